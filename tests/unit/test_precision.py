"""bf16 or fp16 by compute capability. No GPU here: torch.cuda is FAKED (monkeypatched) where a GPU is needed."""

from __future__ import annotations

import pytest
import torch

from dockyard.train import precision


@pytest.mark.parametrize("cap, kind", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((8, 9), "bf16"),
                                       ((9, 0), "bf16"), ((10, 0), "bf16"), (None, "")])
def test_dtype_by_capability(cap, kind):
    assert precision.half_dtype(cap) == kind
    mp = precision.mixed_precision(cap, {})
    assert mp == {"bf16": kind == "bf16", "fp16": kind == "fp16"}


@pytest.mark.parametrize("value", [True, "true"])
def test_fp16_override_on_a_bf16_gpu_switches_bf16_off(value):
    # the Trainer refuses "At most one of fp16 and bf16": the override must switch the default off
    assert precision.mixed_precision((9, 0), {"fp16": value}) == {"fp16": True, "bf16": False}
    assert precision.mixed_precision((7, 5), {"bf16": value}) == {"bf16": True, "fp16": False}


@pytest.mark.parametrize("cap", [(9, 0), (7, 5)])
def test_mixed_precision_switched_off_trains_in_fp32_on_any_gpu(cap):
    """`--bf16 false` on an H100 trained in bf16 all the same: only a true was read."""
    assert precision.mixed_precision(cap, {"bf16": False, "fp16": False}) == {"bf16": False, "fp16": False}
    off = "bf16" if precision.half_dtype(cap) == "bf16" else "fp16"
    assert precision.mixed_precision(cap, {off: False}) == {"bf16": False, "fp16": False}


def test_both_16_bit_kinds_asked_for_is_refused_not_one_picked(tmp_path):
    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import check_training_numbers

    with pytest.raises(DockyardError, match="bf16 and fp16 are both true: give one"):
        check_training_numbers({"bf16": True, "fp16": True})
    check_training_numbers({"bf16": True, "fp16": False})


def test_capability_asks_this_ranks_gpu_not_cuda0_and_ignores_emulated_bf16(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: asked.append(i) or (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a T4 says (emulation)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert precision.half_dtype(precision.capability()) == "fp16" and asked == [1]


def test_fp16_peft_keeps_trainable_heads_in_fp32():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).half()
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    assert precision.upcast_trainable(model) == 2
    assert model[1].weight.dtype == torch.float32 and model[0].weight.dtype == torch.float16
