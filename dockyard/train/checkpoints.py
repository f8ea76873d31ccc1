"""Checkpoints are loaded as weights, never as arbitrary pickles.

A checkpoint lies in the runs folder, which every run's container can write: a `.pt` file replaced by a pickle
that calls os.system would run its code in the next `--resume` (DeepSpeed 0.19.8 loads its files with
`torch.load(weights_only=False)`). So the trainer

- sets TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 for itself (torch then loads every file weights-only, whatever the
  caller asked: DeepSpeed, the Trainer, accelerate), and allows the few classes these checkpoints really hold;
- before resuming, reads the list of Python objects each pickled file of the checkpoint names (without
  loading it) and refuses the checkpoint, naming the file, when one is not allowed or a file is a bare pickle.

The same reading finds a damaged checkpoint (a file cut short by a full disk or a copy, trainer_state.json or the
weights missing) before the Trainer fails on it with a traceback: it is named, and so is the checkpoint before it.
"""

from __future__ import annotations

import enum
import importlib
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

from dockyard.common import tree
from dockyard.common.errors import DockyardError, loads, read_bounded

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
STATE = "trainer_state.json"
# The model's part of a checkpoint, one of these at least: the Trainer's weights (whole, sharded, LoRA's adapter),
# DeepSpeed's engine state (global_stepN/), FSDP's (pytorch_model_fsdp*)
WEIGHTS = ("model*.safetensors", "model.safetensors.index.json", "adapter_model.*", "pytorch_model*", "global_step*")
TORCH_SAVED = {".pt", ".pth", ".bin"}  # what the Trainer and DeepSpeed read with torch.load
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


KINDS = {list: "a list", dict: "a mapping", str: "text"}


def state_of_another_shape(recorded: dict[str, Any]) -> str:
    """What in a trainer_state.json is not of the kind the Trainer's own TrainerState holds (a number, a list, a
    mapping, a switch, as its defaults are), or "": the Trainer loads it as it is, and `log_history: 5` was an
    AttributeError on every rank at the first log after the resume, the run's manifest then saying failed."""
    import dataclasses

    from transformers import TrainerState

    defaults = TrainerState()
    for f in dataclasses.fields(TrainerState):
        value, default = recorded.get(f.name), getattr(defaults, f.name)
        if value is None or default is None:
            continue
        if isinstance(default, bool):
            fits, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, (int, float)):
            fits, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            fits, kind = isinstance(value, type(default)), KINDS.get(type(default), type(default).__name__)
        if not fits:
            return f"{f.name} is {json.dumps(value)[:40]}, where the Trainer writes {kind}"
    if not all(isinstance(entry, dict) for entry in recorded.get("log_history") or []):
        return "log_history holds entries that are not records of a step"
    return ""


def check(checkpoint: Path, earlier: Path | None = None) -> dict[str, Any]:
    """Refuse a checkpoint that holds a file torch would unpickle with anything but weights and allowed classes
    (call allow() first), or that is damaged (`earlier`: the complete checkpoint a user may resume from instead);
    its trainer_state.json, read."""
    import torch

    state = checkpoint / STATE
    try:
        recorded = loads(read_bounded(state, STATE_LIMIT, "trainer_state.json"))
        step = recorded.get("global_step")
    except FileNotFoundError:
        raise damaged(checkpoint, earlier, state, "missing") from None
    except OSError as e:
        raise damaged(checkpoint, earlier, state, e.strerror or str(e)) from None
    except DockyardError:  # read_bounded's: a pipe, a device, or past STATE_LIMIT
        raise damaged(checkpoint, earlier, state, f"not a plain file of at most {STATE_LIMIT >> 20} MiB, as the "
                      "Trainer writes it") from None
    except (ValueError, AttributeError) as e:  # not JSON (or not UTF-8, or nested too deep), or not an object
        raise damaged(checkpoint, earlier, state, f"not the Trainer's JSON ({e})") from None
    if not isinstance(step, int):
        raise damaged(checkpoint, earlier, state, "no global_step in it")
    if wrong := state_of_another_shape(recorded):
        raise damaged(checkpoint, earlier, state, wrong)
    named = checkpoint.name.removeprefix("checkpoint-")
    if named.isdigit() and step != int(named):  # the run picks its step by the name, the Trainer by this
        raise damaged(checkpoint, earlier, state, f"global_step {step}, where the checkpoint's name says {named}")
    if not any(any(checkpoint.glob(pattern)) for pattern in WEIGHTS):
        raise damaged(checkpoint, earlier, checkpoint / "model.safetensors", "missing: the checkpoint holds no "
                      "weights")
    for path in sorted(tree.files(checkpoint)):
        if path.name in NEVER_LOADED:
            continue
        if path.suffix == ".safetensors":
            if why := safetensors_damage(path):
                raise damaged(checkpoint, earlier, path, why)
            continue
        if path.name == ".metadata":  # torch.distributed.checkpoint reads it with plain pickle.load
            raise refusal(path, "a torch.distributed.checkpoint index, which is read with plain pickle")
        with open(path, "rb") as f:
            head = f.read(4)
        if head == ZIP:
            try:
                unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
            except pickle.UnpicklingError as e:
                raise refusal(path, f"not a file torch.save wrote ({e})") from None
            except (OSError, ValueError, RuntimeError, KeyError) as e:  # a zip archive cut short, or not torch's
                raise damaged(checkpoint, earlier, path, f"not a whole torch.save file ({e})") from None
            if unsafe:
                raise refusal(path, f"Python objects that are not weights: {', '.join(sorted(unsafe))}")
        elif head.startswith(PICKLE):
            raise refusal(path, "a bare pickle, not a torch.save file")
        elif path.suffix in TORCH_SAVED:  # empty, or cut inside its first bytes: torch.load's EOFError otherwise
            raise damaged(checkpoint, earlier, path, f"cut short: {path.stat().st_size} bytes, not a torch.save file")
        elif path.name == "latest" and not path.read_text(errors="replace").strip():
            raise damaged(checkpoint, earlier, path, "empty: DeepSpeed reads the name of its step folder there")
    return recorded


STATE_LIMIT = 256 << 20  # trainer_state.json: its log_history grows by a line a logged step (MBs for long runs)
HEADER_LIMIT = 100_000_000  # safetensors' own limit on a header's JSON


def safetensors_damage(path: Path) -> str:
    """What is wrong with a .safetensors file ("" when nothing): its header (an 8-byte length, then JSON) must be
    whole and its tensors' data all there."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return f"cut short: {size} bytes, not even the header's length"
        length = struct.unpack("<Q", raw)[0]
        if length > size - 8:
            return f"cut short: its header says {length} bytes, the file has {size}"
        if length > HEADER_LIMIT:  # safetensors' own reader refuses past 100 MB: read whole, it would cost its size
            return f"not a safetensors file (its header says {length} bytes; safetensors allows {HEADER_LIMIT})"
        try:
            header = loads(f.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            return f"not a safetensors file (its header: {e})"
    if not isinstance(end, int) or 8 + length + end > size:
        return f"cut short: its tensors need {8 + length + end} bytes, the file has {size}"
    return ""


def damaged(checkpoint: Path, earlier: Path | None, path: Path, why: str) -> DockyardError:
    instead = (f"remove it to resume from {earlier.name}" if earlier else
               "it is the run's only complete checkpoint: start the run again in a new run folder")
    return DockyardError(f"{checkpoint.name} is damaged ({path.relative_to(checkpoint)}: {why}); {instead}")


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
