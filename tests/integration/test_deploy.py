"""The compose files, run for real on the engine. Slurm runs for real in test_slurm.py; the Kubernetes manifests
are written by `invoke k8s` and validated in tests/unit/test_k8s.py (no cluster here)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
import yaml

from dockyard import engine
from dockyard.settings import ROOT

pytestmark = pytest.mark.engine


def _compose(settings, *args, env=None):
    """The compose command is a setting: `docker compose` (v2) for most users, `docker-compose` (v1) here."""
    argv = shlex.split(settings.compose) + list(args)
    return subprocess.run(argv, cwd=ROOT / "compose", capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def test_compose_trains_zero2_in_the_cpu_image(settings, cpu_image, tmp_path):
    env = {"DOCKYARD_IMAGE": cpu_image, "DOCKYARD_RUNS": str(tmp_path), "DOCKYARD_RUN_ID": "compose1",
           "DOCKYARD_UID": str(os.getuid()), "DOCKYARD_GID": str(os.getgid()), "HF_CACHE": str(tmp_path / "hf")}
    if engine.daemon_memlock_hard_limit():  # this engine cannot grant unlimited locked memory (see launch.memlock_flag)
        env["DOCKYARD_MEMLOCK"] = str(engine.daemon_memlock_hard_limit())
    project = ["-p", f"dockyardtest{os.getpid()}", "-f", "train.yml"]
    try:
        r = _compose(settings, *project, "run", "--rm", "train", env=env)
    finally:
        _compose(settings, *project, "down", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads((tmp_path / "compose1" / "manifest.json").read_text())
    assert m["status"] == "completed" and m["world_size"] == 2
    assert m["strategy"]["in_effect"]["engine"] == "deepspeed" and m["strategy"]["in_effect"]["zero_stage"] == 2


def test_multinode_compose_renders_rendezvous_gpus_and_host_network(settings):
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "198.18.0.1", "DOCKYARD_NPROC": "gpu", "IFACE": "eth9",
           "LOCAL_ADDR": "198.18.0.2", "DOCKYARD_RUN_ID": "exp1"}
    r = _compose(settings, "-f", "train.yml", "-f", "multinode.yml", "-f", "gpu.yml", "config", env=env)
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(r.stdout)["services"]["train"]
    assert svc["network_mode"] == "host" and svc["ipc"] == "host"
    # The command reads the values from the environment (tests/unit/test_compose_quoting.py runs it)
    env_in = svc["environment"]
    assert {"DY_NNODES": "2", "DY_ENDPOINT": "198.18.0.1:29500", "DY_RUN_ID": "exp1", "DY_LOCAL_ADDR": "198.18.0.2",
            "DY_NPROC": "gpu"}.items() <= {k: str(v) for k, v in env_in.items()}.items()
    words = set(svc["command"][2].split())
    assert {'"--nnodes=$$DY_NNODES"', '"--rdzv-id=$$DY_RUN_ID"', '"--local-addr=$$DY_LOCAL_ADDR"'} <= words
    assert svc["environment"]["GLOO_SOCKET_IFNAME"] == svc["environment"]["NCCL_SOCKET_IFNAME"] == "eth9"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    missing = _compose(settings, "-f", "train.yml", "-f", "multinode.yml", "config",
                       env={**env, "DOCKYARD_RUN_ID": ""})
    assert missing.returncode != 0 and "set DOCKYARD_RUN_ID" in missing.stderr
