"""QLoRA's 4-bit layers as the trainer prepares them (train/fourbit.py): the scales made plain once, peft's copy of
every 4-bit layer's output gone, and the loss and every adapter gradient the same to the bit as bitsandbytes' and
peft's own path. On CPU with bitsandbytes' CPU kernels, under CPU autocast in bf16 as the Trainer trains on GPUs,
and without it as it trains on CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.train import fourbit
from dockyard.train import model as models


class Work(TorchDispatchMode):
    """Counts what the lean path leaves out: copies of tensors at least `size` elements large (a layer's output, not
    an adapter's weights) and dequantizations of the 8-bit scales."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.clones, self.scale_dequants = size, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.clone.default and args[0].numel() >= self.size:
            self.clones += 1
        if func.name().startswith("bitsandbytes::dequantize_blockwise"):  # backward: before the 4-bit dequant
            self.scale_dequants += 1
        if func.name().startswith("bitsandbytes::gemm_4bit"):  # forward: the 8-bit scales go in with the weights
            nested = args[7] if len(args) > 7 else kwargs.get("absmax_8bit")
            self.scale_dequants += nested is not None
        return func(*args, **kwargs)


def qlora_model(tmp_path, **overrides):
    recipe = load_recipe("qlora")
    settings, _ = resolve_settings(recipe, overrides)
    models.materialize_tiny_model(tmp_path / "base")
    tokenizer = models.load_tokenizer(str(tmp_path / "base"))
    model = models.load_model(str(tmp_path / "base"), recipe, settings, tokenizer, [], 0)
    model = models.add_lora(model, recipe, settings, gradient_checkpointing=False)
    with torch.no_grad():  # B starts at zero: make the adapters' path count in the loss
        gen = torch.Generator().manual_seed(0)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.train()
    return model


def step(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    c = model.config  # the narrowest 4-bit layer's output: k_proj's and v_proj's
    work = Work(ids.numel() * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with amp, work:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, work


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast-bf16", "no-autocast"])
def test_lean_qlora_layers_train_to_the_same_bits_without_the_repeated_work(tmp_path, autocast):
    model = qlora_model(tmp_path)
    ids = torch.randint(3, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    loss_before, grads_before, before = step(model, ids, autocast)
    layers = models.count_4bit_layers(model)
    # each layer's forward, and the backward of each but the first block's q, k and v (their input needs no grad)
    assert layers == 14 and before.scale_dequants == 2 * layers - 3, before.scale_dequants

    assert fourbit.plain_scales(model) == layers
    assert fourbit.lean_adapters(model) == layers
    loss, grads, after = step(model, ids, autocast)
    assert (before.clones - after.clones, after.scale_dequants) == (layers, 0), (before.clones, after.clones,
                                                                                  after.scale_dequants)
    assert torch.equal(loss, loss_before)
    assert grads.keys() == grads_before.keys() and len(grads) == 2 * layers
    assert all(torch.equal(grads[n], grads_before[n]) for n in grads), [n for n in grads
                                                                       if not torch.equal(grads[n], grads_before[n])]
    assert fourbit.plain_scales(model) == 0  # once is all: a second call changes nothing


def test_a_scale_that_is_not_a_power_of_two_gives_peft_s_result(tmp_path):
    """lora_alpha 24 over rank 16 scales the adapters by 1.5: the same loss and gradients as peft's forward."""
    model = qlora_model(tmp_path, lora_alpha=24)
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(2))
    loss_before, grads_before, _ = step(model, ids, autocast=True)
    fourbit.lean_adapters(model)
    loss, grads, _ = step(model, ids, autocast=True)
    assert torch.equal(loss, loss_before) and all(torch.equal(grads[n], grads_before[n]) for n in grads)


def test_disabled_adapters_fall_back_to_peft_s_forward(tmp_path):
    """What peft does more (here: adapters switched off, as export's comparison with the base does) is peft's own."""
    model = qlora_model(tmp_path)
    ids = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), model.disable_adapter():
        base_before = model(input_ids=ids).logits
    fourbit.plain_scales(model)
    fourbit.lean_adapters(model)
    with torch.no_grad():
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
    assert torch.equal(base, base_before)
    assert not torch.equal(adapted, base)  # and with them on, the adapters count
