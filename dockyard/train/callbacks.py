"""Trainer callbacks: the strategy check once the model is wrapped, metrics as JSON lines, throughput."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from dockyard.common import runfolder
from dockyard.train import strategy

log = logging.getLogger("dockyard.train")


class StrategyCheck(TrainerCallback):
    """on_train_begin runs after the Trainer has wrapped the model (DDP, DeepSpeed engine, FSDP) and before
    the first step: the one moment to read what is really running and stop before training the wrong thing."""

    def __init__(self, requested: str, world_size: int):
        self.requested, self.world_size = requested, world_size
        self.trainer: Any = None  # set once the Trainer exists
        self.in_effect: dict[str, Any] | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.in_effect = strategy.in_effect(self.trainer.model_wrapped)
        strategy.check(self.requested, self.in_effect, self.world_size)


class MetricsLog(TrainerCallback):
    """DIR/metrics.jsonl: one line per logging step with `step` and `loss` (a resumed run appends to it),
    and the timings the manifest reports; `tokens` is the collator's count of this process's tokens."""

    def __init__(self, path: Path, is_main: bool, started: float, tokens: Any):
        self.path, self.is_main, self.started, self.tokens = path, is_main, started, tokens
        self.seconds_to_first_step: float | None = None
        self.tokens_start = self.tokens_end = 0
        self.time_start = self.time_end = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.tokens_start, self.time_start = self.tokens.value, time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds_to_first_step is None:
            self.seconds_to_first_step = time.perf_counter() - self.started

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.is_main and logs and ("loss" in logs or "eval_loss" in logs):
            line = json.dumps({"step": state.global_step, **logs, "time": round(time.time(), 3)})
            with runfolder.append(self.path.parent, self.path.name) as f:  # never through a planted link
                f.write(line + "\n")
            log.info("%s", line)

    def on_train_end(self, args, state, control, **kwargs):
        self.tokens_end, self.time_end = self.tokens.value, time.perf_counter()

    @property
    def tokens_trained(self) -> int:
        return self.tokens_end - self.tokens_start

    @property
    def seconds(self) -> float:
        return self.time_end - self.time_start
