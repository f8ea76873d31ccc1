"""Every recipe on the GPUs of this machine (one process per GPU), a few steps on the tiny model: the real
strategies the CPU tests cannot run (FSDP2 above all), bf16 mixed precision, QLoRA's base really in 4 bits."""

from __future__ import annotations

import json

import pytest
import torch

from dockyard.common.recipes import load_recipe, recipe_names
from dockyard.train import mfu, strategy
from tests.support.training import FAST, LORA_LR, manifest, reload_logits, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none visible)")]
GPUS = torch.cuda.device_count()

@pytest.mark.parametrize("name", recipe_names())  # every recipe folder, from the registry
def test_recipe_trains_on_the_gpus_with_its_strategy_in_effect(tmp_path, name):
    run = tmp_path / "run"
    train(name, run, *FAST, *(LORA_LR if load_recipe(name).peft else []), nproc=GPUS, gpu=True)
    m = manifest(run)
    assert m["status"] == "completed" and m["world_size"] == GPUS
    # a few steps: compiling would not pay, so the auto leaves it off
    assert m["strategy"]["in_effect"] == {**strategy.expected(load_recipe(name).strategy, GPUS), "compiled": None}
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"] - 0.3
    assert m["metrics"]["peak_memory_kind"] == "gpu_reserved" and m["metrics"]["peak_memory_bytes"] > 0
    # MFU beside tokens/s, in the manifest and in every training line of metrics.jsonl, on a GPU of known peak
    half = "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16"
    if mfu.peak_flops(torch.cuda.get_device_name(), half):
        logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert 0 < m["metrics"]["mfu"] < 1 and all(0 < x["mfu"] < 1 for x in logged if "loss" in x), logged
    # ZeRO-2 loads the weights in the 16-bit type DeepSpeed casts them to (half the host memory while loading)
    recipe = load_recipe(name)
    if not recipe.peft:
        sixteen = recipe.strategy_spec.casts_weights_to_half
        assert m["settings_resolved"]["dtype"]["value"] == ({"bf16": "bfloat16", "fp16": "float16"}[half] if sixteen
                                                            else "float32"), m["settings_resolved"]["dtype"]
    # Trained in 16-bit mixed precision (bf16, fp16 before compute 8.0), reloaded in the weights' dtype.
    reloaded, trained = reload_logits(run, m), torch.tensor(m["probe"]["logits"])
    assert torch.allclose(reloaded, trained, atol=5e-2, rtol=5e-2), (reloaded, trained)


def test_qlora_base_is_held_in_4_bits(tmp_path):
    qlora, lora = tmp_path / "qlora", tmp_path / "lora"
    train("qlora", qlora, *FAST, *LORA_LR, nproc=GPUS, gpu=True)
    train("lora", lora, *FAST, *LORA_LR, nproc=GPUS, gpu=True)
    q, b = manifest(qlora)["model"], manifest(lora)["model"]
    assert q["quantized_layers"] == 14  # every decoder linear layer of the tiny model
    # NF4 packs a weight in half a byte instead of bf16's two: the linear layers (58 % of the tiny model's
    # parameters, the embeddings stay bf16) shrink to a quarter.
    assert q["footprint_bytes"] < 0.65 * b["footprint_bytes"], (q, b)


def test_a_profiled_run_says_how_busy_the_gpu_was_and_with_what(tmp_path):
    """profile_steps on a GPU: the trace holds the CUDA kernels, the summary and the manifest say how much of the
    profiled time a kernel ran (tiny model: mostly launches, so far from 100 %) and which kinds took it."""
    import gzip

    run = tmp_path / "run"
    train("ddp", run, *FAST, "--profile_steps", "8-9", nproc=GPUS, gpu=True)
    profile = manifest(run)["profile"]
    assert profile["steps"] == [8, 9] and 0 < profile["gpu_busy"] <= 1, profile
    assert profile["gpu_kinds"].get("matmul", 0) > 0, profile  # the linear layers' GEMMs, told from their kernels' names
    trace = json.loads(gzip.decompress((run / "profile" / "trace-rank0.json.gz").read_bytes()))
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    summary = (run / "profile" / "summary.txt").read_text()
    assert "GPU busy:" in summary and "matmul" in summary, summary[:2000]
    from dockyard.launch import monitor  # what `invoke run`'s monitor draws profile/timeline.png from

    timeline = monitor.read_timeline(run)
    assert timeline["busy"] == pytest.approx(profile["gpu_busy"], abs=1e-3)
    assert any(name.endswith(" / matmul") for name in timeline["rows"]), list(timeline["rows"])
