"""An interrupted task exits with the status it chose (130 for Ctrl-C, 143 for SIGTERM), as `python -m invoke`
runs it, even where the interrupt landed in code exec() ran from a string (a dataclass built by a lazy import):
CPython then marks the interpreter to end by SIGINT, which the CLI's error path clears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

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


WRAPPED = '''
import signal

import invoke
from dockyard.cli import checked
from dockyard.transport.save import interrupts_as_errors


class Field:  # as a dataclass field a lazy import builds: the signal lands in its __set_name__
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt(signal.Signals.{sig}.name)


def body(c):
    with interrupts_as_errors("saving dockyard-0.1.0-cpu"):
        class Locals:  # Python raises the interrupt as "RuntimeError: Error calling __set_name__ ..."
            buffer = Field()


try:
    checked(body)(invoke.Context())
except invoke.Exit as e:
    raise SystemExit(e.code)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_python_wraps_while_a_class_is_built_still_ends_the_save_with_its_clean_up_and_status(tmp_path, sig):
    (tmp_path / "wrapped_task.py").write_text(WRAPPED.replace("{sig}", sig.name))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "wrapped_task"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 128 + sig, (r.returncode, r.stderr[-2000:])  # 1, on a RuntimeError's traceback, before
    assert f"interrupted ({sig.name}); the partial files were removed" in r.stderr and "Traceback" not in r.stderr


TASKS = '''
from dockyard.cli import task  # as tasks.py's: checked, then Invoke's


class Field:  # as a dataclass field a lazy import builds (rich's, for a task's first table): the Ctrl-C lands here
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt


@task
def wrapped(c):
    class ConsoleThreadLocals:  # Python raises the interrupt as "RuntimeError: Error calling __set_name__ ..."
        buffer = Field()


@task
def plain(c):
    raise KeyboardInterrupt
'''


def test_a_ctrl_c_python_wraps_while_a_class_is_built_ends_any_task_as_a_ctrl_c_does(tmp_path):
    """A task of no clean-up of its own (doctor, plan, inventory: rich's tables and bars are their first lazy
    imports) ended on 'RuntimeError: Error calling __set_name__ ...' and its traceback when the Ctrl-C landed while a
    class was built; it ends as any other Ctrl-C of the task does. Real invoke, a tasks module of two tasks."""
    (tmp_path / "wrapped_tasks.py").write_text(TASKS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    said = {name: subprocess.run([sys.executable, "-m", "invoke", "-c", "wrapped_tasks", name], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120) for name in ("plain", "wrapped")}
    assert "Traceback" not in said["wrapped"].stderr, said["wrapped"].stderr[-2000:]
    assert (said["wrapped"].returncode, said["wrapped"].stderr) == (said["plain"].returncode, said["plain"].stderr)
