"""Checkpoints are loaded as weights, never as arbitrary pickles.

A checkpoint lies in the runs folder, which every run's container can write: a `.pt` file replaced by a pickle
that calls os.system would run its code in the next `--resume` (DeepSpeed 0.19.8 loads its files with
`torch.load(weights_only=False)`). So the trainer

- sets TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 for itself (torch then loads every file weights-only, whatever the
  caller asked: DeepSpeed, the Trainer, accelerate), and allows the few classes these checkpoints really hold;
- before resuming, reads the list of Python objects each pickled file of the checkpoint names (without
  loading it) and refuses the checkpoint, naming the file, when one is not allowed or a file is a bare pickle.
"""

from __future__ import annotations

import enum
import importlib
import os
import pickle
from pathlib import Path

from dockyard.common.errors import DockyardError

# What the checkpoints of the shipped strategies hold besides tensors and plain containers (found with
# torch.serialization.get_unsafe_globals_in_checkpoint on each strategy's checkpoints): the Trainer's RNG state
# (numpy's), and DeepSpeed's ZeRO optimizer state (its loss scaler, stage and fragment addresses).
ALLOWED = (
    ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.dtypes", "UInt32DType"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"), ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
)
NEVER_LOADED = {"training_args.bin"}  # the Trainer writes it for the record and never reads it back
ZIP, PICKLE = b"PK\x03\x04", b"\x80"  # torch.save's zip archive; a bare pickle (protocol 2 and later)


def weights_only() -> None:
    """From here on every torch.load in this process (and the processes it starts) loads weights only."""
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # both set is an error in torch.load


def allow() -> list[str]:
    """Allow the classes in ALLOWED that this image has (DeepSpeed's only where it is installed)."""
    import torch

    found, names = [], []
    for module, name in ALLOWED:
        try:
            found.append(getattr(importlib.import_module(module), name))
            names.append(f"{module}.{name}")
        except (ImportError, AttributeError):
            continue
    enums = tuple(c for c in found if isinstance(c, type) and issubclass(c, enum.Enum))

    def enum_member(cls, name):
        """`getattr` as a pickle uses it for an enum member by name (Python's own pickling of ZeroStageEnum in the
        image writes `getattr(ZeroStageEnum, 'gradients')`): only a member of an allowed enum, nothing else."""
        if cls in enums and isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not a member of an enum the trainer allows")

    torch.serialization.add_safe_globals([*found, (enum_member, "builtins.getattr")])
    return names


def check(checkpoint: Path) -> None:
    """Refuse a checkpoint that holds a file torch would unpickle with anything but weights and allowed classes
    (call allow() first)."""
    import torch

    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        if path.name in NEVER_LOADED or path.suffix == ".safetensors":
            continue
        if path.name == ".metadata":  # torch.distributed.checkpoint reads it with plain pickle.load
            raise refusal(path, "a torch.distributed.checkpoint index, which is read with plain pickle")
        with open(path, "rb") as f:
            head = f.read(4)
        if head == ZIP:
            try:
                unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
            except (ValueError, RuntimeError, KeyError, pickle.UnpicklingError) as e:
                raise refusal(path, f"not a file torch.save wrote ({e})") from None
            if unsafe:
                raise refusal(path, f"Python objects that are not weights: {', '.join(sorted(unsafe))}")
        elif head.startswith(PICKLE):
            raise refusal(path, "a bare pickle, not a torch.save file")


def refusal(path: Path, what: str) -> DockyardError:
    return DockyardError(f"--resume refused: {path} holds {what}; loading it could run code. A checkpoint lies in "
                         "the runs folder, which every run can write: resume only checkpoints this trainer wrote, "
                         "or start again without --resume in a new run folder")


def explain(error: pickle.UnpicklingError) -> DockyardError:
    """What torch.load's weights-only refusal (of a file check() did not scan) says, without its long advice."""
    lines = str(error).splitlines()
    why = next((x.strip() for x in lines if "GLOBAL" in x or "Unsupported" in x), lines[0] if lines else "")
    return DockyardError(f"a checkpoint file holds Python objects that are not weights, refused ({why}): resume only "
                         "checkpoints this trainer wrote, or start again without --resume in a new run folder")
