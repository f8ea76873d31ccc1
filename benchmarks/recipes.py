"""Recipes side by side: tokens/s, peak memory and time to the first step for every recipe, and the overhead
of the project's entry point against a bare torchrun + DDP loop (benchmarks/bare_ddp.py) on the same model
and data, all measured in one run.

    python -m benchmarks.recipes [--steps 200] [--repeats 3]

On CPU: the tiny model, 2 processes (gloo). On GPUs: a ~1B Llama-shaped model made from a config, bf16,
sequence length 2048, one process per GPU, with MFU (tokens/s x 6P / peak bf16 FLOP/s).
Writes benchmarks/results/recipes.md. Target: entry point overhead under 3 % of throughput.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import mfu, report
from dockyard import ROOT
from dockyard.common.recipes import recipe_names
from dockyard.train import precision
from dockyard.train.recipe import DATA, TINY_MODEL

RECIPES = recipe_names()  # every recipe folder, in the registry's order
ONE_B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
         "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096}


def env() -> dict[str, str]:
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    if not torch.cuda.is_available():
        e.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    return e


def torchrun(nproc: int, *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *argv]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True)


def make_model(work: Path, gpu: bool) -> Path:
    """The benchmark model, saved once: the tiny one on CPU, a ~1B Llama-shaped one (random weights) on GPU."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = work / "model"
    config = AutoConfig.from_pretrained(TINY_MODEL, **(ONE_B if gpu else {}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(folder)
    return folder


def make_data(work: Path, seq: int) -> Path:
    """Documents of about `seq` tokens, built from the shipped sample (short lines joined)."""
    lines = [json.loads(x)["text"] for x in (DATA / "sample.jsonl").read_text().splitlines()]
    per_doc = max(1, seq // 45)  # a sample line is about 45 tokens
    rng = random.Random(0)
    docs = [" ".join(rng.sample(lines, per_doc)) for _ in range(400)]
    path = work / "data.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def run_recipe(name: str, work: Path, nproc: int, model: Path, data: Path, steps: int, batch: int, seq: int,
               tag: str) -> dict:
    run = work / f"{name}-{tag}"
    proc = torchrun(nproc, "-m", "dockyard.train", "--recipe", name, "--run-dir", str(run), "--",
                    "--model", str(model), "--data", str(data), "--max_steps", str(steps),
                    "--per_device_train_batch_size", str(batch), "--max_seq_length", str(seq),
                    "--save_steps", str(steps * 10), "--gradient_checkpointing", "false")
    m = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").exists() else {}
    if proc.returncode != 0:
        reason = m.get("error", proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
        return {"recipe": name, "error": reason.split(".")[0]}
    return {"recipe": name, **m["metrics"], "parameters": m["model"]["parameters"], "seq_len": seq,
            "peft": m["strategy"]["peft"],
            "plan_gpu_bytes": m.get("plan", {}).get("gpu_bytes")}


def mfu_cell(row: dict, nproc: int, cfg: dict) -> str:
    """MFU of a recipe's row on this host's GPUs (benchmarks/mfu.py), blank on CPU or for a part not in the table."""
    half = precision.half_dtype(precision.capability())
    peak = mfu.peak_flops(torch.cuda.get_device_name(), half) if half else None
    if "tokens_per_second" not in row or not peak:
        return ""
    per_token = mfu.flops_per_token(parameters=row["parameters"], vocab=cfg["vocab_size"], hidden=cfg["hidden_size"],
                                    layers=cfg["num_hidden_layers"], seq_len=row["seq_len"],
                                    tied=bool(cfg.get("tie_word_embeddings")), adapters=bool(row["peft"]))
    return f"{mfu.mfu(row['tokens_per_second'], per_token, peak, nproc):.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="runs of DDP and of the bare loop, alternated")
    opts = ap.parse_args()
    gpu = torch.cuda.is_available()
    nproc = torch.cuda.device_count() if gpu else 2
    seq, batch = (2048, 1) if gpu else (128, 8)
    where = f"{nproc} x {torch.cuda.get_device_name()}" if gpu else f"CPU, {nproc} processes (gloo), {os.cpu_count()} cores"

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = make_model(work, gpu), make_data(work, seq)
        cfg = json.loads((model / "config.json").read_text())
        rows = [run_recipe(r, work, nproc, model, data, opts.steps, batch, seq, "bench") for r in RECIPES]
        ours, bare = [], []
        ddp_fits = all("error" not in r for r in rows if r["recipe"] == "ddp")
        # Alternated, so that a noisy neighbour hits both the same; DDP holds the whole model, which may not fit (a T4).
        for i in range(opts.repeats if ddp_fits else 0):
            ours.append(run_recipe("ddp", work, nproc, model, data, opts.steps, batch, seq, f"o{i}"))
            out = work / f"bare{i}.json"
            for _ in range(2):  # gloo sometimes aborts while tearing down; the measurement is done by then
                proc = torchrun(nproc, str(ROOT / "benchmarks" / "bare_ddp.py"), str(model), str(data),
                                str(opts.steps), str(batch), str(seq), str(out))
                if out.exists():
                    break
            else:
                sys.exit(f"bare DDP loop failed:\n{proc.stderr[-3000:]}")
            bare.append(json.loads(out.read_text()))

    gib = 2**30
    lines = [f"# Recipes side by side ({dt.date.today()}, {where})", "",
             "Model: " + ("~1B Llama-shaped (config, random weights), bf16 (fp16 before Ampere) mixed precision" if gpu
                          else "tiny Llama-shaped (164 k parameters), fp32") + "; "
             f"sequence length {seq}, micro-batch {batch} per process, {opts.steps} steps, gradient checkpointing off. "
             f"Peak memory: {'GPU memory reserved by torch' if gpu else 'resident set size'} of the largest rank. "
             "Time to first step: from process start (imports, model load, DeepSpeed set-up) to the end of step 1.", "",
             "| recipe | tokens/s | vs ddp | peak memory (GiB) | time to first step (s) | MFU | note |",
             "|---|---|---|---|---|---|---|"]
    ddp_tps = next((r["tokens_per_second"] for r in rows if r["recipe"] == "ddp" and "error" not in r), None)
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['recipe']} | - | - | - | - | - | stopped: {r['error']} |")
            continue
        ratio = f"{r['tokens_per_second'] / ddp_tps:.2f}" if ddp_tps else ""
        lines.append(f"| {r['recipe']} | {r['tokens_per_second']:,.0f} | {ratio} | {r['peak_memory_bytes'] / gib:.2f} "
                     f"| {r['seconds_to_first_step']:.1f} | {mfu_cell(r, nproc, cfg)} | |")
    ours = [r for r in ours if "error" not in r]
    if not ours or not bare:
        lines += ["", "## Entry point overhead", "", "Not measured: the ddp recipe did not run here "
                  "(see its row); the comparison needs the whole model on each GPU."]
        report.write("recipes", lines)
        return
    ours_tps = sorted(r["tokens_per_second"] for r in ours)[len(ours) // 2]
    bare_tps = sorted(r["tokens_per_second"] for r in bare)[len(bare) // 2]
    overhead = 1 - ours_tps / bare_tps
    each = {k: ", ".join(f"{r['tokens_per_second']:,.0f}" for r in v) for k, v in (("ours", ours), ("bare", bare))}
    lines += ["", f"## Entry point overhead (ddp recipe vs bare torchrun + DDP loop, median of {opts.repeats}, alternated)",
              "", "| | tokens/s (each run) | median |", "|---|---|---|",
              f"| `python -m dockyard.train --recipe ddp` | {each['ours']} | {ours_tps:,.0f} |",
              f"| benchmarks/bare_ddp.py | {each['bare']} | {bare_tps:,.0f} |",
              "", f"Overhead on throughput: **{overhead:+.1%}** (target: under 3 %)."]
    report.write("recipes", lines)


if __name__ == "__main__":
    main()
