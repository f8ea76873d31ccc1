"""QLoRA's 4-bit layers with less work per step than bitsandbytes and peft do by default, to the same bits.

Three kinds of work were repeated in every 4-bit layer, in every forward and every backward:
- `plain_scales`: double quantization keeps each 64-weight block's scale in 8 bits, scaled again per 256 blocks.
  bitsandbytes turned those back into fp32 scales at each use (two kernels more per pass), the same result each
  time. Done once after loading, the layers dequantize with the very scales they computed before. It costs 3 bytes
  more per 64 weights (0.05 byte per weight: 0.35 GiB for an 8B model, 3.3 GiB for a 70B one).
- `lean_adapters`: peft's 4-bit LoRA layer copied the base layer's output whole before adding the adapter's to it
  (a defensive clone, 16384 x 5632 bf16 for one MLP layer of the benchmark model at micro-batch 8), then scaled the
  adapter's output and added it in two kernels. bitsandbytes' output is a tensor of its own and the addition is out
  of place, so the copy protects nothing; the scale joins the addition where that is exact (a power of two, as
  lora_alpha / lora_r = 32 / 16 by default). Layers peft gives more to do (DoRA and other variants, several or
  disabled adapters, merged weights, per-example adapters) keep peft's own forward.
- the same forward calls the 4-bit matmul itself where bitsandbytes would dequantize the weight and call F.linear
  (on CPU, and on CUDA for batches of more than FUSED_MAX_TOKENS tokens: every batch of a 2048-token run), through
  the two operations that path ends in, without the four layers of Python and the dispatch of its own operator that
  led there, in every forward and backward. Smaller batches on CUDA, a layer with a bias, and anything unusual keep
  bitsandbytes' own path (its fused kernel for small batches).
tests/unit/test_qlora_lean.py shows the loss and every adapter gradient unchanged to the bit.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch


def plain_scales(model: Any) -> int:
    """Turn every double-quantised 4-bit layer's scales into plain fp32 ones, as bitsandbytes computes them at each
    dequantization; returns how many layers changed."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import dequantize_blockwise

    changed = 0
    for m in model.modules():
        state = getattr(m.weight, "quant_state", None) if isinstance(m, bnb.nn.Linear4bit) else None
        if state is None or not state.nested:
            continue
        with torch.no_grad():
            scales = dequantize_blockwise(state.absmax, state.state2)
            scales += state.offset
        state.absmax, state.state2, state.offset, state.nested = scales.float(), None, None, False
        changed += 1
    return changed


def lean_adapters(model: Any) -> int:
    """Give every peft 4-bit LoRA layer the forward without the copy; returns how many layers have it."""
    from peft.tuners.lora.bnb import Linear4bit

    lean = 0
    for m in model.modules():
        if isinstance(m, Linear4bit):
            m.forward = types.MethodType(_lean_forward, m)
            lean += 1
    return lean


# bitsandbytes 0.50 multiplies batches of up to this many tokens on CUDA with its fused 4-bit kernel, and larger ones
# by dequantizing the weight and calling F.linear (backends/cuda/ops.py, _gemm_4bit_custom_max_m; 256 on ROCm)
FUSED_MAX_TOKENS = 1536


class _Dequantized(torch.autograd.Function):
    """x @ W.T for a frozen 4-bit W, as bitsandbytes computes it past its fused kernel's batches: W dequantized into
    x's dtype for F.linear, and again in its own dtype for the backward (only the packed W kept between them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, state: Any) -> torch.Tensor:
        ctx.state = state
        ctx.save_for_backward(packed)
        return torch.nn.functional.linear(x, _dequantize(packed, state, x.dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (packed,) = ctx.saved_tensors
        return torch.matmul(grad, _dequantize(packed, ctx.state, ctx.state.dtype).to(grad.dtype)), None, None


def _dequantize(packed: torch.Tensor, state: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.ops.bitsandbytes.dequantize_4bit.default(packed.view(-1, 1), state.absmax, state.blocksize,
                                                          state.quant_type, state.shape, dtype)


def _base_output(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """The 4-bit base layer's output: through _Dequantized where bitsandbytes would take that path, else its own."""
    state = getattr(layer.weight, "quant_state", None)
    tokens = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    ours = (state is not None and not state.nested and layer.bias is None and layer.compute_type_is_set
            and layer.compute_dtype is not None and not getattr(state, "packing_format_for_cpu", False)
            and len(state.shape) == 2 and x.shape[-1] == state.shape[1] and tokens > 0
            and (x.device.type == "cpu"
                 or x.device.type == "cuda" and torch.version.hip is None and tokens > FUSED_MAX_TOKENS))
    if not ours:
        return layer(x)
    return _Dequantized.apply(x.to(layer.compute_dtype), layer.weight, state).to(x.dtype)


def _exact_scale(scaling: float) -> bool:
    """Whether multiplying by `scaling` is exact in any float format (barring overflow): a power of two."""
    return scaling > 0 and math.frexp(scaling)[0] == 0.5


def _lean_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    active = self.active_adapters
    if (args or kwargs or self.disable_adapters or self.merged or len(active) != 1
            or active[0] not in self.lora_A or active[0] in self.lora_variant):
        return type(self).forward(self, x, *args, **kwargs)
    name = active[0]
    lora_a, lora_b, scaling = self.lora_A[name], self.lora_B[name], self.scaling[name]
    result = _base_output(self.base_layer, x)
    if torch.is_autocast_enabled():  # as peft: under autocast the adapter runs in the autocast dtype, no casts
        update = lora_b(lora_a(self.lora_dropout[name](x)))
        if _exact_scale(scaling):
            return torch.add(result, update, alpha=scaling)
        return result + update * scaling
    x = self._cast_input_dtype(x, lora_a.weight.dtype)
    return result + (lora_b(lora_a(self.lora_dropout[name](x))) * scaling).to(result.dtype)
