"""`invoke doctor --peer=HOST`: can this node train together with HOST? Run it on each node, naming node 0.

From this node: the interface that routes to the peer (the one NCCL/gloo will use), whether the rendezvous port
answers, InfiniBand devices here and there, the peer's /dev/shm, and whether both engines hold the same image.
The peer is reached through the `ssh` setting (its ~/.ssh/config applies: aliases, keys, ProxyJump).
"""

from __future__ import annotations

import errno
import ipaddress
import select
import shlex
import socket
import subprocess
from collections.abc import Callable

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
UNRESOLVED = "give node 0's IP address, or make its name resolve on this node (DNS or /etc/hosts)"


def diagnose(settings: Settings, peer: str, port: int = 29500) -> list[Check]:
    r = parse_peer(peer)
    image = _image(settings)
    address = ssh_hostname(settings, r.host)
    checks = [check_route(address)]
    checks.append(check_port(address, port, lambda: listen_there(settings, r, image, address, port)))
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
    try:
        local_id = (engine.image_inspect(settings, image) or {}).get("Id", "")
    except DockyardError:  # no engine here: the image check says it is not here, doctor's own check says why
        local_id = ""
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
        found = multinode.route_to(address, "--peer")
    except DockyardError as e:
        return Check("peer route", FAIL, str(e), "give a peer address on the network the nodes share")
    return Check("peer route", PASS, f"{address} through {found['iface']}, this node's address {found['addr']} "
                                     f"(invoke run uses it for NCCL/gloo; --iface to choose another)")


def check_port(address: str, port: int, probe: Callable[[], str] | None = None) -> Check:
    """Whether this node reaches node 0's rendezvous port. Silence is a firewall that drops. A refusal is normal
    before node 0 starts `invoke run`, but a firewall that rejects refuses too: `probe` then opens a listener on
    the peer for a moment and connects again (listen_there), which tells the two apart."""
    refused = connect(address, port)
    if refused is None:
        return Check("rendezvous port", PASS, f"{address}:{port} accepts connections (a run is listening)")
    dropped = f"a firewall drops it: open TCP {port} on node 0, and TCP between the nodes for NCCL/gloo"
    if refused.startswith("cannot resolve"):
        return Check("rendezvous port", FAIL, f"{address}:{port}: {refused}", UNRESOLVED)
    if refused != "refused":
        return Check("rendezvous port", FAIL, f"{address}:{port}: {refused} within {CONNECT_TIMEOUT} s", dropped)
    said = probe() if probe else ""
    idle = f"{address}:{port} refused the connection: no run listens there yet (normal until node 0 starts `invoke run`)"
    if said == "reached":
        return Check("rendezvous port", PASS, f"{idle}, and a listener doctor opened there for a moment was reached "
                                              "from here")
    if said == "refused":
        return Check("rendezvous port", FAIL, f"{address}:{port} refused the connection even while a listener was "
                                              "open there: a firewall rejects it",
                     f"open TCP {port} on node 0 (a REJECT rule refuses it as if nothing listened), and TCP between "
                     "the nodes for NCCL/gloo")
    if said.startswith("dropped"):
        return Check("rendezvous port", FAIL, f"{address}:{port}: no answer while a listener was open there", dropped)
    return Check("rendezvous port", PASS, idle + (f"; whether a firewall rejects it is not known: {said}" if said else ""))


def connect(address: str, port: int) -> str | None:
    """None when a connection is made; "refused", or why not."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT):
            return None
    except ConnectionRefusedError:
        return "refused"
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: an empty label or one past 63 characters
        return f"cannot resolve {address!r} here ({getattr(e, 'strerror', None) or e})"
    except OSError as e:
        return "no answer" if isinstance(e, TimeoutError) or e.errno == errno.ETIMEDOUT else str(e)


# Listens on every address of the peer at the port given and says so; then waits for one connection, at most a few
# seconds, and less once its stdin closes (doctor is done): node 0's rendezvous port is not held longer than needed.
# The connection is accepted and held until doctor closes it: one left in the queue as the listener exits is reset.
LISTENER = """
import os, select, socket, sys
port = int(sys.argv[1])
try:
    if socket.has_dualstack_ipv6():
        s = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    else:
        s = socket.create_server(("", port))
except OSError as e:
    print("taken", os.strerror(e.errno or 0), flush=True)
    sys.exit()
print("listening", flush=True)
if s in select.select([s, sys.stdin], [], [], %d)[0]:
    c = s.accept()[0]  # closed unaccepted, the connection would be reset before doctor's connect() returned
    c.settimeout(5)
    try:
        c.recv(1)  # until doctor closes its end
    except OSError:
        pass
"""
LISTEN_WAIT = 30  # seconds for ssh to log in and the listener to start (in a container: a few more)


def listen_there(settings: Settings, r: remote.Remote, image: str, address: str, port: int) -> str:
    """Open a listener on the peer at `port` for a moment (its python3, else the image's, on the host's network)
    and connect to it from here: "reached", "refused" (a firewall rejects), "dropped ..." (a firewall drops), or
    why it could not be told."""
    code = shlex.quote(LISTENER % (CONNECT_TIMEOUT * 3))
    script = (f"if command -v python3 >/dev/null 2>&1; then exec python3 -c {code} {port}; fi\n"
              f"if docker image inspect {shlex.quote(image)} >/dev/null 2>&1; then exec docker run --rm -i --network "
              f"host --entrypoint python3 {shlex.quote(image)} -c {code} {port}; fi\n"
              "echo none\n")
    try:
        p = subprocess.Popen(remote.ssh_argv(settings, r, script), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    except OSError as e:
        return f"ssh could not start ({e.strerror or e})"
    try:
        said, _, why = _line(p, LISTEN_WAIT).partition(" ")
        if said == "listening":
            refused = connect(address, port)
            return "reached" if refused is None else refused if refused == "refused" else f"dropped ({refused})"
        if said == "taken":
            return f"port {port} is taken there ({why})"
        if said == "none":
            return "the peer has neither python3 nor the image to listen with"
        return "no listener could be opened there"
    finally:
        p.stdin.close()  # the listener stops at once
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _line(p: subprocess.Popen, timeout: float) -> str:
    """The first line the process prints within `timeout` seconds, stripped; "" when none."""
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().strip() if ready else ""


def peer_facts(settings: Settings, r: remote.Remote, image: str) -> dict[str, str] | None:
    script = ("echo shm_kib=$(df -Pk /dev/shm | tail -n 1 | awk '{print $2}'); "
              "echo ib=$(ls /dev/infiniband 2>/dev/null); "
              f"echo image=$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} 2>/dev/null)")
    p = remote.run_there(settings, r, script, "asking its shm, InfiniBand and image", check=False)
    if p.returncode != 0:
        return None
    return dict(line.partition("=")[::2] for line in p.stdout.splitlines() if "=" in line)


def check_peer_shm(kib: str) -> Check:
    size = int(kib) * 1024 if kib.isascii() and kib.isdigit() else 0
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
