"""A run and the disk it writes to: `invoke run` refuses to start where the runs folder lacks the room its
checkpoints and model need, and a save that still runs out of space says so whole, with the ways out.
A small disk is a real tmpfs mounted for the test (these tests run as root, as CI does)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import invoke
from tests.support.training import ROOT, command, env, train


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB filesystem: room for the tiny model's base weights, not for a checkpoint with its optimizer."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_save_that_runs_out_of_space_says_so_whole_with_the_ways_out(small_disk, tmp_path):
    run = small_disk / "run"
    proc = train("ddp", run, "--max_steps", "8", "--save_steps", "4", "--logging_steps", "1", ok=False,
                 logs=tmp_path / "torchrun-logs")  # torchrun's, off the full disk
    assert proc.returncode != 0
    said = next((line for line in proc.stderr.splitlines() if "ran out of space" in line), "")
    assert said.startswith("error: the disk holding"), proc.stderr[-3000:]
    assert "save_total_limit" in said and "runs_dir" in said and "checkpoint(s) of" in said
    # the library's own error, after the first dot too (it used to be cut at "safetensors" / "Error while...")
    error = said.split("The error: ", 1)[1]
    assert error.count(".") >= 1 and len(error) > 40, error
    assert "Traceback" not in proc.stderr.split("error: the disk holding")[0].splitlines()[-1]


def test_run_refuses_to_start_without_room_in_the_runs_folder(small_disk, tmp_path):
    runs = small_disk / "runs"
    proc = invoke("run", "--recipe=zero2", "--variant=cpu", "--run-id=r1", "--dry", "--", "--max_steps", "8",
                  env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
    assert proc.returncode != 0
    assert "not enough disk for this run" in proc.stderr and "Traceback" not in proc.stderr
    for way in ("--save_total_limit 1", "--save_only_model true", "INVOKE_DOCKYARD_RUNS_DIR"):
        assert way in proc.stderr, proc.stderr
    assert not (runs / "r1").exists()

    elsewhere = tmp_path / "big" / "runs"  # the way out: a runs folder on a disk with room
    proc = invoke("run", "--recipe=zero2", "--variant=cpu", "--run-id=r1", "--dry", "--", "--max_steps", "8",
                  env={"INVOKE_DOCKYARD_RUNS_DIR": str(elsewhere)})
    assert proc.returncode == 0, proc.stderr
    assert "disk: the run writes about" in proc.stderr and "dockyard.train" in proc.stdout + proc.stderr


def test_a_hugging_face_cache_that_fills_while_datasets_converts_the_data_says_whose_disk_it_is(small_disk, tmp_path):
    """`datasets` writes an Arrow copy of a jsonl folder into the Hugging Face cache before the run reads it. A cache
    disk that fills was said as "cannot read DATA: [Errno 28] ...", as if the data were at fault."""
    data = tmp_path / "data"
    data.mkdir()
    with (data / "train.jsonl").open("w") as f:  # ~6 MiB: more than the 2 MiB disk the cache is on
        for i in range(20000):
            f.write(json.dumps({"instruction": f"Spell the number {i} out, word by word. " * 3,
                                "output": f"number {i} " * 10}) + "\n")
    run = tmp_path / "run"
    launch = [sys.executable, "-m", "dockyard.train.torchrun", *command("ddp", run, "--max_steps", "2", "--data",
                                                                         str(data))[3:]]  # as the image runs it
    proc = subprocess.run(launch, cwd=ROOT,
                          env={**env(), "HF_HOME": str(small_disk)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    said = next((line for line in proc.stderr.splitlines() if line.startswith("error: ")), "")
    assert said.startswith(f"error: the disk of the Hugging Face cache ({small_disk}/datasets) ran out of space"), \
        proc.stderr[-3000:]
    assert "the data's size" in said and "INVOKE_DOCKYARD_HF_CACHE" in said and "HF_HOME" in said, said
    assert said.endswith("[Errno 28] No space left on device"), said
    assert "cannot read" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
