"""This rank's GPU as mixed precision needs it (the decision itself: dockyard.common.precision).

`torch.cuda.is_bf16_supported()` counts emulation and says yes on a T4 (7.5), where bf16 is slow and SDPA
falls back to its math kernel; it also touches cuda:0 from every rank before each rank's device is set.
So: the capability of this rank's own GPU (LOCAL_RANK), bf16 from Ampere (8.0) on, fp16 before.
"""

from __future__ import annotations

import os
from typing import Any


def capability() -> tuple[int, int] | None:
    """This rank's GPU's compute capability, or None without CUDA (asks for device properties only)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK", "0"))))


def of_args(args: Any) -> str:
    """The mixed precision TrainingArguments `args` train in: "bf16", "fp16", or "" (fp32)."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else ""


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
