"""The run folder's contract: the files a run writes in runs/<run-id>/, read by the host and written by the
trainer in the image. One place for their names, so both sides agree."""

from __future__ import annotations

MANIFEST = "manifest.json"       # node 0's record of the run (status, strategy in effect, metrics)
METRICS = "metrics.jsonl"        # one line per logging window
TRAIN_LOG = "train.log"
LOSS_PLOT = "loss.png"
CHECKPOINTS = "checkpoints"      # the Trainer's output_dir: checkpoint-<step>/ folders


def manifest_file(node_rank: int) -> str:
    """Node 0's manifest is the run's; every other node of a multi-node run writes its own beside it."""
    return MANIFEST if node_rank == 0 else f"manifest-node{node_rank}.json"
