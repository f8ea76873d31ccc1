"""bf16 or fp16 by compute capability, and the dtype the weights load in. No GPU here: torch.cuda is FAKED
(monkeypatched) where a GPU is needed; DeepSpeed is real (on the CPU, in a process of its own)."""

from __future__ import annotations

import pytest
import torch

from dockyard.common import precision as decide
from dockyard.train import precision


@pytest.mark.parametrize("cap, kind", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((8, 9), "bf16"),
                                       ((9, 0), "bf16"), ((10, 0), "bf16"), (None, "")])
def test_dtype_by_capability(cap, kind):
    assert decide.half_dtype(cap) == kind
    mp = decide.mixed_precision(cap, {})
    assert mp == {"bf16": kind == "bf16", "fp16": kind == "fp16"}


@pytest.mark.parametrize("value", [True, "true"])
def test_fp16_override_on_a_bf16_gpu_switches_bf16_off(value):
    # the Trainer refuses "At most one of fp16 and bf16": the override must switch the default off
    assert decide.mixed_precision((9, 0), {"fp16": value}) == {"fp16": True, "bf16": False}
    assert decide.mixed_precision((7, 5), {"bf16": value}) == {"bf16": True, "fp16": False}


@pytest.mark.parametrize("cap", [(9, 0), (7, 5)])
def test_mixed_precision_switched_off_trains_in_fp32_on_any_gpu(cap):
    """`--bf16 false` on an H100 trained in bf16 all the same: only a true was read."""
    assert decide.mixed_precision(cap, {"bf16": False, "fp16": False}) == {"bf16": False, "fp16": False}
    off = "bf16" if decide.half_dtype(cap) == "bf16" else "fp16"
    assert decide.mixed_precision(cap, {off: False}) == {"bf16": False, "fp16": False}


def test_both_16_bit_kinds_asked_for_is_refused_not_one_picked(tmp_path):
    from dockyard.common.errors import DockyardError
    from dockyard.common.training_args import check_training_numbers

    with pytest.raises(DockyardError, match="bf16 and fp16 are both true: give one"):
        check_training_numbers({"bf16": True, "fp16": True})
    check_training_numbers({"bf16": True, "fp16": False})


def test_capability_asks_this_ranks_gpu_not_cuda0_and_ignores_emulated_bf16(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: asked.append(i) or (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a T4 says (emulation)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert decide.half_dtype(precision.capability()) == "fp16" and asked == [1]


def test_fp16_peft_keeps_trainable_heads_in_fp32():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).half()
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    assert precision.upcast_trainable(model) == 2
    assert model[1].weight.dtype == torch.float32 and model[0].weight.dtype == torch.float16


# --- the weights' dtype: a ZeRO-2 full fine-tune under mixed precision loads them in 16 bits ---

ZERO2_MASTERS = """
import json, sys, torch, deepspeed
from pathlib import Path
from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import RunSettings
from dockyard.train import guards, model as models
guards.cpu_collectives_as_built(1)  # as the trainer: no shared-memory op compiled for a CPU run
tmp = Path(sys.argv[1])
torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1)
models.materialize_tiny_model(tmp / "tiny")
tok = models.load_tokenizer(str(tmp / "tiny"))
recipe = load_recipe("zero2")
config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1,
          "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True}
out = {}
for dtype in ("auto", "float32"):  # auto under bf16: what the trainer now loads; float32: what it loaded before
    settings = RunSettings(dtype=dtype)
    model = models.load_model(str(tmp / "tiny"), recipe, settings, tok, [], 0, "bf16")
    loaded = str(next(model.parameters()).dtype)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                                   config=config)
    masters = torch.cat([p.detach().flatten() for p in optimizer.single_partition_of_fp32_groups])
    out[dtype] = {"loaded": loaded, "trains": sorted({str(p.dtype) for p in engine.module.parameters()}),
                  "masters": masters.dtype == torch.float32, "sum": masters.double().sum().item(),
                  "bytes": masters.numpy().tobytes().hex()}
print(json.dumps(out))
"""


def test_a_zero2_full_fine_tune_in_mixed_precision_loads_16_bit_weights_and_trains_the_same_bits(tmp_path):
    """Every ZeRO-2 process loaded the model in float32 on the host (a 7B model on 8 GPUs: 8 x 28 GB of RAM while
    loading) for DeepSpeed to cast it to bf16 and make its float32 optimizer copy from the cast weights. Loaded in
    bf16 (what dtype auto now resolves to there), the optimizer's float32 weights are the same, bit for bit, and the
    host holds half. Real DeepSpeed on one CPU process with bf16 enabled, the trainer's own loading."""
    import json
    import os
    import subprocess
    import sys

    from dockyard import ROOT

    r = subprocess.run([sys.executable, "-c", ZERO2_MASTERS, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT),
                                                                "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    auto, fp32 = out["auto"], out["float32"]
    assert (auto["loaded"], fp32["loaded"]) == ("torch.bfloat16", "torch.float32")
    assert auto["trains"] == fp32["trains"] == ["torch.bfloat16"] and auto["masters"] and fp32["masters"]
    assert auto["sum"] != 0 and auto["bytes"] == fp32["bytes"]


@pytest.mark.parametrize("recipe_name, half, dtype, loads", [
    ("zero2", "bf16", "auto", "bfloat16"), ("zero2-offload", "bf16", "auto", "bfloat16"),
    ("zero2", "fp16", "auto", "float16"),  # a V100: DeepSpeed's fp16 casts the same way
    ("zero2", "", "auto", "float32"),  # CPU, or --bf16 false: DeepSpeed trains float32 weights
    ("zero2", "bf16", "float32", "float32"),  # given: as given
    # the optimizer updates the weights themselves (DDP), FSDP keeps float32 shards, ZeRO-3 loads through zero.Init
    ("ddp", "bf16", "auto", "float32"), ("fsdp", "bf16", "auto", "float32"), ("zero3", "bf16", "auto", "float32"),
])
def test_the_weights_dtype_of_a_full_fine_tune(recipe_name, half, dtype, loads):
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import RunSettings
    from dockyard.train import model as models

    got, why = models.resolved_dtype(RunSettings(dtype=dtype), load_recipe(recipe_name), half)
    assert got == loads and why
    assert models.weights_dtype(RunSettings(dtype=dtype), load_recipe(recipe_name), half) == getattr(torch, loads)


def test_the_plan_counts_the_host_memory_of_loading_in_the_dtype_the_trainer_loads_in():
    """`invoke plan` held every ZeRO-2 process's loading at 4 bytes a weight; it is 2 where the trainer loads 16-bit
    weights (GPUs in mixed precision), as before elsewhere."""
    from dockyard.common import memory

    shape = memory.shape_from_count(7_000_000_000)

    def host(strategy: str, **regime) -> int:
        return memory.model_states(strategy, None, shape, 8, 8, memory.Regime(**regime))[1]

    for strategy in ("zero2", "zero2-offload"):
        assert host(strategy, half=True) * 2 == host(strategy, half=False) == host(strategy, half=True, dtype="float32")
    for strategy in ("ddp", "fsdp"):
        assert host(strategy, half=True) == host(strategy, half=False)


@pytest.mark.parametrize("cap, given, half", [
    ((9, 0), {}, True), ((7, 0), {}, True), (None, {}, False), ((9, 0), {"bf16": False}, False),
    ((9, 0), {"bf16": "false", "fp16": True}, True), (None, {"bf16": True}, True)])
def test_the_plan_and_the_trainer_agree_on_mixed_precision(cap, given, half):
    from dockyard.common import autos

    device = autos.Device("GPU", 80 << 30, cap) if cap else None
    assert autos.computes_in_half(device, given) is half
