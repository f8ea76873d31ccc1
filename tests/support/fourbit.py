"""QLoRA's 4-bit layers for the tests of dockyard/train/fourbit.py (tests/unit/test_qlora_lean.py on CPU,
tests/gpu/test_qlora_lean_gpu.py with bitsandbytes' CUDA kernels): the tiny model as the trainer prepares it, one
training step's loss and gradients, and the work the lean path leaves out, counted."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.train import model as models


class Work(TorchDispatchMode):
    """Counts what the lean path leaves out: copies of tensors at least `size` elements large (a layer's output, not
    an adapter's weights), dequantizations of the 8-bit scales, and calls of bitsandbytes' own 4-bit matmul operator
    (the lean path calls the dequantization and F.linear it ends in itself)."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.clones, self.scale_dequants, self.bnb_matmuls = size, 0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.clone.default and args[0].numel() >= self.size:
            self.clones += 1
        if func.name().startswith("bitsandbytes::dequantize_blockwise"):  # backward: before the 4-bit dequant
            self.scale_dequants += 1
        if func.name().startswith("bitsandbytes::gemm_4bit"):  # forward: the 8-bit scales go in with the weights
            self.bnb_matmuls += 1
            nested = args[7] if len(args) > 7 else kwargs.get("absmax_8bit")
            self.scale_dequants += nested is not None
        return func(*args, **kwargs)


def qlora_model(tmp_path, **overrides):
    """The tiny model as the trainer prepares it for qlora (4-bit base, on the GPU where there is one), with
    adapters whose B is not zero, so that they count in the loss."""
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
    """One forward and backward of `ids` (on the model's device, under autocast in bf16 or not): the loss, every
    adapter's gradient, and the work counted."""
    model.zero_grad(set_to_none=True)
    ids = ids.to(model.device)
    c = model.config  # the narrowest 4-bit layer's output: k_proj's and v_proj's
    work = Work(ids.numel() * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads))
    amp = torch.autocast(model.device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with amp, work:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, work
