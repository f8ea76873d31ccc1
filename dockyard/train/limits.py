"""Bounds on code from the model folder that may run without end: a chat template (Jinja) or a module-name pattern
that loops or grows a string for ever is stopped, as an error of ours, instead of hanging or swamping every rank."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def memory_limit(grow: int) -> Iterator[None]:
    """MemoryError, rather than the OOM killer, where this process's address space grows by more than `grow` bytes
    within: the soft RLIMIT_AS is set that far above what the process maps now, and set back afterwards. A limit
    of the user's own (`ulimit -v`) that is lower already stays as it is."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    bound = mapped + grow if hard == resource.RLIM_INFINITY else min(mapped + grow, hard)
    if soft != resource.RLIM_INFINITY and soft <= bound:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class TooSlow(BaseException):
    """A chat template past its time (BaseException: not taken for the template's own error)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TooSlow in the main thread after `seconds` (a model's chat template is Jinja that may loop ~forever: the
    run hung after its settings line, silent). Elsewhere (a thread) no limit. An alarm already set by the caller
    (a test harness's limit) is left to fire first when it is due first, and set again afterwards otherwise."""
    outer, every = signal.getitimer(signal.ITIMER_REAL)
    if threading.current_thread() is not threading.main_thread() or (0 < outer <= seconds and not every):
        yield
        return

    def expired(_signum: int, _frame: Any) -> None:
        raise TooSlow

    before = signal.signal(signal.SIGALRM, expired)
    began = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - began), 0.001), every)
