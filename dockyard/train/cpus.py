"""The CPUs each process runs on: on a server whose GPUs hang off different NUMA nodes (two sockets, or one socket
split in several nodes), each process is bound to the cores of its own GPU's node, as torchrun's --numa-binding=node
does, and shares them out as threads.

Unbound, a rank's threads (the data loader's, the CPU Adam of the offload recipes, the copies to and from its GPU)
wander over both sockets, and the memory they touch first (the model loaded from disk, an offloaded optimizer's
states) lands on whichever node they ran on: every later read from the other socket crosses the interconnect. The
trainer binds itself here, before it loads the model or starts the data loader's workers (which inherit it), so
that memory is the GPU's node's. Every thread the process already has is moved too, but those that chose their
own CPUs (torch's own binding does the same). `numa_binding` in recipes/defaults.yaml decides
(dockyard.common.autos.resolve_numa_binding).

The topology is read from sysfs (its root a parameter: the tests lay out a two-node server's there, which this
machine lacks), the GPU's PCI address from torch."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from dockyard.common import envvars
from dockyard.common.autos import Device, Placement, cpu_ranges, resolve_numa_binding
from dockyard.common.cores import cpu_list, physical_cores
from dockyard.common.errors import DockyardError

log = logging.getLogger("dockyard.train")

SYS = Path("/sys")


def bind_near_gpu(value: bool | str, device: Device | None, sys_root: Path = SYS) -> tuple[bool, str]:
    """Binds this process (local rank LOCAL_RANK of LOCAL_WORLD_SIZE) where `numa_binding` says, and says what it
    did and why. The threads are shared out again within the NUMA node, unless OMP_NUM_THREADS was set by someone
    else than the image's torchrun (dockyard.train.torchrun): never more than torchrun's share of the whole node,
    which counts the container's CPU quota, so GPUs crowded on one NUMA node get fewer each. Only local rank 0's
    answer reaches the manifest: a rank that could not bind where the others may have says so in a warning."""
    place = None
    if device is not None and value is not False:
        local = int(os.environ.get("LOCAL_RANK", 0))
        gpus = gpu_addresses()[:max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))]
        if local >= len(gpus):  # one_process_per_gpu refuses this before; said here all the same
            return _not_bound(value, f"local rank {local} has no GPU of its own ({len(gpus)} visible)")
        place = placement(local, gpus, sys_root)
    on, why = resolve_numa_binding(value, device, place)
    if not on or place is None:
        if place and place.node >= 0 and not place.cpus:  # this rank's affinity, not the host: the others may bind
            log.warning("numa_binding: %s", why)
        return on, why
    given, share = os.environ.get("OMP_NUM_THREADS"), os.environ.get(envvars.CPU_SHARE, "")
    threads = None  # OMP_NUM_THREADS set by someone else than the image's torchrun: theirs
    if given is None:
        threads = place.threads
    elif given == share and share.isdecimal():
        threads = min(place.threads, int(share))
    try:
        bind(place.cpus, threads)
    except OSError as e:  # the cpuset changed under it, or a sandbox refuses: the run goes on where it was
        return _not_bound(value, f"binding to CPUs {cpu_ranges(place.cpus)} failed ({e.strerror or e})")
    return on, why + (f", {torch.get_num_threads()} thread(s) each" if threads else
                      f"; OMP_NUM_THREADS={given} kept as set")


def _not_bound(value: bool | str, why: str) -> tuple[bool, str]:
    if value is True:
        raise DockyardError(f"numa_binding true cannot bind: {why}; set it to auto or false")
    log.warning("numa_binding: %s: this process is not bound", why)
    return False, why


def placement(gpu: int, local_gpus: list[str], sys_root: Path = SYS,
              allowed: set[int] | None = None) -> Placement | None:
    """The placement of the process on GPU `gpu` among this node's processes' GPUs (`local_gpus`: their PCI
    addresses, one per local rank) when it may use the CPUs `allowed` (its affinity), or None where sysfs does not
    describe NUMA nodes (not Linux, or hidden). A GPU whose node reads -1 is on the only node where there is one."""
    cpu_lists = node_cpus(sys_root)
    if not cpu_lists:
        return None
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    usable = {n: cpus & allowed for n, cpus in cpu_lists.items() if cpus & allowed}
    only = list(usable) if len(usable) == 1 else [-1]
    nodes_of = [n if n >= 0 else only[0] for n in (gpu_node(address, sys_root) for address in local_gpus)]
    node = nodes_of[gpu]
    cpus = frozenset(usable.get(node, set()))
    return Placement(gpu, local_gpus[gpu], node, len(usable), cpus, physical_cores(cpus, sys_root),
                     nodes_of.count(node), tuple(sorted(set(usable) - set(nodes_of))))


def bind(cpus: frozenset[int], threads: int | None) -> None:
    """Every thread of this process onto `cpus` (threads started later inherit it), but those that chose their own
    CPUs (NCCL pins its proxy threads near the GPU); and `threads` threads for torch's and OpenMP's parallel loops
    where given."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)  # first: where the kernel refuses, nothing has moved
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.sched_getaffinity(int(tid)) == before:
                os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread has ended meanwhile
            pass
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by OpenMP runtimes loaded later (DeepSpeed's CPU Adam)
        torch.set_num_threads(threads)


def gpu_addresses() -> list[str]:
    """The PCI address (sysfs' spelling: 0000:1b:00.0) of every GPU torch sees, in torch's order."""
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
    return out


# --- sysfs ------------------------------------------------------------------------------------------------

def node_cpus(sys_root: Path) -> dict[int, set[int]]:
    """{NUMA node: its CPUs}, from /sys/devices/system/node/nodeN/cpulist; {} where unreadable."""
    out = {}
    for path in sorted((sys_root / "devices/system/node").glob("node[0-9]*/cpulist")):
        try:
            out[int(path.parent.name[4:])] = cpu_list(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def gpu_node(address: str, sys_root: Path) -> int:
    """The NUMA node a PCI device hangs off; -1 where the firmware does not say (sysfs' own -1) or it is unreadable."""
    try:
        return int((sys_root / "bus/pci/devices" / address / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1
