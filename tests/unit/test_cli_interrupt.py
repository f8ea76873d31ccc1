"""An interrupted task exits with the status it chose (130 for Ctrl-C, 143 for SIGTERM), as `python -m invoke`
runs it, even where the interrupt landed in code exec() ran from a string (a dataclass built by a lazy import):
CPython then marks the interpreter to end by SIGINT, which the CLI's error path clears."""

from __future__ import annotations

import os
import subprocess
import sys

from dockyard import ROOT

TASK = '''
import invoke
from dockyard.cli import checked
from dockyard.common.errors import DockyardError


def body(c):
    try:
        exec("raise KeyboardInterrupt")  # where a signal lands while a dataclass builds its methods
    except KeyboardInterrupt:
        raise DockyardError("interrupted (SIGINT); the partial files were removed", exit_code=130) from None


try:
    checked(body)(invoke.Context())
except invoke.Exit as e:
    raise SystemExit(e.code)
'''


def test_an_interrupt_caught_after_exec_ran_code_still_exits_with_the_status_chosen(tmp_path):
    (tmp_path / "interrupted_task.py").write_text(TASK)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "interrupted_task"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])  # -2 (ended by SIGINT) before the fix
    assert "error: interrupted (SIGINT)" in r.stderr and "Traceback" not in r.stderr
