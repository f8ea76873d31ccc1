"""profile_steps: torch.profiler over a few optimizer steps, for "why is my GPU only 30 % busy".

Every rank writes its trace, profile/trace-rank<R>.json.gz (Chrome trace format: open it in Perfetto,
https://ui.perfetto.dev, or TensorBoard's profiler), and rank 0 a summary, profile/summary.txt: how much of the
profiled time its GPU was busy, what kind of kernels kept it so, and the operators that took the most time. The
manifest's `profile` says the same in numbers. The profiled steps run slower (the profiler records every
operator and kernel): the throughput the run reports leaves their logging windows out (callbacks.MetricsLog).
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from dockyard.common import runfolder
from dockyard.common.kernels import gpu_time, timeline_record

log = logging.getLogger("dockyard.train")
OPERATORS = 25  # rows of the summary's operator table


def trace_name(rank: int | str) -> str:
    return runfolder.PROFILE_TRACE.format(rank)


class StepProfiler(TrainerCallback):
    """Starts torch.profiler as step `first` begins and stops it once step `last` has ended (or training ends
    before), then writes what it recorded (`write`). `record` is the manifest's `profile` on rank 0."""

    def __init__(self, run_dir: Path, steps: tuple[int, int], rank: int, world_size: int):
        self.folder = run_dir / runfolder.PROFILE
        self.first, self.last = steps
        self.rank, self.world_size = rank, world_size
        self.record: dict[str, Any] | None = None
        self._profiler: Any = None
        self._started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step >= self.first and self.rank == 0:
            log.warning("profile_steps %d-%d: this run resumes after step %d, past them: nothing is profiled",
                        self.first, self.last, state.global_step)
        elif 0 < state.max_steps < self.last and self.rank == 0:
            log.warning("profile_steps %d-%d: the run ends at step %d: the profile stops there", self.first,
                        self.last, state.max_steps)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._profiler is None and state.global_step + 1 == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()  # the steps before are not this profile's
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()
            self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._profiler is not None and state.global_step >= self.last:
            self._stop(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self._profiler is not None:
            self._stop(state.global_step)

    def _stop(self, step: int) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the steps' queued kernels belong to them
        self._profiler.stop()
        seconds = time.perf_counter() - self._started
        profiler, self._profiler = self._profiler, None
        try:
            self.record = write(profiler, self.folder, (self.first, step), seconds, self.rank, self.world_size)
        except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not end the training it looked at
            log.warning("profile_steps %d-%d: the profile could not be written (%s: %s); training goes on",
                        self.first, step, type(e).__name__, e)


def write(profiler: Any, folder: Path, steps: tuple[int, int], seconds: float, rank: int,
          world_size: int) -> dict[str, Any] | None:
    """This rank's trace, and on rank 0 the summary; rank 0's record for the manifest (None on the others)."""
    try:
        folder.mkdir(exist_ok=True)
    except FileExistsError:  # a file of that name (mkdir's word for it); runfolder.write refuses it below
        pass
    with tempfile.TemporaryDirectory(prefix="dockyard-profile-") as tmp:  # torch writes a path: never the run folder's
        exported = Path(tmp, "trace.json")
        profiler.export_chrome_trace(str(exported))
        trace = exported.read_bytes()
    runfolder.write(folder, trace_name(rank), gzip.compress(trace, compresslevel=6))
    if rank != 0:
        return None
    parsed = json.loads(trace)
    busy = gpu_time(parsed)
    if busy:  # what the host's monitor draws profile/timeline.png from: it never reads the trace itself
        timeline = json.dumps(timeline_record(parsed), separators=(",", ":"))
        runfolder.write(folder, runfolder.PROFILE_TIMELINE_DATA, timeline.encode())
    device = "self_device_time_total" if busy else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=device, row_limit=OPERATORS, max_name_column_width=70)
    record = {"steps": list(steps), "rank": 0, "seconds": round(seconds, 3), "gpu_busy": None, "gpu_kinds": None,
              "summary": f"{runfolder.PROFILE}/{runfolder.PROFILE_SUMMARY}", "traces": f"{runfolder.PROFILE}/{trace_name('*')}"}
    if busy:  # shares of the profiled span
        record["gpu_busy"] = round(busy["busy_us"] / busy["span_us"], 4)
        record["gpu_kinds"] = {kind: round(us / busy["span_us"], 4) for kind, us in busy["kinds"].items()}
    runfolder.write(folder, runfolder.PROFILE_SUMMARY, summary(record, world_size, table))
    log.info("profile of steps %d-%d: %s; %s", *steps, headline(record), record["summary"])
    return record


def headline(record: dict[str, Any]) -> str:
    if record["gpu_busy"] is None:
        return f"{record['seconds']:.2f} s, no GPU work recorded (CPU)"
    kinds = ", ".join(f"{kind} {share:.0%}" for kind, share in record["gpu_kinds"].items())
    return f"{record['seconds']:.2f} s, GPU busy {record['gpu_busy']:.0%} of it ({kinds})"


def summary(record: dict[str, Any], world_size: int, table: str) -> str:
    first, last = record["steps"]
    lines = [f"Steps {first}-{last} under torch.profiler on rank 0 of {world_size}: {record['seconds']:.2f} s (the "
             "profiler slows the steps it records: the run's tokens/s leaves them out).", ""]
    if record["gpu_busy"] is None:
        lines += ["No GPU kernel was recorded (a CPU run): the operators below ran on the CPU.", ""]
    else:
        lines += [f"GPU busy: {record['gpu_busy']:.1%} of the profiled time (at least one kernel or copy running; "
                  "kernels that overlap on other streams counted once). Idle time is the GPU waiting on the host: "
                  "data loading, Python and kernel launches, synchronisations. A rank waiting for the others in a "
                  "collective is busy in NCCL's kernels (communication below).",
                  "Kernel time by kind, as a share of the profiled time (kinds overlap where streams run side by "
                  "side; told from the kernels' names):"]
        lines += [f"  {kind:<15} {share:6.1%}" for kind, share in record["gpu_kinds"].items()]
        lines.append("")
    lines += ["The operators that took the most time (self time: without the operators they called):", table, "",
              f"Each rank's full trace: {', '.join(trace_name(r) for r in range(min(world_size, 2)))}"
              + (", ..." if world_size > 2 else "") + " in this folder (Chrome trace format: Perfetto, "
              "https://ui.perfetto.dev, or TensorBoard's profiler open it)."]
    return "\n".join(lines) + "\n"

