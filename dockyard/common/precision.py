"""Which 16-bit type a run trains in: by the GPU's compute capability, unless the run's bf16/fp16 say otherwise.

Plain Python: the host (`invoke plan`, the autos) and the trainer (TrainingArguments, the weights' dtype) decide
alike. The capability itself is the trainer's to read (dockyard.train.precision.capability).
"""

from __future__ import annotations

from typing import Any

BF16_FROM = (8, 0)
_TRUE = (True, 1, "true", "True", "1", "yes")


def half_dtype(cap: tuple[int, int] | None) -> str:
    """"bf16", "fp16", or "" on CPU (which trains in fp32)."""
    if cap is None:
        return ""
    return "bf16" if tuple(cap) >= BF16_FROM else "fp16"


def mixed_precision(cap: tuple[int, int] | None, overrides: dict[str, Any]) -> dict[str, bool]:
    """TrainingArguments' bf16/fp16: each as given (`--bf16 false` on an H100 trains in fp32), else by capability;
    one given true switches the other off (the Trainer refuses both; both given true is refused with the settings:
    training_args.check_training_numbers)."""
    kind = half_dtype(cap)
    given = {k: overrides[k] in _TRUE for k in ("bf16", "fp16") if overrides.get(k) is not None}
    bf16 = given.get("bf16", kind == "bf16" and not given.get("fp16"))
    fp16 = given.get("fp16", kind == "fp16" and not given.get("bf16"))
    return {"bf16": bf16, "fp16": fp16 and not bf16}


def in_half(cap: tuple[int, int] | None, overrides: dict[str, Any]) -> str:
    """"bf16" or "fp16" where the run computes in that 16-bit mixed precision, "" where in fp32."""
    mixed = mixed_precision(cap, overrides)
    return "bf16" if mixed["bf16"] else "fp16" if mixed["fp16"] else ""
