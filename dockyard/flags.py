"""What each number flag of a task takes: the annotations of tasks.py, read by dockyard/cli.py with pydantic.

A value outside these (not a number, nan, inf, negative, absurdly large) is a short error before the task runs;
what depends on another flag (--node-rank below --nodes) is checked by the task's own module.
"""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from dockyard.common.envvars import LONGEST_WAIT, MOST


def _text_as(pattern: str, hint: str):
    """A validator that lets pydantic parse a typed number only when its text has this form (`two` or `nan` is
    refused here, saying what was expected)."""
    form = re.compile(pattern)

    def check(v: object) -> object:
        if isinstance(v, str):
            if not form.fullmatch(v.strip()):
                raise ValueError(hint)
            return v.strip()
        return v

    return check


_whole = _text_as(r"[+-]?[0-9]+", "expected a whole number, e.g. 4")
_decimal = _text_as(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", "expected a number, e.g. 80 or 7.5")


Whole = BeforeValidator(_whole)


def _not_below(unset: int, low: int):
    """A bound that lets a flag's default (`unset`, below it) through: the task tells given from not given."""
    def check(v: int) -> int:
        if v < low and v != unset:
            raise ValueError(f"takes {low} or more")
        return v

    return check


Count = Annotated[int, Whole, Field(ge=0, le=MOST)]                 # processes, GPUs: 0 = what the host has
Nodes = Annotated[int, Whole, Field(ge=1, le=MOST)]
# -1: not given (required of several); the schema says the range a user gives (errors.accepted reads it)
Rank = Annotated[int, Whole, Field(le=4095, json_schema_extra={"minimum": 0}), AfterValidator(_not_below(-1, 0))]
Port = Annotated[int, Whole, Field(ge=1, le=65535)]
PortOrConfig = Annotated[int, Whole, Field(ge=0, le=65535)]         # 0 = the ssh config's
Seconds = Annotated[int, Whole, Field(ge=1, le=LONGEST_WAIT)]
Restarts = Annotated[int, Whole, Field(ge=0, le=1000)]
Level = Annotated[int, Whole, Field(ge=0, le=22)]                   # 0 = the compressor's default
GiB = Annotated[float, BeforeValidator(_decimal), Field(ge=0, le=2**20, allow_inf_nan=False)]  # 0 = what the host has


def _auto_or_whole(v: object) -> object:
    """`auto` as 0 (what a run with no tuning flags does); otherwise a whole number typed as such."""
    if isinstance(v, str) and v.strip() == "auto":
        return 0
    return _text_as(r"[+-]?[0-9]+", "expected auto or a whole number, e.g. 4")(v)


Batch = Annotated[int, BeforeValidator(_auto_or_whole), Field(ge=0, le=2**16)]  # per micro-batch; auto, 0: the run's
Tokens = Annotated[int, BeforeValidator(_auto_or_whole), Field(ge=0, le=2**24)]  # per sequence; auto, 0: the plan's


NAME_MAX = 255  # bytes in one part of a path, on every Linux filesystem


def _place(v: str) -> str:
    """A file or folder the user names: `~` and `~user` expanded (the shell leaves `--out=~/x` as it is), refused
    where the user does not exist (it became a folder named `~nouser` in the current one) or a part is longer than a
    file name can be."""
    if not v:
        return v
    if "\0" in v:
        raise ValueError("a path cannot hold a NUL character")
    path = os.path.expanduser(v)
    if path.startswith("~"):
        raise ValueError(f"no user {path[1:].split('/')[0]!r} on this host: give the path without ~NAME")
    if any(len(os.fsencode(part)) > NAME_MAX for part in path.split("/")):
        raise ValueError(f"a part of this path is longer than the {NAME_MAX} bytes a file name can have")
    return path


Place = Annotated[str, AfterValidator(_place)]  # a path the user gives: --out, --data, --file, ...

