"""The manifest the trainer writes, key by key and in order: what each step of `python -m dockyard.train` adds to
the record (the run folder, the model, the settings resolved, the inputs, the data, the estimates, the reference
logits), for a run that completes and one that fails half-way (it records how far it got). One process, on CPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

from dockyard import ROOT

FIXED = ["run_id", "recipe", "variant", "status", "image", "world_size", "nodes", "node_rank", "rendezvous",
         "strategy", "metrics"]
RESOLVED = ["global_batch", "torch_compile", "per_device_train_batch_size", "gradient_checkpointing",
            "use_liger_kernel", "gradient_accumulation_steps"]


def _train(run_dir, recipe: str, *overrides: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    subprocess.run([sys.executable, "-m", "dockyard.train", "--recipe", recipe, "--run-dir", str(run_dir), "--",
                    *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return json.loads((run_dir / "manifest.json").read_text())


def test_a_completed_run_records_every_part_in_order(tmp_path):
    m = _train(tmp_path / "ok", "lora", "--max_steps", "1", "--save_strategy", "no")
    assert m["status"] == "completed", m.get("error")
    assert list(m) == FIXED + ["recipe_files", "model", "task", "overrides", "settings_resolved", "inputs", "data",
                               "plan", "disk", "probe"]
    assert list(m["model"]) == ["base", "parameters", "saved", "format", "footprint_bytes"]
    assert list(m["settings_resolved"]) == RESOLVED + ["numa_binding", "dtype", "padding_free", "packing"]
    assert list(m["probe"]) == ["input_ids", "logits", "dtype"] and m["model"]["format"] == "adapter"


def test_a_run_that_fails_at_its_data_records_what_came_before(tmp_path):
    m = _train(tmp_path / "bad", "ddp", "--data", str(tmp_path / "none.jsonl"))
    assert m["status"] == "failed" and m["error"].startswith("no data at")
    assert list(m) == FIXED + ["recipe_files", "model", "task", "overrides", "settings_resolved", "inputs", "error"]
    assert list(m["model"]) == ["base", "parameters", "saved", "format"]
    assert list(m["settings_resolved"]) == RESOLVED + ["numa_binding", "dtype"]


def test_a_large_file_in_a_recipe_folder_is_hashed_without_reading_it_whole(tmp_path):
    """Every process hashes the recipe folder for the manifest: a 1.5 GB file left there cost 1.5 GB of RAM in each.
    A 768 MiB file (sparse: no disk) is hashed in a fresh process whose peak memory stays far below its size."""
    folder = tmp_path / "mine"
    shutil.copytree(ROOT / "recipes" / "ddp", folder)
    with open(folder / "big.bin", "wb") as f:
        f.truncate(768 * 2**20)
    probe = ("import json; from dockyard.common.recipes import load_recipe; "
             "from dockyard.train.manifest import recipe_files; from pathlib import Path; "
             f"h = recipe_files(load_recipe({str(folder)!r}), Path({str(ROOT / 'recipes' / 'defaults.yaml')!r})); "
             # VmHWM: this process's own peak (ru_maxrss keeps the forking parent's, the test worker's, across exec)
             "peak = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
             "print(json.dumps([h, peak]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    hashes, peak_kib = json.loads(out.stdout)
    assert hashes["mine/big.bin"] == hashlib.sha256(b"\0" * 768 * 2**20).hexdigest()
    assert peak_kib < 400 * 1024, f"peak {peak_kib // 1024} MiB while hashing a 768 MiB file"
