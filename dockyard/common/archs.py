"""Which GPUs a CUDA build has code for, read alike by the host (an image's archs, from variants.yaml or its
dockyard.cuda_archs label, against NVML's compute capability) and by the trainer (its torch's arch list against the
GPU it was given): a GPU without code runs nothing, whatever the driver."""

from __future__ import annotations

import re


def arch_runs(archs: str, capability: str) -> bool:
    """Whether a GPU of compute capability `capability` ("8.9") has code in a build for `archs` ("7.5;8.6;12.0+PTX"):
    machine code of its major at or below its minor (sm_86 runs on 8.9), or PTX at or below it (JIT-compiled).
    An unknown (or unreadable) capability or a variant that declares no archs is given the benefit of the doubt."""
    if not re.fullmatch(r"\d+\.\d+", capability or "") or not archs:
        return True
    have = _version(capability)
    for entry in re.split(r"[;\s]+", archs.strip()):
        arch = _version(entry.replace("+PTX", ""))
        if (arch[0] == have[0] and arch <= have) or ("+PTX" in entry and arch <= have):
            return True
    return False


def from_torch(arch_list: list[str]) -> str:
    """torch.cuda.get_arch_list() (["sm_75", "sm_90a", "sm_120", "compute_120"]) in variants.yaml's words
    ("7.5;9.0;12.0;12.0+PTX")."""
    out = []
    for name in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", name)
        if m:
            out.append(f"{m[2]}.{m[3]}" + ("+PTX" if m[1] == "compute" else ""))
    return ";".join(out)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))
