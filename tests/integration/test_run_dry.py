"""`invoke run --dry` prints the command the run then starts: the same `docker run` line, memlock and image id
included (issue 25: the dry line used to carry an empty DOCKYARD_IMAGE_ID, and the README another memlock)."""

from __future__ import annotations

import os

import pytest

from dockyard import ROOT, engine
from dockyard.images import variants
from tests.support.cli import invoke

pytestmark = pytest.mark.engine


def _docker_run_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("+ ") and " run --rm " in line)


def test_the_dry_line_is_the_line_that_runs(cpu_image, settings, tmp_path):
    run_id = f"dry-{os.getpid()}"
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}
    args = ["run", "--variant=cpu", "--recipe=ddp", f"--run-id={run_id}", "--", "--max_steps", "1"]
    dry = invoke(*args[:1], "--dry", *args[1:], env=env)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / run_id).exists(), "a dry run makes nothing"
    real = invoke(*args, env=env, timeout=900)
    assert real.returncode == 0, real.stderr[-3000:]
    assert _docker_run_line(dry.stderr) == _docker_run_line(real.stderr)
    image_id = engine.image_inspect(settings, cpu_image)["Id"]
    assert f"DOCKYARD_IMAGE_ID={image_id}" in _docker_run_line(dry.stderr)


def test_an_image_whose_nvidia_require_cuda_leaves_the_driver_out_is_refused_before_it_starts(settings, tmp_path):
    """`invoke build --variant=cu128 --devel` builds FROM nvidia/cuda, whose NVIDIA_REQUIRE_CUDA (cuda>=12.8) the
    NVIDIA toolkit holds against the driver: on a 535 driver (CUDA 12.2) docker refused to start it, and `run --dry`
    had passed; only the failed run then spoke of --disable-require. A stand-in image (no files: the devel build's
    env and labels) on the recorded 535 host: refused by run --dry with the way out, passed with --disable-require,
    and doctor says it of the variant."""
    import json

    cu128 = variants.all_variants(settings)["cu128"]
    name = f"dockyard-requiretest-{os.getpid()}"
    tag = f"{name}:0.1.0-cu128"
    (tmp_path / "Dockerfile").write_text(
        'FROM scratch\nENV NVIDIA_REQUIRE_CUDA="cuda>=12.8 brand=tesla,driver>=470,driver<471 '
        'brand=unknown,driver>=470,driver<471"\n'
        f'LABEL dockyard.variant=cu128 dockyard.cuda=12.8 dockyard.nvcc=base dockyard.base="{cu128.devel.base}"\n')
    engine.run(engine.docker(settings, "build", "-q", "-t", tag, str(tmp_path)), capture=True, quiet=True)
    env = {"INVOKE_DOCKYARD_IMAGE_NAME": name, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"),
           "DOCKYARD_NVML_REPLAY": str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "t4x2_535.json")}
    try:
        refused = invoke("run", "--dry", "--variant=cu128", "--recipe=ddp", env=env, timeout=300)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert (f"error: image {tag} sets NVIDIA_REQUIRE_CUDA cuda>=12.8 (from its base image), and driver 535.183.01 "
                "supports CUDA 12.2: the NVIDIA toolkit would refuse to start it. --disable-require starts it (a CUDA 12 "
                "driver runs any CUDA 12 build: docs/images.md), or use the plain image (`invoke build "
                "--variant=cu128`, without --devel)") in refused.stderr, refused.stderr
        assert "+ " not in refused.stderr, "no command printed"
        real = invoke("run", "--variant=cu128", "--recipe=ddp", "--run-id=req", env=env, timeout=300)
        assert real.returncode == 1 and f"error: image {tag} sets NVIDIA_REQUIRE_CUDA cuda>=12.8" in real.stderr, \
            real.stderr
        assert not (tmp_path / "runs" / "req").exists(), "refused before the run folder is made"
        given = invoke("run", "--dry", "--variant=cu128", "--recipe=ddp", "--disable-require", env=env, timeout=300)
        assert given.returncode == 0, given.stderr
        assert "NVIDIA_DISABLE_REQUIRE=1" in _docker_run_line(given.stderr)
        # invoke shell had no --disable-require: docker refused the devel image there, with no way out
        shell = invoke("shell", "--dry", "--variant=cu128", env=env, timeout=300)
        assert shell.returncode == 1 and "Traceback" not in shell.stderr, shell.stderr
        assert f"error: image {tag} sets NVIDIA_REQUIRE_CUDA cuda>=12.8" in shell.stderr and "+ " not in shell.stderr
        shell = invoke("shell", "--dry", "--variant=cu128", "--disable-require", env=env, timeout=300)
        assert shell.returncode == 0, shell.stderr
        assert "NVIDIA_DISABLE_REQUIRE=1" in _docker_run_line(shell.stderr)
        doctor = invoke("doctor", "--json", env=env, timeout=300)
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["variant cu128"]["status"] == "warn", checks["variant cu128"]
        assert "its image sets NVIDIA_REQUIRE_CUDA cuda>=12.8" in checks["variant cu128"]["detail"]
        assert checks["variant cu128"]["fix"].startswith("invoke run --disable-require starts it")
    finally:
        engine.run(engine.docker(settings, "rmi", "-f", tag), capture=True, check=False, quiet=True)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "a dry run makes nothing"


def test_a_devel_image_is_refused_on_a_geforce_its_requirement_leaves_out_and_runs_on_a_tesla(settings, tmp_path):
    """nvidia/cuda:12.8's NVIDIA_REQUIRE_CUDA admits driver 535 on Tesla (and other data-center brands), not on
    GeForce: run --dry passed on a GeForce host (the brand was never read) and docker's NVIDIA toolkit refused the
    container at start. A stand-in image with that env (no files), on recorded hosts (no GPU here: NVML replayed)."""
    from tests.support.nvml import REQUIRE_CUDA_128

    cu128 = variants.all_variants(settings)["cu128"]
    name = f"dockyard-brandtest-{os.getpid()}"
    tag = f"{name}:0.1.0-cu128"
    (tmp_path / "Dockerfile").write_text(
        f'FROM scratch\nENV NVIDIA_REQUIRE_CUDA="{REQUIRE_CUDA_128}"\n'
        f'LABEL dockyard.variant=cu128 dockyard.cuda=12.8 dockyard.nvcc=base dockyard.base="{cu128.devel.base}"\n')
    engine.run(engine.docker(settings, "build", "-q", "-t", tag, str(tmp_path)), capture=True, quiet=True)
    hosts = ROOT / "tests" / "fixtures" / "nvml" / "hosts"
    env = {"INVOKE_DOCKYARD_IMAGE_NAME": name, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    try:
        geforce = {**env, "DOCKYARD_NVML_REPLAY": str(hosts / "rtx3090x2_535.json")}
        refused = invoke("run", "--dry", "--variant=cu128", "--recipe=ddp", env=geforce, timeout=300)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr and "+ " not in refused.stderr
        assert (f"error: image {tag} sets NVIDIA_REQUIRE_CUDA cuda>=12.8 (from its base image), and driver 535.183.01 "
                "supports CUDA 12.2; it admits this driver on other brands of GPU only, not on GPU 0 (NVIDIA GeForce "
                "RTX 3090, brand=geforce), GPU 1 (NVIDIA GeForce RTX 3090, brand=geforce): the NVIDIA toolkit would "
                "refuse to start it. --disable-require starts it (a CUDA 12 driver runs any CUDA 12 build: "
                "docs/images.md), or use the plain image (`invoke build --variant=cu128`, without --devel)"
                ) in refused.stderr, refused.stderr
        given = invoke("run", "--dry", "--variant=cu128", "--recipe=ddp", "--disable-require", env=geforce,
                       timeout=300)
        assert given.returncode == 0 and "NVIDIA_DISABLE_REQUIRE=1" in _docker_run_line(given.stderr), given.stderr
        tesla = invoke("run", "--dry", "--variant=cu128", "--recipe=ddp", timeout=300,
                       env={**env, "DOCKYARD_NVML_REPLAY": str(hosts / "v100x2_535.json")})
        assert tesla.returncode == 0 and "NVIDIA_DISABLE_REQUIRE" not in _docker_run_line(tesla.stderr), tesla.stderr
    finally:
        engine.run(engine.docker(settings, "rmi", "-f", tag), capture=True, check=False, quiet=True)
