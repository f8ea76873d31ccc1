"""benchmarks/recipes.py runs as it is on a host without GPUs (the smoke check of what a GPU host runs): the
tiny model, one recipe that trains and one that stops, each reported, the stopped one with its whole error; with
--profile, the profile summary of the run that trained."""

from __future__ import annotations

import subprocess
import sys

from dockyard import ROOT


def test_the_recipes_benchmark_runs_on_cpu_and_reports_each_recipe(tmp_path):
    out = tmp_path / "recipes.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.recipes", "--recipes", "ddp,fsdp", "--steps", "12",
                           "--profile", "8-9", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "CPU only, 2 processes (gloo)" in text and "native (no container)" in text  # where it ran
    ddp = next(line for line in text.splitlines() if line.startswith("| ddp |")).split("|")
    steady, manifest = (float(ddp[i].replace(",", "")) for i in (2, 3))
    assert steady > 0 and abs(steady / manifest - 1) < 0.03  # metrics.jsonl and the manifest agree
    # both without the profiled steps, whose summary is kept (the run folder is not)
    profiles = (tmp_path / "recipes-profiles.txt").read_text()
    assert profiles.startswith("## ddp\n\nSteps 8-9 under torch.profiler") and "aten::mm" in profiles
    assert "## fsdp" not in profiles  # it stopped before training
    # no tuning flags (--batch auto): the table says what the autos became, here the CPU's (8 examples, no
    # checkpointing for full fine-tuning, neither compile nor Liger)
    assert "mb 8, accum 1, GC off, compile off, Liger off" in ddp[-2], ddp
    # fsdp stops on CPU by design: its error is reported whole, past its first sentence
    assert "| fsdp |" in text and "### fsdp: the error" in text
    assert "Stopped instead of training with another strategy." in text.split("### fsdp: the error")[1]
