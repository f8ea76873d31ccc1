"""The run folder: DIR/manifest.json, the record of a run (its schema and extra keys: docs/training.md,
"What a run writes"), written by rank 0 at the end, whether the run completed or failed; and the
rule that a folder holding a run is never overwritten, only resumed."""

from __future__ import annotations

import hashlib
import json
import os
import resource
from pathlib import Path
from typing import Any

from dockyard.errors import DockyardError
from dockyard.train import nodes


def peak_memory_bytes() -> int:
    """This process's peak: GPU memory reserved by torch on a GPU, resident set size on CPU."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_reserved())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def logged(metrics_file: Path) -> list[dict[str, Any]]:
    if not metrics_file.is_file():
        return []
    return [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]


def build(run_dir: Path, recipe: Any, status: str, world_size: int, in_effect: dict | None,
          metrics: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    lines = logged(run_dir / "metrics.jsonl")
    seen = [row for row in lines if "loss" in row]
    evals = [row for row in lines if "eval_loss" in row]
    return {
        "run_id": run_dir.resolve().name,
        "recipe": recipe.name if recipe else "",
        "variant": os.environ.get("DOCKYARD_VARIANT", "native"),
        "status": status,
        "image": {"ref": os.environ.get("DOCKYARD_IMAGE_REF", ""), "id": os.environ.get("DOCKYARD_IMAGE_ID", "")},
        "world_size": world_size,
        "nodes": max(1, world_size // max(1, local)),
        "node_rank": nodes.node_rank(),
        "rendezvous": nodes.rendezvous(),
        "strategy": {"requested": recipe.strategy if recipe else "", "in_effect": in_effect,
                     "peft": recipe.peft if recipe else None},
        # A failed run reports what it got to: the last logged step, and no throughput.
        "metrics": {"steps": metrics.get("steps", seen[-1]["step"] if seen else 0),
                    "loss_first": seen[0]["loss"] if seen else None,
                    "loss_last": seen[-1]["loss"] if seen else None,
                    **({"eval_loss_last": evals[-1]["eval_loss"]} if evals else {}),
                    "tokens_per_second": metrics.get("tokens_per_second"),
                    "peak_memory_bytes": metrics.get("peak_memory_bytes", peak_memory_bytes()),
                    **metrics},
        **extra,
    }


SMALL = 64 << 20  # files up to this size are hashed whole; bigger ones and folders by their list of files and sizes


def fingerprint(path: Path) -> dict[str, Any]:
    """What a run used, recorded so it can be checked later: size, and a sha256 of the file (small files) or of
    its list of (relative name, size) (big files and folders: hashing gigabytes of weights would delay every
    run)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    size = sum(f.stat().st_size for f in files)
    h = hashlib.sha256()
    if path.is_file() and size <= SMALL:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return {"bytes": size, "sha256": h.hexdigest(), "hash_of": "content"}
    for f in files:
        h.update(f"{f.relative_to(path).as_posix() if f != path else f.name}\t{f.stat().st_size}\n".encode())
    return {"bytes": size, "files": len(files), "sha256": h.hexdigest(), "hash_of": "file list with sizes"}


def inputs_record(paths: dict[str, str]) -> dict[str, Any]:
    """key → the host path (as `invoke run` / run.sh mounted it, from DOCKYARD_HOST_PATHS), the path inside, and
    its fingerprint; keys naming no local path (a hub id) record the name alone."""
    host = json.loads(os.environ.get("DOCKYARD_HOST_PATHS") or "{}")
    out: dict[str, Any] = {}
    for key, value in paths.items():
        if not value:
            continue
        p = Path(value)
        out[key] = {"path": host.get(value, str(p)), "inside": value}
        if p.exists():
            out[key].update(fingerprint(p))
    return out


def recipe_files(recipe: Any, defaults: Path) -> dict[str, str]:
    """sha256 of every file that made the recipe (its folder and recipes/defaults.yaml): the edited recipe of a
    run is told from the image's by these."""
    files = [defaults, *sorted(p for p in recipe.folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)]
    return {(f.name if f == defaults else f"{recipe.name}/{f.relative_to(recipe.folder).as_posix()}"):
            hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def write(run_dir: Path, manifest: dict[str, Any], name: str = "manifest.json") -> None:
    tmp = run_dir / f"{name}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(run_dir / name)  # never a half-written manifest


def check_run_dir(run_dir: Path, resume: bool) -> str | None:
    """Never overwrite a run: a folder holding one is refused unless --resume, which continues it from
    its last complete checkpoint (a run killed while saving leaves a checkpoint without trainer_state.json,
    the file the Trainer writes last), or starts it again when it failed before completing one (a node lost
    while starting: the same command with --resume is what a user runs then)."""
    started = sorted((p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.name[11:].isdigit()),
                     key=lambda p: int(p.name[11:]))
    complete = [p for p in started if complete_checkpoint(p)]
    holds_run = (run_dir / "manifest.json").exists() or bool(started)
    if resume and not complete and _failed(run_dir / "manifest.json"):
        return None
    if resume and not complete:
        raise DockyardError(f"--resume: {run_dir} holds no checkpoint to continue from; run without --resume")
    if holds_run and not resume:
        raise DockyardError(f"{run_dir} already holds a run; pick a new run folder, or add --resume to continue "
                            f"it from its last checkpoint")
    return str(complete[-1]) if resume else None


def _failed(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("status") == "failed"
    except (OSError, ValueError, AttributeError):
        return False


def complete_checkpoint(path: Path) -> bool:
    """The Trainer writes trainer_state.json last, from rank 0, after DeepSpeed's closing barrier (every rank's
    shards written); each rank then writes its RNG state, so a node lost right there leaves one missing."""
    if not (path / "trainer_state.json").is_file():
        return False
    shards = list(path.glob("global_step*/*optim_states.pt"))
    states = list(path.glob("rng_state_*.pth"))
    return not (shards and states) or len(shards) == len(states)


def trim_metrics(path: Path, step: int) -> None:
    """On resume, drop the lines logged after the checkpoint: those steps run again."""
    if path.is_file():
        lines = [x for x in path.read_text().splitlines() if x.strip() and json.loads(x)["step"] <= step]
        path.write_text("".join(x + "\n" for x in lines))
