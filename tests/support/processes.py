"""Stopping what a test started, all of it: torchrun starts each worker in a session of its own (torch's
SubprocessHandler), so killing the launcher's process group leaves the workers running, holding the test's pipes
and the machine's cores."""

from __future__ import annotations

import contextlib

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILL to the process and every descendant it has now (found before any is killed: an orphan's parent
    changes). The descendants are waited for; the process itself is left to its Popen to reap, whose returncode
    would read 0 otherwise."""
    with contextlib.suppress(psutil.NoSuchProcess):
        top = psutil.Process(pid)
        below = top.children(recursive=True)
        for proc in [*below, top]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(below, timeout=10)
