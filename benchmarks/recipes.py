"""Recipes side by side: steady-state tokens/s, MFU, peak memory against `invoke plan`'s estimate and time to the
first step per recipe, and the bare torchrun + DDP loop (benchmarks/bare_ddp.py) measured the same way.

    python -m benchmarks.recipes [--recipes ddp,zero2] [--batch auto|8] [--seq 2048] [--steps 40]
                                 [--try KEY=VALUE[,KEY=VALUE]]... [--bare] [--repeats 3] [--profile 20-21]
                                 [--out benchmarks/results/recipes.md]

On CPU: the tiny model, 2 processes (gloo): a smoke check that every part runs. On GPUs: a 1.1B Llama-shaped model
(TinyLlama-1.1B's config, random weights), bf16, one process per GPU. On one GPU, a call of two or three recipes at
`--batch 8` finishes in under 10 minutes; run several calls with their own `--out`.

`--batch auto` (the default) passes no micro-batch and no gradient checkpointing: each run takes what a user's run
with no tuning flags gets (recipes/defaults.yaml's autos: micro-batch, accumulation, checkpointing, torch_compile,
Liger, padding-free, packing, each resolved for the GPU at hand), and the table says what they became. `--batch N`
fixes the micro-batch at N with checkpointing off (the autos that are left still resolve). `--try torch_compile=true` runs
each recipe a second time with those settings (any recipe setting or TrainingArguments field, as after `invoke run
-- `), right after its first run, and prints the ratio: how a setting is judged on a GPU before it becomes an auto.

Throughput is the steady state read from each run's metrics.jsonl (a window every 5 steps, the default, as a
user's run has): the logging windows after the first WARMUP_STEPS steps, each its own tokens (every rank's real
tokens) over its own wall time, saves and evaluation left out (dockyard/train/callbacks.py); MFU by
dockyard/train/mfu.py, the trainer's own formula. Runs save no checkpoints, and each run folder is removed once
read (a 1B full fine-tune's final model alone is 4 GB). `--profile A-B` profiles those steps of every run
(profile_steps, dockyard/train/profiler.py: where the GPU's time went, by kind of kernel, and the operators that
took most of it): each run's profile summary is appended to OUT's `-profiles.txt` beside it, and the profiled
windows are left out of tokens/s as the trainer leaves them out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import torch

from benchmarks import report
from dockyard import ROOT
from dockyard.common import memory, runfolder
from dockyard.common.recipes import recipe_names
from dockyard.common.run_settings import DATA, TINY_MODEL, WARMUP_STEPS, profile_range
from dockyard.common.units import GIB
from dockyard.train import mfu

RECIPES = recipe_names()  # every recipe folder, in the registry's order
TEMP_PREFIX = "dockyard-bench-"  # the work folder's: what a killed call left, benchmarks/gpu_check.sh removes
# TinyLlama-1.1B's shape (1,100,048,384 parameters), heads of 64 as in every Llama. Until 2026-11-27 head_dim was
# left at the tiny model's 16: a 944M model whose attention ran at a quarter of its width, unlike any model users
# train (the GPU figures of benchmarks/results/recipes_gpu.md and issue 24's table are that model's).
ONE_B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
         "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipe names (default: all)")
    ap.add_argument("--batch", type=batch_arg, default="auto",
                    help="micro-batch per process, or auto: the defaults a run with no flags gets (the default)")
    ap.add_argument("--seq", type=positive, help="sequence length (default: 128 on CPU, 2048 on GPUs)")
    ap.add_argument("--steps", type=positive, help="steps per run (default: 100 on CPU, 40 on GPUs)")
    ap.add_argument("--try", dest="tries", action="append", type=try_arg, default=[], metavar="KEY=VALUE[,...]",
                    help="also run each recipe with these settings, side by side with its defaults (repeatable)")
    ap.add_argument("--bare", action="store_true", help="also measure the bare DDP loop, and the entry point's "
                                                        "overhead against it (needs ddp among --recipes)")
    ap.add_argument("--repeats", type=int, default=3, help="with --bare: runs of ddp and of the bare loop, alternated")
    ap.add_argument("--profile", type=profile_arg, metavar="A-B",
                    help="profile these steps of every run (profile_steps); the summaries go to OUT's -profiles.txt")
    ap.add_argument("--out", type=Path, default=report.RESULTS / "recipes.md", help="where the table is written")
    opts = ap.parse_args()
    names = [n.strip() for n in opts.recipes.split(",") if n.strip()]
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        sys.exit(f"--recipes: unknown {', '.join(unknown)}; valid: {', '.join(RECIPES)}")
    gpu = torch.cuda.is_available()
    nproc = torch.cuda.device_count() if gpu else 2
    seq = opts.seq or (2048 if gpu else 128)
    batch = opts.batch
    steps = opts.steps or (40 if gpu else 100)
    if steps <= WARMUP_STEPS + 2:
        sys.exit(f"--steps must be over {WARMUP_STEPS + 2}: the first {WARMUP_STEPS} are warm-up")
    profiles = opts.out.with_name(f"{opts.out.stem}-profiles.txt") if opts.profile else None
    if opts.profile and profile_range(opts.profile)[1] > steps:
        sys.exit(f"--profile {opts.profile}: past the runs' last step (--steps {steps}): profile steps within them")
    if profiles:
        profiles.parent.mkdir(parents=True, exist_ok=True)
        profiles.write_text("")

    lines = report.header("Recipes side by side", where(gpu, nproc), setup_line(gpu, seq, batch, steps))
    print("\n".join(lines), flush=True)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
        work = Path(tmp)
        model, data = make_model(work, gpu), make_data(work, seq)
        rows = []
        for name in names:
            for i, tried in enumerate([(), *opts.tries]):
                flags = [w for key, value in tried for w in (f"--{key}", value)]
                flags += ["--profile_steps", opts.profile] if opts.profile else []
                label = f"{name} + {','.join(f'{k}={v}' for k, v in tried)}" if tried else name
                rows.append(run_recipe(name, work, nproc, model, data, steps, batch, seq, f"bench{i}", *flags,
                                       profiles=profiles and (profiles, label)))
                if tried:
                    rows[-1]["label"] = label
                print(table_row(rows[-1], rows), flush=True)  # each result as it lands: a cut-off call keeps it
                # and the table so far, with its errors whole, in case the call is cut off before the end
                opts.out.write_text("\n".join(lines + table(rows) + errors(rows)) + "\n")
        ddp = next((r for r in rows if r["recipe"] == "ddp" and "label" not in r and "micro_batch" in r), None)
        overhead = measure_overhead(opts, work, nproc, model, data, steps,
                                    batch if batch != "auto" else ddp["micro_batch"], seq, gpu) \
            if opts.bare and ddp else []
    lines += table(rows) + compared(rows) + errors(rows) + overhead
    if opts.bare and not ddp:
        lines += ["", "The bare loop was not measured: it is compared with the ddp recipe, which was not asked for "
                      "or failed."]
    text = "\n".join(lines) + "\n"
    opts.out.write_text(text)
    print(text)


# --- where and what -----------------------------------------------------------------------------------

def where(gpu: bool, nproc: int) -> str:
    """The host the figures come from: they hold for it alone."""
    import transformers

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import deepspeed

        versions += f", deepspeed {deepspeed.__version__}"
    except Exception:  # noqa: BLE001 - not installed, or its import fails here: say so
        versions += ", no deepspeed"
    if gpu:
        return (f"{nproc} x {torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), {platform.node()}, "
                f"native (no container), {versions}")
    return f"CPU only, {nproc} processes (gloo), {platform.node()}, native (no container), {versions}"


def positive(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, 1 or more")
    return n


def batch_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of examples, 1 or more, or auto") from None


def profile_arg(text: str) -> str:
    try:
        steps = profile_range(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if steps is None:
        raise argparse.ArgumentTypeError("give the steps to profile, e.g. 20-21")
    return f"{steps[0]}-{steps[1]}"


def try_arg(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not re.fullmatch(r"[a-z_][a-z0-9_]*", key) or not value.strip():
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: KEY=VALUE, e.g. torch_compile=true")
        pairs.append((key, value.strip()))
    return tuple(pairs)


def setup_line(gpu: bool, seq: int, batch: int | str, steps: int) -> str:
    model = ("TinyLlama-1.1B-shaped (1.10 B parameters, heads of 64; config, random weights), bf16 mixed precision "
             "(fp16 before Ampere)" if gpu
             else "tiny Llama-shaped (164 k parameters), fp32")
    how = ("micro-batch, checkpointing and the other autos as a run with no tuning flags resolves them (the settings "
           "column)" if batch == "auto" else f"micro-batch {batch} per process, gradient checkpointing off")
    return (f"Model: {model}; sequence length {seq}, {how}, {steps} steps, "
            f"no checkpoints saved. tokens/s: steady state, the logging windows (every 5 steps) "
            f"after step {WARMUP_STEPS}, from metrics.jsonl (real tokens of every rank); manifest: the run's own "
            "figure. Peak memory: GPU memory reserved by torch (resident set size on CPU) of the largest rank; "
            "plan: `invoke plan`'s estimate of that same figure for the run, from its manifest (torch's pool, "
            "without the CUDA context and NCCL the plan adds for what fits). First step: from process start to the end of step 1")


def make_model(work: Path, gpu: bool) -> Path:
    """The benchmark model, saved once: the tiny one on CPU, a 1.1B Llama-shaped one (random weights) on GPU."""
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
    docs = [" ".join(rng.sample(lines, min(per_doc, len(lines)))) for _ in range(400)]
    path = work / "data.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


# --- runs ---------------------------------------------------------------------------------------------

def env(caches: Path) -> dict[str, str]:
    """The runs' environment. Each run compiles into caches of its own: a cache warm from an earlier run (or an
    earlier call on the same machine) would hide the compile time its first step reports (benchmarks/compile.py
    does the same)."""
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
         "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "TRITON_CACHE_DIR": str(caches / "triton")}
    if not torch.cuda.is_available():
        e.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    return e


# One run's bound: a run that hangs (a collective, a compile) becomes an error row, and the runs after it still get
# measured within a GPU host's 10-minute call. A run of the benchmark model takes 1-3 minutes.
RUN_LIMIT_S = 360
STOP_GRACE_S = 60  # torchrun, sent SIGTERM, stops its workers (each in a session of its own) and exits


def torchrun(nproc: int, caches: Path, *argv: str, limit: float = RUN_LIMIT_S) -> subprocess.CompletedProcess:
    # the launcher every run of the images starts (it shares the node's cores between the processes, as users get)
    cmd = [sys.executable, "-m", "dockyard.train.torchrun", "--standalone", "--nproc-per-node", str(nproc), *argv]
    try:
        with subprocess.Popen(cmd, cwd=ROOT, env=env(caches), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="replace") as p:
            try:
                out, err = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                workers = psutil.Process(p.pid).children(recursive=True)  # each in a session of its own
                p.terminate()
                try:
                    out, err = p.communicate(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                for worker in workers:  # a torchrun that hung on SIGTERM left them holding the GPU
                    with contextlib.suppress(psutil.Error):
                        worker.kill()
                err += f"\nstopped after {limit:g} s (the benchmark's bound for one run): it had not finished"
            return subprocess.CompletedProcess(cmd, p.returncode, out, err)
    finally:
        shutil.rmtree(caches, ignore_errors=True)


def steady_state(metrics_file: Path) -> dict:
    """tokens/s (and MFU where logged) of the logging windows after warm-up, from metrics.jsonl alone; windows the
    profiler slowed (profile_steps) left out, as the trainer leaves them out."""
    rows = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()] if metrics_file.is_file() else []
    windows, steps, before = [], 0, 0
    for r in (r for r in rows if "tokens" in r):
        if r["step"] > WARMUP_STEPS and not r.get("profiled"):
            windows.append(r)
            steps += r["step"] - max(before, WARMUP_STEPS)
        before = r["step"]
    if not windows:
        return {}
    tokens, seconds = sum(w["tokens"] for w in windows), sum(w["seconds"] for w in windows)
    mfus = [w["mfu"] * w["seconds"] for w in windows if w.get("mfu") is not None]
    return {"tokens_per_second": tokens / seconds, "step_seconds": seconds / steps,
            "mfu": sum(mfus) / seconds if len(mfus) == len(windows) else None}


# The autos the table shows, short: settings_resolved key -> column word
SHOWN = {"per_device_train_batch_size": "mb", "gradient_accumulation_steps": "accum",
         "gradient_checkpointing": "GC", "torch_compile": "compile", "use_liger_kernel": "Liger",
         "padding_free": "padding-free", "packing": "packing", "numa_binding": "NUMA-bound"}


def resolved(manifest: dict) -> str:
    """What the run's autos became (settings_resolved), e.g. "mb 8, accum 1, GC off, compile off"."""
    got = manifest.get("settings_resolved") or {}
    words = []
    for key, word in SHOWN.items():
        v = (got.get(key) or {}).get("value")
        if v is not None:
            words.append(f"{word} {'on' if v is True else 'off' if v is False else v}")
    return ", ".join(words)


def run_recipe(name: str, work: Path, nproc: int, model: Path, data: Path, steps: int, batch: int | str, seq: int,
               tag: str, *extra: str, profiles: tuple[Path, str] | None = None) -> dict:
    """One run of the trainer; its figures, then its folder removed. batch "auto": no tuning flags. `profiles`:
    (the file, the run's label) its profile summary is appended to, when it made one."""
    run = work / f"{name}-{tag}"
    fixed = [] if batch == "auto" else ["--per_device_train_batch_size", str(batch), "--gradient_checkpointing",
                                        "false"]
    try:
        proc = torchrun(nproc, work / f"{name}-{tag}-caches", "-m", "dockyard.train", "--recipe", name,
                        "--run-dir", str(run), "--",
                        "--model", str(model), "--data", str(data), "--max_steps", str(steps),
                        "--max_seq_length", str(seq), "--logging_steps", "5", "--save_strategy", "no", *fixed,
                        *extra)
        m = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").exists() else {}
        summary = run / runfolder.PROFILE / runfolder.PROFILE_SUMMARY
        if profiles and summary.is_file():
            with open(profiles[0], "a") as f:
                f.write(f"## {profiles[1]}\n\n{summary.read_text()}\n")
        if proc.returncode != 0 or m.get("status") != "completed":
            tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
            return {"recipe": name, "error": m.get("error") or tail or f"exit {proc.returncode}"}
        met = m["metrics"]
        return {"recipe": name, **steady_state(run / "metrics.jsonl"), "manifest_tps": met["tokens_per_second"],
                "manifest_mfu": met.get("mfu"), "peak": met["peak_memory_bytes"],
                "plan": (m.get("plan") or {}).get("gpu_reserved_bytes"), "first_step": met["seconds_to_first_step"],
                "saving": met.get("seconds_saving"), "resolved": resolved(m),
                "micro_batch": ((m.get("settings_resolved") or {}).get("per_device_train_batch_size") or {})
                .get("value", batch)}
    finally:
        shutil.rmtree(run, ignore_errors=True)


def run_bare(work: Path, nproc: int, model: Path, data: Path, steps: int, batch: int, seq: int, i: int) -> dict:
    out = work / f"bare{i}.json"
    proc = None
    for _ in range(2):  # gloo sometimes aborts while tearing down; the measurement is done by then
        proc = torchrun(nproc, work / f"bare{i}-caches", str(ROOT / "benchmarks" / "bare_ddp.py"), str(model),
                        str(data), str(steps), str(batch), str(seq), str(out))
        if out.exists():
            return json.loads(out.read_text())
    return {"error": "\n".join(proc.stderr.strip().splitlines()[-30:]) or f"exit {proc.returncode}"}


def bare_mfu(row: dict, model: Path, nproc: int) -> float | None:
    """The bare loop's MFU by the trainer's formula (dockyard/train/mfu.py), the model sized from its config."""
    if not torch.cuda.is_available() or "tokens_per_second" not in row:
        return None
    shape = memory.shape_from_folder(model)
    flops = mfu.flops_per_token(parameters=shape.params, vocab=shape.vocab, hidden=shape.hidden, layers=shape.layers,
                                attention_width=shape.q_width, tied=shape.tied, adapters=False,
                                seq_len=mfu.attention_length(row.get("lengths") or []))
    half = "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16"
    return mfu.mfu(row["tokens_per_second"], flops, mfu.peak_flops(torch.cuda.get_device_name(), half), nproc)


def measure_overhead(opts, work: Path, nproc: int, model: Path, data: Path, steps: int, batch: int, seq: int,
                     gpu: bool) -> list[str]:
    """ddp recipe vs the bare loop, alternated so a noisy neighbour hits both the same; medians. The recipe runs
    as the bare loop does (`batch`, which is the ddp row's micro-batch under --batch auto; no checkpointing, no
    compilation, no Liger): what is compared is the entry point, not the autos."""
    ours, bare = [], []
    # the bare loop joins no documents: it pads each row to its longest (bare_ddp.py), as packing off does
    same = ("--torch_compile", "false", "--use_liger_kernel", "false", "--packing", "false")
    for i in range(max(1, opts.repeats)):
        ours.append(run_recipe("ddp", work, nproc, model, data, steps, batch, seq, f"o{i}", *same))
        bare.append(run_bare(work, nproc, model, data, steps, batch, seq, i))
        print(f"overhead run {i + 1}: ddp {ours[-1].get('tokens_per_second', 0):,.0f} tokens/s, "
              f"bare {bare[-1].get('tokens_per_second', 0):,.0f} tokens/s", flush=True)
    failed = [r["error"] for r in ours + bare if "error" in r]
    if failed:
        return ["", "## Entry point overhead", "", "Not measured: a run failed:", "", "```", failed[0], "```"]
    ours_tps = sorted(r["tokens_per_second"] for r in ours)[len(ours) // 2]
    bare_tps = sorted(r["tokens_per_second"] for r in bare)[len(bare) // 2]
    each = {k: ", ".join(f"{r['tokens_per_second']:,.0f}" for r in v) for k, v in (("ours", ours), ("bare", bare))}
    bare_m = bare_mfu(sorted(bare, key=lambda r: r["tokens_per_second"])[len(bare) // 2], model, nproc) if gpu else None
    return ["", f"## Entry point overhead (ddp recipe vs bare torchrun + DDP loop, steady state, median of "
                f"{len(ours)}, alternated)", "",
            "| | tokens/s (each run) | median | MFU |", "|---|---|---|---|",
            f"| `python -m dockyard.train --recipe ddp` | {each['ours']} | {ours_tps:,.0f} | "
            f"{_pct(sorted(ours, key=lambda r: r['tokens_per_second'])[len(ours) // 2].get('mfu'))} |",
            f"| benchmarks/bare_ddp.py | {each['bare']} | {bare_tps:,.0f} | {_pct(bare_m)} |",
            "", f"Overhead on throughput: **{1 - ours_tps / bare_tps:+.1%}** (target: under 3 %)."]


# --- the report ------------------------------------------------------------------------------------------

HEAD = ["| recipe | tokens/s | manifest tokens/s | vs ddp | step (s) | MFU | peak memory (GiB) | plan (GiB) "
        "| plan / peak | first step (s) | settings (the autos resolved) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def table_row(r: dict, rows: list[dict]) -> str:
    label = r.get("label", r["recipe"])
    if "error" in r:
        first = r["error"].strip().splitlines()[-1] if r["error"].strip() else "failed"
        first = first if len(first) <= 100 else first[:100] + "…"
        note = f"failed: {first.replace('|', '/')} (the whole error below)"
        return f"| {label} | - | - | - | - | - | - | - | - | - | {note} |"
    if "tokens_per_second" not in r:
        return f"| {label} | - | {r['manifest_tps']:,.0f} | - | - | - | - | - | - | - | no steady-state window |"
    ddp = next((x["tokens_per_second"] for x in rows if x["recipe"] == "ddp" and "label" not in x
                and "tokens_per_second" in x), None)
    gpu = torch.cuda.is_available()
    plan = f"{r['plan'] / GIB:.2f}" if gpu and r.get("plan") else "-"
    ratio = f"{r['plan'] / r['peak']:.2f}" if gpu and r.get("plan") and r.get("peak") else "-"
    return (f"| {label} | {r['tokens_per_second']:,.0f} | {r['manifest_tps']:,.0f} | "
            f"{r['tokens_per_second'] / ddp:.2f} | " if ddp else
            f"| {label} | {r['tokens_per_second']:,.0f} | {r['manifest_tps']:,.0f} | - | ") + \
        (f"{r['step_seconds']:.3f} | {_pct(r.get('mfu'))} | {r['peak'] / GIB:.2f} | {plan} | {ratio} | "
         f"{r['first_step']:.1f} | {r.get('resolved', '')} |")


def table(rows: list[dict]) -> list[str]:
    return [*HEAD, *(table_row(r, rows) for r in rows)]


def compared(rows: list[dict]) -> list[str]:
    """Each --try row against its recipe's run with the defaults just before it."""
    out, base = [], {}
    for r in rows:
        if "label" not in r:
            base[r["recipe"]] = r.get("tokens_per_second")
        elif r.get("tokens_per_second") and base.get(r["recipe"]):
            out.append(f"- {r['label']}: **{r['tokens_per_second'] / base[r['recipe']]:.2f}x** the tokens/s of "
                       f"{r['recipe']} with its defaults")
        else:
            out.append(f"- {r['label']}: not compared (a run failed or had no steady-state window)")
    return ["", "With --try, each against the same recipe with its defaults, run just before it:", "", *out] if out else []


def errors(rows: list[dict]) -> list[str]:
    """Each failure's error as the run gave it, whole."""
    out = []
    for r in rows:
        if "error" in r:
            out += ["", f"### {r.get('label', r['recipe'])}: the error", "", "```", r["error"].strip(), "```"]
    return out


if __name__ == "__main__":
    main()
