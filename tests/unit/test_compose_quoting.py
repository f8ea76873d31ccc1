"""compose/multinode.yml with hostile variables: compose pastes ${VAR} into the text it is in, so the command's
`bash -c` script reads every user value from a variable instead. `compose config` (no engine needed) renders the
service as compose would create it; its command then runs under bash with the service's environment and a
recording torchrun (tests/support/hostile.py): each value arrives as one word, or a bad run id stops it first,
and no attack runs."""

from __future__ import annotations

import re
import shlex
import subprocess

import yaml
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard.settings import ROOT
from tests.support.hostile import environment, line_text, recorder, records

ATTACK = 'it\'s a "test" `touch "$MARK"` $(touch "$MARK") ${HOME} \\ * #x'
EXAMPLES = hsettings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
value = line_text


def _service(settings, env: dict[str, str]) -> dict:
    """The train service as compose creates it (`config` writes each $ of a value as $$)."""
    r = subprocess.run([*shlex.split(settings.compose), "-f", "train.yml", "-f", "multinode.yml", "config"],
                       cwd=ROOT / "compose", capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **env})
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(r.stdout)["services"]["train"]
    svc["command"] = [w.replace("$$", "$") for w in svc["command"]]
    svc["environment"] = {k: str(v).replace("$$", "$") for k, v in svc["environment"].items()}
    return svc


@EXAMPLES
@example(recipe=ATTACK, run_id="exp1", local="10.0.0.2 $(touch \"$MARK\")")
@example(recipe="zero2", run_id=ATTACK, local="10.0.0.2")
@given(recipe=value, run_id=st.one_of(st.just("exp-1"), value), local=value)
def test_every_value_reaches_torchrun_as_one_word_and_nothing_runs(settings, tmp_path_factory, recipe, run_id, local):
    base = tmp_path_factory.mktemp("compose")
    svc = _service(settings, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "IFACE": "eth0",
                              "LOCAL_ADDR": local, "DOCKYARD_RUN_ID": run_id, "DOCKYARD_RECIPE": recipe})
    recorder(base / "bin", "torchrun")
    log = base / "argv"
    p = subprocess.run(svc["command"], env={**svc["environment"], **environment(base / "bin", log, base / "pwned")},
                       capture_output=True, text=True, timeout=30)
    assert not (base / "pwned").exists(), "a value ran as a command"
    got = records(log)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", run_id):
        assert p.returncode == 2 and "DOCKYARD_RUN_ID" in p.stderr and not got
        return
    assert p.returncode == 0, p.stderr
    assert got[0]["argv"] == ["--nproc-per-node=gpu", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
                              f"--rdzv-id={run_id}", "--rdzv-conf=is_host=0,join_timeout=120", "--max-restarts=0",
                              f"--local-addr={local}", "-m", "dockyard.train", "--recipe", recipe,
                              "--run-dir", f"/workspace/runs/{run_id}"]
