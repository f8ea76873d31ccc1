"""What each number flag of a task takes: the annotations of tasks.py, read by dockyard/cli.py with pydantic.

A value outside these (not a number, nan, inf, negative, absurdly large) is a short error before the task runs;
what depends on another flag (--node-rank below --nodes) is checked by the task's own module.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

Count = Annotated[int, Field(ge=0, le=4096)]                 # processes, GPUs: 0 = what the host has
Nodes = Annotated[int, Field(ge=1, le=4096)]
Rank = Annotated[int, Field(ge=0, le=4095)]
Port = Annotated[int, Field(ge=1, le=65535)]
PortOrConfig = Annotated[int, Field(ge=0, le=65535)]         # 0 = the ssh config's
Seconds = Annotated[int, Field(ge=1, le=7 * 24 * 3600)]
Restarts = Annotated[int, Field(ge=0, le=1000)]
Level = Annotated[int, Field(ge=0, le=22)]                   # 0 = the compressor's default
GiB = Annotated[float, Field(ge=0, le=2**20, allow_inf_nan=False)]  # 0 = what the host has
Tokens = Annotated[int, Field(ge=1, le=2**24)]
Batch = Annotated[int, Field(ge=1, le=2**16)]
