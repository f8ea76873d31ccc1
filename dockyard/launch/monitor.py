"""The run monitor: samples the run's GPUs (or, without GPUs, every training rank's CPU and RSS) once a second
while a run lasts, warns when the work is unbalanced, and leaves plots and a verdict in the run folder.

    with monitor.watch(run_dir):
        engine.run(argv)

It runs on the host, beside the container, and never fails the run: its own errors become a warning.
Files it writes in the run folder: monitor.jsonl (one line per sample), monitor.json (the verdict),
gpu.png or cpu.png (utilisation and memory per device over time), loss.png (from the trainer's metrics.jsonl),
profile/timeline.png (rank 0's GPU kernels over the profiled steps, from the trainer's profile/timeline.json:
profile_steps on a GPU).
Every file goes through dockyard.common.runfolder: a link planted in the run folder is replaced or refused, never followed.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from dockyard import gpus
from dockyard.common import kernels, runfolder
from dockyard.common.errors import DockyardError, loads
from dockyard.gpus import Reading, Source, reading_to_dict
from dockyard.launch import node

BUSY, IDLE = 50.0, 10.0  # percent: a device at or above BUSY works, one below IDLE waits
CPU_BUSY = 25.0          # a CPU rank works from a quarter of a core: CPU hosts are shared, a waiting rank sits near 0
LIVE_WINDOW = 30         # samples (seconds at the default interval) a live warning looks back on
MIN_ACTIVE = 5           # samples with some device busy before any verdict on balance
MOSTLY = 0.5             # "most of the run": this share of the busy samples
WAITING = 80.0           # percent: GPUs busy less than this while training (on average) wait for something
TIMELINE_LIMIT = 8 << 20  # bytes: the profile's timeline.json (kernels.timeline_record's are under 3 MB)


class Processes:
    """CPU runs: each training rank's CPU % and RSS, found by command line (dockyard.train, its --run-dir the run's
    folder: .../<run-id>, inside the container or on this host; a run named exp1 is not exp10).

    torchrun's own process and the docker client name the module too, and so do a rank's data-loader workers
    (forked: its command line and environment). The ranks are the matching processes with LOCAL_RANK set whose
    parent is not a rank (torchrun sets it for its workers only: before they start, torchrun itself has none).
    Where a process's environment cannot be read, its command line is trusted: a worker has its parent's, and a
    launcher is a process that started matching ones with another.
    """

    kind = "cpu"

    def __init__(self, run_dir: Path):
        import psutil

        self.psutil = psutil
        self.run_name = run_dir.name
        self.run_dir = Path(os.path.abspath(run_dir))
        self.procs: dict[int, psutil.Process] = {}  # kept so cpu_percent() measures since the last sample
        self.total = psutil.virtual_memory().total

    def _ranks(self) -> list[tuple]:
        """(process, LOCAL_RANK: "" where unreadable) of each rank."""
        matches = {}
        for p in self.psutil.process_iter(["cmdline", "ppid"]):
            cmd = p.info["cmdline"] or []
            if "dockyard.train" in " ".join(cmd) and self._ours(runfolder.run_dir_of(cmd)) \
                    and not Path(cmd[0]).name.startswith("docker"):
                matches[p.pid] = p
        local = {pid: self._local_rank(p) for pid, p in matches.items()}

        def worker(p) -> bool:  # a rank's data-loader worker
            parent = matches.get(p.info["ppid"])
            if parent is None or local[parent.pid] is None:
                return False
            return local[parent.pid] != "" or parent.info["cmdline"] == p.info["cmdline"]

        started = {p.info["ppid"] for p in matches.values() if not worker(p)}  # the launchers, by what they started
        return [(self.procs.setdefault(pid, p), local[pid]) for pid, p in matches.items()
                if local[pid] is not None and not worker(p) and not (local[pid] == "" and pid in started)]

    def _ours(self, named: str) -> bool:
        """Whether a trainer's --run-dir is this run's: in a container (the runs folder mounted at RUNS_INSIDE) by
        its name, on this host by its whole path (another checkout's or user's run of the same name is not this one)."""
        folder = Path(named)
        if folder.parent == Path(node.RUNS_INSIDE) or not folder.is_absolute():
            return folder.name == self.run_name
        return Path(os.path.abspath(folder)) == self.run_dir

    def _local_rank(self, p) -> str | None:
        """LOCAL_RANK from the process environment; "" when it cannot be read (then trust the command line)."""
        try:
            return p.environ().get("LOCAL_RANK")
        except self.psutil.Error:
            return ""

    def sample(self) -> list[Reading]:
        out = []
        for i, (p, rank) in enumerate(sorted(self._ranks(), key=lambda pr: pr[0].pid)):
            try:
                with p.oneshot():
                    out.append(Reading(int(rank) if rank.isascii() and rank.isdigit() else i, p.cpu_percent(None),
                                       p.memory_info().rss, self.total, (p.pid,)))
            except self.psutil.Error:
                continue  # the rank just ended
        return out


class Selected:
    """The GPUs a run was given (`invoke run --gpus=0,2`) of a source that reads them all: the others run other work,
    or nothing, and are no part of the run's verdict."""

    kind = "gpu"

    def __init__(self, source: Source, devices: Sequence[int]):
        self.source, self.devices = source, set(devices)

    def sample(self) -> list[Reading]:
        return [r for r in self.source.sample() if r.device in self.devices]


@contextlib.contextmanager
def default_source(run_dir: Path, devices: Sequence[int] | None = None) -> Iterator[Source]:
    """NVML (open while the block runs) for the run's GPUs (`devices`, their indices; None: every GPU of the host),
    else (no GPUs, or a run given none: the cpu variant, --cpu) the training ranks' processes."""
    with contextlib.ExitStack() as stack:
        try:
            nv = stack.enter_context(gpus.nvml())
        except gpus.NvmlUnavailable:
            nv = None
        if nv is None or not nv.handles or (devices is not None and not devices):
            yield Processes(run_dir)
        else:
            yield nv if devices is None else Selected(nv, devices)


# --- the verdict: pure, on recorded samples --------------------------------------------------------

def _label(kind: str, device) -> str:
    return f"{'GPU' if kind == 'gpu' else 'rank'} {device}"


def verdict(samples: list[dict], kind: str) -> dict:
    """Is the work spread over every device? Samples are monitor.jsonl lines ({"t", "devices": [...]})."""
    per_dev: dict[int, list[dict]] = collections.defaultdict(list)
    for s in samples:
        for d in s["devices"]:
            per_dev[d["device"]].append(d)
    devices = sorted(per_dev)
    # utilisation None: NVML cannot read it (a MIG device), which is neither busy nor idle
    known = {d: [r["util"] for r in rs if r["util"] is not None] for d, rs in per_dev.items()}
    mean_util = {d: sum(u) / len(u) if u else None for d, u in known.items()}
    unknown = [d for d in devices if mean_util[d] is None]
    peak_mem = {d: max(r["mem"] for r in rs) for d, rs in per_dev.items()}
    busy_at = BUSY if kind == "gpu" else CPU_BUSY

    def idle_now(d: dict) -> bool:
        return d["util"] is not None and d["util"] < IDLE

    def working_from(level: float) -> list[dict]:
        return [s for s in samples if any(d["util"] is not None and d["util"] >= level for d in s["devices"])]

    # a run whose GPUs never reach BUSY still trains (an H100 at 30 %: it waits on data or the host): judged on the
    # samples where some device works at all, it was told its GPUs "stayed idle: the training did not run on them"
    active = working_from(busy_at) or working_from(IDLE)
    idle_in = collections.Counter(d["device"] for s in active for d in s["devices"] if idle_now(d))
    lopsided = sum(1 for s in active if any(idle_now(d) for d in s["devices"]))
    idle = [d for d in devices if active and idle_in[d] >= MOSTLY * len(active)]
    unbalanced = len(devices) > 1 and len(active) >= MIN_ACTIVE and lopsided >= MOSTLY * len(active) and bool(idle)
    all_idle = kind == "gpu" and len(samples) >= LIVE_WINDOW and not active and not unknown
    seconds = samples[-1]["t"] - samples[0]["t"] if samples else 0.0
    of = "" if kind == "gpu" else " of a core"  # a process's CPU time: 100 % is one core busy
    means = ", ".join(f"{_label(kind, d)} " + (f"{mean_util[d]:.0f}%{of}" if d not in unknown else "unknown")
                      for d in devices)
    if unbalanced:
        busy = [d for d in devices if d not in idle]
        message = (f"unbalanced: {', '.join(_label(kind, d) for d in idle)} mostly idle while "
                   f"{', '.join(_label(kind, d) for d in busy)} worked, in {lopsided} of {len(active)} busy "
                   f"samples (mean utilisation: {means})")
        causes = _causes(samples, kind, idle, peak_mem)
    elif all_idle:
        message = (f"the GPUs stayed idle for the whole run ({means}): the training did not run on them "
                   "(the cpu variant, or CUDA not visible in the container)")
        causes = []
    elif not samples:
        message, causes = "no samples: no training process was seen", []
    elif unknown:
        used = ", ".join(f"{peak_mem[d] / 2**30:.1f} GiB on {_label(kind, d)}" for d in unknown)
        message = (f"utilisation unknown for {', '.join(_label(kind, d) for d in unknown)} (NVML cannot read it on a "
                   f"MIG device); memory in use peaked at {used}"
                   + (f" (mean utilisation: {means})" if len(unknown) < len(devices) else ""))
        causes = []
    else:
        message, causes = f"balanced: {means}", []
        training = [d["util"] for s in active for d in s["devices"] if d["util"] is not None]
        while_training = sum(training) / len(training) if training else 100.0
        if kind == "gpu" and len(active) >= MIN_ACTIVE and while_training < WAITING:
            causes = [f"While training, a GPU ran a kernel {while_training:.0f}% of the time on average: "
                      "the rest it waited (on data, the host, communication). `-- --profile_steps 20-22` profiles "
                      "those steps and says on what (docs/training.md, Profiling a few steps)."]
    return {"kind": kind, "devices": len(devices), "samples": len(samples), "seconds": round(seconds, 1),
            "unbalanced": unbalanced, "idle_devices": idle, "idle_whole_run": all_idle,
            "mean_util": {str(d): None if u is None else round(u, 1) for d, u in mean_util.items()},
            "peak_mem_bytes": {str(d): m for d, m in peak_mem.items()}, "message": message, "causes": causes}


def _causes(samples: list[dict], kind: str, idle: list[int], peak_mem: dict[int, int]) -> list[str]:
    """The likely reasons, the ones the readings point at first."""
    if kind != "gpu":
        return ["the idle ranks wait for the others: uneven batches or sequence lengths, or more ranks than "
                "free CPU cores (other work on the host)"]
    devices_of_pid: dict[int, set[int]] = collections.defaultdict(set)
    total = {}
    for s in samples:
        for d in s["devices"]:
            total[d["device"]] = d.get("mem_total") or total.get(d["device"], 0)
            for pid in d.get("pids", ()):
                devices_of_pid[pid].add(d["device"])
    causes = [f"one process (pid {pid}) drives GPUs {', '.join(map(str, sorted(devs)))}: it was started with "
              "plain `python` (the HF Trainer then uses nn.DataParallel) or loads the model with "
              'device_map="auto"; recipes must run one process per GPU (torchrun)'
              for pid, devs in sorted(devices_of_pid.items()) if len(devs) > 1]
    empty = [d for d in idle if peak_mem.get(d, 0) < max(512 * 2**20, 0.05 * total.get(d, 0))]
    if empty:
        causes.append(f"nothing runs on GPU {', '.join(map(str, empty))}: fewer processes than GPUs "
                      "(--nproc) or CUDA_VISIBLE_DEVICES hides them")
    if any(d not in empty for d in idle):
        causes.append('the idle GPUs hold memory but wait: layers split across GPUs by device_map="auto" run '
                      "one after another, or uneven batches make ranks wait for the slowest")
    return causes


# --- plots ---------------------------------------------------------------------------------------

def plot_usage(samples: list[dict], kind: str, title: str = "") -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6), layout="constrained")
    # a CPU run's stand-in for gpu.png says so where a reader looks first, not in an axis label alone
    fig.suptitle(title if kind == "gpu" else f"{title}\nno GPU in this run: each training rank's CPU use and resident "
                 "memory", fontsize=10)
    util_ax, mem_ax = fig.subplots(2, 1, sharex=True)
    devices = sorted({d["device"] for s in samples for d in s["devices"]})
    for dev in devices:
        points = [(s["t"], d) for s in samples for d in s["devices"] if d["device"] == dev]
        t = [p[0] for p in points]
        util = [math.nan if p[1]["util"] is None else p[1]["util"] for p in points]  # unknown (MIG): no line
        util_ax.plot(t, util, label=_label(kind, dev) + (" (utilisation unknown)" if all(map(math.isnan, util)) else ""))
        mem_ax.plot(t, [p[1]["mem"] / 2**30 for p in points], label=_label(kind, dev))
    util_ax.set_ylabel("GPU utilisation (%)" if kind == "gpu" else "CPU (% of one core)")
    mem_ax.set_ylabel("GPU memory used (GiB)" if kind == "gpu" else "RSS (GiB)")
    mem_ax.set_xlabel("seconds since start")
    util_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # beside the curves, never on them
    util_ax.grid(alpha=0.3)
    mem_ax.grid(alpha=0.3)
    return _png(fig)


METRICS_LIMIT = 4 << 30  # bytes of metrics.jsonl the host reads for the plot (a line per logging step: ~16M lines)
LOSS_BOUND = 1e30  # past it a value is no loss a run logs (1e308 and -1e308 left matplotlib no axis to draw)
LOSS_POINTS = 20_000  # points a series keeps: a line per step of a million-step run is more than a plot shows
CHUNK = 1 << 20


def read_losses(run_dir: Path, name: str = runfolder.METRICS) -> dict[str, list[tuple[float, float]]]:
    """(step, value) series for `loss` and `eval_loss` from JSON lines; other lines and keys, and values no loss
    takes (not finite, or past LOSS_BOUND), are skipped. Read in chunks, every line split but only about LOSS_POINTS
    of each kind parsed, evenly spaced: a 256 MiB file of short lines took 67 s and 2.4 GB for a plot of 12 million
    points."""
    series: dict[str, list[tuple[float, float]]] = {}
    f = runfolder.open_file(run_dir, name, METRICS_LIMIT)
    if f is None:
        return series
    with f:
        size = os.fstat(f.fileno()).st_size
        stride, n, evals, rest, unread = 0, 0, 0, b"", b""
        while chunk := f.read(CHUNK):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if not stride:  # from the first chunk's lines, the share of the file's that makes LOSS_POINTS
                stride = max(1, size * len(lines) // CHUNK // LOSS_POINTS)
            for line in lines:
                evaluated = b'"eval_loss"' in line and evals < LOSS_POINTS
                evals += evaluated
                unread = b"" if evaluated or n % stride == 0 else line
                if not unread:
                    _add(series, line)
                n += 1
        _add(series, rest or unread)  # the last step, where the curve ends
    return series


def _add(series: dict[str, list[tuple[float, float]]], line: bytes) -> None:
    if not line.strip():
        return
    try:
        row = loads(line)
    except ValueError:
        return
    if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)) or isinstance(row["step"], bool):
        return
    for key in ("loss", "eval_loss"):
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and _plottable(v) and _plottable(row["step"]):
            series.setdefault(key, []).append((row["step"], float(v)))


def _plottable(v: int | float) -> bool:
    try:
        return math.isfinite(float(v)) and abs(float(v)) <= LOSS_BOUND
    except OverflowError:  # an int of hundreds of digits
        return False


def plot_loss(series: dict[str, list[tuple[float, float]]], title: str = "") -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    # a point is a logging window's mean (steps 1, 5, 10, ...), not one step's: said, as is which curve is which
    shown = "training loss" + (" and loss on the held-out data" if "eval_loss" in series else "")
    fig.suptitle(f"{title}: {shown} by step (the mean over each logging window)" if title else shown, fontsize=10)
    ax = fig.subplots()
    for key, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None,
                label=f"{key} ({'held-out data' if key == 'eval_loss' else 'training'})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig)


def read_timeline(run_dir: Path) -> dict | None:
    """Rank 0's kernels over the profiled steps as the trainer wrote them (kernels.timeline_record), checked; None
    when the run has none (no profile, or a CPU run's). Untrusted: read through no link, refused past
    TIMELINE_LIMIT bytes (the trainer's stay under 3 MB) or where its shape is not the trainer's."""
    folder = run_dir / runfolder.PROFILE
    if not os.path.lexists(folder):
        return None
    raw = runfolder.read(folder, runfolder.PROFILE_TIMELINE_DATA, TIMELINE_LIMIT)
    if raw is None:
        return None
    try:
        data = loads(raw)
    except ValueError as e:  # not JSON (UnicodeDecodeError is a ValueError; errors.loads says deep nesting as one)
        raise DockyardError(f"{folder / runfolder.PROFILE_TIMELINE_DATA} is not JSON ({e})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    busy = data.get("busy") if isinstance(data, dict) else None
    if not (_number(busy) and 0 <= busy <= 1 and isinstance(rows, dict) and 0 < len(rows) <= kernels.TIMELINE_ROWS
            and all(isinstance(name, str) and isinstance(at, list) and len(at) <= kernels.TIMELINE_POINTS + 1
                    and all(isinstance(x, list) and len(x) == 2 and all(map(_number, x)) for x in at)
                    for name, at in rows.items())):
        raise DockyardError(f"{folder / runfolder.PROFILE_TIMELINE_DATA} is not a timeline the trainer wrote")
    return {"busy": busy, "rows": {name[:80]: [tuple(x) for x in at] for name, at in rows.items()}}


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plot_timeline(rows: dict[str, list[tuple[float, float]]], title: str = "") -> bytes:
    """Each stream's kernels, a row per kind, over the profiled time (ms): the gaps are the GPU waiting."""
    from matplotlib.figure import Figure

    names = list(rows)  # each stream: all its kernels, then each kind's
    kinds = [kind for kind, _ in kernels.KINDS] + [kernels.OTHER]
    fig = Figure(figsize=(11, 1.2 + 0.35 * len(names)), layout="constrained")
    fig.suptitle(title, fontsize=10)
    ax = fig.subplots()
    for i, name in enumerate(names):
        kind = name.rsplit(" / ", 1)[-1]
        color = "0.25" if kind == kernels.ALL else f"C{kinds.index(kind) if kind in kinds else len(kinds)}"
        ax.broken_barh(rows[name], (i - 0.4, 0.8), facecolors=color, linewidth=0)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first kernel of the profiled steps")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _png(fig) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()


# --- the sampler and the context manager ----------------------------------------------------------

def _say(text: str, style: str = "yellow") -> None:
    from rich.console import Console
    from rich.text import Text

    # a link's target, a kernel's name, an error's words: what a container wrote, shown as text, never read as [tags]
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(f"monitor: {text}", style=style))


class Monitor:
    def __init__(self, run_dir: Path, interval: float, source: Source, node_rank: int = 0):
        self.run_dir, self.interval, self.source = run_dir, interval, source
        # Several nodes share one run folder: each watches its own devices into its own files; node 0's keep
        # the plain names (and the loss plot, from the metrics only global rank 0 writes).
        self.suffix = f"-node{node_rank}" if node_rank else ""
        self.node_rank = node_rank
        self.samples: list[dict] = []
        self.warned = False
        self.discarded = False
        self._file: IO[str] | None = None  # the samples file, appended to; None when it could not be opened
        self._open_error: Exception | None = None  # why: said by the sampler, the verdict still written
        self._kept = 0  # the samples file's size before this run's: what discard() leaves
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dockyard-monitor", daemon=True)

    def start(self) -> None:
        try:
            self._file = runfolder.append(self.run_dir, self.name(runfolder.MONITOR_SAMPLES))
            self._kept = os.fstat(self._file.fileno()).st_size
        except Exception as e:  # noqa: BLE001 - e.g. a link planted there
            self._open_error = e
        self._thread.start()

    def _loop(self) -> None:
        t0 = time.monotonic()
        f = self._file
        try:
            if f is None:  # start() could not open it
                raise self._open_error
            while True:
                readings = self.source.sample()
                if readings:
                    # t from this watch's start (a resume starts again at 0, in the same file); time: the clock,
                    # one time base across a run's attempts, as metrics.jsonl's
                    row = {"t": round(time.monotonic() - t0, 3), "time": round(time.time(), 3), "kind": self.source.kind,
                           "devices": [reading_to_dict(r) for r in readings]}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    self.samples.append(row)
                    self._live_check()
                if self._stop.wait(self.interval):
                    return
        except Exception as e:  # noqa: BLE001 - the run must go on whatever the monitor meets
            _say(f"sampling stopped ({type(e).__name__}: {e}); the run goes on")

    def discard(self) -> None:
        """Keep nothing of this watch (a resume the trainer refused): the run's samples, plots and verdict stay
        those of the run before it."""
        self.discarded = True

    def _live_check(self) -> None:
        if self.warned or len(self.samples) < LIVE_WINDOW:
            return
        v = verdict(self.samples[-LIVE_WINDOW:], self.source.kind)
        if v["unbalanced"]:
            self.warned = True
            _say("; ".join([v["message"], *v["causes"]]))

    def name(self, file: str) -> str:
        stem, dot, ext = file.partition(".")
        return f"{stem}{self.suffix}{dot}{ext}"

    def finish(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=max(10.0, 3 * self.interval))
        if self._file is not None:
            with self._file:
                if self.discarded:
                    self._file.truncate(self._kept)
        if self.discarded:
            return {}
        kind = self.source.kind
        v = verdict(self.samples, kind)
        usage = self.name(f"{kind}.png")
        if self.samples:
            runfolder.write(self.run_dir, usage,
                            plot_usage(self.samples, kind, f"{self.run_dir.name}: {v['message'].split(' (')[0]}"))
        try:
            losses = read_losses(self.run_dir) if self.node_rank == 0 else {}
            if losses:
                runfolder.write(self.run_dir, runfolder.LOSS_PLOT, plot_loss(losses, self.run_dir.name))
        except Exception as e:  # noqa: BLE001 - metrics.jsonl planted as a link, a fifo, or past its limit, or values
            # matplotlib cannot place: no loss plot, the verdict still
            _say(f"no loss plot: {e if isinstance(e, DockyardError) else f'{type(e).__name__}: {e}'}")
            losses = {}
        timeline = self._profile_timeline() if self.node_rank == 0 else None
        v["plots"] = (([usage] if self.samples else []) + ([runfolder.LOSS_PLOT] if losses else [])
                      + ([timeline] if timeline else []))
        runfolder.write(self.run_dir, self.name(runfolder.MONITOR_VERDICT), json.dumps(v, indent=2) + "\n")
        _say(" ".join([v["message"] + ".", *v["causes"]]), "yellow" if v["unbalanced"] or v["idle_whole_run"] else "green")
        return v

    def _profile_timeline(self) -> str | None:
        """profile/timeline.png from rank 0's timeline when the run profiled GPU steps; its path in the run folder."""
        try:
            timeline = read_timeline(self.run_dir)
            if timeline is None:
                return None  # no profile, or a CPU run's: its summary lists the operators
            title = (f"{self.run_dir.name}: GPU kernels of the profiled steps by stream and kind (busy "
                     f"{timeline['busy']:.0%} of the profiled time)")
            runfolder.write(self.run_dir / runfolder.PROFILE, runfolder.PROFILE_TIMELINE,
                            plot_timeline(timeline["rows"], title))
        except Exception as e:  # noqa: BLE001 - a plot that fails leaves the verdict and the other plots
            _say(f"no profile timeline: {e if isinstance(e, DockyardError) else f'{type(e).__name__}: {e}'}")
            return None
        return f"{runfolder.PROFILE}/{runfolder.PROFILE_TIMELINE}"


@contextlib.contextmanager
def watch(run_dir: Path, *, interval: float = 1.0, source: Source | None = None, node_rank: int = 0,
          devices: Sequence[int] | None = None):
    """Sample while the block runs; at the end write plots and the verdict. Never raises on its own account.
    `devices`: the indices of the GPUs the run uses (default_source)."""
    with contextlib.ExitStack() as stack:
        mon = None
        try:
            if source is None:
                source = stack.enter_context(default_source(Path(run_dir), devices))
            mon = Monitor(Path(run_dir), interval, source, node_rank)
            mon.start()
        except Exception as e:  # noqa: BLE001
            _say(f"not started ({type(e).__name__}: {e}); the run goes on without it")
            mon = None
        try:
            yield mon
        finally:
            if mon is not None:
                try:
                    mon.finish()  # stops sampling before NVML is shut down on the way out
                except Exception as e:  # noqa: BLE001
                    _say(f"could not finish ({type(e).__name__}: {e}); the run itself is not affected")
