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


def liger_kinds() -> tuple[tuple[str, ...], str]:
    """The model types liger-kernel patches here (the installed package's own table, our list where a version has
    none; () without liger-kernel), and why there are none where it is installed but does not import."""
    if importlib.util.find_spec("liger_kernel") is None:
        return (), ""
    try:  # what the Trainer imports once training starts: an install that fails here would fail there, too late
        from liger_kernel.transformers import (
            _apply_liger_kernel_to_instance,  # noqa: F401
            monkey_patch,
        )
    except Exception as e:  # noqa: BLE001 - any failure (a triton it was not built for, a missing library)
        first = str(e).splitlines()[0] if str(e) else ""
        return (), f"liger-kernel is installed but does not import ({type(e).__name__}: {first})"
    return tuple(getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", LIGER_TYPES)), ""  # a version without the table
