"""The monitor on a host without GPUs: it finds the training ranks by command line (not the launcher, not the
docker client) and records their CPU and RSS. Real processes; NVML is faked (no GPU here) where a test says so.
The verdict on balance is tested on readings the monitor recorded of real ranks (tests/fixtures/nvml/cpu_ranks_*),
replayed through its source interface: what share of a core a live rank gets is the host's doing (other jobs on a
shared CPU host), which no test here controls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import psutil
import pytest

from dockyard.common import runfolder
from dockyard.gpus import Recorded
from dockyard.launch import monitor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
PNG = b"\x89PNG\r\n\x1a\n"


def _replayed(run_dir: Path, recording: str) -> dict:
    """The verdict monitor.watch writes over a recording of a CPU run's ranks (40 samples of
    monitor.Processes, every 0.5 s) fed through the monitor's source interface as Processes' readings are."""
    source = Recorded.from_file(FIXTURES / recording)
    assert source.kind == "cpu" and len(source.recording.samples) == 40
    with monitor.watch(run_dir, interval=0.001, source=source) as mon:
        deadline = time.monotonic() + 60  # not a measure: only so that a monitor which stopped fails, not hangs
        while len(mon.samples) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len((run_dir / runfolder.MONITOR_SAMPLES).read_text().splitlines()) == 40
    assert (run_dir / "cpu.png").read_bytes()[:8] == PNG
    return json.loads((run_dir / runfolder.MONITOR_VERDICT).read_text())


@pytest.mark.parametrize("recording", ["cpu_ranks_one_idle.json", "cpu_ranks_one_idle_shared_host.json"])
def test_an_idle_rank_among_busy_ones_is_caught_and_named(tmp_path, capfd, recording):
    """Rank 0 works (a whole core on a quiet host, about half of one beside six busy loops), rank 1 waits: the
    monitor warns while the run lasts (after 30 samples) and again at the end, naming rank 1, and says why a CPU
    rank waits."""
    verdict = _replayed(tmp_path, recording)
    assert verdict["kind"] == "cpu" and verdict["devices"] == 2 and verdict["samples"] == 40
    assert verdict["unbalanced"] and verdict["idle_devices"] == [1] and not verdict["idle_whole_run"]
    assert verdict["message"].startswith("unbalanced: rank 1 mostly idle while rank 0 worked")
    assert verdict["plots"] == ["cpu.png"]
    err = capfd.readouterr().err
    assert err.count("rank 1 mostly idle while rank 0 worked") == 2  # once live, once at the end
    assert "more ranks than free CPU cores" in err


def test_ranks_that_both_work_are_not_flagged(tmp_path, capfd):
    """Both ranks spin, each given from a third of a core to a whole one by a shared host: balanced, no warning."""
    verdict = _replayed(tmp_path, "cpu_ranks_balanced.json")
    assert verdict["kind"] == "cpu" and verdict["samples"] == 40
    assert not verdict["unbalanced"] and verdict["idle_devices"] == [] and not verdict["idle_whole_run"]
    assert verdict["message"].startswith("balanced: rank 0 ") and ", rank 1 " in verdict["message"]
    err = capfd.readouterr().err
    assert "monitor: balanced: rank 0" in err and "idle" not in err


# A stand-in for torchrun: a parent whose command names the module, starting two ranks that do too.
# Rank 0 spins, rank 1 sleeps (each ends by itself after two minutes, should the test not stop them).
LAUNCHER = """
import os, subprocess, sys
run_dir = sys.argv[-1]
work = "import time\\nt=time.time()\\nwhile time.time()-t<120: pass"
rest = "import time; time.sleep(120)"
ranks = [subprocess.Popen([sys.executable, "-c", code, "-m", "dockyard.train", "--run-dir", run_dir],
                          env={**os.environ, "LOCAL_RANK": str(i)}) for i, code in enumerate((work, rest))]
for r in ranks:
    r.wait()
"""


def _cpu_seconds(rows: list[dict], rank: int) -> float:
    """The CPU time the samples give a rank: its % of a core since the sample before, times the time since then."""
    return sum(d["util"] / 100 * (row["t"] - before["t"]) for before, row in pairwise(rows)
               for d in row["devices"] if d["device"] == rank)


def test_cpu_ranks_are_found_and_each_sampled(tmp_path):
    """Real ranks under a real launcher: the monitor finds both (by LOCAL_RANK, the launcher left out), and each
    row holds each rank's own CPU and RSS: the rank that spins is read spending CPU time, the one that sleeps
    less. The monitor is watched until the spinning rank has been read at a CPU-second, however long a loaded host
    takes to give it one (up to 90 s, a hundredth of a core); whether it ran busy enough for the verdict to call it working is the
    host's doing, so the verdict's balance is not asserted here (the tests above)."""
    run_dir = tmp_path / f"zero2-monitor-test-{os.getpid()}"
    run_dir.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, "-m", "dockyard.train", "--run-dir", str(run_dir)],
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(ranks := psutil.Process(launcher.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        with monitor.watch(run_dir, interval=0.25, source=monitor.Processes(run_dir)) as mon:
            while time.monotonic() < deadline and (sum(len(s["devices"]) == 2 for s in list(mon.samples)) < 12
                                                   or _cpu_seconds(list(mon.samples), 0) < 1.0):
                time.sleep(0.1)
        rank_pids = {int(p.environ()["LOCAL_RANK"]): p.pid for p in ranks}
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()
    rows = [json.loads(ln) for ln in (run_dir / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    full = [r for r in rows if len(r["devices"]) == 2]
    assert len(full) >= 12, "the two ranks were not found"
    assert {p for r in rows for d in r["devices"] for p in d["pids"]} == set(rank_pids.values())  # not the launcher
    assert all({d["device"]: d["pids"] for d in r["devices"]} == {0: [rank_pids[0]], 1: [rank_pids[1]]} for r in full)
    assert all(d["mem"] > 1_000_000 and r["kind"] == "cpu" for r in full for d in r["devices"])  # RSS
    spun, slept = _cpu_seconds(rows, 0), _cpu_seconds(rows, 1)
    assert spun >= 1.0, f"the spinning rank was read at {spun:.2f} CPU-seconds in 90 s"
    assert slept < spun, f"the sleeping rank was read at {slept:.2f} CPU-seconds, the spinning one at {spun:.2f}"
    verdict = json.loads((run_dir / runfolder.MONITOR_VERDICT).read_text())
    assert verdict["kind"] == "cpu" and verdict["devices"] == 2 and verdict["samples"] == len(rows)
    assert verdict["plots"] == ["cpu.png"] and (run_dir / "cpu.png").read_bytes()[:8] == PNG


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
    """A stand-in for pynvml (this CI has no GPU): a driver that is missing, or present with no GPU. Its errors are
    pynvml's own, which carry NVML's code (`value`), as dockyard.gpus reads it."""

    import pynvml

    NVMLError = pynvml.NVMLError
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def __init__(self, driver: bool):
        self.driver, self.opened, self.closed = driver, 0, 0

    def nvmlInit(self):
        if not self.driver:
            raise self.NVMLError(self.NVML_ERROR_DRIVER_NOT_LOADED)
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


def test_the_cpu_plot_says_there_was_no_gpu_and_its_legend_covers_no_curve(monkeypatch):
    """cpu.png, a CPU run's stand-in for gpu.png, was titled 'ntty: balanced: rank 0 33% of a core, ...': nothing on it
    said the run had no GPU (a reader looking for GPU use met a CPU chart and had to work it out from an axis label),
    and its legend, in the upper right, lay over the curves where a rank's use was high at the end."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figures = []
    monkeypatch.setattr(monitor, "_png", lambda fig: figures.append(fig) or b"")
    samples = [{"t": float(t), "devices": [{"device": r, "util": 40.0 if t > 5 else 10.0, "mem": 2**29}
                                          for r in (0, 1)]} for t in range(20)]
    monitor.plot_usage(samples, "cpu", "ntty: balanced: rank 0 33% of a core, rank 1 33% of a core")
    (fig,) = figures
    assert "no GPU" in fig.get_suptitle() and fig.get_suptitle().startswith("ntty: ")
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        if legend := ax.get_legend():
            assert not legend.get_window_extent().overlaps(ax.get_window_extent()), "the legend lies on the curves"


def test_the_loss_plot_says_what_it_shows_and_plots_the_logged_points(monkeypatch, tmp_path):
    """loss.png was titled with the run id alone ('ntty'): nothing said a point is a logging window's mean loss
    (steps 1, 5, 10, ...), not one step's, nor which curve was held-out data."""
    figures = []
    monkeypatch.setattr(monitor, "_png", lambda fig: figures.append(fig) or b"")
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 6.0 - s / 10}) + "\n" for s in (1, 5, 10)) + json.dumps(
        {"step": 10, "eval_loss": 5.5}) + "\n")
    monitor.plot_loss(monitor.read_losses(tmp_path), "ntty")
    (fig,) = figures
    title = fig.get_suptitle()
    assert title.startswith("ntty: ") and "mean over each logging window" in title and "held-out" in title, title
    (ax,) = fig.axes
    assert [list(line.get_xydata().tolist()) for line in ax.get_lines()] == [
        [[1.0, 5.9], [5.0, 5.5], [10.0, 5.0]], [[10.0, 5.5]]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss (training)", "eval_loss (held-out data)"]
