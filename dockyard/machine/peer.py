"""`invoke doctor --peer=HOST`: can this node train together with HOST? Run it on each node, naming node 0.

From this node: the interface that routes to the peer (the one NCCL/gloo will use), whether the rendezvous port
answers, InfiniBand devices here and there, the peer's /dev/shm, and whether both engines hold the same image.
The peer is reached through the `ssh` setting (its ~/.ssh/config applies: aliases, keys, ProxyJump).
"""

from __future__ import annotations

import errno
import ipaddress
import shlex
import socket

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.common.units import GIB
from dockyard.images import variants
from dockyard.launch import multinode
from dockyard.machine.check import FAIL, PASS, WARN, Check
from dockyard.settings import Settings
from dockyard.transport import remote

SHM_MIN = GIB  # NCCL and DeepSpeed's shared-memory ops need more than Docker's 64 MB
CONNECT_TIMEOUT = 5


def diagnose(settings: Settings, peer: str, port: int = 29500) -> list[Check]:
    r = parse_peer(peer)
    image = _image(settings)
    address = ssh_hostname(settings, r.host)
    checks = [check_route(address)]
    checks.append(check_port(address, port))
    try:
        facts = peer_facts(settings, r, image)
    except DockyardError as e:  # ssh itself failed: the report goes on, with ssh's reason
        facts, why = None, str(e).partition(". ")[0]
    else:
        why = f"`{settings.ssh} {r.host}` did not answer"
    if facts is None:
        return checks + [Check("peer ssh", FAIL, why,
                               "check the ssh setting and ~/.ssh/config: doctor, ship and save --thin-for use it")]
    local_ib = [d.name for d in multinode.INFINIBAND.iterdir()] if multinode.INFINIBAND.is_dir() else []
    local_id = (engine.image_inspect(settings, image) or {}).get("Id", "")
    return checks + [check_peer_shm(facts.get("shm_kib", "")),
                     check_infiniband(local_ib, facts.get("ib", "").split()),
                     check_same_image(image, local_id, facts.get("image", ""), r.host)]


def parse_peer(peer: str) -> remote.Remote:
    """--peer: [user@]host (an ssh alias, a name, an IPv4 or IPv6 address, bracketed or not), or
    ssh://[user@]host[:port] for another ssh port. `host:2222` was read as a folder and the port silently dropped,
    and an IPv6 address cut at its first colon."""
    if peer.startswith("ssh://"):
        return remote.parse_ssh_url(peer)
    user, at, host = peer.rpartition("@")
    host = host.removeprefix("[").removesuffix("]")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise DockyardError(f"--peer={peer!r}: expected [user@]host; for another ssh port give "
                                "ssh://[user@]host:PORT, or a Host in ~/.ssh/config with its Port") from None
    if not host:
        raise DockyardError(f"--peer={peer!r}: expected [user@]host")
    return remote.Remote(user + at + host)


def _image(settings: Settings) -> str:
    try:
        chosen, _ = variants.resolve(settings, "auto")
    except DockyardError:
        chosen = variants.all_variants(settings)["cpu"]
    return variants.tag(settings, chosen)


def ssh_hostname(settings: Settings, host: str) -> str:
    """The address an ssh alias stands for (`ssh -G`), so the network checks test what ssh reaches."""
    p = engine.run([*shlex.split(settings.ssh), "-G", host], capture=True, check=False, quiet=True)
    for line in p.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname":
            return value
    return host.rpartition("@")[2]


def check_route(address: str) -> Check:
    try:
        found = multinode.route_to(address)
    except DockyardError as e:
        return Check("peer route", FAIL, str(e), "give a peer address on the network the nodes share")
    return Check("peer route", PASS, f"{address} through {found['iface']}, this node's address {found['addr']} "
                                     f"(invoke run uses it for NCCL/gloo; --iface to choose another)")


def check_port(address: str, port: int) -> Check:
    """A refused connection is an answer (nothing listens until node 0 starts); silence is a firewall."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT):
            return Check("rendezvous port", PASS, f"{address}:{port} accepts connections (a run is listening)")
    except ConnectionRefusedError:
        return Check("rendezvous port", PASS, f"{address}:{port} answers; nothing listens yet (normal until node 0 "
                                              "starts `invoke run`)")
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) or e.errno == errno.ETIMEDOUT else str(e)
        return Check("rendezvous port", FAIL, f"{address}:{port}: {why} within {CONNECT_TIMEOUT} s",
                     f"a firewall drops it: open TCP {port} on node 0, and TCP between the nodes for NCCL/gloo")


def peer_facts(settings: Settings, r: remote.Remote, image: str) -> dict[str, str] | None:
    script = ("echo shm_kib=$(df -Pk /dev/shm | tail -n 1 | awk '{print $2}'); "
              "echo ib=$(ls /dev/infiniband 2>/dev/null); "
              f"echo image=$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} 2>/dev/null)")
    p = remote.run_there(settings, r, script, f"asking {r.host}", check=False)
    if p.returncode != 0:
        return None
    return dict(line.partition("=")[::2] for line in p.stdout.splitlines() if "=" in line)


def check_peer_shm(kib: str) -> Check:
    size = int(kib) * 1024 if kib.isdigit() else 0
    if size >= SHM_MIN:
        return Check("peer shm", PASS, f"/dev/shm {size / GIB:.1f} GiB (runs share the host's: --ipc=host)")
    return Check("peer shm", WARN, f"/dev/shm {size / 2**20:.0f} MiB on the peer",
                 "NCCL/DeepSpeed need more: enlarge /dev/shm there (mount -o remount,size=16G /dev/shm)")


def check_infiniband(here: list[str], there: list[str]) -> Check:
    if here and there:
        return Check("infiniband", PASS, f"here: {' '.join(sorted(here))}; peer: {' '.join(sorted(there))} "
                                         "(passed into GPU runs with IPC_LOCK)")
    if not here and not there:
        return Check("infiniband", PASS, "no /dev/infiniband on either node: NCCL uses TCP sockets")
    return Check("infiniband", WARN, f"/dev/infiniband on {'this node' if here else 'the peer'} only",
                 "load the RDMA drivers (rdma-core, the NIC's OFED) on the other node, or NCCL uses TCP between them")


def check_same_image(image: str, here: str, there: str, peer: str) -> Check:
    if here and here == there:
        return Check("same image", PASS, f"{image} is {here[:19]} on both nodes")
    if not here:
        return Check("same image", FAIL, f"{image} is not on this node", "invoke build (or invoke load)")
    if not there:
        return Check("same image", FAIL, f"{image} is not on {peer}", f"invoke ship --image={image} --to={peer}")
    return Check("same image", FAIL, f"{image} differs: {here[:19]} here, {there[:19]} on {peer}",
                 f"the nodes must run the same image: invoke ship --image={image} --to={peer}")
