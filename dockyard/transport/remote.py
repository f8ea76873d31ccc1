"""Another node, over OpenSSH: where it is, commands run there, its state and its layer inventory.

Everything goes through the user's own `ssh` (the `ssh` setting), so ~/.ssh/config, keys, agents and
ProxyJump all apply. Nothing but sh, coreutils and docker is needed on the node.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.gpus import Host
from dockyard.settings import Settings
from dockyard.transport import inventory

SEP = "@@dockyard@@"


@dataclass(frozen=True)
class Remote:
    host: str           # [user@]host, or an alias from the ssh config
    dir: str = ""
    port: int = 0
    identity: str = ""

    def __post_init__(self) -> None:
        # ssh reads a destination word that starts with '-' as an option (`-oProxyCommand=...` runs a command
        # here); every Remote is checked, whichever flag named it
        if self.host.startswith("-") or self.host.rpartition("@")[2].startswith("-"):
            raise DockyardError(f"{self.host!r}: a host cannot start with '-' (ssh would read it as an option); "
                                "give [user@]host, or an alias from your ssh config")
        user, at, name = self.host.rpartition("@")
        if not name or (at and not user):  # ssh's usage text, or a lookup of "", was said as the node's failure
            raise DockyardError(f"{self.host!r}: {'no host' if not name else 'no user'} before or after '@': give "
                                "[user@]host, or an alias from your ssh config")

    def where(self, name: str = "") -> str:
        return f"{self.host}:{self.dir}" + (f"/{name}" if name else "")

    @property
    def url(self) -> str:
        """ssh://[user@]host[:port], how --thin-for names a node."""
        user, at, name = self.host.rpartition("@")
        return f"ssh://{user}{at}" + (f"[{name}]" if ":" in name else name) + (f":{self.port}" if self.port else "")


def check_identity(identity: str) -> None:
    """--identity names a key file: ssh only warns of one it cannot read and tries the others, and its last words,
    said as the failure, were "Permission denied (publickey)", hiding the misspelt --identity."""
    if identity and not Path(os.path.expanduser(identity)).is_file():
        raise DockyardError(f"--identity={identity}: no such key file (give your ssh private key, e.g. "
                            "--identity=~/.ssh/id_ed25519, or leave it out for the ssh config's and agent's keys)")


def parse_to(to: str, port: int = 0, identity: str = "", need_dir: bool = True) -> Remote:
    """--to=[user@]host:/dir (the folder may be relative to the remote home, or start with ~/); with need_dir false,
    [user@]host alone."""
    address = to.rpartition("@")[2]
    if address.startswith("[") or re.match(r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:", address):
        # `2001:db8::5` read as host 2001 (glibc's 0.0.7.209) and folder db8::5; `[::1]:/x` as host `[`
        raise DockyardError(f"--to={to}: an IPv6 address, which host:/dir cannot tell from its folder: name the node "
                            "in ~/.ssh/config (Host node9, HostName the address) and give --to=node9:/dir")
    host, colon, folder = to.partition(":")
    if colon and not need_dir and host:  # the folder was left out without a word: the user looked there for a file
        raise DockyardError(f"--to={to}: a stream (--image) writes no file on the node, so it takes no folder: give "
                            f"--to={host} (a port: --port=P), or save an archive and ship it there (invoke ship "
                            f"--file=ARCHIVE --to={to})")
    if not host or (need_dir and not (colon and folder)):
        raise DockyardError(f"--to={to!r}: expected [user@]host:/dir" if need_dir else
                            f"--to={to!r}: expected [user@]host")
    return Remote(host, folder.rstrip("/") or ("/" if folder else ""), port, identity)


SSH_URL = re.compile(r"ssh://(?P<user>[^/:@\[\]]*@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^/:@\[\]]*))"
                     r"(?::(?P<port>\d+))?/?")


def parse_ssh_url(url: str) -> Remote:
    """ssh://[user@]host[:port] (what --thin-for and doctor --peer take); an IPv6 address in brackets, as in URLs."""
    m = SSH_URL.fullmatch(url)
    if m and m["v6"]:
        try:
            ipaddress.IPv6Address(m["v6"])
        except ValueError:
            m = None
    if not m:
        raise DockyardError(f"{url!r}: expected ssh://[user@]host[:port] (an IPv6 address in brackets: "
                            "ssh://[2001:db8::5]:2222)")
    port = int(m["port"] or 0)
    if m["port"] and not 1 <= port <= 65535:  # ssh's own words were "Bad port", once it ran
        raise DockyardError(f"{url!r}: port {m['port']} is not a TCP port (1-65535)")
    return Remote((m["user"] or "") + (m["v6"] or m["host"]), port=port)


# A node that does not answer fails in bounded time instead of when TCP gives up (about two minutes to connect,
# never on a link that died mid-copy). ssh keeps the first value it is given for an option, so the same `-o` in
# the `ssh` setting wins over these (they also override ~/.ssh/config, which ssh reads after the command line).
SSH_DEFAULTS = ["-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
SSH_FAILED = 255  # ssh's own exit code when it cannot connect, log in, or the link dies


def ssh_base(settings: Settings, r: Remote) -> list[str]:
    """ssh and its options, without the destination (what rsync -e takes)."""
    argv = shlex.split(settings.ssh)
    if r.port:
        argv += ["-p", str(r.port)]
    if r.identity:
        argv += ["-i", str(Path(os.path.expanduser(r.identity)))]
    return argv + SSH_DEFAULTS


def unreachable(r: Remote, stderr: str) -> DockyardError:
    """What ssh failing on its own (exit 255) says: the node, ssh's reason, and what to check."""
    reason = (stderr.strip().splitlines() or ["no answer"])[-1]
    return DockyardError(f"ssh to {r.host} failed ({reason}). Check that {r.host} is up and reachable from here, "
                         f"that its sshd answers on port {r.port or 22} and accepts your key, and the `ssh` "
                         "setting (it may hold -o ConnectTimeout=SECONDS, -F FILE, ...)")


def ssh_argv(settings: Settings, r: Remote, script: str) -> list[str]:
    """Run a POSIX sh script on the node, whatever the remote user's login shell is. `--`: nothing after it is an
    option, whatever the host word holds."""
    return [*ssh_base(settings, r), "--", r.host, sh_command(script)]


# sshd hands the command to the user's login shell (`$SHELL -c COMMAND`), and not every one leaves a single-quoted word
# as it is: csh and tcsh end it at a newline ("Unmatched '.": every multi-line script, the node's state first of all,
# so no `invoke ship` got further for a tcsh user) and read `!` as history; fish reads `\\` and `\'` in it as escapes.
MANGLED = re.compile(r"[^ -~]|[\\!]")  # anything but printable ASCII, a backslash, a `!`


def sh_command(script: str) -> str:
    """`sh -c SCRIPT` as one command line that sh, bash, dash, zsh, fish, csh and tcsh all pass to sh unchanged. A script
    with a character one of them changes goes as sh's printf %b would write it: those characters, and the ones sh's
    double quotes expand, as octal escapes (\\0ooo, a backslash no shell above reads before a digit); sh writes it back
    and runs it."""
    if not MANGLED.search(script):
        return "sh -c " + shlex.quote(script)
    text = "".join(chr(b) if 32 <= b < 127 and chr(b) not in "\\!'\"$`" else f"\\0{b:03o}"
                   for b in script.encode(errors="surrogateescape"))
    # the x kept at the end: $(...) drops the newlines a script ends with
    return "sh -c " + shlex.quote(f'_dockyard_script=$(printf %b "{text}x") && _dockyard_script=${{_dockyard_script%x}} '
                                  '&& eval "$_dockyard_script"')


def rpath(folder: str, name: str = "") -> str:
    """A remote path as a shell word; a leading ~/ stays the remote home."""
    path = f"{folder}/{name}" if name else folder
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def run_there(settings: Settings, r: Remote, script: str, what: str, check: bool = True,
              input: bytes | None = None, held: bool = False) -> subprocess.CompletedProcess:
    """A script on the node, its output captured. A failure says `{what} on {host} failed: ` and the node's last
    line on stderr, which holds the cause: the ssh command, quoted twice over, would bury it.

    `held`: ssh's stdin is a pipe this end holds open until the script has ended, for a script that stops its work
    when that pipe ends (held_open): Ctrl-C here, or a cut link, then stops it there."""
    argv = ssh_argv(settings, r, script)
    if held:
        with engine.Pipeline(argv, stdin=engine.PIPE, stdout=engine.PIPE, quiet=True, what=f"{what} on {r.host}") as s:
            out = s.stdout.read().decode(errors="replace")
            code = s.wait(check=False)[0]
            p = subprocess.CompletedProcess(argv, code, out, "\n".join(s.output(whole=True)))
    else:
        p = engine.run(argv, capture=True, check=False, quiet=True, input=input, what=f"{what} on {r.host}")
    if p.returncode == SSH_FAILED:
        raise unreachable(r, p.stderr)
    if check and p.returncode != 0:
        said = [line.strip() for line in p.stderr.splitlines() if line.strip()]
        raise DockyardError(f"{what} on {r.host} failed: "
                            + (said[-1] if said else f"exit {p.returncode}, with nothing on stderr"))
    return p


def held_open(command: str) -> str:
    """A sh line that runs the simple `command` on the node while the ssh that started it lasts (run_there's
    `held`). sshd signals nothing to a command without a terminal when its client goes: a load.sh went on unseen
    after a Ctrl-C here, then died at its next line of output and left its full-size private copy of the archive.
    Here a watcher reads ssh's stdin; its end (the client gone) sends the command SIGTERM, which load.sh traps to
    stop docker load and remove its copy. Background commands read /dev/null unless told: the watcher is given fd 3."""
    return ("exec 3<&0\n"
            f"{command} </dev/null 3<&- & p=$!\n"
            "(cat <&3 >/dev/null 2>&1; kill -TERM $p 2>/dev/null) >/dev/null 2>&1 & w=$!\n"
            "exec 3<&-\n"
            "wait $p; rc=$?\n"
            "kill $w 2>/dev/null\n"  # the command ended by itself: the watcher's kill must never come (its pid goes)
            "exit $rc\n")


def sha256_there(settings: Settings, r: Remote, name: str, have: dict[str, str]) -> str:
    """sha256 of a file in the node's folder; OpenSSL where it is there (about 4x faster than coreutils)."""
    tool = "openssl dgst -sha256 -r" if have.get("openssl") else "sha256sum"
    out = run_there(settings, r, f"{tool} < {rpath(r.dir, name)}", f"checking the sha256 of {name}").stdout
    return out.split()[0] if out.split() else ""


# --- what the node has ---------------------------------------------------------------------------

def node_state(settings: Settings, r: Remote, name: str) -> dict[str, str]:
    """The node's tools (name → path, empty when missing), free_kb in its folder, the sizes of `name` there (final)
    and of a cut copy (partial), where they exist, and its nvidia-smi's driver line (smi) and GPUs (gpus: "name,
    capability;" each), where it has a working one."""
    return parse_node_state(run_there(settings, r, node_state_script(r.dir, name),
                                      "asking which tools and how much space it has")
                            .stdout)


# the NVIDIA driver's header line and each GPU's name and compute capability, where nvidia-smi answers (smi=, gpus=:
# what node_host reads)
# (an nvidia-smi of a GPU fallen off the bus hangs for minutes: 20 s each, where a timeout that takes `timeout 20 CMD`
# is there: coreutils', a busybox's since 1.30; an older busybox's wants -t, and fails at once)
NVIDIA_SMI_SCRIPT = (
    "t=; timeout 20 true >/dev/null 2>&1 && t='timeout 20'; "
    "s=$($t nvidia-smi 2>/dev/null | grep -m 1 'Driver Version') && printf 'smi=%s\\n' \"$s\" && printf 'gpus=%s\\n' "
    "\"$($t nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | tr '\\n' ';')\"\n")


def node_state_script(folder: str, name: str) -> str:
    d = rpath(folder)
    return (
        "for t in rsync zstd gzip sha256sum openssl docker; do printf '%s=%s\\n' $t \"$(command -v $t)\"; done\n"
        f"p={d}; while [ ! -d \"$p\" ]; do p=$(dirname \"$p\"); done\n"
        "printf 'free_kb=%s\\n' \"$(df -Pk \"$p\" | awk 'NR == 2 { print $4 }')\"\n"
        + NVIDIA_SMI_SCRIPT +
        # a link is no cut copy of ours (in a folder others write, one planted there would be appended to)
        f"f={rpath(folder, name + '.partial')}; [ -f \"$f\" ] && [ ! -L \"$f\" ] "
        "&& printf 'partial=%s\\n' \"$(wc -c < \"$f\")\"\n"
        f"f={rpath(folder, name)}; [ -f \"$f\" ] && printf 'final=%s\\n' \"$(wc -c < \"$f\")\"\n"
        "true\n")


def parse_node_state(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def node_host(have: dict[str, str]) -> Host | None:
    """What the node's nvidia-smi said (node_state's smi and gpus) as the Host the variants' rules read; None where it
    said nothing, or what no nvidia-smi says."""
    if not have.get("smi"):
        return None
    driver = re.search(r"Driver Version: *([0-9][0-9.]*)", have["smi"])
    cuda = re.search(r"CUDA Version: *(\d{1,3}\.\d{1,3})", have["smi"])
    gpus = [g.rpartition(",") for g in have.get("gpus", "").split(";") if "," in g]

    def host(listed: list[tuple[str, str, str]]) -> Host:
        # checked as a recorded host is (a Host alone is not): no escape sequence in a GPU's name reaches the terminal;
        # a capability that is no version (sm_70, [N/A]) is one not known
        return _HOST.validate_json(json.dumps({
            "driver": driver[1] if driver else "", "cuda": cuda[1] if cuda else "",
            "gpus": [{"index": i, "name": name.strip(), "memory_bytes": 0,
                      "capability": cap.strip() if re.fullmatch(r"\d{1,3}\.\d{1,3}", cap.strip()) else ""}
                     for i, (name, _, cap) in enumerate(listed)]}))

    try:
        return host(gpus)
    except ValidationError:  # its GPUs said in words no GPU has: the driver is still the driver (a 470 asked for
        pass  # compute_cap, which it does not know, answers so on stdout; load.sh refuses a driver that old)
    try:
        return host([])
    except ValidationError:
        return None


_HOST = TypeAdapter(Host)


# the node's nvidia-smi first, as invoke ship reads it (a thin save checks the node's driver by it), then docker's
INVENTORY_SCRIPT = NVIDIA_SMI_SCRIPT + "echo " + SEP + "\n" + (
    "docker info --format '{{json .}}' && echo " + SEP + " && "
    "ids=$(docker image ls -aq --no-trunc | sort -u) && "
    "if [ -n \"$ids\" ]; then docker image inspect $ids; else echo '[]'; fi")


def remote_inventory(settings: Settings, r: Remote) -> dict:
    """The node's layer inventory, read over ssh with its own docker (no project needed there), and its driver and
    GPUs where its nvidia-smi answers (as load.sh --inventory records them, read as invoke ship reads them). What the
    node sends is untrusted: at most INVENTORY_CAP bytes are read, and it must have the shape docker prints."""
    what = f"reading the image inventory of {r.host}"
    with engine.Pipeline(ssh_argv(settings, r, INVENTORY_SCRIPT), stdout=engine.PIPE, quiet=True, what=what) as p:
        out = p.stdout.read(inventory.INVENTORY_CAP + 1)
        if len(out) > inventory.INVENTORY_CAP:  # leaving the block stops ssh
            raise DockyardError(f"{r.host} sent more than {inventory.INVENTORY_CAP >> 20} MiB for its image "
                                "inventory: refused (no engine's inventory is that large)")
        code = p.wait(check=False)[0]
        said = p.output()
    if code == SSH_FAILED:
        raise unreachable(r, "\n".join(said))
    last = (said or ["no answer"])[-1]
    smi, sep, rest = out.partition((SEP + "\n").encode())
    info, sep2, images = rest.partition((SEP + "\n").encode())
    if code != 0 or not (sep and sep2):
        raise DockyardError(f"cannot read the images of {r.host} over ssh (is docker there, and may this "
                            f"user use it?): {last}")
    inv = inventory.inventory_from_json(info, images, r.host)
    host = node_host(parse_node_state(smi.decode(errors="replace")))
    return {**inv, "driver": inventory.driver_record(host)} if host else inv


def target_inventory(settings: Settings, thin_for: str) -> dict:
    """The inventory --thin-for names: a node over ssh (ssh://[user@]host[:port]) or an inventory file."""
    if thin_for.startswith("ssh://"):
        return remote_inventory(settings, parse_ssh_url(thin_for))
    # a bare host name (or address) given for the node itself, without the ssh:// that says so
    looks_like_a_host = "/" not in thin_for and not thin_for.endswith(".json")
    return inventory.read_inventory(Path(thin_for), f" (for a node over ssh: --thin-for=ssh://{thin_for})"
                                    if looks_like_a_host else "")
