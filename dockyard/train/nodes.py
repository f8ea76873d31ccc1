"""Several nodes, from inside the run: do they share the run folder, who they are, which one was lost.

DeepSpeed writes each rank's shard of a checkpoint into the run folder, and a resume reads them all back:
node-local run folders make a resume silently impossible. So before training, node 0 writes a fresh token
there and every node must read it back within DOCKYARD_SHARED_TIMEOUT seconds (30: network filesystems show new
files late), or every rank stops with the reason.

"Node 0" is always the node the user numbered 0 (`invoke run --node-rank`, DOCKYARD_NODE_RANK): torchrun numbers
the ranks by sorting the nodes' addresses as text, so global rank 0 may well live elsewhere (10.0.0.10 sorts
before 10.0.0.9).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dockyard.common import envvars, runfolder, tree
from dockyard.common.errors import DockyardError, first_line, loads, on_host
from dockyard.common.recipes import Recipe

# how every way of finding a node gone words it (explain, the heartbeat's verdict; torchrun's records, ending's one line)
LOST_SAID = re.compile(r"lost node (\d{1,6})\b")


def first_of_node() -> bool:
    """This process is its node's first (local rank 0; one started without torchrun is): the one that says what every
    process of the node would say alike, once."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def node_rank() -> int:
    """The node's rank as the user numbered it (`invoke run --node-rank`); torchrun's own order otherwise."""
    raw = os.environ.get(envvars.NODE_RANK, os.environ.get("GROUP_RANK", "0"))
    if not (raw.isascii() and raw.isdecimal()):
        raise DockyardError(f"{envvars.NODE_RANK}={raw!r}: give the node's number, 0 for the node that hosts the "
                            "rendezvous (compose: NODE_RANK)")
    return int(raw)


LAUNCHER_NUMBERS = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT")


def check_launcher_numbers() -> None:
    """torchrun's counts, where set, are whole numbers: set by hand as words (`WORLD_SIZE=abc`), each was int()'s
    traceback wherever it was first read."""
    for name in LAUNCHER_NUMBERS:
        raw = os.environ.get(name)
        if raw is not None and not (raw.strip().isascii() and raw.strip().isdecimal()):
            raise DockyardError(f"{name}={raw[:40]!r} is not a whole number: torchrun sets it (start the trainer "
                                "with torchrun, as invoke run and run.sh do), or unset it for one process")


def rendezvous() -> dict[str, Any] | None:
    raw = os.environ.get(envvars.RENDEZVOUS)
    if not raw:
        return None
    try:
        record = loads(raw)
        problem = "" if isinstance(record, dict) else type(record).__name__
    except ValueError as e:
        record, problem = None, first_line(e)
    if problem:
        raise DockyardError(f"{envvars.RENDEZVOUS} is not a JSON object ({problem}): invoke run, slurm, k8s and "
                            "compose/multinode.yml write it; a value set into it there (LOCAL_ADDR, IFACE) must hold "
                            "no quote or backslash")
    return record


IF_INET6 = Path("/proc/net/if_inet6")  # the kernel's IPv6 addresses: hex address, index, prefix, scope, flags, name


def interface_of(addr: str) -> str | None:
    """The network interface that holds `addr`, IPv4 or IPv6, on this machine (no `ip` needed: images need not have
    it)."""
    import fcntl
    import struct

    if ":" in addr:  # IPv6: the kernel lists each address with its interface, in hex (a name resolving to one alone)
        try:
            want = socket.inet_pton(socket.AF_INET6, addr.split("%")[0]).hex()
            lines = IF_INET6.read_text().splitlines()
        except (OSError, ValueError):
            return None
        return next((f[5] for f in map(str.split, lines) if len(f) == 6 and f[0] == want), None)
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
    `invoke slurm`, `invoke k8s`) and the user chose no interface, use the one that holds that address. One node
    whose ranks meet on loopback (torchrun --standalone --local-addr=127.0.0.1): gloo's on loopback too, where a
    hostname that resolves to nothing (a node's own name missing from /etc/hosts) had each rank warn "Unable to
    resolve hostname ... Using the loopback address as fallback"; NCCL, which meets on no socket there, is left as
    it is."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    addr = (rendezvous() or {}).get("local_addr")
    one_node = not addr and not several() and os.environ.get("MASTER_ADDR") in ("127.0.0.1", "::1")
    if one_node:
        addr = os.environ["MASTER_ADDR"]
    iface = interface_of(addr) if addr else None
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        if not one_node:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    return iface


def several() -> bool:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1)) < int(os.environ.get("WORLD_SIZE", 1))


def check_shared(run_dir: Path, started_with: dict[str, Any] | None = None,
                 timeout: float | None = None) -> list[dict[str, Any]]:
    """All ranks call this once torch.distributed is up. Returns every node (rank, host, address); raises the
    same DockyardError on every rank when a node cannot see what node 0 wrote in the run folder, or was started with
    another recipe or other settings (`started_with`: what this node was given) than node 0."""
    import torch.distributed as dist

    timeout = envvars.shared_timeout() if timeout is None else timeout
    first = int(os.environ.get("LOCAL_RANK", 0)) == 0
    who: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(who, (node_rank(), first))
    writer = who.index((0, True)) if (0, True) in who else 0  # node 0's first process, wherever torchrun ranked it
    token = [secrets.token_hex(16) if dist.get_rank() == writer else None]
    if dist.get_rank() == writer:
        (run_dir / runfolder.LOST_NODE).unlink(missing_ok=True)  # from an earlier attempt of this run
        runfolder.write(run_dir, runfolder.SHARED_TOKEN, token[0])
    dist.broadcast_object_list(token, src=writer)
    sees = None
    if first:
        sees = _wait_for(run_dir, token[0], timeout)
    me = {"node_rank": node_rank(), "host": socket.gethostname(), "sees_run_dir": sees,
          "addr": (rendezvous() or {}).get("local_addr", ""), "started_with": started_with or {}}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    check_started_alike(everyone)
    found = sorted((n for n in everyone if n["sees_run_dir"] is not None), key=lambda n: n["node_rank"])
    blind = [n for n in found if not n["sees_run_dir"]]
    if blind:
        who = ", ".join(f"node {n['node_rank']} ({n['addr'] or n['host']})" for n in blind)
        raise DockyardError(
            f"the run folder is not shared: {who} did not see in {run_dir} the file node 0 wrote there within "
            f"{timeout:.0f} s. DeepSpeed writes each node's checkpoint shards there and a resume needs them all: "
            "give every node the same runs folder on shared storage (NFS, Lustre, ...) mounted at the same "
            "path, e.g. INVOKE_DOCKYARD_RUNS_DIR=/shared/runs on each node")
    return [{k: v for k, v in n.items() if k not in ("sees_run_dir", "started_with")} for n in found]


# What a node trains with beyond its command line (what_this_node_runs): each node's `invoke run` mounts its own
# checkout's recipes/ over the image's, and runs its own engine's image, so two nodes given the same command could
# train with another recipe.yaml, ds_config.json or defaults.yaml, or another trainer, torch or DeepSpeed.
RECIPE_FILE = "recipe file "
INPUT = "input "  # the data and model each node's `invoke run` mounts from its own host path
PACKAGES = ("torch", "deepspeed", "transformers", "peft", "accelerate")


def started_with(recipe: Recipe, resume: bool, overrides: dict[str, Any],
                 recipe_files: dict[str, str] | None, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What this node was started with, as every node compares it with node 0's (check_shared): its command line (the
    recipe, --resume, the overrides) and what it trains with beyond it, the inputs' content among it (`inputs`: the
    manifest's record of them)."""
    return {"recipe": recipe.name, "resume": resume, **{f"--{k}": v for k, v in overrides.items()},
            **what_this_node_runs(read_by_the_trainer(recipe, recipe_files)), **inputs_read(inputs)}


def inputs_read(inputs: dict[str, Any] | None) -> dict[str, str]:
    """The fingerprint of each input (data, model, eval data) this node reads, not its path: one command mounts each
    node's own file at that path, and node 1's older copy of the data trained its replica on other rows, "completed";
    the same files at other host paths are alike. A folder's hidden files are left out, as the trainer reads none: the
    .cache/huggingface/ that `hf download --local-dir` leaves in a model folder holds each node's own download times,
    and one model downloaded on each node was refused. That fingerprint is the record's `read` (what a resume compares
    too); a record without it (a file hashed whole, or one written before it) is the file's, or the folder's walked."""
    read = {}
    for key, found in (inputs or {}).items():
        if not (isinstance(found, dict) and "sha256" in found):
            continue
        if "read" in found and "read_bytes" in found:
            found = {"sha256": found["read"], "bytes": found["read_bytes"]}
        elif found.get("hash_of") != "content" and isinstance(found.get("inside"), str):
            found = runfolder.fingerprint(Path(found["inside"]), hidden=False) or found
        read[f"{INPUT}{key}"] = f"{found['sha256'][:12]} ({found['bytes']} bytes)"
    return read


def read_by_the_trainer(recipe: Recipe, recipe_files: dict[str, str] | None) -> dict[str, str]:
    """Of the recipe's files (the manifest's recipe_files: every file of its folder), those the trainer reads:
    recipes/defaults.yaml, recipe.yaml and its DeepSpeed or FSDP file. Another file there (a README of a node's own
    checkout, an editor's backup or swap file, a log written into the folder) trains nothing, and refused the run."""
    read = {"defaults.yaml", *(f"{recipe.name}/{name}" for name in ("recipe.yaml", recipe.deepspeed, recipe.fsdp) if name)}
    return {name: digest for name, digest in (recipe_files or {}).items() if name in read}


def what_this_node_runs(recipe_files: dict[str, str] | None) -> dict[str, str]:
    """The recipe's files (their sha256, from the manifest's recipe_files), the trainer's own code and the libraries
    it trains with, as check_started_alike compares them between the nodes."""
    from importlib import metadata

    import dockyard

    found = {f"{RECIPE_FILE}{name}": digest[:12] for name, digest in (recipe_files or {}).items()}
    found["dockyard code"] = f"{dockyard.__version__} {tree.code_hash()[:12]}"  # the image's dockyard.code label's
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "(not installed)"
    return found


def check_started_alike(everyone: list[dict[str, Any]]) -> None:
    """Every node started with node 0's recipe and settings. Nodes given another recipe waited on each other's
    collectives for the process group's timeout (30 minutes), other max_steps likewise at the end, and another
    learning rate trained each node's replica its own way and said "completed". The same holds of another recipe
    file of the same name (a node's own checkout, edited or at another commit) and of another image."""
    node0 = next((n["started_with"] for n in everyone if n["node_rank"] == 0), None)
    if node0 is None:
        return
    said, keys_said = {}, set()
    for n in everyone:
        mine = n["started_with"]
        if n["node_rank"] in said or mine == node0:
            continue
        keys = sorted(k for k in set(mine) | set(node0) if mine.get(k) != node0.get(k))
        if mine.get("recipe") != node0.get("recipe"):  # another recipe's files are its own, not node 0's edited
            keys = [k for k in keys if not (k.startswith(RECIPE_FILE) and "/" in k)]
        keys_said.update(keys)
        said[n["node_rank"]] = "; ".join(f"{k} {_shown(mine.get(k))} (node 0: {_shown(node0.get(k))})" for k in keys)
    if said:
        why = ". Start every node with the same recipe and settings (the same command but for --node-rank)"
        if any(k.startswith(RECIPE_FILE) for k in keys_said):
            why += ("; a recipe file of another content: each node reads its own checkout's recipes/ (and "
                    "recipes/defaults.yaml), so give every node the same checkout (git status, git log -1 on each), "
                    "or one shared checkout")
        if any(k.startswith(INPUT) for k in keys_said):
            why += ("; another data or model file at the same path: each node mounts its own --data and --model, so "
                    "give every node the same files (shared storage, or the same copy on each)")
        if keys_said & {"dockyard code", *PACKAGES}:
            why += ("; another trainer or library: the nodes run other images, so give every node the same image "
                    "(invoke ship --image=IMAGE --to=NODE; invoke doctor --peer=NODE compares the image ids)")
        raise DockyardError("the nodes were not started alike: " + ", ".join(
            f"node {rank} with {what}" for rank, what in sorted(said.items())) + why)


def _shown(value: Any) -> str:
    return "(not given)" if value is None else json.dumps(value, default=str)[:60]


def _wait_for(run_dir: Path, token: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if runfolder.read_text(run_dir, runfolder.SHARED_TOKEN) == token:
                return True
        except (OSError, DockyardError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


PEER = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3})\]?(?::|, )\d+")  # gloo's ADDR:PORT, the store's (ADDR, PORT)


def explain(error: str, run_dir: Path, nodes: list[dict[str, Any]]) -> str:
    """A failed rank's error, led by the node that was lost when this rank or another one found out which.
    The rank that finds it says so on stderr, and leaves it for the others: a rank whose own peer was a
    neighbour on the same node (which stopped first), or which torchrun stopped, sees only that."""
    lost = lost_node(error, nodes)
    if lost:
        print(on_host(f"error: {lost}"), file=sys.stderr, flush=True)
        runfolder.write(run_dir, runfolder.LOST_NODE, lost)  # a random temporary name: containers of several nodes share pids
    else:
        try:
            lost = runfolder.read_text(run_dir, runfolder.LOST_NODE)
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
        other = store_host_of_two(addr)  # torchrun's store, lost before the nodes said who they are
        if other is not None:
            return f"lost node {other} ({addr}): it stopped answering"
    return None


def store_host_of_two(addr: str) -> int | None:
    """The node torchrun's store at `addr` lives on, when it is not this one and there are two: the other node
    (torchrun may have ranked either first)."""
    if node_count() == 2 and addr == os.environ.get("MASTER_ADDR") and addr != (rendezvous() or {}).get("local_addr"):
        return 1 - node_rank()
    return None


# --- heartbeats: a node lost at any moment, not only under a running collective ----------------------------
# A killed node's sockets close, and a collective running at that moment fails at once (lost_node() names the
# peer). Before the first collective nothing notices: a rank waiting for a peer's address while the process
# group is set up, or for a barrier while another node loads the model, waits for the process group's timeout
# (the Trainer's ddp_timeout: 30 minutes). So every node's first process adds to a counter of its own in
# torchrun's store every few seconds, and a thread in every process watches the other nodes' counters: one that
# stays still for the bound (the rendezvous' join timeout, `invoke run --join-timeout`) is a lost node, and this
# node stops, naming it, whatever its main thread is waiting for. Counters, not times: no clock is shared
# across nodes, each process measures the silence on its own.

CUT_OFF = re.compile(r"Dist(Network|Store)Error|Broken pipe|Connection (reset|closed|refused)")
BEAT = "dockyard/beat/{}"
NODE = "dockyard/node/{}"
DONE = 1 << 40  # added to a node's counter when it finished its run: its silence from then on is no loss
GRACE = 5.0     # what a process other than its node's first waits after its verdict, so that the first one
#                 (which writes the node's manifest) stops with the reason, not with torchrun's SIGTERM


def silence_bound() -> float:
    """How long a node may stay silent: the join timeout the launcher gave torchrun, recorded in
    DOCKYARD_RENDEZVOUS (`invoke run --join-timeout`, `invoke slurm`, `invoke k8s`, compose's JOIN_TIMEOUT)."""
    try:
        bound = float((rendezvous() or {}).get("join_timeout") or envvars.JOIN_TIMEOUT)
    except (TypeError, ValueError):
        bound = envvars.JOIN_TIMEOUT
    return bound if bound >= 1 else envvars.JOIN_TIMEOUT


def beat_interval(bound: float) -> float:
    """A beat often enough that ten fit in the bound, at most every 5 s and at least every 0.5 s."""
    return max(0.5, min(5.0, bound / 10))


def node_count() -> int:
    return int(os.environ.get("GROUP_WORLD_SIZE") or
               int(os.environ.get("WORLD_SIZE", 1)) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


class Silence:
    """The verdict, from the counters alone: which other node's counter has stayed still for longer than
    `bound` seconds of this process's clock, counting from `started` for a node that never beat."""

    def __init__(self, others: list[int], bound: float, started: float):
        self.bound = bound
        self.last = {n: (0, started) for n in others}  # node → (counter, when it last changed)

    def see(self, counts: dict[int, int], now: float) -> tuple[int, float, bool] | None:
        """The silent node (the longest silent, when several), how long it has been silent, and whether it ever
        beat; None while every node is heard from or done."""
        worst = None
        for n, (count, since) in self.last.items():
            new = counts.get(n, count)
            if new != count:
                self.last[n] = (new, now)
                continue
            if count >= DONE:
                continue
            silent = now - since
            if silent > self.bound and (worst is None or silent > worst[1]):
                worst = (n, silent, count > 0)
        return worst


_UNSET = "\x00dockyard: not set"  # what _read asks compare_set for: neither a count nor JSON
_ASK_AGAIN = object()  # a node's info not set yet (or deleted): asked again at the next beat


def _count(raw: bytes) -> int:
    text = raw.decode("ascii")
    if not text.isdecimal():
        raise ValueError(text)
    return int(text)


def _node_info(raw: bytes) -> dict[str, Any] | None:
    """What a node's heartbeat says of itself (Heartbeat.info), or None: a host or address that is no printable text
    (a stranger's escape sequences) would reach the terminal in the verdict that names the node."""
    info = loads(raw)
    if not (isinstance(info, dict) and type(info.get("node_rank")) is int and all(
            isinstance(info.get(k), str) and len(info[k]) <= 255 and info[k].isprintable() for k in ("host", "addr"))):
        return None
    return {k: info[k] for k in ("node_rank", "host", "addr")}


def lost_message(node: int, silent: float, ever_beat: bool, info: dict[str, Any] | None, phase: str) -> str:
    """Said the way lost_node() says it, so that a user (and a test) reads one sentence for a lost node."""
    where = f" ({info['addr'] or '?'}, host {info['host']})" if info else ""
    why = (f"no heartbeat for {silent:.0f} s" if ever_beat else
           f"its processes never started: no heartbeat in the {silent:.0f} s since this node started")
    return f"lost node {node}{where}: it stopped answering ({why}, while this node was {phase})"


class Heartbeat:
    """This node's beat and the watch over the others, in a daemon thread with its own connection to torchrun's
    store (the process group's own connection may be blocked in a wait). `on_lost(message)` is called from
    that thread, once; it is expected to end the process."""

    def __init__(self, on_lost, bound: float | None = None):
        self.on_lost = on_lost
        self.bound = bound or silence_bound()
        self.me = node_rank()
        self.first = int(os.environ.get("LOCAL_RANK", 0)) == 0
        self.others = [n for n in range(node_count()) if n != self.me]
        self.store_at = (os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", 0)))
        self.info = {"node_rank": self.me, "host": socket.gethostname(), "addr": (rendezvous() or {}).get("local_addr", "")}
        self.phase = "starting"
        self.verdict: str | None = None
        self._infos: dict[int, dict[str, Any]] = {}
        self._asked: set[int] = set()  # the nodes whose info was read (of the nodes' shape or not): not read again
        self._store: Any = None
        self._beats = 0  # this node's counter: written whole (set), never added to (see _watch)
        self._done = 0   # DONE, once this node finished its run
        self._writing = threading.Lock()  # the thread's beat and done()'s, one at a time
        self._stop = False  # tests: this node goes silent

    def start(self) -> Heartbeat:
        threading.Thread(target=self._run, name="dockyard-heartbeat", daemon=True).start()
        return self

    def done(self) -> None:
        """This node finished its run: the others must not count its silence from now on as a loss. It still
        watches them through the last barrier (a verdict then ends the process; its manifest is written)."""
        if self.first and self._store is not None:
            try:
                self._done = DONE
                self._beat()
            except Exception:  # noqa: BLE001 - the store's host finished first: nobody is left to tell
                pass

    def verdict_for(self, error: str, nodes: list[dict[str, Any]]) -> str | None:
        """The verdict that explains the main thread's `error`: the one reached already, or, for a broken
        connection that names no peer (gloo setting up a group through torchrun's store: "DistNetworkError:
        Broken pipe"), the one this thread reaches within a beat when that store's host is gone."""
        if self.verdict is None and CUT_OFF.search(error) and lost_node(error, nodes) is None:
            deadline = time.monotonic() + beat_interval(self.bound) + 2.0
            while self.verdict is None and time.monotonic() < deadline:
                time.sleep(0.1)
        return self.verdict

    def _run(self) -> None:
        message = self._watch()
        if message and not self._stop:
            self.verdict = message
            self.on_lost(message)

    def _watch(self) -> str | None:
        """Beat and watch until a node is lost (its message) or this node is done (None)."""
        started = time.monotonic()
        silence = Silence(self.others, self.bound, started)
        interval = beat_interval(self.bound)
        try:
            self._store = self._connect(started + self.bound)
            if self.first:
                self._store.set(NODE.format(self.me), json.dumps(self.info))
            while not self._stop:
                if self.first:
                    self._beats += 1
                    self._beat()
                counts = {n: count for n in self.others if (count := self._read(BEAT.format(n), _count)) is not None}
                for n in self.others:  # who each node is, asked once it beats (it says so first), and once (_read)
                    if n not in self._asked and counts.get(n, 0) > 0:  # a lost store's host is named by it
                        info = self._read(NODE.format(n), _node_info, absent=_ASK_AGAIN)
                        if info is not _ASK_AGAIN:
                            self._asked.add(n)
                            if info:
                                self._infos[n] = info
                lost = silence.see(counts, time.monotonic())
                if lost:
                    n, silent, ever = lost
                    return lost_message(n, silent, ever, self._infos.get(n), self.phase)
                time.sleep(interval)
        except Exception as e:  # noqa: BLE001 - the store's connection failed: its host is gone
            return self._store_lost(e)
        return None

    # Anyone who reaches the store's port may write these keys (TCPStore has no password): a value of another shape
    # is no news, never a failure of the store. A counter is set whole and read as text: TCPStore.add on a
    # stranger's "abc" made the store drop the connection, and every node took the other for lost.
    def _beat(self) -> None:
        with self._writing:
            self._store.set(BEAT.format(self.me), str(self._beats + self._done))

    def _read(self, key: str, parse, absent: Any = None) -> Any:
        """`parse` of the key's value, None where it is not of the shape the nodes write (`absent` where it is not set).
        One request, which never waits: a check, then a get, met a key a stranger deleted in between, and get waited
        the bound for it and failed, the store taken for lost. compare_set of a value no node writes changes nothing
        and answers the value, or that value where the key is not set.
        A value is read whole: torch's Store has no ranged get and no size of a value (get, compare_set and multi_get
        answer it all; check says only whether it is set). So a node's info, which its node writes once, is read
        once (_watch): a stranger's megabytes there were downloaded by every process at every beat for the whole run.
        A counter is read every beat; its node sets it again at every beat, so a stranger's value there lasts one
        beat unless the stranger sends it again each time."""
        raw = self._store.compare_set(key, _UNSET, _UNSET)
        if raw == _UNSET.encode():
            return absent
        try:
            return parse(raw) if len(raw) <= 1024 else None
        except (ValueError, TypeError, UnicodeDecodeError):
            return None

    def _connect(self, deadline: float) -> Any:
        """torchrun's store, reached by `deadline` or lost. TCPStore's own connect retries for up to twice its
        timeout plus a random pause (50 s for a 20 s bound), so it is only asked once the port answers; its
        timeout is then the bound, for every later request."""
        import datetime

        from torch.distributed import TCPStore

        while True:
            try:
                socket.create_connection(self.store_at, timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"not reachable for {self.bound:.0f} s ({e.strerror or e})") from e
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        # the host may still go in between: a third of the bound, so that even TCPStore's retries fit in it
        store = TCPStore(*self.store_at, is_master=False, timeout=datetime.timedelta(seconds=max(1.0, self.bound / 3)),
                         wait_for_workers=False)
        store.set_timeout(datetime.timedelta(seconds=self.bound))
        return store

    def _store_lost(self, error: Exception) -> str:
        """The store lives on the node torchrun ranked first: named from what the nodes said of themselves, or,
        of two nodes, the other one (the store's address is not this node's)."""
        addr = self.store_at[0]
        host = next((i for i in self._infos.values() if i.get("addr") == addr), None)
        other = store_host_of_two(addr)
        if host:
            who = f"node {host['node_rank']} ({addr}, host {host['host']})"
        elif other is not None:
            who = f"node {other} ({addr})"
        else:
            who = f"the node at {addr}"
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"lost {who}: it stopped answering (torchrun's store there failed: {detail}; while this node was "
                f"{self.phase})")
