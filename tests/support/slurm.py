"""A real Slurm cluster of two nodes on this machine, for the Slurm tests: Debian's slurmctld, slurmd and munge.

Node `dy1` is this host, node `dy2` the test node of tests/support/node2.py (its own network namespace and
dockerd): its slurmd runs inside that namespace, named with `slurmd -N`, and both nodes are addressed on the
test network (198.18.0.0/15). Everything is private to one folder: the munge key and socket, slurm.conf, the
state and spool folders, the logs; the ports are picked at random. Every daemon is started here and stopped
here by its pid.

The one thing a real cluster does differently: there, each node's Docker engine is at the default socket. Here
node 2's engine has its own socket, so a TaskProlog (Slurm's hook for a task's environment) gives the tasks on
`dy2` that DOCKER_HOST.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")


def missing() -> list[str]:
    return [d for d in DAEMONS if not Path(d).exists()]


@dataclass
class Cluster:
    base: Path
    conf: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a user's shell on the login node has: the cluster's slurm.conf."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}\n"
                                 + self.logs())
        return p

    def logs(self) -> str:
        out = []
        for log in sorted((self.base / "log").glob("*")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)


def _free_ports() -> tuple[int, int]:
    """Two different free ports for slurmctld and slurmd, between 29000 and the kernel's ephemeral ports (32768 on,
    where any connect() may take one): the Slurm tests give their rendezvous (MASTER_PORT) a port from 20000 to
    29000, which drawn from the same range could be a daemon's, and the two daemons' could be one."""
    ports: list[int] = []
    while len(ports) < 2:
        port = random.randrange(29000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports[0], ports[1]


def _config(base: Path, node, ctl_port: int, d_port: int) -> str:
    return "\n".join([
        "ClusterName=dockyardtest",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({node.host_addr})",
        f"SlurmctldPort={ctl_port}",
        f"SlurmdPort={d_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base / 'munge.sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}/%n",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log'}/slurmd-%n.log",
        # no cgroups, accounting or MPI here: the job's processes are tracked by their parent pids
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        f"TaskProlog={base / 'taskprolog.sh'}",
        f"NodeName=dy1 NodeAddr={node.host_addr} CPUs={os.cpu_count()} State=UNKNOWN",
        f"NodeName=dy2 NodeAddr={node.addr} CPUs={os.cpu_count()} State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def start(node, base: Path) -> Cluster:
    """munged, slurmctld and a slurmd on this host; a slurmd in `node`'s namespace; both nodes idle."""
    base.mkdir(parents=True)
    for d in ("state", "spool/dy1", "spool/dy2", "log"):
        (base / d).mkdir(parents=True)
    cluster = Cluster(base=base, conf=base / "slurm.conf")
    try:
        _start(cluster, node)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _start(cluster: Cluster, node) -> None:
    b = cluster.base
    key = b / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    cluster.conf.write_text(_config(b, node, *_free_ports()))
    prolog = b / "taskprolog.sh"
    prolog.write_text(f'#!/bin/sh\n[ "$SLURMD_NODENAME" = dy2 ] && echo "export DOCKER_HOST=unix://{node.sock}"\n'
                      "exit 0\n")
    prolog.chmod(0o755)

    def daemon(name: str, argv: list) -> None:
        cluster.procs[name] = subprocess.Popen([str(a) for a in argv], stdout=open(b / "log" / f"{name}.out", "wb"),
                                               stderr=subprocess.STDOUT, start_new_session=True)

    # --foreground: munged's pid is the one we stop (it forks away otherwise)
    daemon("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--key-file={key}", f"--socket={b / 'munge.sock'}",
                      f"--pid-file={b / 'munged.pid'}", f"--seed-file={b / 'munge.seed'}",
                      f"--log-file={b / 'log' / 'munged.log'}"])
    _wait("munged", lambda: (b / "munge.sock").exists())
    daemon("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", cluster.conf])
    daemon("slurmd-dy1", ["/usr/sbin/slurmd", "-D", "-N", "dy1", "-f", cluster.conf])
    daemon("slurmd-dy2", ["nsenter", f"--net=/var/run/netns/{node.netns}",
                          "/usr/sbin/slurmd", "-D", "-N", "dy2", "-f", cluster.conf])

    def idle() -> bool:
        for name, p in cluster.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}):\n{cluster.logs()}")
        p = cluster.run("sinfo", "--noheader", "--format=%N %t", "--Node", check=False, timeout=20)
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return p.returncode == 0 and states.get("dy1") == "idle" and states.get("dy2") == "idle"

    _wait("both nodes idle in sinfo", idle, cluster=cluster)


def _wait(what: str, ok, timeout: float = 60, cluster: Cluster | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise RuntimeError(f"slurm: {what}: not within {timeout:.0f} s\n{cluster.logs() if cluster else ''}")


def stop(cluster: Cluster) -> None:
    """Cancel what is left of the jobs, stop every daemon by its pid (slurmd's job steps are in its session),
    remove the folder."""
    if "slurmctld" in cluster.procs and cluster.procs["slurmctld"].poll() is None:
        subprocess.run(["scancel", "--full", "--quiet", "--user=root"], env=cluster.env, capture_output=True,
                       timeout=30)
    for name in ("slurmd-dy2", "slurmd-dy1", "slurmctld", "munged"):
        p = cluster.procs.get(name)
        if p is None:
            continue
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    shutil.rmtree(cluster.base, ignore_errors=True)
