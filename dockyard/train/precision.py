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
    """TrainingArguments' bf16/fp16: each as given (`--bf16 false` on an H100 trains in fp32), else by capability;
    one given true switches the other off (the Trainer refuses both; both given true is refused with the settings:
    run_settings.check_training_numbers)."""
    kind = half_dtype(cap)
    given = {k: overrides[k] in _TRUE for k in ("bf16", "fp16") if overrides.get(k) is not None}
    bf16 = given.get("bf16", kind == "bf16" and not given.get("fp16"))
    fp16 = given.get("fp16", kind == "fp16" and not given.get("bf16"))
    return {"bf16": bf16, "fp16": fp16 and not bf16}


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
