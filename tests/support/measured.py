"""What was measured on a real GPU, for the tests that check the plan and the autos against it (issue 24: one
H100 80GB SXM, driver 580, torch 2.11 + transformers 5.23, main at a5eb2cf)."""

from __future__ import annotations

import json
from pathlib import Path

from dockyard.common import memory

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts"
H100 = HOSTS / "h100x1_580.json"  # `invoke doctor --record` of that host

# The config the GPU ran: benchmarks/recipes.py's ONE_B applied to dockyard/train/assets/tiny-llama/config.json.
# head_dim 16 is the tiny model's (64 / 4 heads), which ONE_B does not reset: 32 query heads of 16 (q width 512).
# That is the model measured (944,334,848 parameters), so the tests keep it whatever ONE_B becomes.
MEASURED_MODEL = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 32000,
                  "max_position_embeddings": 4096, "tie_word_embeddings": False}


LLAMA3_VOCABULARY = 128256
# tests/gpu/test_autos_gpu.py's runs of the measured model at its auto micro-batch, one GPU, 2048 tokens: name ->
# recipe, vocabulary, global batch per GPU, micro-batch given (None: auto), and the micro-batch the plan picks on an
# 80 GB H100 and on a 141 GB H200 with its 10 % margin, each as (without Liger's kernels, with them)
# (tests/unit/test_plan_measured.py resolves them on both). Where liger-kernel loads, the auto turns its kernels on
# (runs this short never compile), and they keep less: with Llama 3's vocabulary (1.34B parameters) the loss head's
# fp32 logits bind, and Liger's fused loss (no logits) fits twice the micro-batch.
NINE_FORTY_FOUR_M = {
    "ddp-llama3-vocabulary": ("ddp", LLAMA3_VOCABULARY, 32, None, (4, 8), (8, 16)),
    "zero2": ("zero2", 32000, 16, None, (8, 16), (16, 16)),
    "lora": ("lora", 32000, 16, None, (16, 16), (16, 16)),
    "ddp-checkpointed": ("ddp", 32000, 40, 40, (40, 40), (40, 40)),  # 40 fits only with gradient checkpointing
}
# benchmarks/recipes.py's model since 2026-11-27 (its ONE_B on the tiny model's config): TinyLlama-1.1B's shape,
# heads of 64, 1,100,048,384 parameters
ONE_B_MODEL = {**MEASURED_MODEL, "head_dim": 64}
H200_MIB = 143771  # what NVML and torch see of an H200's memory


def measured_shape(folder: Path) -> memory.Shape:
    (folder / "config.json").write_text(json.dumps(MEASURED_MODEL))
    shape = memory.shape_from_folder(folder)
    assert shape.params == 944_334_848  # the parameter count the GPU runs recorded
    return shape


def measured_config(vocab: int = MEASURED_MODEL["vocab_size"]):
    """The measured model's transformers config (the tiny model's, resized), with another vocabulary size if asked
    (the tokenizer then uses its first rows only)."""
    from transformers import AutoConfig

    from dockyard.common.run_settings import TINY_MODEL

    sizes = {k: v for k, v in MEASURED_MODEL.items() if k != "model_type"}
    return AutoConfig.from_pretrained(TINY_MODEL, **{**sizes, "vocab_size": vocab})


def make_measured_model(folder: Path, vocab: int = MEASURED_MODEL["vocab_size"]) -> Path:
    """The measured model itself (random weights, saved in bf16) with the tiny model's tokenizer: for GPU tests."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dockyard.common.run_settings import TINY_MODEL

    config = measured_config(vocab)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(folder)
    return folder


def long_documents(path: Path, tokens: int, count: int = 64) -> Path:
    """Text examples of at least `tokens` tokens of the tiny tokenizer, from the shipped sample's lines."""
    import random

    from dockyard.common.run_settings import DATA

    lines = [json.loads(x)["text"] for x in (DATA / "sample.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    per_doc = max(1, tokens // 20)  # a sample line is 45 tokens or so: twice what is needed
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(lines, k=per_doc))}) + "\n" for _ in range(count)))
    return path
