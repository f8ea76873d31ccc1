"""The HF Trainer's errors in fit, each said in one line with the way out instead of a traceback from every rank: a
GPU out of memory, and what stopped the Trainer before its first step (the settings it was reading, and where each
was set). __main__.fit raises them."""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

from dockyard.common.errors import DockyardError, first_line
from dockyard.common.recipes import RECIPES, Recipe
from dockyard.common.run_settings import RunSettings


def out_of_memory(e: BaseException, args: Any, settings: RunSettings) -> DockyardError:
    """A GPU out of memory, in one line with the ways out, instead of torch's traceback from every rank (`args`: the
    run's TrainingArguments)."""
    checkpointing = " with gradient checkpointing" if args.gradient_checkpointing else ""
    return DockyardError(f"out of GPU memory at micro-batch {args.per_device_train_batch_size} x "
                         f"{settings.max_seq_length} tokens{checkpointing} ({first_line(e, 160)}): lower "
                         "--per_device_train_batch_size (gradient accumulation keeps the global batch), add "
                         "--gradient_checkpointing true, or train with a recipe that shards more (invoke plan "
                         "--model=... says what fits)")


# The settings the Trainer reads in the function of its own that raised (its traceback's): an error there names them
SCHEDULE = ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio")
OPTIMIZER = ("optim", "optim_args", "optim_target_modules", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2",
             "adam_epsilon")
READ_BY = {"get_scheduler": ("the learning-rate schedule", SCHEDULE),
           "create_scheduler": ("the learning-rate schedule", SCHEDULE),
           "get_optimizer_cls_and_kwargs": ("the optimizer", OPTIMIZER),
           "create_optimizer": ("the optimizer", OPTIMIZER)}
# transformers' line for each DeepSpeed config value that disagrees with a TrainingArguments one
DEEPSPEED_MISMATCH = re.compile(r"^- ds (\S+)=(.*) vs hf (.+?)=(.*)$", re.MULTILINE)


def made_from_the_settings(e: BaseException) -> bool:
    """The error came from the Trainer making the optimizer or the schedule of the settings (READ_BY's functions), not
    from reading a checkpoint: a resume given `--lr_scheduler_kwargs '{foo: 1}'` was told its checkpoint was "not a
    checkpoint the Trainer wrote for this run" and to remove it."""
    return bool({frame.name for frame in traceback.extract_tb(e.__traceback__)} & READ_BY.keys())


def before_the_first_step(e: BaseException, recipe: Recipe, given: dict[str, Any]) -> DockyardError:
    """An error the Trainer raised setting up its first step, most often from a setting it takes as it is and reads only
    now (`lr_scheduler_type inverse_sqrt` with `{timescale: 0}`, `--lr_scheduler_kwargs '{min_lr: 1e-5}'` for a
    schedule without it), or a DeepSpeed config value that disagrees with the training settings. One line naming the
    settings involved and where each was set (`given`: those after `--`; the recipe's settings:; defaults.yaml; its
    DeepSpeed config), never those that played no part; the traceback in train.log (rank 0) for a fault elsewhere."""
    logging.getLogger("traceback").info("the Trainer stopped before its first step", exc_info=e)  # train.log alone
    stopped = "the Trainer stopped before its first step"
    logged = "the traceback is in the run's train.log"
    mismatches = DEEPSPEED_MISMATCH.findall(str(e))
    if mismatches and recipe.deepspeed:
        ds = recipe.file(recipe.deepspeed)
        said = "; ".join(f"{key} {ds_value} where the Trainer has {hf_key.removesuffix(' (calculated)')} {hf_value}"
                         + _set_in(re.split(r"[|+]", hf_key.removesuffix(" (calculated)")), recipe, given)
                         for key, ds_value, hf_key, hf_value in mismatches)
        return DockyardError(f"{stopped}: the DeepSpeed config {ds} disagrees with the training settings: {said}. Set "
                             f"each of these to \"auto\" in {ds.name} (the Trainer fills in its value) or to the "
                             f"Trainer's value; {logged}")
    error = f"{stopped}: {type(e).__name__}: {first_line(e, 200)}"
    frames = {frame.name for frame in traceback.extract_tb(e.__traceback__)}
    what, read = next((READ_BY[name] for name in READ_BY if name in frames), ("", ()))
    if read:
        mine = [k for k in read if k in given or k in recipe.settings]
        defaults = _defaults()
        by_default = [k for k in read if k not in mine and k in defaults]
        if mine or by_default:
            said = ", ".join(_where(k, recipe, given) for k in mine)
            shared = ", ".join(f"{k} {_value(defaults[k])}" for k in by_default)
            said = (f"{said}, with {shared} of recipes/defaults.yaml" if said and shared else
                    said or f"{shared} of recipes/defaults.yaml")
            return DockyardError(f"{error}. {what[0].upper()}{what[1:]} read {said}: check them; {logged}")
    named = [_where(k, recipe, given) for k in sorted(given)] + [_where(k, recipe, {}) for k in sorted(recipe.settings)
                                                                 if k not in given]
    if recipe.deepspeed:
        named.append(f"the DeepSpeed config {recipe.file(recipe.deepspeed)}")
    return DockyardError(f"{error}. " + (f"Check the settings given: {', '.join(named)}; {logged}" if named
                                         else logged[0].upper() + logged[1:]))


def _defaults() -> dict[str, Any]:
    from dockyard.common.run_settings import read_defaults

    try:
        return read_defaults(RECIPES / "defaults.yaml")
    except DockyardError:  # read at the start of the run; changed since
        return {}


def _value(value: Any) -> str:
    said = str(value)
    return said if len(said) <= 60 else said[:57] + "..."


def _where(key: str, recipe: Recipe, given: dict[str, Any]) -> str:
    """`--key value` for a setting given after `--`, `key value in the recipe's settings: (PATH)` for the recipe's."""
    if key in given:
        return f"--{key} {_value(given[key])}"
    return f"{key} {_value(recipe.settings[key])} in the recipe's settings: ({recipe.folder / 'recipe.yaml'})"


def _set_in(keys: list[str], recipe: Recipe, given: dict[str, Any]) -> str:
    """Where the TrainingArguments `keys` were set by the run's own settings (after `--`, the recipe's settings:)."""
    mine = [_where(k, recipe, given) for k in keys if k in given or k in recipe.settings]
    return f" ({', '.join(mine)})" if mine else ""
