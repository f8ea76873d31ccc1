"""Several nodes, from inside the run: do they share the run folder, who they are, which one was lost.

DeepSpeed writes each rank's shard of a checkpoint into the run folder, and a resume reads them all back:
node-local run folders make a resume silently impossible. So before training, node 0 writes a fresh token
there and every node must read it back within SHARED_TIMEOUT seconds, or every rank stops with the reason.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError

SHARED_TIMEOUT = float(os.environ.get("DOCKYARD_SHARED_TIMEOUT", 30))  # network filesystems show new files late
TOKEN = ".shared-check"
LOST = ".lost-node"  # the first rank that sees which node was lost says it here, for the ranks that see less


def node_rank() -> int:
    """The node's rank as the user numbered it (`invoke run --node-rank`); torchrun's own order otherwise."""
    return int(os.environ.get("DOCKYARD_NODE_RANK", os.environ.get("GROUP_RANK", 0)))


def rendezvous() -> dict[str, Any] | None:
    raw = os.environ.get("DOCKYARD_RENDEZVOUS")
    return json.loads(raw) if raw else None


def interface_of(addr: str) -> str | None:
    """The network interface that holds `addr` on this machine (no `ip` needed: images need not have it)."""
    import fcntl
    import struct

    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    return None


def pin_interface() -> str | None:
    """gloo and NCCL pick their interface from the hostname, which can resolve to loopback (a container's, or a
    node whose /etc/hosts maps its name to 127.0.1.1): then every rank tells the others to connect to 127.0.0.1.
    When the launcher said which address this node advertises (DOCKYARD_RENDEZVOUS local_addr: `invoke run`,
    `invoke slurm`, `invoke k8s`) and the user chose no interface, use the one that holds that address."""
    addr = (rendezvous() or {}).get("local_addr")
    if not addr or os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    iface = interface_of(addr)
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    return iface


def several() -> bool:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1)) < int(os.environ.get("WORLD_SIZE", 1))


def check_shared(run_dir: Path, timeout: float = SHARED_TIMEOUT) -> list[dict[str, Any]]:
    """All ranks call this once torch.distributed is up. Returns every node (rank, host, address); raises the
    same DockyardError on every rank when a node cannot see what node 0 wrote in the run folder."""
    import torch.distributed as dist

    token = [secrets.token_hex(16) if dist.get_rank() == 0 else None]
    if dist.get_rank() == 0:
        (run_dir / LOST).unlink(missing_ok=True)  # from an earlier attempt of this run
        runfolder.write(run_dir, TOKEN, token[0])
    dist.broadcast_object_list(token, src=0)
    sees = None
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        sees = _wait_for(run_dir, token[0], timeout)
    me = {"node_rank": node_rank(), "host": socket.gethostname(), "sees_run_dir": sees,
          "addr": (rendezvous() or {}).get("local_addr", "")}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    found = sorted((n for n in everyone if n["sees_run_dir"] is not None), key=lambda n: n["node_rank"])
    blind = [n for n in found if not n["sees_run_dir"]]
    if blind:
        who = ", ".join(f"node {n['node_rank']} ({n['addr'] or n['host']})" for n in blind)
        raise DockyardError(
            f"the run folder is not shared: {who} did not see in {run_dir} the file node 0 wrote there within "
            f"{timeout:.0f} s. DeepSpeed writes each node's checkpoint shards there and a resume needs them all: "
            "give every node the same runs folder on shared storage (NFS, Lustre, ...) mounted at the same "
            "path, e.g. INVOKE_DOCKYARD_RUNS_DIR=/shared/runs on each node")
    return [{k: v for k, v in n.items() if k != "sees_run_dir"} for n in found]


def _wait_for(run_dir: Path, token: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if runfolder.read_text(run_dir, TOKEN) == token:
                return True
        except (OSError, DockyardError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


PEER = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3})\]?:\d+")


def explain(error: str, run_dir: Path, nodes: list[dict[str, Any]]) -> str:
    """A failed rank's error, led by the node that was lost when this rank or another one found out which.
    The rank that finds it says so on stderr, and leaves it for the others: a rank whose own peer was a
    neighbour on the same node (which stopped first), or which torchrun stopped, sees only that."""
    lost = lost_node(error, nodes)
    if lost:
        print(f"error: {lost}", file=sys.stderr, flush=True)
        runfolder.write(run_dir, LOST, lost)  # a random temporary name: containers of several nodes share pids
    else:
        try:
            lost = runfolder.read_text(run_dir, LOST)
        except (OSError, DockyardError):
            return error
        if lost is None:
            return error
    return f"{lost}: {error}"


def lost_node(error: str, nodes: list[dict[str, Any]]) -> str | None:
    """The node a communication error names (gloo and NCCL quote the peer's address), as the user numbered it."""
    mine = node_rank()
    for addr in PEER.findall(error):
        for n in nodes:
            if n["addr"] == addr and n["node_rank"] != mine:
                return f"lost node {n['node_rank']} ({addr}, host {n['host']}): it stopped answering"
    return None
