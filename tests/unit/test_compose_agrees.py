"""compose/*.yml keep their own text (compose reads static YAML, not Python): held here to what
dockyard/launch/node.py renders for every other launcher, so that the two cannot drift apart. The variables are
filled in as compose would (${VAR:-default}, $$ for a $), and multinode.yml's command runs under bash with a
recording torchrun: the argv it gets is node.py's for the same values."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from dockyard.common import envvars
from dockyard.common.errors import cut
from dockyard.launch import node
from dockyard.settings import ROOT
from tests.support.hostile import environment, recorder, records

VALUES = {"NNODES": "2", "MASTER_ADDR": "10.0.0.1", "IFACE": "eth0", "LOCAL_ADDR": "10.0.0.2",
          "DOCKYARD_RUN_ID": "exp1", "DOCKYARD_RECIPE": "ddp"}


def _service(name: str) -> dict:
    return yaml.safe_load((ROOT / "compose" / name).read_text())["services"]["train"]


def _compose(text: str, values: dict[str, str]) -> str:
    """`text` with compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR:?message}; $$ is a $."""
    def one(m: re.Match) -> str:
        name, how, default = m[1], m[2] or "", m[3] or ""
        return values.get(name) or (default if how == ":-" else "")
    return re.sub(r"(?<!\$)\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, text).replace("$$", "$")


def test_the_one_node_service_starts_the_trainer_as_node_renders_it():
    svc = _service("train.yml")
    nproc = "${DOCKYARD_NPROC:-2}"
    # compose's one node is torchrun --standalone without --local-addr (its container resolves its own hostname)
    assert svc["command"][:3] == node.torchrun_argv(nproc)[:3]
    assert svc["command"][3:] == node.entry_argv("${DOCKYARD_RECIPE:-zero2}", node.run_dir_inside("${DOCKYARD_RUN_ID:-compose}"))
    # the compile cache in the runs folder, as the Kubernetes pods keep it (the trainer checks it)
    assert svc["environment"] == node.container_env() | node.compile_in_runs_env()
    assert svc["working_dir"] == node.WORKDIR
    assert [v.rsplit(":", 1)[-1] for v in svc["volumes"]] == [node.RUNS_INSIDE, node.HF_INSIDE]


@pytest.mark.parametrize("path", ["compose/train.yml", "compose/gpu.yml", "compose/multinode.yml",
                                  "docs/multinode.md"])
def test_every_compose_example_runs_as_the_user_as_invoke_run_does(path):
    """The service runs as ${DOCKYARD_UID:-1000}:${DOCKYARD_GID:-1000}: the examples left them out, and for a user
    whose uid is not 1000 the run could not write its runs folder. Each example says them, as `invoke run` passes
    --user $(id -u):$(id -g)."""
    assert _service("train.yml")["user"] == "${DOCKYARD_UID:-1000}:${DOCKYARD_GID:-1000}"
    text = re.sub(r"\\\n[#\s]*", " ", (ROOT / path).read_text())  # a command continued on the next line
    examples = [line for line in text.splitlines() if "docker compose -f" in line]
    assert examples
    for line in examples:
        assert "DOCKYARD_UID=$(id -u) DOCKYARD_GID=$(id -g)" in line, line
    if path == "compose/train.yml":  # where memlock cannot be unlimited, the number `invoke doctor` prints
        assert "DOCKYARD_MEMLOCK=<bytes> that `invoke doctor` prints" in text


@pytest.mark.parametrize("rank, resume", [(0, False), (1, False), (0, True), (1, True)])
def test_the_multinode_service_starts_the_rendezvous_node_renders(tmp_path, rank, resume):
    """And DOCKYARD_RESUME=1 continues the run, as `invoke run --resume` does: after a lost node, the same command again
    on every node met "already holds a run; ... add --resume", which the service had no way to add."""
    svc = _service("multinode.yml")
    values = {**VALUES, "NODE_RANK": str(rank), **({"DOCKYARD_RESUME": "1"} if resume else {})}
    env = {k: _compose(str(v), values) for k, v in svc["environment"].items()}
    rdzv = node.Rendezvous(endpoint=f"10.0.0.1:{node.PORT}", run_id="exp1", is_host=rank == 0, iface="eth0",
                           local_addr="10.0.0.2")
    expected_env = rdzv.env() | {envvars.NODE_RANK: str(rank)}
    assert {k: env[k] for k in expected_env} == {**expected_env, envvars.RENDEZVOUS: env[envvars.RENDEZVOUS]}
    assert json.loads(env[envvars.RENDEZVOUS]) == json.loads(expected_env[envvars.RENDEZVOUS])

    recorder(tmp_path / "bin", "torchrun")
    log = tmp_path / "argv"
    command = [_compose(w, values) for w in svc["command"]]
    p = subprocess.run(command, env={**env, **environment(tmp_path / "bin", log, tmp_path / "mark")},
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    expected = node.torchrun_argv("gpu", "2", rdzv.torchrun_flags()) + node.entry_argv("ddp", node.run_dir_inside("exp1"),
                                                                                         resume=resume)
    assert ["torchrun", *records(log)[0]["argv"]] == expected


def _multinode(tmp_path, values: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """multinode.yml's command run with `values` as compose fills them in, and a recording torchrun: what it did, and
    the torchrun calls it made (all of them so far in tmp_path)."""
    svc = _service("multinode.yml")
    env = {k: _compose(str(v), values) for k, v in svc["environment"].items()}
    recorder(tmp_path / "bin", "torchrun")
    log = tmp_path / "argv"
    p = subprocess.run([_compose(w, values) for w in svc["command"]],
                       env={**env, **environment(tmp_path / "bin", log, tmp_path / "mark")},
                       capture_output=True, text=True, timeout=30)
    return p, records(log)


def test_the_multinode_service_refuses_a_resume_value_it_does_not_know(tmp_path):
    p, torchruns = _multinode(tmp_path, {**VALUES, "NODE_RANK": "0", "DOCKYARD_RESUME": "yes"})
    assert p.returncode == 2 and not torchruns, "refused before torchrun"
    assert p.stderr == "DOCKYARD_RESUME='yes': give 1 to continue the run from its last checkpoint, or leave it out\n"


@pytest.mark.parametrize("given", ["120,last_call_timeout=1", "120,is_host=1", "0", "0120", "604801", "9" * 5000, "2m"])
def test_the_multinode_service_takes_a_join_timeout_of_whole_seconds_in_range_alone(tmp_path, given):
    """JOIN_TIMEOUT is pasted into --rdzv-conf after `join_timeout=`: `120,last_call_timeout=1` (or `120,is_host=1`
    on a node that does not host the store) passed torchrun's check of join_timeout and handed torch's rendezvous a key
    of the user's; it also made the DOCKYARD_RENDEZVOUS record, which is JSON, unreadable (as 0120 does). Now the
    service takes whole seconds from 1 to a week, as torchrun and invoke run do, and refuses anything else before
    torchrun starts."""
    p, torchruns = _multinode(tmp_path, {**VALUES, "NODE_RANK": "1", "JOIN_TIMEOUT": given})
    assert p.returncode == 2 and not torchruns, (p.stderr, "refused before torchrun")
    # the value said cut, as every other value is (5,000 digits were said whole)
    assert p.stderr == f"JOIN_TIMEOUT='{cut(given, 60)}': give whole seconds, 1 to {envvars.LONGEST_WAIT} (a week)\n"
    for taken in ("1", str(envvars.LONGEST_WAIT)):  # the range's ends, as torchrun's check takes them
        p, torchruns = _multinode(tmp_path, {**VALUES, "NODE_RANK": "1", "JOIN_TIMEOUT": taken})
        assert p.returncode == 0 and f"join_timeout={taken}" in torchruns[-1]["argv"][5], p.stderr
