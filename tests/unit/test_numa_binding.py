"""Each process on the cores of its GPU's NUMA node (numa_binding, dockyard.train.cpus).

This machine has one NUMA node and no GPU, so the servers here are sysfs trees the tests lay out (a two-socket
server with hyperthreads, 8 GPUs four per socket) and the GPUs are their PCI addresses: stand-ins for what this
machine lacks. The binding itself is real: a child process is bound to one of this machine's two CPUs, every one
of its threads with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dockyard.common.autos import Device, Placement, cpu_ranges, resolve_numa_binding
from dockyard.common.errors import DockyardError
from dockyard.train import cpus

ROOT = Path(__file__).resolve().parents[2]
H100 = Device("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
GPUS = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)]


def lay_out(root: Path, nodes: dict[int, str], siblings: dict[int, str], gpu_nodes: dict[str, str]) -> Path:
    """A sysfs tree: each NUMA node's cpulist, each CPU's hyperthread siblings, each GPU's numa_node."""
    for node, cpulist in nodes.items():
        (root / f"devices/system/node/node{node}").mkdir(parents=True)
        (root / f"devices/system/node/node{node}/cpulist").write_text(cpulist + "\n")
    for cpu, sibs in siblings.items():
        (root / f"devices/system/cpu/cpu{cpu}/topology").mkdir(parents=True)
        (root / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").write_text(sibs + "\n")
    for address, node in gpu_nodes.items():
        (root / "bus/pci/devices" / address).mkdir(parents=True)
        (root / "bus/pci/devices" / address / "numa_node").write_text(node + "\n")
    return root


@pytest.fixture
def two_sockets(tmp_path: Path) -> Path:
    """2 sockets x 16 cores x 2 hyperthreads: node 0 has CPUs 0-15 and 32-47 (CPU n and n+32 are one core), node 1
    16-31 and 48-63; GPUs 0-3 on node 0, 4-7 on node 1."""
    siblings = {c: f"{c % 32},{c % 32 + 32}" for c in range(64)}
    return lay_out(tmp_path, {0: "0-15,32-47", 1: "16-31,48-63"}, siblings,
                   {a: str(i // 4) for i, a in enumerate(GPUS)})


def test_a_two_socket_server_binds_each_process_to_its_gpus_node_and_shares_its_cores(two_sockets):
    first, last = (cpus.placement(g, GPUS, two_sockets, allowed=set(range(64))) for g in (0, 7))
    assert first == Placement(gpu=0, address=GPUS[0], node=0, nodes=2, cpus=frozenset({*range(16), *range(32, 48)}),
                              cores=16, sharing=4)
    assert last.node == 1 and last.cpus == frozenset({*range(16, 32), *range(48, 64)}) and last.threads == 4
    on, why = resolve_numa_binding("auto", H100, last)
    assert on
    assert why == ("GPU 7 (0000:db:00.0) is on NUMA node 1: bound to its 16 core(s) (CPUs 16-31,48-63), shared by 4 "
                   "process(es)")


def test_gpus_crowded_on_one_node_are_left_unbound_unless_asked_and_then_share_its_cores(two_sockets):
    """All 8 GPUs on node 0 (some servers wire them so): bound, node 1's 16 cores would idle, so the auto leaves
    the processes where they were. Set true, each gets 2 of node 0's 16 cores, not 64 / 8 = 8."""
    for address in GPUS:
        (two_sockets / "bus/pci/devices" / address / "numa_node").write_text("0\n")
    place = cpus.placement(5, GPUS, two_sockets, allowed=set(range(64)))
    assert (place.node, place.sharing, place.cores, place.threads, place.idle) == (0, 8, 16, 2, (1,))
    assert resolve_numa_binding("auto", H100, place) == (False, (
        "NUMA node(s) 1 hold(s) none of this run's GPUs: bound near their GPUs, the processes would leave those cores "
        "idle (set it true to bind even so)"))
    assert resolve_numa_binding(True, H100, place)[0]


def test_a_run_on_some_of_the_gpus_binds_only_where_its_gpus_cover_every_node(two_sockets):
    """2 processes on GPUs 0 and 1, both on node 0: left unbound (node 1 would idle). On GPUs 0 and 4, one per
    node: each bound to its node's 16 cores, alone there."""
    assert cpus.placement(1, GPUS[:2], two_sockets, allowed=set(range(64))).idle == (1,)
    spread = cpus.placement(1, [GPUS[0], GPUS[4]], two_sockets, allowed=set(range(64)))
    assert (spread.node, spread.sharing, spread.threads, spread.idle) == (1, 1, 16, ())
    assert resolve_numa_binding("auto", H100, spread)[0]


def test_the_affinity_given_by_slurm_or_a_cpuset_bounds_the_binding(two_sockets):
    """A job given CPUs 8-23 (half of each node's first cores, no hyperthreads) binds within them; one given node 1's
    CPUs only cannot bind near a GPU on node 0, and says why instead of binding elsewhere."""
    place = cpus.placement(0, GPUS, two_sockets, allowed=set(range(8, 24)))
    assert place.cpus == frozenset(range(8, 16)) and place.cores == 8 and resolve_numa_binding("auto", H100, place)[0]
    elsewhere = cpus.placement(0, GPUS, two_sockets, allowed=set(range(16, 32)))
    assert elsewhere.cpus == frozenset() and elsewhere.nodes == 1
    assert resolve_numa_binding("auto", H100, elsewhere) == (False, (
        "this process may use none of NUMA node 0's CPUs, where its GPU 0 (0000:18:00.0) is: its CPU affinity "
        "(Slurm's, or the container's cpuset) holds it elsewhere"))
    with pytest.raises(DockyardError, match="numa_binding true cannot bind: this process may use none of NUMA node 0"):
        resolve_numa_binding(True, H100, elsewhere)


def test_where_binding_gains_nothing_or_cannot_be_done_the_auto_stays_off_and_says_why(tmp_path):
    one = lay_out(tmp_path / "one", {0: "0-7"}, {}, {GPUS[0]: "0"})
    assert resolve_numa_binding("auto", H100, cpus.placement(0, GPUS[:1], one, allowed=set(range(8)))) == (
        False, "one NUMA node: every core is as near the GPUs as any other")
    # many one-socket hosts say -1: that is the only node, as the auto and `true` both read it
    unsaid = cpus.placement(0, GPUS[:1], lay_out(tmp_path / "unsaid", {0: "0-7"}, {}, {GPUS[0]: "-1"}),
                            allowed=set(range(8)))
    assert unsaid.node == 0 and resolve_numa_binding("auto", H100, unsaid) == (
        False, "one NUMA node: every core is as near the GPUs as any other")
    assert resolve_numa_binding(True, H100, unsaid)[0]
    unknown = lay_out(tmp_path / "unknown", {0: "0-7", 1: "8-15"}, {}, {GPUS[0]: "-1"})
    place = cpus.placement(0, GPUS[:1], unknown, allowed=set(range(16)))
    assert resolve_numa_binding("auto", H100, place) == (
        False, "GPU 0 (0000:18:00.0)'s NUMA node is not known: its firmware does not say (sysfs reads -1)")
    assert cpus.placement(0, GPUS[:1], tmp_path / "no-sysfs") is None
    assert resolve_numa_binding("auto", H100, None) == (
        False, "this host's NUMA topology is not readable (/sys/devices/system/node)")
    assert resolve_numa_binding("auto", None, None) == (False, "CPU: no GPU to bind near")
    assert resolve_numa_binding(False, H100, place) == (False, "set")
    with pytest.raises(DockyardError, match="numa_binding true cannot bind: CPU: no GPU to bind near; set it to auto"):
        resolve_numa_binding(True, None, None)


CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    from pathlib import Path
    import torch
    from dockyard.common.autos import Device
    from dockyard.train import cpus

    before = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    before.start()  # a thread the process had before it bound itself (as the process group's are)
    pinned = threading.Event()

    def pin_myself():  # a thread that chose its CPU itself (as NCCL's proxy threads do): left where it is
        os.sched_setaffinity(0, {int(sys.argv[4])})
        pinned.set()
        time.sleep(5)

    threading.Thread(target=pin_myself, daemon=True).start()
    pinned.wait()
    threads_before = torch.get_num_threads()
    cpus.gpu_addresses = lambda: json.loads(sys.argv[2])  # the GPUs this machine lacks
    value = {"auto": "auto", "true": True}[sys.argv[3]]
    on, why = cpus.bind_near_gpu(value, Device("H100", 80 << 30, (9, 0)), Path(sys.argv[1]))
    after = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    after.start()
    allowed = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    print(json.dumps({"on": on, "why": why, "allowed": allowed, "threads": torch.get_num_threads(),
                      "threads_before": threads_before, "omp": os.environ.get("OMP_NUM_THREADS")}))
""")


def run_child(sysfs: Path, local_rank: int, env: dict[str, str], value: str = "auto") -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "DOCKYARD_CPU_SHARE")}
    full.update({"PYTHONPATH": str(ROOT), "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": "2", **env})
    pin = str(sorted(os.sched_getaffinity(0))[0])  # where a thread of the child pins itself
    done = subprocess.run([sys.executable, "-c", CHILD, str(sysfs), json.dumps(GPUS[:2]), value, pin], env=full,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_bound_process_runs_every_thread_on_its_gpus_node_with_that_nodes_share_of_threads(tmp_path):
    """This machine's two CPUs laid out as two NUMA nodes, one GPU on each: rank 1 ends up on the second CPU, the
    thread it had before binding and the one it starts after included."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    sysfs = lay_out(tmp_path, {0: str(first), 1: str(second)}, {}, {GPUS[0]: "0", GPUS[1]: "1"})
    # the image's torchrun gave each process 2 threads (its share of a larger node); within the node there is 1 core
    got = run_child(sysfs, 1, {"OMP_NUM_THREADS": "2", "DOCKYARD_CPU_SHARE": "2"})
    assert got["on"] and got["why"].startswith(f"GPU 1 ({GPUS[1]}) is on NUMA node 1: bound to its 1 core(s) (CPUs {second})")
    assert sorted(map(tuple, got["allowed"].values())).count((second,)) >= 3, got["allowed"]  # main, before, after
    assert sorted(map(tuple, got["allowed"].values())).count((first,)) == 1, got["allowed"]  # the one pinned by itself
    assert (got["threads"], got["omp"]) == (1, "1") and got["why"].endswith("shared by 1 process(es), 1 thread(s) each")
    # OMP_NUM_THREADS a user set is theirs: bound, but the count is kept and the reason says so
    mine = run_child(sysfs, 0, {"OMP_NUM_THREADS": "3"})
    assert all(cpu == [first] for cpu in mine["allowed"].values()), mine["allowed"]
    assert mine["threads"] == mine["threads_before"] and mine["omp"] == "3"
    assert mine["why"].endswith("; OMP_NUM_THREADS=3 kept as set")


def test_the_threads_never_exceed_the_launchers_share_which_counts_the_cpu_quota(tmp_path):
    """Both CPUs in GPU 0's node: 2 threads for its one process by the node, but the image's torchrun gave 1 (a
    container's CPU quota, say): 1 it stays. Launched without OMP_NUM_THREADS at all, the node's share is taken."""
    cpu_set = sorted(os.sched_getaffinity(0))
    sysfs = lay_out(tmp_path, {0: ",".join(map(str, cpu_set))}, {}, {GPUS[0]: "0", GPUS[1]: "0"})
    capped = run_child(sysfs, 0, {"OMP_NUM_THREADS": "1", "DOCKYARD_CPU_SHARE": "1",
                                  "LOCAL_WORLD_SIZE": "1"}, value="true")
    assert capped["on"] and (capped["threads"], capped["omp"]) == (1, "1"), capped
    free = run_child(sysfs, 0, {"LOCAL_WORLD_SIZE": "1"}, value="true")
    assert (free["threads"], free["omp"]) == (len(cpu_set), str(len(cpu_set))), free
    assert free["why"].endswith(f"shared by 1 process(es), {len(cpu_set)} thread(s) each")


def test_cores_count_once_per_physical_core_and_each_cpu_where_sysfs_does_not_say(tmp_path):
    """The launcher's share (dockyard.common.cores.usable_cores) counts hyperthreads' siblings once. Where the
    topology is not readable (some VMs and sandboxes) every CPU counts: psutil's count of physical cores was None
    there, which made every process's share 1."""
    from dockyard.common.cores import usable_cores

    siblings = lay_out(tmp_path / "ht", {0: "0-3"}, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}, {})
    assert cpus.physical_cores(frozenset(range(4)), siblings) == 2
    assert cpus.physical_cores(frozenset({0, 1}), siblings) == 2  # one thread of each core: still two cores
    assert cpus.physical_cores(frozenset(range(4)), tmp_path / "unreadable") == 4
    mine = sorted(os.sched_getaffinity(0))
    paired = lay_out(tmp_path / "paired", {0: ",".join(map(str, mine))}, {c: ",".join(map(str, mine)) for c in mine},
                     {})
    no_cgroup = tmp_path / "cgroup"
    assert usable_cores(no_cgroup, paired) == 1  # this process's CPUs as one core's two threads
    assert usable_cores(no_cgroup, tmp_path / "unreadable") == len(mine)
    # what no kernel writes counts as unreadable: a billion-CPU range was a billion-element set
    huge = lay_out(tmp_path / "huge", {0: "0-999999999"}, {c: "0-999999999" for c in mine}, {})
    assert cpus.node_cpus(huge) == {} and usable_cores(no_cgroup, huge) == len(mine)
    assert cpus.cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    for bad in ("3-1", "-1", "70000", "x"):
        with pytest.raises(ValueError):
            cpus.cpu_list(bad)


def test_a_binding_refused_or_a_rank_without_a_gpu_leaves_the_process_unbound_and_says_why(tmp_path, monkeypatch,
                                                                                          caplog):
    """The kernel refusing the binding (a sandbox, a cpuset that shrank meanwhile: os.sched_setaffinity is a stand-in
    that refuses here) and a local rank past the visible GPUs: the run goes on unbound under auto, with a warning
    from that rank (only local rank 0's answer reaches the manifest); `true` stops with the reason."""
    mine = sorted(os.sched_getaffinity(0))
    sysfs = lay_out(tmp_path, {0: str(mine[0]), 1: ",".join(map(str, mine[1:]))}, {},
                    {GPUS[0]: "0", GPUS[1]: "1"})
    monkeypatch.setattr(cpus, "gpu_addresses", lambda: GPUS[:2])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")

    def refuse(pid, cpu_set):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    assert cpus.bind_near_gpu("auto", H100, sysfs) == (
        False, f"binding to CPUs {cpu_ranges(frozenset(mine[1:]))} failed (Invalid argument)")  # node 1: all but one
    assert "numa_binding: binding to CPUs" in caplog.text and "this process is not bound" in caplog.text
    with pytest.raises(DockyardError, match=r"numa_binding true cannot bind: binding to CPUs .* failed \(Invalid"):
        cpus.bind_near_gpu(True, H100, sysfs)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert cpus.bind_near_gpu("auto", H100, sysfs) == (False, "local rank 2 has no GPU of its own (2 visible)")
    # a host whose GPUs' node is not known (many VMs) is every rank's lot, not one rank's trouble: no warning
    caplog.clear()
    unknown = lay_out(tmp_path / "unknown", {0: str(mine[0]), 1: ",".join(map(str, mine[1:]))}, {},
                      {GPUS[0]: "-1", GPUS[1]: "-1"})
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert cpus.bind_near_gpu("auto", H100, unknown)[0] is False and "numa_binding" not in caplog.text
