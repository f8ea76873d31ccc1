"""QLoRA's base, as the trainer prepares it: the linear layers in 4 bits, everything else frozen in bf16 (not the
fp32 copies peft's prepare_model_for_kbit_training made, which put QLoRA's GPU peak above full fine-tuning's),
and the adapters still get gradients through checkpointed layers. On CPU with bitsandbytes' CPU kernels."""

from __future__ import annotations

import torch

from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.train import model as models


def test_qlora_keeps_the_frozen_base_in_16_bits_and_trains_the_adapters(tmp_path):
    recipe = load_recipe("qlora")
    settings, _ = resolve_settings(recipe, {})
    models.materialize_tiny_model(tmp_path / "base")
    tokenizer = models.load_tokenizer(str(tmp_path / "base"))
    model = models.load_model(str(tmp_path / "base"), recipe, settings, tokenizer, [], 0)
    assert models.count_4bit_layers(model) == 14
    model = models.add_lora(model, recipe, settings, gradient_checkpointing=True)
    frozen = {p.dtype for _, p in model.named_parameters() if not p.requires_grad}
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert frozen == {torch.bfloat16}  # 4-bit weights are stored in bf16 too (bnb_4bit_quant_storage)
    assert trained and all("lora_" in n for n, _ in trained)

    model.train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # as the Trainer does
    ids = torch.randint(3, 500, (2, 24))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for _, p in trained)
    # B starts at 0 (so A's gradient is 0 at the first step): B's gradient says the loss reaches the adapters
    assert all(p.grad.abs().sum() > 0 for n, p in trained if "lora_B" in n)
