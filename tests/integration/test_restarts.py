"""torchrun --max-restarts (`invoke run --max-restarts`, `invoke k8s --max-restarts`): a rank lost mid-run restarts
the workers, which continue the run from its last complete checkpoint. Before, every restarted worker refused the
folder its first attempt wrote ("already holds a run"), so a restart could never succeed. Then the restarted workers
could read the addresses their dead predecessors had left in torchrun's shared store, and fail to connect or wait for
ever (dockyard.train.torchrun now gives each attempt a store of its own). Real runs: 2 processes under the torchrun
every launcher starts (dockyard.train.torchrun), on CPU (gloo), the tiny model; rank 1 is killed the moment the
first checkpoint is complete, as soon after the store was last written as a real failure can be."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from dockyard import ROOT
from dockyard.common import runfolder
from dockyard.train import manifest as train_manifest
from tests.support.processes import kill_tree
from tests.support.training import command, env, manifest

STEPS = 60


def test_a_rank_killed_mid_run_is_restarted_by_torchrun_and_the_run_continues_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    argv = command("ddp", run, "--max_steps", str(STEPS), "--save_steps", "20", "--logging_steps", "5",
                   "--per_device_train_batch_size", "2", "--max_seq_length", "32")
    argv[:argv.index("--nproc-per-node")] = [sys.executable, "-m", "dockyard.train.torchrun", "--max-restarts=1"]
    p = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(train_manifest.complete_checkpoint(c) for c in runfolder.checkpoints_started(run)):
            assert p.poll() is None and time.monotonic() < deadline, "no checkpoint was completed"
            time.sleep(0.1)
        (rank1,) = [w for w in psutil.Process(p.pid).children() if w.environ().get("RANK") == "1"]
        rank1.kill()
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:  # the workers too: left behind, they would slow every test after this one
            kill_tree(p.pid)
    assert p.returncode == 0, out[-4000:]
    assert "torchrun restarted the workers (restart 1): the run continues from checkpoint-" in out
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == STEPS
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == sorted(set(logged)) and logged[-1] == STEPS, "every step logged once, up to the last"
