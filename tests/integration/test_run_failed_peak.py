"""A failed run's manifest reports the largest peak memory any rank reached, and which rank: a user whose rank 1 ran
out of memory read rank 0's smaller figure before (a completed run measured it over the ranks, a failed one did not).
A real run: torchrun, two CPU processes of the trainer (on CPU the peak is the largest process's resident set); rank 1
takes far more memory than rank 0 at its second step, then fails as a GPU out of memory does."""

from __future__ import annotations

import json
import subprocess

from tests.support.training import FAST, ROOT, command, env, manifest

EXTRA = 768 << 20  # what rank 1 takes beyond rank 0 before it fails

# the trainer as torchrun starts it, with rank 1 taking EXTRA bytes (resident: written, not merely reserved) at the end
# of step 2 and then failing; each rank leaves its own peak at that moment beside the run, for the test to compare
FAILING_RANK = f"""
import os, resource, runpy, sys
import torch
from dockyard.train import callbacks

step_end = callbacks.MetricsLog.on_step_end
beside = sys.argv[0] + "-peak"  # before runpy makes sys.argv[0] the trainer's

def on_step_end(self, args, state, control, **kwargs):
    out = step_end(self, args, state, control, **kwargs)
    if state.global_step == 2:
        held = b"x" * {EXTRA} if os.environ["RANK"] == "1" else b""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(beside + os.environ["RANK"], "w") as f:
            f.write(str(peak))
        if held:
            raise torch.OutOfMemoryError("rank 1 ran out of memory (the test's)")
    return out

callbacks.MetricsLog.on_step_end = on_step_end
runpy.run_module("dockyard.train", run_name="__main__", alter_sys=True)
"""


def test_a_failed_runs_manifest_reports_the_largest_peak_of_every_rank_and_names_it(tmp_path):
    run, script = tmp_path / "run", tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK)
    argv = command("ddp", run, *FAST)
    argv[argv.index("-m", argv.index("--standalone")):argv.index("--recipe")] = [str(script)]
    proc = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stderr[-4000:]
    peaks = {rank: int((tmp_path / f"failing_rank.py-peak{rank}").read_text()) for rank in (0, 1)}
    assert peaks[1] > peaks[0] + EXTRA // 2, peaks  # rank 1 really held more
    m = manifest(run)
    assert m["status"] == "failed" and "out of GPU memory" in m["error"] and "(rank 1;" in m["error"], m["error"]
    met = m["metrics"]
    assert met["peak_memory_bytes"] >= peaks[1] and met["peak_memory_rank"] == 1, json.dumps(met)
    assert met["peak_memory_kind"] == "rss"
