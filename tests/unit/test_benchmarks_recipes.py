"""benchmarks/recipes.py's own choices, without running a trainer: what --try and --batch accept, and how a --try
row is compared (each against its own recipe's run with the defaults, not against ddp), and how long one run may
hang before it becomes an error row (a real torchrun, with a worker that never ends)."""

from __future__ import annotations

import argparse
import os
import time

import pytest

from benchmarks.recipes import batch_arg, compared, table_row, torchrun, try_arg


def test_try_reads_settings_and_refuses_what_is_not_one():
    assert try_arg("torch_compile=true") == (("torch_compile", "true"),)
    assert try_arg("use_liger_kernel=true, per_device_train_batch_size=16") == (
        ("use_liger_kernel", "true"), ("per_device_train_batch_size", "16"))
    for bad in ("torch_compile", "=true", "torch_compile=", "--max_steps=3", "a b=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            try_arg(bad)
    assert batch_arg("auto") == "auto" and batch_arg("16") == 16
    for bad in ("0", "-2", "eight", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            batch_arg(bad)


def row(recipe: str, tps: float, label: str | None = None) -> dict:
    r = {"recipe": recipe, "tokens_per_second": tps, "manifest_tps": tps, "step_seconds": 1.0, "peak": 1 << 30,
         "first_step": 1.0, "resolved": "mb 8"}
    return {**r, "label": label} if label else r


def test_a_tried_setting_is_compared_with_its_own_recipe_and_the_ddp_column_with_plain_ddp():
    rows = [row("ddp", 100.0), row("ddp", 130.0, "ddp + torch_compile=true"), row("lora", 80.0),
            row("lora", 60.0, "lora + use_liger_kernel=true"), {"recipe": "zero2", "label": "zero2 + x=1",
                                                                "error": "boom"}]
    lines = compared(rows)
    assert any("ddp + torch_compile=true: **1.30x**" in x for x in lines)
    assert any("lora + use_liger_kernel=true: **0.75x** the tokens/s of lora" in x for x in lines)
    assert any("zero2 + x=1: not compared" in x for x in lines)
    # "vs ddp" reads plain ddp's run, not the compiled one listed after it
    assert "| lora | 80 | 80 | 0.80 |" in table_row(rows[2], rows)
    assert table_row(rows[1], rows).startswith("| ddp + torch_compile=true | 130 |")
    assert compared(rows[:1]) == []  # no --try, no section


def test_a_run_that_hangs_is_stopped_at_its_bound_with_its_workers(tmp_path):
    """A hung run (a collective that never returns) must not take the GPU host's whole call: torchrun is stopped at
    the bound, and so are its workers (each in a session of its own), which would otherwise keep the GPU."""
    pid_file = tmp_path / "worker.pid"
    script = tmp_path / "hang.py"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    began = time.monotonic()
    proc = torchrun(1, tmp_path / "caches", str(script), limit=30)  # torchrun imports torch before it starts one
    took = time.monotonic() - began
    assert proc.returncode != 0 and "stopped after 30 s (the benchmark's bound for one run)" in proc.stderr
    assert took < 30 + 30, took
    assert pid_file.exists(), "the worker never started: " + proc.stderr[-2000:]
    worker = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # gone, not left holding the GPU
        os.kill(worker, 0)
    assert not (tmp_path / "caches").exists()
