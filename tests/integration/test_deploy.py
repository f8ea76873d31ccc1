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


COMPILED = ["--torch_compile", "true", "--max_steps", "1", "--save_strategy", "no", "--logging_steps", "1"]


def test_compose_keeps_compiled_kernels_for_the_next_run_in_the_runs_folder_for_its_user_alone(settings, cpu_image,
                                                                                                tmp_path):
    """compose/train.yml keeps the compile cache in the runs folder (nothing of it on the host's side): the trainer
    makes it, for the run's user alone. The runs are a user's (uid 1000), not this test's root; a team's runs folder
    where another user's run made the cache first is not used: that run compiles in its /tmp, saying so."""
    user = 1000
    for name in ("runs", "hf", "team"):
        (tmp_path / name).mkdir(mode=0o700)
        os.chown(tmp_path / name, user, user)
    (tmp_path / "team" / ".cache" / "compile" / "inductor").mkdir(parents=True, mode=0o700)  # root's, here
    env = {"DOCKYARD_IMAGE": cpu_image, "DOCKYARD_UID": str(user), "DOCKYARD_GID": str(user),
           "HF_CACHE": str(tmp_path / "hf")}
    if engine.daemon_memlock_hard_limit():
        env["DOCKYARD_MEMLOCK"] = str(engine.daemon_memlock_hard_limit())
    project = ["-p", f"dockyardcc{os.getpid()}", "-f", "train.yml"]
    said = {}
    try:
        for run_id, runs in (("cold", "runs"), ("warm", "runs"), ("other", "team")):
            argv = ["torchrun", "--nproc-per-node=1", "--standalone", "-m", "dockyard.train", "--recipe", "ddp",
                    "--run-dir", f"/workspace/runs/{run_id}", "--", *COMPILED]
            r = _compose(settings, *project, "run", "--rm", "train", *argv,
                         env={**env, "DOCKYARD_RUNS": str(tmp_path / runs)})
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            said[run_id] = r.stdout + r.stderr
    finally:
        _compose(settings, *project, "down", env=env)
    used = {run_id: json.loads((tmp_path / runs / run_id / "manifest.json").read_text())["metrics"]["compile_cache"]
            for run_id, runs in (("cold", "runs"), ("warm", "runs"), ("other", "team"))}
    assert used["cold"]["misses"] > 0 and used["warm"]["misses"] == 0, used
    assert used["warm"]["hits"] == used["cold"]["hits"] + used["cold"]["misses"], "every graph from the first run"
    for name in ("inductor", "triton"):
        made = (tmp_path / "runs" / ".cache" / "compile" / name).stat()
        assert made.st_uid == user and made.st_mode & 0o777 == 0o700, "the trainer made it, for its user alone"
    assert "compile cache not used" not in said["cold"] + said["warm"]
    assert ("compile cache not used: TORCHINDUCTOR_CACHE_DIR=/workspace/runs/.cache/compile/inductor belongs to uid "
            f"0, not to this process's uid {user}") in said["other"]
    assert used["other"]["misses"] > 0
    assert not any((tmp_path / "team" / ".cache" / "compile" / "inductor").iterdir()), "nothing read or written there"


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
