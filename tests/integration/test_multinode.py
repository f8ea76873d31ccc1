"""Two nodes training together for real: node 0 is this host's engine, node 1 the test node (its own network
namespace and dockerd, reached over a veth in 198.18.0.0/15). Each runs `invoke run --nodes=2 --node-rank=I
--master-addr=<node 0's address on the test network>` as a user would, at the same time, 2 CPU processes each.

The test node shares this machine's filesystem, so one runs folder is "shared storage" and two different
folders are not. The cpu image reaches the test node's engine through `docker save | docker load` (the archive
path itself is tested in test_transport.py).

The two nodes here sit at x.9 (node 0) and x.10 (node 1): torchrun's rendezvous ranks nodes by their addresses as
text, so global rank 0 and torchrun's store live on node 1, as on a cluster at 10.0.0.9 and 10.0.0.10. Everything
the user sees must still call node 0 the node they numbered 0. The usual order (global rank 0 on node 0) is what
test_slurm.py trains across the same two kinds of node with.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from dockyard.settings import ROOT
from tests.support import node2
from tests.support.cli import INVOKE, invoke
from tests.support.training import manifest

pytestmark = pytest.mark.engine

STEPS = ["--per_device_train_batch_size", "4", "--max_seq_length", "64", "--logging_steps", "1",
         "--learning_rate", "3e-3", "--lr_scheduler_type", "constant"]
TEXT_ORDER_FLIPPED = True  # the test node at x.10, this host at x.9 (see above; tests/integration/conftest.py)
LOST_NODE_BOUND_S = 60  # node 0 must stop this soon after node 1's container is killed


@pytest.fixture(scope="module")
def node_image(cpu_image, node):
    save = subprocess.Popen([node2.DOCKER, "save", cpu_image], stdout=subprocess.PIPE)
    load = subprocess.run([node2.DOCKER, "load"], stdin=save.stdout, env=node.env, capture_output=True, text=True)
    save.stdout.close()
    assert save.wait() == 0 and load.returncode == 0, load.stderr
    return cpu_image


def _memlock_env() -> dict[str, str]:
    """The test node's dockerd was started by this test, with this process's locked-memory limit: say it."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return {} if hard == resource.RLIM_INFINITY else {"DOCKYARD_MEMLOCK": str(hard)}


class TwoNodes:
    """`invoke run` on both nodes at once; node 1 `late` seconds after node 0, or not at all (`late=None`); `env`: more
    of each node's environment."""

    def __init__(self, node, run_id: str, runs0: Path, runs1: Path, overrides: list[str], resume: bool = False,
                 join_timeout: int = 60, late: float | None = 0, env: dict[str, str] | None = None):
        self.node, self.run_id, self.runs0, self.runs1 = node, run_id, runs0, runs1
        port = random.randrange(20000, 29000)
        common = ["run", "--variant=cpu", "--nodes=2", f"--master-addr={node.host_addr}", f"--master-port={port}",
                  f"--run-id={run_id}", f"--join-timeout={join_timeout}", *(["--resume"] if resume else []), "--",
                  *overrides]
        invoke = INVOKE
        self.logs = {r: open(runs0.parent / f"{run_id}-node{r}{'-resume' if resume else ''}.log", "w+") for r in (0, 1)}
        self.started = time.monotonic()
        self.procs = {0: subprocess.Popen([*invoke, common[0], "--node-rank=0", *common[1:]], cwd=ROOT,
                                          env={**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(runs0), **(env or {})},
                                          stdout=self.logs[0], stderr=subprocess.STDOUT)}
        if late is None:
            return
        time.sleep(late)
        self.procs[1] = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "env", f"DOCKER_HOST=unix://{node.sock}",
             f"INVOKE_DOCKYARD_RUNS_DIR={runs1}", *[f"{k}={v}" for k, v in {**_memlock_env(), **(env or {})}.items()],
             *invoke, common[0], "--node-rank=1", *common[1:]],
            cwd=ROOT, stdout=self.logs[1], stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 600) -> dict[int, int]:
        try:
            return {r: p.wait(timeout) for r, p in self.procs.items()}
        finally:
            self.stop()

    def output(self, rank: int) -> str:
        self.logs[rank].seek(0)
        return self.logs[rank].read()

    def stop(self) -> None:
        """Nothing left behind when a test fails half-way: the processes it started, then both containers."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([node2.DOCKER, "rm", "-f", f"dockyard-{self.run_id}-node0"], capture_output=True)
        self.node.docker("rm", "-f", f"dockyard-{self.run_id}-node1", check=False)


def test_two_nodes_train_zero2_together(node, node_image, tmp_path):
    runs = tmp_path / "runs"
    two = TwoNodes(node, "two1", runs, runs, ["--max_steps", "8", "--save_steps", "4", *STEPS])
    codes = two.wait()
    assert codes == {0: 0, 1: 0}, two.output(0)[-3000:] + two.output(1)[-3000:]
    m0, m1 = manifest(runs / "two1"), manifest(runs / "two1", node_rank=1)
    for m, rank in ((m0, 0), (m1, 1)):
        assert m["status"] == "completed" and m["world_size"] == 4 and m["nodes"] == 2 and m["node_rank"] == rank
        assert m["strategy"]["in_effect"]["engine"] == "deepspeed" and m["strategy"]["in_effect"]["zero_stage"] == 2
        assert m["rendezvous"]["endpoint"].startswith(f"{node.host_addr}:") and m["rendezvous"]["id"] == "two1"
    assert m1["rendezvous"]["local_addr"] == node.addr, "node 1 advertised its own address, not loopback"
    assert [n["addr"] for n in m0["nodes_seen"]] == [node.host_addr, node.addr]
    assert m0["metrics"]["loss_first"] == m1["metrics"]["loss_first"] and m0["metrics"]["steps"] == 8
    assert m0["metrics"]["loss_last"] < m0["metrics"]["loss_first"], "the loss fell"
    print(f"two nodes, world size 4, 8 steps: {time.monotonic() - two.started:.1f} s")


def test_two_nodes_train_together_through_compose(settings, node, node_image, tmp_path):
    """compose/multinode.yml as its header says to use it, on both engines at the same time."""
    import shlex

    runs = tmp_path / "runs"
    runs.mkdir()
    port = str(random.randrange(20000, 29000))
    common = {"DOCKYARD_IMAGE": node_image, "DOCKYARD_RUNS": str(runs), "DOCKYARD_RUN_ID": "comp1", "NNODES": "2",
              "DOCKYARD_NPROC": "2", "MASTER_ADDR": node.host_addr, "MASTER_PORT": port, "HF_CACHE": str(tmp_path / "hf"),
              "DOCKYARD_UID": str(os.getuid()), "DOCKYARD_GID": str(os.getgid())}
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] != resource.RLIM_INFINITY:  # both engines run under this limit
        common["DOCKYARD_MEMLOCK"] = str(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1])
    compose = [*shlex.split(settings.compose), "-p", f"dyn{os.getpid()}", "-f", "train.yml", "-f", "multinode.yml",
               "run", "--rm", "train"]
    logs = [open(tmp_path / f"compose-node{r}.log", "w+") for r in (0, 1)]
    procs = [subprocess.Popen(compose, cwd=ROOT / "compose", stdout=logs[0], stderr=subprocess.STDOUT,
                              env={**os.environ, **common, "NODE_RANK": "0", "IFACE": node.veth,
                                   "LOCAL_ADDR": node.host_addr}),
             subprocess.Popen(["ip", "netns", "exec", node.netns, *compose], cwd=ROOT / "compose", stdout=logs[1],
                              stderr=subprocess.STDOUT,
                              env={**os.environ, **common, "NODE_RANK": "1", "IFACE": node.veth[:-1] + "b",
                                   "LOCAL_ADDR": node.addr, "DOCKER_HOST": f"unix://{node.sock}"})]
    try:
        codes = [p.wait(600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [(log.seek(0), log.read())[1] for log in logs]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    m0, m1 = manifest(runs / "comp1"), manifest(runs / "comp1", node_rank=1)
    assert m0["status"] == m1["status"] == "completed" and m0["world_size"] == m1["world_size"] == 4
    assert (m0["node_rank"], m1["node_rank"]) == (0, 1) and m1["rendezvous"]["local_addr"] == node.addr


def test_doctor_peer_checks_the_route_port_and_image_of_the_other_node(node, node_image):
    from tests.support.cli import invoke

    r = invoke("doctor", f"--peer={node.alias}", "--json", env={"INVOKE_DOCKYARD_SSH": node.ssh_command})
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["peer route"]["status"] == "pass" and f"through {node.veth}" in checks["peer route"]["detail"]
    assert f"this node's address {node.host_addr}" in checks["peer route"]["detail"]
    port = checks["rendezvous port"]
    assert port["status"] == "pass" and "no run listens there yet" in port["detail"]
    assert "a listener doctor opened there for a moment was reached from here" in port["detail"]  # through real ssh
    assert checks["same image"]["status"] == "pass" and node_image in checks["same image"]["detail"]
    assert checks["infiniband"]["status"] == "pass" and checks["peer shm"]["status"] in ("pass", "warn")

    # A firewall on the peer that drops the rendezvous port, then one that rejects it: refused as if nothing
    # listened, which passed before doctor listened there itself (in the test node's own namespace only).
    for target, said in (("DROP", "no answer within"), ("REJECT", "refused the connection even while a listener "
                                                                  "was open there: a firewall rejects it")):
        rule = ["INPUT", "-p", "tcp", "--dport", "29500", "-j", target]
        subprocess.run(["ip", "netns", "exec", node.netns, "iptables", "-I", *rule], check=True)
        try:
            r = invoke("doctor", f"--peer={node.alias}", "--json", env={"INVOKE_DOCKYARD_SSH": node.ssh_command})
        finally:
            subprocess.run(["ip", "netns", "exec", node.netns, "iptables", "-D", *rule], check=True)
        port = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["rendezvous port"]
        assert r.returncode != 0 and port["status"] == "fail" and "open TCP 29500" in port["fix"], port
        assert said in port["detail"], port


def test_doctor_listens_with_the_image_on_a_peer_without_python3(node, node_image, tmp_path):
    """A node may hold only sh, coreutils and Docker: doctor's listener then runs in the image, on the host's
    network. The test node shares this machine's python3, so an ssh setting stands in for such a node: it puts a
    PATH holding only sh and docker in front of the command doctor sends (said plainly here: a stand-in)."""
    from tests.support.cli import invoke

    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "docker"):
        (bare / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True,
                                                check=True).stdout.strip())
    wrapper = tmp_path / "ssh-without-python3"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        # the last word is the command for the node: run it with a PATH that has no python3 (`-G`: as it is)
        [ "$1" = -G ] && exec {node.ssh_command} "$@"
        n=$#; i=0
        for a in "$@"; do i=$((i + 1)); [ "$i" -lt "$n" ] && set -- "$@" "$a"; done
        shift "$n"
        exec {node.ssh_command} "$@" "PATH={bare}; export PATH; $a"
        """))
    wrapper.chmod(0o755)
    hidden = subprocess.run([str(wrapper), node.alias, "sh -c 'command -v python3 || echo no python3'"],
                            capture_output=True, text=True, timeout=60)
    assert hidden.stdout.strip() == "no python3", hidden
    r = invoke("doctor", f"--peer={node.alias}", "--json", env={"INVOKE_DOCKYARD_SSH": str(wrapper)})
    port = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["rendezvous port"]
    assert port["status"] == "pass", port
    assert "a listener doctor opened there for a moment was reached from here" in port["detail"], port


def test_run_folders_not_shared_between_the_nodes_are_refused_before_training(node, node_image, tmp_path):
    # node 1 waits this long for node 0's file, which never comes: the default 30 s was sat out by the test (invoke
    # run hands the variable to both nodes' trainers, as docs/multinode.md tells a user of slow shared storage)
    two = TwoNodes(node, "apart1", tmp_path / "runs-a", tmp_path / "runs-b", ["--max_steps", "4", *STEPS],
                   env={"DOCKYARD_SHARED_TIMEOUT": "5"})
    codes = two.wait(timeout=180)
    took = time.monotonic() - two.started
    assert codes[0] != 0 and codes[1] != 0
    for rank in (0, 1):
        assert "the run folder is not shared: node 1" in two.output(rank), two.output(rank)[-3000:]
        assert "wrote there within 5 s" in two.output(rank), two.output(rank)[-3000:]
    m = manifest(tmp_path / "runs-a" / "apart1")
    assert m["status"] == "failed" and "shared storage" in m["error"] and m["metrics"]["steps"] == 0
    assert not (tmp_path / "runs-a" / "apart1" / "checkpoints").exists(), "refused before training"
    print(f"unshared run folders refused on both nodes in {took:.1f} s")


def _kill_at_step_12(two: TwoNodes, run_dir: Path, kill, survivor: int, timeout: float) -> tuple[int, float]:
    """Once step 12 is logged, `kill` one node; the other's exit code, and how long after the kill it came."""
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 12):
            assert time.monotonic() < deadline and two.procs[survivor].poll() is None, two.output(survivor)[-3000:]
            time.sleep(0.2)
        kill()
        killed = time.monotonic()
        code = two.procs[survivor].wait(timeout=timeout)
        return code, time.monotonic() - killed
    finally:
        two.wait(timeout=60)


def test_a_lost_node_stops_the_other_soon_and_both_resume(node, node_image, tmp_path):
    runs = tmp_path / "runs"
    # killed at step 12 with 18 steps to go (the run must still be going then); resumed from checkpoint-10, the
    # rest is 20 steps: 60 resumed 50 steps and 10 saves on 4 processes, proving nothing more
    overrides = ["--max_steps", "30", "--save_steps", "5", *STEPS]
    two = TwoNodes(node, "lost1", runs, runs, overrides)
    code0, stopped_after = _kill_at_step_12(two, runs / "lost1", lambda: node.docker("kill", "dockyard-lost1-node1"),
                                            survivor=0, timeout=LOST_NODE_BOUND_S * 3)
    print(f"node 1's container killed: node 0 stopped {stopped_after:.1f} s later")
    assert code0 != 0 and stopped_after < LOST_NODE_BOUND_S
    out = two.output(0)
    assert f"lost node 1 ({node.addr}" in out, out[-3000:]
    m = manifest(runs / "lost1")
    assert m["status"] == "failed" and m["error"].startswith("lost node 1")
    steps_before = m["metrics"]["steps"]

    again = TwoNodes(node, "lost1", runs, runs, overrides, resume=True)
    codes = again.wait()
    assert codes == {0: 0, 1: 0}, again.output(0)[-3000:] + again.output(1)[-3000:]
    m0, m1 = manifest(runs / "lost1"), manifest(runs / "lost1", node_rank=1)
    assert m0["status"] == m1["status"] == "completed" and m0["metrics"]["steps"] == 30
    logged = [json.loads(line)["step"] for line in (runs / "lost1" / "metrics.jsonl").read_text().splitlines()]
    assert logged == sorted(set(logged)) and logged[-1] == 30, "no step logged twice after the resume"
    resumed = re.findall(r"Attempting to resume from \S+/checkpoint-(\d+)", (runs / "lost1" / "train.log").read_text())
    assert resumed and 5 <= int(resumed[-1]) <= steps_before, "resumed from the last complete checkpoint"


# --- a node lost at any moment of the run, one that never arrives, one that arrives late -------------------------
# The bound is the join timeout (docs/multinode.md): small here, so the tests stay short.
JOIN_S = 20
# on top of the bound: node 0's processes starting their watch (importing torch), the last beat, torchrun and the
# container stopping, invoke's summary. 60 s, not 30: on CI's 2 cores, with an image's layers exported to the same disk
# beside the test, the containers' start and stop alone can take tens of seconds; what these tests catch took 600 s
# (torchrun's own join timeout) and 887 s (no end of a lost node)
STOP_MARGIN_S = 60


def _workers_started(node, run_id: str) -> bool:
    """torchrun on node 1 started its trainer processes (`python -u -m dockyard.train`): the rendezvous is over.
    Found in this machine's process table, in the test node's network namespace (its containers share it)."""
    netns = os.stat(f"/var/run/netns/{node.netns}").st_ino
    found = 0
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[1:4] == [b"-u", b"-m", b"dockyard.train"] and f"/runs/{run_id}".encode() in b" ".join(argv):
                found += os.stat(proc / "ns" / "net").st_ino == netns
        except (OSError, IndexError):
            continue  # not a process, or one that has just exited
    return found >= 2


MOMENTS = {  # what node 0's test waits for before killing node 1's container
    "after-the-rendezvous": lambda node, run: _workers_started(node, run.name),
    # node 0 logs this once every node has checked the run folder; then each loads the data and the model
    "during-model-load": lambda node, run: "dockyard.train: recipe zero2 with " in _text(run / "train.log"),
    "during-the-first-checkpoint-save": lambda node, run: (run / "checkpoints" / "checkpoint-5").exists(),
}


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_node_lost_at_any_moment_stops_the_other_within_the_bound_and_the_run_resumes(node, node_image, tmp_path,
                                                                                        moment):
    runs = tmp_path / "runs"
    overrides = ["--max_steps", "10", "--save_steps", "5", *STEPS]
    two = TwoNodes(node, "gone1", runs, runs, overrides, join_timeout=JOIN_S)
    try:
        deadline = time.monotonic() + 300
        while not MOMENTS[moment](node, runs / "gone1"):
            assert time.monotonic() < deadline and all(p.poll() is None for p in two.procs.values()), \
                f"{moment} never came\n" + two.output(0)[-3000:] + two.output(1)[-3000:]
            time.sleep(0.1)
        node.docker("kill", "dockyard-gone1-node1")
        killed = time.monotonic()
        code0 = two.procs[0].wait(timeout=JOIN_S * 10)  # before this change: no end in 887 s
        stopped_after = time.monotonic() - killed
    finally:
        two.wait(timeout=60)
    out = two.output(0)
    print(f"node 1 killed {moment}: node 0 stopped {stopped_after:.1f} s later (bound {JOIN_S} s)")
    assert code0 != 0 and stopped_after < JOIN_S + STOP_MARGIN_S, out[-3000:]
    assert "error: lost node 1" in out and "it stopped answering" in out, out[-3000:]
    m = manifest(runs / "gone1")
    assert m["status"] == "failed" and m["error"].startswith("lost node 1"), m.get("error")
    assert m["world_size"] == 4 and m["nodes"] == 2
    if moment != "after-the-rendezvous":  # node 1 had said where it is by then
        assert m["error"].startswith(f"lost node 1 ({node.addr}, host "), m["error"]
    if moment == "during-model-load":
        return  # resuming is the same as after the rendezvous: no checkpoint yet, the run starts again

    again = TwoNodes(node, "gone1", runs, runs, overrides, resume=True, join_timeout=JOIN_S)
    codes = again.wait()
    assert codes == {0: 0, 1: 0}, again.output(0)[-3000:] + again.output(1)[-3000:]
    m0 = manifest(runs / "gone1")
    assert m0["status"] == "completed" and m0["metrics"]["steps"] == 10 and "error" not in m0
    logged = [json.loads(line)["step"] for line in (runs / "gone1" / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, 11)), "every step logged once after the resume"


def test_node_0_lost_mid_run_is_named_by_the_node_that_survives_it(node, node_image, tmp_path):
    """Node 0's container killed at step 12, torchrun's store on node 1 (this module's order): node 1's agent stopped
    its workers as soon as node 0's rendezvous went away, before any heartbeat was missed, and node 1's manifest said
    "stopped by SIGTERM: another rank failed (its error is above)", with no error above; its torchrun said to start
    every node with the same --run-id, advice for nodes that never met. And the run was left with no manifest.json
    (node 0's to write): node 0's `invoke run --resume` was refused ("no manifest naming its recipe"), `invoke export`
    said there was no such run; node 1 writes it now."""
    runs = tmp_path / "runs"
    two = TwoNodes(node, "n0lost", runs, runs, ["--max_steps", "60", "--save_steps", "5", *STEPS], join_timeout=JOIN_S)
    code1, stopped_after = _kill_at_step_12(
        two, runs / "n0lost", lambda: subprocess.run([node2.DOCKER, "kill", "dockyard-n0lost-node0"], check=True,
                                                     capture_output=True), survivor=1, timeout=JOIN_S * 10)
    out = two.output(1)
    print(f"node 0's container killed: node 1 stopped {stopped_after:.1f} s later")
    assert code1 != 0 and stopped_after < JOIN_S + STOP_MARGIN_S, out[-3000:]
    assert "went away after the nodes had met" in out and "start every node with the same" not in out, out[-3000:]
    m = manifest(runs / "n0lost", node_rank=1)
    assert m["status"] == "failed" and m["error"].startswith(f"lost node 0 ({node.host_addr}, host "), m["error"]
    assert f"error: run n0lost failed: lost node 0 ({node.host_addr}" in out, out[-3000:]
    assert "has failed to" not in out, out[-3000:]  # torch's warnings that its rendezvous' keep-alive, shutdown failed
    assert manifest(runs / "n0lost") == m, "the run's manifest.json: node 1's record, which names node 0 as lost"

    resume = invoke("run", "--variant=cpu", "--nodes=2", "--node-rank=0", f"--master-addr={node.host_addr}",
                    "--run-id=n0lost", "--resume", "--dry", env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
    assert resume.returncode == 0 and "--recipe zero2 --run-dir /workspace/runs/n0lost --resume" in resume.stderr, \
        resume.stdout[-2000:] + resume.stderr[-2000:]


def test_a_node_that_never_arrives_stops_node_0_at_the_join_bound(node, node_image, tmp_path):
    runs = tmp_path / "runs"
    bound = JOIN_S // 2  # sat out whole: no node is waited for but one that never comes
    alone = TwoNodes(node, "alone1", runs, runs, ["--max_steps", "4", *STEPS], join_timeout=bound, late=None)
    code = alone.procs[0].wait(timeout=JOIN_S * 10)
    took = time.monotonic() - alone.started
    alone.wait(timeout=60)
    print(f"node 1 never came: node 0 stopped after {took:.1f} s (join bound {bound} s)")
    out = alone.output(0)
    assert code != 0 and bound <= took < bound + STOP_MARGIN_S + 15, out[-3000:]  # + the image's start
    # one line saying which rendezvous and what to check, not torchrun's 45 lines ending in a bare exception name
    assert f"torchrun: not every node joined the rendezvous alone1 at {node.host_addr}:" in out, out[-3000:]
    assert f" within {bound} s" in out, out[-3000:]
    assert "Traceback" not in out and "nothing was kept, so the same command can be run again" in out, out[-3000:]


def test_a_node_that_arrives_late_but_within_the_bound_trains_with_the_other(node, node_image, tmp_path):
    runs = tmp_path / "runs"
    late = TwoNodes(node, "late1", runs, runs, ["--max_steps", "4", *STEPS], join_timeout=JOIN_S + 10,
                    late=JOIN_S / 2)
    codes = late.wait()
    assert codes == {0: 0, 1: 0}, late.output(0)[-3000:] + late.output(1)[-3000:]
    m = manifest(runs / "late1")
    assert m["status"] == "completed" and m["world_size"] == 4 and m["metrics"]["steps"] == 4


def _pod_as_docker_run(pod: dict, index: int, pod_ip: str, hosts: dict[str, str], runs: Path) -> list[str]:
    """What a kubelet would start for pod `index` of the Indexed Job, as a `docker run` on one engine: the pod's
    network is the node's (POD_IP = the node's address); /etc/hosts holds, as the kubelet writes it, the pod's
    own hostname at its IP and (the headless Service's DNS) pod 0's name; the runs claim is a bind mount, the
    memory emptyDir a /dev/shm of its size limit."""
    (c,) = pod["containers"]
    sec = pod["securityContext"]
    argv = [node2.DOCKER, "run", "--rm", "--name", f"k8s-pod-{index}-{os.getpid()}", "--network", "host",
            "--user", f"{sec['runAsUser']}:{sec['runAsGroup']}", "-w", c["workingDir"],
            "-e", f"JOB_COMPLETION_INDEX={index}", f"--add-host={socket.gethostname()}:{pod_ip}",
            *[f"--add-host={h}:{a}" for h, a in hosts.items()]]
    for e in c["env"]:
        value = pod_ip if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP" else e["value"]
        argv += ["-e", f"{e['name']}={value}"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        v = volumes[m["name"]]
        if v.get("emptyDir", {}).get("medium") == "Memory":
            argv += ["--shm-size", v["emptyDir"]["sizeLimit"].replace("Gi", "g").replace("Mi", "m")]
        elif "emptyDir" in v:  # the kubelet makes it writable by the pod's fsGroup
            argv += ["--mount", f"type=tmpfs,destination={m['mountPath']},tmpfs-mode=1777"]
        else:
            argv += ["-v", f"{runs}:{m['mountPath']}"]
    assert "resources" not in c, "CPU pods: no GPU limits"
    return argv + ["--entrypoint", c["command"][0], c["image"], *c["command"][1:], *c["args"]]


def test_the_kubernetes_pods_of_invoke_k8s_train_together(node, node_image, tmp_path):
    """No cluster here: each pod of the Indexed Job `invoke k8s` wrote is started as a kubelet would start it,
    with `docker run` on each node's engine (see _pod_as_docker_run), so its own command really trains."""
    from tests.support.cli import invoke

    r = invoke("k8s", "--recipe=zero2", "--nodes=2", "--gpus-per-node=0", "--variant=cpu", "--run-id=kube1",
               "--shm=1Gi", f"--out={tmp_path / 'k8s'}", "--", "--max_steps", "6", *STEPS)
    assert r.returncode == 0, r.stderr
    svc, job = yaml.safe_load_all((tmp_path / "k8s" / "job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    pod0 = f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"])  # the claim's fsGroup
    hosts = {pod0: node.host_addr}
    logs = [open(tmp_path / f"pod{i}.log", "w+") for i in (0, 1)]
    procs = [subprocess.Popen(_pod_as_docker_run(pod, 0, node.host_addr, hosts, runs), stdout=logs[0],
                              stderr=subprocess.STDOUT),
             subprocess.Popen(_pod_as_docker_run(pod, 1, node.addr, hosts, runs), stdout=logs[1],
                              stderr=subprocess.STDOUT, env=node.env)]
    try:
        codes = [p.wait(600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([node2.DOCKER, "rm", "-f", f"k8s-pod-0-{os.getpid()}"], capture_output=True)
        node.docker("rm", "-f", f"k8s-pod-1-{os.getpid()}", check=False)
    outputs = [(log.seek(0), log.read())[1] for log in logs]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    m0, m1 = manifest(runs / "kube1"), manifest(runs / "kube1", node_rank=1)
    for m, rank in ((m0, 0), (m1, 1)):
        assert m["status"] == "completed" and m["world_size"] == 4 and m["node_rank"] == rank
        assert m["rendezvous"]["endpoint"] == f"{pod0}:29500"
        assert m["strategy"]["in_effect"]["zero_stage"] == 2
    assert m1["rendezvous"]["local_addr"] == node.addr, "pod 1 advertised its pod IP"
    assert m0["metrics"]["loss_last"] < m0["metrics"]["loss_first"], "the loss fell"
