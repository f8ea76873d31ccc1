"""Several nodes: torchrun's c10d rendezvous, the network interface the collectives use, InfiniBand devices.

What goes wrong across nodes, and what this module does about each:
- the container's hostname resolves to 127.0.0.1, so gloo/NCCL advertise loopback to the other nodes →
  every node advertises the address of the interface that routes to node 0 (torchrun --local-addr,
  GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), found with `ip` or given with --iface;
- the c10d store must be hosted by node 0 (`is_host=1`), else every node waits for a store nobody runs;
- a dead node leaves the others waiting for torchrun's join timeout (600 s by default) → a bounded
  `--join-timeout` and `--max-restarts` as flags;
- NCCL falls back to TCP when /dev/infiniband is not passed in → its devices and IPC_LOCK when present.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dockyard.common.errors import DockyardError

JOIN_TIMEOUT = 120      # seconds node 0 waits for the others to join (torchrun's default: 600)
INFINIBAND = Path("/dev/infiniband")


@dataclass
class Rendezvous:
    """How the nodes of one run find each other (recorded in every node's manifest)."""

    endpoint: str             # node 0's host:port
    run_id: str               # the same on every node: torchrun's --rdzv-id
    is_host: bool             # node 0 hosts the c10d store
    join_timeout: int = JOIN_TIMEOUT
    max_restarts: int = 0
    iface: str = ""           # the interface the collectives use on this node
    local_addr: str = ""      # this node's address on it, advertised to the others

    def torchrun_flags(self) -> list[str]:
        conf = f"is_host={int(self.is_host)},join_timeout={self.join_timeout}"
        flags = ["--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}",
                 f"--rdzv-conf={conf}", f"--max-restarts={self.max_restarts}"]
        return flags + ([f"--local-addr={self.local_addr}"] if self.local_addr else [])

    def env(self) -> dict[str, str]:
        env = {"DOCKYARD_RENDEZVOUS": json.dumps({"backend": "c10d", "endpoint": self.endpoint, "id": self.run_id,
                                                  "join_timeout": self.join_timeout, "iface": self.iface,
                                                  "local_addr": self.local_addr})}
        if self.iface:
            env |= {"GLOO_SOCKET_IFNAME": self.iface, "NCCL_SOCKET_IFNAME": self.iface}
        return env


def rendezvous(*, master_addr: str, master_port: int, node_rank: int, run_id: str, join_timeout: int,
               max_restarts: int, iface: str = "", routes: dict | None = None) -> Rendezvous:
    """The rendezvous of this node. `routes` (tests): what `route_to` would find, instead of asking `ip`."""
    if not run_id:
        raise DockyardError("--nodes > 1 needs --run-id, the same on every node: it names the rendezvous and the "
                            "shared run folder (e.g. --run-id=zero2-exp1 on each node)")
    if join_timeout < 1:
        raise DockyardError(f"--join-timeout must be at least 1 second (got {join_timeout})")
    if max_restarts < 0:
        raise DockyardError(f"--max-restarts must be 0 or more (got {max_restarts})")
    found = routes if routes is not None else route_to(master_addr)
    if iface and found.get("iface") != iface:
        found = {"iface": iface, "addr": interface_address(iface)}
    return Rendezvous(endpoint=f"{master_addr}:{master_port}", run_id=run_id, is_host=node_rank == 0,
                      join_timeout=join_timeout, max_restarts=max_restarts, iface=found.get("iface", ""),
                      local_addr=found.get("addr", ""))


def _ip_json(*args: str) -> list[dict]:
    try:
        p = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        raise DockyardError("`ip` (iproute2) not found: install it, or give --iface=NAME") from None
    if p.returncode != 0:
        raise DockyardError(f"`ip {' '.join(args)}` failed: {p.stderr.strip()}")
    return json.loads(p.stdout or "[]")


def resolve_address(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise DockyardError(f"cannot resolve {host!r} ({e}): give node 0's IP address, or fix name resolution "
                            "(the same name must resolve on every node)") from None


def route_to(host: str) -> dict[str, str]:
    """The interface this node reaches `host` through, and this node's address on it. Node 0 reaches itself
    through `lo`: then the interface that holds the address."""
    addr = resolve_address(host)
    if ipaddress.ip_address(addr).is_loopback:
        raise DockyardError(f"--master-addr {host} is a loopback address: the other nodes cannot reach it; "
                            "give node 0's address on the network the nodes share")
    for link in _ip_json("addr"):
        for a in link.get("addr_info", []):
            if a.get("local") == addr:
                return {"iface": link["ifname"], "addr": addr}
    routes = _ip_json("route", "get", addr)
    if not routes:
        raise DockyardError(f"no route to {host} ({addr}): check the network, or give --iface=NAME")
    return {"iface": routes[0].get("dev", ""), "addr": routes[0].get("prefsrc", "")}


def interface_address(iface: str) -> str:
    for link in _ip_json("addr", "show", "dev", iface):
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                return a["local"]
    raise DockyardError(f"--iface {iface}: no IPv4 address on it (see `ip addr`)")


def infiniband_flags(root: Path = INFINIBAND) -> list[str]:
    """`docker run` flags that give NCCL the InfiniBand/RoCE devices (else it silently falls back to TCP)."""
    if not root.is_dir():
        return []
    devices = sorted(p for p in root.iterdir() if not p.is_dir())
    if not devices:
        return []
    return [f for d in devices for f in ("--device", str(d))] + ["--cap-add", "IPC_LOCK"]


def node_command(*, index: str, nnodes: str | int, nproc: str | int, endpoint: str, entry: str, run_id: str,
                 local_addr: str = "", join_timeout: int = JOIN_TIMEOUT, max_restarts: int = 0) -> str:
    """The shell line one node runs when a scheduler starts every node at once and numbers them (Slurm's
    SLURM_NODEID, an Indexed Job's JOB_COMPLETION_INDEX): torchrun with the same c10d rendezvous `invoke run`
    gives a node, the node numbered 0 hosting the store. `index`, `endpoint`, `run_id` and `local_addr` may be
    shell expressions, expanded on each node, each in double quotes: so they are ours ($VAR, ${...}), and a user's
    value reaches them through a variable or checked to hold no shell character (a Kubernetes name); `entry` is
    what follows torchrun's flags (already shell words)."""
    rdzv = {"backend": "c10d", "endpoint": endpoint, "id": run_id, "join_timeout": join_timeout}
    if local_addr:
        rdzv["local_addr"] = local_addr
    flags = [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
             f"--rdzv-id={run_id}", f"--rdzv-conf=is_host=$(( {index} == 0 )),join_timeout={join_timeout}",
             f"--max-restarts={max_restarts}", *([f"--local-addr={local_addr}"] if local_addr else [])]
    # Each in double quotes: the expressions expand on the node, and what they expand to stays one word.
    return (f"export DOCKYARD_NODE_RANK={_expanding(str(index))} DOCKYARD_RENDEZVOUS={_expanding(json.dumps(rdzv))}; "
            f"exec torchrun {' '.join(_expanding(f) for f in flags)} {entry}")


def _expanding(text: str) -> str:
    """`text` as one double-quoted shell word in which $VAR, ${...} and $(( )) still expand."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
