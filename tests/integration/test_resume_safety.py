"""`--resume` loads a checkpoint as weights, never as code (issue 27): a checkpoint file replaced by a pickle that
runs a command is refused before anything of it is unpickled, and a checkpoint the trainer wrote still resumes.
Real runs: 2 processes under torchrun on CPU (gloo; DeepSpeed on its CPU accelerator), the tiny model."""

from __future__ import annotations

import os
import shlex
import shutil

import pytest
import torch

from tests.support.training import manifest, train

FIRST = ["--max_steps", "2", "--save_steps", "2", "--per_device_train_batch_size", "2", "--max_seq_length", "32",
         "--logging_steps", "1"]
MORE = ["--max_steps", "3", *FIRST[2:]]


class Planted:
    """What a hostile container leaves in a checkpoint: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


# A pickle planted with torch.save, in the Trainer's own file and in DeepSpeed's (which asks torch.load for
# weights_only=False). A bare pickle (not torch's zip) meets the same check before the trainer starts:
# tests/unit/test_train_checkpoints.py plants one (here, each kind is a run more of CI's 2 cores).
@pytest.mark.parametrize("recipe, planted", [("ddp", "rng_state_0.pth"),
                                             ("zero2", "global_step2/mp_rank_00_model_states.pt")])
def test_a_planted_pickle_is_refused_and_the_genuine_checkpoint_resumes(recipe, planted, tmp_path):
    run = tmp_path / "run"
    train(recipe, run, *FIRST)
    marker = tmp_path / "the-pickle-ran"
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    torch.save({"state": Planted(marker)}, bad / "checkpoints" / "checkpoint-2" / planted)
    record = (bad / "manifest.json").read_text()
    refused = train(recipe, bad, *MORE, resume=True, ok=False)
    assert refused.returncode != 0
    assert not marker.exists(), "the planted pickle ran"
    assert (bad / "manifest.json").read_text() == record  # refused before training: the run's record stays
    said = refused.stderr[refused.stderr.index("error: --resume refused"):].splitlines()[0]
    assert planted in said and "posix.system" in said, said

    train(recipe, run, *MORE, resume=True)
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 3, m.get("error")
    assert "Resuming training from checkpoint" in (run / "train.log").read_text()
    assert not marker.exists()
