"""dockyard.train.torchrun: torchrun, real, whose failed worker is one line, not torchrun's own traceback."""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dockyard import ROOT
from tests.support.processes import kill_tree, said_by


def bare(tmp_path) -> dict[str, str]:
    """A launcher's environment of its own: torch and dockyard, the system's tools, and the test's folder as TMPDIR,
    where torchrun makes the log folder it never removes (torch's DefaultLogsSpecs: a /tmp/torchelastic_* left by
    each launch of every test here)."""
    return {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}


def run(args: list[str], cwd, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command, whose launcher, if it hangs, fails this test with what it printed, its workers killed with it
    (subprocess.run's timeout kills the launcher only: the workers, each in a session of its own, went on)."""
    p = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid)
        out, err = p.communicate(timeout=30)
        raise AssertionError(f"{shlex.join(args[2:])} still running after {timeout:g} s:\n{out[-2000:]}\n"
                             f"{err[-3000:]}") from None
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def test_a_failed_worker_is_one_line_with_torchruns_exit_status_not_a_traceback(tmp_path):
    """A trainer refusing a setting says why in one line and exits 1; torchrun then printed forty lines of its own
    traceback (ChildFailedError) and a table under that line, in front of every user of invoke run and run.sh."""
    (tmp_path / "worker.py").write_text("import sys\nprint('error: the reason, in one line', file=sys.stderr)\n"
                                        "raise SystemExit(3)\n")
    plain = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--standalone",
                 "worker.py"], cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text("error: the reason, in one line\n")
    quiet = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                 "worker.py", "--run-dir", "run"], cwd=tmp_path,
                env=bare(tmp_path))
    assert plain.returncode == quiet.returncode == 1
    assert "Traceback" in plain.stderr and "ChildFailedError" in plain.stderr  # what users saw
    assert "Traceback" not in quiet.stderr and "error: the reason, in one line" in quiet.stderr
    assert "failed (exitcode: 3)" in plain.stderr and "failed (exitcode" not in quiet.stderr, "torchrun's log line too"
    assert quiet.stderr.rstrip().splitlines()[-1] == ("torchrun: worker.py failed: rank 0 (local rank 0) first, exit 3; "
                                                      "its reason is above (and in the run's train.log)")
    # a run refused before it had a folder has no train.log to point at
    (tmp_path / "run" / "train.log").unlink()
    again = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                 "worker.py", "--run-dir", "run"], cwd=tmp_path,
                env=bare(tmp_path))
    assert again.stderr.rstrip().endswith("exit 3; its reason is above"), again.stderr


def test_a_worker_killed_by_sigkill_is_said_to_have_said_nothing(tmp_path):
    """A worker the kernel's out-of-memory killer ended (SIGKILL) says nothing: "its reason is above" sent the user
    looking for a line no process could print."""
    (tmp_path / "worker.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone", "worker.py"],
            cwd=tmp_path, env=bare(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith(
        "torchrun: worker.py failed: rank 0 (local rank 0) first, signal SIGKILL; killed, so it could say nothing: "
        "most often by the kernel's out-of-memory killer"), r.stderr


def test_a_run_that_succeeds_exits_0_and_leaves_no_log_folder_behind(tmp_path):
    """torch's torchrun makes a log folder in TMPDIR (/tmp/torchelastic_<random>) and never removes it: every
    `invoke run --native` left one in the host's /tmp (458 of them on this CI host). Ours removes its own, after a
    failure too (the worker's error file in it is read first: the failed-worker case's one line names the exit);
    a --log-dir given is the user's, and kept."""
    (tmp_path / "worker.py").write_text("print('trained')\n")
    (tmp_path / "tmp").mkdir()
    env = {**bare(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    ok = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
              "worker.py"], cwd=tmp_path, env=env)
    assert ok.returncode == 0 and "trained" in ok.stdout
    (tmp_path / "failing.py").write_text("raise SystemExit(3)\n")
    failed = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                  "failing.py"], cwd=tmp_path, env=env)
    assert failed.returncode == 1 and "first, exit 3" in failed.stderr, failed.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
    kept = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                "--log-dir", str(tmp_path / "mine"), "worker.py"], cwd=tmp_path, env=env)
    assert kept.returncode == 0 and (tmp_path / "mine").is_dir() and list((tmp_path / "tmp").iterdir()) == []


def test_the_log_folder_of_a_launcher_killed_outright_is_removed_by_the_next_and_a_running_ones_is_kept(tmp_path):
    """A launcher killed with SIGKILL (the OOM killer, a node-lost test) cannot remove its log folder: one
    /tmp/dockyard-torchrun-* was left in this host's /tmp each hour of CI. The next launch removes it; the folder of a
    launcher still running is left alone."""
    import time

    (tmp_path / "tmp").mkdir()
    env = {**bare(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "waits.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    (tmp_path / "worker.py").write_text("print('trained')\n")
    launch = [sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone"]

    def started() -> subprocess.Popen:
        p = subprocess.Popen([*launch, "waits.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while "started" not in p.stdout.readline():  # its folder is made before the worker starts
            assert p.poll() is None and time.monotonic() < deadline, said_by(p)
        return p

    killed = started()
    [orphan] = list((tmp_path / "tmp").iterdir())
    kill_tree(killed.pid)  # SIGKILL to the launcher and its worker: no finally runs
    killed.wait(timeout=30)
    running = started()
    try:
        assert not orphan.exists(), "the killed launcher's log folder is still there"
        [kept] = list((tmp_path / "tmp").iterdir())
        ok = run([*launch, "worker.py"], cwd=tmp_path, env=env)
        assert ok.returncode == 0 and "trained" in ok.stdout, ok.stderr
        assert list((tmp_path / "tmp").iterdir()) == [kept]  # the running launcher's, in use
    finally:
        kill_tree(running.pid)
        running.wait(timeout=30)


def test_a_node_alone_says_what_it_starts_before_its_workers_say_anything(tmp_path):
    """`invoke run` in the cpu image said nothing for 24 s after its `docker run` line (48 s on a loaded host): the
    trainer's processes each load torch, transformers and DeepSpeed before the run's first line. The launcher says what
    it starts as it starts it, before any worker has loaded anything, and for the trainer what the wait is."""
    from dockyard.train import torchrun

    (tmp_path / "worker.py").write_text("import sys, time\ntime.sleep(1)\nprint('worker: loaded', file=sys.stderr)\n")
    ok = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=2", "--standalone", "worker.py"],
             cwd=tmp_path, env=bare(tmp_path))
    assert ok.returncode == 0 and ok.stderr.splitlines()[0] == "torchrun: starting 2 processes of worker.py", ok.stderr
    trainer = torchrun.torchrun_args(["--nproc-per-node=gpu", "--standalone", "-m", "dockyard.train", "--recipe", "ddp"])
    assert torchrun.starting(trainer) == ("starting one process per GPU of dockyard.train: each loads torch, "
                                          "transformers and DeepSpeed before the run's first line (seconds to a minute)")


RESTARTED_WORKER = """
import os, signal, time
import torch
import torch.distributed as dist

attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
print(f"attempt {attempt} rank {rank} meets at {os.environ['MASTER_PORT']}", flush=True)
if attempt and rank == 1:
    time.sleep(1)  # the new rank 0 looks up rank 1 first
dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(100):
    dist.all_reduce(t)
    if attempt < 3 and rank == 1 and step == 50:
        os.kill(os.getpid(), signal.SIGKILL)  # lost mid-run: torchrun restarts both
print(f"attempt {attempt} rank {rank} done at {os.environ['MASTER_PORT']} {os.environ['TORCHELASTIC_USE_AGENT_STORE']}",
      flush=True)
dist.destroy_process_group()
"""


def test_restarted_workers_meet_in_a_store_of_their_own_not_their_dead_predecessors(tmp_path):
    """torchrun --max-restarts: torch keeps the agent's first store for every attempt, and a restarted rank 0 could
    connect to the address a dead rank had left there (pytorch/pytorch#135712): gloo's "connection refused", or both
    ranks waiting for ever. The wrapper starts the store afresh for each attempt (a new port each time, still the
    agent's: the nodes' heartbeat needs it to outlive the workers). A real torchrun with 2 gloo workers;
    rank 1 dies mid-run three times (plain torchrun failed or hung in 3 of 4 such runs here), the fourth attempt
    finishes."""
    (tmp_path / "worker.py").write_text(RESTARTED_WORKER)
    p = subprocess.Popen([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=2", "--standalone",
                          "--max-restarts=3", "worker.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**bare(tmp_path), "OMP_NUM_THREADS": "1"})
    try:
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:  # hung (the old behaviour): its workers too, or they would outlive the test
            kill_tree(p.pid)
    assert p.returncode == 0, stderr[-3000:]
    met = set(re.findall(r"attempt (\d) rank \d meets at (\d+)", stdout))
    ports = {attempt: port for attempt, port in met}
    assert len(met) == len(ports) == 4 and len(set(ports.values())) == 4, f"one new store per attempt: {sorted(met)}"
    done = sorted(re.findall(r"attempt (\d) rank (\d) done at (\d+) (True|False)", stdout))
    assert [(a, rank) for a, rank, _, _ in done] == [("3", "0"), ("3", "1")], stdout
    assert {agents for _, _, _, agents in done} == {"True"}, "the store is still the agent's"


THREADS_WORKER = """
import os, torch
print(f"rank {os.environ['RANK']} threads {os.environ['OMP_NUM_THREADS']} torch {torch.get_num_threads()} "
      f"share {os.environ.get('DOCKYARD_CPU_SHARE', '-')}", flush=True)
"""


def _threads(tmp_path, nproc: int, **env: str) -> tuple[set[str], str]:
    (tmp_path / "worker.py").write_text(THREADS_WORKER)
    p = run([sys.executable, "-m", "dockyard.train.torchrun", f"--nproc-per-node={nproc}", "--standalone",
             "worker.py"], cwd=tmp_path,
            env={**bare(tmp_path), **env})
    assert p.returncode == 0, p.stderr[-3000:]
    return set(re.findall(r"threads (\d+) torch (\d+) share ([-\d]+)", p.stdout)), p.stderr


def test_each_worker_gets_its_share_of_the_nodes_cores_not_torchruns_one(tmp_path):
    """torchrun gave every worker OMP_NUM_THREADS=1 (and four lines asking to tune it): DeepSpeed's CPU Adam, the
    offload recipes' optimizer step, then ran on one core per GPU on nodes of dozens. The wrapper shares the cores
    this process may use (affinity, hyperthreads and the cgroup's quota counted) between the node's workers; a value
    the user set is kept. Real torchrun workers report what they got."""
    from dockyard.common.cores import usable_cores

    cores = usable_cores()
    one, _ = _threads(tmp_path, 1)
    assert one == {(str(cores), str(cores), str(cores))}, one  # and says it is its share (train.cpus re-shares it)
    two, said = _threads(tmp_path, 2)
    share = str(max(1, cores // 2))
    assert two == {(share, share, share)}, two
    assert "Setting OMP_NUM_THREADS" not in said, said[-2000:]  # torchrun's banner, printed when it chose 1
    kept, _ = _threads(tmp_path, 2, OMP_NUM_THREADS="3")
    assert {(env, ours) for env, _, ours in kept} == {("3", "-")}, kept  # (torch uses no more threads than cores)


def test_the_cores_usable_are_capped_by_the_containers_cpu_quota(tmp_path):
    from dockyard.common.cores import cpu_quota, usable_cores

    v2 = tmp_path / "v2"
    v2.mkdir()
    assert cpu_quota(v2) is None and usable_cores(v2) >= 1  # no cgroup files: no limit
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(v2) is None
    (v2 / "cpu.max").write_text("150000 100000\n")  # docker run --cpus=1.5, a Kubernetes limit of 1500m
    assert cpu_quota(v2) == 1.5 and usable_cores(v2) == 1
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cpu_quota(v1) == 1.0 and usable_cores(v1) == 1
    (v2 / "cpu.max").write_text("garbage\n")
    assert cpu_quota(v2) is None
    (v2 / "cpu.max").write_text("1e400 100000\n")  # not a quota a kernel writes: an OverflowError traceback, before
    assert cpu_quota(v2) is None and usable_cores(v2) >= 1


def test_an_omp_num_threads_that_is_not_a_thread_count_is_refused_naming_it(tmp_path):
    """"abc" gave three lines of libgomp's "Invalid value" and then the trainer's "invalid literal for int()",
    naming no variable; "0" ran on one thread, under accelerate's warning that it was unset."""
    (tmp_path / "worker.py").write_text("print('trained')\n")
    for value in ("abc", "", "0", "-2", "1.5", "²"):  # ²: a digit to str.isdigit, not to int()
        r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                 "worker.py"], cwd=tmp_path,
                env={**bare(tmp_path), "OMP_NUM_THREADS": value})
        assert r.returncode == 2 and "trained" not in r.stdout, (value, r.stdout, r.stderr)
        assert r.stderr.strip() == (f"torchrun: OMP_NUM_THREADS={value!r}: give a whole number of CPU threads per "
                                    "process, 1 or more, or unset it (each process then gets its share of the node's "
                                    "cores)"), (value, r.stderr)


def test_nodes_that_never_meet_are_one_line_naming_the_rendezvous_and_what_to_check(tmp_path, loopback_port):
    """Node 0 alone: torchrun's 45-line traceback ending in a bare RendezvousTimeoutError. Real torchrun, two nodes
    asked for on loopback, the second never started."""
    port = loopback_port
    (tmp_path / "worker.py").write_text("print('never started')\n")
    alone = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=alone1",
                 "--rdzv-conf=is_host=1,join_timeout=3", "--local-addr=127.0.0.1", "worker.py"],
                cwd=tmp_path,
                env={**bare(tmp_path), "DOCKYARD_NODE_RANK": "0"})
    assert alone.stderr.startswith(f"torchrun: node 0 of 2 hosts the rendezvous alone1 at 127.0.0.1:{port}: waiting up "
                                   "to 3 s for the other node(s) to join\n"), alone.stderr
    assert alone.returncode == 1 and "Traceback" not in alone.stderr, alone.stderr
    assert alone.stderr.strip().splitlines()[-1] == (
        f"torchrun: not every node joined the rendezvous alone1 at 127.0.0.1:{port} within 3 s: start every node with "
        "the same --run-id, --master-addr and --master-port (--nodes=2); invoke doctor --peer=HOST checks the port from "
        "another node; a node that was started but did not join cannot reach 127.0.0.1 (its --master-addr) on TCP port "
        f"{port}: a firewall, or another address")


def test_each_node_says_whom_it_waits_for_and_one_that_cannot_reach_node_0_gives_up_within_the_join_timeout(
        tmp_path, loopback_port):
    """Node 1 started before node 0 (or told another --master-addr, or behind a firewall): silent, it waited for torch's
    60 s read timeout twice over (128 s with --join-timeout=20 between two network namespaces), then said to start
    every node alike, not what to check. Now it says whom it waits for at once, gives up within the join timeout, and
    names node 0, its address, the port and a firewall. Real torchrun, on loopback, a port nothing listens on."""
    import time

    port = loopback_port
    (tmp_path / "worker.py").write_text("print('never started')\n")
    started = time.monotonic()
    r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=far1",
             "--rdzv-conf=is_host=0,join_timeout=6", "--local-addr=127.0.0.1", "worker.py"],
            cwd=tmp_path, env={**bare(tmp_path), "DOCKYARD_NODE_RANK": "1"},
            timeout=90)
    took = time.monotonic() - started
    said = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr and took < 6 + 30, (took, r.stderr)  # 30: torch's import
    assert said[0] == (f"torchrun: node 1 of 2 joining the rendezvous far1 at 127.0.0.1:{port}: waiting up to 6 s for "
                       "node 0, which hosts it"), said
    assert said[-1].startswith(f"torchrun: cannot reach the rendezvous far1 at 127.0.0.1:{port} within 6 s (node 0 "
                               "hosts it; "), said
    assert said[-1].endswith(f"check that node 0 runs (--node-rank=0, started within --join-timeout of this node), "
                             f"that 127.0.0.1 is its address (--master-addr), and that no firewall drops TCP port {port} "
                             "on the way; start every node with the same --run-id and --master-port (--nodes=2); "
                             "invoke doctor --peer=127.0.0.1 checks the port from here"), said



def test_nodes_that_meet_each_say_so_with_how_long_they_waited(tmp_path, loopback_port):
    """The counterpart of the waiting line: torchrun said nothing between starting and the workers' own output, so a
    node that had waited did not say that the wait was over. Two real torchruns on loopback, node 1 a moment late."""
    import time

    port = loopback_port
    (tmp_path / "worker.py").write_text("print('trained', flush=True)\n")
    nodes = []
    for rank in (0, 1):
        nodes.append(_torchrun_node(tmp_path, port, rank, "met1", 2, join_timeout=60))
        time.sleep(3)
    try:
        said = [p.communicate(timeout=120) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                kill_tree(p.pid)
    for rank, (p, (out, err)) in enumerate(zip(nodes, said, strict=True)):
        assert p.returncode == 0 and out.count("trained") == 1, (rank, out, err)
        lines = err.strip().splitlines()
        assert re.fullmatch(r"torchrun: the 2 nodes met in the rendezvous met1 after \d+ s; the workers start",
                            lines[1]), (rank, err)



def _torchrun_node(tmp_path, port: int, rank: int, run_id: str, nnodes, join_timeout: int,
                   go: Path | None = None) -> subprocess.Popen:
    """A real torchrun of one process as node `rank` of `nnodes` on loopback, running tmp_path's worker.py; given `go`,
    one whose Python imports torch's launcher at once and starts it once the test has written `go` (PREWARMED)."""
    start = [sys.executable, "-c", PREWARMED, str(go)] if go else [sys.executable, "-m", "dockyard.train.torchrun"]
    return subprocess.Popen(
        [*start, "--nproc-per-node=1", f"--nnodes={nnodes}",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
         f"--rdzv-conf=is_host={int(rank == 0)},join_timeout={join_timeout}", "--local-addr=127.0.0.1", "worker.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**bare(tmp_path), "DOCKYARD_NODE_RANK": str(rank)})


def _hosting(node0: subprocess.Popen, port: int, bound: float = 120):
    """A client of node 0's store once node 0 hosts its rendezvous there (its id and number of nodes written): a node
    that came before that found nothing to compare with. A fixed 3 s was the host's to miss (torch's import alone
    takes longer on a loaded one). The client connects once the port listens: one that tried before, each try torch's
    5 s timeout and a delay of up to 5 s, came up to 10 s into node 0's wait."""
    import datetime
    import time

    from torch.distributed import TCPStore

    from dockyard.train import torchrun

    deadline = time.monotonic() + bound
    store = None
    while store is None or not store.check([torchrun.HOSTED_COUNT]):
        assert node0.poll() is None and time.monotonic() < deadline, "node 0 never hosted: " + said_by(node0)
        if store is None and _listening(port):
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
        time.sleep(0.1)
    return store


def _listening(port: int) -> bool:
    """Whether a socket listens on TCP `port` here, as the kernel's tables say (no connection made: the port's holder,
    tests/support/ports.py, is bound there without listening)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):  # tcp6: a kernel without IPv6
            continue
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


# node 0's wait in the tests of a node 1 that comes once node 0 hosts: node 1 must be refused (or come) within it. A
# node 1 started then, a Python importing torch and then torchrun, missed 10-15 s on a loaded 2-core host (CI's unit
# tests run beside the images' builds), and 30 s was sat out by each test; node 1 now imports torch beside node 0
# (PREWARMED) and is let go once node 0 hosts: what is left of its start is the launcher's own, a second or two
JOIN = 15

# python -c PREWARMED GO ARGS...: dockyard.train.torchrun ARGS as `python -m` runs it, once the file GO exists, torch's
# launcher imported before (dockyard's launcher itself is not: run as __main__, it is not also a module of its own)
PREWARMED = """import os, runpy, sys, time
import torch.distributed.run
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend
go, deadline = sys.argv.pop(1), time.monotonic() + 300
while not os.path.exists(go):
    assert time.monotonic() < deadline, "never let go"
    time.sleep(0.05)
runpy.run_module("dockyard.train.torchrun", run_name="__main__", alter_sys=True)
"""


def _node_1_refused_at_once(tmp_path, port: int, nodes: tuple, join_timeout: int):
    """Two real torchruns on loopback, each (rank, run id, node count), node 1 let go once node 0 hosts the
    rendezvous: node 1 must end within the join timeout while node 0 still waits; both ended, their processes and
    (stdout, stderr) by rank."""
    procs = []
    try:
        for rank, run_id, count in nodes:
            procs.append(_torchrun_node(tmp_path, port, rank, run_id, count, join_timeout,
                                        go=tmp_path / "go" if rank else None))
        _hosting(procs[0], port)
        (tmp_path / "go").touch()
        # node 1 ends before node 0's wait (started earlier) does: it was refused, not timed out
        node1 = procs[1].communicate(timeout=join_timeout)
        assert procs[0].poll() is None, "node 0 should still be waiting"
        return procs, (procs[0].communicate(timeout=120), node1)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)


def test_a_node_given_another_run_id_is_told_node_0_s_at_once_and_node_0_which_came(tmp_path, loopback_port):
    """--run-id mn70p on node 0 and mn70q on node 1 (two network namespaces): node 1 reached node 0's store, and both
    waited out the join timeout, each then told to check a firewall or its --master-addr. Two real torchruns on
    loopback: node 1 stops at once naming node 0's id, and node 0, when its wait ends, the id that came."""
    port = loopback_port
    (tmp_path / "worker.py").write_text("print('never started')\n")
    nodes, (node0, node1) = _node_1_refused_at_once(tmp_path, port, ((0, "idA", 2), (1, "idB", 2)), join_timeout=JOIN)
    assert nodes[1].returncode == 1 and "Traceback" not in node1[1], node1[1]
    assert node1[1].strip().splitlines()[-1] == (
        f"torchrun: node 0 at 127.0.0.1:{port} hosts the rendezvous idA, not this node's idB: start every node with "
        "the same --run-id (node 0's is idA); where both runs are meant, give this one another --master-port")
    assert nodes[0].returncode == 1 and node0[1].strip().splitlines()[-1] == (
        f"torchrun: not every node joined the rendezvous idA at 127.0.0.1:{port} within {JOIN} s: a node came for the "
        "rendezvous idB: start every node with the same --run-id (idA here)"), node0[1]


def _node_0_beside_a_stranger(tmp_path, port: int, appended: str) -> tuple[int, str]:
    """A real torchrun as node 0 of two, alone, and a stranger's TCPStore client (this test's) that appends
    `appended` to the ids the nodes came for once node 0 hosts the rendezvous, well within its wait (a stranger's
    process started a fixed 3 s after node 0, which then had to load torch, could come after a loaded host's node 0
    had ended its wait): node 0's exit status and stderr once its wait ran out. The wait is JOIN: a wait of 10 s
    missed this test's client, which then tried to connect before node 0 listened (see _hosting)."""
    (tmp_path / "worker.py").write_text("print('never started')\n")
    node0 = _torchrun_node(tmp_path, port, 0, "idA", 2, join_timeout=JOIN)
    try:
        _hosting(node0, port).append("dockyard/came-for", appended)
        _, err = node0.communicate(timeout=120)
    finally:
        if node0.poll() is None:
            kill_tree(node0.pid)
    return node0.returncode, err


def test_a_rendezvous_id_a_stranger_wrote_in_node_0_s_store_reaches_its_terminal_escaped(tmp_path, loopback_port):
    """Node 0's store answers anyone who reaches its port (torch's TCPStore has no password): a stranger appending
    an id of escape sequences to the ids the nodes came for had node 0 write them, raw, into its user's terminal as
    its wait ended (a window title set, the screen cleared, the clipboard written: OSC 52). A real torchrun as node
    0, and a stranger's TCPStore client: node 0's line shows the escapes as text."""
    returncode, err = _node_0_beside_a_stranger(tmp_path, loopback_port, "\x1b]0;pwned\x07\x1b[2Jevil\n")
    assert returncode == 1 and "\x1b" not in err and "\x07" not in err, err
    assert err.strip().splitlines()[-1].startswith(
        f"torchrun: not every node joined the rendezvous idA at 127.0.0.1:{loopback_port} within {JOIN} s: a node "
        "came for the rendezvous \\x1b]0;pwned\\x07\\x1b[2Jevil"), err


def test_the_rendezvous_ids_a_stranger_wrote_by_the_thousand_are_said_in_a_line_of_a_few(tmp_path, loopback_port):
    """A stranger's client appending 5,000 made-up ids of 200 characters to the ids the nodes came for (anyone who
    reaches node 0's port may: TCPStore has no password) had node 0 end its wait with one line of a megabyte, every
    id written out. The first few are said, each cut, and how many more came."""
    returncode, err = _node_0_beside_a_stranger(
        tmp_path, loopback_port, "".join(f"{i:05d}" + "x" * 195 + "\n" for i in range(5000)))
    last = err.strip().splitlines()[-1]
    assert returncode == 1 and len(last) < 1000, len(last)
    assert last.startswith(f"torchrun: not every node joined the rendezvous idA at 127.0.0.1:{loopback_port} within "
                           f"{JOIN} s: a node came for the rendezvous 00000xxx") and "and 4997 more" in last, last


@pytest.mark.parametrize("node0, node1", [(3, 2), (2, 3)])
def test_a_node_given_another_node_count_is_told_node_0_s_at_once_and_node_0_which_came(tmp_path, loopback_port,
                                                                                        node0, node1):
    """--nodes=3 on node 0 and 2 on node 1 (a typo on one node): the two met and trained, world size 2, node 0 saying
    "the 3 nodes met". --nodes=2 on node 0 and 3 on node 1: both waited out the join timeout, node 1 told it could not
    reach node 0, node 0 that not every node joined. Two real torchruns on loopback: node 1 stops at once naming node
    0's count, and node 0, when its wait ends, the count that came; no worker starts."""
    port = loopback_port
    (tmp_path / "worker.py").write_text("print('trained', flush=True)\n")
    nodes, (node0_said, node1_said) = _node_1_refused_at_once(tmp_path, port, ((0, "cnt1", node0), (1, "cnt1", node1)),
                                                              join_timeout=JOIN)
    assert "trained" not in node0_said[0] + node1_said[0], "no worker trains in a run of another size than asked for"
    assert nodes[1].returncode == 1 and "Traceback" not in node1_said[1], node1_said[1]
    assert node1_said[1].strip().splitlines()[-1] == (
        f"torchrun: node 0 at 127.0.0.1:{port} hosts the rendezvous cnt1 for --nodes={node0}, this node was started "
        f"with --nodes={node1}: start every node with the same --nodes (compose: NNODES), the number of nodes the run "
        "has"), node1_said[1]
    assert nodes[0].returncode == 1 and node0_said[1].strip().splitlines()[-1] == (
        f"torchrun: not every node joined the rendezvous cnt1 at 127.0.0.1:{port} within {JOIN} s: a node started with "
        f"--nodes={node1} came: start every node with the same --nodes (compose: NNODES; {node0} here)"), node0_said[1]


def test_nodes_given_one_count_as_min_max_are_not_told_to_give_the_same_count(tmp_path, loopback_port):
    """--nnodes=3:3 on both nodes (a Kubeflow PyTorchJob's elastic policy writes PET_NNODES as MIN:MAX), the third node
    never started: node 0's store holds the count as torch reads it (3), and node 0, comparing it with its own as typed
    (3:3), ended its wait saying "a node started with --nodes=3 came: start every node with the same --nodes (3:3
    here)", which every node was. It says what a wait that nobody cut short says: a node that did not join.
    Node 1 is seen to come, its count in node 0's store, before node 0's wait ends: one that came later (a loaded
    host) left nothing to compare, and the test passed whatever node 0 made of a count."""
    import time

    from dockyard.train import torchrun

    port = loopback_port
    (tmp_path / "worker.py").write_text("print('never started')\n")
    procs = []
    try:
        procs.append(_torchrun_node(tmp_path, port, 0, "mm1", "3:3", join_timeout=JOIN))
        procs.append(_torchrun_node(tmp_path, port, 1, "mm1", "3:3", join_timeout=JOIN, go=tmp_path / "go"))
        store = _hosting(procs[0], port)
        (tmp_path / "go").touch()
        while not store.check([torchrun.CAME_WITH]):
            assert procs[0].poll() is None, "node 1 came after node 0's wait (nothing tested): " + said_by(procs[1])
            time.sleep(0.1)
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
    last = err.strip().splitlines()[-1]
    assert procs[0].returncode == 1 and last.startswith(
        f"torchrun: not every node joined the rendezvous mm1 at 127.0.0.1:{port} within {JOIN} s: start every node with "
        "the same --run-id"), err
    assert "same --nodes" not in last, last


def test_one_process_per_gpu_where_torch_sees_none_is_one_line(tmp_path):
    """compose/multinode.yml's default (DOCKYARD_NPROC=gpu) on a node without GPUs: torchrun's ValueError traceback
    ("Cuda is not available"). CUDA_VISIBLE_DEVICES="" hides any GPU this runs on."""
    (tmp_path / "worker.py").write_text("print('never started')\n")
    r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=gpu", "--standalone",
             "worker.py"], cwd=tmp_path,
            env={**bare(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "never started" not in r.stdout, r.stderr
    assert r.stderr.strip() == ("torchrun: --nproc-per-node=gpu (one process per GPU), but torch sees no GPU here: "
                                "give a number of processes (compose: DOCKYARD_NPROC=2 on a node without GPUs), or add "
                                "the GPUs (compose/gpu.yml)")


def test_node_0_whose_rendezvous_port_is_taken_is_told_so_not_to_start_the_other_nodes(tmp_path):
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    (tmp_path / "worker.py").write_text("print('never started')\n")
    try:
        r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=taken1",
                 "--rdzv-conf=is_host=1,join_timeout=3", "--local-addr=127.0.0.1", "worker.py"],
                cwd=tmp_path,
                env=bare(tmp_path))
    finally:
        held.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"torchrun: port {port} is taken on this node, which hosts the rendezvous taken1 (node 0): give every node "
        "another --master-port (or stop what holds it)")


def test_a_signal_to_torchrun_is_one_line_with_128_and_the_signal(tmp_path):
    """Ctrl-C (or SIGTERM) to torchrun: it stops its workers, then raised SignalException out of its main, and Python
    printed its traceback under every interrupted run (20 lines, after each worker's own)."""
    import time

    (tmp_path / "worker.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(3600)\n")
    p = subprocess.Popen([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                          "worker.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=bare(tmp_path))
    try:
        assert select.select([p.stdout], [], [], 120)[0], "the worker did not start within 120 s"
        assert p.stdout.readline().strip() == "started"
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    assert p.returncode == 130, err
    # (the worker's own KeyboardInterrupt is its to say: the trainer says it in one line)
    assert "SignalException" not in err and "torch/distributed" not in err, err
    assert err.strip().splitlines()[-1] == "torchrun: stopped by SIGINT; the workers were stopped with it", err


def test_values_torchrun_refuses_only_in_a_traceback_are_one_line_naming_compose_s_variable(tmp_path):
    """compose/multinode.yml hands its user's NNODES, DOCKYARD_NPROC, MASTER_ADDR:MASTER_PORT, JOIN_TIMEOUT and
    MAX_RESTARTS to torchrun unchecked: NNODES=abc, DOCKYARD_NPROC=0, MAX_RESTARTS=-1, MASTER_PORT=99999 or
    JOIN_TIMEOUT=0 were torchrun's ValueError or AssertionError, 30 lines of traceback from deep in its launcher; an
    NNODES of 5,000 digits Python's ValueError reading it, JOIN_TIMEOUT=99999999999999 torch's OverflowError."""
    (tmp_path / "worker.py").write_text("print('never started')\n")
    rdzv = ["--rdzv-backend=c10d", "--rdzv-id=x", "--local-addr=127.0.0.1"]
    cases = {
        "--nnodes=abc": "--nnodes='abc': give the number of nodes, 1 to 4096 (compose: NNODES)",
        "--nnodes=2:1": "--nnodes='2:1': give the number of nodes, 1 to 4096 (compose: NNODES)",
        f"--nnodes=1:{'9' * 5000}": f"--nnodes='1:{'9' * 5000}': give the number of nodes, 1 to 4096 (compose: NNODES)",
        "--nproc-per-node=0": "--nproc-per-node='0': give the processes of this node, 1 to 4096, or gpu for one per "
                              "GPU (compose: DOCKYARD_NPROC)",
        "--max-restarts=-1": "--max-restarts=-1: give 0 or more (compose: MAX_RESTARTS)",
        "--rdzv-endpoint=10.0.0.1:99999": "--rdzv-endpoint='10.0.0.1:99999': The port number of the rendezvous "
                                          "endpoint '10.0.0.1:99999' must be an integer between 0 and 65536. (compose: "
                                          "MASTER_ADDR and MASTER_PORT)",
        "--rdzv-endpoint=a b:29500": "--rdzv-endpoint='a b:29500': The hostname of the rendezvous endpoint 'a b:29500' "
                                     "must be a dot-separated list of labels, an IPv4 address, or an IPv6 address. "
                                     "(compose: MASTER_ADDR and MASTER_PORT)",
        "--rdzv-conf=is_host=1,join_timeout=0": "join_timeout='0' in --rdzv-conf: give whole seconds, 1 to 604800 (a "
                                                "week; compose: JOIN_TIMEOUT; invoke run, slurm and k8s: --join-timeout)",
        "--rdzv-conf=is_host=1,join_timeout=99999999999999": "join_timeout='99999999999999' in --rdzv-conf: give whole "
                                                             "seconds, 1 to 604800 (a week; compose: JOIN_TIMEOUT; invoke "
                                                             "run, slurm and k8s: --join-timeout)",
    }
    for flag, said in cases.items():
        r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=1",
                 "--rdzv-endpoint=127.0.0.1:1", "--rdzv-conf=is_host=1,join_timeout=3", *rdzv, flag, "worker.py"],
                cwd=tmp_path, env=bare(tmp_path), timeout=120)
        assert r.returncode == 2 and "never started" not in r.stdout, (flag, r.stderr[-1500:])
        assert r.stderr.strip() == f"torchrun: {said}", (flag, r.stderr[-1500:])


def test_more_processes_of_a_node_than_invoke_run_takes_are_refused_before_any_starts():
    """compose's DOCKYARD_NPROC=99999999999 (a typo, a value pasted twice) passed the check: torchrun started workers
    until the host's memory ran out (225 of them froze a 23 GiB host for half an hour, reproduced). The image's
    torchrun takes what invoke run and run.sh take, at most 4096. Read here without starting torchrun: the code before
    the fix starts every one."""
    from dockyard.train import torchrun

    for nproc in ("4097", "99999999999", "1" * 5000):
        given = torchrun.torchrun_args([f"--nproc-per-node={nproc}", "--standalone", "worker.py"])
        assert torchrun.bad_value(given) == (f"--nproc-per-node={nproc!r}: give the processes of this node, 1 to 4096, "
                                             "or gpu for one per GPU (compose: DOCKYARD_NPROC)")
    assert torchrun.bad_value(torchrun.torchrun_args(["--nproc-per-node=4096", "--standalone", "worker.py"])) is None


# A worker that ends as the trainer does (dockyard.train.ending: SIGTERM recorded, its one line said); the rank named
# by FAIL_RANK refuses a setting. The workers here that wait to be stopped (by torchrun, or killed with their node)
# sleep an hour, longer than any bound of the tests': one that slept a minute ended on its own, exit 0, on a host loaded
# enough that the test waited longer than that for the other node's worker to start (its bound is 120 s) or for torchrun
# to see node 0 gone, and node 1 then said torch's "Error waiting on exit barrier" traceback and exited 0, in place of
# what the test checks. A torchrun that never stops them still fails the test, at the test's own bound.
TRAINER_WORKER = """
import os, sys, time
from dockyard.common.errors import DockyardError
from dockyard.train import ending
ending.begin()
open(sys.argv[1] + os.environ["RANK"], "w")
try:
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        while not os.path.exists(sys.argv[1] + "0"):
            time.sleep(0.1)
        raise DockyardError("invalid training setting: nonsense")
    time.sleep(3600)
except BaseException as e:
    sys.exit(ending.failed(e, None))
"""


@pytest.mark.parametrize("worker", ["bare", "the trainer's ending"])
def test_node_0_lost_after_the_nodes_met_is_said_as_such_not_as_a_rendezvous_never_met(tmp_path, worker,
                                                                                      loopback_port):
    """Node 0's machine gone mid-run: node 1's torchrun, whose next look at the rendezvous failed, said "cannot reach
    the rendezvous ...: start every node with the same --run-id, --master-addr and --master-port", advice for nodes
    that never met, after torch's warnings that its keep-alive and shutdown of the rendezvous had failed: one line
    now. And node 1's trainer, stopped by its torchrun, said first "error: stopped by SIGTERM: another rank failed (its
    error is above) ...", with nothing above (the failure was node 0's): torchrun's line alone says it now. Real
    torchrun, two agents on loopback; node 0's agent and worker killed once both workers run."""
    import time

    port = loopback_port
    (tmp_path / "worker.py").write_text(TRAINER_WORKER if worker != "bare" else
                                        "import os, sys, time\nopen(sys.argv[1] + os.environ['RANK'], 'w')\n"
                                        "time.sleep(3600)\n")
    env = bare(tmp_path)
    procs = []
    for host in (1, 0):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=met1",
             f"--rdzv-conf=is_host={host},join_timeout=30", "--monitor-interval=0.5", "--local-addr=127.0.0.1",
             "worker.py", str(tmp_path / "started")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True))
    node0, node1 = procs
    try:
        deadline = time.monotonic() + 120
        while not ((tmp_path / "started0").exists() and (tmp_path / "started1").exists()):
            assert time.monotonic() < deadline and node1.poll() is None, said_by(node1)
            time.sleep(0.2)
        kill_tree(node0.pid)  # node 0's machine gone: its agent (and the store) and its worker
        out, err = node1.communicate(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
        node0.communicate(timeout=30)
    said = [line for line in err.splitlines() if line.startswith("torchrun: ")]
    assert node1.returncode == 1 and said, err[-3000:]
    # torch's "W1206 06:08:14.441000 11715 .../dynamic_rendezvous.py:1298] The node '127.0.0.1_11715_0' has failed to
    # shutdown the rendezvous 'met1' due to an error of type RendezvousConnectionError." (and its keep-alive's) before it
    # (after its own lines saying whom it waited for, and that the nodes met)
    assert err.splitlines()[:2] == said[:2] and " met in the rendezvous met1 after " in said[1], err[-3000:]
    assert err.splitlines()[2:] == said[-1:], err[-3000:]
    assert said[-1].startswith(f"torchrun: the rendezvous met1 at 127.0.0.1:{port} went away after the nodes had met ("), \
        err[-3000:]
    assert said[-1].endswith("): node 0, which hosts it, stopped or was lost (its own output, or the run's manifest, "
                             "says why); this node stopped with it"), said[-1]


WORKER_RECORDING_A_STOP = """
import json, os, signal, sys, time
run_dir, rank, case = sys.argv[2], os.environ["DOCKYARD_NODE_RANK"], os.environ.get("CASE", "")
nodes = [{"node_rank": 0, "host": "gpu-a", "addr": "10.0.0.9"}, {"node_rank": 1, "host": "gpu-b", "addr": "10.0.0.10"}]
def record(error):
    name = "manifest.json" if rank == "0" else f"manifest-node{rank}.json"
    with open(os.path.join(run_dir, name), "w") as f:
        json.dump({"run_id": "met2", "node_rank": int(rank), "status": "failed", "error": error, "nodes_seen": nodes}, f)
# gloo's closed socket, as the trainer says it (dockyard.train.nodes.lost_node)
SOCKET = "lost node 0 (10.0.0.9, host gpu-a): it stopped answering: Connection closed by peer [10.0.0.9]:4242"
def stopped(*_):
    if case == "earlier attempt":  # a resume stopped before it trained: the run's record stays as it was
        sys.exit(143)
    record("data.jsonl: line 3 is not JSON" if rank == "1" and case == "own error" else
           SOCKET if case == "node 0 failed, its socket closed" else
           "stopped by SIGTERM: a process failed, on this node or another, or the run was cancelled")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
open(os.path.join(run_dir, "started" + rank), "w")
if case.startswith("node 0 failed") and rank == "0":  # its own error, recorded, before it exits
    while not os.path.exists(os.path.join(run_dir, "started1")):
        time.sleep(0.1)
    record("CUDA out of memory. Tried to allocate 2.00 GiB")
    sys.exit(1)
if case == "node 1 failed" and rank == "1":  # its own error, recorded, before it exits
    while not os.path.exists(os.path.join(run_dir, "started0")):
        time.sleep(0.1)
    record("CUDA out of memory. Tried to allocate 4.00 GiB")
    sys.exit(1)
if case == "node 1 failed" and rank == "0":  # node 0's collective: node 1's socket closed
    node_1s = os.path.join(run_dir, "manifest-node1.json")
    while not (os.path.exists(node_1s) and "CUDA" in open(node_1s).read()):
        time.sleep(0.1)
    record("lost node 1 (10.0.0.10, host gpu-b): it stopped answering: Connection closed by peer [10.0.0.10]:4242")
    sys.exit(1)
if case == "node 0 failed, its socket closed" and rank == "1":
    node_0s = os.path.join(run_dir, "manifest.json")
    while not (os.path.exists(node_0s) and "CUDA" in open(node_0s).read()):
        time.sleep(0.1)
    record(SOCKET)
    sys.exit(1)
time.sleep(3600)
"""
STOPPED_BEFORE = "stopped by SIGTERM: a process failed, on this node or another, or the run was cancelled"


def test_a_rank_stopped_after_another_failed_on_its_node_leaves_the_reason_to_that_one_and_torchrun(tmp_path):
    """One node: rank 1 refuses a setting and says why; torchrun stops rank 0, which says nothing of its own (it
    cannot know why it was stopped): under rank 1's line comes torchrun's, naming rank 1 and pointing above, where the
    reason is."""
    (tmp_path / "worker.py").write_text(TRAINER_WORKER)
    r = run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=2", "--standalone",
             "--local-addr=127.0.0.1", "worker.py", str(tmp_path / "started")], cwd=tmp_path,
            env={**bare(tmp_path), "OMP_NUM_THREADS": "1", "FAIL_RANK": "1"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and [line for line in lines if line.startswith("error: ")] == [
        "error: invalid training setting: nonsense"], r.stderr[-3000:]
    assert lines[-1] == "torchrun: worker.py failed: rank 1 (local rank 1) first, exit 1; its reason is above", \
        r.stderr[-3000:]


@pytest.mark.parametrize("case", ["node 0 lost", "own error", "earlier attempt", "node 0's record there",
                                  "node 0 failed", "node 0 failed, its socket closed", "node 1 failed"])
def test_a_node_stopped_because_node_0_went_away_records_why(tmp_path, case, loopback_port):
    """Node 0's container killed at step 12, torchrun's store on node 1 (node 0 at x.9, node 1 at x.10): node 1's agent
    stopped its workers at once, and its manifest said "stopped by SIGTERM: another rank failed (its error is above)",
    with no error above and no lost node named. The run then had no manifest.json at all (node 0 writes it): node 0's
    `invoke run --resume` was refused for want of the run's recipe, and `invoke export` said there was no such run; the
    node that lost node 0 now writes it, where there is none. A reason of the node's own is kept, and so is the record
    of an earlier attempt that this one never rewrote (a preempted job's, resumed, with node 0 lost before the resume
    trained), and node 0's own manifest.json. Node 0 that failed on its own error (its record says so) is not "lost":
    node 1 said "lost node 0" whether its agent saw the rendezvous end or its workers saw node 0's sockets close; nor
    is node 1 in node 0's record, the run's, where node 1 ran out of memory."""
    import json
    import time

    port = loopback_port
    (tmp_path / "worker.py").write_text(WORKER_RECORDING_A_STOP)
    earlier = json.dumps({"run_id": "met2", "status": "failed", "metrics": {"steps": 40}, "error": STOPPED_BEFORE})
    if case == "earlier attempt":
        (tmp_path / "manifest-node1.json").write_text(earlier)
    node_0s = json.dumps({"run_id": "met2", "node_rank": 0, "status": "failed", "error": "lost node 1 (...)"})
    if case == "node 0's record there":
        (tmp_path / "manifest.json").write_text(node_0s)
    procs = {}
    for rank in (0, 1):
        env = {**bare(tmp_path), "DOCKYARD_NODE_RANK": str(rank), "CASE": case}
        procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=met2", f"--rdzv-conf=is_host={int(rank == 0)},join_timeout=30",
             "--monitor-interval=0.5", "--local-addr=127.0.0.1", "worker.py", "--run-dir", str(tmp_path)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((tmp_path / "started0").exists() and (tmp_path / "started1").exists()):
            assert time.monotonic() < deadline and procs[1].poll() is None, said_by(procs[1])
            time.sleep(0.2)
        if not case.startswith(("node 0 failed", "node 1 failed")):
            kill_tree(procs[0].pid)  # node 0's machine gone
        _, err = procs[1].communicate(timeout=120)
        if case == "node 1 failed":
            _, err = procs[0].communicate(timeout=120)  # node 0's, which writes the run's record
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p.pid)
        procs[0].communicate(timeout=30)
    run_manifest = (tmp_path / "manifest.json").read_text() if (tmp_path / "manifest.json").exists() else None
    if case == "earlier attempt":
        assert (tmp_path / "manifest-node1.json").read_text() == earlier, err[-2000:]
        assert run_manifest is None
        return
    record = json.loads((tmp_path / "manifest-node1.json").read_text())
    error = record["error"]
    if case == "node 1 failed":  # node 0's manifest.json, the run's record, said "lost node 1 (...): it stopped answering"
        assert error == "CUDA out of memory. Tried to allocate 4.00 GiB", "node 1's own record, kept"
        said = json.loads(run_manifest)["error"]
        assert said == ("node 1 (10.0.0.10, host gpu-b) failed first: CUDA out of memory. Tried to allocate 4.00 GiB "
                        "(its record: manifest-node1.json); this node was stopped with it"), (said, err[-2000:])
        assert f"torchrun: {said}" in err, err[-2000:]
        return
    if case == "own error":
        assert error == "data.jsonl: line 3 is not JSON"
        assert run_manifest is None, "node 1's own error is no loss of node 0: node 0 writes the run's record"
        return
    if case.startswith("node 0 failed"):
        assert error == ("node 0 (10.0.0.9, host gpu-a) failed first: CUDA out of memory. Tried to allocate 2.00 GiB "
                         "(its record: manifest.json); this node was stopped with it"), (error, err[-2000:])
        assert json.loads(run_manifest)["error"].startswith("CUDA out of memory"), "node 0's own record, kept"
        assert f"torchrun: {error}" in err, err[-2000:]
        return
    assert error.startswith(f"lost node 0 (10.0.0.9, host gpu-a): its torchrun, which holds the rendezvous met2 at "
                            f"127.0.0.1:{port}, went away after the nodes had met ("), (error, err[-2000:])
    assert error.endswith("); this node was stopped with it")
    if case == "node 0's record there":
        assert run_manifest == node_0s, "node 0's own record is never replaced"
        return
    assert json.loads(run_manifest) == record, "the run's manifest.json: node 1's record, which says whose"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_node_lost_in_turn_is_followed_to_the_one_that_failed(tmp_path, monkeypatch, capfd):
    """Three nodes: node 2's GPU failed, node 0 lost node 2, node 1 lost node 0. Node 1 said "node 0 failed first:
    lost node 2 ..." at best; it follows the records to node 2. Nodes that lost each other (a network cut) name no
    failure of their own, and keep their records."""
    import json

    from dockyard.train import torchrun

    nodes = [{"node_rank": r, "host": f"gpu-{r}", "addr": f"10.0.0.{r + 9}"} for r in range(3)]

    def settle(records: dict[str, str]) -> str:
        for node, error in records.items():
            name = "manifest.json" if node == 0 else f"manifest-node{node}.json"
            (tmp_path / name).write_text(json.dumps({"run_id": "r3", "node_rank": node, "status": "failed",
                                                     "error": error, "nodes_seen": nodes}))
        monkeypatch.setenv("DOCKYARD_NODE_RANK", "1")
        args = ["--nnodes=3", "--rdzv-endpoint=10.0.0.9:29500", "--rdzv-id=r3", "-m", "dockyard.train", "--run-dir",
                str(tmp_path)]
        torchrun.settle(args, torchrun.torchrun_args(args), None, {})
        return json.loads((tmp_path / "manifest-node1.json").read_text())["error"]

    said = settle({1: "lost node 0 (10.0.0.9, host gpu-0): it stopped answering: Connection reset by peer",
                   0: "lost node 2 (10.0.0.11, host gpu-2): it stopped answering: Connection closed by peer",
                   2: "NCCL error: unhandled cuda error"})
    assert said == ("node 2 (10.0.0.11, host gpu-2) failed first: NCCL error: unhandled cuda error (its record: "
                    "manifest-node2.json); this node was stopped with it")
    assert f"torchrun: {said}" in capfd.readouterr().err
    cut = {1: "lost node 0 (10.0.0.9, host gpu-0): it stopped answering: Connection reset by peer",
           0: "lost node 1 (10.0.0.10, host gpu-1): it stopped answering: Connection reset by peer"}
    assert settle(cut) == cut[1]


WORKER_FAILING_IN_TWO_ATTEMPTS = """
import glob, json, os, sys, time
run_dir, node = sys.argv[2], os.environ["DOCKYARD_NODE_RANK"]
attempt = len(glob.glob(os.path.join(run_dir, f"started{node}-*")))  # this node's workers started before
nodes = [{"node_rank": 0, "host": "gpu-a", "addr": "10.0.0.9"}, {"node_rank": 1, "host": "gpu-b", "addr": "10.0.0.10"}]
def record(error):  # replaced whole, as the trainer writes it
    name = "manifest.json" if node == "0" else f"manifest-node{node}.json"
    with open(os.path.join(run_dir, name + ".tmp"), "w") as f:
        json.dump({"run_id": "att1", "node_rank": int(node), "status": "failed", "error": error, "nodes_seen": nodes}, f)
    os.replace(os.path.join(run_dir, name + ".tmp"), os.path.join(run_dir, name))
def wait_for(name, holding=""):
    while not (os.path.exists(os.path.join(run_dir, name)) and holding in open(os.path.join(run_dir, name)).read()):
        time.sleep(0.1)
open(os.path.join(run_dir, f"started{node}-{attempt}"), "w")
LOST = "lost node 1 (10.0.0.10, host gpu-b): it stopped answering: Connection closed by peer [10.0.0.10]:424"
if attempt == 0 and node == "1":  # its own error, recorded; it exits once node 0's worker has (both restart)
    wait_for("started0-0")
    record("CUDA out of memory. Tried to allocate 4.00 GiB")
    wait_for("manifest.json", LOST)
    sys.exit(1)
if node == "0":  # node 1's socket closed under node 0's collective: after its failure, then as its machine went
    wait_for("manifest-node1.json", "CUDA") if attempt == 0 else wait_for("node1-gone")
    record(LOST + str(attempt))
    sys.exit(1)
time.sleep(3600)
"""


def test_a_record_of_an_earlier_attempt_is_not_taken_for_this_ones(tmp_path, loopback_port):
    """--max-restarts=1 on two nodes: in the first attempt node 1 ran out of memory (its record says so) and both
    nodes restarted; in the second, node 1's machine went down, and node 0 recorded it lost. Node 0's torchrun read
    every record written since it started as this attempt's, and its manifest, the run's, said "node 1 ... failed
    first: CUDA out of memory ...", the first attempt's failure. Records are this attempt's from its rendezvous on."""
    import json
    import time

    procs = _two_agents_restarting_once(tmp_path, WORKER_FAILING_IN_TWO_ATTEMPTS, "att1", loopback_port)
    try:
        deadline = time.monotonic() + 180
        while not ((tmp_path / "started0-1").exists() and (tmp_path / "started1-1").exists()):
            assert time.monotonic() < deadline and procs[0].poll() is None, said_by(procs[0])
            time.sleep(0.2)
        kill_tree(procs[1].pid)  # node 1's machine gone, in the second attempt
        (tmp_path / "node1-gone").touch()
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p.pid)
        procs[1].communicate(timeout=30)
    assert procs[0].returncode == 1, err[-3000:]
    assert json.loads((tmp_path / "manifest-node1.json").read_text())["error"].startswith("CUDA out of memory")
    said = json.loads((tmp_path / "manifest.json").read_text())["error"]
    assert said == ("lost node 1 (10.0.0.10, host gpu-b): it stopped answering: Connection closed by peer "
                    "[10.0.0.10]:4241"), (said, err[-3000:])
    assert "failed first" not in err, err[-3000:]


WORKER_RESTARTED_FOR_ANOTHER_NODE = """
import json, os, sys, time
from dockyard.train import ending
run_dir, node = sys.argv[2], os.environ["DOCKYARD_NODE_RANK"]
mark = os.path.join(run_dir, f"started{node}")
if not os.path.exists(mark):  # the first attempt
    open(mark, "w").close()
    if node == "1":  # fails on its own, once node 0's worker runs
        while not os.path.exists(os.path.join(run_dir, "started0")):
            time.sleep(0.1)
        sys.exit(1)
    time.sleep(3600)  # node 0's is well: torchrun stops it as node 1 comes back
print(json.dumps({"node": node, "count": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
                  "restarted": ending.restarted()}), flush=True)
"""


def test_a_node_restarted_for_another_nodes_failure_continues_the_run_as_that_node_does(tmp_path, loopback_port):
    """--max-restarts on two nodes, node 1's worker failed and node 0's was well: torchrun restarts node 0's workers as
    node 1 rejoins, with TORCHELASTIC_RESTART_COUNT 0 (only a node's own failures count), so the trainer took node 0's
    second attempt for a new run (in the folder the first wrote) while node 1's resumed. The image's torchrun counts
    the nodes' meetings for its workers. Two real agents on loopback."""
    import json

    procs = _two_agents_restarting_once(tmp_path, WORKER_RESTARTED_FOR_ANOTHER_NODE, "rs1", loopback_port)
    said = {}
    try:
        for rank, p in procs.items():
            said[rank] = p.communicate(timeout=150)
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p.pid)
    assert [p.returncode for p in procs.values()] == [0, 0], (said[0][1][-2000:], said[1][1][-2000:])
    second = {rank: json.loads(out.strip().splitlines()[-1]) for rank, (out, _) in said.items()}
    assert second[1] == {"node": "1", "count": "1", "restarted": True}, second
    assert second[0] == {"node": "0", "count": "0", "restarted": True}, second  # torch's count says no restart


def _two_agents_restarting_once(tmp_path, worker: str, rdzv_id: str, port: int) -> dict[int, subprocess.Popen]:
    """Two nodes' agents of the image's torchrun on loopback, one worker each, --max-restarts=1, their rendezvous at
    127.0.0.1:`port` (held by the test); `worker` is given `--run-dir tmp_path` and its node's DOCKYARD_NODE_RANK."""
    (tmp_path / "worker.py").write_text(worker)
    procs = {}
    for rank in (0, 1):
        env = {**bare(tmp_path), "DOCKYARD_NODE_RANK": str(rank)}
        procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--nnodes=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rdzv_id}",
             f"--rdzv-conf=is_host={int(rank == 0)},join_timeout=60", "--max-restarts=1", "--monitor-interval=0.5",
             "--local-addr=127.0.0.1", "worker.py", "--run-dir", str(tmp_path)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return procs


def test_a_tmpdir_without_locks_still_trains_and_its_log_folder_is_removed(tmp_path, monkeypatch):
    """7b5cf05's log folder holds a lock while its launcher runs; where TMPDIR's file system has no locks (NFS without
    its lock service: ENOLCK; Lustre mounted without flock: ENOSYS), taking it raised out of the launcher and the run
    never started (runfolder's own lock trains unguarded there). The launcher goes on with its --log-dir, a sweep by
    another launcher leaves that folder alone (no lock says its owner is gone), and it is removed as the run ends."""
    import argparse
    import errno
    import fcntl
    import tempfile

    from dockyard.train import torchrun

    def no_locks(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with torchrun.logs_folder(argparse.Namespace(log_dir=None)) as logs:
        assert logs[0] == "--log-dir" and os.path.isdir(logs[1]) and logs[1].startswith(str(tmp_path))
        # another launcher's sweep, as this one runs, whose own lock is taken (locks that fail there too would keep
        # any folder): nothing of this folder says its owner is gone
        monkeypatch.undo()
        torchrun.remove_orphaned_logs(tmp_path)
        assert os.path.isdir(logs[1])
    assert not os.path.exists(logs[1]) and not os.listdir(tmp_path)


def test_a_fifo_planted_as_a_log_folders_owner_file_neither_hangs_the_launcher_nor_is_removed(tmp_path):
    """7b5cf05's sweep opened each dockyard-torchrun-*/.owner in TMPDIR to read whose it is before asking: in a /tmp
    every user writes (a native run on a shared host), a fifo of that name in a folder of another user's blocked that
    open for good, and every launch hung before torchrun started, saying nothing. The sweep now opens it without
    waiting and asks only a plain file's lock; the planted folder is left as it is."""
    planted = tmp_path / "dockyard-torchrun-planted"
    planted.mkdir()
    os.mkfifo(planted / ".owner")
    sweep = ("import sys; from pathlib import Path; from dockyard.train.torchrun import remove_orphaned_logs; "
             "remove_orphaned_logs(Path(sys.argv[1]))")
    try:
        done = subprocess.run([sys.executable, "-c", sweep, str(tmp_path)], env=bare(tmp_path), capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the sweep hung on the fifo: the launcher never started torchrun")
    assert done.returncode == 0, done.stderr
    assert (planted / ".owner").exists(), "the planted folder is someone else's to remove"


def test_a_tmpdir_with_no_room_for_the_log_folder_is_said_in_one_line_and_leaves_nothing(tmp_path):
    """7b5cf05's log folder is made, then its lock file in it: where TMPDIR had room for the folder and not the file
    (its last inode, its quota), the launcher ended in OSError's traceback ('No space left on device: .../.held')
    and left the folder, without the .owner that lets a later sweep remove it. Now one line says where and how to
    free it, exit 1, and the folder is gone."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "worker.py").write_text("print('trained')\n")
    # the lock file's open fails as on a full disk (the folder itself is made)
    full = ("import builtins, errno, sys\n"
            "from dockyard.train import torchrun\n"
            "def no_room(path, *a, **k):\n"
            "    if str(path).endswith('.held'):\n"
            "        raise OSError(errno.ENOSPC, 'No space left on device', str(path))\n"
            "    return builtins.open(path, *a, **k)\n"
            "torchrun.open = no_room\n"
            "sys.exit(torchrun.main(sys.argv[1:]))\n")
    done = run([sys.executable, "-c", full, "--nproc-per-node=1", "--standalone", "worker.py"], cwd=tmp_path,
               env={**bare(tmp_path), "TMPDIR": str(tmp_path / "tmp")})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "trained" not in done.stdout
    said = [line for line in done.stderr.splitlines() if "log folder" in line]
    assert said and said[0].startswith("torchrun: cannot make its log folder in ") and "No space left" in said[0], \
        done.stderr
    assert list((tmp_path / "tmp").iterdir()) == [], "the half-made log folder is left"


def image_torchrun() -> str:
    """The image's /opt/venv/bin/torchrun, as images/Dockerfile writes it (printf's \\n as newlines)."""
    written = re.search(r"printf '(#!/opt/venv/bin/python\\n.*?)'\s*\\\s*\n\s*> /opt/venv/bin/torchrun",
                        (ROOT / "images" / "Dockerfile").read_text(), re.S)
    assert written, "images/Dockerfile no longer writes /opt/venv/bin/torchrun with printf"
    return written.group(1).replace("\\n", "\n")


# torch, as a Ctrl-C finds it while it still imports (seconds, more on a busy machine): the handler's
# KeyboardInterrupt raised where the signal landed; in a dataclass's field, Python 3.11 raises it wrapped in
# "RuntimeError: Error calling __set_name__ on 'Field' instance ..."
TORCH_IMPORTING = """
class Field:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt
{where}
"""


@pytest.mark.parametrize("where", ["class ThreadLocals:\n    buffer = Field()", "raise KeyboardInterrupt"],
                         ids=["in-a-class-being-built", "elsewhere"])
@pytest.mark.parametrize("entry", ["image", "module"])
def test_ctrl_c_while_torch_imports_ends_torchrun_in_one_line_from_either_entry(tmp_path, entry, where):
    """The image's torchrun (which every launcher in the image starts) calls main(); only `python -m` had the
    handler for a Ctrl-C before torch was imported: in the image it ended on KeyboardInterrupt's traceback from deep
    in torch's import, and on either entry a Ctrl-C landing while torch's import built a dataclass ended on
    'RuntimeError: Error calling __set_name__ ...', status 1."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(TORCH_IMPORTING.replace("{where}", where))
    launcher = [sys.executable, "-c", image_torchrun()] if entry == "image" else \
        [sys.executable, "-m", "dockyard.train.torchrun"]
    done = run([*launcher, "--nproc-per-node=1", "--standalone", "worker.py"], cwd=tmp_path,
               env={**bare(tmp_path), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}, timeout=120)
    assert done.returncode == 128 + signal.SIGINT, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == "torchrun: stopped by SIGINT before it started the workers", done.stderr[-2000:]
