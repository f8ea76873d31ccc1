"""A run's settings: recipes/defaults.yaml ← the recipe's `settings:` ← the command line.

The recipe itself (its folder, strategy and adapters) is read by dockyard.common.recipes, the one registry;
recipes/defaults.yaml holds the settings every recipe shares; a recipe may change a few of them
(`settings:`), and the command line overrides any of them (`-- --max_steps 50`).

Needs only pydantic and PyYAML (no torch), like the registry it reads.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import math
import re
import reprlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from dockyard import ROOT
from dockyard.common import passthrough
from dockyard.common.errors import (
    DockyardError,
    MiB,
    accepted,
    cut,
    problem_list,
    read_bounded,
    short,
    shown,
    yaml_problem,
)
from dockyard.common.recipes import (
    RECIPES,
    STRATEGY_KEYS,
    YAML_ERRORS,
    Recipe,
    Yaml11Number,
    Yaml11Numbers,
    read_deepspeed_config,
    read_yaml,
)

DATA = ROOT / "data"
# the checkout's data/ files the image ships (the default data of each task): nothing else a user keeps in data/
SAMPLES = {"causal_lm": "sample.jsonl", "seq_cls": "sample-classify.jsonl"}
TINY_MODEL = ROOT / "dockyard" / "train" / "assets" / "tiny-llama"  # the tokenizer and config the trainer ships
# TrainingArguments' fields and number types, as the pinned transformers has them: the host has no transformers
TRAINING_ARGUMENTS = ROOT / "dockyard" / "train" / "assets" / "training_arguments.txt"
# The TrainingArguments fields the trainer may resolve itself when they say `auto` (dockyard.common.autos)
AUTO_TRAINING_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                           "torch_compile", "use_liger_kernel")
AUTO = "auto"
# examples each process takes per optimizer step when global_batch is auto: the micro-batch every run had before the
# autos (dockyard.common.autos)
PER_PROCESS = 8
# Upper bounds: past them a number is a slip of the keyboard (and the planner's sums would overflow)
MAX_TOKENS = 2**24        # per example
MAX_LORA = 2**16          # a rank (or alpha) wider than any layer
MAX_EXAMPLES = 10**12     # per optimizer step (the micro-batch is found among its divisors, in √n steps)
WIDEST_INT = 2**63 - 1    # torch's and numpy's widest integer: a count past it overflows in the Trainer
# logging windows ending within a run's first 5 steps are warm-up (set-up, compilation, allocator): the throughput
# leaves them out (dockyard.train.callbacks)
WARMUP_STEPS = 5
MAX_LEARNING_RATE = 100   # past it a learning rate is a slip of the keyboard (3e4 for 3e-4): RANGES
MAX_PROFILED = 10         # steps profile_steps may hold: each profiled step of a 1B model adds megabytes of trace

# from 0 up to, not including, 1 (an int 0 too; never true/false, nan or inf)
Fraction = Annotated[StrictFloat, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]


# --- settings ------------------------------------------------------------------------------------

class RunSettings(BaseModel):
    """The project's own settings; every other key in defaults.yaml is a TrainingArguments field."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""               # a model folder; "" = the tiny Llama-shaped model made from its config
    data: str = ""                # a data file, folder or cached hub id; "" = the sample shipped in data/
    data_format: Literal["auto", "text", "prompt_completion", "messages", "alpaca", "sharegpt", "text_label"] = "auto"
    eval_data: str = ""           # held-out examples in the same format, or:
    eval_fraction: Fraction = 0.0  # that share of `data` held out (by the seed)
    task: Literal["causal_lm", "seq_cls"] = "causal_lm"
    max_seq_length: StrictInt = Field(default=128, ge=1, le=MAX_TOKENS)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    lora_r: StrictInt = Field(default=16, ge=1, le=MAX_LORA)
    lora_alpha: StrictInt = Field(default=32, ge=1, le=MAX_LORA)
    lora_dropout: Fraction = 0.0
    lora_target_modules: str | list[str] = "all-linear"
    # examples per optimizer step over all processes
    global_batch: Annotated[StrictInt, Field(ge=1, le=MAX_EXAMPLES)] | Literal["auto"] = "auto"
    padding_free: StrictBool | Literal["auto"] = "auto"  # instruction/chat examples packed into one row per batch
    packing: StrictBool | Literal["auto"] = "auto"  # text documents joined and cut into max_seq_length blocks
    numa_binding: StrictBool | Literal["auto"] = "auto"  # each process on its GPU's NUMA node's cores
    profile_steps: str = ""  # "A-B" (or "N"): torch.profiler over those steps (dockyard.train.profiler)
    qlora_lean: StrictBool = True  # qlora's 4-bit layers without their repeated work (dockyard.train.fourbit)

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        """`q_proj,v_proj` (the way most write it) as the list of names it means: peft read it as one name, matched
        nothing and stopped with its traceback."""
        parts = [n.strip() for n in value.split(",")] if isinstance(value, str) and "," in value else None
        if parts and all(not n or NAME.fullmatch(n) for n in parts):  # not a regex of peft's (`\\d{1,2}` has a comma)
            value = [n for n in parts if n]
        if isinstance(value, str):
            value = value.strip()
        if not value or not (isinstance(value, str) or isinstance(value, list)
                             and all(isinstance(v, str) and v for v in value)):
            raise ValueError("give the names of the model's linear layers, as in q_proj,v_proj, or all-linear")
        if isinstance(value, str) and value != "all-linear":  # one name is a regular expression to peft
            try:
                re.compile(value)
            except (re.error, RecursionError, OverflowError) as e:  # a traceback from peft, after the model loaded
                # the value is the formatter's to quote (errors.problem_list), once, as it quotes every setting's
                raise ValueError(f"is not a regular expression ({e}); give the names of the model's linear layers, "
                                 "as in q_proj,v_proj, or all-linear") from None
        return value

    @field_validator("profile_steps", mode="before")
    @classmethod
    def _steps_to_profile(cls, value: Any) -> str:
        # the value is the formatter's to quote (errors.problem_list), once, as it quotes every setting's
        if value is True:  # `-- --profile_steps` with no value reads as a switch (parse_overrides)
            raise ValueError("was given no value; put a step or a range of steps after it, e.g. 20-22")
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(NOT_STEPS)
        return "-".join(map(str, profile_range(value) or ()))

    @model_validator(mode="after")
    def _format_of_the_task(self) -> RunSettings:
        """A data format the task reads: seq_cls took text and label whatever data_format said (text was ignored)."""
        if self.task == "seq_cls" and self.data_format not in ("auto", "text_label"):
            raise ValueError(f"data_format {self.data_format}: task seq_cls reads a text and a label per example "
                             "(data_format text_label, or auto)")
        if self.task == "causal_lm" and self.data_format == "text_label":
            raise ValueError("data_format text_label is for sequence classification: add --task seq_cls")
        return self

    @property
    def data_path(self) -> Path:
        if self.data:
            return Path(self.data)
        return DATA / SAMPLES[self.task]

    @property
    def profiled(self) -> tuple[int, int] | None:
        """The first and last step profile_steps names, or None."""
        return profile_range(self.profile_steps)


def profile_range(value: int | str) -> tuple[int, int] | None:
    """profile_steps as (first, last) optimizer steps, counted from 1; "" is None. Raises ValueError (pydantic says
    it as the setting's error, quoting the value) for anything else than N or A-B with 1 <= A <= B < A + MAX_PROFILED
    and B a step a run can reach (a step of 5,000 digits was Python's own words on int()'s limit)."""
    text = str(value).strip()
    if not text:
        return None
    first, dash, last = (part.strip() for part in text.partition("-"))
    if not (first.isdecimal() and (not dash or last.isdecimal())):
        raise ValueError(NOT_STEPS)
    if max(len(first.lstrip("0")), len(last.lstrip("0"))) > len(str(WIDEST_INT)) \
            or max(int(first), int(last) if dash else 0) > WIDEST_INT:
        raise ValueError(f"names a step past any run's last (at most {WIDEST_INT:,}); profile steps within the "
                         "run, e.g. 20-22")
    a, b = int(first), int(last) if dash else int(first)
    if a < 1 or b < a:
        raise ValueError("steps count from 1 and a range runs upwards; give A-B with 1 <= A <= B, e.g. 20-22")
    if b - a >= MAX_PROFILED:
        raise ValueError(f"holds {b - a + 1:,} steps; profile at most {MAX_PROFILED} (each adds megabytes of "
                         "trace), e.g. 20-22")
    return a, b


NOT_STEPS = "is not a step or a range of steps; give N or A-B, e.g. 20-22"


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """`--key value` / `--key=value` / `--flag` (true) → {key: value}, values read as YAML scalars."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.lstrip("-") in HELP_WORDS:  # not "write it --help": no trainer setting is named that
            raise DockyardError(f"override {tok!r}: {HELP_ASKED}")
        if not tok.startswith("--") or tok == "--":
            raise DockyardError(f"override {tok!r} is not of the form --key value{_as_flag(tok)}")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            else:
                value = "true"
        key, flag = key.replace("-", "_"), tok.partition("=")[0]
        try:
            read = _scalar(value, flag)
        except Yaml11Number as e:  # `--max_steps 1:00` was 60 steps, `--seed 010` seed 8
            if key not in TEXT_KEYS:
                raise DockyardError(f"{flag} {e.problem}") from None
            read = value
        # a name or a path is the text typed: `--run_name yes` was recorded as true, `--data 2024` refused as a number
        out[key] = value if key in TEXT_KEYS and isinstance(read, (bool, int, float)) else read
        i += 1
    return out


# help asked after `--` (`invoke run -- --help`, the trainer's options wanted): where it is, and what `--` takes
HELP_WORDS = ("help", "h")
HELP_ASKED = ("help is not a trainer setting: `invoke --help run` (or slurm, k8s) says the task's flags; after -- go "
              "the trainer's settings, the keys of recipes/defaults.yaml and any transformers.TrainingArguments field "
              "(e.g. -- --max_steps 50)")


def _as_flag(tok: str) -> str:
    """How an override typed as a name (`max_steps=10`, `-max_steps`, `max_steps 10`) is written: `--max_steps 10`."""
    named = re.fullmatch(r"-?([A-Za-z_][\w-]*)(?:=(.*))?", tok, re.S)
    if not named:  # a stray value, `--` again: no flag to name
        return ""
    value = f" {shlex.quote(named[2])}" if named[2] is not None else ""
    return f": write it --{named[1]}{value}"


TEXT_KEYS = {"run_name", "model", "data", "eval_data", "hub_model_id", "hub_revision"}


class _NoAliases(Yaml11Numbers):
    """YAML without aliases: nine levels of `&a [*b, *b, ...]`, 300 bytes of one override, stand for 10**9 values,
    which the run's record (overrides.json, the manifest) wrote out until the host's memory was gone."""

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's own signature
        if self.check_event(yaml.AliasEvent):
            raise Aliased(self.peek_event().anchor)
        return super().compose_node(parent, index)


class Aliased(Exception):  # noqa: N818 - an alias met, not an error of YAML's
    pass


def _scalar(text: str, flag: str = "") -> Any:
    try:
        value = yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader
    except Aliased as e:
        raise DockyardError(f"{flag} {text[:40]!r}...: a YAML alias (*{e}) repeats a value by reference; write the "
                            "value out (an override holds no aliases)") from None
    except Yaml11Number:
        raise
    except YAML_ERRORS:  # `0x_`, `2001-02-30`, ...: not a YAML value, so the text itself
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-4 as a string
            return float(text)
        except ValueError:
            return text
    if isinstance(value, (dt.date, dt.datetime)):  # `--run_name 2024-01-01` is a name, not a date (no setting
        return text                               # takes one, and JSON, the manifest's, has none)
    return yaml12_within(value) if isinstance(value, (dict, list)) else value


# TrainingArguments fields the run sets itself, after the settings: given anyway, each was silently dropped (a fresh
# run for --resume_from_checkpoint /x, checkpoints in the run folder for --output_dir /x). What to do instead:
SET_BY_THE_RUN = {
    "output_dir": "a run writes into its own folder, runs/<run id>/: name it with --run-id, and move the runs folder "
                  "with the runs_dir setting (INVOKE_DOCKYARD_RUNS_DIR=/big/disk/runs)",
    "resume_from_checkpoint": "continue a run with --resume and its --run-id (invoke run or sh run.sh): it picks the "
                              "run's last complete checkpoint",
    "use_cpu": "the run trains on the GPUs it is given, else on CPU: invoke run --cpu trains on CPU on a GPU host",
    "local_rank": "torchrun gives each process its rank",
    "do_train": "the run always trains, and evaluates where --eval_strategy says (with --eval_data or "
                "--eval_fraction)",
}
SET_BY_THE_RUN |= {"do_eval": SET_BY_THE_RUN["do_train"], "do_predict": SET_BY_THE_RUN["do_train"]}


# a number in exponent form without a dot (`1e-3`), which YAML 1.1 (PyYAML) reads as text; the command line's
# overrides take it as a number (_scalar), and so do the YAML files
YAML11_TEXT_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")


def yaml12_numbers(layer: dict[str, Any]) -> dict[str, Any]:
    """A YAML file's settings with `1e-3` read as the number it is (`learning_rate: 1e-3` in a recipe was refused as
    "takes a finite number"), within a setting's mapping or list too."""
    return {k: v if k in TEXT_KEYS else yaml12_within(v) for k, v in layer.items()}


def yaml12_within(value: Any) -> Any:
    """`value` with every `1e-5` in it, however deep in mappings and lists, the number it is: `--lr_scheduler_kwargs
    '{min_lr: 1e-5}'` handed the schedule the text '1e-5' (a TypeError from the Trainer, blaming the setting), where
    `{min_lr: 1.0e-5}` was taken."""
    if isinstance(value, str):
        return float(value) if YAML11_TEXT_NUMBER.fullmatch(value) else value
    if isinstance(value, dict):
        return {k: yaml12_within(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml12_within(v) for v in value]
    return value


def resolve_settings(recipe: Recipe, overrides: dict[str, Any]) -> tuple[RunSettings, dict[str, Any]]:
    """defaults.yaml ← recipe settings ← overrides, split into the project's settings and TrainingArguments."""
    defaults = yaml12_numbers(read_defaults(RECIPES / "defaults.yaml"))
    for key in STRATEGY_KEYS:
        if key in overrides or key in defaults:
            where = f"--{key}" if key in overrides else f"`{key}` in recipes/defaults.yaml"
            raise DockyardError(f"{where}: the recipe is the strategy (DeepSpeed or FSDP, never both); pick "
                                f"another recipe (invoke recipes) or make a recipe folder of your own")
    layers = ((defaults, "recipes/defaults.yaml"),
              (yaml12_numbers(recipe.settings), f"settings: in {recipe.folder / 'recipe.yaml'}"),
              (overrides, OVERRIDES_WHERE))
    dead = without_effect(recipe)
    for layer, where in layers:
        # defaults.yaml holds the LoRA settings and the schedule every recipe shares: there, only the run's own keys
        for key in sorted(set(layer) & (SET_BY_THE_RUN.keys() if layer is defaults else dead.keys())):
            raise DockyardError(f"{key} in {where}: {dead[key]}")
        if layer.get("hub_token") not in (None, ""):
            raise DockyardError(f"hub_token in {where}: a token given as a setting is saved whole in training_args.bin "
                                "of every checkpoint and of model/, and stands in the docker command line every user "
                                "of the host sees (ps); the runs are offline (HF_HUB_OFFLINE=1) and push nothing: "
                                "leave it out")
        if layer.get("push_to_hub") is True:
            raise DockyardError(f"push_to_hub in {where}: runs are offline (HF_HUB_OFFLINE=1), so the push would fail "
                                "after training; leave it out, and upload the run's model/ from a host with internet "
                                "(`hf upload`)")
    merged = {k: v for layer, where in layers for k, v in plain_names(layer, where).items()}
    check_epochs_take_effect(layers, merged)
    ours = {k: merged.pop(k) for k in list(merged) if k in RunSettings.model_fields}
    try:
        settings = RunSettings(**ours)
    except ValidationError as e:
        origin = {k: where for layer, where in layers for k in plain_names(layer, where)}  # the last layer's wins
        raise DockyardError(f"invalid setting: {_problems(e, ours, origin)}") from None
    if settings.dtype == "float16" and not recipe.peft and recipe.strategy_spec.engine == "ddp":
        # DDP's optimizer steps the model's own weights (DeepSpeed keeps an fp32 copy, FSDP upcasts them): Adam's state
        # in float16, where its eps (1e-8) and small squared gradients are 0, made the loss nan by step 4 on CPU, and
        # fp16 mixed precision refuses float16 weights ("Attempting to unscale FP16 gradients")
        raise DockyardError(f"dtype float16: recipe {recipe.name} trains the whole model with DDP, whose optimizer would "
                            "update float16 weights and keep its state in float16, where it underflows (the loss goes "
                            "nan within a few steps): leave dtype auto (float32 weights, mixed precision on GPUs), "
                            "give bfloat16, or pick a recipe that keeps float32 weights for the optimizer (zero2, "
                            "fsdp) or trains adapters (lora)")
    return settings, merged


OVERRIDES_WHERE = "the overrides after --"


def check_epochs_take_effect(layers: tuple[tuple[dict[str, Any], str], ...], merged: dict[str, Any]) -> None:
    """num_train_epochs given where max_steps (defaults.yaml's 50) is set too: the Trainer takes max_steps and ignores
    the epochs (`-- --num_train_epochs 3` trained 50 steps, its only word "max_steps is given, it will override any
    value given in num_train_epochs" in train.log)."""
    given = [where for layer, where in layers[1:] if "num_train_epochs" in layer]  # defaults.yaml's own: never
    steps = merged.get("max_steps")
    if given and isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        steps_from = next(where for layer, where in reversed(layers) if "max_steps" in layer)
        raise DockyardError(f"num_train_epochs in {given[-1]}: the Trainer ignores it while max_steps is set "
                            f"(max_steps {steps}, from {steps_from}), and would stop after {steps} steps: add "
                            "--max_steps -1 to train for num_train_epochs, or leave num_train_epochs out")


NAME = re.compile(r"[A-Za-z_][\w.]*")  # a module's name (q_proj, mlp.down_proj), where a list of them is written a,b
LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")  # read by the lora and qlora recipes only

# The TrainingArguments a DeepSpeed config's own section overrides, that section's name, and what it is
DEEPSPEED_CHOOSES = {"optimizer": (("optim", "optim_args", "optim_target_modules"), "the optimizer"),
                     "scheduler": (("lr_scheduler_type", "lr_scheduler_kwargs"), "the learning-rate schedule")}


def without_effect(recipe: Recipe) -> dict[str, str]:
    """Each setting that would do nothing in a run of `recipe`, with why and what to give instead: resolve_settings
    refuses it where it is given, and a resume leaves it out of the settings a run saved before it was refused.
    `--optim sgd` on an offload recipe trained with its ds_config's AdamW while the manifest said sgd."""
    why = {k: f"the run sets it itself and would ignore this value; {v}" for k, v in SET_BY_THE_RUN.items()}
    if recipe.peft != "qlora":
        why["qlora_lean"] = (f"recipe {recipe.name} has no 4-bit layers (only qlora's base is quantised); leave it out, "
                             "or pick qlora")
    if not recipe.peft:
        why |= dict.fromkeys(LORA_KEYS, f"recipe {recipe.name} trains the whole model, with no LoRA adapters to set; "
                                        "pick lora or qlora (invoke recipes), or leave it out")
    chosen = read_deepspeed_config(recipe.file(recipe.deepspeed)) if recipe.deepspeed else {}
    for section, (keys, what) in DEEPSPEED_CHOOSES.items():
        if section in chosen:
            why |= {k: f"recipe {recipe.name}'s {recipe.deepspeed} chooses {what} itself (its `{section}` section), "
                       f"and DeepSpeed would take that one; leave {k} out, or make a recipe of your own whose "
                       f"{recipe.deepspeed} has no `{section}` (docs/training.md: Adding a recipe)" for k in keys}
    return why


def ineffective(recipe: Recipe, overrides: dict[str, Any]) -> list[str]:
    """The keys of `overrides` that have no effect on a run of `recipe` (without_effect)."""
    return sorted(set(overrides) & without_effect(recipe).keys())


def resumed_with(recipe: Recipe, saved: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                                                    list[str]]:
    """--resume: the run's own settings (`saved`, its overrides.json) with those `given` now on top, as (merged, kept:
    the run's own that stay, dropped: the run's own that never had an effect on it and are left out)."""
    dropped = ineffective(recipe, saved)  # a run of before they were refused
    kept = {k: v for k, v in saved.items() if k not in given and k not in dropped}
    return {**kept, **given}, kept, dropped


def blame_kept(e: DockyardError, kept: dict[str, Any]) -> DockyardError:
    """A resume's settings error that names one of the run's own settings (`kept`), said to be one: the user gave
    nothing of that name this time."""
    named = ", ".join(f"--{k} {v}" for k, v in kept.items() if k in str(e))
    if not named:  # a setting given now
        return e
    batch = ("; the global batch is the one the run trained over, kept so a resume on another number of processes "
             "trains over the same: -- --global_batch auto works it out again for this one"
             if "global_batch" in kept and "global_batch" in str(e) else "")
    return DockyardError(f"{e} (the run's own settings, from its overrides.json: {named}; give one again after -- to "
                         f"change it{batch})")


# The settings that give a checkpoint's tensors their shape: LoRA's rank and the layers that carry adapters, and the
# task (a classification head, or none). A resume that changed one failed once the model had loaded: another lora_r
# as a size-mismatch traceback from every rank, other lora_target_modules as a checkpoint "not written for this run",
# with the advice to remove it (the one before it fails the same way).
SHAPING_KEYS = ("lora_r", "lora_target_modules", "task")


def check_same_shape(recipe: Recipe, saved: dict[str, Any], settings: RunSettings) -> None:
    """--resume from a checkpoint: `settings` (the run's own, `saved`, with those given now on top) shape the model as
    the run that wrote the checkpoint had it. The host checks it before the run starts, the trainer again."""
    try:
        was, _ = resolve_settings(recipe, saved)
    except DockyardError:  # the run's own settings alone are refused where they are merged (blame_kept)
        return
    for key in SHAPING_KEYS:
        if key in LORA_KEYS and not recipe.peft:
            continue
        values = getattr(was, key), getattr(settings, key)
        if len({repr(sorted(set(v)) if isinstance(v, list) else v) for v in values}) == 1:
            continue  # the same (target modules in another order are the same modules, the same tensors)
        before, now = (",".join(v) if isinstance(v, list) else str(v) for v in values)
        if before != now:
            raise DockyardError(f"--{key} {shown(now)[:80]}: the run trained with {key} {shown(before)[:80]}, and its "
                                "checkpoints hold tensors of that shape, which a resume cannot change: leave "
                                f"--{key} out to continue the run, or train with {key} {shown(now)[:80]} as a new run "
                                "(another --run-id)")


def read_defaults(path: Path) -> dict[str, Any]:
    """recipes/defaults.yaml as `key: value` settings, or one error line saying what is wrong with it (it is read by
    every run, on the host and in the trainer: a slip in it was a traceback there)."""
    try:
        defaults = read_yaml(read_bounded(path, MiB, "defaults.yaml").decode("utf-8-sig"), path) or {}
    except (*YAML_ERRORS, UnicodeDecodeError) as e:
        raise DockyardError(f"{path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(defaults, dict) or not all(isinstance(k, str) for k in defaults):
        raise DockyardError(f"{path}: expected `key: value` lines, one setting each (max_steps: 50, ...)")
    return defaults


def known_keys() -> set[str]:
    """The keys a run takes: the project's settings and TrainingArguments' fields."""
    return set(RunSettings.model_fields) | set(training_arguments())


# TrainingArguments fields of transformers 4 that 5 (every image's) no longer has, and what takes their place
GONE = {
    "logging_dir": "transformers 5 has none: the run's logs are in its folder, train.log and metrics.jsonl",
    "overwrite_output_dir": "transformers 5 has none, and a run never overwrites another: give a new --run-id",
    "no_cuda": "transformers 5 has none: invoke run --cpu trains on CPU",
    "evaluation_strategy": "transformers 5 calls it --eval_strategy",
    "per_gpu_train_batch_size": "transformers 5 calls it --per_device_train_batch_size",
    "per_gpu_eval_batch_size": "transformers 5 calls it --per_device_eval_batch_size",
}


# What other trainers and scripts call a setting, and dockyard's name for it: the closest spelling misled here
# (`--batch_size` was "did you mean --auto_find_batch_size?", `--lora_rank` --local_rank, `--dataset` --data_seed)
# or found nothing (`--lr`, `--epochs`)
OTHER_NAMES = {
    "lr": "--learning_rate",
    **dict.fromkeys(("batch_size", "bs", "micro_batch_size"),
                    "--per_device_train_batch_size, examples per process, or --global_batch, per step over all processes"),
    "train_batch_size": "--global_batch, examples per step over all processes",
    **dict.fromkeys(("epochs", "num_epochs", "n_epochs"), "--num_train_epochs"),
    **dict.fromkeys(("seq_len", "seq_length", "sequence_len", "sequence_length", "max_length", "max_len",
                     "block_size", "cutoff_len"), "--max_seq_length"),
    **dict.fromkeys(("dataset", "dataset_name", "dataset_path", "data_path", "train_file"), "--data"),
    **dict.fromkeys(("model_name_or_path", "model_name", "model_path", "base_model"), "--model"),
    **dict.fromkeys(("lora_rank", "rank"), "--lora_r"),
    **dict.fromkeys(("grad_accum", "gradient_accumulation", "grad_accumulation_steps"),
                    "--gradient_accumulation_steps"),
}


# `invoke run`'s own flags, which a user may write after `--` (the trainer's overrides) by mistake
RUN_FLAGS = frozenset({"dry", "native", "cpu", "resume", "run_id", "recipe", "variant", "nproc", "nodes", "node_rank",
                       "master_addr", "master_port", "gpus", "iface", "join_timeout", "max_restarts",
                       "disable_require"})


def check_known_overrides(given: dict[str, Any]) -> None:
    """Every override after `--` a known key; a typo is named with the key it is closest to."""
    known = known_keys()
    if asked := [key for key in HELP_WORDS if key in given]:
        raise DockyardError(f"override --{asked[0]}: {HELP_ASKED}")
    if unknown := sorted(set(given) - known):
        said = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            said.append(f"--{cut(key, 60)}" + (f" ({GONE[key]})" if key in GONE else
                                      " (a flag of invoke run: put it before --)" if key in RUN_FLAGS else
                                      f" (did you mean {OTHER_NAMES[key]}?)" if key in OTHER_NAMES else
                                      f" (did you mean --{close[0]}?)" if close else ""))
        raise DockyardError(f"unknown trainer override(s): {', '.join(said)}. Valid: the keys of "
                            "recipes/defaults.yaml and any transformers.TrainingArguments field")


def check_known_settings(recipe: Recipe, training: dict[str, Any]) -> None:
    """Every TrainingArguments key of the recipe's `settings:` and defaults.yaml a known one (the overrides are
    checked before: check_known_overrides)."""
    if unknown := sorted(set(training) - known_keys()):
        where = (f"settings: in {recipe.folder / 'recipe.yaml'}" if set(unknown) & set(recipe.settings)
                 else "recipes/defaults.yaml")
        raise DockyardError(f"unknown setting(s) {', '.join(unknown)} in {where}: give a key of recipes/defaults.yaml "
                            "or a transformers.TrainingArguments field")


# transformers' AcceleratorConfig fields (trainer_pt_utils, the pin; a test keeps them current)
ACCELERATOR_CONFIG = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
                      "gradient_accumulation_kwargs", "use_configured_state")
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
    """Every TrainingArguments number of resolve_settings' second half valid (check_number): the host checks them
    before a run starts (`invoke run`, slurm, k8s), the trainer again for what reaches it directly (run.sh, native),
    with its torch's `compile_modes`."""
    kinds = training_arguments()
    for key, value in training.items():
        check_number(key, value, kinds.get(key, ""))
    passthrough.check(training)
    for key in ("log_level", "log_level_replica"):  # the Trainer looks it up in a table of these: a KeyError
        if key in training and str(training[key]) not in LOG_LEVELS:
            raise DockyardError(f"{key} {training[key]!r}: give one of {', '.join(LOG_LEVELS)}")
    check_debug(training.get("debug"))
    if training.get("accelerator_config") is not None and not isinstance(training["accelerator_config"], dict):
        # a file's path: the Trainer reads it in each process, unchecked (split_batches in it; a fifo hung the run)
        raise DockyardError(f"accelerator_config {shown(str(training['accelerator_config']))[:80]!r}: give its "
                            "settings as a mapping after --, as in --accelerator_config '{even_batches: false}', not "
                            "a file's name")
    if "split_batches" in json.dumps(training.get("accelerator_config"), default=str):
        # each process then takes its share of one micro-batch: the run trained half (of 2 processes) the global
        # batch it reported
        raise DockyardError("accelerator_config: leave split_batches out: global_batch says what each step trains over "
                            "all processes, and the project splits it (split_batches would train less than it says)")
    # TrainingArguments' TypeError once the image had started: --dry took any key
    if unknown := sorted(set(training.get("accelerator_config") or {}) - set(ACCELERATOR_CONFIG), key=str):
        raise DockyardError(f"accelerator_config: unknown key(s) {cut(', '.join(map(str, unknown)), 80)}; transformers' "
                            f"AcceleratorConfig takes {', '.join(k for k in ACCELERATOR_CONFIG if k != 'split_batches')}")
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


def check_evaluation(settings: RunSettings, training: dict[str, Any]) -> None:
    """An evaluation strategy with held-out data to evaluate on: the HF Trainer refuses one without, but only once
    the model and the data have loaded. The host checks it before a run starts, the trainer again (run.sh, native)."""
    strategy = training.get("eval_strategy")
    if settings.eval_data and settings.eval_fraction:  # the trainer took eval_data and held nothing out, unsaid
        raise DockyardError(f"eval_data and eval_fraction are both set ({settings.eval_fraction:g}): evaluate on the "
                            "file (--eval_fraction 0) or on a share of --data (leave out --eval_data), not both")
    if training.get("eval_on_start") is True and not (settings.eval_data or settings.eval_fraction):
        raise DockyardError("eval_on_start needs held-out data: add --eval_fraction 0.05 or --eval_data FILE")
    held_out = settings.eval_data or settings.eval_fraction
    for key, value, needs in (("load_best_model_at_end", True, "to choose the best checkpoint by"),
                              ("lr_scheduler_type", "reduce_lr_on_plateau", "whose loss lowers the learning rate"),
                              ("lr_scheduler_type", "greedy", "whose loss steers the learning rate")):
        if training.get(key) == value and (not held_out or strategy in ("no", False)):
            raise DockyardError(f"{key} {str(value).lower()} needs an evaluation {needs}: add --eval_fraction 0.05 "
                                "or --eval_data FILE (and leave eval_strategy as it is), or leave it out")
    if str(strategy) in ("steps", "epoch") and not (settings.eval_data or settings.eval_fraction):
        raise DockyardError(f"eval_strategy {strategy} needs held-out data: add --eval_fraction 0.05 or --eval_data "
                            "FILE (or --eval_strategy no)")
    if training.get("load_best_model_at_end") is True:
        check_best_model_saved(training, bool(held_out))


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


def check_profile(settings: RunSettings, training: dict[str, Any]) -> None:
    """profile_steps within the run's max_steps (a run that counts epochs is checked as it starts: it then knows its
    steps). The host checks it before a run starts, the trainer again (run.sh, native)."""
    steps = training.get("max_steps")
    if settings.profiled and isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps < settings.profiled[1]:
        raise DockyardError(f"profile_steps {settings.profile_steps} runs past the run's last step (max_steps {steps}): "
                            f"profile steps within it, after the first {WARMUP_STEPS} (warm-up), or raise --max_steps")


def training_arguments() -> dict[str, str]:
    """TrainingArguments' field names and, for a number, its type (`int`, `float|None`, ...; "" for the others), as
    the pinned transformers has them (a test keeps the snapshot current)."""
    lines = TRAINING_ARGUMENTS.read_text().splitlines()
    return dict((line.split() + [""])[:2] for line in lines if line.strip() and not line.startswith("#"))


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
# DeepSpeed gathers a ZeRO-3 parameter only inside its own module's forward: Liger's fused loss reads the output
# layer's weight without calling that layer, and gets an empty shard (trl #3368, #5891: "size mismatch")
LIGER_UNDER_ZERO3 = ("use_liger_kernel true: under ZeRO-3 Liger's fused loss reads the output layer's weight while "
                     "DeepSpeed holds it partitioned (an empty shard: the run would fail at its first step); set it to "
                     "auto or false, or train with zero2 or fsdp")
LIGER_AND_COMPILE = ("use_liger_kernel and torch_compile do not work together (under torch.compile Liger's kernels "
                     "fail, or its fused loss comes out wrong where labels are masked): turn one of them off")


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


# --- the auto settings' values: what the trainer resolves (dockyard.common.autos), checked the same way on the host

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


# transformers 5 renamed gradient checkpointing (the old names warn, and go in v6): a recipe may use either name,
# the trainer reads dockyard's (the old one, which the autos and the plan speak) and hands the Trainer the new one
CHECKPOINTING_NAMES = {"activation_checkpointing": "gradient_checkpointing",
                       "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}


def either_name(key: str) -> str:
    """A checkpointing setting as an error names it: by both its names, since a user may have written either."""
    new = next((n for n, o in CHECKPOINTING_NAMES.items() if o == key), None)
    return f"{key} (or {new})" if new else key


def plain_names(layer: dict[str, Any], where: str) -> dict[str, Any]:
    """One layer of settings with transformers' new checkpointing names read as dockyard's; both names in one layer
    with different values is refused."""
    out = dict(layer)
    for new, old in CHECKPOINTING_NAMES.items():
        if new in out:
            value = out.pop(new)
            if old in out and out[old] != value:
                raise DockyardError(f"{where}: {old} {out[old]!r} and {new} {value!r} are one setting (transformers "
                                    f"5 renamed it): give one of them")
            out[old] = value
    return out


def _problems(error: ValidationError, given: dict[str, Any], origin: dict[str, str]) -> str:
    """Each problem in our words (errors.problem_list: what the setting takes, from its bounds), the setting named
    as it was given: `--key` for an override, else the key and the file it came from (`origin`)."""
    said = []
    for key, value, words in problem_list(error, model=RunSettings):
        where = origin.get(key, "")
        bare = key in given and given[key] is True and not accepted(RunSettings, key)  # `--key` alone: not a switch
        value, place = (f" {value}" if value and not bare else ""), \
            (f" ({where})" if where and where != OVERRIDES_WHERE else "")
        name = f"--{key}" if where == OVERRIDES_WHERE else key
        if key in given and given[key] is None and not accepted(RunSettings, key):  # not a number or a switch
            # `--data=` or a bare `~`: YAML's null
            said.append(f"{name}{place}: given no value (`--{key}=` with nothing after it, or a bare ~, reads as none): give "
                        f"one, e.g. --{key} {'PATH' if key in ('model', 'data', 'eval_data') else 'VALUE'}")
        elif key:
            said.append(f"{name}{value}{place}: {words}")
        else:  # the settings together (a model validator's): its own words
            said.append(words)
    return "; ".join(said)


def number_range(name: str) -> str:
    """What a number setting takes, as a user reads it, from its bounds on RunSettings ("" for the others)."""
    takes = accepted(RunSettings, name)
    return takes if takes.startswith(("a whole number", "a number")) else ""

