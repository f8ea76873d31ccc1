"""torchrun, without its traceback when a worker fails: `python -m dockyard.train.torchrun ARGS` is `torchrun ARGS`.

A trainer that refuses a setting says why in one line and exits 1; torchrun then raised ChildFailedError out of its
own main, and Python printed forty lines of traceback and a table under that line. Here the failure is one line too:
which rank failed first, how, where its reason is. The exit status is torchrun's (1). The images' `torchrun` is this
(images/Dockerfile), so every launcher that starts torchrun in an image (invoke run, run.sh, Slurm, Kubernetes,
compose) gets it; native runs start it by name (dockyard.launch.command.native_command).

It also makes restarts (--max-restarts) work. torchrun's agent holds the store the workers' process group meets
in, and its handler is meant to start a new one for each attempt (pytorch/pytorch#135957); torch 2.10-2.15 start
one for the first attempt only and keep it. A restarted worker could then read the address its dead predecessor had
left there (pytorch/pytorch#135712): gloo failed with "connection refused", NCCL would connect to a stale port, or
every rank waited in init_process_group for ever. Here each rendezvous round starts the handler's store afresh, so
each attempt meets in an empty one, still held by the agent (it outlives the workers: the nodes' heartbeat watches
it, dockyard.train.nodes). A torch without those fields gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 instead (the
store is then held by the first worker).

And it gives each worker its share of the node's CPU cores (OMP_NUM_THREADS, where not set): torchrun sets 1 for
every worker (and prints four lines asking to tune it), which left DeepSpeed's CPU Adam, the optimizer step of the
offload recipes, on one core per GPU however many the node has.

A node of several says whom it waits for as it starts, and that the nodes met, and one that cannot reach node 0's
store gives up within the join timeout; a node given another --run-id than node 0's is told so (rendezvous_store).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from dockyard.common import envvars, runfolder
from dockyard.common.cores import usable_cores
from dockyard.common.errors import DockyardError, first_line, on_host, shown, signals_unwrapped
from dockyard.train.nodes import LOST_SAID

# torch (and dockyard.train.cpus, which imports it) load after main()'s check of OMP_NUM_THREADS: libgomp reads it,
# and says it is invalid in three lines of its own, as it loads


def main(argv: list[str] | None = None) -> int:
    """torchrun, for both of its entries: the image's /opt/venv/bin/torchrun (which calls this) and `python -m`."""
    try:
        with signals_unwrapped():  # Ctrl-C landing while torch's import builds a dataclass: Python wraps it
            return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while torch still imports: its traceback from deep in the import
        print("torchrun: stopped by SIGINT before it started the workers", file=sys.stderr)
        return 128 + signal.SIGINT


def _main(argv: list[str] | None) -> int:
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is not None and not (threads.strip().isascii() and threads.strip().isdigit() and int(threads) > 0):
        print(f"torchrun: OMP_NUM_THREADS={threads!r}: give a whole number of CPU threads per process, 1 or more, or "
              "unset it (each process then gets its share of the node's cores)", file=sys.stderr)
        return 2
    # The agent's own C++ logs (c10d's socket and store): a node that cannot reach node 0 printed each retry with a
    # stack of 40 frames, and a node whose store went away as node 0 finished a successful run did too. What the
    # agent says is said below in one line; the workers keep the level the user set (read as torch loads).
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ  # a level the user set (to debug a rendezvous) is kept
    if quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from torch.distributed.run import main as torchrun  # (and torch's elastic modules, read by _launch)

    if quiet:
        del os.environ["TORCH_CPP_LOG_LEVEL"]

    # its "failed (exitcode: 1) local_rank: 0 (pid: 27600) of binary: ..." and "Sending process 19312 closing signal
    # SIGTERM", under every failed run's reason: the line below says which process failed first, and how
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    # and its "Received Signals.SIGINT death signal, shutting down workers", said below in one line
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    # and, on the nodes that outlive node 0, its rendezvous' "The node '10.0.0.10_7_0' has failed to send a keep-alive
    # heartbeat to the rendezvous" and "has failed to shutdown the rendezvous ... RendezvousConnectionError" (its only
    # warnings), in torch's log format between the lines that say what happened: node 0's rendezvous went away, said
    # below in one line, and the manifest names node 0
    logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").setLevel(logging.ERROR)
    fresh_store_per_attempt()
    rendezvous_store()
    args = sys.argv[1:] if argv is None else argv
    given = torchrun_args(args)
    if given and (bad := bad_value(given)):
        print(f"torchrun: {bad}", file=sys.stderr)
        return 2
    waits = waiting(given) if given else None
    if waits:
        print(f"torchrun: {waits}", file=sys.stderr, flush=True)
    if given and no_gpu_for_one_per_gpu(given):
        print("torchrun: --nproc-per-node=gpu (one process per GPU), but torch sees no GPU here: give a number of "
              "processes (compose: DOCKYARD_NPROC=2 on a node without GPUs), or add the GPUs (compose/gpu.yml)",
              file=sys.stderr)
        return 2
    if given:
        share_cpu_cores(given)
        if not waits:
            print(f"torchrun: {starting(given)}", file=sys.stderr, flush=True)
    # the nodes' records, stamped as each attempt begins (next_rendezvous): none of those is the attempt's to rewrite
    # or to read
    RECORDS.update(_records(args, given))
    try:
        with logs_folder(given) as logs:
            return _launch(torchrun, [*logs, *args], args, given)
    except DockyardError as e:
        print(f"torchrun: {e}", file=sys.stderr)
        return 1


LOGS_PREFIX = "dockyard-torchrun-"


@contextlib.contextmanager
def logs_folder(given: argparse.Namespace | None):
    """torchrun's --log-dir, a folder removed as it ends: where none is given, torch makes /tmp/torchelastic_<random>
    and never removes it (each `invoke run --native` left one in the host's /tmp). It holds each worker's error file,
    read when a worker fails (ChildFailedError), so it goes once the failure is said. A --log-dir given is kept.
    A launcher killed outright (SIGKILL, the OOM killer) cannot remove its own: the folder's lock file, held while it
    runs, tells the next launcher that its owner is gone, and that one removes it."""
    if given is None or given.log_dir:
        yield []
        return
    import fcntl
    import shutil
    import tempfile

    tmp = tempfile.gettempdir()
    remove_orphaned_logs(Path(tmp))
    folder = ""
    try:
        folder = tempfile.mkdtemp(prefix=LOGS_PREFIX)
        held = open(os.path.join(folder, ".held"), "w")  # held for the run, closed below
    except OSError as e:  # no room in TMPDIR (its last inode, a quota): the folder without .owner no sweep removes
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise DockyardError(f"cannot make its log folder in {shown(tmp)} ({e.strerror}): free room there (df -h, df -i), "
                            "or set TMPDIR to a folder that has some") from None
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # ENOLCK, ENOSYS: a TMPDIR without locks (NFS, Lustre without flock): no .owner, never swept
            pass
        else:
            os.rename(held.name, os.path.join(folder, ".owner"))  # appears locked: no sweep takes one being made
        yield ["--log-dir", folder]
    finally:
        held.close()
        shutil.rmtree(folder, ignore_errors=True)


def remove_orphaned_logs(tmp: Path) -> None:
    """Remove the log folders in `tmp` whose launchers are gone: their `.owner` is ours and no process holds its lock.
    A folder without one (being made, or not ours) is left alone. TMPDIR is anyone's (/tmp): `.owner` is opened
    without waiting (a fifo of that name, planted by another user, blocked the open and hung every launch) and only a
    plain file's lock is asked."""
    import fcntl
    import shutil
    import stat

    with contextlib.suppress(OSError):
        for folder in tmp.iterdir():
            if not folder.name.startswith(LOGS_PREFIX):
                continue
            with contextlib.suppress(OSError):
                fd = os.open(folder / ".owner", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    owner = os.fstat(fd)
                    if not stat.S_ISREG(owner.st_mode) or owner.st_uid != os.getuid() or folder.is_symlink():
                        continue
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError where its launcher still runs
                    shutil.rmtree(folder, ignore_errors=True)
                finally:
                    os.close(fd)


def _launch(torchrun, argv: list[str], args: list[str], given: argparse.Namespace | None) -> int:
    """torchrun itself, its failures said in one line each (`args`: as the caller gave them)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    try:
        torchrun(argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit {failure.exitcode}"
        run_dir = runfolder.run_dir_of(args)  # a run refused before it had a folder has no train.log
        log = " (and in the run's train.log)" if run_dir and (Path(run_dir) / "train.log").is_file() else ""
        why = f"its reason is above{log}"
        if failure.exitcode == -signal.SIGKILL:  # no process can say that it was killed so
            why = ("killed, so it could say nothing: most often by the kernel's out-of-memory killer (`dmesg` says, or "
                   "`docker inspect`'s OOMKilled), else a `kill -9`")
        print(f"torchrun: {e.name} failed: rank {rank} (local rank {failure.local_rank}) first, {how}; {why}",
              file=sys.stderr, flush=True)
        settle(args, given, None, this_attempts())
        return 1
    except (RendezvousTimeoutError, RendezvousConnectionError) as e:
        # escaped: the rendezvous ids it names are read from the store, which anyone who reaches its port may write
        print(f"torchrun: {shown(not_met(given, e))}", file=sys.stderr, flush=True)
        if MET and isinstance(e, RendezvousConnectionError):
            settle(args, given, e, this_attempts())
        return 1
    except SignalException as e:  # Ctrl-C or SIGTERM to the agent: it has stopped the workers with the same signal
        print(f"torchrun: stopped by {signal.Signals(e.sigval).name}; the workers were stopped with it",
              file=sys.stderr, flush=True)
        return 128 + e.sigval
    return 0


def torchrun_args(argv: list[str]) -> argparse.Namespace | None:
    """torchrun's own reading of its arguments, read once here, quietly (torchrun says what is wrong with them
    itself, once); None where it cannot read them."""
    from torch.distributed.run import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return get_args_parser().parse_known_args(argv)[0]
    except SystemExit:
        return None


def bad_value(a: argparse.Namespace) -> str | None:
    """What torchrun refuses only in a traceback of its own, from deep in its launcher (an AssertionError, a
    ValueError, 30 lines each), among the values a launcher hands on from its user unchecked: compose's NNODES,
    DOCKYARD_NPROC, MASTER_ADDR and MASTER_PORT, JOIN_TIMEOUT and MAX_RESTARTS (NNODES=abc, JOIN_TIMEOUT=0,
    DOCKYARD_NPROC=0, MAX_RESTARTS=-1, MASTER_PORT=99999). The line names the flag, its value and compose's variable."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    # at most MOST (a value of 5,000 digits was Python's ValueError, a traceback, reading it)
    parts = str(a.nnodes).split(":")  # N, or MIN:MAX (elastic)
    if not (len(parts) <= 2 and all(p.isascii() and p.isdecimal() and len(p) <= 4 for p in parts)
            and 0 < int(parts[0]) <= int(parts[-1]) <= envvars.MOST):
        return f"--nnodes={a.nnodes!r}: give the number of nodes, 1 to {envvars.MOST} (compose: NNODES)"
    nproc = str(a.nproc_per_node)
    # at most MOST, as invoke run and run.sh take: DOCKYARD_NPROC=99999999999 started workers until the host's memory
    # ran out (225 of them froze a 23 GiB host for half an hour)
    if not (nproc in ("gpu", "cpu", "auto", "xpu") or (nproc.isascii() and nproc.isdecimal() and len(nproc) <= 4
                                                      and 0 < int(nproc) <= envvars.MOST)):
        return (f"--nproc-per-node={nproc!r}: give the processes of this node, 1 to {envvars.MOST}, or gpu for one per "
                "GPU (compose: DOCKYARD_NPROC)")
    if a.max_restarts < 0:
        return f"--max-restarts={a.max_restarts}: give 0 or more (compose: MAX_RESTARTS)"
    if a.rdzv_endpoint:
        try:
            parse_rendezvous_endpoint(a.rdzv_endpoint, default_port=29400)
        except ValueError as e:
            return f"--rdzv-endpoint={a.rdzv_endpoint!r}: {e} (compose: MASTER_ADDR and MASTER_PORT)"
    conf = dict(kv.split("=", 1) for kv in (a.rdzv_conf or "").split(",") if "=" in kv)
    timeout = conf.get("join_timeout", "1").strip()
    # at most a week: JOIN_TIMEOUT=99999999999999 was an OverflowError in torch's rendezvous, a traceback
    if not (timeout.isascii() and timeout.isdecimal() and len(timeout) <= 7 and 0 < int(timeout) <= envvars.LONGEST_WAIT):
        return (f"join_timeout={conf['join_timeout']!r} in --rdzv-conf: give whole seconds, 1 to {envvars.LONGEST_WAIT} "
                "(a week; compose: JOIN_TIMEOUT; invoke run, slurm and k8s: --join-timeout)")
    return None


def not_met(a: argparse.Namespace, error: BaseException) -> str:
    """The nodes did not meet: which rendezvous, where, for how long, and what to check, in one line (torchrun's
    was a bare RendezvousTimeoutError under 45 lines of traceback, or two chained ones from a node that could not
    reach node 0)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    conf = dict(kv.split("=", 1) for kv in (a.rdzv_conf or "").split(",") if "=" in kv)
    waited = f" within {conf['join_timeout']} s" if "join_timeout" in conf else ""
    addr, _, port = a.rdzv_endpoint.rpartition(":")
    fix = (f"start every node with the same --run-id, --master-addr and --master-port (--nodes={a.nnodes}); "
           "invoke doctor --peer=HOST checks the port from another node")
    if OTHER_RUN:
        return (f"node 0 at {a.rdzv_endpoint} hosts the rendezvous {_few(OTHER_RUN)}, not this node's {a.rdzv_id}: "
                f"start every node with the same --run-id (node 0's is {_few(OTHER_RUN)}); where both runs are meant, "
                "give this one another --master-port")
    if OTHER_COUNT:
        return (f"node 0 at {a.rdzv_endpoint} hosts the rendezvous {a.rdzv_id} for --nodes={_few(OTHER_COUNT)}, this "
                f"node was started with --nodes={a.nnodes}: start every node with the same --nodes (compose: NNODES), the "
                "number of nodes the run has")
    if isinstance(error, RendezvousTimeoutError) and (others := came_for(CAME_FOR, a.rdzv_id)):
        return (f"not every node joined the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}{waited}: a node came for "
                f"the rendezvous {_few(others)}: start every node with the same --run-id ({a.rdzv_id} here)")
    least, _, most = str(a.nnodes).partition(":")  # N or MIN:MAX (bad_value took it), as the store holds it: _count
    if isinstance(error, RendezvousTimeoutError) and (counts := came_for(CAME_WITH, _count(int(least), int(most or least)))):
        return (f"not every node joined the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}{waited}: a node "
                f"started with --nodes={_few(counts)} came: start every node with the same --nodes (compose: NNODES; "
                f"{a.nnodes} here)")
    if isinstance(error, RendezvousTimeoutError):
        return (f"not every node joined the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}{waited}: {fix}; a node that "
                f"was started but did not join cannot reach {addr} (its --master-addr) on TCP port {port}: a "
                "firewall, or another address")
    cause, said = underlying(error)
    if MET and conf.get("is_host") != "1":
        # the nodes had met and trained (or were starting to): node 0's agent, which holds the rendezvous, is gone.
        # "start every node with the same --run-id" was this node's last line after node 0 was lost mid-run.
        return (f"the rendezvous {a.rdzv_id} at {a.rdzv_endpoint} went away after the nodes had met "
                f"({type(cause).__name__}: {said}): node 0, which hosts it, stopped or was lost (its own output, or "
                "the run's manifest, says why); this node stopped with it")
    if conf.get("is_host") == "1" and "EADDRINUSE" in str(cause) + said or "address already in use" in said.lower():
        port = a.rdzv_endpoint.rsplit(":", 1)[-1]
        return (f"port {port} is taken on this node, which hosts the rendezvous {a.rdzv_id} (node 0): give every node "
                "another --master-port (or stop what holds it)")
    return (f"cannot reach the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}{waited} (node 0 hosts it; "
            f"{type(cause).__name__}: {said}): check that node 0 runs (--node-rank=0, started within --join-timeout "
            f"of this node), that {addr} is its address (--master-addr), and that no firewall drops TCP port {port} "
            f"on the way; start every node with the same --run-id and --master-port (--nodes={a.nnodes}); invoke "
            f"doctor --peer={addr} checks the port from here")


def starting(a: argparse.Namespace) -> str:
    """What a node alone starts, said as it does: the trainer's processes each load torch, transformers and DeepSpeed
    before the run's first line, and `invoke run` in the cpu image said nothing for 24 s after its `docker run` line
    (48 s on a loaded host, minutes on a slow disk). A node of several says whom it waits for instead (waiting)."""
    nproc = str(a.nproc_per_node)
    procs = ("one process per GPU" if nproc == "gpu" else "1 process" if nproc == "1"
             else f"{nproc} processes" if nproc.isdecimal() else f"processes ({nproc})")
    if a.module and a.training_script == "dockyard.train":
        return (f"starting {procs} of dockyard.train: each loads torch, transformers and DeepSpeed before the run's "
                "first line (seconds to a minute)")
    return f"starting {procs} of {a.training_script}"


def waiting(a: argparse.Namespace) -> str | None:
    """What this node waits for, for how long, said as it starts: a node alone waited silently for the whole join
    timeout (two minutes by default; one started before node 0 twice that), with no word of whom it waited for."""
    conf = dict(kv.split("=", 1) for kv in (a.rdzv_conf or "").split(",") if "=" in kv)
    nodes = str(a.nnodes).split(":")[-1]
    if not (nodes.isdecimal() and int(nodes) > 1) or a.standalone:
        return None
    me, bound = _node_rank(), f" up to {conf['join_timeout']} s" if "join_timeout" in conf else ""
    this = f"node {me} of {nodes}" if me is not None else f"this node (one of {nodes})"
    MEETING.update(rdzv_id=a.rdzv_id, nodes=nodes, since=time.monotonic())
    if conf.get("is_host") == "1":
        return (f"{this} hosts the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}: waiting{bound} for the other "
                "node(s) to join")
    return f"{this} joining the rendezvous {a.rdzv_id} at {a.rdzv_endpoint}: waiting{bound} for node 0, which hosts it"


def rendezvous_store() -> None:
    """torchrun's c10d backend, as its store is made:
    - a node reaching node 0's store gives up within the join timeout, not torch's 60 s read timeout twice over:
      TCPStore retries its connect once more after its timeout (measured: 128 s with --join-timeout=20, and the same
      with 120), so a third of the bound, as the nodes' heartbeat takes (dockyard.train.nodes). The same timeout bounds
      the rendezvous' own store operations, which take milliseconds. A read_timeout given in --rdzv-conf is kept.
    - node 0 leaves its rendezvous id in the store, and every other node the one it came for: a node given another
      --run-id reached node 0 and then both waited out the join timeout, each told to check a firewall. It stops at
      once saying node 0's id, and node 0 says, when its wait ends, which ids came.
    - the same for the number of nodes: a node given --nodes=3 beside a node 0 given 2 waited out the join timeout
      and was told it could not reach node 0; one given 2 beside a node 0 given 3 met it and both trained, world size
      2, node 0 saying "the 3 nodes met"."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    first = c10d.create_backend
    if getattr(first, "rendezvous_store", False):
        return

    def create_backend(params):
        join = params.get("join_timeout")
        if params.get("read_timeout") is None and str(join).isascii() and str(join).isdecimal():
            params.config["read_timeout"] = str(max(2, int(join) // 3))
        backend, store = first(params)
        STORE[:] = [store]  # held: node 0's not_met reads who came, from its own store
        count = _count(params.min_nodes, params.max_nodes)
        if params.get_as_bool("is_host"):
            store.set(HOSTED, params.run_id)
            store.set(HOSTED_COUNT, count)
            return backend, store
        store.append(CAME_FOR, f"{params.run_id}\n")
        hosted = store.get(HOSTED).decode(errors="replace") if store.check([HOSTED]) else params.run_id
        if hosted != params.run_id:
            OTHER_RUN.append(hosted)
            raise RendezvousConnectionError(f"node 0 hosts the rendezvous {hosted}")
        store.append(CAME_WITH, f"{count}\n")
        hosted = store.get(HOSTED_COUNT).decode(errors="replace") if store.check([HOSTED_COUNT]) else count
        if hosted != count:
            OTHER_COUNT.append(hosted)
            raise RendezvousConnectionError(f"node 0 hosts the rendezvous for --nodes={hosted}")
        return backend, store

    create_backend.rendezvous_store = True
    c10d.create_backend = create_backend


def came_for(key: str, own: str) -> list[str]:
    """What the nodes that reached this node's store came with (node 0's, as its wait ends), where it is not this
    node's `own`: the rendezvous ids (CAME_FOR), or the numbers of nodes (CAME_WITH)."""
    with contextlib.suppress(Exception):  # a store gone already: nothing to say
        if STORE and STORE[0].check([key]):
            said = STORE[0].get(key).decode(errors="replace").split()
            return sorted(set(said) - {own})
    return []


def _few(values: list[str], most: int = 3, width: int = 64) -> str:
    """Values read from the store, as a line says them: anyone who reaches its port may write thousands, each as long
    as they like (a stranger's 5,000 ids were one line of a megabyte)."""
    said = ", ".join(v if len(v) <= width else v[:width - 1] + "…" for v in values[:most])
    return said + (f", and {len(values) - most} more" if len(values) > most else "")


def _count(least: int, most: int) -> str:
    """A number of nodes as --nnodes gives it: N, or MIN:MAX."""
    return str(most) if least == most else f"{least}:{most}"


def underlying(error: BaseException) -> tuple[BaseException, str]:
    """The error under torchrun's rendezvous error, and the first line of what it said."""
    cause = error.__cause__ or error.__context__ or error
    return cause, first_line(cause, 160) or "no answer"


def settle(args: list[str], a: argparse.Namespace | None, error: BaseException | None,
           found: dict[int, tuple[int, int, int] | None]) -> None:
    """What this node's manifest says of the node that ended the run, once this node's run ended for another node's
    sake; only for a manifest this attempt wrote (`found`: each node's record as it was when this attempt began: a
    resume stopped before it trained leaves the run's records as they were, and so does a restart's).

    - Another node failed on its own error (its record, written since this attempt began, says so). This node saw its
      sockets close, its heartbeat stop or, for node 0, its rendezvous end, and recorded "lost node K": said instead as
      node K's failure, with its error and the record that holds it. A node that recorded another's loss in turn ("lost
      node 2" in node 0's) is followed to the one that failed. Node 0's manifest.json, the run's record, said "lost
      node 1 (...): it stopped answering" where node 1 had run out of memory.
    - Stopped by torchrun's SIGTERM because node 0's rendezvous went away (`error`), on a node other than 0: the workers
      recorded only that they were stopped by SIGTERM (they cannot tell why), naming no node, wherever torchrun's store
      was elsewhere (node 0 at 10.0.0.9, node 1 at 10.0.0.10: 3.8 s after node 0's container was killed at step 12).
      Said as the loss of node 0 it was. A run stopped by a signal to this agent (scancel) never comes here.
    - Node 0 lost and no manifest.json: this record is made the run's manifest.json too (its node_rank says whose),
      never replacing one. Without it node 0's `invoke run --resume` was refused ("no manifest naming its recipe"),
      and `invoke export` said there was no such run."""
    from dockyard.train import manifest
    from dockyard.train.ending import STOPPED

    me, run_dir = _node_rank(), runfolder.run_dir_of(args)
    if me is None or not run_dir or a is None:
        return
    path = Path(run_dir) / runfolder.manifest_file(me)
    if _stamp(path) == found.get(me):
        return
    record = manifest.recorded(path.parent, path.name)
    if not (record.get("status") == "failed" and isinstance(record.get("error"), str)):
        return
    said = record["error"]
    lost = LOST_SAID.match(said)
    node_0_gone = me != 0 and error is not None and said.startswith(STOPPED)
    first = _failed_first(path.parent, int(lost[1]) if lost else 0, me, found) if lost or node_0_gone else None
    if first:
        node, failed = first
        record["error"] = (f"node {node} ({_who(record, node, a)}) failed first: {failed} (its record: "
                           f"{runfolder.manifest_file(node)}); this node was stopped with it")
        print(on_host(f"torchrun: {shown(record['error'])}"), file=sys.stderr, flush=True)  # anyone's words
    elif node_0_gone:  # (a reason of this node's own is kept)
        cause, detail = underlying(error)
        record["error"] = (f"lost node 0 ({_who(record, 0, a)}): its torchrun, which holds the rendezvous {a.rdzv_id} "
                           f"at {a.rdzv_endpoint}, went away after the nodes had met ({type(cause).__name__}: "
                           f"{detail}); this node was stopped with it")
    try:
        text = manifest.json_text(record, indent=2) + "\n"
    except RecursionError:  # nested deeper than any record the trainer writes (json reads it): planted, left as it is
        return
    if record["error"] != said:
        with contextlib.suppress(OSError, DockyardError):
            runfolder.write(path.parent, path.name, text)
    if me != 0 and (lost := LOST_SAID.match(record["error"])) and lost[1] == "0":
        with contextlib.suppress(OSError, DockyardError):
            runfolder.create(path.parent, runfolder.MANIFEST, text)


# how settle() words a node's failure
FAILED_FIRST = re.compile(r"node (\d{1,6}) \(.*?\) failed first: ")


def _failed_first(run_dir: Path, node: int, me: int, found: dict[int, tuple[int, int, int] | None]
                  ) -> tuple[int, str] | None:
    """The node that failed on its own error, and the error, following the records from `node` (the one this node
    lost): each a record of the node it names, written since this attempt began (`found`), saying it failed, and why,
    or naming in turn the node it lost. None where a record is missing, older, or says no reason of its own (stopped by
    torchrun, or a resumed run's interim record)."""
    from dockyard.train import manifest
    from dockyard.train.ending import STOPPED, UNRECORDED

    seen = {me}
    while node not in seen:
        seen.add(node)
        path = run_dir / runfolder.manifest_file(node)
        if _stamp(path) == found.get(node):
            return None  # no record of this attempt's (a missing one is stamped None as well)
        record = manifest.recorded(path.parent, path.name)
        if not (record.get("node_rank") == node and record.get("status") == "failed"):
            return None  # another node's (a survivor's manifest.json), or not one the trainer wrote
        error = str(record.get("error") or "")
        if UNRECORDED in error or error.startswith(STOPPED):
            return None
        if named := LOST_SAID.match(error) or FAILED_FIRST.match(error):
            node = int(named[1])
            continue
        return node, first_line(error, 200) or "no error recorded"
    return None


def _who(record: dict, node: int, a: argparse.Namespace) -> str:
    """Node `node` as the nodes said who they are (the manifest's nodes_seen): its address and host; node 0 before
    they said it, by the rendezvous' address; else '?'."""
    seen = record.get("nodes_seen") if isinstance(record.get("nodes_seen"), list) else []
    known = next((n for n in seen if isinstance(n, dict) and n.get("node_rank") == node), None)
    if known:
        return f"{known.get('addr') or '?'}, host {known.get('host')}"
    return a.rdzv_endpoint.rsplit(":", 1)[0] if node == 0 else "?"


def _node_rank() -> int | None:
    """This node's rank (DOCKYARD_NODE_RANK, which every launcher of the project sets, a run of one node too); None
    where it is not set or not a number. A torchrun of several nodes started by hand without it numbers the nodes
    itself, which its agent does not know here: taken for node 0, every node read and rewrote the run's manifest.json
    as its own (the workers' own reading, nodes.node_rank, takes torchrun's GROUP_RANK, which they alone are given)."""
    rank = os.environ.get(envvars.NODE_RANK, "")
    return int(rank) if rank.isascii() and rank.isdecimal() and len(rank) <= 6 else None


def _records(args: list[str], a: argparse.Namespace | None) -> dict[int, Path]:
    """Each node's record, for as many nodes as torchrun is given (--nnodes N or MIN:MAX)."""
    run_dir = runfolder.run_dir_of(args)
    try:
        count = int(str(a.nnodes).split(":")[-1]) if a else 1
    except ValueError:
        count = 1
    if not run_dir:
        return {}
    return {node: Path(run_dir) / runfolder.manifest_file(node) for node in range(min(max(count, 1), 1024))}


def this_attempts() -> dict[int, tuple[int, int, int] | None]:
    """Each node's record as it was when this attempt began, the nodes met (settle reads only those written since);
    before any attempt, as it is now."""
    return MET[-1] if MET else _stamps()


def _stamps() -> dict[int, tuple[int, int, int] | None]:
    return {node: _stamp(path) for node, path in RECORDS.items()}


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    """Which file `path` is (inode, size, mtime): runfolder.write replaces a manifest by a new file."""
    try:
        st = os.stat(path, follow_symlinks=False) if path else None
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st else None


def no_gpu_for_one_per_gpu(given: argparse.Namespace) -> bool:
    """--nproc-per-node=gpu where torch sees no GPU (torchrun's ValueError traceback: "Cuda is not available")."""
    if given.nproc_per_node != "gpu":
        return False
    import torch

    return not torch.cuda.is_available()


# One entry a rendezvous round this agent completed (next_rendezvous), which begins an attempt of the run: each node's
# record as it was then. With --max-restarts, a record an earlier attempt wrote is no record of this one's: stamped at
# the agent's start alone, node 0's restarted attempt took node 1's out-of-memory record of the attempt before for its
# own failure. Stamped once the nodes have met, not as this node joins: another node's workers of the attempt before
# may still be writing theirs until it joins too, and this attempt's start only once all have.
MET: list[dict[int, tuple[int, int, int] | None]] = []
RECORDS: dict[int, Path] = {}  # each node's record (main)
MEETING: dict = {}  # the rendezvous of several nodes this node waits for, and since when (waiting)
# in the c10d store: node 0's rendezvous id and number of nodes, and those the other nodes came with
# (rendezvous_store)
HOSTED, CAME_FOR = "dockyard/rendezvous-id", "dockyard/came-for"
HOSTED_COUNT, CAME_WITH = "dockyard/rendezvous-nodes", "dockyard/came-with-nodes"
STORE: list = []  # the c10d backend's store, once made
OTHER_RUN: list[str] = []  # node 0's rendezvous id, where it is not this node's
OTHER_COUNT: list[str] = []  # node 0's number of nodes, where it is not this node's


def fresh_store_per_attempt() -> None:
    """Each rendezvous round of torchrun's c10d handler starts a new store for the workers (see above)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    first = DynamicRendezvousHandler.next_rendezvous
    if getattr(first, "fresh_store_per_attempt", False):
        return

    def next_rendezvous(self):
        if hasattr(self, "_bootstrap_store_info") and hasattr(self, "_shared_tcp_store_server"):
            self._bootstrap_store_info = None  # rank 0 starts a new server, the others read where from the round
            self._shared_tcp_store_server = None
        else:
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        met = first(self)
        MET.append(_stamps())  # the nodes met: a rendezvous lost from here on is a node lost, not a wrong command
        if MEETING:  # (several nodes) the counterpart of waiting()'s line: the wait is over
            when = (f"again (attempt {len(MET)})" if len(MET) > 1 else
                    f"after {time.monotonic() - MEETING['since']:.0f} s")
            print(f"torchrun: the {MEETING['nodes']} nodes met in the rendezvous {MEETING['rdzv_id']} {when}; the "
                  "workers start", file=sys.stderr, flush=True)
        os.environ[envvars.ATTEMPT] = str(len(MET))  # the workers this round starts inherit it (ending.restarts)
        return met

    next_rendezvous.fresh_store_per_attempt = True
    DynamicRendezvousHandler.next_rendezvous = next_rendezvous


def share_cpu_cores(given: argparse.Namespace) -> None:
    """OMP_NUM_THREADS for the workers, unless set: this node's usable cores shared out between its processes."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    from torch.distributed.run import determine_local_world_size

    try:
        nproc = determine_local_world_size(given.nproc_per_node)
    except ValueError:  # torchrun says what is wrong with it itself
        return
    share = str(max(1, usable_cores() // max(1, nproc)))
    os.environ["OMP_NUM_THREADS"] = os.environ[envvars.CPU_SHARE] = share  # the trainer may re-share (train.cpus)


if __name__ == "__main__":
    sys.exit(main())
