"""QLoRA's 4-bit layers with less work per step than bitsandbytes and peft do by default, to the same bits.

Two kinds of work were repeated in every 4-bit layer, in every forward and every backward:
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
        state = getattr(getattr(m, "weight", None), "quant_state", None) if isinstance(m, bnb.nn.Linear4bit) else None
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
    result = self.base_layer(x)
    if torch.is_autocast_enabled():  # as peft: under autocast the adapter runs in the autocast dtype, no casts
        update = lora_b(lora_a(self.lora_dropout[name](x)))
        if _exact_scale(scaling):
            return torch.add(result, update, alpha=scaling)
        return result + update * scaling
    x = self._cast_input_dtype(x, lora_a.weight.dtype)
    return result + (lora_b(lora_a(self.lora_dropout[name](x))) * scaling).to(result.dtype)
