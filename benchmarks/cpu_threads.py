"""DeepSpeed's CPU Adam (the optimizer step of zero2-offload and zero3-offload) with torchrun's one thread per process
against the share of the node's cores the launcher now gives each process (dockyard/train/torchrun.py), side by
side on the same parameters.

    python -m benchmarks.cpu_threads [--params 100] [--nproc 1] [--steps 5] [--rounds 3]

Each setting runs in a fresh process (OpenMP reads OMP_NUM_THREADS once, as it starts), alternating, `--rounds`
times: the median step of each. `--nproc`: the processes sharing this node (its GPUs): the share is this machine's
usable cores divided by them, as a node of that many GPUs gives each. `--params`: millions of fp32 parameters in
one process's shard (each takes 16 bytes: weights, gradients and Adam's two moments). Writes
benchmarks/results/cpu_threads.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks import report
from benchmarks.recipes import positive
from dockyard import ROOT
from dockyard.train.torchrun import usable_cores

ONE = """
import json, sys, time
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

n, steps = int(sys.argv[1]), int(sys.argv[2])
p = torch.nn.Parameter(torch.zeros(n))
p.grad = torch.randn(n)
opt = DeepSpeedCPUAdam([p], lr=1e-4)
opt.step()  # loads the op and allocates the moments
times = []
for _ in range(steps):
    t = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t)
print(json.dumps({"threads": torch.get_num_threads(), "times": times}))
"""


def step_times(threads: int, params: int, steps: int) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", ONE, str(params), str(steps)], env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"error: CPU Adam with {threads} thread(s) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["times"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=positive, default=100, help="millions of parameters per process (default 100)")
    ap.add_argument("--nproc", type=positive, default=1, help="processes sharing the node (default 1)")
    ap.add_argument("--steps", type=positive, default=5, help="timed steps per process (default 5)")
    ap.add_argument("--rounds", type=positive, default=3, help="fresh processes per setting (default 3)")
    opts = ap.parse_args(argv)
    cores = usable_cores()
    share = max(1, cores // opts.nproc)
    settings = {"torchrun's default (1 thread)": 1, f"the launcher's share ({share} threads)": share}
    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(opts.rounds):
        for name, threads in settings.items():
            times[name] += step_times(threads, opts.params * 10**6, opts.steps)
    base = statistics.median(next(iter(times.values())))  # torchrun's default
    lines = report.header("CPU Adam: one thread per process against the launcher's share of the cores",
                          f"{cores} usable physical cores, shared by {opts.nproc} process(es)",
                          f"DeepSpeedCPUAdam.step on {opts.params}M fp32 parameters, median of {opts.steps} steps × "
                          f"{opts.rounds} fresh processes per setting, alternating")
    lines += ["| threads per process | step (s) | speed vs torchrun's default |", "|---|---|---|"]
    for name in settings:
        m = statistics.median(times[name])
        lines.append(f"| {name} | {m:.3f} | {base / m:.2f}x |")
    report.write("cpu_threads", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
