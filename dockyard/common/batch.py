"""How one optimizer step's examples split: global_batch over the processes, each process's share as micro-batch ×
accumulation steps, any of them `auto` for the trainer to pick on the GPU at hand (dockyard.common.autos); and the
other auto settings' values (checkpointing, compile, Liger) checked as the trainer reads them. The host checks them
too, so a run is refused before its folder is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dockyard.common.errors import DockyardError, short
from dockyard.common.recipes import Recipe
from dockyard.common.training_args import AUTO, either_name

# examples each process takes per optimizer step when global_batch is auto: the micro-batch every run had before the
# autos (dockyard.common.autos)
PER_PROCESS = 8
# examples per optimizer step, at most: past it a slip of the keyboard (and the planner's sums would overflow); the
# micro-batch is found among its divisors, in √n steps
MAX_EXAMPLES = 10**12


# DeepSpeed gathers a ZeRO-3 parameter only inside its own module's forward: Liger's fused loss reads the output
# layer's weight without calling that layer, and gets an empty shard (trl #3368, #5891: "size mismatch")
LIGER_UNDER_ZERO3 = ("use_liger_kernel true: under ZeRO-3 Liger's fused loss reads the output layer's weight while "
                     "DeepSpeed holds it partitioned (an empty shard: the run would fail at its first step); set it to "
                     "auto or false, or train with zero2 or fsdp")
LIGER_AND_COMPILE = ("use_liger_kernel and torch_compile do not work together (under torch.compile Liger's kernels "
                     "fail, or its fused loss comes out wrong where labels are masked): turn one of them off")


@dataclass(frozen=True)
class Batch:
    """How the examples of one optimizer step split, as given: AUTO where the trainer picks on the GPU at hand."""

    per_process: int          # examples each process takes per optimizer step
    processes: int
    micro: int | str          # per_device_train_batch_size
    accumulation: int | str   # gradient_accumulation_steps

    @property
    def global_batch(self) -> int:
        return self.per_process * self.processes

    @property
    def given_micro(self) -> int | None:
        """The micro-batch the settings fix (set, or global_batch over the accumulation set), None where it is auto."""
        if self.micro != AUTO:
            return int(self.micro)
        return self.per_process // int(self.accumulation) if self.accumulation != AUTO else None


def batch_split(global_batch: int | str, micro: int | str, accumulation: int | str, processes: int) -> Batch:
    """The examples each process takes per step (global_batch, auto: PER_PROCESS, or the micro-batch × the
    accumulation set, per process), refused where the micro-batch or the accumulation set cannot divide them."""
    if global_batch == AUTO:
        global_batch = (micro if micro != AUTO else PER_PROCESS) * (accumulation if accumulation != AUTO else 1) * processes
        if global_batch > MAX_EXAMPLES:  # as global_batch set itself is bounded
            raise DockyardError(f"per_device_train_batch_size × gradient_accumulation_steps × {processes} process(es) "
                                f"is {global_batch:.3g} examples per step, more than {MAX_EXAMPLES:.0e}: lower them")
    glob = int(global_batch)
    if glob % processes:
        raise DockyardError(f"global_batch {glob} cannot be split evenly over {processes} processes: make it a "
                            f"multiple of {processes}")
    per = glob // processes
    each = f"the {per} examples each of the {processes} process(es) takes per step (global_batch {glob})"
    if micro != AUTO and per % micro:
        raise DockyardError(f"per_device_train_batch_size {micro} does not divide {each}: pick a divisor, or set "
                            "global_batch")
    if accumulation != AUTO and per % accumulation:
        raise DockyardError(f"gradient_accumulation_steps {accumulation} does not divide {each}: each micro-batch "
                            f"is an equal share of them; pick a divisor of {per}, or set global_batch to a multiple of "
                            f"{accumulation * processes}")
    if micro != AUTO and accumulation != AUTO and micro * accumulation != per:
        raise DockyardError(f"global_batch {glob} ≠ per_device_train_batch_size {micro} × gradient_accumulation_steps "
                            f"{accumulation} × {processes} process(es): set two of the three")
    return Batch(per, processes, micro, accumulation)


def check_autos(training: dict[str, Any], recipe: Recipe) -> tuple[int | str, int | str]:
    """Every auto setting's value valid for this recipe, as the trainer reads them before it resolves them (the host
    checks them too, with batch_split, so a run is refused before its folder is made): (the micro-batch, the
    accumulation)."""
    switch = {key: auto_switch(training.get(key, AUTO), key)
              for key in ("gradient_checkpointing", "torch_compile", "use_liger_kernel")}
    if switch["use_liger_kernel"] is True and switch["torch_compile"] is True:
        raise DockyardError(LIGER_AND_COMPILE)
    if switch["use_liger_kernel"] is True and recipe.strategy_spec.zero_stage == 3:
        raise DockyardError(LIGER_UNDER_ZERO3)
    return (auto_count(training.get("per_device_train_batch_size", AUTO), "per_device_train_batch_size"),
            auto_count(training.get("gradient_accumulation_steps", AUTO), "gradient_accumulation_steps"))


def check_batch_within_data(global_batch: int, examples: int, packed: bool, processes: int = 1,
                            at_most: str = "") -> None:
    """A step takes `global_batch` examples; with fewer in the data, each epoch was one step over whatever there was,
    while the run said it trained on global_batch. The batch the error offers splits over the run's `processes` (it
    offered `at most 1` to a run of 2 processes, which refuses any global_batch that is not a multiple of 2).
    `at_most`: said after the count where it is a bound (the host's, before eval_fraction's share is chosen)."""
    if global_batch > examples:
        what = (f"{examples} blocks of max_seq_length tokens (its documents packed)" if packed
                else f"{examples} example{'s' * (examples != 1)}{at_most}")
        fix = (f"set global_batch (or per_device_train_batch_size × gradient_accumulation_steps × processes) to at "
               f"most {examples - examples % processes}" if examples >= processes else
               f"each of the run's {processes} processes takes one example a step at least: give fewer processes "
               "(--nproc)")
        raise DockyardError(f"global_batch {global_batch}: the training data holds {what}, fewer than one optimizer "
                            f"step takes; {fix}, or give more data")


def auto_count(value: Any, key: str) -> int | str:
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        unit = "steps" if key == "gradient_accumulation_steps" else "examples"
        raise DockyardError(f"{key} must be a whole number of {unit}, 1 or more, or auto (got {short(value)})")
    return value


def auto_switch(value: Any, key: str) -> bool | str:
    if value == AUTO or isinstance(value, bool):
        return value
    raise DockyardError(f"{either_name(key)} must be true, false or auto (got {short(value)})")
