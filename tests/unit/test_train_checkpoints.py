"""Checkpoint files are read as weights (issue 27): what the trainer's checkpoints hold loads, a pickle that runs
code is refused by name before it is loaded, and torch.load itself refuses it even where a caller asks for a full
unpickle (DeepSpeed's `weights_only=False`). Real torch.save files; the training runs: tests/integration."""

from __future__ import annotations

import os
import pickle
import random
import shlex

import numpy as np
import pytest
import torch

from dockyard.common.errors import DockyardError
from dockyard.train import checkpoints


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _genuine(folder):
    """The kinds of objects the Trainer's and DeepSpeed's files hold (rng_state_N.pth, ZeRO optimizer states)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    folder.mkdir(parents=True)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               folder / "rng_state_0.pth")
    scalers = {"loss_scaler": LossScaler(1.0), "dynamic": DynamicLossScaler(2.0**16, 1000, 1.0, 2, False)}
    torch.save({"optimizer_state_dict": {**scalers, "zero_stage": ZeroStageEnum(2), "state": {0: torch.zeros(3)}}},
               folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (folder / "trainer_state.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x80" + bytes(40))  # a header length that starts like a pickle


def test_what_the_trainer_and_deepspeed_save_passes_and_loads_as_weights(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    _genuine(tmp_path / "checkpoint-2")
    checkpoints.allow()
    checkpoints.check(tmp_path / "checkpoint-2")
    checkpoints.weights_only()
    state = torch.load(tmp_path / "checkpoint-2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    assert int(state["optimizer_state_dict"]["zero_stage"]) == 2
    assert torch.load(tmp_path / "checkpoint-2" / "rng_state_0.pth")["numpy"][0] == "MT19937"


@pytest.mark.parametrize("how", ["torch.save", "bare pickle", "nested"])
def test_a_planted_pickle_is_refused_by_name_and_never_runs(tmp_path, monkeypatch, how):
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    folder = tmp_path / "checkpoint-2"
    _genuine(folder)
    marker = tmp_path / "ran"
    target = folder / ("global_step2/mp_rank_00_model_states.pt" if how == "nested" else "rng_state_0.pth")
    target.parent.mkdir(exist_ok=True)
    if how == "bare pickle":
        target.write_bytes(pickle.dumps({"rng": Planted(marker)}))
    else:
        torch.save({"module": {"w": torch.zeros(2)}, "x": Planted(marker)}, target)
    checkpoints.allow()
    with pytest.raises(DockyardError, match=f"--resume refused: {target} holds"):
        checkpoints.check(folder)
    assert not marker.exists()


def test_torch_load_refuses_the_pickle_even_when_asked_for_a_full_unpickle(tmp_path, monkeypatch):
    """What DeepSpeed does on resume: torch.load(path, weights_only=False). The trainer's environment overrides it."""
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    marker = tmp_path / "ran"
    torch.save({"x": Planted(marker)}, tmp_path / "bad.pt")
    checkpoints.weights_only()
    with pytest.raises(pickle.UnpicklingError) as e:
        torch.load(tmp_path / "bad.pt", weights_only=False)
    assert not marker.exists()
    said = str(checkpoints.explain(e.value))
    assert "posix.system" in said and "\n" not in said


class _ByName:
    """What the image's Python writes for an enum member: getattr(Class, 'name') (protocol 2, as DeepSpeed saves)."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return (getattr, (self.cls, self.name))


def test_an_enum_member_pickled_by_name_loads_and_no_other_getattr_does(tmp_path):
    from deepspeed.runtime.zero.config import ZeroStageEnum

    checkpoints.allow()
    (tmp_path / "checkpoint-2").mkdir()
    good, evil = tmp_path / "checkpoint-2" / "optim_states.pt", tmp_path / "evil.pt"
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "gradients")}, good, pickle_protocol=2)
    torch.save({"x": _ByName(np.ndarray, "tofile")}, evil, pickle_protocol=2)
    checkpoints.check(tmp_path / "checkpoint-2")  # a ZeRO checkpoint written by the image's Python is resumed
    assert torch.load(good, weights_only=True) == {"zero_stage": ZeroStageEnum.gradients}
    with pytest.raises(pickle.UnpicklingError, match="not a member of an enum the trainer allows"):
        torch.load(evil, weights_only=True)
