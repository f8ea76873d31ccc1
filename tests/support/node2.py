"""A second, air-gapped node on this machine, for the transport tests.

A network namespace reachable only over a veth pair with addresses in 198.18.0.0/15 (the range for
benchmarking networks: nothing real lives there), holding its own dockerd (own data root, exec root
and socket; no bridge, no route out) and an sshd that accepts one key made for the test. Remote
commands get the node's engine through `SetEnv DOCKER_HOST=...` in the sshd config.

Every process is started here and stopped here by its pid; `stop()` also removes the namespace, the
veth pair, any mounts under the node's folder, and the folder.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DOCKER = "/usr/bin/docker"
RANGE = ipaddress.ip_network("198.18.0.0/15")


def _sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], check=False, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        # What the command said is what explains a failure (a full disk, a refused archive): keep it.
        raise AssertionError(
            f"exit {p.returncode}: {' '.join(map(str, argv))}\n"
            f"stdout (end): {p.stdout[-3000:]}\nstderr (end): {p.stderr[-3000:]}"
        )
    return p


@dataclass
class Node:
    tag: str
    base: Path
    netns: str
    veth: str
    host_addr: str
    addr: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def sock(self) -> Path:
        return self.base / "docker.sock"

    @property
    def ssh_config(self) -> Path:
        return self.base / "ssh_config"

    @property
    def alias(self) -> str:
        return f"node2-{self.tag}"

    @property
    def ssh_command(self) -> str:
        """The `ssh` setting that reaches this node by its alias (what a user's ~/.ssh/config does)."""
        return f"ssh -F {self.ssh_config}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.sock}"}

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """The node's engine, reached through its socket (for checks; tests act through ssh). Bounded: an engine
        that accepts and never answers fails the call, not the whole suite."""
        return _sh(DOCKER, *args, check=check, env=self.env, timeout=timeout)

    def ssh(self, script: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a shell script on the node over ssh, as a user would."""
        return _sh("ssh", "-F", self.ssh_config, self.alias, script, check=check, timeout=timeout)

    def image_id(self, ref: str) -> str | None:
        p = self.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        return p.stdout.strip() if p.returncode == 0 else None

    def wipe(self) -> None:
        """Remove every container and image on the node: an empty node."""
        ids = self.docker("ps", "-aq").stdout.split()
        if ids:
            self.docker("rm", "-f", *ids)
        ids = self.docker("image", "ls", "-aq").stdout.split()
        if ids:
            self.docker("image", "rm", "-f", *sorted(set(ids)), check=False)

    def limit_rate(self, mbit: int) -> None:
        """Slow the link down (a token bucket on the host's end of the veth), to interrupt copies."""
        _sh("tc", "qdisc", "replace", "dev", self.veth, "root", "tbf", "rate", f"{mbit}mbit",
            "burst", "64kb", "latency", "400ms")

    def unlimit_rate(self) -> None:
        _sh("tc", "qdisc", "del", "dev", self.veth, "root", check=False)

    def write_ssh_config(self, path: Path, identity: Path | None) -> Path:
        """An ssh config that reaches the node by its alias, as a user's ~/.ssh/config does: with
        `identity` as its key, or naming no key at all (then only `ssh -i KEY` of an authorised key gets in)."""
        path.write_text(
            f"Host {self.alias}\n  HostName {self.addr}\n  User root\n"
            + (f"  IdentityFile {identity}\n" if identity else "")
            + f"  IdentitiesOnly yes\n  UserKnownHostsFile {self.base / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  ConnectTimeout 10\n")
        return path

    @contextlib.contextmanager
    def only_key(self, public_key: Path):
        """Authorise only this key while the block runs (sshd reads the file at every login), then the
        usual one again."""
        keys = self.base / "authorized_keys"
        usual = keys.read_text()
        keys.write_text(public_key.read_text())
        try:
            yield
        finally:
            keys.write_text(usual)


def _free_subnet(text_order_flipped: bool = False) -> ipaddress.IPv4Network:
    """A free /30: this host gets its first address, the node the second. `text_order_flipped`: the pair is x.9
    and x.10, which torchrun's rendezvous ranks by text (x.10 first), putting global rank 0 on the node."""
    used = _sh("ip", "-4", "-o", "addr").stdout
    while True:
        offset = 256 * random.randrange(RANGE.num_addresses // 256) + 8 if text_order_flipped \
            else 4 * random.randrange(RANGE.num_addresses // 4)
        net = ipaddress.ip_network((int(RANGE.network_address) + offset, 30))
        if str(net.network_address)[:-1] not in used and all(str(h) not in used for h in net.hosts()):
            return net


HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# dockyard test node"


def _name_in_hosts(node: Node, named: bool = True) -> None:
    """Name the pair's two addresses in /etc/hosts while the node is up (`named`), or no longer. torch's store and
    gloo look up by name every peer address they meet: unnamed, those lookups went to this machine's DNS server, and
    the tests send nothing beyond loopback and their own namespaces. Rewritten in place, under a lock: /etc/hosts may
    be a mount, and nodes of other test processes come and go beside this one. Lines a killed run left, for a node
    whose namespace is gone, go too."""
    import fcntl

    with open("/tmp/dockyard-test-hosts.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        alive = set(_sh("ip", "netns", "list", check=False).stdout.split())
        lines = HOSTS.read_text(errors="surrogateescape").removesuffix("\n").split("\n")  # its bytes, as they were
        kept = [line for line in lines
                if HOSTS_MARK not in line or (line.split()[-1] in alive and line.split()[-1] != node.netns)]
        if named:  # torch's store listens on IPv6: it meets its peers at their IPv4-mapped addresses
            kept += [f"{prefix}{addr} dyn2-{who}-{node.tag}{suffix} {HOSTS_MARK} {node.netns}"
                     for who, addr in (("host", node.host_addr), ("node", node.addr))
                     for prefix, suffix in (("", ""), ("::ffff:", "-v4mapped"))]
        text = "".join(line + "\n" for line in kept)
        with contextlib.suppress(OSError), HOSTS.open("r+", errors="surrogateescape") as f:  # read-only: DNS, as before
            f.write(text)
            f.truncate()


def _wait(what: str, ok, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):  # not answering yet: asked again
            if ok():
                return
        time.sleep(0.5)
    raise RuntimeError(f"node2: {what} did not come up within {timeout:.0f} s")


def start(text_order_flipped: bool = False) -> Node:
    tag = f"{os.getpid() % 100000:05d}{random.randrange(1000):03d}"
    base = Path(f"/tmp/dyn2-{tag}")  # short: unix socket paths under the exec root must stay < 108
    base.mkdir(mode=0o700)
    net = _free_subnet(text_order_flipped)
    host_addr, addr = (str(h) for h in net.hosts())
    node = Node(tag=tag, base=base, netns=f"dyn2-{tag}", veth=f"dy{tag[-6:]}a", host_addr=host_addr, addr=addr)
    try:
        _start(node, net)
    except BaseException:
        stop(node)
        raise
    return node


def _start(node: Node, net: ipaddress.IPv4Network) -> None:
    peer = node.veth[:-1] + "b"
    nsenter = ["nsenter", f"--net=/var/run/netns/{node.netns}"]
    _sh("ip", "netns", "add", node.netns)
    _sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer)
    _sh("ip", "link", "set", peer, "netns", node.netns)
    _sh("ip", "addr", "add", f"{node.host_addr}/{net.prefixlen}", "dev", node.veth)
    _sh("ip", "link", "set", node.veth, "up")
    _sh(*nsenter, "ip", "addr", "add", f"{node.addr}/{net.prefixlen}", "dev", peer)
    _sh(*nsenter, "ip", "link", "set", peer, "up")
    _sh(*nsenter, "ip", "link", "set", "lo", "up")
    _name_in_hosts(node)

    b = node.base
    # `ip netns exec` would give dockerd a mount namespace that hides the cgroup mounts: nsenter --net.
    node.procs["dockerd"] = subprocess.Popen(
        [*nsenter, "dockerd", "--data-root", b / "data", "--exec-root", b / "exec", "-H", f"unix://{node.sock}",
         "--pidfile", b / "docker.pid", "--bridge=none", "--iptables=false", "--ip-masq=false",
         "--containerd-namespace", f"dyn2-{node.tag}", "--containerd-plugins-namespace", f"dyn2p-{node.tag}"],
        stdout=open(b / "dockerd.log", "wb"), stderr=subprocess.STDOUT)

    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", b / "host_key")
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dockyard-test", "-f", b / "key")
    shutil.copy(b / "key.pub", b / "authorized_keys")
    (b / "known_hosts").write_text(f"{node.addr} {(b / 'host_key.pub').read_text().split(' ')[0]} "
                                   f"{(b / 'host_key.pub').read_text().split(' ')[1]}\n")
    (b / "sshd_config").write_text(
        f"ListenAddress {node.addr}\nPort 22\nHostKey {b / 'host_key'}\nPidFile {b / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {b / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"SetEnv DOCKER_HOST=unix://{node.sock}\nSubsystem sftp internal-sftp\n")
    node.write_ssh_config(node.ssh_config, b / "key")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
    node.procs["sshd"] = subprocess.Popen(
        [*nsenter, "/usr/sbin/sshd", "-D", "-e", "-f", b / "sshd_config"],
        stdout=open(b / "sshd.log", "wb"), stderr=subprocess.STDOUT)

    _wait("dockerd", lambda: node.docker("info", check=False, timeout=10).returncode == 0)
    _wait("sshd", lambda: node.ssh("docker info >/dev/null", check=False, timeout=20).returncode == 0)


@contextlib.contextmanager
def silent_host():
    """A network namespace where one address of 198.18.0.0/15 is routed but never answers: packets to it go out
    of a veth (both ends inside the namespace) to a link address nobody has, and are dropped, as on a link to a
    node that is down. Yields the command prefix that runs a program in the namespace, and the address."""
    tag = f"{os.getpid() % 100000:05d}{random.randrange(1000):03d}"
    netns, net = f"dysil-{tag}", _free_subnet()
    here, there = (str(h) for h in net.hosts())
    inside = ["ip", "-n", netns]
    try:
        _sh("ip", "netns", "add", netns)
        _sh(*inside, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        _sh(*inside, "addr", "add", f"{here}/{net.prefixlen}", "dev", "v0")
        for link in ("lo", "v0", "v1"):
            _sh(*inside, "link", "set", link, "up")
        _sh(*inside, "neigh", "add", there, "lladdr", "02:00:00:00:00:02", "dev", "v0", "nud", "permanent")
        yield ["nsenter", f"--net=/var/run/netns/{netns}"], there
    finally:
        _sh("ip", "netns", "del", netns, check=False)


def _stop_process(p: subprocess.Popen, timeout: float) -> None:
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def stop(node: Node) -> None:
    if "sshd" in node.procs:
        _stop_process(node.procs["sshd"], 10)
    if "dockerd" in node.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):  # a wedged engine is stopped all the same
            ids = node.docker("ps", "-aq", check=False, timeout=60).stdout.split()
            if ids:  # containers first, so dockerd stops quickly and leaves no mounts
                node.docker("rm", "-f", *ids, check=False, timeout=120)
        _stop_process(node.procs["dockerd"], 60)
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in reversed(mounts):
        if m == str(node.base) or m.startswith(str(node.base) + "/"):
            _sh("umount", "-l", m, check=False)
    _sh("ip", "netns", "del", node.netns, check=False)
    _sh("ip", "link", "del", node.veth, check=False)
    _name_in_hosts(node, named=False)
    shutil.rmtree(node.base, ignore_errors=True)
