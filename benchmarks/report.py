"""The one report writer of the benchmarks: a header that says where and when, the table printed, and the same
text kept in benchmarks/results/<name>.md."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def header(title: str, *notes: str) -> list[str]:
    """`# title`, then one line: UTC time, cores, machine, and the notes (what was measured, how often)."""
    when = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {platform.machine()}"
    return [f"# {title}", "", ". ".join([when, *notes]), ""]


def write(name: str, lines: list[str]) -> Path:
    text = "\n".join(lines) + "\n"
    print(text)
    out = RESULTS / f"{name}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
