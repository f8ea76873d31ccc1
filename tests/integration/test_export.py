"""`invoke export`: a run's model as a plain Hugging Face folder that transformers alone (or peft, for an adapter)
reloads into the model that was trained. ddp, lora and qlora trained for real (tiny model, CPU), exported as users
run it; and once through the image, the way a run in a container is exported."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.cli import invoke
from tests.support.training import FAST, LORA_LR, manifest, train

SHORT = [*FAST, "--max_steps", "4", "--save_steps", "100"]


def _logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1, :16]


@pytest.mark.parametrize("recipe", ["ddp", "lora", "qlora"])
def test_export_writes_a_folder_that_reloads_into_the_trained_model(tmp_path, recipe):
    runs = tmp_path / "runs"
    train(recipe, runs / "r", *SHORT, *(LORA_LR if "lora" in recipe else []))
    m = manifest(runs / "r")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}

    r = invoke("export", "--run=r", env=env)  # trained on this host: said by the user, not read from the manifest
    assert r.returncode == 1 and "say so: invoke export --run=r --native" in r.stderr, r.stderr
    r = invoke("export", "--run=r", "--native", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "largest logit difference" in r.stdout and "tolerance" in r.stdout
    # the saved model is the one that ended training (its probe): said, no warning (a real run's bf16/4-bit logits)
    assert "differs from the model as training ended" in r.stdout and "warning" not in r.stderr, r.stderr
    folder = runs / "r" / "export"
    assert (folder / "tokenizer.json").is_file()
    if recipe == "ddp":
        got = _logits(folder, m["probe"]["input_ids"])
        assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=1e-4), "not the model that was trained"
    else:
        assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA"
        r = invoke("export", "--run=r", "--merge", "--native", f"--out={tmp_path / 'merged'}", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        merged = tmp_path / "merged"
        assert not (merged / "adapter_config.json").exists(), "a plain model: no adapter left"
        got = _logits(merged, m["probe"]["input_ids"])
        # against the run's own (bf16 base + adapter; for QLoRA the 4-bit base it trained on, hence the margin)
        margin = 0.1 if recipe == "qlora" else 0.05
        assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=margin), (got, m["probe"]["logits"])
        if recipe == "qlora":
            assert "4-bit model as trained differs from it by up to" in r.stdout
        assert "differs from the model as training ended" in r.stdout and "warning" not in r.stderr, r.stderr

    r = invoke("export", "--run=r", "--native", env=env)
    assert r.returncode == 1 and "already exists" in r.stderr, "an export never overwrites"


def test_export_of_a_run_in_the_image_merges_there(cpu_image, tmp_path):
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke("run", "--variant=cpu", "--recipe=lora", "--run-id=l1", "--", "--max_steps", "3",
               "--learning_rate", "1e-2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    r = invoke("export", "--run=l1", "--merge", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = manifest(tmp_path / "runs" / "l1")
    got = _logits(tmp_path / "runs" / "l1" / "merged", m["probe"]["input_ids"])
    assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=0.05)
