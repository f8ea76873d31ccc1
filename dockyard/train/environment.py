"""What the trainer finds where it runs, for the `auto` settings (dockyard.common.autos decides them): the GPUs
torch sees, and which model types the installed liger-kernel has kernels for."""

from __future__ import annotations

import importlib.util

from dockyard.common.autos import LIGER_TYPES, Device


def device_from_torch() -> Device | None:
    """The smallest GPU this process can see (every rank then resolves the same values), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    p = min(props, key=lambda p: p.total_memory)
    return Device(p.name, int(p.total_memory), (p.major, p.minor))


def liger_kinds() -> tuple[str, ...]:
    """The model types liger-kernel patches here: the installed package's own table (our list where a version has
    none), or () without liger-kernel."""
    if importlib.util.find_spec("liger_kernel") is None:
        return ()
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception:  # noqa: BLE001 - a version without the table, or one failing to import: our own list
        return LIGER_TYPES
    return tuple(MODEL_TYPE_TO_APPLY_LIGER_FN)
