"""One node's launch, spelled once: what every launcher starts on a node (`invoke run` and --native, run.sh, the
sbatch script, the Kubernetes pods) is rendered here.

  torchrun_argv     torchrun's process flags: one process per GPU (or CPU slot), alone or through a rendezvous
  rendezvous_flags  torchrun's c10d rendezvous (node 0 hosts the store), from a Rendezvous or shell expressions
  entry_argv        the trainer: -m dockyard.train --recipe R --run-dir D [--resume] [-- overrides]
  entry_shell       the same as one shell line, for the scripts and pods
  node_command      the shell line a scheduler starts on each node (Slurm's SLURM_NODEID, an Indexed Job's index)
  container_env     the trainer's container environment: HOME, Hugging Face's cache, offline
  fabric_env        the fabric's settings (NCCL_*, FI_*, UCX_*) of the node's environment, which every launcher of
                    several nodes passes
  fabric_files      the node's files they name (NCCL_TOPO_FILE, NCCL_GRAPH_FILE), which every launcher of several nodes mounts
  cluster_variant   `auto` on a cluster: the nodes' GPUs decide, not this host's
  check_*           the node count, rank, port and restart checks every launcher makes
compose/*.yml are static YAML with their own text: tests/unit/test_compose_agrees.py holds them to this module.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dockyard.common import envvars, runfolder
from dockyard.common.errors import DockyardError, cut
from dockyard.images import variants
from dockyard.images.variants import Variant
from dockyard.launch import scriptwords
from dockyard.settings import Settings

WORKSPACE = "/workspace"
RUNS_INSIDE = runfolder.RUNS_INSIDE                # the runs folder, as the container sees it
HF_INSIDE = f"{WORKSPACE}/.cache/huggingface"     # Hugging Face's cache, as the container sees it
WORKDIR = "/opt/dockyard"                         # the image's copy of the project: dockyard/, recipes/
CPU_NPROC = 2  # processes per node where there is no GPU: enough to exercise every distributed code path
PORT = 29500   # node 0's rendezvous port unless told another
JOIN_TIMEOUT = envvars.JOIN_TIMEOUT  # seconds node 0 waits for the others to join, the trainer's bound on silence
# torch's TCP store listens on IPv6 and meets its own processes at ::ffff:127.0.0.1, whose name it looks up for its
# logs: no hosts file names that address, so each connection asked the DNS server. Where that server does not answer
# (an air-gapped node's resolv.conf) each lookup waited ~10 s: a 2-process start took 23.9 s, not 4.8 s
# (docs/multinode.md). A one-node run's container names it in its /etc/hosts; a multi-node run's shares the host's
# network and so its /etc/hosts, which an --add-host would replace (docker's rule for the host network).
LOOPBACK_V4MAPPED = ("loopback-v4mapped", "::ffff:127.0.0.1")
TRAINER = ["-m", "dockyard.train"]


@dataclass
class Rendezvous:
    """How the nodes of one run find each other (recorded in every node's manifest): multinode.rendezvous()."""

    endpoint: str             # node 0's host:port
    run_id: str               # the same on every node: torchrun's --rdzv-id
    is_host: bool             # node 0 hosts the c10d store
    join_timeout: int = JOIN_TIMEOUT
    max_restarts: int = 0
    iface: str = ""           # the interface the collectives use on this node
    local_addr: str = ""      # this node's address on it, advertised to the others

    def torchrun_flags(self) -> list[str]:
        return rendezvous_flags(endpoint=self.endpoint, run_id=self.run_id, is_host=self.is_host,
                                join_timeout=self.join_timeout, max_restarts=self.max_restarts,
                                local_addr=self.local_addr)

    def env(self) -> dict[str, str]:
        record = rendezvous_record(self.endpoint, self.run_id, self.join_timeout, iface=self.iface,
                                   local_addr=self.local_addr)
        env = {envvars.RENDEZVOUS: json.dumps(record)}
        if self.iface:
            env |= {"GLOO_SOCKET_IFNAME": self.iface, "NCCL_SOCKET_IFNAME": self.iface}
        return env


def torchrun_argv(nproc: int | str, nnodes: int | str = 1, rendezvous: list[str] | None = None,
                  launcher: list[str] | None = None, max_restarts: int = 0) -> list[str]:
    """One process per GPU (or per CPU slot) on this node; with `rendezvous` (rendezvous_flags) the c10d
    rendezvous across `nnodes` nodes: node 0 hosts the store, and torchrun then numbers the nodes itself.
    `max_restarts`: one node's (several nodes': in `rendezvous`)."""
    argv = list(launcher or ["torchrun"]) + [f"--nproc-per-node={nproc}"]
    if rendezvous is not None:
        return argv + [f"--nnodes={nnodes}", *rendezvous]
    # The workers' store address: without it torchrun looks up the container's hostname, which an engine
    # without a bridge network (air-gapped nodes, `--bridge=none`) cannot resolve: every rank then waits forever.
    return argv + ["--standalone", "--local-addr=127.0.0.1", *([f"--max-restarts={max_restarts}"] if max_restarts else [])]


def rendezvous_flags(*, endpoint: str, run_id: str, is_host: bool | str, join_timeout: int | str,
                     max_restarts: int | str, local_addr: str = "") -> list[str]:
    """torchrun's c10d flags. `is_host`: True on node 0, or (for a shell line) an expression that gives 1 or 0."""
    host = int(is_host) if isinstance(is_host, bool) else is_host
    return ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={host},join_timeout={join_timeout}", f"--max-restarts={max_restarts}",
            *([f"--local-addr={local_addr}"] if local_addr else [])]


def rendezvous_record(endpoint: str, run_id: str, join_timeout: int | str, **more: str) -> dict:
    """What the trainer reads in DOCKYARD_RENDEZVOUS (and records in the manifest); `more`: iface, local_addr."""
    return {"backend": "c10d", "endpoint": endpoint, "id": run_id, "join_timeout": join_timeout, **more}


def run_dir_inside(run_id: str) -> str:
    return f"{RUNS_INSIDE}/{run_id}"


def entry_argv(recipe: str, run_dir: str, overrides: list[str] | tuple[str, ...] = (), resume: bool = False) -> list[str]:
    """What follows torchrun's flags: the trainer, its recipe and run folder, and the recipe's overrides."""
    argv = [*TRAINER, "--recipe", recipe, "--run-dir", run_dir]
    if resume:
        argv.append("--resume")
    return argv + (["--", *overrides] if overrides else [])


def entry_shell(recipe: str, run_dir: str, overrides: list[str] | tuple[str, ...] = (), resume: bool = False, *,
                expand_run_dir: bool = False, args: str = "") -> str:
    """entry_argv as shell words. `expand_run_dir`: the run folder is an expression ($RUN_ID in it) expanded on the
    node; `args`: shell words given on before the overrides (a script's "$@")."""
    line = shlex.join([*TRAINER, "--recipe", recipe, "--run-dir"]) + " "
    line += expanding(run_dir) if expand_run_dir else shlex.quote(run_dir)
    line += " --resume" if resume else ""
    line += f" {args}" if args else ""
    return line + (" " + shlex.join(["--", *overrides]) if overrides else "")


def node_command(*, index: str, nnodes: str | int, nproc: str | int, endpoint: str, entry: str, run_id: str,
                 local_addr: str = "", join_timeout: int = JOIN_TIMEOUT, max_restarts: int = 0) -> str:
    """The shell line one node runs when a scheduler starts every node at once and numbers them (Slurm's
    SLURM_NODEID, an Indexed Job's JOB_COMPLETION_INDEX): torchrun with the same c10d rendezvous `invoke run`
    gives a node, the node numbered 0 hosting the store. `index`, `endpoint`, `run_id` and `local_addr` may be
    shell expressions, expanded on each node, each in double quotes: so they are ours ($VAR, ${...}), and a user's
    value reaches them through a variable or checked to hold no shell character (a Kubernetes name); `entry` is
    what follows torchrun's flags (already shell words: entry_shell)."""
    rdzv = rendezvous_record(endpoint, run_id, join_timeout, **({"local_addr": local_addr} if local_addr else {}))
    argv = torchrun_argv(nproc, nnodes, rendezvous_flags(
        endpoint=endpoint, run_id=run_id, is_host=f"$(( {index} == 0 ))", join_timeout=join_timeout,
        max_restarts=max_restarts, local_addr=local_addr))
    # Each in double quotes: the expressions expand on the node, and what they expand to stays one word.
    return (f"export {envvars.NODE_RANK}={expanding(str(index))} {envvars.RENDEZVOUS}={expanding(json.dumps(rdzv))}; "
            f"exec {argv[0]} {' '.join(expanding(f) for f in argv[1:])} {entry}")


def expanding(text: str) -> str:
    """`text` as one double-quoted shell word in which $VAR, ${...} and $(( )) still expand."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


# torch.compile's kernels kept for the next run where no launcher of ours mounts the compile cache (compose, the
# Kubernetes pods): in the runs folder, which they mount already. The trainer makes the folders for the run's user
# alone, and uses them only while they stay so (dockyard.train.environment); whoever can write the runs folder can
# already write the checkpoints a resume loads.
COMPILE_IN_RUNS = f"{RUNS_INSIDE}/{runfolder.CACHES_IN_RUNS}/compile"


def compile_in_runs_env() -> dict[str, str]:
    return compile_cache_env(COMPILE_IN_RUNS)


def compile_cache_env(root: str) -> dict[str, str]:
    """The variables naming each compile cache, in folders of `root` (as the container sees it): torch.compile's,
    Triton's, and the C++ ops torch builds on first use (dockyard.train.environment checks each)."""
    return {"TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor", "TRITON_CACHE_DIR": f"{root}/triton",
            envvars.OPS_CACHE: f"{root}/extensions"}


def container_env() -> dict[str, str]:
    """The trainer's container environment on every launcher: a HOME any user id can write, and Hugging Face's
    cache at its mounted folder, never asked over the network."""
    return {"HOME": "/tmp", "HF_HOME": HF_INSIDE, "HF_HUB_OFFLINE": "1"}


# The fabric's settings a cluster's user sets in the job's environment: NCCL's (NCCL_IB_HCA, NCCL_NET_GDR_LEVEL,
# NCCL_DEBUG...), libfabric's (FI_PROVIDER, FI_EFA_*: AWS EFA) and UCX's (some InfiniBand stacks). Left out, a job that
# used InfiniBand fell back to sockets, or hung. Every launcher of several nodes (whose containers have the host's
# network) gives the trainer those set where the node starts (a name bash can export: the job's environment holds no
# other), and none of the host's other variables.
FABRIC_PREFIXES = ("NCCL", "FI", "UCX")
FABRIC_NAME = rf"({'|'.join(FABRIC_PREFIXES)})_[A-Za-z0-9_]+"  # a whole name (slurm.py: the same, in bash)
SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # the interfaces gloo and NCCL take (Rendezvous.env)


def fabric_env(environ: Mapping[str, str], iface: str = "") -> dict[str, str]:
    """The fabric's settings in `environ` (the node's), as they are, and the interface it names for gloo. `iface`: the
    interface this command's --iface named, which wins over the environment's for both (Rendezvous.env); without it
    the environment's win over the interface found towards node 0, as the trainer leaves a user's own
    (dockyard.train.nodes.pin_interface) and the containers of the sbatch script see them."""
    env = {k: v for k, v in sorted(environ.items()) if re.fullmatch(FABRIC_NAME, k) or k == "GLOO_SOCKET_IFNAME"}
    for name in SOCKET_IFNAMES if iface else ():
        env.pop(name, None)
    return env


# The fabric's settings that name a file of the node's, each with what it is, what NCCL does where it cannot open it,
# and whether that fails it. NCCL_TOPO_FILE: the node's PCI/NVLink/NIC topology (cloud VMs give NCCL one, their own
# being virtual); NCCL warned that it could not open it and went on without it, its rings and NIC choices those of the
# topology it could see. NCCL_GRAPH_FILE: the rings and trees NCCL is to use, as NCCL_GRAPH_DUMP_FILE wrote them; NCCL
# failed as it started ("Could not open XML graph file", an unhandled system error), set but empty too (an image's
# NCCL_GRAPH_FILE="", a way to unset it that is none). The container does not see the host's files: every launcher of
# several nodes mounts each read-only at the same path, or refuses.
FABRIC_FILES = {"NCCL_TOPO_FILE": ("topology file", "would go on without it", False),
                "NCCL_GRAPH_FILE": ("graph file", "would fail as it starts, unable to open it", True)}


def fabric_files(fabric: Mapping[str, str], separators: str = ":") -> list[tuple[Path, str, bool]]:
    """The files the fabric's settings (fabric_env's) name, as read-only mounts at the same path, each checked here
    (`separators`: those of the runtime's mount list, as inputs.read_only_mounts)."""
    mounts = []
    for name, (what, without, fails) in FABRIC_FILES.items():
        value = fabric.get(name)
        if value is None or not (value or fails):
            continue
        if not value:
            raise DockyardError(f"{name} is set but empty, and NCCL in the container {without}: give the node's "
                                f"{what} by its absolute path, or unset {name}")
        scriptwords.mount_path(value, name, separators)
        path = Path(value)
        if not path.is_absolute() or not path.is_file():
            why = "not an absolute path" if not path.is_absolute() else "no such file on this node"
            raise DockyardError(f"{name}={cut(value)}: {why}, and NCCL in the container {without}: give the node's "
                                f"{what} by its absolute path (the container sees it there, read-only), or unset {name}")
        mounts.append((path, value, True))
    return mounts


# NCCL's settings of one node's own transport and of its log, which a one-node run's container is given where set on
# the host: NCCL_P2P_DISABLE=1 is the way out of a hang on GPUs whose P2P the hardware claims and does not give (ACS
# on, some consumer boards), NCCL_DEBUG=INFO the way to see why. Not those that name a network, an interface or a
# host's file (NCCL_SOCKET_IFNAME=ib0, NCCL_NET=IB, NCCL_IB_*, NCCL_TOPO_FILE): the container has a network of its
# own and none of the InfiniBand devices, and a cluster's login shell sets them for every job.
# Shell patterns (run.sh's `case` holds the same words).
LOCAL_NCCL = ("NCCL_P2P_*", "NCCL_SHM_*", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
              "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NTHREADS")


def local_nccl_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL settings in `environ` (this host's) that a one-node run's container is given (LOCAL_NCCL)."""
    return {k: v for k, v in sorted(environ.items())
            if re.fullmatch(r"NCCL_[A-Z0-9_]+", k) and any(fnmatch.fnmatchcase(k, p) for p in LOCAL_NCCL)}


def cluster_variant(settings: Settings, variant: str, gpus_per_node: int) -> Variant:
    """The variant a cluster's nodes run. `auto`: their GPUs decide, not this (login) host's: the newest CUDA
    variant, or cpu without GPUs."""
    if variant == "auto":
        if not gpus_per_node:
            return variants.resolve(settings, "cpu")[0]
        chosen, older = variants.newest_cuda(settings), variants.oldest_cuda(settings)

        def needs(v: Variant) -> str:
            since = variants.MIN_DRIVER.get(variants.cuda_version(v.cuda)[0])
            return f"an NVIDIA driver from {since} on" if since else f"a driver for CUDA {v.cuda}"

        print(f"auto → {chosen.name} (CUDA {chosen.cuda}) for the nodes' GPUs: every node needs {needs(chosen)}"
              f"{f'; --variant={older.name} (CUDA {older.cuda}) needs {needs(older)}' if older != chosen else ''}",
              file=sys.stderr)
        return chosen
    chosen = variants.resolve(settings, variant)[0]
    if gpus_per_node and not chosen.is_cuda:  # the job held the GPUs and trained on the CPUs beside them
        raise DockyardError(f"--variant={chosen.name} has no CUDA, so its nodes would train on their CPUs while the job "
                            f"holds {gpus_per_node} GPU(s) each: pick a CUDA variant (or leave out --variant), or "
                            "leave out --gpus-per-node for CPU nodes")
    return chosen


def check_nodes(nodes: int, gpus_per_node: int | None = None) -> None:
    if nodes < 1:
        raise DockyardError(f"--nodes must be at least 1 (got {nodes})")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise DockyardError(f"--gpus-per-node must be 0 (CPU nodes) or more (got {gpus_per_node})")


def given_rank(node_rank: int, nodes: int) -> int:
    """`invoke run`'s --node-rank (-1: not given), checked against --nodes before anything else reads it: with several
    nodes each must say its own (a node 1 taken for node 0 hosted a rendezvous of its own, and both waited for the
    other until the join timeout); with one, a rank past 0 means --nodes was forgotten."""
    if node_rank < 0 and nodes > 1:
        others = "1 on the other" if nodes == 2 else f"1 to {nodes - 1} on the others, each its own"
        raise DockyardError(f"--nodes={nodes} needs this node's --node-rank: 0 on the node at --master-addr (it hosts "
                            f"the rendezvous), {others}")
    if node_rank > 0 and nodes == 1:
        raise DockyardError(f"--node-rank={node_rank} is for several nodes: give their number too, --nodes=N (the "
                            "same on every node)")
    return max(node_rank, 0)


def check_rank_and_port(node_rank: int, nodes: int, master_port: int) -> None:
    if not 0 <= node_rank < nodes:
        raise DockyardError(f"--node-rank must be in 0..{nodes - 1} (got {node_rank})")
    if not 1 <= master_port <= 65535:
        raise DockyardError(f"--master-port must be a TCP port (got {master_port})")


def check_restarts(max_restarts: int, join_timeout: int | None = None) -> None:
    if join_timeout is not None and join_timeout < 1:
        raise DockyardError(f"--join-timeout must be at least 1 second (got {join_timeout})")
    if max_restarts < 0:
        raise DockyardError(f"--max-restarts must be 0 or more (got {max_restarts})")
