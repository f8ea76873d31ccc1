"""Trainer callbacks: the strategy check once the model is wrapped, metrics as JSON lines with the throughput of
each logging window, and checkpoints published once every rank has written its part."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from dockyard.common import model_config, runfolder
from dockyard.common.run_settings import WARMUP_STEPS
from dockyard.common.units import duration
from dockyard.train import guards, manifest, strategy

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
        self.in_effect["compiled"] = strategy.compiled(self.trainer.model_wrapped)


class FirstStep(TrainerCallback):
    """Calls `begin` once, as this attempt's first step starts: after the Trainer loaded what a resume continues
    from (optimizer, scheduler, trainer_state.json, random state). A resume whose checkpoint failed to load never
    got here, and leaves the run's record, metrics and settings as they were."""

    def __init__(self, begin: Any):
        self.begin, self.done = begin, False

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.done:
            self.done = True
            self.begin()


class ScheduleCheck(TrainerCallback):
    """on_train_begin runs once the Trainer has made its learning-rate schedule over the run's steps, and before the
    first step: the schedule is read at every step then (guards.check_schedule), not found broken at the last."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        guards.check_schedule(lr_scheduler, state.max_steps, args)


class ResumedRate(TrainerCallback):
    """A resume's first step trains at the rate of the schedule the run now has. The Trainer loads the checkpoint's
    optimizer, whose rate the schedule it was saved under set for the next step, and the scheduler sets a new one
    only after that step: a resume with another max_steps trained its first step at the old schedule's rate (0,
    where that schedule had ended). The HF schedules are LambdaLR: the rate at step n is base × lambda(n)."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        from torch.optim.lr_scheduler import LambdaLR

        schedule = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper under DeepSpeed
        if state.global_step > 0 and isinstance(schedule, LambdaLR):
            step = schedule.last_epoch
            rates = [base * rate(step) for base, rate in zip(schedule.base_lrs, schedule.lr_lambdas, strict=True)]
            for group, lr in zip(schedule.optimizer.param_groups, rates, strict=True):
                group["lr"] = lr
            schedule._last_lr = rates


class PublishCheckpoint(TrainerCallback):
    """A checkpoint counts once every rank has written its part: the Trainer writes trainer_state.json from rank 0
    while other ranks may still be writing their RNG state (and on other nodes, their shards). on_save runs on every
    rank after the Trainer's save; after a barrier, rank 0 adds the marker manifest.complete_checkpoint looks for.
    An adapter's checkpoint names its base as the host has it (`as_host`, as the run's model/ does), before the marker:
    resume reads only the adapter's weights onto the base the run loads, never the base the checkpoint names."""

    def __init__(self, as_host: Callable[[str], str] | None = None):
        self.as_host = as_host

    def on_save(self, args, state, control, **kwargs):
        _barrier()
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.as_host and args.should_save:  # the process that saved it
            model_config.rename_base(checkpoint, self.as_host)
        if args.process_index == 0:
            runfolder.share_weights(checkpoint)
            manifest.mark_complete(checkpoint, state.global_step)
        _barrier()  # nobody trains on (and may be killed) before the marker is there


class TokenCount:
    """The real (non-padding) tokens of the batches this process has trained on, counted as the Trainer takes each
    step's batches (`add`, from Trainer.get_batch_samples): the batches the data loader has made ahead (it makes the
    next step's before this one trains) and evaluation batches are not counted. Summed on the device, so a step
    waits for nothing; `value` waits for the steps queued so far."""

    def __init__(self):
        self._count: Any = 0

    def add(self, batches: list[dict[str, Any]]) -> None:
        for batch in batches:  # padded: the mask's ones; padding-free: one row of real tokens only
            mask = batch.get("attention_mask")
            self._count = self._count + (mask.sum() if mask is not None else batch["input_ids"].numel())

    @property
    def value(self) -> int:
        return int(self._count)


def window_line(step: int, max_steps: int, logs: dict[str, Any]) -> str:
    """A logging window as the console and train.log say it; metrics.jsonl keeps every key, unrounded. The JSON line
    itself was the console's (`"learning_rate": 0.0002500000000000001`, a Unix time beside the log's own)."""
    def num(key: str, form: str) -> str:
        value = logs.get(key)
        if value is None:  # json_text's null: NaN or infinity
            return "not finite"
        return format(value, form) if isinstance(value, (int, float)) else str(value)

    said = [f"step {step}/{max_steps}"]
    if "loss" in logs:
        said += [f"loss {num('loss', '.4f')}", *([f"grad_norm {num('grad_norm', '.3g')}"] if "grad_norm" in logs else []),
                 f"lr {num('learning_rate', '.3g')}"]
        if "tokens_per_second" in logs:
            said.append(f"{num('tokens_per_second', '.0f')} tokens/s ({num('step_seconds', '.3g')} s/step)"
                        + (f", MFU {num('mfu', '.1%')}" if logs.get("mfu") is not None else "")
                        + (" (profiled)" if logs.get("profiled") else ""))
        if isinstance(logs.get("step_seconds"), (int, float)) and step < max_steps:
            # at this window's pace (checkpoints and evaluations to come not counted): what a log is read for
            left = (max_steps - step) * logs["step_seconds"]
            said.append(f"about {duration(left)} left" if left >= 0.5 else "less than a second left")
    if "eval_loss" in logs:
        said.append(f"eval_loss {num('eval_loss', '.4f')}"
                    + (f" ({num('eval_runtime', '.3g')} s)" if "eval_runtime" in logs else ""))
    return " · ".join(said)


class MetricsLog(TrainerCallback):
    """DIR/metrics.jsonl: one line per logging window with `step`, `loss` (a resumed run appends to it) and that
    window's throughput: `tokens` (real, non-padding tokens of every rank), `seconds` (its wall time, less any
    time spent saving or evaluating), `step_seconds`, `tokens_per_second` and, on GPUs whose dense peak is known,
    `mfu`. The last step always closes a window (a log), whatever logging_steps says. The steady state the
    manifest reports is the sum of the windows after warm-up (steady_state()). A number that is not finite (a
    diverged run's loss) is written null, and the first such loss is warned of in train.log.

    `tokens` is this process's TokenCount; `flops` the FLOPs per token and `peak` one GPU's peak
    (dockyard.train.mfu)."""

    def __init__(self, path: Path, is_main: bool, started: float, tokens: Any, flops: float | None = None,
                 peak: float | None = None, profiled: tuple[int, int] | None = None):
        self.path, self.is_main, self.started, self.tokens = path, is_main, started, tokens
        self.flops, self.peak, self.profiled = flops, peak, profiled
        self.seconds_to_first_step: float | None = None
        self.diverged_at: int | None = None  # the first step whose loss was not finite (said once, in train.log)
        self.seconds_saving = self.seconds_evaluating = 0.0
        self.windows: list[dict[str, Any]] = []
        self.world, self.device, self.first_step = 1, None, 0
        self.tokens_start = self.tokens_end = 0
        self.time_start = self.time_end = 0.0
        self._mark = 0.0               # the time after the last thing that was timed
        self._window = (0.0, 0, 0)     # (time, token count, step) where the open window began
        self._paused = 0.0             # seconds saving or evaluating within the open window
        self._step_lr: float | None = None  # the learning rate the current step trains with
        self.steps_done = 0            # the Trainer's global step after the last step that ended (a resume's, at first)
        # (bytes, rank): the largest process's peak memory as of the last window closed, which a failed run reports
        self.peak_memory: tuple[int, int] | None = None

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        # The rate this step's update uses. The Trainer logs the scheduler's last rate, read after the optimizer step
        # and before its own scheduler step; DeepSpeed steps the scheduler inside its optimizer step, so its runs
        # logged the next step's rate (a 2-step zero2 run: 5e-4, 0; ddp: 1e-3, 5e-4)
        groups = getattr(optimizer, "param_groups", None)
        if groups:
            self._step_lr = float(groups[0]["lr"])

    def on_train_begin(self, args, state, control, **kwargs):
        self.world, self.device, self.first_step = args.world_size, args.device, state.global_step
        self.steps_done = state.global_step
        if self.profiled and state.global_step >= self.profiled[0]:
            self.profiled = None  # a resume past the profiled steps' start: the profiler runs none (StepProfiler)
        self.tokens_start, self.time_start = self.tokens.value, time.perf_counter()
        self._mark = self.time_start
        self._window = (self.time_start, self.tokens_start, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds_to_first_step is None:
            self.seconds_to_first_step = time.perf_counter() - self.started
        self.steps_done = state.global_step
        if state.global_step >= state.max_steps:
            control.should_log = True  # the steps since the last multiple of logging_steps are a window too
        if state.global_step == self.first_step + WARMUP_STEPS:
            # a window ends with the warm-up, whatever logging_steps is: one running on past it (steps 2-10 at
            # logging_steps 10) brought its warm-up steps, a compile's included, into the steady state
            control.should_log = True
        if control.should_save or control.should_evaluate:
            _synchronize()  # the step's queued GPU work belongs to the step, not to the save that follows
        self._mark = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "loss" in logs:  # a training window closes (every rank logs it: the token sum is a collective)
            logs.update(self._close_window(state.global_step))
            if "learning_rate" in logs and self._step_lr is not None:
                logs["learning_rate"] = self._step_lr  # the window's last step's own (on_step_begin)
            if self.is_main and self.diverged_at is None and manifest.finite(logs["loss"]) is None:
                self.diverged_at = state.global_step
                log.warning("the loss became non-finite (%s) at step %d: the run diverged (the model it saves is not "
                            "usable); lower --learning_rate (and keep --max_grad_norm above 0)", logs["loss"],
                            state.global_step)
        if self.is_main and ("loss" in logs or "eval_loss" in logs):
            line = manifest.json_text({"step": state.global_step, **logs, "time": round(time.time(), 3)})
            with runfolder.append(self.path.parent, self.path.name) as f:  # never through a planted link
                f.write(line + "\n")
            log.info("%s", window_line(state.global_step, state.max_steps, logs))
            if "loss" in logs:  # writing the window's line is training's time: a save or evaluation next starts here
                self._mark = time.perf_counter()

    def on_evaluate(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds_evaluating += now - self._mark
        self._paused += now - self._mark
        self._mark = now

    def on_save(self, args, state, control, **kwargs):
        now = time.perf_counter()  # after PublishCheckpoint (added before this callback): every rank has saved
        self.seconds_saving += now - self._mark
        self._paused += now - self._mark
        self._mark = now

    def on_train_end(self, args, state, control, **kwargs):
        self.tokens_end, self.time_end = self.tokens.value, time.perf_counter()

    def _close_window(self, step: int) -> dict[str, Any]:
        _synchronize()
        now, count = time.perf_counter(), self.tokens.value
        start, start_count, start_step = self._window
        tokens, self.peak_memory = over_ranks(count - start_count, manifest.peak_memory_bytes(), self.world,
                                              self.device)
        seconds = max(now - start - self._paused, 1e-9)
        self.windows.append({"from_step": start_step + 1, "step": step, "tokens": tokens, "seconds": seconds})
        self._window, self._mark, self._paused = (now, count, step), now, 0.0
        rate = tokens / seconds
        out = {"tokens": tokens, "seconds": round(seconds, 4), "step_seconds": round(seconds / max(1, step - start_step), 4),
               "tokens_per_second": round(rate, 2)}
        if self.flops and self.peak:
            out["mfu"] = float(f"{rate * self.flops / (self.peak * self.world):.4g}")
        if self._under_profiler(self.windows[-1]):
            out["profiled"] = True  # slowed by the profiler: left out of the steady state
        return out

    def _under_profiler(self, window: dict[str, Any]) -> bool:
        return bool(self.profiled) and window["from_step"] <= self.profiled[1] and window["step"] >= self.profiled[0]

    def steady_state(self) -> dict[str, Any]:
        """The windows after warm-up (the first window and any ending within the first WARMUP_STEPS steps of this
        process, where one always ends: on_step_end), summed, less those holding a profiled step (profile_steps);
        fewer windows than that: what there is. Empty when nothing was logged."""
        unprofiled = [w for w in self.windows[1:] if not self._under_profiler(w)]
        after = [w for w in unprofiled if w["step"] > self.first_step + WARMUP_STEPS]
        # too few windows: the warm-up counts before a profiled window does (the profiler writing its trace is
        # slower than any warm-up step)
        chosen = after or unprofiled or self.windows[1:] or self.windows
        if not chosen:
            return {}
        tokens, seconds = sum(w["tokens"] for w in chosen), sum(w["seconds"] for w in chosen)
        out = {"from_step": chosen[0]["from_step"], "to_step": chosen[-1]["step"], "tokens": tokens,
               "seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 2), "mfu": None,
               "warm_up_left_out": bool(after)}
        if any(self._under_profiler(w) for w in chosen):
            out["profiled_steps_included"] = list(self.profiled)
        elif len(unprofiled) < len(self.windows[1:]):
            out["profiled_steps_left_out"] = list(self.profiled)
        if self.flops and self.peak:
            out["mfu"] = float(f"{tokens / seconds * self.flops / (self.peak * self.world):.4g}")
        return out

    @property
    def tokens_trained(self) -> int:
        return self.tokens_end - self.tokens_start

    @property
    def seconds(self) -> float:
        """Training time of the whole run, less the checkpoints saved and the evaluations run meanwhile."""
        return self.time_end - self.time_start - self.seconds_saving - self.seconds_evaluating


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def over_ranks(tokens: int, peak: int, world: int, device: Any) -> tuple[int, tuple[int, int]]:
    """`tokens` summed over the ranks, and the largest of their `peak`s (memory) with its rank, in one collective."""
    import torch
    import torch.distributed as dist

    if world <= 1 or not (dist.is_available() and dist.is_initialized()):
        return tokens, (peak, 0)
    mine = torch.tensor([tokens, peak], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    rows = torch.stack(every).tolist()  # one copy to the host, not one per rank (each a GPU sync)
    largest = max(range(world), key=lambda rank: rows[rank][1])
    return sum(row[0] for row in rows), (rows[largest][1], largest)
