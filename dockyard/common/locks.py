"""One process at a time: an exclusive, non-blocking lock on a file, refused at once with the caller's words."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from dockyard.common.errors import DockyardError


@contextlib.contextmanager
def held_alone(lock_file: Path, busy: str) -> Iterator[None]:
    """Hold `lock_file` (made if missing) for the block; DockyardError(busy) when another process holds it."""
    with open(lock_file, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DockyardError(busy) from None
        yield
