"""What a user sees of long work: sizes in words, free-space checks, progress bars, and the end of a
failed command's output (the "  |" lines every error quotes)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from dockyard.common.errors import DockyardError

TAIL_LINES = 20  # how much of a failed command's output an error message quotes


def human(n: float) -> str:
    """Bytes in decimal units, as `df -H` and transfer tools show them."""
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"


def check_free(folder: Path, need: int, what: str, hint: str) -> None:
    """Refuse before writing when `folder` (or its nearest existing parent) lacks `need` bytes."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < need:
        raise DockyardError(f"not enough space in {folder}: {human(free)} free, {what} needs about "
                            f"{human(need)}. {hint}")


def progress(things: bool = False):
    """A bar on stderr: a transfer (bytes, speed, time), or with `things` a count of things done ("37/600",
    time); nothing when stderr is not a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    counts = [MofNCompleteColumn()] if things else [DownloadColumn(), TransferSpeedColumn()]
    return Progress(TextColumn("{task.description}"), BarColumn(), *counts, TimeElapsedColumn(), console=console,
                    transient=True, disable=not console.is_terminal)


def tail(lines: Iterable[str]) -> str:
    """The last lines of a command's output, indented under the message that quotes the command."""
    return "\n".join(f"  | {line}" for line in list(lines)[-TAIL_LINES:])


def last_lines(f: IO[bytes]) -> list[str]:
    """The last lines written to a file a command's output went to."""
    f.seek(0)
    return f.read().decode(errors="replace").strip().splitlines()[-TAIL_LINES:]
