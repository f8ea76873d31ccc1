"""What a run writes to disk, and whether the runs folder has room for it: `invoke plan` shows it per recipe,
`invoke run` (and `--dry`) refuses to start without it, and the trainer says it when a save still runs out.

A checkpoint holds the weights (the whole model, or the adapters alone) and, unless `save_only_model`, the
optimizer: AdamW's two moments in fp32 (8 bytes per trainable parameter); DeepSpeed adds its fp32 master copy (4
more) and, for ZeRO-1/2, the module's weights again in its model-states file. At most `save_total_limit` checkpoints
are kept (the Trainer deletes the oldest only after writing the next, so one more is on disk for a moment); the
final model comes on top. Estimates: tokenizer, RNG and scheduler files are small beside the weights. No torch.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from dockyard.common import tree
from dockyard.common.errors import DockyardError, causes
from dockyard.common.memory import LORA_RANK
from dockyard.common.run_settings import resolve_settings
from dockyard.common.units import GIB

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def checkpoint_bytes(shape: Any, *, strategy: str, peft: str | None, weight_bytes: int, optimizer: bool,
                     lora_r: int = LORA_RANK) -> int:
    """One checkpoint of a model of memory.Shape `shape` (see the module docstring)."""
    trainable = shape.adapter_params(lora_r) if peft else shape.params
    weights = trainable * 4 if peft else shape.params * weight_bytes  # PEFT keeps (and saves) adapters in fp32
    if not optimizer:
        return weights
    deepspeed = strategy.startswith("zero")
    states = trainable * (12 if deepspeed else 8)
    module_copy = weights if deepspeed and not strategy.startswith("zero3") else 0
    return weights + states + module_copy


def checkpoints_written(*, max_steps: int, save_steps: float, save_strategy: str,
                        save_total_limit: int | None) -> tuple[int, int]:
    """(checkpoints kept at the end, checkpoints on disk at once at the peak): the Trainer also saves at the last
    step, and deletes the oldest only once the next is written."""
    if str(save_strategy).split(".")[-1].lower() == "no":
        return 0, 0
    limit = save_total_limit if save_total_limit and save_total_limit > 0 else None
    if max_steps and max_steps > 0 and save_steps and save_steps > 0:
        every = math.ceil(max_steps * save_steps) if save_steps < 1 else int(save_steps)
        count = math.ceil(max_steps / max(1, every))
        return (min(count, limit), min(count, limit + 1)) if limit else (count, count)
    return (limit, limit + 1) if limit else (1, 1)  # epochs, no step count: at least what the limit keeps


def run_bytes(shape: Any, *, strategy: str, peft: str | None, dtype: str, half_on_gpu: bool, optimizer: bool,
              max_steps: int, save_steps: float, save_strategy: str, save_total_limit: int | None,
              lora_r: int = LORA_RANK) -> dict[str, Any]:
    """What a run writes: checkpoints (one × how many at the peak) and the final model."""
    weight_bytes = DTYPE_BYTES.get(dtype, 4)  # "auto": fp32 weights for full fine-tuning
    if strategy.startswith("zero") and half_on_gpu:
        weight_bytes = 2  # DeepSpeed casts the module to bf16/fp16 and saves it so
    one = checkpoint_bytes(shape, strategy=strategy, peft=peft, weight_bytes=weight_bytes, optimizer=optimizer,
                           lora_r=lora_r)
    model = checkpoint_bytes(shape, strategy=strategy, peft=peft, weight_bytes=weight_bytes, optimizer=False,
                             lora_r=lora_r)
    kept, peak = checkpoints_written(max_steps=max_steps, save_steps=save_steps, save_strategy=save_strategy,
                                     save_total_limit=save_total_limit)
    # a run by epochs (no max_steps) that keeps every checkpoint: how many it writes is not known before its data is
    unbounded = kept > 0 and not (max_steps and max_steps > 0) and not (save_total_limit and save_total_limit > 0)
    return {"checkpoint_bytes": one, "checkpoints": kept, "checkpoints_at_peak": peak, "model_bytes": model,
            "total_bytes": max(peak * one, kept * one + model),  # the final model comes after the last rotation
            "optimizer_saved": optimizer, "save_total_limit": save_total_limit, "unbounded": unbounded}


def for_recipe(shape: Any, recipe: Any) -> dict[str, Any]:
    """`invoke plan`: what a recipe writes with its own settings (recipes/defaults.yaml and its `settings:`), bf16,
    at the peak of a run long enough to rotate its checkpoints (save_total_limit + 1 on disk while the next is
    written): a plan is for the run to come, not the default's 50 steps (`invoke run` counts its own run's steps)."""
    run_settings, training = resolve_settings(recipe, {})
    return for_settings(shape, recipe, run_settings, {**training, "max_steps": -1}, half_on_gpu=True)


def for_settings(shape: Any, recipe: Any, settings: Any, training: dict[str, Any], half_on_gpu: bool) -> dict[str, Any]:
    """run_bytes for a recipe with its resolved settings (run_settings.resolve_settings: RunSettings and the
    TrainingArguments values, read before any TrainingArguments exist)."""
    def number(key: str, default: float) -> float:
        value = training.get(key, default)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value if number and abs(value) < 2**63 else default  # not nan, inf or past int64: the run refuses those

    limit = training.get("save_total_limit")
    return run_bytes(shape, strategy=recipe.strategy, peft=recipe.peft, dtype=settings.dtype, half_on_gpu=half_on_gpu,
                     optimizer=training.get("save_only_model") not in (True, "true", "True", 1),
                     max_steps=int(number("max_steps", -1)), save_steps=number("save_steps", 500),
                     save_strategy="no" if training.get("save_strategy") is False  # YAML's reading of `no`
                     else str(training.get("save_strategy", "steps")),
                     save_total_limit=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
                     lora_r=settings.lora_r)


def free_bytes(folder: Path) -> int:
    """Free space (for this user) on the filesystem that holds `folder`, or would once it is made."""
    path = folder.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def ways_out(need: dict[str, Any]) -> str:
    limit = need.get("save_total_limit")
    fewer = (f"keep fewer checkpoints (-- --save_total_limit {max(1, limit - 1)}; each is "
             f"{size(need['checkpoint_bytes'])})" if limit and limit > 1 else
             f"save fewer checkpoints (-- --save_steps; each is {size(need['checkpoint_bytes'])})")
    return (f"{fewer}"
            + (", leave the optimizer out of them (-- --save_only_model true: such a checkpoint cannot be resumed)"
               if need.get("optimizer_saved") else "")
            + ", or put the runs folder on a bigger disk (the runs_dir setting, e.g. "
              "INVOKE_DOCKYARD_RUNS_DIR=/scratch/runs invoke run ...; run.sh: --runs=DIR)")


def check_room(runs: Path, need: dict[str, Any], already: int = 0) -> None:
    """Refuse a run whose checkpoints and model will not fit in the free space of the runs folder's disk (less
    what a resumed run already holds there)."""
    wanted = max(0, need["total_bytes"] - already)
    free = free_bytes(runs)
    if wanted > free:
        raise DockyardError(f"not enough disk for this run in {runs}: it writes about {size(wanted)} "
                            f"({describe(need)}) but {size(free)} is free. Ways out: {ways_out(need)}")


def describe(need: dict[str, Any]) -> str:
    extra = need.get("checkpoints_at_peak", 0) > need["checkpoints"]
    if need.get("unbounded"):
        return (f"at least: one checkpoint of {size(need['checkpoint_bytes'])} every save_steps, every one kept "
                "(save_total_limit 0, and no max_steps to count them by): give --save_total_limit N to bound it"
                + f"; and the final model, {size(need['model_bytes'])}")
    return (f"{need['checkpoints']} checkpoint(s) of {size(need['checkpoint_bytes'])}"
            + ("" if need["optimizer_saved"] else " (model only)")
            + (", one more while the next is written" if extra else "")
            + f", and the final model, {size(need['model_bytes'])}")


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in tree.files(folder)) if folder.is_dir() else 0


def size(n: float) -> str:
    if n < GIB:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GIB:.1f} GiB" if n < 100 * GIB else f"{n / GIB:.0f} GiB"


def disk_full(error: BaseException, folder: Path, by_free_space: bool = True) -> bool:
    """Whether a failure while training or saving was the disk running out: the errno where there is one
    (safetensors and torch.save wrap it in their own errors, torch.save without the reason), else (`by_free_space`)
    a folder whose disk has (almost) nothing left."""
    chain = causes(error)
    if any(isinstance(e, OSError) and e.errno == 28 for e in chain):
        return True
    text = " ".join(str(e) for e in chain)
    if "No space left on device" in text or "os error 28" in text or "StorageFull" in text:
        return True
    if not by_free_space:
        return False
    try:
        return free_bytes(folder) < 16 * 2**20
    except OSError:
        return False


def full_message(error: BaseException, folder: Path, need: dict[str, Any] | None) -> str:
    """The whole error (never cut), what filled the disk and the ways out."""
    whole = f"{type(error).__name__}: {error}".strip()
    need = need if need and "total_bytes" in need else None
    try:
        free = size(free_bytes(folder))
    except OSError:
        free = "unknown"
    planned = f"; the run writes about {size(need['total_bytes'])} ({describe(need)})" if need else ""
    out = ways_out(need) if need else ("save fewer checkpoints (save_total_limit, save_steps), or put the runs folder "
                                       "on a bigger disk (the runs_dir setting)")
    return f"the disk holding {folder} ran out of space ({free} free now){planned}. Ways out: {out}. The error: {whole}"
