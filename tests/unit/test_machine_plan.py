"""plan: model-state numbers against DeepSpeed's own estimators, the Llama-3.1-8B anchors, activations against
what autograd really saves, config.json read without torch, every recipe folder planned, the recommendation."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from benchmarks.plan_accuracy import saved_bytes  # the benchmark's own measurement, one copy
from dockyard.common import memory
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import list_recipes, load_recipe, recipe_names
from dockyard.common.units import GIB
from dockyard.machine import planner
from tests.support.cli import INVOKE, short_error
from tests.support.measured import MEASURED_MODEL

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"
SIZES = [(125_000_000, 38_597_376), (1_300_000_000, 103_000_000), (8_030_261_248, 525_336_576),
         (70_553_706_496, 1_050_673_152)]
SETUPS = [(1, 1), (2, 1), (8, 1), (8, 2), (4, 4)]  # (GPUs per node, nodes)


def _shape(p: int, big: int) -> memory.Shape:
    return memory.Shape(params=p, largest_layer=big, hidden=4096, layers=32, vocab=128256, intermediate=14336,
                      kv_hidden=1024, linear_params=p // 2, lora_params=p // 200)


@pytest.mark.parametrize("p,big", SIZES)
@pytest.mark.parametrize("gpn,nodes", SETUPS)
def test_model_states_agree_with_deepspeed_estimators(p, big, gpn, nodes):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape, world = _shape(p, big), gpn * nodes
    ours = {r: memory.model_states(r, None, shape, world, gpn) for r in ("zero2", "zero2-offload", "zero3", "zero3-offload")}
    cpu, gpu = estimate_zero2_model_states_mem_needs(p, gpn, nodes, cpu_offload=False)
    assert ours["zero2"] == (gpu, cpu)
    cpu, gpu = estimate_zero2_model_states_mem_needs(p, gpn, nodes, cpu_offload=True)
    assert ours["zero2-offload"][0] == gpu
    if nodes == 1:  # on several, DeepSpeed's host figure counts every node's processes (below)
        assert ours["zero2-offload"][1] == cpu
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, big, gpn, nodes, cpu_offload=False, zero_init=True)
    assert ours["zero3"] == (gpu, cpu)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, big, gpn, nodes, cpu_offload=True,
                                                        cpu_offload_params=True, zero_init=True)
    assert ours["zero3-offload"] == (gpu, cpu)
    assert ours["zero3"][0] == memory.model_states("fsdp", None, shape, world, gpn)[0]  # FULL_SHARD shards like ZeRO-3


def test_a_node_of_a_zero2_offload_run_over_several_nodes_is_asked_for_its_own_processes_memory():
    """zero2-offload of Llama-3.1-8B on 4 nodes of 8 GPUs: the trainer asked each node for 1436 GiB of host RAM
    (DeepSpeed's estimator counts 4 bytes per parameter for every process of every node) and refused to start on
    nodes of 1 TiB, where each node's 8 processes load 8 fp32 copies (359 GiB with DeepSpeed's 1.5 buffer) and then
    pin a quarter of the optimizer. More nodes never ask a node for more than one node alone does."""
    from dockyard.train import guards

    shape = memory.shape_from_folder(LLAMA_8B)
    alone = memory.model_states("zero2-offload", None, shape, 8, 8)[1]
    assert round(alone / GIB) == 359  # DeepSpeed's figure for one node of 8 (test above)
    for nodes in (2, 4):
        need = memory.model_states("zero2-offload", None, shape, 8 * nodes, 8)[1]
        assert need <= alone
        guards.check_offload_memory("zero2-offload", need, shape.params, 1024 * GIB)  # a node of 1 TiB starts
    with pytest.raises(DockyardError, match="host RAM"):  # and one short of what its own processes load does not
        guards.check_offload_memory("zero2-offload", memory.model_states("zero2-offload", None, shape, 32, 8)[1],
                                    shape.params, 256 * GIB)


def test_fsdps_host_figure_holds_the_fp32_model_its_first_process_loads():
    """fsdp of Llama-3.1-8B on 8 GPUs: the plan's host column said 23.5 GiB (ZeRO-3's zero.Init figure, 4 bytes of
    the largest layer per process), where the recipe's loading (cpu_ram_efficient_loading) has one process of the
    node read the whole model in fp32, 29.9 GiB before any buffer; zero3's stays its own."""
    shape = memory.shape_from_folder(LLAMA_8B)
    rows = {r["recipe"]: r for r in planner.plan(shape, gpus=8, gpu_mem=80 * GIB, cpu_mem=1024 * GIB,
                                                 seq_len=2048)["recipes"]}
    assert rows["fsdp"]["host_bytes"] >= 4 * shape.params
    assert rows["fsdp"]["model_states_bytes"] == rows["zero3"]["model_states_bytes"]  # FULL_SHARD shards like ZeRO-3
    assert rows["zero3"]["host_bytes"] < 4 * shape.params  # zero.Init: each process reads its own partition


@pytest.mark.parametrize("world", [1, 8])
def test_ddp_and_adapter_model_states_are_pinned(world):
    """Hand-computed, not by the function under test: DDP keeps fp32 weights 4 + grads 4 + Adam 8 + the bf16
    working copy 2 = 18 bytes per parameter on every GPU, whatever the GPU count; LoRA keeps the bf16 base (2)
    plus 18 per adapter parameter; QLoRA 0.5625 per quantised weight (half a byte, an fp32 scale per
    64), 2 for the rest, 18 per adapter parameter."""
    shape = _shape(1_000_000_000, 100_000_000)  # linear_params 500 M, lora_params 5 M
    assert memory.model_states("ddp", None, shape, world, world)[0] == 18_000_000_000
    assert memory.model_states("ddp", "lora", shape, world, world)[0] == 2_000_000_000 + 90_000_000
    assert memory.model_states("ddp", "qlora", shape, world, world)[0] == 281_250_000 + 1_000_000_000 + 90_000_000
    # the run's adapter rank (lora_params is rank 16's) and, for an adapter recipe, a float32 base: once every rank
    # and dtype gave rank 16's figure on a 16-bit base
    r64, fp32 = memory.Regime(lora_r=64), memory.Regime(dtype="float32")
    assert memory.model_states("ddp", "lora", shape, world, world, r64)[0] == 2_000_000_000 + 4 * 90_000_000
    assert memory.model_states("ddp", "lora", shape, world, world, fp32)[0] == 4_000_000_000 + 90_000_000
    assert memory.model_states("ddp", "qlora", shape, world, world, fp32)[0] == 281_250_000 + 2_000_000_000 + 90_000_000
    assert memory.model_states("ddp", None, shape, world, world, fp32)[0] == 18_000_000_000  # full: fp32 already


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

    shape = memory.shape_from_folder(LLAMA_8B)  # from config.json alone
    assert (shape.params, shape.largest_layer) == (8_030_261_248, 525_336_576)
    z2 = memory.model_states("zero2", None, shape, 8, 8)[0] / GIB
    z3 = memory.model_states("zero3", None, shape, 8, 8)[0] / GIB
    assert (round(z2, 1), round(z3, 1)) == (31.8, 18.8)

    ds2 = _deepspeed_table(estimate_zero2_model_states_mem_needs_all_cold, shape.params, 8, 1)
    assert [r[1] for r in ds2 if "offload_optimizer=none" in r[2]] == [round(z2, 2)]
    ds3 = _deepspeed_table(estimate_zero3_model_states_mem_needs_all_cold, shape.params, shape.largest_layer, 8, 1)
    offload_all = memory.model_states("zero3-offload", None, shape, 8, 8)
    row = next(r for r in ds3
               if "offload_param=none" not in r[2] and "offload_optimizer=none" not in r[2] and "zero_init=1" in r[2])
    assert (row[0], row[1]) == (round(offload_all[1] / GIB, 2), round(offload_all[0] / GIB, 2))
    assert any(r[1] == round(z3, 2) for r in ds3 if "offload_optimizer=none" in r[2] and "zero_init=1" in r[2])

    # a bare count guesses the same shape: the same figures from `--model 8.03B`
    guessed = planner.shape_for("8.03B")
    assert guessed.largest_layer == 525_336_576 and (guessed.hidden, guessed.layers) == (4096, 32)


@pytest.mark.parametrize("count", ["1M", "10M", "125M", "350M", "1B", "8B", "70B"])
def test_a_bare_count_guesses_a_model_of_that_size(count):
    """`--model=1M` kept Llama 3's 128k vocabulary: embeddings of 33M parameters, an output layer 16 times the
    model. Whatever the count, the guessed decoder and its embeddings add up to it, and no layer outgrows it."""
    params = planner.parse_count(count)
    shape = planner.shape_for(count)
    assert shape.largest_layer < params / 2
    assert shape.linear_params + 2 * shape.vocab * shape.hidden == pytest.approx(params, rel=0.35)
    assert shape.vocab == memory.ASSUMED_VOCAB or 2 * shape.vocab * shape.hidden <= params / 2


def test_a_count_near_a_published_model_is_planned_with_that_models_shape():
    """`--model=7B` was planned as hidden 3840 and 30 layers, a model nobody trains (Llama 2 7B and Mistral 7B are
    4096 and 32): its activations came out 12 % short. A count within 15 % of a published model's takes that
    model's shape, said in the source; a count that is one's to three figures (8.03B) is what that model's own
    config.json counts; a count near none is the Llama-3-shaped guess, said as such.

    7B was Llama 2 7B's shape until Qwen2.5 7B and Llama 3.1 8B joined the list: all four are near 7B, and a user
    saying 7B may mean any of them, so it is now planned as the one whose activations take the most memory (Qwen2.5
    7B: 152k vocabulary, MLP 18944 wide), which Llama 2 7B's 32k vocabulary left a quarter short."""
    folder = memory.shape_from_folder(LLAMA_8B)
    counted = planner.shape_for("8.03B")
    for field in ("hidden", "layers", "intermediate", "kv_hidden", "vocab", "largest_layer", "linear_params",
                  "lora_params"):
        assert getattr(counted, field) == getattr(folder, field), field
    assert "assumed Llama 3.1 8B's shape (hidden 4096, 32 layers, vocab 128256)" in counted.source
    seven = planner.shape_for("7B")
    assert (seven.hidden, seven.layers, seven.params) == (3584, 28, 7 * 10**9)
    assert "assumed Qwen2.5 7B's shape (hidden 3584, 28 layers, vocab 152064)" in seven.source
    assert "Llama 2 7B, Mistral 7B, Llama 3.1 8B" in seven.source
    assert "nearest 405B" in planner.shape_for("405B").source  # near one: as before
    assert (planner.shape_for("70B").hidden, planner.shape_for("70B").layers) == (8192, 80)
    assert "Llama-3-like" in planner.shape_for("45B").source  # from 32B and 70B: near none



# Qwen/Qwen3-0.6B's config.json, the settings that size it: its heads are 128 wide, not hidden / heads = 64
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "head_dim": 128,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "vocab_size": 151936, "tie_word_embeddings": True}


def test_a_qwen3_count_is_planned_with_its_heads_as_wide_as_its_config_sets_them(tmp_path):
    """Qwen3 was not in the list: `--model=0.6B` was planned as a guessed Llama-3-like model (hidden 1408, 11
    layers) and `--model=4B` as hidden 3200, 25 layers, where Qwen3 0.6B and 4B are 28 and 36 layers with attention
    twice as wide as their hidden size (head_dim 128). A count of Qwen3's is planned as its config.json counts."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    folder, counted = memory.shape_from_folder(tmp_path), planner.shape_for("0.596B")
    for field in ("hidden", "layers", "intermediate", "kv_hidden", "q_hidden", "vocab", "largest_layer",
                  "linear_params", "lora_params"):
        assert getattr(counted, field) == getattr(folder, field), field
    assert counted.q_hidden == 2 * counted.hidden
    assert "assumed Qwen3 0.6B's shape (hidden 1024, 28 layers, vocab 151936)" in planner.shape_for("0.6B").source
    assert (planner.shape_for("4B").hidden, planner.shape_for("4B").layers) == (2560, 36)

# Parameter counts of the model transformers builds from each one's published config.json (on the meta device)
BUILT = {"Llama 2 7B": 6_738_415_616, "Llama 3.1 8B": 8_030_261_248, "Mistral 7B": 7_241_732_096,
         "Qwen2.5 14B": 14_770_033_664, "Qwen2.5 3B": 3_085_938_688, "Llama 2 13B": 13_015_864_320,
         "Llama 3.1 70B": 70_553_706_496, "Llama 3.1 405B": 405_853_388_800, "TinyLlama 1.1B": 1_100_048_384,
         "Llama 3.2 1B": 1_235_814_400, "Llama 3.2 3B": 3_212_749_824,
         # Qwen3's, as keras-hub's Qwen3 presets publish them (qwen3_presets.py)
         "Qwen3 0.6B": 596_049_920, "Qwen3 1.7B": 1_720_574_976, "Qwen3 4B": 4_022_468_096,
         "Qwen3 8B": 8_190_735_360, "Qwen3 14B": 14_768_307_200, "Qwen3 32B": 32_762_123_264,
         # Gemma's, as keras-hub's Gemma presets publish them (gemma_presets.py)
         "Gemma 2B": 2_506_172_416, "Gemma 7B": 8_537_680_896, "Gemma 2 2B": 2_614_341_888,
         "Gemma 2 9B": 9_241_705_984, "Gemma 2 27B": 27_227_128_320}


def test_the_published_models_are_counted_as_transformers_builds_them(tmp_path):
    """Each published model of the list is counted by model_config from its config.json's settings: the count
    transformers gives the model it builds from them (here, on the meta device, as the trainer does), and for those
    in BUILT the count of the published model."""
    import transformers

    from dockyard.train.model import model_shape

    counted = {m.name: m.shape().params for m in memory.PUBLISHED}
    assert {name: counted[name] for name in BUILT} == BUILT
    for m in memory.PUBLISHED:
        settings = m.config()
        transformers.AutoConfig.for_model(settings.pop("model_type"), **settings).save_pretrained(tmp_path / m.name)
        assert model_shape(tmp_path / m.name).params == counted[m.name], m.name
    assert len({m.name for m in memory.PUBLISHED}) == len(memory.PUBLISHED)


# Qwen/Qwen2.5-14B's config.json, the settings that size it
QWEN_14B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120,
            "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 131072, "tie_word_embeddings": False}


def test_a_count_near_several_published_models_plans_the_activations_of_the_largest(tmp_path):
    """`--model=14B` was planned as Llama 2 13B (32k vocabulary, full-width K/V), which left Qwen2.5 14B's
    activations (152k vocabulary: its logits) about a quarter short: a plan's "fits" that would not. Now every
    recipe's activations are at least Qwen2.5 14B's, as its config.json counts, and the plan says which shape it
    assumed and how to plan exactly."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN_14B))  # the folder of the model the user means
    exact, counted = memory.shape_from_folder(tmp_path), planner.shape_for("14B")
    rows = [{r["recipe"]: r for r in planner.plan(shape, gpus=1, gpu_mem=80 * GIB, cpu_mem=512 * GIB, seq_len=4096,
                                                  batch=1)["recipes"]} for shape in (exact, counted)]
    assert rows[0].keys() == rows[1].keys()
    for name, row in rows[1].items():
        for key in ("activation_bytes", "activation_bytes_checkpointed"):
            assert row[key] >= rows[0][name][key], (name, key)
    proc = subprocess.run([sys.executable, "-m", "invoke", "plan", "--model=14B", "--seq-len=4096", "--gpus=1",
                           "--gpu-mem=80", "--cpu-mem=512"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the table's console wraps long lines
    assert "assumed Qwen2.5 14B's shape (hidden 5120, 48 layers, vocab 152064)" in out
    assert "(Llama 2 13B, Qwen3 14B too)" in out and "config.json alone will do: Qwen/Qwen2.5-14B's" in out


def test_a_count_is_a_count_even_where_a_folder_of_that_name_is_here(tmp_path, monkeypatch):
    """`invoke plan --model=7B` run where a folder 7B happens to be planned that folder's model, saying nothing."""
    (tmp_path / "7B").mkdir()
    (tmp_path / "7B" / "config.json").write_text(json.dumps({**MEASURED_MODEL}))
    monkeypatch.chdir(tmp_path)
    counted = planner.shape_for("7B")
    assert counted.params == 7 * 10**9 and "write ./7B to plan that folder" in counted.source
    assert planner.shape_for("./7B").params == 944_334_848


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
    shape = memory.shape_from_folder(tmp_path)
    predicted = memory.activation_bytes(shape, seq, batch, checkpointing)
    if checkpointing:  # the layer being recomputed is transient: not in what the outer graph saves
        predicted -= batch * seq * (20 * shape.hidden + 4 * shape.kv_hidden + 8 * shape.intermediate)
    assert predicted == pytest.approx(measured, rel=0.05)


def _peak_allocated(model, ids, trace: Path) -> int:
    """The most torch's CPU allocator held at once during one forward and backward pass, above what it held as
    the pass began (the weights), from the profiler's allocator events (written to `trace`): what a GPU's peak
    would hold, on CPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    prof.export_chrome_trace(str(trace))
    held = [e["args"]["Total Allocated"] for e in json.loads(trace.read_text())["traceEvents"]
            if e.get("name") == "[memory]"]
    return max(held) - held[0]


def test_the_loss_head_at_the_peak_is_what_the_allocator_holds_for_it(tmp_path):
    """The loss holds three fp32 copies of the logits as the backward pass starts (the saved log-softmax, its
    gradient coming in and the one it makes): a vocabulary of 128k at micro-batch 8 × 2048 is 25 GB of them. The
    plan once counted one, which fitted the measured 32k vocabulary and left a Llama-3 vocabulary's auto
    micro-batch ~10 GiB short. Measured here as two models that differ only in their vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    peaks, shapes = {}, {}
    for vocab in (4000, 16000):
        cfg = LlamaConfig(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=1, vocab_size=vocab, attn_implementation="sdpa")
        cfg.save_pretrained(tmp_path / str(vocab))
        shapes[vocab] = memory.shape_from_folder(tmp_path / str(vocab))
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).train()  # bf16 weights, as DeepSpeed casts them
        peaks[vocab] = _peak_allocated(model, torch.randint(0, vocab, (2, 256)), tmp_path / f"trace-{vocab}.json")
    zero2 = load_recipe("zero2")
    predicted = {v: memory.gpu_activation_bytes(shapes[v], zero2, 256, 2, False) for v in shapes}
    assert peaks[16000] - peaks[4000] == pytest.approx(predicted[16000] - predicted[4000], rel=0.05)
    assert predicted[16000] - predicted[4000] == 12 * 12000 * 512

    def grows(recipe, regime):
        return (memory.gpu_activation_bytes(shapes[16000], recipe, 256, 2, False, regime)
                - memory.gpu_activation_bytes(shapes[4000], recipe, 256, 2, False, regime))

    # a classifier (task seq_cls) has no vocabulary-wide logits
    assert grows(zero2, memory.Regime(logits=False)) == 0
    # Liger's fused loss makes none either: what grows is the output layer's weight gradient, which its forward
    # pass computes (bf16 under DeepSpeed), and nothing where that layer is frozen (LoRA)
    liger = memory.Regime(liger=True)
    assert grows(zero2, liger) == 12000 * shapes[16000].hidden * 2
    assert grows(zero2, liger) < (predicted[16000] - predicted[4000]) / 10
    assert grows(load_recipe("lora"), liger) == 0


def test_recommendation_is_the_fastest_recipe_that_fits():
    big = planner.plan(planner.shape_for("8B"), gpus=8, gpu_mem=80 * GIB, cpu_mem=1024 * GIB, seq_len=2048)
    assert big["recommendation"]["recipe"] == "zero2"
    assert "ddp needs" in big["recommendation"]["why"]
    rows = {r["recipe"]: r for r in big["recipes"]}
    assert list(rows) == recipe_names()  # every recipe folder, in the registry's order
    assert not rows["ddp"]["fits"] and rows["zero3"]["fits"]
    assert rows["zero2"]["gpu_bytes_checkpointed"] < rows["zero2"]["gpu_bytes"]

    small = planner.plan(planner.shape_for("350M"), gpus=8, gpu_mem=80 * GIB, cpu_mem=64 * GIB, seq_len=2048, batch=4)
    assert small["recommendation"] == {**small["recommendation"], "recipe": "ddp", "gradient_checkpointing": False}

    one = planner.plan(planner.shape_for("8B"), gpus=1, gpu_mem=24 * GIB, cpu_mem=64 * GIB, seq_len=2048)
    assert one["recommendation"]["recipe"] in ("lora", "qlora")
    assert "adapters only" in one["recommendation"]["why"]
    assert not {r["recipe"]: r for r in one["recipes"]}["zero3-offload"]["fits"]  # 200 GiB of host memory needed

    huge = planner.plan(planner.shape_for("405B"), gpus=1, gpu_mem=24 * GIB, cpu_mem=64 * GIB, seq_len=2048)
    assert huge["recommendation"]["recipe"] is None and "nothing fits" in huge["recommendation"]["why"]


def test_the_plan_gives_the_command_of_the_run_it_sized_and_that_run_fits(tmp_path, monkeypatch):
    """The plan sizes runs of 2048 tokens by default, `invoke run` trains 128 (recipes/defaults.yaml): the
    recommendation named a recipe and no sequence length, and docs/machine.md told to give `invoke run` a --seq-len
    it does not have. `run it:` is the command, and on the GPUs planned (a replayed T4 host) the host's own fit check
    (the trainer's autos) takes it, where the plan's runner-up does not fit."""
    from tests.support.cli import invoke_here

    monkeypatch.setenv("DOCKYARD_NVML_REPLAY", str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "t4x2_535.json"))
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "hf")}
    planned = invoke_here("plan", f"--model={LLAMA_8B}", "--seq-len=1024", "--cpu-mem=64", "--json", env=env)
    assert planned.returncode == 0, planned.stderr
    rec = json.loads(planned.stdout)["recommendation"]
    assert rec["command"] == (f"invoke run --recipe={rec['recipe']} --model={LLAMA_8B} -- --max_seq_length 1024")
    said = invoke_here("plan", f"--model={LLAMA_8B}", "--seq-len=1024", "--cpu-mem=64", env=env)
    assert f"run it: {rec['command']}" in said.stdout.replace("\n", "")
    ran = invoke_here(*rec["command"].split()[1:3], "--dry", *rec["command"].split()[3:], env=env)
    assert ran.returncode == 0 and "docker run" in ran.stderr, ran.stderr
    ddp = invoke_here("run", "--recipe=ddp", "--dry", *rec["command"].split()[3:], env=env)  # does not fit a T4
    assert ddp.returncode != 0 and "the model alone does not fit" in ddp.stderr, ddp.stderr
    counted = planner.plan_model("8B", gpus=8, gpu_mem_gib=80, cpu_mem_gib=1024, seq_len=4096, batch=2)
    assert counted["recommendation"]["command"] == (  # a count names no model; the GPUs planned, where said
        "invoke run --recipe=zero2 --model=MODEL_FOLDER --gpus=0,1,2,3,4,5,6,7 -- --max_seq_length 4096 "
        "--per_device_train_batch_size 2")


@pytest.mark.parametrize("gpus, spread", [
    (16, "--nodes=2 --node-rank=RANK --master-addr=NODE0_ADDR --run-id=RUN_ID --"),
    (12, "--nodes=2 --node-rank=RANK --master-addr=NODE0_ADDR --run-id=RUN_ID --nproc=6 --"),
    (8, "--gpus=0,1,2,3,4,5,6,7 --"),
])
def test_a_plan_for_more_of_this_host_s_gpus_than_it_has_gives_the_run_of_several_such_nodes(tmp_path, monkeypatch,
                                                                                            gpus, spread):
    """`invoke plan --gpus=16` on a host of eight H100s (two such nodes) said `run it: invoke run ... --gpus=0,1,...,15`,
    which invoke run refuses there ("GPU '8' (from --gpus=...) is not on this host"). It now gives each node's
    command, the GPUs shared out evenly; the command, filled in, is one invoke run takes."""
    from tests.support.cli import invoke_here

    monkeypatch.setenv("DOCKYARD_NVML_REPLAY", str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x8_580.json"))
    command = planner.plan_model(str(LLAMA_8B), gpus=gpus, cpu_mem_gib=2048)["recommendation"]["command"]
    assert f"--model={LLAMA_8B} {spread} --max_seq_length 2048" in command
    if gpus > 8:
        env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "hf")}
        filled = command.replace("RANK", "1").replace("NODE0_ADDR", "192.0.2.1").replace("RUN_ID", "exp1").split()
        flags = [w for w in filled[2:filled.index("--")] if not w.startswith("--model=")]  # the sample model: no disk
        ran = invoke_here("run", "--dry", *flags, env=env)
        assert ran.returncode == 0 and "--nnodes=2" in ran.stderr, ran.stderr
        assert f"--nproc-per-node={gpus // 2}" in ran.stderr


def test_a_plan_not_told_the_sequence_length_sizes_no_longer_one_than_the_model_has_positions(tmp_path):
    """`invoke plan --model=FOLDER` of a model of 512 positions sized runs of 2048 tokens and printed `run it: ...
    --max_seq_length 2048`: past its context (a model of learned positions, GPT-2's, refuses such examples). Not told,
    it plans the model's context where that is shorter; told, what it is told."""
    from tests.support.cli import invoke_here

    cfg = json.loads((LLAMA_8B / "config.json").read_text())
    short = tmp_path / "short"
    short.mkdir()
    (short / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 512}))
    planned = planner.plan_model(str(short), gpus=1, gpu_mem_gib=80, cpu_mem_gib=512)
    assert (planned["seq_len"], planned["seq_len_from"]) == (512, "the model's context")
    assert planned["recommendation"]["command"].endswith("--max_seq_length 512")
    told = planner.plan_model(str(short), gpus=1, gpu_mem_gib=80, cpu_mem_gib=512, seq_len=1024)
    assert (told["seq_len"], told["seq_len_from"]) == (1024, "--seq-len")
    assert cfg["max_position_embeddings"] > 2048
    assert planner.plan_model(str(LLAMA_8B), gpus=1, gpu_mem_gib=80, cpu_mem_gib=512)["seq_len"] == 2048
    said = invoke_here("plan", f"--model={short}", "--gpus=1", "--gpu-mem=80", "--cpu-mem=512", env={"COLUMNS": "200"})
    assert said.returncode == 0 and "seq 512 (the model's context)" in " ".join(said.stdout.split()), said.stdout
    auto = invoke_here("plan", f"--model={short}", "--gpus=1", "--gpu-mem=80", "--seq-len=auto", "--json")
    assert json.loads(auto.stdout)["seq_len"] == 512, auto.stderr


def test_the_host_memory_the_plan_takes_from_this_machine_is_said_to_be_this_machines():
    """`plan --gpus=8 --gpu-mem=80` plans another server's GPUs with this machine's RAM (23.5 GiB on a laptop): the
    offload recipes read "no RAM" for a server of 2 TiB, and the title said only "host 23.5 GiB"."""
    from tests.support.cli import invoke_here

    mine = invoke_here("plan", "--model=8B", "--gpus=8", "--gpu-mem=80", env={"COLUMNS": "200"})
    assert mine.returncode == 0 and "(this host's; --cpu-mem)" in mine.stdout, mine.stderr
    given = invoke_here("plan", "--model=8B", "--gpus=8", "--gpu-mem=80", "--cpu-mem=2048", env={"COLUMNS": "200"})
    assert "host 2048.0 GiB, seq" in given.stdout and "this host's" not in given.stdout
    # a recorded server's GPUs (DOCKYARD_NVML_REPLAY) beside this machine's RAM: said too (a newcomer's first hour)
    replayed = invoke_here("plan", "--model=8B", env={"COLUMNS": "200", "DOCKYARD_NVML_REPLAY": str(
        ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x8_580.json")})
    assert "8 GPU(s) ×" in replayed.stdout and "(this host's; --cpu-mem)" in replayed.stdout, replayed.stderr


def test_qlora_says_it_buys_memory_not_speed():
    r = planner.plan(planner.shape_for("8B"), gpus=1, gpu_mem=12 * GIB, cpu_mem=64 * GIB, seq_len=1024)
    assert r["recommendation"]["recipe"] == "qlora"
    assert "not speed" in r["recommendation"]["why"]


def test_the_trainers_estimate_for_the_manifest():
    """What the trainer records next to the measured peak: zero3 of Llama-3.1-8B on 8 GPUs, 18.8 GiB of model
    states per GPU (the anchor above), activations with checkpointing (bf16: DeepSpeed casts the model), ZeRO-3's
    buckets, and 1 GiB for the CUDA context and NCCL outside torch's pool, as plain JSON."""
    shape = memory.shape_from_folder(LLAMA_8B)
    got = memory.estimate(shape, load_recipe("zero3"), world_size=8, gpus_per_node=8, seq_len=2048, batch=1,
                        gradient_checkpointing=True)
    assert round(got["gpu_model_states_bytes"] / GIB, 1) == 18.8
    # checkpointed: each of 32 layers keeps its 2·h input, one layer is recomputed, plus the loss head as the
    # backward pass starts (the fp32 log-softmax and its gradient in and out)
    per_token = 32 * 2 * 4096 + (20 * 4096 + 4 * 1024 + 8 * 14336) + (12 * 128256 + 8 * 4096)
    assert got["gpu_activation_bytes"] == 2048 * per_token
    assert got["gpu_reserved_bytes"] == (got["gpu_model_states_bytes"] + memory.STAGE_EXTRA[3]
                                         + got["gpu_activation_bytes"])
    assert got["gpu_bytes"] == got["gpu_reserved_bytes"] + GIB
    assert (got["recipe"], got["strategy"], got["peft"]) == ("zero3", "zero3", None)
    assert json.loads(json.dumps(got)) == got  # manifest.json holds exactly these figures


@pytest.mark.parametrize("text,count", [("8B", 8_000_000_000), ("1.5b", 1_500_000_000), ("350M", 350_000_000),
                                        ("8030261248", 8_030_261_248), ("0.5T", 500_000_000_000)])
def test_parse_count(text, count):
    assert planner.parse_count(text) == count


def test_a_bad_model_size_or_flag_gets_a_short_error_naming_the_fix():
    with pytest.raises(DockyardError, match="neither a folder nor a parameter count"):
        planner.shape_for("llama-8b")
    with pytest.raises(DockyardError, match="--model"):
        planner.shape_for("")
    from dockyard.gpus import Host

    with pytest.raises(DockyardError, match="--gpus=8 --gpu-mem=80"):
        planner.plan_model("8B", host=Host(error="no driver"))
    with pytest.raises(DockyardError, match="unknown strategy 'zero4'"):
        memory.model_states("zero4", None, planner.shape_for("1B"), 1, 1)
    for flag, kwargs in (("--gpu-mem", {"gpu_mem_gib": -80.0}), ("--cpu-mem", {"cpu_mem_gib": -1.0}),
                         ("--gpus", {"gpus": -8})):
        with pytest.raises(DockyardError, match=f"{flag}=-.*must be positive"):
            planner.plan_model("8B", **{"gpus": 8, "gpu_mem_gib": 80.0, **kwargs})


@pytest.mark.parametrize("recipe", [r for r in list_recipes() if r.deepspeed], ids=lambda r: r.name)
def test_the_registry_says_what_each_deepspeed_config_does(recipe):
    """plan and the strategy check take the ZeRO stage and the offloads from the registry: every recipe's own
    ds_config.json must say the same."""
    z = json.loads(recipe.file(recipe.deepspeed).read_text())["zero_optimization"]
    spec = recipe.strategy_spec
    assert z["stage"] == spec.zero_stage
    for key, wanted in (("offload_optimizer", spec.offload_optimizer), ("offload_param", spec.offload_param)):
        assert (z.get(key) or {}).get("device", "none") == ("cpu" if wanted else "none"), key


def test_every_strategy_has_a_recipe_folder():
    from dockyard.common.recipes import STRATEGIES

    assert {r.strategy for r in list_recipes()} == set(STRATEGIES)


def test_the_plan_says_a_small_models_size_in_its_own_unit():
    """`invoke plan --model=` a tiny model saved with transformers (140 K parameters) printed "model: 0.00 B parameters,
    largest layer 0 M": a newcomer's own test model looked empty."""
    tiny = ROOT / "dockyard" / "train" / "assets" / "tiny-llama"
    proc = subprocess.run([*INVOKE, "plan", f"--model={tiny}", "--gpus=1", "--gpu-mem=16"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    params = planner.plan_model(str(tiny), gpus=1, gpu_mem_gib=16, cpu_mem_gib=16, seq_len=128)["model"]["params"]
    assert 10**5 < params < 10**6 and f"model: {params / 1e3:.3g} K parameters" in proc.stdout, proc.stdout
    assert "0.00 B" not in proc.stdout and " 0 M" not in proc.stdout
    assert [planner.format_count(n) for n in (8_030_261_248, 230_000_000, 999, 1_500)] == ["8.03 B", "230 M", "999",
                                                                                           "1.5 K"]


def test_invoke_plan_as_a_user_runs_it():
    base = [*INVOKE, "plan", "--gpus=8", "--gpu-mem=80", "--cpu-mem=512"]
    proc = subprocess.run(base + [f"--model={LLAMA_8B}", "--batch=auto", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["model"]["params"] == 8_030_261_248 and result["recommendation"]["recipe"] == "zero2"
    assert result["batch"] == "auto" and all(r["micro_batch"] * r["gradient_accumulation_steps"] == 8
                                             for r in result["recipes"])  # each row as a run of 8 examples per GPU
    table = subprocess.run(base + ["--model=8B", "--seq-len=4096", "--batch=2"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "COLUMNS": "160"})
    assert table.returncode == 0 and "recommended: zero2" in table.stdout and "qlora" in table.stdout
    bad = subprocess.run(base + ["--model=eight-billion"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "error: --model=eight-billion: neither a folder" in bad.stderr



@pytest.mark.parametrize("size", [["--model=1B", "--gpus=1", "--gpu-mem=80"],
                                  ["--model=70B", "--gpus=1", "--gpu-mem=24", "--cpu-mem=4000"],
                                  ["--model=1.1B", "--gpus=8", "--gpu-mem=80", "--cpu-mem=16"]])
def test_invoke_plan_at_80_columns_shows_every_column_whole(size):
    """Once the disk column squeezed `fits` to nothing at 80 columns (blank header, blank cells)."""
    base = [*INVOKE, "plan", *size]
    env = {**os.environ, "COLUMNS": "80"}
    result = json.loads(subprocess.run(base + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                                       env=env).stdout)
    shown = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    command = [line for line in lines if line.startswith("run it: ")]  # one line, whatever its length: to copy
    assert [c.removeprefix("run it: ").split(" (MODEL_FOLDER")[0] for c in command] == [
        result["recommendation"]["command"]]
    assert max(len(line) for line in lines if line not in command) <= 80 and "…" not in shown.stdout
    header = [c.split("┃")[1:-1] for c in lines if c.startswith("┃")]
    assert [" ".join(filter(None, (c.strip() for c in col))) for col in zip(*header, strict=True)] == [
        "recipe", "states", "activ.", "per GPU", "w/ ckpt", "host", "fits", "disk"]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert [r[0] for r in rows] == [r["recipe"] for r in result["recipes"]], "every recipe name whole"
    for row, r in zip(rows, result["recipes"], strict=True):
        verdict = "yes" if r["fits"] else "ckpt" if r["fits_checkpointed"] else "no"
        if r["offloads"] and r["host_bytes"] > result["cpu_mem_bytes"]:  # said why: the GPUs may hold the rest
            assert row[6] == "no RAM" and not r["fits"] and not r["fits_checkpointed"], row
        else:
            marks = " ".join(m for m, on in (("C", r["torch_compile"]), ("L", r["use_liger_kernel"])) if on)
            assert row[6] == f"{verdict} {r['micro_batch']}×{r['gradient_accumulation_steps']} {marks}".strip(), row
        # the host figure marked where it is only the checkpoint-loading worst case (not counted: 358 GiB beside
        # "yes" on a host of 16 read as a contradiction)
        assert row[5].endswith("*") != r["offloads"], row
        for cell, key in zip(row[1:6] + row[7:], ("model_states_bytes", "activation_bytes", "gpu_bytes",
                                                  "gpu_bytes_checkpointed", "host_bytes", "disk_bytes"), strict=True):
            assert float(cell.rstrip("*")) == pytest.approx(r[key] / GIB, abs=0.5), (key, row)


# --- config.json without torch ------------------------------------------------------------------------

SMALL = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2,
             num_hidden_layers=3, vocab_size=32064)


@pytest.mark.parametrize("model_type, extra", [
    ("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    ("mistral", {}), ("qwen2", {}), ("qwen3", {"head_dim": 64}), ("gemma", {"head_dim": 48}), ("gemma2", {}),
    ("phi3", {}),
])
def test_config_counts_match_the_model_transformers_builds(tmp_path, model_type, extra):
    """plan reads config.json alone; the trainer builds the model on the meta device: the same numbers."""
    import dataclasses

    import transformers

    from dockyard.train.model import model_shape

    transformers.AutoConfig.for_model(model_type, **SMALL, **extra).save_pretrained(tmp_path)
    built = model_shape(tmp_path)
    assert memory.shape_from_folder(tmp_path) == dataclasses.replace(built, source=str(tmp_path / "config.json"))


@pytest.mark.parametrize("pad", [512, -1000])
def test_the_trainer_refuses_a_pad_token_past_the_embeddings_in_a_line(tmp_path, pad):
    """The thirteenth red-team pass: config.json's pad_token_id 512 of a 512-row vocabulary was torch's
    `AssertionError: Padding_idx must be within num_embeddings`, a traceback on every rank; -1 (the last row, as torch
    reads it) and the model's own stay fine."""
    import transformers

    from dockyard.train.model import model_shape

    transformers.AutoConfig.for_model("llama", **{**SMALL, "vocab_size": 512, "pad_token_id": pad}).save_pretrained(
        tmp_path)
    with pytest.raises(DockyardError, match=f"`pad_token_id` {pad} is no row of the 512 embeddings"):
        model_shape(tmp_path)
    transformers.AutoConfig.for_model("llama", **{**SMALL, "vocab_size": 512, "pad_token_id": -1}).save_pretrained(
        tmp_path)
    assert model_shape(tmp_path).params > 0


def test_the_trainer_refuses_a_layer_count_no_model_has_before_building_one(tmp_path):
    """It built every layer on the meta device before counting: 3,000 took 7.5 s, 5e7 would take hours and a
    terabyte, in every process."""
    import time

    import transformers

    from dockyard.train.model import model_shape

    transformers.AutoConfig.for_model("llama", **{**SMALL, "num_hidden_layers": 50_000_000}).save_pretrained(tmp_path)
    started = time.monotonic()
    with pytest.raises(DockyardError, match="`num_hidden_layers` is 50000000, more than 4096"):
        model_shape(tmp_path)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("model_type, counts, says", [
    ("bart", {"encoder_layers": 1, "decoder_layers": 50_000_000}, "`decoder_layers` is 50000000, more than 4096"),
    ("t5", {"num_layers": 1, "num_decoder_layers": 50_000_000}, "`num_decoder_layers` is 50000000, more than 4096"),
    ("gpt2", {"n_layer": 50_000_000}, "`n_layer` is 50000000, more than 4096"),
    # the eleventh: ALBERT builds num_hidden_groups groups of inner_group_num layers each
    ("albert", {"num_hidden_layers": 2, "num_hidden_groups": 50_000_000, "embedding_size": 8, "hidden_size": 8,
                "num_attention_heads": 2, "intermediate_size": 16}, "`num_hidden_groups` is 50000000, more than 4096"),
    ("albert", {"num_hidden_layers": 2, "inner_group_num": 50_000_000, "embedding_size": 8, "hidden_size": 8,
                "num_attention_heads": 2, "intermediate_size": 16}, "`inner_group_num` is 50000000, more than 4096"),
])
def test_any_layer_count_no_model_has_is_refused_before_building_one(tmp_path, model_type, counts, says):
    """The tenth red-team pass: the cap read num_hidden_layers alone, which a BART config gives as 1 (its
    encoder's) while transformers built its 5e7 decoder layers one by one: silent for minutes, gigabytes growing.
    Every count config.json gives is read, by the trainer and by `run --dry` for any family."""
    import time

    from dockyard.launch.preflight import check_model_config
    from dockyard.train.model import model_shape

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 64, **counts}))
    started = time.monotonic()
    with pytest.raises(DockyardError, match=says):
        model_shape(tmp_path)
    with pytest.raises(DockyardError, match=says):
        check_model_config(tmp_path, liger=False)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("model_type, extra, says", [
    ("mixtral", {"num_local_experts": 8}, "is a mixture of 8 experts per layer"),
    ("qwen2_moe", {"num_experts": 4}, "is a mixture of 4 experts per layer"),
    ("llava", {}, "is a model of several parts (its language model's settings are under text_config)"),
])
def test_a_config_plan_cannot_count_is_refused_with_the_count_to_give(tmp_path, model_type, extra, says):
    """A mixture of experts was counted as one dense MLP per layer (Mixtral 8x7B: 6x too few parameters, and a plan
    that said fits), and a model of several parts was said to lack hidden_size."""
    import transformers

    config = SMALL if model_type != "llava" else {}
    transformers.AutoConfig.for_model(model_type, **config, **extra).save_pretrained(tmp_path)
    with pytest.raises(DockyardError, match=re.escape(says) + ".*give the model's parameter count instead, as in "
                                            "--model=47B"):
        planner.shape_for(str(tmp_path))


@pytest.mark.parametrize("key, value, problem", [
    ("hidden_size", -4096, "`hidden_size` is -4096: expected a positive whole number"),
    ("num_hidden_layers", 32.5, "`num_hidden_layers` is 32.5"),
    ("vocab_size", "128256", "`vocab_size` is '128256'"),
    ("num_key_value_heads", 0, "`num_key_value_heads` is 0"),
    ("num_attention_heads", None, "`num_attention_heads` is missing"),
    # a crafted or broken file: the plan printed 4e47 T parameters and a table of them
    ("hidden_size", 10**24, "its sizes make 8e+49 parameters, more than 100T: not a model's config.json"),
    ("num_key_value_heads", 64, "`num_key_value_heads` 64 does not divide `num_attention_heads` 32"),
    # "false" as text was counted by its truth: tied, 130M parameters too few
    ("tie_word_embeddings", "false", "tie_word_embeddings 'false': takes true or false (no quotes)"),
    ("model_type", ["llama"], "model_type ['llama']: takes the model's type as text"),
    # eighth red-team pass: the plan said "fits" for each, and the trainer refused it (or built 5e7 layers for hours)
    ("num_hidden_layers", 50_000_000, "`num_hidden_layers` is 50000000, more than 4096: not a model's config.json"),
    ("attention_bias", "false", "attention_bias 'false': takes true or false (no quotes)"),
    ("mlp_bias", "no", "mlp_bias 'no': takes true or false (no quotes)"),
    ("intermediate_size", "null", "`intermediate_size` is null"),
    ("head_dim", "absent, hidden 4100", "`hidden_size` 4100 is not a multiple of `num_attention_heads` 32"),
    ("head_dim", "absent, 8192 heads", "`hidden_size` 4096 is not a multiple of `num_attention_heads` 8192"),
    # thirteenth red-team pass: `run --dry` passed, and torch's assert was a traceback on every rank
    ("pad_token_id", 128256, "`pad_token_id` 128256 is no row of the 128256 embeddings (`vocab_size`)"),
    ("pad_token_id", -200000, "`pad_token_id` -200000 is no row of the 128256 embeddings"),
])
def test_bad_config_values_are_named(tmp_path, key, value, problem):
    cfg = json.loads((LLAMA_8B / "config.json").read_text())
    specials = {"null": {key: None}, "absent, hidden 4100": {"hidden_size": 4100},
                "absent, 8192 heads": {"num_attention_heads": 8192, "num_key_value_heads": 8}}
    if isinstance(value, str) and value in specials:
        cfg.pop(key, None)
        cfg.update(specials[value])
    else:
        cfg.pop(key) if value is None else cfg.update({key: value})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DockyardError, match=re.escape(problem)):
        planner.shape_for(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DockyardError, match="not valid JSON"):
        planner.shape_for(str(tmp_path))


def test_invoke_plan_reads_a_model_folder_with_host_dependencies_only():
    """A host install has no torch: `invoke plan --model=FOLDER` must not need it (torch made unimportable)."""
    code = ("import sys; sys.modules.update(torch=None, transformers=None, deepspeed=None); "
            "from invoke.main import program; program.run(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", code, "invoke", "plan", f"--model={LLAMA_8B}", "--gpus=8",
                           "--gpu-mem=80", "--cpu-mem=512", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["model"]["params"], result["model"]["largest_layer"]) == (8_030_261_248, 525_336_576)
    assert result["recommendation"]["recipe"] == "zero2"


def test_an_unmerged_lora_export_is_said_to_be_an_adapter_not_a_folder_without_config(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "invoke", "plan", f"--model={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{tmp_path}: a LoRA adapter (adapter_config.json), not a model: pass the base" in proc.stderr


def test_a_recipe_folder_of_ones_own_is_planned_beside_its_strategy(tmp_path, monkeypatch):
    """A recipe is a folder: one naming an existing strategy is planned with that strategy's figures."""
    import shutil

    from dockyard.common import recipes

    for name in ("zero2", "lora"):
        shutil.copytree(ROOT / "recipes" / name, tmp_path / name)
    mine = tmp_path / "zero2-long"
    shutil.copytree(ROOT / "recipes" / "zero2", mine)
    (mine / "recipe.yaml").write_text("# invoke run --recipe=zero2-long\nwhen: Mine, for long sequences.\n"
                                      "strategy: zero2\ndeepspeed: ds_config.json\n")
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    result = planner.plan(planner.shape_for("8B"), gpus=8, gpu_mem=80 * GIB, cpu_mem=512 * GIB, seq_len=2048,
                       batch=1)
    rows = {r["recipe"]: r for r in result["recipes"]}
    assert list(rows) == ["zero2", "zero2-long", "lora"]
    assert rows["zero2-long"]["strategy"] == "zero2"
    assert rows["zero2-long"]["gpu_bytes"] == rows["zero2"]["gpu_bytes"]


def test_a_recipes_own_adapter_rank_and_base_dtype_are_planned(tmp_path, monkeypatch):
    """plan takes each recipe's settings: a LoRA recipe of one's own at rank 256 on a float32 base needs more than
    lora (it was planned with rank 16's figure on a 16-bit base)."""
    from dockyard.common import recipes

    shutil.copytree(ROOT / "recipes" / "lora", tmp_path / "lora")
    mine = tmp_path / "lora-wide"
    shutil.copytree(ROOT / "recipes" / "lora", mine)
    (mine / "recipe.yaml").write_text("# invoke run --recipe=lora-wide\nwhen: Mine.\nstrategy: ddp\npeft: lora\n"
                                      "settings:\n  lora_r: 256\n  dtype: float32\n")
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    shape = memory.shape_from_folder(LLAMA_8B)
    rows = {r["recipe"]: r for r in planner.plan(shape, gpus=1, gpu_mem=80 * GIB, cpu_mem=512 * GIB, seq_len=2048,
                                                 batch=1)["recipes"]}
    assert rows["lora-wide"]["model_states_bytes"] - rows["lora"]["model_states_bytes"] == \
        18 * 15 * shape.lora_params + 2 * shape.params
    assert rows["lora-wide"]["gpu_bytes"] > rows["lora"]["gpu_bytes"]


def test_a_broken_recipe_folder_is_left_out_and_named_while_the_others_are_planned_and_listed(tmp_path, monkeypatch,
                                                                                               capsys):
    """One folder under recipes/ with a bad recipe.yaml, or settings the trainer would refuse, stopped `invoke plan`
    and `invoke recipes` whole (`invoke run --recipe=other` worked)."""
    from dockyard.common import recipes

    shutil.copytree(ROOT / "recipes" / "zero2", tmp_path / "zero2")
    (tmp_path / "typo").mkdir()
    (tmp_path / "typo" / "recipe.yaml").write_text("# invoke run --recipe=typo\nwhen: Mine.\nstrategy: zero5\n")
    shutil.copytree(ROOT / "recipes" / "zero2", tmp_path / "liger-compiled")
    (tmp_path / "liger-compiled" / "recipe.yaml").write_text("# invoke run --recipe=liger-compiled\nwhen: Mine.\n"
                                                             "strategy: zero2\ndeepspeed: ds_config.json\nsettings:\n"
                                                             "  use_liger_kernel: true\n  torch_compile: true\n")
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    result = planner.plan(planner.shape_for("1B"), gpus=1, gpu_mem=80 * GIB, cpu_mem=512 * GIB, seq_len=2048)
    assert [r["recipe"] for r in result["recipes"]] == ["zero2"]
    assert set(result["broken_recipes"]) == {"typo", "liger-compiled"}
    assert "zero5" in result["broken_recipes"]["typo"] and "torch_compile" in result["broken_recipes"]["liger-compiled"]
    planner.print_plan(result)
    recipes.print_table()
    out = capsys.readouterr().out
    assert "left out: recipe typo:" in out and "left out: recipe liger-compiled:" in out
    assert "zero2" in out and "broken" in out
    # liger-compiled loads (its settings are the run's to refuse): by strategy, then name; those that do not load last
    assert recipes.recipe_names() == ["liger-compiled", "zero2", "typo"]


def test_the_memory_models_lora_rank_is_the_recipes_default():
    import yaml

    from dockyard.common.recipes import RECIPES
    from dockyard.common.run_settings import RunSettings

    defaults = yaml.safe_load((RECIPES / "defaults.yaml").read_text())
    assert memory.LORA_RANK == RunSettings.model_fields["lora_r"].default == defaults["lora_r"]


def test_plan_takes_a_hub_model_from_the_cache_as_run_does(tmp_path):
    """`invoke run --model=org/llama` takes a model the Hugging Face cache holds; `invoke plan` refused that id
    ("neither a folder nor a parameter count"), and with the id in the `model` setting named a folder made of the
    project root and the id. Plan counts the cached snapshot's config.json, as it counts a folder's."""
    from tests.support.cli import invoke_here

    snapshot = tmp_path / "hub" / "models--org--llama" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    shutil.copy(LLAMA_8B / "config.json", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    hardware = ["--gpus=8", "--gpu-mem=80", "--cpu-mem=1024", "--json"]
    env = {"INVOKE_DOCKYARD_HF_CACHE": str(tmp_path)}
    by_id = invoke_here("plan", "--model=org/llama", *hardware, env=env)
    by_folder = invoke_here("plan", f"--model={LLAMA_8B}", *hardware, env=env)
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout)["model"]["params"] == json.loads(by_folder.stdout)["model"]["params"] > 8e9
    setting = invoke_here("plan", *hardware, env=env | {"INVOKE_DOCKYARD_MODEL": "org/llama"})
    assert setting.returncode == 0 and setting.stdout == by_id.stdout
    missing = invoke_here("plan", *hardware, env=env | {"INVOKE_DOCKYARD_MODEL": "org/other"})
    short_error(missing, "setting model org/other: neither a folder, a model in the Hugging Face cache")
    # and how to get one there: its config.json is all the plan reads
    short_error(missing, f"the plan needs only its config.json: on a machine with internet, `HF_HOME={tmp_path} hf "
                         "download org/other config.json`")


def test_a_count_without_its_unit_is_refused():
    for bare in ("8", "1.5"):  # "1.5" was said as "2 parameters", rounded
        with pytest.raises(DockyardError, match=rf"^--model={bare}: {bare} parameters is no language model; give the "
                                                 "unit, as in 8B"):
            planner.shape_for(bare)
    # a count with its unit, too small: told the smallest, not to give the unit it gave ("--model=0B")
    for given in ("0B", "0.5M"):
        with pytest.raises(DockyardError, match=rf"^--model={given}: {given} parameters is no language model; give at "
                                                 r"least 1M$"):
            planner.shape_for(given)
