"""QLoRA's 4-bit layers as the trainer prepares them (train/fourbit.py): the scales made plain once, peft's copy of
every 4-bit layer's output gone, the 4-bit matmul called without bitsandbytes' layers around it, and the loss and
every adapter gradient the same to the bit as bitsandbytes' and peft's own path. On CPU with bitsandbytes' CPU
kernels, under CPU autocast in bf16 as the Trainer trains on GPUs, and without it as it trains on CPU."""

from __future__ import annotations

import pytest
import torch

from dockyard.train import fourbit
from dockyard.train import model as models
from tests.support.fourbit import qlora_model, step


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
    assert before.bnb_matmuls == layers and after.bnb_matmuls == 0, (before.bnb_matmuls, after.bnb_matmuls)
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
