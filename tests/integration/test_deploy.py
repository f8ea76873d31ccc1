"""Compose and Kubernetes files: compose runs for real on the engine; Kubernetes is checked for consistency (no
cluster here). The Slurm script is written by `invoke slurm` and tested in test_multinode.py."""

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
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "198.18.0.1", "DOCKYARD_NPROC": "gpu"}
    r = _compose(settings, "-f", "train.yml", "-f", "multinode.yml", "-f", "gpu.yml", "config", env=env)
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(r.stdout)["services"]["train"]
    assert svc["network_mode"] == "host" and svc["ipc"] == "host"
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=198.18.0.1", "--nproc-per-node=gpu"} <= set(svc["command"])
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    missing = _compose(settings, "-f", "train.yml", "-f", "multinode.yml", "config",
                       env={k: "" for k in ("NNODES",)} | {"NODE_RANK": "0", "MASTER_ADDR": "h"})
    assert missing.returncode != 0 and "set NNODES" in missing.stderr


def test_kubernetes_job_agrees_with_itself():
    svc, job = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "train.yaml").read_text())
    spec = job["spec"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == int(env["NNODES"])
    assert svc["spec"]["clusterIP"] == "None" and spec["template"]["spec"]["subdomain"] == svc["metadata"]["name"]
    assert "--node-rank=$JOB_COMPLETION_INDEX" in container["args"][0]
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in spec["template"]["spec"]["volumes"])
