"""Build-time checks: run inside the image by the Dockerfile; any failure fails the build.

Catches what otherwise surfaces only at training time: a later install that swapped the pinned torch or
triton, a DeepSpeed op that was asked for but silently skipped (DeepSpeed >= 0.15.1 does that), a library
that does not import against this torch. For CUDA variants (checked without a GPU): nvcc and torch agree on
the CUDA release, the compiled ops hold code for every asked arch, bitsandbytes has its library for torch's
CUDA, triton has its ptxas, and no CUDA library is there twice. Saves `ds_report` for `invoke doctor`.
"""

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# The build runs this file alone (no dockyard package yet): dockyard.images.variants.OP_NAMES is the same table,
# and tests/unit/test_build_plan.py keeps them equal.
OP_NAMES = {"CPU_ADAM": "cpu_adam", "FUSED_ADAM": "fused_adam", "AIO": "async_io",
            "SHM_COMM": "deepspeed_shm_comm", "CPU_LION": "cpu_lion", "CPU_ADAGRAD": "cpu_adagrad"}
BUILDERS = {"CPU_ADAM": "CPUAdamBuilder", "FUSED_ADAM": "FusedAdamBuilder", "AIO": "AsyncIOBuilder",
            "SHM_COMM": "ShareMemCommBuilder", "CPU_LION": "CPULionBuilder", "CPU_ADAGRAD": "CPUAdagradBuilder"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", default="")
    p.add_argument("--triton", default="")
    p.add_argument("--deepspeed", default="")
    p.add_argument("--ops", default="")
    p.add_argument("--report", required=True)
    p.add_argument("--cuda", default="", help="the CUDA release the variant is labelled with (empty: cpu)")
    p.add_argument("--arch-list", default="", help="TORCH_CUDA_ARCH_LIST the ops were compiled for")
    p.add_argument("--allow-duplicate-cuda-libs", action="store_true", help="a registry base: warn only")
    p.add_argument("--nvcc", action="store_true", help="the image has a CUDA compiler: check its release")
    p.add_argument("--cuda-archs", default="", help="the GPU archs torch holds code for, as the label says")
    p.add_argument("--pins", default="{}", help="every pin of the variant, as JSON (the image's labels say them)")
    a = p.parse_args()
    problems = []

    pins = {"torch": a.torch, "triton": a.triton, "deepspeed": a.deepspeed, **json.loads(a.pins or "{}")}
    for dist, want in pins.items():
        if not want:
            continue
        try:
            have = version(dist)
        except PackageNotFoundError:
            have = "not installed"
        if have != want:
            problems.append(f"{dist} is {have}, the variant pins {want}")
    # a requirement of an installed package that is not there (the stack installs with --no-deps, from the lock)
    deps = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    if deps.returncode:
        problems += [f"pip check: {line}" for line in deps.stdout.splitlines() if line.strip()]
    if not a.cuda:
        import torch

        if torch.version.cuda:  # a cpu variant whose torch pin is a CUDA build (PyPI's plain `torch==X`)
            problems.append(f"torch {version('torch')} is built for CUDA {torch.version.cuda}: a cpu variant pins "
                            "torch's cpu build (X+cpu)")

    for mod in ("transformers", "peft", "accelerate", "bitsandbytes", "pynvml", "datasets"):
        try:
            importlib.import_module(mod)
        except Exception as e:  # any import-time failure is a broken image
            problems.append(f"import {mod} failed: {type(e).__name__}: {e}")

    from deepspeed.git_version_info import installed_ops

    for op in a.ops.split():
        name = OP_NAMES.get(op, op.lower())
        if not installed_ops.get(name):
            problems.append(f"DeepSpeed op {name} (DS_BUILD_{op}=1) was not built")
        else:
            problems += _op_loads(op, name)

    if a.cuda:
        problems += cuda_problems(a.cuda, a.arch_list, a.ops.split(), a.allow_duplicate_cuda_libs, a.nvcc)
        problems += _torch_archs(a.cuda_archs)

    report = subprocess.run(["ds_report"], capture_output=True, text=True)
    with open(a.report, "w") as f:
        f.write(report.stdout + report.stderr)

    if problems:
        print("image check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    built = sorted(k for k, v in installed_ops.items() if v)
    print(f"image check passed: torch {version('torch')}, deepspeed {version('deepspeed')}, ops built: {', '.join(built)}")
    return 0


# --- CUDA variants ---------------------------------------------------------------------------

# The libraries torch's wheels bring; a second copy (e.g. from a CUDA devel base) costs gigabytes. Not CUPTI:
# triton ships its own for its profiler (about 40 MB, at the release it was built with), torch uses the wheel's.
CUDA_LIBS = re.compile(r"^(lib(?:cublas|cublasLt|cudnn\w*|nccl|cudart|cusparse|cusparseLt|cufft|curand|cusolver"
                       r"|nvrtc|nvJitLink|nvshmem\w*|cufile))\.so(\.[\d.]+)?$")
SKIP_DIRS = {"/proc", "/sys", "/dev", "/tmp", "/wheels", "/dist"}


def _op_loads(op: str, name: str) -> list[str]:
    """A prebuilt op loads as DeepSpeed loads it at run time (its builder's load: the compiled module, no JIT),
    here without a GPU: an op linked against a library the image lacks fails now, not in a user's run."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(BUILDERS.get(op, ""))
    if builder is None:
        return [f"DeepSpeed op {name}: the {get_accelerator()._name} accelerator has no builder for it"]
    try:
        builder.load(verbose=False)
    except Exception as e:  # noqa: BLE001 - whatever the import raises, the image is broken
        return [f"DeepSpeed op {name} was built but does not load: {type(e).__name__}: {str(e)[-300:]}"]
    return []


def _torch_archs(expected: str) -> list[str]:
    """The GPU architectures torch's own libraries hold code for are the ones the image's label promises (doctor
    and `invoke run` refuse a GPU outside them)."""
    import torch

    flags = torch._C._cuda_getArchFlags().split()  # e.g. sm_75 ... sm_120 compute_120, compiled into libtorch_cuda
    sass = [f"{f[3:-1]}.{f[-1]}" for f in flags if f.startswith("sm_")]
    ptx = {f"{f[8:-1]}.{f[-1]}" for f in flags if f.startswith("compute_")}
    have = ";".join(a + ("+PTX" if a in ptx else "") for a in sass)
    if have != expected:
        return [f"torch holds code for GPU archs {have or 'none'} ({' '.join(flags)}), the variant's torch_archs "
                f"says {expected or 'nothing'}: set torch_archs in images/variants.yaml to what torch holds"]
    return []


def cuda_problems(cuda: str, arch_list: str, ops: list[str], allow_duplicates: bool, nvcc: bool) -> list[str]:
    import torch

    problems = []
    torch_cuda = torch.version.cuda or "none"
    if _major_minor(torch_cuda) != cuda:
        problems.append(f"torch is built for CUDA {torch_cuda}, the variant is labelled CUDA {cuda}")
    if nvcc:
        problems += _nvcc_release(torch_cuda)
    elif "FUSED_ADAM" in ops:
        problems.append("FUSED_ADAM needs nvcc, and this image has none: drop it from ds_ops or build FROM a "
                        "CUDA devel base (`invoke build --devel`)")
    if "FUSED_ADAM" in ops:
        problems += _op_archs("fused_adam_op", arch_list)
    problems += _bitsandbytes(torch_cuda)
    problems += _triton_ptxas()
    duplicates = _duplicate_cuda_libs()
    if duplicates and allow_duplicates:
        print("warning: CUDA libraries present twice (the registry base's and torch's wheels'):\n  "
              + "\n  ".join(duplicates), file=sys.stderr)
    elif duplicates:
        problems += [f"CUDA library present twice: {d}" for d in duplicates]
    return problems


def _nvcc_release(torch_cuda: str) -> list[str]:
    problems = []
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
    m = re.search(r"release (\d+\.\d+)", nvcc.stdout)
    if not m:
        problems.append(f"nvcc did not run (CUDA_HOME={os.environ.get('CUDA_HOME')}): {nvcc.stderr.strip()[-300:]}")
    elif m.group(1) != _major_minor(torch_cuda):
        problems.append(f"nvcc is release {m.group(1)}, torch is built for CUDA {torch_cuda}: pin the toolkit "
                        "wheels (nvidia-cuda-nvcc, -nvvm, -crt) to torch's CUDA release")
    return problems


def _major_minor(release: str) -> str:
    return ".".join(release.split(".")[:2])


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _cuobjdump() -> str:
    """triton's wheel ships one (the toolkit wheels do not)."""
    return str(_site() / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump")


def _op_archs(module: str, arch_list: str) -> list[str]:
    """The compiled op holds machine code for every arch asked for, and imports without a GPU."""
    found = sorted((_site() / "deepspeed").rglob(f"{module}*.so"))
    if not found:
        return [f"DeepSpeed CUDA op {module}: no compiled .so under deepspeed/"]
    so = found[0]
    elf = subprocess.run([_cuobjdump(), "--list-elf", str(so)], capture_output=True, text=True)
    if elf.returncode:
        return [f"cuobjdump --list-elf {so} failed: {elf.stderr.strip()[-300:]}"]
    have = set(re.findall(r"\.sm_(\d+a?)\.", elf.stdout))
    want = [a.replace("+PTX", "").replace(".", "") for a in re.split(r"[;\s]+", arch_list) if a]
    problems = [f"{so.name} holds no code for sm_{w} (TORCH_CUDA_ARCH_LIST={arch_list}; it holds "
                f"{', '.join(sorted(have)) or 'none'})" for w in want if w not in have]
    if "+PTX" in arch_list:
        ptx = subprocess.run([_cuobjdump(), "--list-ptx", str(so)], capture_output=True, text=True).stdout
        if "compute_" not in ptx and ".ptx" not in ptx:
            problems.append(f"{so.name} holds no PTX although the arch list asks for +PTX")
    dotted = ".".join(so.relative_to(_site()).with_suffix("").parts).split(".cpython")[0]
    try:
        importlib.import_module(dotted)
    except Exception as e:  # the op must load on a GPU-less build host, as on any node
        problems.append(f"import {dotted} failed: {type(e).__name__}: {e}")
    return problems


def _bitsandbytes(torch_cuda: str) -> list[str]:
    import bitsandbytes

    lib = Path(bitsandbytes.__file__).parent / f"libbitsandbytes_cuda{torch_cuda.replace('.', '')}.so"
    return [] if lib.exists() else [f"bitsandbytes {version('bitsandbytes')} has no {lib.name} for torch's CUDA"]


def _triton_ptxas() -> list[str]:
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or str(_site() / "triton" / "backends" / "nvidia" / "bin" / "ptxas")
    r = subprocess.run([ptxas, "--version"], capture_output=True, text=True) if os.path.exists(ptxas) else None
    if r is None or r.returncode:
        return [f"triton's ptxas ({ptxas}) is missing or does not run"]
    return []


def _duplicate_cuda_libs() -> list[str]:
    """Library names (libcublas, libcudnn_ops...) held by more than one real file, symlinks not counted."""
    seen: dict[str, set[str]] = {}
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in SKIP_DIRS]
        for f in files:
            m = CUDA_LIBS.match(f)
            path = os.path.join(top, f)
            if m and not os.path.islink(path):
                seen.setdefault(m.group(1), set()).add(path)
    return [f"{name}: {', '.join(sorted(paths))}" for name, paths in sorted(seen.items()) if len(paths) > 1]


if __name__ == "__main__":
    sys.exit(main())
