"""QLoRA's lean 4-bit layers (dockyard/train/fourbit.py, `qlora_lean`) with bitsandbytes' CUDA kernels, under bf16
autocast as the Trainer trains: the work it leaves out is gone, and a batch of training size (more than the 1,536
tokens up to which bitsandbytes uses its fused 4-bit matmul, so through its dequantize-then-matmul path, as every
batch of the benchmark model at micro-batch 8 x 2048, where the lean path calls the dequantization and the matmul
itself) gives the same loss and adapter gradients to the bit. Below that, bitsandbytes' fused kernel still runs,
with the scales in their other form, and the results are held to bf16's precision."""

from __future__ import annotations

import pytest
import torch

from dockyard.train import fourbit
from tests.support.fourbit import qlora_model, step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none visible)")]


@pytest.mark.parametrize("tokens", [(2, 1024), (2, 64)], ids=["2048-tokens", "128-tokens"])
def test_lean_qlora_layers_on_the_gpu(tmp_path, tokens):
    model = qlora_model(tmp_path)
    assert model.device.type == "cuda"
    ids = torch.randint(3, 500, tokens, generator=torch.Generator().manual_seed(1))
    loss_before, grads_before, before = step(model, ids, autocast=True)
    layers = fourbit.plain_scales(model)
    assert layers == 14 and fourbit.lean_adapters(model) == layers
    loss, grads, after = step(model, ids, autocast=True)
    assert after.scale_dequants == 0 and before.clones - after.clones == layers, (vars(before), vars(after))
    # past the fused kernel's batches the matmul is the lean path's own; below, bitsandbytes' (its fused kernel)
    assert after.bnb_matmuls == (0 if ids.numel() > 1536 else layers), after.bnb_matmuls
    assert grads.keys() == grads_before.keys()
    if ids.numel() > 1536:
        assert torch.equal(loss, loss_before)
        assert all(torch.equal(grads[n], grads_before[n]) for n in grads), [
            n for n in grads if not torch.equal(grads[n], grads_before[n])]
    else:
        torch.testing.assert_close(loss, loss_before, rtol=1e-3, atol=0)
        for n in grads:
            torch.testing.assert_close(grads[n], grads_before[n], rtol=2e-2, atol=1e-6, msg=n)
