"""A ZeRO run preempted on 2 processes resumes on 1: its checkpoint is converted to DeepSpeed's universal form (where
it was refused: ZeRO split the optimizer's state over the 2), and the run goes on as the uninterrupted run went.
Real runs: torchrun on CPU (gloo; DeepSpeed on its CPU accelerator), the tiny model."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.support.training import manifest, train

STEPS = ["--max_steps", "4", "--save_steps", "2", "--logging_steps", "1", "--max_seq_length", "32"]


def _sums(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _steps(run):
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r}


def test_a_zero2_run_preempted_on_2_processes_resumes_on_1_where_it_stopped(tmp_path):
    whole = tmp_path / "whole"
    train("zero2", whole, *STEPS)  # 2 processes, 4 steps: what the preempted run would have done
    run = tmp_path / "run"
    shutil.copytree(whole, run)  # the run preempted after checkpoint-2: what came after it is not there
    shutil.rmtree(run / "checkpoints" / "checkpoint-4")
    shutil.rmtree(run / "model")
    checkpoint = run / "checkpoints" / "checkpoint-2"
    original = _sums(checkpoint)

    resumed = train("zero2", run, resume=True, nproc=1)  # its own settings: 4 steps, the global batch of 16
    said = [line for line in resumed.stderr.splitlines() if "universal form" in line]
    assert len(said) == 1 and said[0].split("dockyard.train: ")[1].startswith(
        "checkpoint-2 was saved by 2 processes; converted to DeepSpeed's universal form for 1 (into "
        "checkpoint-2/global_step2_universal in "), resumed.stderr[-3000:]
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 4 and m["world_size"] == 1, m.get("error")
    assert m["resumed"] == {"from": "checkpoint-2", "step": 2, "saved_by": 2, "universal": True}
    before, after = _steps(whole), _steps(run)
    assert sorted(after) == [1, 2, 3, 4]  # 1 and 2 kept from before the preemption, 3 and 4 trained again
    for step in (3, 4):
        # the same weights, Adam moments, learning rate and examples: the same loss, to float32's sums in another
        # order (here the same to the bit; Adam's moments started over moved step 4's loss by 0.011)
        assert after[step]["loss"] == pytest.approx(before[step]["loss"], abs=1e-3), (step, before, after)
        assert after[step]["learning_rate"] == pytest.approx(before[step]["learning_rate"], rel=1e-9)
    now = _sums(checkpoint)
    assert {k: v for k, v in now.items() if k in original} == original  # its own files, as they were
    assert sorted(p.name for p in (run / "checkpoints" / "checkpoint-4" / "global_step4").iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # saved by the 1 that went on
