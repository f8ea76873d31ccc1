"""The run folder: DIR/manifest.json, the record of a run (its schema and extra keys: docs/training.md,
"What a run writes"), written by rank 0 at the end, whether the run completed or failed; and the
rule that a folder holding a run is never overwritten, only resumed. Files in the folder are read and written
through dockyard.common.runfolder: never through a link."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import resource
from pathlib import Path
from typing import Any

from dockyard.common import envvars, runfolder, tree
from dockyard.common.errors import DockyardError, loads
from dockyard.train import nodes

log = logging.getLogger("dockyard.train")


def peak_memory_bytes() -> int:
    """This process's peak: GPU memory reserved by torch on a GPU, resident set size on CPU."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_reserved())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_memory_kind() -> str:
    """What peak_memory_bytes measures here: "gpu_reserved" (torch's pool) or "rss" (the process, on CPU)."""
    import torch

    return "gpu_reserved" if torch.cuda.is_available() else "rss"


def logged(run_dir: Path, name: str = runfolder.METRICS) -> list[dict[str, Any]]:
    """The lines of metrics.jsonl that are JSON objects with a step (a damaged line is skipped, not a crash)."""
    rows = []
    for line in (runfolder.read_text(run_dir, name) or "").splitlines():
        try:
            row = loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def json_text(value: Any, **kw: Any) -> str:
    """JSON that strict parsers read: a non-finite number (a diverged run's NaN loss, its logits) is null, never NaN."""
    # default=str: a value no JSON type holds (a YAML date inside a mapping given as a setting) as its text, never a
    # TypeError that would leave the run without its manifest
    return json.dumps(finite(value), allow_nan=False, default=str, **kw)


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity in it, in dicts and lists too, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _a_loss(value: Any) -> bool:
    """A loss as the trainer logs it: a number, or null where it was not finite."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def build(run_dir: Path, recipe: Any, status: str, world_size: int, in_effect: dict | None,
          metrics: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    lines = logged(run_dir)
    # a line of another shape (`"loss": [1]`, written there by anything but the trainer) is no loss: copied into the
    # manifest, it made a completed run's manifest one the host refuses
    seen = [row for row in lines if "loss" in row and _a_loss(row["loss"])]
    evals = [row for row in lines if "eval_loss" in row and _a_loss(row["eval_loss"])]
    # a loss logged as null (or NaN, by an older trainer) was not finite: the run diverged there
    diverged = next((row["step"] for row in seen if finite(row["loss"]) is None), None)
    return {
        "run_id": run_dir.resolve().name,
        "recipe": recipe.name if recipe else "",
        "variant": os.environ.get(envvars.VARIANT, "native"),
        "status": status,
        "image": {"ref": os.environ.get(envvars.IMAGE_REF, ""), "id": os.environ.get(envvars.IMAGE_ID, "")},
        "world_size": world_size,
        # torchrun's count where it gives one: nodes may run another --nproc each
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE") or 0) or max(1, world_size // max(1, local)),
        "node_rank": nodes.node_rank(),
        "rendezvous": nodes.rendezvous(),
        "strategy": {"requested": recipe.strategy if recipe else "", "in_effect": in_effect,
                     "peft": recipe.peft if recipe else None},
        # A failed run reports what it got to: its steps, and the rate of the windows it logged (if any).
        "metrics": {"steps": metrics.get("steps", seen[-1]["step"] if seen else 0),
                    "loss_first": seen[0]["loss"] if seen else None,
                    "loss_last": seen[-1]["loss"] if seen else None,
                    "loss_non_finite_at_step": diverged,
                    **({"eval_loss_last": evals[-1]["eval_loss"]} if evals else {}),
                    "tokens_per_second": metrics.get("tokens_per_second"),
                    "mfu": metrics.get("mfu"),
                    **{k: metrics.get(k) for k in ("seconds_to_first_step", "seconds_saving", "seconds_evaluating")},
                    "peak_memory_bytes": metrics.get("peak_memory_bytes", peak_memory_bytes()),
                    **metrics},
        **extra,
    }


def host_path(inside: str) -> str:
    """The host path of a path inside the container (DOCKYARD_HOST_PATHS), or `inside` where none is known (a native
    run's own path, a hub id)."""
    host = (envvars.host_paths() or {}).get(inside, inside)
    return host if isinstance(host, str) else inside


def inputs_record(paths: dict[str, str]) -> dict[str, Any]:
    """key → the host path (as `invoke run` / run.sh mounted it, from DOCKYARD_HOST_PATHS), the path inside, and
    its fingerprint; keys naming no local path (a hub id) record the name alone."""
    host = envvars.host_paths()
    if host is None:  # set by invoke run and run.sh: a record of where the inputs came from, no more
        if os.environ.get("LOCAL_RANK", "0") == "0":  # once per node, not per process
            log.warning(f"{envvars.HOST_PATHS} is not a JSON object: the manifest records the inputs' paths "
                        "inside")
        host = {}
    out: dict[str, Any] = {}
    for key, value in paths.items():
        if not value:
            continue
        p = Path(value)
        out[key] = {"path": host.get(value, str(p)), "inside": value}
        if p.exists():
            out[key].update(runfolder.fingerprint(p))
            if out[key].get("hash_of") != "content" and (read := runfolder.fingerprint(p, hidden=False)):
                # less its hidden files, which the trainer never reads: what a resume and the other nodes compare (a
                # vim swap file beside the data)
                out[key] |= {"read": read["sha256"], "read_bytes": read["bytes"]}
    return out


def recipe_files(recipe: Any, defaults: Path) -> dict[str, str]:
    """sha256 of every file that made the recipe (its folder and recipes/defaults.yaml): the edited recipe of a
    run is told from the image's by these."""
    files = [defaults, *sorted(p for p in tree.files(recipe.folder) if "__pycache__" not in p.parts)]
    return {(f.name if f == defaults else f"{recipe.name}/{f.relative_to(recipe.folder).as_posix()}"): sha256(f)
            for f in files}


def sha256(path: Path) -> str:
    """Read in blocks: a large file left in a recipe folder (a dataset, a model) costs each process a block of
    memory, not its size."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write(run_dir: Path, manifest: dict[str, Any], name: str = runfolder.MANIFEST) -> None:
    runfolder.write(run_dir, name, json_text(manifest, indent=2) + "\n")  # never half-written, never via a link


# what a run writes in its folder, one of which a folder --resume continues holds
RUN_FILES = {runfolder.MANIFEST, runfolder.METRICS, runfolder.TRAIN_LOG, runfolder.OVERRIDES, runfolder.CHECKPOINTS,
             runfolder.MODEL, runfolder.CLAIM, runfolder.SHARED_TOKEN, runfolder.LOST_NODE}


def check_holds_a_run(run_dir: Path) -> None:
    """--resume names a run's folder: one holding nothing a run writes (an empty folder, the runs folder itself, a
    typo of a folder of one's own) was taken for a run that had failed early, and a new run was written there,
    beside what it held."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return  # said by what reads the folder next
    if not any(n in RUN_FILES or n.startswith(runfolder.RANK_FAILED) or runfolder.OTHER_NODES_FILE.fullmatch(n)
               for n in names):
        raise DockyardError(f"--resume: {run_dir} holds no run (no {runfolder.MANIFEST}, {runfolder.TRAIN_LOG}, "
                            f"{runfolder.METRICS} or {runfolder.CHECKPOINTS}/): check the run folder you named (invoke "
                            "run: --run-id), or run without --resume to start one")


def check_run_dir(run_dir: Path, resume: bool) -> str | None:
    """Never overwrite a run: a folder holding one is refused unless --resume, which continues it from
    its last complete checkpoint (complete_checkpoint), or starts it again when it failed before completing one
    (a node lost while starting: the same command with --resume is what a user runs then), or was killed before it
    wrote a manifest or a checkpoint (an OOM kill leaves train.log and metrics.jsonl: `invoke run` refuses that
    folder without --resume, so --resume must take it)."""
    started = runfolder.checkpoints_started(run_dir)
    complete = [p for p in started if complete_checkpoint(p)]
    recorded = (run_dir / runfolder.MANIFEST).exists()
    holds_run = recorded or bool(started)
    if resume and not complete and (_failed(run_dir) or not recorded):
        return None  # failed before its first checkpoint, or killed (mid-save perhaps) before its manifest: again
    if resume and not complete:
        # "run without --resume" led to "already holds a run; ... add --resume", and round again
        raise DockyardError(f"--resume: {run_dir} holds no checkpoint to continue from, and its record stays: start "
                            "the run again in a new run folder (invoke run: another --run-id)")
    if holds_run and not resume:
        raise DockyardError(f"{run_dir} already holds a run; pick a new run folder, or add --resume (compose: "
                            "DOCKYARD_RESUME=1) to continue it from its last checkpoint")
    return str(complete[-1]) if resume else None


def check_same_recipe(run_dir: Path, recipe: str) -> None:
    """--resume with the recipe the run was started with: a checkpoint holds one strategy's state (DeepSpeed's
    engine files, DDP's optimizer), which another strategy cannot load, or loads wrongly."""
    was = run_record(run_dir).get("recipe")
    if isinstance(was, str) and was and was != recipe:
        raise DockyardError(f"--resume: {run_dir} was trained with recipe {was}, not {recipe}: resume it with "
                            f"--recipe {was} (a checkpoint holds one strategy's state)")


INPUT_KEYS = ("model", "data", "eval_data")


def check_same_inputs(run_dir: Path, given: dict[str, str], from_saved: list[str] | tuple = (),
                      every: bool = True) -> None:
    """--resume with the model and data the run was started with, as its manifest's `inputs` recorded them: `invoke
    run --resume --run-id=X` without the first run's --model/--data continued from the tiny default model and the
    sample (a checkpoint of another shape failed in the Trainer and rewrote the run's manifest as failed; one of the
    same shape would have trained on, on other data). `given`: key → the value this resume reads ("" for none);
    `from_saved`: those of them taken from the run's overrides.json, not given now: without the manifest's record to
    hold them against, a path written into that file (by anything that ran in the folder) is not read. `every`:
    all three held against the record (a checkpoint continues), else only `from_saved` (nothing trained yet: what is
    given now is a fresh start's)."""
    was = run_record(run_dir).get("inputs")
    if not isinstance(was, dict):
        if from_saved:
            named = ", ".join(f"{k} {given.get(k) or '(none)'}" for k in from_saved)
            raise DockyardError(f"--resume: {run_dir.name}'s overrides.json names {named}, and its manifest holds no "
                                "record of what the run read to check that against: give them again as the run was "
                                "started (--data=..., --model=...; -- --eval_data ...)")
        return  # no record, nothing taken from the folder: what the user gave now
    now = inputs_record(given)
    for key, flag in zip(INPUT_KEYS, ("--model", "--data", "-- --eval_data"), strict=True):
        if not every and key not in from_saved:
            continue
        before = was.get(key) if isinstance(was.get(key), dict) else {}
        after = now.get(key, {})
        hashed = "read" if "read" in before else "sha256"  # (a record written before "read" was: the whole folder)
        if (before.get(hashed) or before.get("path")) != (after.get(hashed) or after.get("path")):
            if before.get("path") and before.get("path") == after.get("path"):
                raise DockyardError(f"--resume: {run_dir.name} was trained with {key} {before['path']}, which now "
                                    f"{'holds other content' if after.get('sha256') else 'cannot be read here'}: "
                                    "put back what it trained on (a checkpoint continues its own model on its own "
                                    "data)")
            raise DockyardError(f"--resume: {run_dir.name} was trained with {key} {before.get('path') or 'the default'}"
                                f", not {after.get('path') or 'the default'}: resume it with the {flag} it was started "
                                "with (a checkpoint continues its own model on its own data)")


def mark_complete(path: Path, step: int) -> None:
    """Publish a checkpoint: the marker appears whole (written aside, then renamed) or not at all."""
    runfolder.write(path, runfolder.COMPLETE, json.dumps({"step": step, "ranks_saved": "all"}) + "\n")


def _failed(run_dir: Path) -> bool:
    """The run's manifest says it failed."""
    return recorded(run_dir).get("status") == "failed"


def completed(run_dir: Path) -> bool:
    """The run's manifest says it completed."""
    return recorded(run_dir).get("status") == "completed"


def recorded(run_dir: Path, name: str = runfolder.MANIFEST) -> dict[str, Any]:
    """The run's manifest (or a node's, `name`) as it is ({} when there is none, or it is not a JSON object), read as
    untrusted: never through a link."""
    try:
        raw = loads(runfolder.read_text(run_dir, name, runfolder.MANIFEST_LIMIT) or "{}")
    except (OSError, ValueError, DockyardError):
        return {}
    return raw if isinstance(raw, dict) else {}


def run_record(run_dir: Path) -> dict[str, Any]:
    """The record a resume is held against: the run's manifest.json or, where no node wrote that, another node's
    (runfolder.records_for: both nodes lost, node 0 without a record); {} where there is none, or it is no manifest."""
    try:
        found = runfolder.record_for(run_dir, 0)
    except DockyardError:  # a manifest.json that is no manifest: read as recorded() reads it
        found = None
    return recorded(run_dir, found[0] if found else runfolder.MANIFEST)


def complete_checkpoint(path: Path) -> bool:
    """A checkpoint holding the marker: every rank had written its part. A run killed while saving leaves one
    without, even with trainer_state.json written (rank 0 writes it while other ranks may still be writing
    their RNG state, or on other nodes their shards)."""
    return (path / runfolder.COMPLETE).is_file()


def trim_metrics(run_dir: Path, step: int, name: str = runfolder.METRICS) -> None:
    """Drop the lines logged after the checkpoint a run starts from (step 0: from the start): those steps run
    again."""
    if runfolder.read(run_dir, name) is not None:
        runfolder.write(run_dir, name, "".join(json_text(row) + "\n" for row in logged(run_dir, name)
                                               if row["step"] <= step))
