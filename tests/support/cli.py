"""The project's commands as a user types them: `invoke ARGS` from the project root, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dockyard import ROOT

INVOKE = [sys.executable, "-m", "invoke"]
# root without the capabilities that read past file modes: a file or folder of mode 0 is refused to it as to a user
AS_A_USER = [] if os.geteuid() else ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                                     "--bounding-set=-dac_override,-dac_read_search"]


def invoke(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 1800,
           as_a_user: bool = False) -> subprocess.CompletedProcess:
    """Run `invoke ARGS` as a user would, from the project root; `as_a_user`: one file modes hold to, even as root."""
    return subprocess.run([*(AS_A_USER if as_a_user else []), *INVOKE, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def invoke_here(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`invoke ARGS` in this process (Invoke's own Program, the real tasks.py and invoke.yaml), for tests that try
    hundreds of values: a subprocess each would take minutes. sys.argv is what the tasks read the overrides after
    `--` from; the environment gets `env` for the call alone."""
    import contextlib
    import io

    from invoke.main import program

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = ["invoke", *args]
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            program.run(["invoke", "--search-root", str(ROOT), *args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["invoke", *args], code, out.getvalue(), err.getvalue())


def short_error(r: subprocess.CompletedProcess, *names: str) -> None:
    """The outcome of a refused value: a non-zero exit and one printable `error:` line naming one of `names`
    ("" for any), never a traceback."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    # one line that starts with "error: " (the refused value, quoted in it, may hold "error: " too)
    errors = [line for line in r.stderr.splitlines(keepends=True) if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].endswith("\n"), r.stderr
    said = r.stderr[r.stderr.index(errors[0]):]
    assert said.isprintable() or set(said) - set(filter(str.isprintable, said)) <= {"\n", "\t"}, repr(said)
    assert any(n in said for n in names), f"{said!r} names none of {names}"


def docker(settings, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The docker client the settings name, as tests call it directly (outside the tasks): text output captured."""
    from dockyard import engine

    return subprocess.run(engine.docker(settings, *args), capture_output=True, text=True, check=check)
