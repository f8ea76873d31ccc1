"""`--resume` of every recipe on the GPUs of this machine, with checkpoints loaded weights-only (issue 27): the
classes a GPU run's checkpoints hold (bf16/fp16 loss scalers, FSDP2's full state dicts) must be in the trainer's
allow-list, or a genuine resume would be refused. The CPU strategies: tests/integration/test_resume_safety.py."""

from __future__ import annotations

import pytest
import torch

from dockyard.common.recipes import load_recipe, recipe_names
from tests.support.training import LORA_LR, manifest, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none visible)")]
GPUS = torch.cuda.device_count()
SHORT = ["--per_device_train_batch_size", "4", "--max_seq_length", "64", "--save_steps", "4", "--logging_steps", "1"]


@pytest.mark.parametrize("name", recipe_names())
def test_a_genuine_checkpoint_of_every_recipe_resumes_weights_only(tmp_path, name):
    run = tmp_path / "run"
    lr = LORA_LR if load_recipe(name).peft else []
    train(name, run, "--max_steps", "4", *SHORT, *lr, nproc=GPUS, gpu=True)
    resumed = train(name, run, "--max_steps", "6", *SHORT, *lr, nproc=GPUS, gpu=True, resume=True, ok=False)
    m = manifest(run)
    assert resumed.returncode == 0 and m["status"] == "completed", m.get("error") or resumed.stderr[-3000:]
    assert m["metrics"]["steps"] == 6 and "Resuming training from checkpoint" in (run / "train.log").read_text()
