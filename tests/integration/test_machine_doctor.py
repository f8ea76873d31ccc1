"""`invoke doctor` against the real Docker engine, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import INVOKE

ROOT = Path(__file__).resolve().parents[2]


def _doctor(env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*INVOKE, "doctor", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.engine
def test_doctor_on_this_host():
    from dockyard.gpus import read_host

    proc = _doctor()
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    assert proc.returncode == (1 if failed else 0), proc.stderr
    assert report["ok"] == (not failed)
    if failed:
        assert f"check(s) failed: {', '.join(failed)}" in proc.stderr
    assert checks["engine"]["status"] == "pass" and "Docker" in checks["engine"]["detail"]
    assert checks["buildkit"]["status"] == "pass"
    assert checks["shared memory"]["status"] == "pass"  # the run flags give the host's /dev/shm
    assert checks["disk"]["status"] in ("pass", "warn")
    if not read_host().gpus:
        assert checks["gpus"]["status"] == "pass" and "cpu variant will be used" in checks["gpus"]["detail"]
        assert checks["auto variant"]["detail"].startswith("auto → cpu")
    # the probe container is gone (--rm)
    from dockyard import engine
    from dockyard.settings import Settings

    left = subprocess.run(engine.docker(Settings(), "ps", "-aq", "--filter", "name=dockyard-doctor-"),
                          capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_doctor_fails_clearly_without_an_engine(tmp_path):
    """DOCKER_HOST at a socket where no daemon listens: the engine check fails with how to fix it."""
    proc = _doctor({"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert proc.returncode == 1
    assert "check(s) failed: engine" in proc.stderr
    engine = json.loads(proc.stdout)["checks"][0]
    assert engine["name"] == "engine" and engine["status"] == "fail"
    assert "no Docker engine answers" in engine["fix"] and "no-daemon.sock" in engine["detail"]


def _stand_in(settings, folder: Path, tag: str, labels: str) -> str:
    """A stand-in dockyard image, built here: the base image, a real ds_report where the build keeps it, `labels`."""
    from dockyard import engine

    (folder / "ds_report.txt").write_bytes((ROOT / "tests" / "fixtures" / "ds_report_cpu_jit.txt").read_bytes())
    (folder / "Dockerfile").write_text(f"FROM {settings.base_image_cpu}\nCOPY ds_report.txt /opt/dockyard/ds_report.txt\n"
                                       f"LABEL {labels}\n")
    engine.run(engine.docker(settings, "build", "-q", "-t", tag, str(folder)), capture=True, quiet=True)
    return tag


@pytest.mark.engine
def test_doctor_reads_the_images_saved_ds_report(tmp_path):
    """A stand-in image under its own name, holding a real ds_report where the build keeps it: doctor reads it
    from a container started with the run flags."""
    from dockyard import engine
    from dockyard.settings import Settings

    settings = Settings()
    name = f"dockyard-doctortest-{os.getpid()}"
    tag = _stand_in(settings, tmp_path, f"{name}:0.1.0-cpu", 'dockyard.variant=cpu dockyard.cuda=""')
    try:
        proc = _doctor({"INVOKE_DOCKYARD_IMAGE_NAME": name})
        ds = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["deepspeed ops"]
        # the JIT-only report has no prebuilt op: the cpu variant's ops are reported missing, libaio absent
        assert ds["status"] == "fail" and ds["detail"].startswith(f"{tag}: built")
        assert "NOT built: cpu_adam" in ds["detail"] and "no libaio" in ds["detail"]
        assert "--no-cache" in ds["fix"]
    finally:
        engine.run(engine.docker(settings, "rmi", "-f", tag), capture=True, check=False, quiet=True)


@pytest.mark.engine
def test_doctor_on_a_node_holding_only_a_shipped_cuda_image_probes_with_it(tmp_path):
    """An air-gapped node without GPUs that was shipped the cu128 image alone: doctor looked for the cpu image and
    the base image, found neither, skipped shared memory, ulimits, disk and the DeepSpeed ops, passed, and said to
    build (which such a node cannot). It now probes with the image that is there. (Stand-in image: the base image
    with a ds_report and the cu128 labels, no CUDA; NVML replayed from a recording of a host without GPUs, so
    that auto picks the cpu variant, whose image is not there, on any host.)"""
    from dockyard import engine
    from dockyard.settings import Settings

    no_gpu = tmp_path / "no_gpu.json"
    no_gpu.write_text(json.dumps({"kind": "gpu", "host": {"error": "NVML not found"}, "links": [], "samples": []}))
    settings = Settings()
    name = f"dockyard-doctornode-{os.getpid()}"
    tag = _stand_in(settings, tmp_path, f"{name}:0.1.0-cu128", 'dockyard.variant=cu128 dockyard.cuda="12.8"')
    try:
        proc = _doctor({"INVOKE_DOCKYARD_IMAGE_NAME": name, "DOCKYARD_NVML_REPLAY": str(no_gpu)})
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        assert checks["auto variant"]["detail"].startswith("auto → cpu"), checks["auto variant"]
        assert {"shared memory", "ulimits", "disk"} <= set(checks), checks
        assert checks["deepspeed ops"]["detail"].startswith(f"{tag}: "), checks["deepspeed ops"]
        assert "run container" not in checks
        assert checks["auto image"]["status"] == "warn" and f"{name}:0.1.0-cpu (what auto picks here) is not here" \
            in checks["auto image"]["detail"] and "--variant=cu128" in checks["auto image"]["fix"]
    finally:
        engine.run(engine.docker(settings, "rmi", "-f", tag), capture=True, check=False, quiet=True)
