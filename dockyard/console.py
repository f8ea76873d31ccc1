"""What a user sees of long work: sizes in words, free-space checks, progress bars, and the end of a
failed command's output (the "  |" lines every error quotes)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from dockyard.common.errors import DockyardError
from dockyard.common.units import duration, human

TAIL_LINES = 20  # how much of a failed command's output an error message quotes


def check_free(folder: Path, need: int, what: str, hint: str) -> int:
    """Refuse before writing when `folder` (or its nearest existing parent) lacks `need` bytes; the bytes free."""
    free = shutil.disk_usage(existing(folder)).free
    if free < need:
        raise DockyardError(f"not enough space in {folder}: {human(free)} free, {what} needs about "
                            f"{human(need)}. {hint}")
    return free


def existing(folder: Path) -> Path:
    """`folder`, or its nearest parent that exists: where a folder not made yet will take its space."""
    while not folder.exists():
        folder = folder.parent
    return folder


class Lines:
    """Progress where stderr is not a terminal (a log, CI, nohup): a plain line every LINE_EVERY seconds, with the
    rate and the time left as a bar shows them, "save dockyard_0.1.0-cu132.tar.zst: 1.2 GB of 6.9 GB (17%), 41 s,
    29.3 MB/s, about 3.2 min left", and one at the end, "... (100%) in 3.9 min, 29.5 MB/s". A bar drawn there would
    print nothing until the work was done, and a save of a CUDA image takes minutes."""

    LINE_EVERY = 30.0

    def __init__(self, things: bool, clock=None):
        import time

        self.things, self.clock = things, clock or time.monotonic
        self.tasks: list[dict] = []

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc) -> None:
        for task in self.tasks:
            if exc[0] is None and task.get("said_done") != task["completed"]:
                self._say(task, done=True)

    def add_task(self, description: str, total: float | None = None, completed: float = 0) -> int:
        now = self.clock()
        self.tasks.append({"description": description, "total": total, "completed": completed, "start": now,
                           "said": now, "begun_at": completed})  # a resumed transfer's rate counts from here
        return len(self.tasks) - 1

    def advance(self, task: int, advance: float = 1) -> None:
        t = self.tasks[task]
        t["completed"] += advance
        if self.clock() - t["said"] >= self.LINE_EVERY:
            self._say(t)

    def update(self, task: int, *, total: float | None = None, completed: float | None = None) -> None:
        """rich's Progress.update, as much as dockyard asks of it: a total known better as the work goes on, or
        the count so far as another program reports it (rsync's)."""
        if total is not None:
            self.tasks[task]["total"] = total
        if completed is not None:
            self.advance(task, completed - self.tasks[task]["completed"])

    def _say(self, t: dict, done: bool = False) -> None:
        import sys

        now = t["said"] = self.clock()
        t["said_done"] = t["completed"]
        shown = min(t["completed"], t["total"]) if t["total"] else t["completed"]  # (a tar's headers: past its total)
        said = f"{shown:.0f}" if self.things else human(shown)
        if t["total"]:
            said += f" of {t['total']:.0f}" if self.things else f" of {human(t['total'])}"
            said += f" ({min(1.0, t['completed'] / t['total']):.0%})"
        took = now - t["start"]
        said += f" in {duration(took)}" if done else f", {duration(took)}"
        rate = (shown - t["begun_at"]) / took if took > 0 else 0.0
        if rate > 0 and not self.things:
            said += f", {human(rate)}/s"
        begun = t["total"] and shown - t["begun_at"] >= t["total"] / 100  # a rate read from less says nothing yet
        if rate > 0 and begun and not done and shown < t["total"]:
            said += f", about {duration((t['total'] - shown) / rate)} left"
        print(f"{t['description']}: {said}", file=sys.stderr, flush=True)


def progress(things: bool = False):
    """A bar on stderr: a transfer (bytes, speed, time), or with `things` a count of things done ("37/600",
    time); where stderr is not a terminal, a line now and then (Lines)."""
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
    if not console.is_terminal:
        return Lines(things)
    counts = [MofNCompleteColumn()] if things else [DownloadColumn(), TransferSpeedColumn()]
    return Progress(TextColumn("{task.description}"), BarColumn(), *counts, TimeElapsedColumn(), console=console,
                    transient=True)


def tail(lines: Iterable[str]) -> str:
    """The last lines of a command's output, indented under the message that quotes the command."""
    # a progress line rewritten in place (rsync's, "\r 32,768 0% ...\r 102,137,856 2%"): what a terminal showed last
    return "\n".join(f"  | {line.rstrip().rsplit(chr(13), 1)[-1]}" for line in list(lines)[-TAIL_LINES:])


def last_lines(f: IO[bytes]) -> list[str]:
    """The last lines written to a file a command's output went to."""
    f.seek(0)
    return f.read().decode(errors="replace").strip().splitlines()[-TAIL_LINES:]
