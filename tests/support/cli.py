"""The project's commands as a user types them: `invoke ARGS` from the project root, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dockyard import ROOT

INVOKE = [sys.executable, "-m", "invoke"]


def invoke(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run `invoke ARGS` as a user would, from the project root."""
    return subprocess.run([*INVOKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
