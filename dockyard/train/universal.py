"""A ZeRO checkpoint resumed on another number of processes (a run preempted on 8 GPUs, going on with 4).

ZeRO splits the optimizer's state over the processes that saved it, one file each (`..._pp_rank_R_...`), and
DeepSpeed loads such a checkpoint on as many only: on another number it raised its ZeRORuntimeException on every rank,
once the model had loaded. DeepSpeed's universal form holds that state whole, a folder per parameter, and loads on any
number. So a resume on another number

- decides, in every process before the process group forms, that it needs the universal form (`needed`): the
  DeepSpeed config then asks for it (`checkpoint.load_universal`), or the resume is refused, with the reason, where
  no universal form can be made;
- has rank 0 make it with DeepSpeed's own ds_to_universal, or find it made by an earlier attempt, while the other
  ranks wait for it (`ready`); then the Trainer resumes as ever: its step, learning-rate schedule and data position
  from the checkpoint's own files, its global batch from the run's kept settings.

The form lies beside the original, inside its checkpoint (checkpoint-N/global_stepN_universal, named by
checkpoint-N/latest_universal, where DeepSpeed looks when the Trainer resumes): no file of the original changes, and
the form goes with its checkpoint when the Trainer rotates it out. It is made in a scratch folder and moved into place
whole, so a conversion cut short leaves nothing that a resume would load, or refuse as damaged.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockyard.common import disk, recipes, runfolder
from dockyard.common.errors import DockyardError, first_line, loads

log = logging.getLogger(__name__)

SUFFIX = "_universal"            # global_stepN_universal, as DeepSpeed's documentation names it
LATEST = "latest_universal"      # the form's folder name, which DeepSpeed reads with load_universal
MADE = "converted.json"          # in the form's folder: the files it was made from
SCRATCH = ".universal-partial"   # in checkpoints/, a conversion under way (not a checkpoint-N the Trainer rotates)
ZERO_PART = re.compile(r".*zero_pp_rank_([0-9]{1,6})_mp_rank_[0-9]+_optim_states\.pt")
WAIT_S = 0.5                     # how often the other ranks look for rank 0's conversion
RECORD_LIMIT = 16 << 20          # converted.json and latest_universal: a few KB (a line per file of global_stepN)
NAMED = 10                       # the missing parts a refusal names; the rest it counts


@dataclass(frozen=True)
class Reshard:
    """A resume that loads `checkpoint` on `world` processes, where `saved_by` saved it (its ZeRO files in `source`)."""

    checkpoint: Path
    source: Path                 # checkpoint-N/global_stepN
    saved_by: int
    world: int

    @property
    def folder(self) -> Path:
        """The universal form's folder, beside the original."""
        return self.checkpoint / (self.source.name + SUFFIX)


def needed(checkpoint: Path, world: int, recipe: Any) -> Reshard | None:
    """The universal form a resume of `checkpoint` on `world` processes loads, or None where it loads the checkpoint as
    it is (saved by as many, or not ZeRO's). Refused, with the reason, where no universal form can be made."""
    source = zero_folder(checkpoint) if recipe.deepspeed else None
    ranks = sorted(int(m.group(1)) for f in source.iterdir() if (m := ZERO_PART.fullmatch(f.name))) if source else []
    saved_by = ranks[-1] + 1 if ranks else 0
    if not saved_by or saved_by == world:
        return None
    if missing := sorted(set(range(saved_by)) - set(ranks)):
        # a part named for process 999999 (planted, or left by a run on far more) makes a million missing: a few named
        more = f" and {len(missing) - NAMED:,} more" if len(missing) > NAMED else ""
        raise refused(checkpoint, world, saved_by, recipe, f"{source.name} lacks the part of process(es) "
                      f"{', '.join(map(str, missing[:NAMED]))}{more} (it holds {len(set(ranks))} of {saved_by})")
    config = recipes.read_deepspeed_config(recipe.file(recipe.deepspeed))
    if (config.get("checkpoint") or {}).get("use_node_local_storage"):
        raise refused(checkpoint, world, saved_by, recipe, f"{recipe.file(recipe.deepspeed)} keeps each node's part on "
                      "the node (checkpoint.use_node_local_storage), so no folder holds them all")
    return Reshard(checkpoint, source, saved_by, world)


def zero_folder(checkpoint: Path) -> Path | None:
    """The checkpoint's DeepSpeed folder, global_stepN (the one its `latest` names, were there more), or None."""
    found = [p for p in sorted(checkpoint.glob("global_step*")) if p.is_dir() and not p.name.endswith(SUFFIX)]
    latest = checkpoint / "latest"
    named = latest.read_text(errors="replace").strip() if latest.is_file() else ""
    return next((p for p in found if p.name == named), found[-1] if found else None)


def refused(checkpoint: Path, world: int, saved_by: int, recipe: Any, why: str) -> DockyardError:
    weights = ("" if recipe.peft else f", or start a new run from its weights (--model with the folder "
               f"{checkpoint.parent.parent.name}/{checkpoint.parent.name}/{checkpoint.name} of the runs folder)")
    return DockyardError(
        f"cannot resume from {checkpoint.name} with {world} process(es): it was saved by {saved_by}, and ZeRO split the "
        f"optimizer's state over them; DeepSpeed's universal form, which loads on any number, cannot be made of it: "
        f"{why}. Resume on {saved_by} (--nproc={saved_by}, or as many GPUs){weights}")


def ready(reshard: Reshard, writer: bool, recipe: Any) -> str:
    """The universal form, made by `writer` (rank 0) or found made by an earlier attempt; the other ranks wait for it.
    What rank 0 says of it ("" on the others)."""
    made = made_from(reshard)
    if not writer:
        while not is_made(reshard, made):  # rank 0 failing stops this process with the others (torchrun)
            time.sleep(WAIT_S)
        return ""
    saved = f"{reshard.checkpoint.name} was saved by {reshard.saved_by} process{'es' * (reshard.saved_by != 1)}"
    where = f"{reshard.checkpoint.name}/{reshard.folder.name}"
    if is_made(reshard, made):
        return f"{saved}; loading on {reshard.world} the universal form an earlier resume converted it to ({where})"
    started = time.perf_counter()
    convert(reshard, made, recipe)
    return (f"{saved}; converted to DeepSpeed's universal form for {reshard.world} (into {where} in "
            f"{time.perf_counter() - started:.1f} s; the checkpoint's own files are as they were)")


def made_from(reshard: Reshard) -> dict[str, Any]:
    """What a universal form records of the files it was made from: a checkpoint saved again is converted again."""
    files = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(reshard.source.iterdir()) if f.is_file()}
    return {"from": reshard.source.name, "saved_by": reshard.saved_by, "files": files}


def is_made(reshard: Reshard, made: dict[str, Any]) -> bool:
    """Whether the form rank 0 made of these files is in place. Its record and latest_universal are files of the runs
    folder, which any run's container can write: read through no link, a fifo or a file past RECORD_LIMIT refused,
    JSON nested too deep unreadable; any of these is no record, and rank 0 makes the form again."""
    try:
        record = runfolder.read(reshard.folder, MADE, RECORD_LIMIT)
        latest = runfolder.read_text(reshard.checkpoint, LATEST, RECORD_LIMIT)
        return (record is not None and loads(record) == made
                and latest is not None and latest.strip() == reshard.folder.name)
    except (OSError, ValueError, DockyardError):
        return False


def convert(reshard: Reshard, made: dict[str, Any], recipe: Any) -> None:
    """DeepSpeed's ds_to_universal, in this process: its torch.load reads weights only and the classes
    checkpoints.allow() allows, as every load of a resume does (a process of its own would not have them)."""
    from deepspeed.checkpoint import ds_to_universal

    scratch = reshard.checkpoint.parent / SCRATCH
    remove(scratch)  # a conversion cut short
    remove(reshard.folder)  # one made of other files (the checkpoint was saved again)
    # ds_to_universal writes the fragments of every parameter, then merges them: about twice the optimizer's state
    parts = [f.stat().st_size for f in reshard.source.iterdir() if f.is_file()]
    need, free = 2 * sum(parts), disk.free_bytes(reshard.checkpoint)
    if need > free:
        raise refused(reshard.checkpoint, reshard.world, reshard.saved_by, recipe, f"converting it takes about "
                      f"{disk.size(need)} of disk in {reshard.checkpoint.parent}, where {disk.size(free)} is free")
    out = scratch / reshard.folder.name
    args = argparse.Namespace(input_folder=str(reshard.source), output_folder=str(out), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True,
                              # what DeepSpeed's own clients (Megatron) record, and the HF Trainer's engine does not
                              inject_missing_state=True)
    said = io.StringIO()
    try:
        scratch.mkdir()  # a folder of its own: not one a link planted since stands for (FileExistsError: refused)
        # its progress bars and steps go to train.log; one worker each: no processes forked from this one
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ds_to_universal.main(args)
        runfolder.write(out, MADE, json.dumps(made))
        out.rename(reshard.folder)
        runfolder.write(reshard.checkpoint, LATEST, reshard.folder.name)
    except Exception as e:
        log.info("ds_to_universal said:\n%s", said.getvalue())
        remove(scratch)
        remove(reshard.folder)
        if isinstance(e, DockyardError):
            raise
        why = ("the disk ran out" if disk.disk_full(e, reshard.checkpoint, by_free_space=False) else
               f"DeepSpeed's conversion failed ({type(e).__name__}: {first_line(e, 200)})")
        raise refused(reshard.checkpoint, reshard.world, reshard.saved_by, recipe, why) from None
    remove(scratch)


def remove(path: Path) -> None:
    """Whatever lies at `path`: a folder with all it holds; a link or a file itself. rmtree refuses a link and a file,
    and leaving them was writing the conversion through a link planted there (out of the runs folder), or failing
    every later conversion on a file, blamed on DeepSpeed."""
    if path.is_symlink() or path.exists() and not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
