"""The auto settings in real runs (torchrun, 2 CPU processes, the tiny model): each resolves to what runs did
before and says so in the manifest; padding-free batches, packed text and torch_compile, set by hand, train."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from tests.support.training import FAST, LORA_LR, chat_data, manifest, train

AUTOS = ("global_batch", "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
         "torch_compile", "use_liger_kernel", "padding_free", "packing")


def test_on_cpu_every_auto_resolves_to_the_old_behaviour_and_the_manifest_says_why(tmp_path):
    run = tmp_path / "run"
    train("lora", run, "--max_steps", "4", "--max_seq_length", "64", "--save_steps", "100", "--logging_steps", "1")
    resolved = manifest(run)["settings_resolved"]
    assert {k: resolved[k]["value"] for k in AUTOS} == {
        "global_batch": 16, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
        "gradient_checkpointing": True, "torch_compile": False, "use_liger_kernel": False, "padding_free": False,
        "packing": False}
    assert all(resolved[k]["why"] for k in AUTOS)
    assert manifest(run)["plan"]["batch"] == 8


def test_padding_free_batches_train_chat_data(tmp_path):
    data = chat_data(tmp_path / "chat.jsonl")
    run = tmp_path / "run"
    train("ddp", run, *FAST, "--data", str(data), "--padding_free", "true", "--global_batch", "8")
    m = manifest(run)
    assert m["settings_resolved"]["padding_free"] == {"value": True, "why": "set"}
    assert m["data"]["format"] == "messages"
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"] - 0.3
    assert (m["settings_resolved"]["per_device_train_batch_size"]["value"],
            m["settings_resolved"]["gradient_accumulation_steps"]["value"]) == (4, 1)


def test_packed_text_trains_full_blocks_of_real_tokens(tmp_path):
    """The sample's ~40-token documents, joined into 64-token blocks: every step of 2 processes x 4 blocks trains
    512 real tokens (padded, the same step held 8 documents, ~390 tokens), and nothing is cut."""
    run = tmp_path / "run"
    train("ddp", run, *FAST, "--packing", "true")
    m = manifest(run)
    assert m["settings_resolved"]["packing"] == {"value": True, "why": "set"}
    assert m["data"]["packed"] is True and m["data"]["truncated"] == 0 and m["data"]["format"] == "text"
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"] - 0.3
    windows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [w for w in windows if "tokens" in w]
    # one block per epoch may be the short last one
    assert sum(w["tokens"] for w in steps) >= 12 * 512 - 64 and all(w["tokens"] <= 512 for w in steps), steps


@pytest.mark.parametrize("name", ["ddp", "zero2", "lora"])
def test_torch_compile_set_by_hand_trains_under_each_engine(tmp_path, name):
    """Compiled (inductor on CPU), each run passes the strategy check and learns, every engine block by block (what
    the manifest reads from the trained model's objects); under DDP the compiled blocks sit in a copy of the DDP
    wrapper, which the check must still read as DDP, and the model saved carries none of compile's wrappers."""
    run = tmp_path / "run"
    train(name, run, *FAST, "--save_strategy", "no", "--torch_compile", "true", *(LORA_LR if name == "lora" else []))
    m = manifest(run)
    assert m["settings_resolved"]["torch_compile"] == {"value": True, "why": "set"}
    assert m["strategy"]["in_effect"]["engine"] == ("deepspeed" if name == "zero2" else "ddp")
    assert m["strategy"]["in_effect"]["compiled"].startswith("block by block (")
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"] - 0.3
    saved = run / "model" / ("adapter_model.safetensors" if name == "lora" else "model.safetensors")
    with safe_open(saved, "pt") as f:
        assert f.keys() and not [k for k in f.keys() if "_orig_mod" in k or k.startswith("module.")]
