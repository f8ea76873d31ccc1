"""TrainingArguments as dockyard checks them, without transformers (the host has none): every field's type and range
as the pinned transformers has them (a snapshot, kept current by a test), and the fields whose value must name
something the run has (a backend, a compile mode, a log level). `invoke run --dry`, `invoke plan`, slurm and k8s
refuse a bad value before an image starts; the trainer runs the same checks again for what reaches it directly
(run.sh, native). The values handed to the Trainer as given (optim, report_to, ...) are passthrough's to check.

Torch-free, like the rest of dockyard.common.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from dockyard import ROOT
from dockyard.common import passthrough
from dockyard.common.errors import DockyardError, short

# TrainingArguments' fields and number types, as the pinned transformers has them: the host has no transformers
TRAINING_ARGUMENTS = ROOT / "dockyard" / "train" / "assets" / "training_arguments.txt"
# The TrainingArguments fields the trainer may resolve itself when they say `auto` (dockyard.common.autos)
AUTO_TRAINING_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                           "torch_compile", "use_liger_kernel")
AUTO = "auto"  # what such a setting (and global_batch, packing, ...) says to leave it to the trainer
WIDEST_INT = 2**63 - 1    # torch's and numpy's widest integer: a count past it overflows in the Trainer
MAX_LEARNING_RATE = 100   # past it a learning rate is a slip of the keyboard (3e4 for 3e-4): RANGES


def training_arguments() -> dict[str, str]:
    """TrainingArguments' field names and, for a number, its type (`int`, `float|None`, ...; "" for the others), as
    the pinned transformers has them (a test keeps the snapshot current)."""
    lines = TRAINING_ARGUMENTS.read_text().splitlines()
    return dict((line.split() + [""])[:2] for line in lines if line.strip() and not line.startswith("#"))


START_METHODS = ("fork", "spawn", "forkserver")  # torch.multiprocessing.get_all_start_methods() on Linux
DDP_BACKENDS = ("nccl", "gloo")  # what torch.distributed holds in the images (no MPI, no oneCCL)
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")  # torch's own: others need packages no image has
# torch.compile's modes, as torch._inductor.list_mode_options() names them in the pinned torch (the host has no torch;
# the trainer asks its own: guards.compile_modes)
COMPILE_MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
# TrainingArguments.train_sampling_strategy's choices, and include_num_input_tokens_seen's names besides true/false:
# anything else the Trainer took without a word (a random sampler; no count)
SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")
TOKENS_SEEN = ("all", "non_padding", "no")


def check_training_numbers(training: dict[str, Any], compile_modes: tuple[str, ...] = COMPILE_MODES) -> None:
    """Every TrainingArguments value of resolve_settings' second half as the pinned transformers reads it: each number
    in its range (check_number), the values handed on as given (passthrough.check), the names looked up in a table
    (log levels, debug, strategies, compile modes...). The host checks them before a run starts (`invoke run`, slurm,
    k8s), the trainer again for what reaches it directly (run.sh, native), with its torch's `compile_modes`."""
    kinds = training_arguments()
    for key, value in training.items():
        check_number(key, value, kinds.get(key, ""))
    passthrough.check(training)
    for key in ("log_level", "log_level_replica"):  # the Trainer looks it up in a table of these: a KeyError
        if key in training and str(training[key]) not in LOG_LEVELS:
            raise DockyardError(f"{key} {training[key]!r}: give one of {', '.join(LOG_LEVELS)}")
    check_debug(training.get("debug"))
    if training.get("parallelism_config") is not None:  # an object of accelerate's: a string was a traceback per rank
        raise DockyardError("parallelism_config cannot be given as a setting: the recipe's strategy decides how the "
                            "model is split (invoke recipes); leave it out")
    metric = training.get("metric_for_best_model")
    if metric is not None and metric not in ("loss", "eval_loss"):  # the Trainer's KeyError after the first eval
        raise DockyardError(f"metric_for_best_model {reprlib.repr(metric)}: a run computes no metric but the "
                            "evaluation loss: give eval_loss, or leave it out")
    shown_metrics = training.get("include_for_metrics")
    if shown_metrics is not None and not (isinstance(shown_metrics, list)
                                          and all(m in ("inputs", "loss") for m in shown_metrics)):
        raise DockyardError(f"include_for_metrics {reprlib.repr(shown_metrics)}: takes a list of inputs and loss, as "
                            "in --include_for_metrics '[loss]', or leave it out")
    if training.get("dataloader_prefetch_factor") is not None and not training.get("dataloader_num_workers"):
        raise DockyardError("dataloader_prefetch_factor works with dataloader_num_workers above 0 (the batches each "
                            "worker prepares ahead): set both, or leave out dataloader_prefetch_factor")
    context = training.get("dataloader_multiprocessing_context")
    if context is not None and (context not in START_METHODS or not training.get("dataloader_num_workers")):
        # torch's DataLoader refuses both, as the Trainer makes it: once the model had loaded
        raise DockyardError(f"dataloader_multiprocessing_context {reprlib.repr(context)}: how dataloader_num_workers' "
                            f"workers start ({', '.join(START_METHODS)}), with dataloader_num_workers above 0: set both, "
                            "or leave it out")
    if training.get("ddp_backend") not in (None, *DDP_BACKENDS):  # accelerate's "not available" at the model's load
        raise DockyardError(f"ddp_backend {reprlib.repr(training['ddp_backend'])}: the images hold "
                            f"{' and '.join(DDP_BACKENDS)}: give one of them, or leave it out (nccl on GPUs, gloo on "
                            "CPUs)")
    backend = training.get("torch_compile_backend")
    if backend is not None and str(backend).lower() not in COMPILE_BACKENDS:  # accelerate's enum, in the run
        raise DockyardError(f"torch_compile_backend {reprlib.repr(backend)}: give one of "
                            f"{', '.join(COMPILE_BACKENDS)} (inductor is torch's own), or leave it out")
    mode = training.get("torch_compile_mode")
    if mode is not None and mode not in compile_modes:  # torch's RuntimeError (accelerate's KeyError) once loaded
        raise DockyardError(f"torch_compile_mode {reprlib.repr(mode)}: give one of {', '.join(compile_modes)} "
                            "(torch.compile's modes), or leave it out")
    sampler = training.get("train_sampling_strategy")
    if sampler is not None and sampler not in SAMPLING_STRATEGIES:  # the Trainer fell back to random, unsaid
        raise DockyardError(f"train_sampling_strategy {reprlib.repr(sampler)}: give one of "
                            f"{', '.join(SAMPLING_STRATEGIES)}, or leave it out (random)")
    seen = training.get("include_num_input_tokens_seen")
    if seen is not None and not isinstance(seen, bool) and seen not in TOKENS_SEEN:  # no count, unsaid
        raise DockyardError(f"include_num_input_tokens_seen {reprlib.repr(seen)}: give one of "
                            f"{', '.join(TOKENS_SEEN)}, or true (all) or false (no)")
    if training.get("bf16") is True and training.get("fp16") is True:
        raise DockyardError("bf16 and fp16 are both true: give one (bf16 on Ampere and newer GPUs, fp16 on older ones), "
                            "or neither for the GPU's own")
    kwargs = training.get("gradient_checkpointing_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):  # read by the trainer and the Trainer as a mapping
        raise DockyardError(f"{either_name('gradient_checkpointing_kwargs')} {kwargs!r}: takes a "
                            f"mapping, as in -- --gradient_checkpointing_kwargs '{{use_reentrant: false}}'")
    if unknown := sorted(set(kwargs or {}) - set(CHECKPOINT_KWARGS), key=str):  # torch's at the first step
        raise DockyardError(f"{either_name('gradient_checkpointing_kwargs')}: unknown key(s) "
                            f"{', '.join(map(str, unknown))}; torch.utils.checkpoint takes "
                            f"{', '.join(sorted(CHECKPOINT_KWARGS))} (as in '{{use_reentrant: false}}')")
    for key, value in (kwargs or {}).items():  # "false" in quotes is a string, which torch reads as true
        takes = CHECKPOINT_KWARGS[key]
        if value not in takes or type(value) is not type(takes[0]):  # 1 == True, yet not a bool
            raise DockyardError(f"{either_name('gradient_checkpointing_kwargs')}: {key} {value!r}: takes "
                                f"{' or '.join(json.dumps(t) for t in takes)}")


def check_number(key: str, value: Any, kind: str) -> None:
    """A TrainingArguments number given a finite number (a whole one for an int field) in its range (RANGES), a
    switch given true or false, or `auto` where the trainer resolves it, or null where the field takes None;
    anything else would fail minutes into the run, or train nonsense (a learning rate of nan, bf16 "maybe")."""
    auto = key in AUTO_TRAINING_ARGUMENTS
    optional = kind.endswith("|None")
    if not kind or (auto and value == "auto") or (optional and value is None):
        return
    if kind.startswith("choice:"):  # an enum of transformers' (optim, lr_scheduler_type, the strategies)
        names = kind.removeprefix("choice:").split(",")
        if value is False and "no" in names:  # YAML reads `--save_strategy no` as false (the trainer maps it back)
            return
        if not (isinstance(value, str) and value in names):
            close = difflib.get_close_matches(str(value), names, n=1)
            raise DockyardError(f"{key} {reprlib.repr(value)}: " + (f"did you mean {close[0]}? " if close else "")
                                + f"TrainingArguments.{key} takes one of {', '.join(names)}")
        return
    if kind.startswith("bool"):
        if not isinstance(value, bool) and not auto:  # an auto's: check_autos says it with the choices it has
            raise DockyardError(f"{key} {reprlib.repr(value)}: TrainingArguments.{key} is a switch: give true or "
                                "false")
        return
    whole = kind.startswith("int")
    number = isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)
    if number and (abs(value) <= WIDEST_INT if whole else _finite(value)):
        if key == "max_steps" and not (value == -1 or value >= 1):
            raise DockyardError(f"max_steps {value}: give the number of optimizer steps, 1 or more (or -1 to train "
                                "for num_train_epochs)")
        if key in RANGES and not RANGES[key].holds(value):
            raise DockyardError(f"{key} {value}: TrainingArguments.{key} takes a number {RANGES[key].words()}")
        if key in STEP_COUNTS and value > 1 and value != int(value):  # TrainingArguments' ValueError, in the container
            raise DockyardError(f"{key} {value}: a number of steps above 1 is a whole one ({int(value)} or "
                                f"{int(value) + 1}); below 1 it is a share of the run's steps (0.25)")
        return
    if value is True:  # `-- --max_steps` with no value reads as a switch (parse_overrides)
        raise DockyardError(f"--{key} was given no value: put {'a whole number' if whole else 'a number'} after it "
                            f"(--{key} N; true and yes are not numbers)")
    # a whole number past what the field holds (a str: past YAML's 4,300 digits) was 'takes a whole number'
    huge = (isinstance(value, int) and not isinstance(value, bool)
            or isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value))
    bounded = key in RANGES and RANGES[key].high != math.inf
    takes = (f"a number {RANGES[key].words()}" if huge and bounded else
             f"a whole number of at most {len(str(WIDEST_INT))} digits (up to {WIDEST_INT:,})" if whole and huge
             else "a whole number" if whole else
             "a finite number (a float ends near 1.8e308)" if huge else "a finite number")
    shown = "given no value" if value is None else short(value)  # `--key ''`: YAML's null
    raise DockyardError(f"{key} {shown}: TrainingArguments.{key} takes {takes}"
                        + (", or auto" if auto else ", or null (its default)" if optional else ""))


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


# The TrainingArguments numbers whose range the Trainer or torch checks only once the model is loaded (a traceback:
# "Invalid learning rate: -1"), or not at all (max_steps 0 trained by epochs): (lowest, highest, the words for it)
@dataclass(frozen=True)
class Range:
    """Where a number may lie: from `low` to `high`, either end left out where `open_low`/`open_high` say so."""

    low: float
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False

    def holds(self, x: float) -> bool:
        return (self.low < x if self.open_low else self.low <= x) and (x < self.high if self.open_high else x <= self.high)

    def words(self) -> str:
        low, high = (str(int(x)) if float(x).is_integer() else f"{x:g}" for x in (self.low, self.high))
        if self.high == math.inf:
            return f"above {low}" if self.open_low else f"{low} or more"
        return f"from {low} {'up to (not including)' if self.open_high else 'to'} {high}"


RANGES: dict[str, Range] = {
    **dict.fromkeys(("weight_decay", "adam_epsilon", "max_grad_norm", "warmup_steps", "save_total_limit"),
                    Range(0)),  # save_total_limit 0: keep all
    # torch takes any rate of 0 or more: 1e20 (3e4 for 3e-4) trained to nan without a word. Fine-tuning rates are
    # 1e-6 to 1e-2, SGD's rarely past 1; 100 leaves room for any optimizer's (AWD-LSTM's SGD took 30)
    "learning_rate": Range(0, MAX_LEARNING_RATE),
    # each process forks that many workers, each preparing that many batches ahead: 10**5 workers forked a
    # 500 MB process 10**5 times, and a prefetch factor of 10**18 spun every rank at 100 % before its first batch
    "dataloader_num_workers": Range(0, 64),
    "dataloader_prefetch_factor": Range(1, 64),
    # accelerate pads the last evaluation batch to this size by doubling a list: 10**12 took the host's memory
    "per_device_eval_batch_size": Range(1, 65536),
    **dict.fromkeys(("adam_beta1", "adam_beta2"), Range(0, 1, open_high=True)),  # torch: "Invalid beta parameter"
    "eval_accumulation_steps": Range(1),
    **dict.fromkeys(("logging_steps", "save_steps", "eval_steps", "num_train_epochs"), Range(0, open_low=True)),
    **dict.fromkeys(("seed", "data_seed"), Range(0, 2**32 - 1)),
    # torch's uniform_ refused a negative one at the first step, and one past float32 (1e300) in a traceback; the
    # NEFTune paper's are 5 to 15
    "neftune_noise_alpha": Range(0, 1000),
    # (1 - ε)·nll + ε·smooth: at 1 or more the correct token's loss is pushed the wrong way (10 meant for 10 %)
    "label_smoothing_factor": Range(0, 1, open_high=True),
    "torch_empty_cache_steps": Range(1),  # TrainingArguments: "must be a positive integer" (null: never)
    # seconds a collective waits for the other processes: 0 (meant as "never") timed every process out as it
    # connected, and 10**13 was gloo's "Invalid timeout" (nanoseconds past int64), both once the image had started
    "ddp_timeout": Range(1, 10**9),
}


STEP_COUNTS = {"logging_steps", "save_steps", "eval_steps"}  # a whole number of steps, or below 1 a share of the run


def check_debug(given: Any) -> None:
    """debug the option TrainingArguments knows that does something here: a word of its own was its ValueError once the
    image had started, one in a list went unread, and tpu_metrics_debug does nothing off a TPU."""
    if given in (None, "", []):
        return
    names = given.split() if isinstance(given, str) else given
    if not isinstance(names, list) or not all(n in DEBUG_OPTIONS for n in names):
        raise DockyardError(f"debug {short(given)}: give {DEBUG_OPTIONS[0]} (each layer's activations and weights "
                            "checked for inf and nan, said as it is met), or leave it out")
    if "tpu_metrics_debug" in names:
        raise DockyardError(f"debug {short(given)}: tpu_metrics_debug prints a TPU's metrics, and the runs train on GPUs "
                            f"or CPUs: leave it out (or give {DEBUG_OPTIONS[0]})")


DEBUG_OPTIONS = ("underflow_overflow", "tpu_metrics_debug")  # transformers' DebugOption (debug_utils, the pin)
# what torch.utils.checkpoint.checkpoint takes besides the function and its inputs (context_fn, a function, cannot be
# written in a setting)
CHECKPOINT_KWARGS = {"use_reentrant": (True, False), "preserve_rng_state": (True, False),
                     "determinism_check": ("default", "none"), "debug": (True, False), "early_stop": (True, False)}
LOG_LEVELS = ("detail", "debug", "info", "warning", "error", "critical", "passive")  # transformers' trainer_log_levels


def check_best_model_saved(training: dict[str, Any], held_out: bool) -> None:
    """load_best_model_at_end's checkpoints saved where the run evaluates, as TrainingArguments requires (its
    ValueError once the image had started): the strategies the trainer gives it (dockyard.train.arguments.evaluation:
    every logging step with held-out data) and the run's save_strategy and save_steps."""
    def named(key: str, default: str) -> str:  # YAML reads `no` as false
        value = training.get(key, default)
        return "no" if value is False else str(value)

    evaluated, saved = named("eval_strategy", "steps" if held_out else "no"), named("save_strategy", "steps")
    if saved == "best":
        return
    if evaluated != saved:
        raise DockyardError(f"load_best_model_at_end true requires the save and eval strategy to match, except when "
                            f"save_strategy is best, but found eval_strategy {evaluated} and save_strategy {saved}: "
                            f"give --save_strategy {evaluated} (or best), or leave load_best_model_at_end out")
    every = training.get("eval_steps") or training.get("logging_steps") or 5
    save_steps = training.get("save_steps", 500)
    if evaluated == "steps" and not _multiple(save_steps, every):
        raise DockyardError(f"load_best_model_at_end true requires the saving steps to be a round multiple of the "
                            f"evaluation steps, but found save_steps {save_steps:g} and eval_steps {every:g}: give "
                            f"--save_steps a multiple of {every:g} (or --save_strategy best), or leave "
                            "load_best_model_at_end out")


def _multiple(save_steps: float, eval_steps: float) -> bool:
    """save_steps a multiple of eval_steps, as TrainingArguments counts it: whole steps, or both shares of the run
    (below 1), which it compares in millionths."""
    if save_steps % eval_steps == 0:
        return True
    million = 1_000_000
    return save_steps < 1 and eval_steps < 1 and (save_steps * million) % (eval_steps * million) == 0


# transformers 5 renamed gradient checkpointing (the old names warn, and go in v6): a recipe may use either name,
# the trainer reads dockyard's (the old one, which the autos and the plan speak) and hands the Trainer the new one
CHECKPOINTING_NAMES = {"activation_checkpointing": "gradient_checkpointing",
                       "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}


def either_name(key: str) -> str:
    """A checkpointing setting as an error names it: by both its names, since a user may have written either."""
    new = next((n for n, o in CHECKPOINTING_NAMES.items() if o == key), None)
    return f"{key} (or {new})" if new else key
