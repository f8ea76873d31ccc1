"""Build benchmark: cold build vs rebuild after a recipe-only or code-only change, and image size against a
naive single-stage Dockerfile doing the same installs. All measured in one run, side by side.

    python -m benchmarks.build [--variant=cpu] [--skip-cold]
    python -m benchmarks.build --variant=cuda [--skip-cold]      # every CUDA variant side by side (or --variant=cu128)
    python -m benchmarks.build --variant=cpu --ops                # DeepSpeed's ops: serial vs ninja

Targets (issue 2): a recipe- or code-only rebuild under 10 s and under 1 MB of new layers.
For a CUDA variant (issue 13): cold build time, image size, its `invoke save` archive, and the size the same
stack has on an nvidia/cuda:<same>-cudnn-devel base, side by side; targets ≤ 7 GB, archive ≤ 3.5 GB, ≤ 0.6×.
`--ops`: the deepspeed-build stage cold, DeepSpeed's own serial compile (DS_ENABLE_NINJA empty) beside ninja
running MAX_JOBS=nproc compilers (the Dockerfile's default), with the step's time as BuildKit reports it.
Writes benchmarks/results/build.md. Builds into its own tags (dockyard-bench/*) from a copy of the context.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report
from dockyard import engine
from dockyard import settings as settings_mod
from dockyard.images import build, variants
from dockyard.settings import ROOT

NAIVE = """FROM {base}
RUN apt-get update && apt-get install -y {os_packages} g++ make libaio-dev ca-certificates
RUN python{python} -m venv /opt/venv
COPY . /opt/dockyard
RUN awk '/^[^ #]/ {{ skip = ($0 ~ /^deepspeed==/) }} !skip' /opt/dockyard/wheels/lock.txt > /tmp/stack.txt \\
    && /opt/venv/bin/pip install --no-index --find-links /opt/dockyard/wheels -r /tmp/stack.txt
RUN awk '/^[^ #]/ {{ keep = ($0 ~ /^deepspeed==/) }} keep' /opt/dockyard/wheels/lock.txt > /tmp/ds.txt \\
    && DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_BUILD_AIO=1 DS_ACCELERATOR=cpu /opt/venv/bin/pip install \\
       --no-index --find-links /opt/dockyard/wheels --no-build-isolation -r /tmp/ds.txt
"""

def timed_build(settings, v, ctx: Path, ref: str, no_cache: bool = False) -> tuple[float, list[str]]:
    (argv, env), = build.build_steps(settings, v, context=ctx, ref=ref, no_cache=no_cache, revision="bench").steps
    t = time.perf_counter()
    engine.run(argv, env=env, capture=True, quiet=True)
    return time.perf_counter() - t, engine.image_inspect(settings, ref)["RootFS"]["Layers"]


def new_layer_bytes(settings, ref: str, old: list[str], new: list[str]) -> int:
    """Bytes of the layers of `new` that `old` does not share, from `docker history` (top first)."""
    changed = len([ln for i, ln in enumerate(new) if i >= len(old) or old[i] != ln])
    out = engine.run(engine.docker(settings, "history", "--no-trunc", "--format", "{{.Size}}", "--human=false", ref),
                     capture=True, quiet=True).stdout.split()
    sizes = [int(s) for s in out if int(s) > 0]
    return sum(sizes[:changed])


# What an nvidia/cuda *-cudnn-devel base holds as well, in the same files torch's wheels bring (their shared
# libraries; the base adds static ones and more, not counted: the devel-base size below is a lower bound).
DUPLICATED = r"^lib(cublas|cublasLt|cudnn\w*|nccl|cudart|cusparse|cufft|curand|cusolver|nvrtc\w*|nvJitLink|cupti|cufile)\.so"
# The toolkit wheels (nvcc, nvvm, crt, cccl, headers, static runtime) a devel base would replace.
TOOLKIT = r"/(bin|nvvm|include)/|\.a$|/cuda_nvcc/|/cuda_cccl/"
MEASURE = f"""
import os, re, sysconfig
site = sysconfig.get_paths()["purelib"] + "/nvidia"
dup = tk = 0
for top, dirs, files in os.walk(site):
    for f in files:
        p = os.path.join(top, f)
        if os.path.islink(p):
            continue
        if re.match(r"{DUPLICATED}", f):
            dup += os.path.getsize(p)
        elif re.search(r"{TOOLKIT}", p):
            tk += os.path.getsize(p)
print(dup, tk)
"""


def cuda_row(s, v, skip_cold: bool) -> dict:
    """One CUDA variant: cold build, size, `invoke save` archive, the same stack on a devel base."""
    ref = f"dockyard-bench/{v.name}:cuda"
    with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as tmp:
        ctx = build.copy_context(Path(tmp) / "ctx", v)
        cold, _ = timed_build(s, v, ctx, ref, no_cache=not skip_cold)
        size = engine.image_inspect(s, ref)["Size"]
        out = engine.run(engine.docker(s, "run", "--rm", "--network", "none", ref, "python", "-c", MEASURE),
                         capture=True, quiet=True).stdout.split()
        dup, toolkit = int(out[0]), int(out[1])
        t = time.perf_counter()
        engine.run([sys.executable, "-m", "invoke", "save", f"--image={ref}", f"--out={tmp}/dist"], cwd=ROOT,
                   capture=True, quiet=True, env={"INVOKE_DOCKYARD_LAYER_CACHE": f"{tmp}/lc"})
        save_s = time.perf_counter() - t
        archive = next(Path(tmp, "dist").glob("*.tar.zst")).stat().st_size
    engine.run(engine.docker(s, "rmi", "-f", ref), capture=True, check=False, quiet=True)
    return {"variant": v.name, "cuda": v.cuda, "nvcc": v.toolkit, "cold": cold, "cached": skip_cold, "size": size,
            "archive": archive, "save_s": save_s, "dup": dup, "toolkit": toolkit, "devel": size + dup}


OPS_STEP = re.compile(r"^#(\d+) \[deepspeed-build [^\]]*\] RUN ")


def ops_seconds(s, v, ctx: Path, ninja: bool) -> float:
    """Cold build of the deepspeed-build stage; the seconds BuildKit gives its one RUN (the ops compile)."""
    (argv, env), = build.build_steps(s, v, context=ctx, ref=f"dockyard-bench/{v.name}:ops", no_cache=True,
                                    revision="bench").steps
    argv = argv[:-1] + ["--target", "deepspeed-build", "--build-arg", f"DS_ENABLE_NINJA={'1' if ninja else ''}",
                        argv[-1]]
    # BuildKit's --progress=plain log (with each step's DONE seconds) is on stderr: run with it merged into stdout
    out = engine.run(argv, env=env, capture=True, check=False, quiet=True, merge_stderr=True)
    if out.returncode:
        sys.exit(f"ops build ({'ninja' if ninja else 'serial'}) failed:\n{out.stdout[-3000:]}")
    lines = out.stdout.splitlines()
    step = next(m.group(1) for ln in lines if (m := OPS_STEP.match(ln)))
    done = [ln for ln in lines if ln.startswith(f"#{step} DONE ")]
    return float(done[-1].split()[-1].rstrip("s"))


def ops_section(s, v) -> str:
    with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as tmp:
        ctx = build.copy_context(Path(tmp) / "ctx", v)
        serial = ops_seconds(s, v, ctx, ninja=False)
        ninja = ops_seconds(s, v, ctx, ninja=True)
    engine.run(engine.docker(s, "rmi", "-f", f"dockyard-bench/{v.name}:ops"), capture=True, check=False, quiet=True)
    return "\n".join([
        f"## DeepSpeed ops: serial vs ninja ({v.name}: {' '.join(v.ds_ops)}; {os.cpu_count()} cores, {dt.date.today()})",
        "", "| compile | ops step s | vs serial |", "|---|---|---|",
        f"| DeepSpeed's default (one source at a time) | {serial:.0f} | 1.00 |",
        f"| DS_ENABLE_NINJA=1, MAX_JOBS={os.cpu_count()} (the Dockerfile's) | {ninja:.0f} | {ninja / serial:.2f} |",
        ""])


def replace_section(text: str, heading: str, section: str) -> str:
    """`text` with its `## heading...` section (up to the next `## `) replaced by `section`, or it appended."""
    parts = re.split(r"(?m)^(?=## )", text)
    kept = [p for p in parts if not p.startswith(f"## {heading}")]
    return "".join(kept).rstrip() + "\n\n" + section


def write_cuda_section(rows: list[dict]) -> str:
    lines = ["## CUDA variants", "",
             f"{os.cpu_count()} cores, {dt.date.today()}. The devel-base column is the same stack on "
             "nvidia/cuda:<same>-cudnn-devel: this image plus the CUDA libraries that base holds a second copy of "
             "(its toolkit replacing the wheels'); a lower bound, since the base also ships static libraries.", "",
             "| variant | cold build s | image GB | `invoke save` archive GB (save s) | duplicated CUDA libs GB "
             "| toolkit wheels GB | same stack on devel base ≥ GB | image / devel |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} (CUDA {r['cuda']}, nvcc: {r['nvcc'] or 'none'}) "
                     f"| {r['cold']:.0f}{' (cache kept)' if r['cached'] else ''} "
                     f"| {r['size'] / 1e9:.2f} | {r['archive'] / 1e9:.2f} ({r['save_s']:.0f}) | {r['dup'] / 1e9:.2f} "
                     f"| {r['toolkit'] / 1e9:.2f} | {r['devel'] / 1e9:.2f} | {r['size'] / r['devel']:.2f} |")
    newest = max(rows, key=lambda r: variants.cuda_version(r["cuda"]))
    ok = newest["size"] <= 7e9 and newest["archive"] <= 3.5e9 and newest["size"] <= 0.6 * newest["devel"]
    lines += ["", f"Targets for the newest ({newest['variant']}): ≤ 7 GB, archive ≤ 3.5 GB, ≤ 0.6× the devel-base "
              f"image: {'PASS' if ok else 'FAIL'}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="cpu", help="a variant, or `cuda` for every CUDA variant side by side")
    p.add_argument("--skip-cold", action="store_true", help="reuse the build cache for the first build")
    p.add_argument("--ops", action="store_true", help="only the DeepSpeed ops compile: serial vs ninja")
    a = p.parse_args()
    s = settings_mod.load({"docker": os.environ.get("INVOKE_DOCKYARD_DOCKER", "")})
    out = report.RESULTS / "build.md"
    if a.variant == "cuda":
        rows = [cuda_row(s, v, a.skip_cold) for v in variants.all_variants(s).values() if v.is_cuda]
        section = write_cuda_section(rows)
        print(section)
        out.write_text(replace_section(out.read_text() if out.exists() else "", "CUDA variants", section))
        return
    v = variants.resolve(s, a.variant)[0]
    if a.ops:
        section = ops_section(s, v)
        print(section)
        out.write_text(replace_section(out.read_text() if out.exists() else "", "DeepSpeed ops", section))
        return
    if v.is_cuda:
        section = write_cuda_section([cuda_row(s, v, a.skip_cold)])
        print(section)
        out.write_text(replace_section(out.read_text() if out.exists() else "", "CUDA variants", section))
        return
    ref = f"dockyard-bench/{v.name}:layers"
    rows = []
    with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as tmp:
        ctx = build.copy_context(Path(tmp) / "ctx", v)
        cold, base = timed_build(s, v, ctx, ref, no_cache=not a.skip_cold)
        rows.append(("cold build" + (" (cache kept)" if a.skip_cold else " (--no-cache)"), cold, None))
        with open(ctx / "recipes" / "zero2" / "recipe.yaml", "a") as f:
            f.write("# bench: recipe-only change\n")
        t, layers = timed_build(s, v, ctx, ref)
        rows.append(("rebuild after a recipe-only change", t, new_layer_bytes(s, ref, base, layers)))
        with open(ctx / "dockyard" / "__init__.py", "a") as f:
            f.write("# bench: code-only change\n")
        t2, layers2 = timed_build(s, v, ctx, ref)
        rows.append(("rebuild after a code-only change", t2, new_layer_bytes(s, ref, layers, layers2)))
        size = engine.image_inspect(s, ref)["Size"]

        naive_ref = f"dockyard-bench/{v.name}:naive"
        (ctx / "Dockerfile.naive").write_text(NAIVE.format(base=build.base_image(s, v), variant=v.name, python=v.python,
                                                           os_packages=" ".join(v.os_packages)))
        (ctx / ".dockerignore").unlink()
        t = time.perf_counter()
        engine.run(engine.docker(s, "build", "-q", "--no-cache", "-f", str(ctx / "Dockerfile.naive"), "-t", naive_ref, str(ctx)),
                   env=engine.build_env(), capture=True, quiet=True)
        naive_time = time.perf_counter() - t
        naive_size = engine.image_inspect(s, naive_ref)["Size"]
    for r in (ref, naive_ref):
        engine.run(engine.docker(s, "rmi", "-f", r), capture=True, check=False, quiet=True)

    lines = [f"# Build benchmark ({v.name}, {os.cpu_count()} cores, {dt.date.today()})", "",
             "| step | seconds | new layer bytes | vs cold build |", "|---|---|---|---|"]
    for name, secs, nbytes in rows:
        lines.append(f"| {name} | {secs:.1f} | {'' if nbytes is None else f'{nbytes:,}'} | {secs / cold:.3f} |")
    lines += ["", "| image | size (bytes) | build seconds | size vs dockyard |", "|---|---|---|---|",
              f"| dockyard multi-stage | {size:,} | {cold:.1f} | 1.00 |",
              f"| naive single stage, same installs | {naive_size:,} | {naive_time:.1f} | {naive_size / size:.2f} |",
              "", "Targets: recipe- or code-only rebuild < 10 s and < 1 MB of new layers.",
              f"Recipe-only: {'PASS' if rows[1][1] < 10 and rows[1][2] < 1e6 else 'FAIL'}; "
              f"code-only: {'PASS' if rows[2][1] < 10 and rows[2][2] < 1e6 else 'FAIL'}."]
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = out.read_text() if out.exists() else ""
    sections = old[old.index("\n## ") + 1:] if "\n## " in old else ""
    out.write_text(text + ("\n" + sections if sections else ""))


if __name__ == "__main__":
    main()
