"""The monitor on a host without GPUs: it finds the training ranks by command line (not the launcher, not the
docker client) and records their CPU and RSS. Real processes; NVML is faked (no GPU here) where a test says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.common import runfolder
from dockyard.launch import monitor

# A stand-in for torchrun: a parent whose command names the module, starting two ranks that do too.
# Rank 0 spins, rank 1 sleeps: the unbalanced case the monitor must catch.
LAUNCHER = """
import os, subprocess, sys
run_dir = sys.argv[-1]
work = "import time\\nt=time.time()\\nwhile time.time()-t<30: pass"
rest = "import time; time.sleep(30)"
ranks = [subprocess.Popen([sys.executable, "-c", code, "-m", "dockyard.train", "--run-dir", run_dir],
                          env={**os.environ, "LOCAL_RANK": str(i)}) for i, code in enumerate((work, rest))]
for r in ranks:
    r.wait()
"""


def test_cpu_ranks_sampled_and_idle_rank_caught(tmp_path, capfd):
    run_dir = tmp_path / f"zero2-monitor-test-{os.getpid()}"
    run_dir.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, "-m", "dockyard.train", "--run-dir", str(run_dir)],
                                start_new_session=True)
    try:
        with monitor.watch(run_dir, interval=0.25, source=monitor.Processes(run_dir)) as mon:
            deadline = time.time() + 20
            while time.time() < deadline and sum(1 for s in mon.samples if len(s["devices"]) == 2) < 12:
                time.sleep(0.1)
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()
    rows = [json.loads(ln) for ln in (run_dir / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    full = [r for r in rows if len(r["devices"]) == 2]
    assert len(full) >= 12, "the two ranks were not found"
    assert {d["device"] for r in full for d in r["devices"]} == {0, 1}  # LOCAL_RANK, the launcher left out
    assert launcher.pid not in {p for r in rows for d in r["devices"] for p in d["pids"]}
    assert all(d["mem"] > 1_000_000 and r["kind"] == "cpu" for r in full for d in r["devices"])  # RSS
    verdict = json.loads((run_dir / runfolder.MONITOR_VERDICT).read_text())
    assert (run_dir / "cpu.png").read_bytes()[:4] == b"\x89PNG"
    spinning = [d["util"] for r in full for d in r["devices"] if d["device"] == 0]
    if sorted(spinning)[len(spinning) // 2] < monitor.CPU_BUSY and not verdict["unbalanced"]:
        # A host so loaded (other jobs on 2 cores) that the spinning rank mostly got under a quarter of a core:
        # working and waiting cannot be told apart. The verdict must still be the one its samples give.
        assert verdict == {**monitor.verdict(rows, "cpu"), "plots": ["cpu.png"]}
        return
    assert verdict["kind"] == "cpu" and verdict["unbalanced"] and verdict["idle_devices"] == [1]
    assert "rank 1 mostly idle" in capfd.readouterr().err


# A rank with --dataloader_num_workers 2: it forks two workers (a fork keeps its command line and LOCAL_RANK), then
# leaves its pid in the run folder; and torchrun's stand-in again, starting two of them.
RANK_WITH_WORKERS = """
import os, sys, time
for _ in range(2):
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
open(os.path.join(sys.argv[-1], str(os.getpid())), "w").close()
time.sleep(30)
"""
LAUNCHER_OF_RANKS_WITH_WORKERS = f"""
import os, subprocess, sys
ranks = [subprocess.Popen([sys.executable, "-c", {RANK_WITH_WORKERS!r}, "-m", "dockyard.train", "--run-dir",
                           sys.argv[-1]], env={{**os.environ, "LOCAL_RANK": str(i)}}) for i in range(2)]
for r in ranks:
    r.wait()
"""


@pytest.mark.parametrize("environment", ["readable", "unreadable"])
def test_the_ranks_are_sampled_not_their_data_loader_workers(tmp_path, monkeypatch, environment):
    """With --dataloader_num_workers 2 the samples held the four workers (about 0 % CPU) and left the ranks out, which
    have children with their command line: cpu.png fell to 0 % while training. Where no environment can be read
    (another user's processes) the command lines tell them apart."""
    run_dir = tmp_path / f"ddp-workers-test-{os.getpid()}"
    run_dir.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_OF_RANKS_WITH_WORKERS, "-m", "dockyard.train",
                                 "--run-dir", str(run_dir)], start_new_session=True)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and len(list(run_dir.iterdir())) < 2:
            time.sleep(0.05)
        ranks = {int(p.name) for p in run_dir.iterdir()}
        assert len(ranks) == 2, "the ranks did not start"
        source = monitor.Processes(run_dir)
        if environment == "unreadable":
            monkeypatch.setattr(source, "_local_rank", lambda p: "")
        readings = source.sample()
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()
    assert {pid for r in readings for pid in r.pids} == ranks
    if environment == "readable":
        assert sorted(r.device for r in readings) == [0, 1]


def test_a_run_is_not_sampled_for_another_whose_name_starts_with_its_own():
    """Once a substring match: two CPU runs exp1 and exp10 at once, and exp1's samples held exp10's rank too."""
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "dockyard.train", "--recipe",
                             "ddp", "--run-dir", "/workspace/runs/exp10"], env={**os.environ, "LOCAL_RANK": "0"})
    try:
        deadline = time.time() + 10
        seen = []
        while time.time() < deadline and rank.pid not in seen:
            seen = [d for r in monitor.Processes(Path("runs/exp10")).sample() for d in r.pids]
            time.sleep(0.1)
        assert rank.pid in seen, "the rank of exp10 is found for exp10"
        assert rank.pid not in [d for r in monitor.Processes(Path("runs/exp1")).sample() for d in r.pids]
        assert rank.pid not in [d for r in monitor.Processes(Path("runs/exp")).sample() for d in r.pids]
    finally:
        rank.kill()
        rank.wait()


def test_a_native_run_is_not_sampled_for_another_folder_of_the_same_name(tmp_path):
    """On the host the whole folder tells runs apart: another checkout's or user's native run named exp1 was counted
    as a rank of this exp1 (an "unbalanced" verdict, and its CPU in cpu.png)."""
    other = tmp_path / "other" / "runs" / "exp1"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "dockyard.train", "--run-dir",
                             str(other)], env={**os.environ, "LOCAL_RANK": "0"})
    try:
        deadline = time.time() + 10
        seen = []
        while time.time() < deadline and rank.pid not in seen:
            seen = [d for r in monitor.Processes(other).sample() for d in r.pids]
            time.sleep(0.1)
        assert rank.pid in seen, "the rank is found for its own folder"
        assert rank.pid not in [d for r in monitor.Processes(tmp_path / "mine" / "exp1").sample() for d in r.pids]
    finally:
        rank.kill()
        rank.wait()


class FakeNvml:
    """A stand-in for pynvml (this CI has no GPU): a driver that is missing, or present with no GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, driver: bool):
        self.driver, self.opened, self.closed = driver, 0, 0

    def nvmlInit(self):
        if not self.driver:
            raise self.NVMLError("Driver Not Loaded")
        self.opened += 1

    def nvmlShutdown(self):
        self.closed += 1

    def nvmlDeviceGetCount(self):
        return 0


@pytest.mark.parametrize("driver", [False, True])
def test_without_gpus_the_monitor_samples_the_ranks_and_leaves_nvml_closed(tmp_path, monkeypatch, driver):
    fake = FakeNvml(driver)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with monitor.default_source(tmp_path) as source:
        assert isinstance(source, monitor.Processes) and source.kind == "cpu"
    assert (fake.opened, fake.closed) == ((1, 1) if driver else (0, 0))  # NVML shut down as often as opened


def test_a_run_on_cpu_of_a_host_with_gpus_samples_its_ranks_not_the_gpus(tmp_path, monkeypatch):
    """`invoke run --cpu` (or the cpu variant) on a GPU host: its GPUs idle the whole run, and say nothing of it."""
    from tests.support.nvml import install

    install(monkeypatch, 2)
    with monitor.default_source(tmp_path, devices=[]) as source:
        assert isinstance(source, monitor.Processes)
    with monitor.default_source(tmp_path, devices=[1]) as source:
        assert source.kind == "gpu" and [r.device for r in source.sample()] == [1]
