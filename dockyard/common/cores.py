"""The cores a process may use: its CPU affinity, counted in physical cores, within its cgroup's CPU quota. Read by
the launcher in the image (each worker's share of them, dockyard.train.torchrun), the trainer (dockyard.train.cpus)
and `invoke run` on the host (CPU processes past them). sysfs' root and the cgroup folder are parameters: the tests
lay out hosts this machine is not."""

from __future__ import annotations

import math
import os
from pathlib import Path

MAX_CPUS = 1 << 16  # past any kernel's CPU numbers (NR_CPUS is at most 8192 today)


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup"), sys_root: Path = Path("/sys")) -> int:
    """The physical cores this process may use: its CPU affinity, less hyperthreads' siblings (AVX work such as CPU
    Adam gains nothing from them; where sysfs does not say which CPUs are siblings, each counts), within the
    container's CPU quota (cgroup v2 cpu.max, v1 cfs_quota_us) when there is one, as Kubernetes' CPU limits and
    `docker run --cpus` set."""
    cores = max(1, physical_cores(frozenset(os.sched_getaffinity(0)), sys_root))
    quota = cpu_quota(cgroup)
    return max(1, min(cores, int(quota))) if quota else cores


def cpu_quota(cgroup: Path) -> float | None:
    """CPUs' worth of time the cgroup may use (2.5 for "250000 100000"), or None without a limit."""
    for quota_file, period_file in ((cgroup / "cpu.max", None),
                                    (cgroup / "cpu" / "cpu.cfs_quota_us", cgroup / "cpu" / "cpu.cfs_period_us")):
        try:
            words = quota_file.read_text().split()
            if period_file is not None:
                words += period_file.read_text().split()
            quota, period = float(words[0]), float(words[1])
        except (OSError, ValueError, IndexError):  # absent, "max", unreadable
            continue
        return quota / period if quota > 0 and period > 0 and math.isfinite(quota / period) else None
    return None


def physical_cores(cpus: frozenset[int], sys_root: Path) -> int:
    """How many physical cores `cpus` spans: CPUs listed as one core's thread siblings count once."""
    cores = set()
    for cpu in cpus:
        try:
            siblings = cpu_list((sys_root / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = {cpu}
        cores.add(min(siblings | {cpu}))
    return len(cores)


def cpu_list(text: str) -> set[int]:
    """sysfs' list format ("0-3,8,10-11") as a set of CPU numbers; ValueError where it is not one (a CPU number
    past any kernel's, MAX_CPUS, included: "0-999999999" would be a billion-element set)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if not 0 <= low <= high < MAX_CPUS:
            raise ValueError(f"not a list of CPUs: {part!r}")
        out.update(range(low, high + 1))
    return out
