"""Stopping what a test started, all of it: torchrun starts each worker in a session of its own (torch's
SubprocessHandler), so killing the launcher's process group leaves the workers running, holding the test's pipes
and the machine's cores."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess

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


def said_by(p: subprocess.Popen) -> str:
    """What a process printed, for the message of an assertion that gave up waiting on it: one still running (a
    deadline passed) is stopped first, with all it started. communicate() on it raised TimeoutExpired, or waited for
    ever, in the message's place, hiding what the test was waiting for."""
    running = p.poll() is None
    if running:
        kill_tree(p.pid)
    out, err = p.communicate(timeout=30)
    how = "still running at the deadline: stopped" if running else f"ended with exit {p.returncode}"
    return f"{how}\n{(out or '')[-2000:]}\n{(err or '')[-3000:]}"


def bounded_run(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True) for a command fed hostile input that may, where the
    code under test regresses, read a device for ever or wait on a pipe: it runs in a session of its own, may write
    no file past 64 MiB nor hold more than 4 GiB of memory, and on `timeout` everything it started is killed (an
    orphaned `cp /dev/zero` filled the disk) before TimeoutExpired is raised."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          preexec_fn=limits, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            kill_tree(p.pid)
            p.communicate()
            raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)
