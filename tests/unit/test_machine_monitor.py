"""The run monitor. GPU readings are fed through the NVML source interface from recordings in
tests/fixtures/nvml/ (this CI has no GPU); the CPU path samples real processes; plots are real PNG files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dockyard.common import runfolder
from dockyard.gpus import Recorded
from dockyard.launch import monitor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
PNG = b"\x89PNG\r\n\x1a\n"


def _samples(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["samples"]


def _is_png(path: Path) -> bool:
    from matplotlib.image import imread

    return path.read_bytes()[:8] == PNG and imread(path).shape[0] > 100


def test_verdict_two_gpus_one_idle_names_the_idle_gpu_and_the_cause():
    v = monitor.verdict(_samples("two_gpus_one_idle.json"), "gpu")
    assert v["unbalanced"] and v["idle_devices"] == [1]
    assert "GPU 1 mostly idle" in v["message"]
    assert "pid 4242" in v["causes"][0] and "DataParallel" in v["causes"][0]


def test_verdict_balanced_run():
    v = monitor.verdict(_samples("balanced.json"), "gpu")
    assert not v["unbalanced"] and not v["idle_whole_run"]
    assert v["message"].startswith("balanced") and v["idle_devices"] == []
    cpu = [{**s, "devices": [{**d, "util": 55.0} for d in s["devices"]]} for s in _samples("balanced.json")]
    assert monitor.verdict(cpu, "cpu")["message"].startswith("balanced: rank 0 55% of a core, rank 1 55% of a core")
    assert float(v["mean_util"]["0"]) > 70 and float(v["mean_util"]["1"]) > 70


def test_a_balanced_run_whose_gpus_wait_while_training_is_told_how_to_find_on_what():
    """NVML's utilisation is the share of time a kernel ran: 87 % in the recording above, say nothing; 60 % while
    training (a host-bound run) points at profile_steps."""
    assert monitor.verdict(_samples("balanced.json"), "gpu")["causes"] == []
    waiting = [{"t": float(t), "devices": [{"device": d, "util": 0.0 if t < 5 else 60.0, "mem": 2**34} for d in (0, 1)]}
               for t in range(40)]
    v = monitor.verdict(waiting, "gpu")
    assert v["message"].startswith("balanced") and not v["unbalanced"]
    assert "60% of the time" in v["causes"][0] and "--profile_steps" in v["causes"][0]  # loading (0 %) left out


def test_verdict_gpus_idle_for_the_whole_run():
    idle = [{"t": float(t), "devices": [{"device": 0, "util": 0.0, "mem": 0}, {"device": 1, "util": 0.0, "mem": 0}]}
            for t in range(40)]
    v = monitor.verdict(idle, "gpu")
    assert v["idle_whole_run"] and not v["unbalanced"] and "did not run on them" in v["message"]


def test_gpus_that_train_below_busy_are_told_they_wait_not_that_the_training_did_not_run_on_them():
    """An H100 at 30 % for two minutes (a run that waits on its data or the host): the verdict said "the GPUs stayed
    idle for the whole run: the training did not run on them (the cpu variant, or CUDA not visible in the
    container)", and so did a run of one process at 35 % on one of two GPUs, with no word of the idle one."""
    slow = [{"t": float(t), "devices": [{"device": 0, "util": 30.0, "mem": 60 * 2**30, "mem_total": 80 * 2**30,
                                         "pids": [7]}]} for t in range(120)]
    v = monitor.verdict(slow, "gpu")
    assert not v["idle_whole_run"] and "did not run on them" not in v["message"]
    assert "30% of the time" in v["causes"][0] and "--profile_steps" in v["causes"][0]
    one_of_two = [{"t": float(t), "devices": [
        {"device": 0, "util": 35.0, "mem": 20 * 2**30, "mem_total": 24 * 2**30, "pids": [7]},
        {"device": 1, "util": 0.0, "mem": 2**20, "mem_total": 24 * 2**30, "pids": []}]} for t in range(120)]
    v = monitor.verdict(one_of_two, "gpu")
    assert not v["idle_whole_run"] and v["unbalanced"] and v["idle_devices"] == [1]
    assert any("nothing runs on GPU 1" in c for c in v["causes"])


def test_verdict_nothing_on_the_idle_gpu():
    """Fewer processes than GPUs: GPU 1 neither works nor holds memory."""
    rows = [{"t": float(t), "devices": [{"device": 0, "util": 95.0, "mem": 20 * 2**30, "mem_total": 80 * 2**30, "pids": [7]},
                                        {"device": 1, "util": 0.0, "mem": 2**20, "mem_total": 80 * 2**30, "pids": []}]}
            for t in range(20)]
    v = monitor.verdict(rows, "gpu")
    assert v["unbalanced"] and any("nothing runs on GPU 1" in c for c in v["causes"])


def test_a_gpu_whose_utilisation_nvml_cannot_read_is_unknown_not_idle(tmp_path):
    """A MIG GPU: its utilisation was stored as 0 %, and the verdict said "the GPUs stayed idle for the whole run (GPU 0
    0%): the training did not run on them" while 30 GiB were in use. Its memory and processes still show the use."""
    mig = [{"t": float(t), "devices": [{"device": 0, "util": None, "mem": 30 * 2**30, "mem_total": 40 * 2**30,
                                        "pids": [77]}]} for t in range(40)]
    v = monitor.verdict(mig, "gpu")
    assert not v["idle_whole_run"] and not v["unbalanced"] and "did not run on them" not in v["message"]
    assert v["message"] == ("utilisation unknown for GPU 0 (NVML cannot read it on a MIG device); memory in use peaked "
                            "at 30.0 GiB on GPU 0")
    assert v["mean_util"] == {"0": None}
    beside = [{"t": s["t"], "devices": [{"device": 0, "util": 90.0, "mem": 2**30, "pids": [7]},
                                        {**s["devices"][0], "device": 1}]} for s in mig]
    v = monitor.verdict(beside, "gpu")  # beside a busy GPU it is not an idle one
    assert not v["unbalanced"] and v["idle_devices"] == [] and "GPU 0 90%, GPU 1 unknown" in v["message"]
    (tmp_path / "gpu.png").write_bytes(monitor.plot_usage(beside, "gpu"))
    assert _is_png(tmp_path / "gpu.png")


def _two(util0: float, util1: list[float]) -> list[dict]:
    return [{"t": float(t), "devices": [{"device": 0, "util": util0, "mem": 2**30}, {"device": 1, "util": u, "mem": 2**30}]}
            for t, u in enumerate(util1)]


# idle: the devices idle in at least MOSTLY of the busy samples (monitor.json's idle_devices), whether or not there
# were enough of them (MIN_ACTIVE) for a verdict on balance
@pytest.mark.parametrize("samples, unbalanced, idle", [
    (_two(monitor.BUSY, [0.0] * 10), True, [1]),              # exactly BUSY is working
    (_two(monitor.BUSY - 0.1, [0.0] * 10), True, [1]),        # just under, and nothing busier: judged as it works
    (_two(monitor.IDLE - 0.1, [0.0] * 10), False, []),        # nobody works: nothing to compare
    (_two(95.0, [monitor.IDLE - 0.1] * 10), True, [1]),       # just under IDLE is idle
    (_two(95.0, [monitor.IDLE] * 10), False, []),             # exactly IDLE is not idle
    (_two(95.0, [0.0] * 5 + [60.0] * 5), True, [1]),          # idle in exactly MOSTLY (half) of the busy samples
    (_two(95.0, [0.0] * 4 + [60.0] * 6), False, []),          # idle in 4 of 10: not most of them
    (_two(95.0, [0.0] * monitor.MIN_ACTIVE), True, [1]),      # exactly MIN_ACTIVE busy samples give a verdict
    (_two(95.0, [0.0] * (monitor.MIN_ACTIVE - 1)), False, [1]),  # too few for one; GPU 1 was idle in each of them
])
def test_verdict_on_each_threshold(samples, unbalanced, idle):
    v = monitor.verdict(samples, "gpu")
    assert v["unbalanced"] is unbalanced
    assert v["idle_devices"] == idle


def _until_replayed(mon, samples: int = 90) -> None:
    """Until the monitor has the recording's samples, or has stopped, or a minute has gone by."""
    deadline = time.monotonic() + 60
    while len(mon.samples) < samples and mon._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_watch_records_warns_live_and_plots(tmp_path, capfd):
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [{"step": s, "loss": 3.0 - s * 0.1, "learning_rate": 1e-4} for s in range(1, 21)])
        + '\nnot json\n{"step": 20, "eval_loss": 2.1}\n{"train_runtime": 12.5}\n')
    with monitor.watch(tmp_path, interval=0.001, source=Recorded.from_file(FIXTURES / "two_gpus_one_idle.json")) as mon:
        _until_replayed(mon)  # the run lasts until the recording is replayed
    err = capfd.readouterr().err
    assert err.count("unbalanced") == 2  # once live, once at the end
    lines = (tmp_path / runfolder.MONITOR_SAMPLES).read_text().splitlines()
    assert len(lines) == 90 and json.loads(lines[-1])["devices"][1]["device"] == 1
    verdict = json.loads((tmp_path / runfolder.MONITOR_VERDICT).read_text())
    assert verdict["unbalanced"] and verdict["plots"] == ["gpu.png", "loss.png"]
    assert _is_png(tmp_path / "gpu.png") and _is_png(tmp_path / "loss.png")
    assert monitor.read_losses(tmp_path)["eval_loss"] == [(20, 2.1)]


def test_the_loss_plot_of_a_long_run_reads_a_spaced_sample_of_its_steps_and_every_evaluation(tmp_path):
    """A 256 MiB metrics.jsonl of short lines took 67 s and 2.4 GB of the host for a plot of 12 million points, and
    one over 256 MiB (a long run logging every step) got none. Now about LOSS_POINTS evenly spaced steps are read,
    the first and the last among them, and every evaluation."""
    steps = 400_000
    lines = [json.dumps({"step": s, "loss": 10.0 - s / steps}) for s in range(1, steps + 1)]
    for at in range(50_000, steps + 1, 50_000):
        lines.insert(at, json.dumps({"step": at, "eval_loss": 1.0 + at / steps}))
    (tmp_path / runfolder.METRICS).write_text("\n".join(lines) + "\n")
    series = monitor.read_losses(tmp_path)
    loss = series["loss"]
    assert monitor.LOSS_POINTS * 0.9 <= len(loss) <= monitor.LOSS_POINTS * 1.1
    assert loss[0] == (1, 10.0 - 1 / steps) and loss[-1] == (steps, 9.0)
    gaps = {b[0] - a[0] for a, b in zip(loss, loss[1:-1], strict=False)}
    assert max(gaps) <= 2 * min(gaps)  # evenly spaced, not the first 20,000 steps
    assert series["eval_loss"] == [(at, 1.0 + at / steps) for at in range(50_000, steps + 1, 50_000)]
    runfolder.write(tmp_path, runfolder.LOSS_PLOT, monitor.plot_loss(series))
    assert _is_png(tmp_path / runfolder.LOSS_PLOT)


def _profiled_run(run, timeline: bytes) -> dict:
    """A run whose rank 0 left `timeline` in profile/timeline.json, watched on the recorded balanced GPUs."""
    (run / runfolder.PROFILE).mkdir(parents=True)
    (run / runfolder.PROFILE / runfolder.PROFILE_TIMELINE_DATA).write_bytes(timeline)
    with monitor.watch(run, interval=0.001, source=Recorded.from_file(FIXTURES / "balanced.json")) as mon:
        _until_replayed(mon)
    return json.loads((run / runfolder.MONITOR_VERDICT).read_text())


def test_a_gpu_profile_gets_a_timeline_of_its_kernels_and_a_broken_one_costs_only_that_plot(tmp_path, capfd):
    """The trace is the format torch.profiler writes on a GPU (Kineto's `kernel` and `gpu_memcpy` events), made here
    since this machine has none; the trainer turns it into profile/timeline.json (dockyard.train.profiler), which
    the monitor draws."""
    kernels = [{"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 90.0, "tid": stream}
               for ts, name, stream in ((0.0, "nvjet_tst_gemm", 7), (100.0, "flash_fwd_kernel", 7),
                                        (50.0, "ncclDevKernel_AllReduce", 20), (300.0, "elementwise", 7))]
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 400.0}, *kernels,
                             {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 200.0, "dur": 10.0, "tid": 7}]}
    record = monitor.kernels.timeline_record(trace)
    v = _profiled_run(tmp_path / "gpu", json.dumps(record).encode())
    assert v["plots"] == ["gpu.png", "profile/timeline.png"] and _is_png(tmp_path / "gpu" / "profile" / "timeline.png")
    rows = record["rows"]
    assert list(rows) == ["stream 20 / all kernels", "stream 20 / communication", "stream 7 / all kernels",
                          "stream 7 / attention", "stream 7 / matmul", "stream 7 / memory copies",
                          "stream 7 / other kernels"]
    assert rows["stream 7 / attention"] == [[0.1, 0.09]]  # ms from the first kernel
    assert len(rows["stream 7 / all kernels"]) == 4  # the stream's every kernel and copy: its gaps are its waits
    assert record["busy"] == pytest.approx(290 / 400)  # 0-190 (both streams), the copy, 300-390: of the 400 µs span
    assert monitor.kernels.timeline_record({"traceEvents": trace["traceEvents"][:1]}) is None  # CPU: none written
    # what is not the trainer's timeline: said, and the verdict and the other plots are there all the same
    for name, garbage in (("text", b"not a timeline"), ("deep", b"[" * 100000), ("trace", json.dumps(trace).encode()),
                          ("nan", json.dumps({**record, "busy": float("nan")}).encode()),
                          ("long", json.dumps({"busy": 0.5, "rows": {"x": [[0, 1]] * 5000}}).encode()),
                          ("big", b" " * (monitor.TIMELINE_LIMIT + 1))):
        assert _profiled_run(tmp_path / name, garbage)["plots"] == ["gpu.png"], name
        assert "no profile timeline" in capfd.readouterr().err and not (tmp_path / name / "profile" / "timeline.png").exists()


def test_a_timeline_stays_small_whatever_the_number_of_kernels():
    """The host parsed rank 0's whole trace to draw it: 229 MB of trace took 1.3 GB and 29 s there, and a planted
    one of 4 GiB (12 MB gzip'd) would have taken tens of GB. The trainer now writes the timeline, its intervals
    closer than a pixel merged: 200,000 kernels of one stream make at most TIMELINE_POINTS + 1 intervals a row, and
    the GPU's busy share is the trace's own."""
    # a kernel every 10 µs, and a 50 ms wait (the data loader, say) after the 100,000th
    events = [{"ph": "X", "cat": "kernel", "name": "nvjet_tst_gemm" if i % 2 else "flash_fwd_kernel",
               "ts": i * 10.0 + (50_000.0 if i >= 100_000 else 0.0), "dur": 6.0, "tid": 7} for i in range(200_000)]
    trace = {"traceEvents": events}
    record = monitor.kernels.timeline_record(trace)
    busy = monitor.kernels.gpu_time(trace)
    assert record["busy"] == pytest.approx(busy["busy_us"] / busy["span_us"]) == pytest.approx(1.2e6 / 2_049_996)
    assert all(len(at) == 2 for at in record["rows"].values()), {name: len(at) for name, at in record["rows"].items()}
    (first, took), (then, _) = record["rows"]["stream 7 / all kernels"]
    assert (first, then) == (0.0, 1050.0) and took == pytest.approx(999.996), "the wait stays, as wide as it was"
    assert len(json.dumps(record)) < 1000


def test_watch_never_fails_the_run(tmp_path, capfd):
    class Broken:
        kind = "gpu"

        def sample(self):
            raise RuntimeError("NVML went away")

        def close(self):
            pass

    ran = []
    with monitor.watch(tmp_path, interval=0.001, source=Broken()):
        ran.append(True)
    assert ran and "sampling stopped (RuntimeError: NVML went away)" in capfd.readouterr().err
    assert json.loads((tmp_path / runfolder.MONITOR_VERDICT).read_text())["samples"] == 0


def test_watch_lets_the_runs_own_error_through(tmp_path):
    with pytest.raises(KeyError, match="boom"):
        with monitor.watch(tmp_path, interval=0.001, source=Recorded.from_file(FIXTURES / "balanced.json")):
            raise KeyError("boom")
    assert json.loads((tmp_path / runfolder.MONITOR_VERDICT).read_text())["samples"] > 0


def test_each_node_of_a_shared_run_folder_watches_into_its_own_files(tmp_path):
    """Two nodes, one run folder: node 1 must not write into node 0's samples, verdict or plots."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    for rank in (0, 1):
        with monitor.watch(tmp_path, interval=0.001, source=Recorded.from_file(FIXTURES / "balanced.json"),
                           node_rank=rank) as mon:
            while len(mon.samples) < 5:
                time.sleep(0.01)
    v0 = json.loads((tmp_path / "monitor.json").read_text())
    v1 = json.loads((tmp_path / "monitor-node1.json").read_text())
    assert v0["plots"] == ["gpu.png", "loss.png"] and v1["plots"] == ["gpu-node1.png"]
    assert _is_png(tmp_path / "gpu-node1.png") and (tmp_path / "monitor-node1.jsonl").read_text().count("\n") >= 5


def test_a_run_given_some_gpus_is_watched_on_those_alone(settings, monkeypatch, tmp_path):
    """`invoke run --gpus=0,2` sampled every GPU of the host: the verdict said "GPU 1 mostly idle ... nothing runs on
    GPU 1" of a GPU the run was told not to use, and gpu.png drew it. Through launch.run with a stand-in engine on a
    recorded 8-GPU host; NVML faked with GPUs 0 and 2 busy, the others idle."""
    from dockyard import engine, gpus
    from dockyard.common.recipes import load_recipe
    from dockyard.launch import run as launch_run
    from dockyard.train import manifest
    from tests.support.fake_engine import FakeEngine
    from tests.support.nvml import install

    def trainer(argv: list[str]) -> int:  # the container: a run that completes once the monitor has sampled it
        run_dir, deadline = tmp_path / "runs" / "picked", time.time() + 10
        sampled = run_dir / runfolder.MONITOR_SAMPLES
        while time.time() < deadline and not (sampled.is_file() and sampled.read_text().strip()):
            time.sleep(0.05)
        manifest.write(run_dir, manifest.build(run_dir, load_recipe("ddp"), "completed", 2, None, {}, {}))
        return 0

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(gpus.REPLAY_ENV, str(FIXTURES / "hosts" / "h100x8_580.json"))
    monkeypatch.setenv("DOCKYARD_MEMLOCK", str(1 << 30))  # not this host's dockerd limits
    monkeypatch.setattr(engine, "which", lambda name: f"/usr/bin/{name}")  # the NVIDIA runtime's hook
    install(monkeypatch, 8, util=[95, 0, 95, 0, 0, 0, 0, 0])
    fake = FakeEngine(container=trainer)
    s = fake.install(monkeypatch, settings).model_copy(update={"runs_dir": tmp_path / "runs"})
    host = gpus.read_host()
    tag = launch_run.variants.tag(s, launch_run.variants.resolve(s, "auto", host)[0])
    fake.images.add("sha256:" + "c" * 64)
    fake.tags[tag] = "sha256:" + "c" * 64
    launch_run.run(s, launch_run.RunRequest(recipe="ddp", run_id="picked", gpus="0,2"))

    run_dir = tmp_path / "runs" / "picked"
    rows = [json.loads(line) for line in (run_dir / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    assert rows and all([d["device"] for d in r["devices"]] == [0, 2] for r in rows)
    verdict = json.loads((run_dir / runfolder.MONITOR_VERDICT).read_text())
    assert verdict["devices"] == 2 and set(verdict["mean_util"]) == {"0", "2"} and "GPU 1" not in verdict["message"]


def test_a_resumed_run_appends_samples_that_keep_one_clock_across_attempts(tmp_path):
    """A resume appended its samples with `t` starting again at 0, nothing telling the attempts apart: each sample
    carries the clock too, as metrics.jsonl's lines do."""
    counts = []
    for _ in range(2):
        with monitor.watch(tmp_path, interval=0.001, source=Recorded.from_file(FIXTURES / "balanced.json")) as mon:
            while len(mon.samples) < 5:
                time.sleep(0.01)
        counts.append(len(mon.samples))
    rows = [json.loads(line) for line in (tmp_path / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    first, second = rows[:counts[0]], rows[counts[0]:]
    assert len(second) == counts[1] and second[0]["t"] < first[-1]["t"]  # t restarts with the attempt
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows) and second[0]["time"] >= first[-1]["time"]
