"""One finding of `invoke doctor`: passes, warns or fails, with what was found and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
