"""plan: model-state numbers against DeepSpeed's own estimators, the Llama-3.1-8B anchors, activations against
what autograd really saves, and the recommendation."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from benchmarks.plan_accuracy import saved_bytes  # the benchmark's own measurement, one copy
from dockyard.machine import plan
from dockyard.errors import DockyardError

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"
SIZES = [(125_000_000, 38_597_376), (1_300_000_000, 103_000_000), (8_030_261_248, 525_336_576),
         (70_553_706_496, 1_050_673_152)]
SETUPS = [(1, 1), (2, 1), (8, 1), (8, 2), (4, 4)]  # (GPUs per node, nodes)


def _shape(p: int, big: int) -> plan.Shape:
    return plan.Shape(params=p, largest_layer=big, hidden=4096, layers=32, vocab=128256, intermediate=14336,
                      kv_hidden=1024, linear_params=p // 2, lora_params=p // 200)


@pytest.mark.parametrize("p,big", SIZES)
@pytest.mark.parametrize("gpn,nodes", SETUPS)
def test_model_states_agree_with_deepspeed_estimators(p, big, gpn, nodes):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape, world = _shape(p, big), gpn * nodes
    ours = {r: plan.model_states(r, shape, world, gpn) for r in ("zero2", "zero2-offload", "zero3", "zero3-offload")}
    cpu, gpu = estimate_zero2_model_states_mem_needs(p, gpn, nodes, cpu_offload=False)
    assert ours["zero2"] == (gpu, cpu)
    cpu, gpu = estimate_zero2_model_states_mem_needs(p, gpn, nodes, cpu_offload=True)
    assert ours["zero2-offload"] == (gpu, cpu)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, big, gpn, nodes, cpu_offload=False, zero_init=True)
    assert ours["zero3"] == (gpu, cpu)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, big, gpn, nodes, cpu_offload=True,
                                                        cpu_offload_params=True, zero_init=True)
    assert ours["zero3-offload"] == (gpu, cpu)
    assert ours["zero3"][0] == plan.model_states("fsdp", shape, world, gpn)[0]  # FULL_SHARD shards like ZeRO-3


def _deepspeed_table(fn, *args) -> list[tuple[float, float, str]]:
    """The rows DeepSpeed's user-facing *_all_cold functions print: (GiB per CPU, GiB per GPU, options)."""
    out = io.StringIO()
    with redirect_stdout(out):
        fn(*args)
    return [(float(a), float(b), o) for a, b, o in re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$", out.getvalue(), re.M)]


def test_llama_3_1_8b_anchor_figures_and_deepspeed_printout():
    """anchors.md: Llama-3.1-8B (P 8.03 B, L 525 M) on 8 GPUs: ZeRO-2 31.8 GiB, ZeRO-3 18.8 GiB per GPU."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    shape = plan.shape_from_folder(LLAMA_8B)  # built on the meta device from config.json alone
    assert (shape.params, shape.largest_layer) == (8_030_261_248, 525_336_576)
    z2 = plan.model_states("zero2", shape, 8, 8)[0] / plan.GIB
    z3 = plan.model_states("zero3", shape, 8, 8)[0] / plan.GIB
    assert (round(z2, 1), round(z3, 1)) == (31.8, 18.8)

    ds2 = _deepspeed_table(estimate_zero2_model_states_mem_needs_all_cold, shape.params, 8, 1)
    assert [r[1] for r in ds2 if "offload_optimizer=none" in r[2]] == [round(z2, 2)]
    ds3 = _deepspeed_table(estimate_zero3_model_states_mem_needs_all_cold, shape.params, shape.largest_layer, 8, 1)
    offload_all = plan.model_states("zero3-offload", shape, 8, 8)
    row = next(r for r in ds3 if "offload_param=none" not in r[2] and "offload_optimizer=none" not in r[2] and "zero_init=1" in r[2])
    assert (row[0], row[1]) == (round(offload_all[1] / plan.GIB, 2), round(offload_all[0] / plan.GIB, 2))
    assert any(r[1] == round(z3, 2) for r in ds3 if "offload_optimizer=none" in r[2] and "zero_init=1" in r[2])

    # a bare count guesses the same shape: the same figures from `--model 8.03B`
    guessed = plan.shape_for("8.03B")
    assert guessed.largest_layer == 525_336_576 and (guessed.hidden, guessed.layers) == (4096, 32)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_matches_what_autograd_saves(checkpointing, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2,
                      num_hidden_layers=3, vocab_size=4000, attn_implementation="sdpa")
    cfg.save_pretrained(tmp_path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    batch, seq = 2, 128
    measured = saved_bytes(model, torch.randint(0, 4000, (batch, seq)))
    shape = plan.shape_from_folder(tmp_path)
    predicted = plan.activation_bytes(shape, seq, batch, checkpointing)
    if checkpointing:  # the layer being recomputed is transient: not in what the outer graph saves
        predicted -= batch * seq * (20 * shape.hidden + 4 * shape.kv_hidden + 8 * shape.intermediate)
    assert predicted == pytest.approx(measured, rel=0.05)


def test_recommendation_is_the_fastest_recipe_that_fits():
    big = plan.plan(plan.shape_for("8B"), gpus=8, gpu_mem=80 * plan.GIB, cpu_mem=1024 * plan.GIB, seq_len=2048, batch=1)
    assert big["recommendation"]["recipe"] == "zero2"
    assert "ddp needs" in big["recommendation"]["why"]
    rows = {r["recipe"]: r for r in big["recipes"]}
    assert set(rows) == set(plan.RECIPES)
    assert not rows["ddp"]["fits"] and rows["zero3"]["fits"]
    assert rows["zero2"]["gpu_bytes_checkpointed"] < rows["zero2"]["gpu_bytes"]

    small = plan.plan(plan.shape_for("350M"), gpus=8, gpu_mem=80 * plan.GIB, cpu_mem=64 * plan.GIB, seq_len=2048, batch=4)
    assert small["recommendation"] == {**small["recommendation"], "recipe": "ddp", "gradient_checkpointing": False}

    one = plan.plan(plan.shape_for("8B"), gpus=1, gpu_mem=24 * plan.GIB, cpu_mem=64 * plan.GIB, seq_len=2048, batch=1)
    assert one["recommendation"]["recipe"] in ("lora", "qlora")
    assert "adapters only" in one["recommendation"]["why"]
    assert not {r["recipe"]: r for r in one["recipes"]}["zero3-offload"]["fits"]  # 200 GiB of host memory needed

    huge = plan.plan(plan.shape_for("405B"), gpus=1, gpu_mem=24 * plan.GIB, cpu_mem=64 * plan.GIB, seq_len=2048, batch=1)
    assert huge["recommendation"]["recipe"] is None and "nothing fits" in huge["recommendation"]["why"]


def test_qlora_says_it_buys_memory_not_speed():
    r = plan.plan(plan.shape_for("8B"), gpus=1, gpu_mem=12 * plan.GIB, cpu_mem=64 * plan.GIB, seq_len=1024, batch=1)
    assert r["recommendation"]["recipe"] == "qlora"
    assert "not speed" in r["recommendation"]["why"]


def test_estimate_run_for_the_manifest():
    got = plan.estimate_run(8_030_261_248, 525_336_576, "zero3", 8, 8, 2048, 1, 4096, 32, True,
                            vocab=128256, intermediate=14336, kv_hidden=1024)
    assert got["gpu_bytes"] == got["gpu_model_states_bytes"] + got["gpu_activation_bytes"] + got["gpu_overhead_bytes"]
    assert round(got["gpu_model_states_bytes"] / plan.GIB, 1) == 18.8
    assert got["host_bytes"] > 0 and got["recipe"] == "zero3" and got["gradient_checkpointing"] is True
    json.dumps(got)  # goes into manifest.json as is


@pytest.mark.parametrize("text,count", [("8B", 8_000_000_000), ("1.5b", 1_500_000_000), ("350M", 350_000_000),
                                        ("8030261248", 8_030_261_248), ("0.5T", 500_000_000_000)])
def test_parse_count(text, count):
    assert plan.parse_count(text) == count


def test_user_errors():
    with pytest.raises(DockyardError, match="neither a folder nor a parameter count"):
        plan.shape_for("llama-8b")
    with pytest.raises(DockyardError, match="--model"):
        plan.shape_for("")
    from dockyard.gpus import Host

    with pytest.raises(DockyardError, match="--gpus=8 --gpu-mem=80"):
        plan.run("8B", host=Host(error="no driver"))
    with pytest.raises(DockyardError, match="unknown recipe"):
        plan.model_states("zero4", plan.shape_for("1B"), 1, 1)


def test_offload_assumptions_match_the_recipes_deepspeed_configs():
    """plan assumes zero2-offload moves the optimizer, zero3-offload moves parameters and optimizer, and the
    others move nothing: the recipes' own ds_config.json files must say the same."""
    expect = {"zero2": (2, None, None), "zero2-offload": (2, "cpu", None), "zero3": (3, None, None),
              "zero3-offload": (3, "cpu", "cpu")}
    for name, (stage, opt, param) in expect.items():
        path = ROOT / "recipes" / name / "ds_config.json"
        if not path.exists():
            continue  # recipe not written yet
        z = json.loads(path.read_text())["zero_optimization"]
        assert z["stage"] == stage, name
        assert (z.get("offload_optimizer") or {}).get("device", None) in (opt, "none" if opt is None else opt), name
        assert (z.get("offload_param") or {}).get("device", None) in (param, "none" if param is None else param), name


def test_invoke_plan_as_a_user_runs_it():
    base = [sys.executable, "-m", "invoke", "plan", "--gpus=8", "--gpu-mem=80", "--cpu-mem=512"]
    proc = subprocess.run(base + [f"--model={LLAMA_8B}", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["model"]["params"] == 8_030_261_248 and result["recommendation"]["recipe"] == "zero2"
    table = subprocess.run(base + ["--model=8B", "--seq-len=4096", "--batch=2"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "COLUMNS": "160"})
    assert table.returncode == 0 and "recommended: zero2" in table.stdout and "qlora" in table.stdout
    bad = subprocess.run(base + ["--model=eight-billion"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "error: --model=eight-billion: neither a folder" in bad.stderr
