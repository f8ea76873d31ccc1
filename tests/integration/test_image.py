"""The images on the real engine: what the cpu and the newest CUDA image hold, `invoke run` of zero2, layer reuse."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from dockyard import ROOT, engine
from dockyard.images import build, variants
from tests.support.buildcache import drop_context_copies
from tests.support.cli import docker, invoke

pytestmark = pytest.mark.engine


def test_a_rebuild_with_nothing_changed_is_the_same_image(settings, cpu_image):
    """The `created` label was the clock's: every rebuild, its layers all from the cache, made a new image and left
    the last one untagged. It is the commit's time now (SOURCE_DATE_EPOCH where set)."""
    before = engine.image_inspect(settings, cpu_image)
    r = invoke("build", "--variant=cpu")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    drop_context_copies(settings)
    after = engine.image_inspect(settings, cpu_image)
    assert after["Id"] == before["Id"], "a rebuild from the cache is the image it was"
    # and says so: a newcomer read "built dockyard:0.1.0-cpu" as a new image, made again
    assert f"{cpu_image} is up to date" in r.stdout and "\nbuilt " not in r.stdout, r.stdout[-2000:]
    assert after["Config"]["Labels"]["org.opencontainers.image.created"] == build.build_time()  # the commit's


def test_image_holds_what_its_labels_say(settings, cpu_image):
    info = engine.image_inspect(settings, cpu_image)
    labels = info["Config"]["Labels"]
    cpu = variants.resolve(settings, "cpu")[0]
    assert labels["dockyard.variant"] == "cpu" and labels["dockyard.lock"] == variants.lock_hash(cpu)
    assert labels["dockyard.torch"] == cpu.pins["torch"] and labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) >= 40
    assert info["Config"]["User"] == "dockyard", "the image must not run as root by default"
    # however a container of it starts (Slurm, Kubernetes, compose set nothing), the manifest records its variant
    assert "DOCKYARD_VARIANT=cpu" in info["Config"]["Env"]
    probe = ("import json, torch, deepspeed, transformers, peft, bitsandbytes;"
             "from deepspeed.git_version_info import installed_ops as o;"
             "print(json.dumps({'torch': torch.__version__, 'deepspeed': deepspeed.__version__, 'ops': o}))")
    out = json.loads(docker(settings, "run", "--rm", cpu_image, "python", "-c", probe).stdout.strip().splitlines()[-1])
    assert out["torch"] == cpu.pins["torch"] and out["deepspeed"] == cpu.pins["deepspeed"]
    for op in ("cpu_adam", "deepspeed_shm_comm", "async_io"):
        assert out["ops"][op], f"DeepSpeed op {op} was asked for but is not built"
    # built for the CPU here, so an offload run loads it: no "DeepSpeed compiles its cpu_adam op" warning, which
    # every offload run in this image printed while starting at once
    to_compile = docker(settings, "run", "--rm", "-e", "DS_ACCELERATOR=cpu", cpu_image, "python", "-c",
                        "from dockyard.train.environment import cpu_adam_to_compile; print(cpu_adam_to_compile())")
    assert to_compile.stdout.strip().splitlines()[-1] == "None", to_compile.stdout + to_compile.stderr
    report = docker(settings, "run", "--rm", cpu_image, "sh", "-c", "cat /opt/dockyard/ds_report.txt; ldconfig -p").stdout
    assert "DeepSpeed general environment info" in report and "libaio.so" in report
    # the image's torchrun says a failed worker in one line, no traceback of its own (dockyard.train.torchrun)
    failed = docker(settings, "run", "--rm", cpu_image, "sh", "-c", "cd /tmp && echo 'raise SystemExit(3)' > w.py && "
                    "torchrun --nproc-per-node=1 --standalone w.py", check=False)
    assert failed.returncode == 1 and "torchrun: w.py failed: rank 0 (local rank 0) first, exit 3" in failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr


def test_zero2_trains_in_the_image_through_invoke_run(settings, cpu_image, tmp_path):
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}
    r = invoke("run", "--recipe=zero2", "--variant=cpu", "--run-id=z2", "--", "--max_steps", "12", env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run_dir = tmp_path / "z2"
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["status"] == "completed" and m["recipe"] == "zero2" and m["variant"] == "cpu"
    assert m["world_size"] == 2 and m["nodes"] == 1
    assert m["strategy"]["in_effect"]["engine"] == "deepspeed" and m["strategy"]["in_effect"]["zero_stage"] == 2
    assert m["image"]["ref"] == cpu_image and m["image"]["id"] == engine.image_inspect(settings, cpu_image)["Id"]
    assert m["metrics"]["steps"] == 12 and m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    assert m["metrics"]["tokens_per_second"] > 0 and m["metrics"]["peak_memory_bytes"] > 0
    steps = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert any("loss" in s for s in steps)
    for p in run_dir.rglob("*"):  # outputs belong to the user who ran the task, not to root-in-a-container
        assert p.stat().st_uid == os.getuid(), p
    before = (run_dir / "manifest.json").read_bytes()
    again = invoke("run", "--recipe=zero2", "--variant=cpu", "--run-id=z2", env=env)
    assert again.returncode != 0 and "already holds a run" in again.stderr
    assert (run_dir / "manifest.json").read_bytes() == before, "a refused run must leave the old one untouched"


def _build_layers(settings, context: Path, ref: str) -> list[str]:
    cpu = variants.resolve(settings, "cpu")[0]
    (argv, env), = build.build_steps(settings, cpu, context=context, ref=ref, revision="test").steps
    engine.run(argv, env=env, quiet=True, capture=True)
    return engine.image_inspect(settings, ref)["RootFS"]["Layers"]


def _top_layers_bytes(settings, ref: str, count: int) -> float:
    """Bytes of the `count` topmost layers that hold files (metadata steps like USER have none)."""
    out = docker(settings, "history", "--no-trunc", "--format", "{{json .}}", ref).stdout.splitlines()
    sized = [_bytes(json.loads(ln)["Size"]) for ln in out]
    return sum([b for b in sized if b > 0][:count])


def _bytes(text: str) -> float:
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return float(text[: -len(u)]) * units[u]
    return float(text)


def test_recipe_or_code_change_rebuilds_only_the_top_layers(settings, cpu_image, tmp_path):
    ctx = build.copy_context(tmp_path / "ctx", variants.resolve(settings, "cpu")[0])
    ref = "dockyard-test/rebuild:layers"
    try:
        base = _build_layers(settings, ctx, ref)
        heavy = engine.image_inspect(settings, cpu_image)["RootFS"]["Layers"][:-3]
        assert base[:-3] == heavy, "a copy of the context must reuse the OS and Python stack layers"

        with open(ctx / "recipes" / "zero2" / "recipe.yaml", "a") as f:
            f.write("# a recipe-only change\n")
        after_recipe = _build_layers(settings, ctx, ref)
        assert after_recipe[:-1] == base[:-1] and after_recipe[-1] != base[-1], "only the recipes layer may change"
        assert _top_layers_bytes(settings, ref, 1) < 1e6

        with open(ctx / "dockyard" / "__init__.py", "a") as f:
            f.write("# a code-only change\n")
        after_code = _build_layers(settings, ctx, ref)
        assert after_code[:-3] == base[:-3], "a code change may rebuild code, data and recipes layers, nothing below"
        assert after_code[-3] != base[-3]
    finally:
        docker(settings, "rmi", "-f", ref, check=False)


KERNEL = "__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\nint main() { twice<<<1, 32>>>(0); return 0; }\n"


def test_cuda_image_holds_one_toolkit_that_matches_torch(settings, cuda_image):
    """Checked without a GPU: labels, torch's CUDA, nvcc building and linking a kernel through CUDA_HOME, the
    prebuilt DeepSpeed ops. The build's own checks (images/check_image.py) also read the op's fatbinary."""
    v = variants.newest_cuda(settings)
    info = engine.image_inspect(settings, cuda_image)
    labels = info["Config"]["Labels"]
    assert labels["dockyard.variant"] == v.name and labels["dockyard.cuda"] == v.cuda
    assert f"DOCKYARD_VARIANT={v.name}" in info["Config"]["Env"]
    assert labels["dockyard.lock"] == variants.lock_hash(v) and labels["dockyard.torch"] == v.pins["torch"]
    probe = ("import json, torch; from deepspeed.git_version_info import installed_ops as o;"
             "print(json.dumps({'cuda': torch.version.cuda, 'ops': o}))")
    script = (f"python -c {shlex.quote(probe)} && printf {shlex.quote(KERNEL)} > /tmp/k.cu && cd /tmp"
              f" && nvcc -gencode arch=compute_90,code=sm_90 k.cu -o k -L$CUDA_HOME/lib64 && nvcc --version"
              f" && ls $CUDA_HOME/lib64/libcudart.so $CUDA_HOME/nvvm/bin/cicc")
    r = docker(settings, "run", "--rm", "--network", "none", cuda_image, "bash", "-c", script, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[0])
    assert out["cuda"] == v.cuda and f"release {v.cuda}" in r.stdout
    for op in ("fused_adam", "cpu_adam", "async_io"):
        assert out["ops"][op], f"DeepSpeed op {op} was asked for but is not built"
    assert info["Size"] < 7e9, f"the CUDA image is {info['Size'] / 1e9:.2f} GB, the target is 7 GB"


def test_cuda12_image_holds_torchs_cuda_12_and_the_ops_the_host_compiler_builds(settings, cuda12_image):
    """cu128 from the Debian base, no registry: torch's CUDA 12.8, bitsandbytes' cuda128 library, no nvcc, the
    ops its labels list prebuilt (and nothing that needs nvcc), torch's GPU archs as the label says."""
    v = variants.oldest_cuda(settings)
    labels = engine.image_inspect(settings, cuda12_image)["Config"]["Labels"]
    assert labels["dockyard.cuda"] == v.cuda == "12.8" and labels["dockyard.base"] == settings.base_image_cpu
    assert labels["dockyard.ds_ops"] == "cpu_adam,async_io" and labels["dockyard.nvcc"] == ""
    probe = ("import json, pathlib, torch, bitsandbytes; from deepspeed.git_version_info import installed_ops as o;"
             "print(json.dumps({'cuda': torch.version.cuda, 'ops': o, 'archs': torch._C._cuda_getArchFlags(),"
             "'bnb': [p.name for p in pathlib.Path(bitsandbytes.__file__).parent.glob('libbitsandbytes_*.so')]}))")
    script = f"python -c {shlex.quote(probe)} && if command -v nvcc; then echo 'nvcc found'; fi"
    r = docker(settings, "run", "--rm", "--network", "none", cuda12_image, "bash", "-c", script, check=False)
    assert r.returncode == 0 and "nvcc found" not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[0])
    assert out["cuda"] == "12.8" and sorted(out["bnb"]) == ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda128.so"]
    assert out["ops"]["cpu_adam"] and out["ops"]["async_io"] and not out["ops"]["fused_adam"]
    archs = [f"{a[3:-1]}.{a[-1]}" for a in out["archs"].split() if a.startswith("sm_")]
    assert ";".join(archs) == labels["dockyard.cuda_archs"], (out["archs"], labels["dockyard.cuda_archs"])


@pytest.mark.parametrize("existing", ["", "ubuntu"])
def test_the_image_user_is_made_on_bases_with_or_without_a_uid_1000(settings, existing):
    """images/add_user.sh, the Dockerfile's user step, in the registry-free base as it is and with a UID 1000
    already taken, as on every Ubuntu 24.04 base (nvidia/cuda:*-ubuntu24.04 ships `ubuntu`): plain useradd
    fails there."""
    before = f"useradd --create-home --uid 1000 {existing} && touch /home/{existing}/.kept && " if existing else ""
    check = ("id -u dockyard; id -gn dockyard; getent passwd dockyard | cut -d: -f6,7; "
             "stat -c %U /home/dockyard; ls -A /home /home/dockyard")
    out = docker(settings, "run", "--rm", "--user", "0", "-v", f"{ROOT / 'images' / 'add_user.sh'}:/tmp/add_user.sh:ro",
                  settings.base_image_cpu, "sh", "-ec", f"{before}sh /tmp/add_user.sh >/dev/null; {check}").stdout.split()
    assert out[:4] == ["1000", "dockyard", "/home/dockyard:/bin/bash", "dockyard"]
    assert "ubuntu" not in out  # one user: the existing one renamed, with its group
    assert (".kept" in out) == bool(existing)  # and its home moved, files kept
