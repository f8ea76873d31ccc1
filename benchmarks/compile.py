"""torch.compile side by side: the whole model against block by block (accelerate's regional compilation, what the
trainer does under DeepSpeed and FSDP), and eager, on the same model and batch: time to the end of the first
training step (compiling) and the steady step time after it.

    python -m benchmarks.compile [--layers 22] [--batch 4] [--seq 64] [--steps 8]

Each mode runs in a fresh process with an empty inductor cache (a warm cache would hide the compile time), and the
compiled modes once more in another fresh process with the cache the first left (`warm`): what a second run gets from
the compile cache `invoke run` mounts (dockyard/launch/caches.py). On CPU:
the tiny model's width with the benchmark model's depth (22 layers; compiling costs per graph, not per FLOP), fp32.
On a GPU: benchmarks/recipes.py's ~1B model (random weights), bf16 autocast. Writes benchmarks/results/compile.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks import report
from benchmarks.recipes import ONE_B, positive
from dockyard import ROOT
from dockyard.common.run_settings import TINY_MODEL

MODES = ("eager", "whole", "blocks")


def one(mode: str, layers: int, batch: int, seq: int, steps: int) -> dict:
    """In this process: build the model, compile it as `mode` says, train `steps` steps, time them."""
    from accelerate.utils import compile_regions
    from transformers import AutoConfig, AutoModelForCausalLM

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(TINY_MODEL, **(ONE_B if gpu else {}), num_hidden_layers=layers)
    model = AutoModelForCausalLM.from_config(config).to(device)
    model = {"eager": lambda m: m, "whole": torch.compile, "blocks": compile_regions}[mode](model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    steady = times[2:]
    return {"first": times[0], "step": sum(steady) / len(steady), "loss": loss.item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=positive, default=22)
    ap.add_argument("--batch", type=positive, default=4)
    ap.add_argument("--seq", type=positive, default=None, help="default: 64 on CPU, 2048 on a GPU")
    ap.add_argument("--steps", type=positive, default=8)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # the child process
    opts = ap.parse_args()
    gpu = torch.cuda.is_available()
    seq = opts.seq or (2048 if gpu else 64)
    if opts.steps < 4:
        sys.exit("--steps must be 4 or more: the first two steps are left out of the steady step time")
    if opts.one:
        print(json.dumps(one(opts.one, opts.layers, opts.batch, seq, opts.steps)))
        return
    where = (f"1 x {torch.cuda.get_device_name()}, ~1B Llama-shaped model cut to {opts.layers} layers, bf16 autocast"
             if gpu else f"CPU, tiny Llama-shaped model's width with {opts.layers} layers, fp32")
    lines = report.header("torch.compile: whole model vs block by block", where,
                          f"torch {torch.__version__}; micro-batch {opts.batch} x {seq} tokens, {opts.steps} steps, "
                          "one process per mode, empty inductor cache each (warm: the cache the mode's run before "
                          "left); step: mean of the steps after the second")
    rows = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
                   "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            for name in (mode,) if mode == "eager" else (mode, f"{mode}, warm"):
                proc = subprocess.run([sys.executable, "-m", "benchmarks.compile", "--one", mode, "--layers",
                                       str(opts.layers), "--batch", str(opts.batch), "--seq", str(seq), "--steps",
                                       str(opts.steps)], cwd=ROOT, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
                rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"{name}: {rows[name]}", flush=True)
    eager = rows["eager"]
    lines += ["| mode | first step (s) | compiling, beyond eager's first step (s) | step (s) | step vs eager | loss |",
              "|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['first']:.1f} | {r['first'] - eager['first']:.1f} | {r['step']:.4f} | "
                     f"{r['step'] / eager['step']:.2f} | {r['loss']:.4f} |")
    def compiling(name: str) -> float:
        return rows[name]["first"] - eager["first"]

    w, b = rows["whole"], rows["blocks"]
    lines += ["", f"Block by block compiles in **{compiling('blocks') / compiling('whole'):.2f}x** "
                  f"the time of the whole model; its steady step is **{b['step'] / w['step']:.2f}x** the whole model's.",
              "", f"With the cache warm, compiling takes **{compiling('whole, warm') / compiling('whole'):.2f}x** its "
                  f"cold time for the whole model and **{compiling('blocks, warm') / compiling('blocks'):.2f}x** block "
                  "by block."]
    report.write("compile", lines)


if __name__ == "__main__":
    main()
