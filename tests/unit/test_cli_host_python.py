"""A task started by an invoke of another Python than dockyard's venv (a system or pipx invoke, the venv not
activated) says so in one line, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import tomllib

from dockyard import ROOT

# `rich` missing, as from an invoke whose Python has invoke (and pydantic, PyYAML) but not the rest
WITHOUT_RICH = "import sys; sys.modules['rich'] = None; from invoke.main import program; program.run()"


def test_a_task_run_by_a_python_without_the_host_dependencies_says_which_invoke_to_run():
    """The newcomer audit: `invoke recipes` from Debian's python3-invoke ended in "ModuleNotFoundError: No module
    named 'rich'" under a traceback of Invoke's and dockyard's frames."""
    r = subprocess.run([sys.executable, "-c", WITHOUT_RICH, "recipes"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr == (f"error: this invoke runs on {sys.executable}, which lacks what dockyard's tasks need "
                        "(rich): run the invoke of the venv dockyard is installed in (.venv/bin/invoke, or "
                        "`. .venv/bin/activate` first; installed with `.venv/bin/pip install -e .`)\n")


def test_the_host_packages_are_pyprojects_dependencies():
    from dockyard.cli import HOST_PACKAGES

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    assert names == set(HOST_PACKAGES.values()) | {"invoke"}


# ruff missing (the README's host install: `pip install -e .`); anything `invoke test` would run stops the program
WITHOUT_RUFF = ("import sys, invoke; sys.modules['ruff'] = None; "
                "invoke.Context.run = lambda self, command, **kw: sys.exit(f'ran: {command}'); "
                "from invoke.main import program; program.run()")


def test_invoke_test_without_the_test_tools_says_what_to_install_before_running_anything():
    """`invoke test` from the README's host install ended "/path/python3: No module named ruff", exit 1, and no
    word of what to install (README's Development: `pip install -e '.[train,dev]'`)."""
    r = subprocess.run([sys.executable, "-c", WITHOUT_RUFF, "test"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and "ran: " not in r.stderr + r.stdout, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: invoke test runs ruff and pytest in this invoke's Python ({sys.executable}), "
                               "which lacks ruff: install the test tools and the training stack the tests train "
                               "with, `pip install -e '.[train,dev]'`"), r.stderr


def test_the_test_packages_are_pyprojects_dev_and_train_extras():
    from dockyard.cli import TEST_PACKAGES

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in extras["dev"] + extras["train"]}
    assert set(TEST_PACKAGES.values()) <= names
