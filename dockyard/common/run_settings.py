"""A run's settings: recipes/defaults.yaml ← the recipe's `settings:` ← the command line.

The recipe itself (its folder, strategy and adapters) is read by dockyard.common.recipes, the one registry;
recipes/defaults.yaml holds the settings every recipe shares; a recipe may change a few of them
(`settings:`), and the command line overrides any of them (`-- --max_steps 50`, read by dockyard.common.overrides).
resolve_settings merges the layers into the project's own settings (RunSettings) and TrainingArguments' fields, whose
values dockyard.common.training_args checks; the batch split and the auto settings' values are
dockyard.common.batch's. Here too: which keys a run takes, those that would do nothing in a recipe's run, and what a
resume keeps of the run's own.

Needs only pydantic and PyYAML (no torch), like the registry it reads.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

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
from dockyard.common.batch import MAX_EXAMPLES
from dockyard.common.errors import (
    DockyardError,
    MiB,
    accepted,
    cut,
    problem_list,
    read_bounded,
    shown,
    yaml_problem,
)
from dockyard.common.overrides import HELP_ASKED, HELP_WORDS, OVERRIDES_WHERE, yaml12_numbers
from dockyard.common.recipes import (
    RECIPES,
    STRATEGY_KEYS,
    YAML_ERRORS,
    Recipe,
    read_deepspeed_config,
    read_yaml,
)
from dockyard.common.training_args import CHECKPOINTING_NAMES, WIDEST_INT, check_best_model_saved, training_arguments

DATA = ROOT / "data"
# the checkout's data/ files the image ships (the default data of each task): nothing else a user keeps in data/
SAMPLES = {"causal_lm": "sample.jsonl", "seq_cls": "sample-classify.jsonl"}
TINY_MODEL = ROOT / "dockyard" / "train" / "assets" / "tiny-llama"  # the tokenizer and config the trainer ships
# Upper bounds: past them a number is a slip of the keyboard (and the planner's sums would overflow)
MAX_TOKENS = 2**24        # per example
MAX_LORA = 2**16          # a rank (or alpha) wider than any layer
# logging windows ending within a run's first 5 steps are warm-up (set-up, compilation, allocator): the throughput
# leaves them out (dockyard.train.callbacks)
WARMUP_STEPS = 5
MAX_PROFILED = 10         # steps profile_steps may hold: each profiled step of a 1B model adds megabytes of trace

# from 0 up to, not including, 1 (an int 0 too; never true/false, nan or inf)
Fraction = Annotated[StrictFloat, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]


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


def check_profile(settings: RunSettings, training: dict[str, Any]) -> None:
    """profile_steps within the run's max_steps (a run that counts epochs is checked as it starts: it then knows its
    steps). The host checks it before a run starts, the trainer again (run.sh, native)."""
    steps = training.get("max_steps")
    if settings.profiled and isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps < settings.profiled[1]:
        raise DockyardError(f"profile_steps {settings.profile_steps} runs past the run's last step (max_steps {steps}): "
                            f"profile steps within it, after the first {WARMUP_STEPS} (warm-up), or raise --max_steps")


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

