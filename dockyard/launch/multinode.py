"""Several nodes: finding the rendezvous (node.Rendezvous), the network interface the collectives use, InfiniBand
devices. How a node's torchrun line spells it is dockyard/launch/node.py's.

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
import sys
from pathlib import Path

from dockyard import engine
from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.launch import node
from dockyard.launch.node import Rendezvous

INFINIBAND = Path("/dev/infiniband")


def rendezvous(*, master_addr: str, master_port: int, node_rank: int, run_id: str, join_timeout: int,
               max_restarts: int, recipe: str, iface: str = "", routes: dict | None = None) -> Rendezvous:
    """The rendezvous of this node. `recipe`: the one the user gave, for the run id an error suggests; `routes`
    (tests): what `route_to` would find, instead of asking `ip`."""
    if not run_id:
        raise DockyardError("--nodes > 1 needs --run-id, the same on every node: it names the rendezvous and the "
                            f"shared run folder (e.g. --run-id={runfolder.recipe_name(recipe)}-exp1 on each node)")
    node.check_restarts(max_restarts, join_timeout)
    found = routes if routes is not None else route_to(master_addr)
    reached = found.get("addr")  # this node's address towards --master-addr: that address, where it is this node's
    if iface and found.get("iface") != iface:
        found = {"iface": iface, "addr": interface_address(iface)}
    if found.get("addr") and ipaddress.ip_address(found["addr"]).is_loopback:
        raise DockyardError(f"--iface {found.get('iface')} is a loopback interface ({found['addr']}): the other nodes "
                            "cannot reach it; give this node's interface on the network the nodes share (`ip addr`)")
    if node_rank == 0 and reached and resolve_address(master_addr) != reached:
        # node 0 hosts the store on this machine; the others look for it at --master-addr (said, not refused: a
        # forwarded or virtual address may reach it)
        print(f"warning: --master-addr {master_addr} is not an address of this node, yet --node-rank=0 hosts the "
              f"rendezvous here: the other nodes will look for it there; give node 0 its own address "
              f"({found['addr']} on {found.get('iface') or 'its interface'}), or, where this is another node, its own "
              "--node-rank", file=sys.stderr)
    return Rendezvous(endpoint=f"{master_addr}:{master_port}", run_id=run_id, is_host=node_rank == 0,
                      join_timeout=join_timeout, max_restarts=max_restarts, iface=found.get("iface", ""),
                      local_addr=found.get("addr", ""))


def _ip_json(*args: str) -> list[dict]:
    if not engine.which("ip"):
        raise DockyardError("`ip` (iproute2) not found: install it, or give --iface=NAME")
    p = engine.run(["ip", "-j", *args], capture=True, check=False, quiet=True, timeout=10)
    if p.returncode != 0:
        raise DockyardError(f"`ip {' '.join(args)}` failed: {p.stderr.strip()}")
    return json.loads(p.stdout or "[]")


def resolve_address(host: str, flag: str = "--master-addr") -> str:
    """`host`'s address: an IP address as it is, a name's IPv4 address, or its IPv6 one where it has none (an IPv6-only
    cluster's names, which torchrun and gloo resolve alike). An address in a URL's brackets, or followed by a port,
    is said as such (torchrun's habit of HOST:PORT): they were "cannot resolve '10.0.0.1:29500'"."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if host.startswith("[") and host.endswith("]") and _an_ip(host[1:-1]):
        raise DockyardError(f"{flag} {host}: give the IPv6 address without brackets ({flag}={host[1:-1]})")
    name, colon, port = host.rpartition(":")
    if colon and port.isascii() and port.isdecimal() and (_an_ip(name.strip("[]")) or ":" not in name) and name:
        alone = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        more = f", and the port as --master-port={int(port)}" if flag == "--master-addr" else ""
        whose = "node 0's address" if flag == "--master-addr" else "the address"
        raise DockyardError(f"{flag} {host}: give {whose} alone ({flag}={alone}){more}")
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:  # UnicodeError: an empty label or one past 63 characters (node0..cluster)
        raise DockyardError(f"cannot resolve {host!r} ({getattr(e, 'strerror', None) or e}): give node 0's IP "
                            "address, or fix name resolution (the same name must resolve on every node)") from None
    # IPv4 where the name has it (as gethostbyname, which knew no other); a scope (%eth0) is no part of the address
    sockaddr = min(found, key=lambda f: f[0] != socket.AF_INET)[4]
    return str(sockaddr[0]).partition("%")[0]


def _an_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def route_to(host: str, flag: str = "--master-addr") -> dict[str, str]:
    """The interface this node reaches `host` (given as `flag`) through, and this node's address on it. Node 0
    reaches itself through `lo`: then the interface that holds the address."""
    addr = resolve_address(host, flag)
    ip = ipaddress.ip_address(addr)
    ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip.is_unspecified:  # a listening socket's "every address", which no node dials
        raise DockyardError(f"{flag} {host} means any address, none the other nodes can dial: give node 0's "
                            "address on the network the nodes share (`ip addr` on node 0)")
    if ip.is_loopback:
        raise DockyardError(f"{flag} {host} is a loopback address: the other nodes cannot reach it; "
                            "give node 0's address on the network the nodes share")
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise DockyardError(f"{flag} {host} is a multicast or broadcast address, no one node's: give node 0's "
                            "address on the network the nodes share (`ip addr` on node 0)")
    for link in _ip_json("addr"):
        for a in link.get("addr_info", []):
            if a.get("local") == addr:
                return {"iface": link["ifname"], "addr": addr}
    try:
        routes = _ip_json("route", "get", addr)
    except DockyardError as e:  # ip's "RTNETLINK answers: Network is unreachable": a mistyped address, mostly
        routes, said = [], str(e).rpartition(": ")[2]
    else:
        said = "no route"
    if not routes:
        whose = "node 0's address" if flag == "--master-addr" else "an address"
        raise DockyardError(f"{flag} {host}: this node has no route to {addr} ({said}): give {whose} on the network "
                            "the nodes share (`ip -4 addr` there shows it; `ip route` here, the networks this node "
                            "reaches), or --iface=NAME")
    return {"iface": routes[0].get("dev", ""), "addr": routes[0].get("prefsrc", "")}


def interface_address(iface: str) -> str:
    """The interface's IPv4 address. `ip addr show dev eth0:anything` answers for eth0, but gloo and NCCL look the
    name up as given (getifaddrs: an interface, or an address's label such as eth0:1) and failed at run time."""
    named = False
    for link in _ip_json("addr", "show"):  # every interface: `dev NAME` of none there is ip's error, not ours
        for a in link.get("addr_info", []):
            if iface in (link.get("ifname"), a.get("label")):
                named = True
                if a.get("family") == "inet":
                    return a["local"]
    if not named:
        raise DockyardError(f"--iface {iface}: no interface (nor address label) of that name here: give one that "
                            "`ip -brief addr` lists")
    raise DockyardError(f"--iface {iface}: no IPv4 address on it (see `ip addr`)")


def infiniband_flags(root: Path = INFINIBAND) -> list[str]:
    """`docker run` flags that give NCCL the InfiniBand/RoCE devices (else it silently falls back to TCP)."""
    if not root.is_dir():
        return []
    devices = sorted(p for p in root.iterdir() if not p.is_dir())
    if not devices:
        return []
    return [f for d in devices for f in ("--device", str(d))] + ["--cap-add", "IPC_LOCK"]
