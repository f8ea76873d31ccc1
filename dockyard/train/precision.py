"""Which 16-bit type a GPU trains in, decided by its compute capability.

`torch.cuda.is_bf16_supported()` counts emulation and says yes on a T4 (7.5), where bf16 is slow and SDPA
falls back to its math kernel; it also touches cuda:0 from every rank before each rank's device is set.
So: the capability of this rank's own GPU (LOCAL_RANK), bf16 from Ampere (8.0) on, fp16 before.
"""

from __future__ import annotations

import os
from typing import Any

BF16_FROM = (8, 0)
_TRUE = (True, 1, "true", "True", "1", "yes")


def capability() -> tuple[int, int] | None:
    """This rank's GPU's compute capability, or None without CUDA (asks for device properties only)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK", "0"))))


def half_dtype(cap: tuple[int, int] | None) -> str:
    """"bf16", "fp16", or "" on CPU (which trains in fp32)."""
    if cap is None:
        return ""
    return "bf16" if tuple(cap) >= BF16_FROM else "fp16"


def mixed_precision(cap: tuple[int, int] | None, overrides: dict[str, Any]) -> dict[str, bool]:
    """TrainingArguments' bf16/fp16 by capability; `--fp16 true` or `--bf16 true` wins and switches the other off
    (the Trainer refuses both)."""
    if overrides.get("fp16") in _TRUE:
        return {"fp16": True, "bf16": False}
    if overrides.get("bf16") in _TRUE:
        return {"bf16": True, "fp16": False}
    kind = half_dtype(cap)
    return {"bf16": kind == "bf16", "fp16": kind == "fp16"}


def upcast_trainable(model: Any) -> int:
    """fp16 + PEFT: trainable parameters still in fp16 (a classification `score` head, modules_to_save) go to
    fp32, or the grad scaler refuses them ("Attempting to unscale FP16 gradients"). Returns how many."""
    import torch

    n = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype == torch.float16:
            p.data = p.data.float()
            n += 1
    return n
