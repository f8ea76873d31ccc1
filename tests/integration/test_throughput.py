"""The throughput a run reports is the training's own: real runs of the ddp recipe (the tiny model), 2 processes
(every rank's tokens summed).

Saving and evaluating are left out of a run's tokens/s. That is checked inside one run that saves a checkpoint
after every second step and evaluates every tenth: its windows that held a save (or an evaluation) report the same
tokens/s as the windows between them. The two kinds of window alternate every ~30 ms, so the host's noise (on
this shared 2-core machine a step's time doubles or halves within a minute) falls on both alike, where counting the
pauses would read those windows at about half the speed. One bias was the trainer's: rank 0 writes each window's
line after closing it, and a save or evaluation that followed counted the writing as its pause, so the windows after
one read 1.05 to 1.07 here and 1.104 in a CI (failed at 10 %); now the writing is training's time in every window:
0.94 to 0.99 in 6 runs (the step after a save may find the CPU's caches cold). Two runs side by side (one
saving at every step, one never), as this test was before, met that noise without cancelling it, and more: the
run that never paused trained faster while the other saved, 0.81 to 1.09 a pair (a CI failed at a median of 0.895
of five), 0.98 to 1.03 for two runs that both never saved."""

from __future__ import annotations

import json
from pathlib import Path

from dockyard.train.callbacks import WARMUP_STEPS
from tests.support.training import manifest, train

STEPS = ["--max_steps", "100", "--per_device_train_batch_size", "8", "--max_seq_length", "64", "--logging_steps", "1",
         "--lr_scheduler_type", "constant"]
SAVING = ["--save_steps", "2", "--save_total_limit", "2", "--eval_fraction", "0.05", "--eval_steps", "10",
          "--per_device_eval_batch_size", "8"]
PLAIN = ["--save_strategy", "no", "--eval_fraction", "0.05", "--eval_strategy", "no"]


def lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def rate(windows: list[dict]) -> float:
    return sum(w["tokens"] for w in windows) / sum(w["seconds"] for w in windows)


def test_saving_and_evaluating_leave_the_reported_tokens_per_second_alone(tmp_path):
    run = tmp_path / "run"
    train("ddp", run, *STEPS, *SAVING)
    m = manifest(run)["metrics"]
    assert len(list((run / "checkpoints").glob("checkpoint-*"))) == 2  # it saved (and kept the last two)
    assert m["seconds_saving"] > 0 and m["seconds_evaluating"] > 0 and "eval_loss_last" in m
    steady = m["steady_state"]
    assert steady["warm_up_left_out"] and steady["to_step"] == 100
    windows = {x["step"]: x for x in lines(run) if "seconds" in x}
    # A save (and every fifth time an evaluation) follows each even step: the next window holds it.
    after = [windows[s] for s in windows if s > WARMUP_STEPS + 1 and s % 2 == 1]
    between = [windows[s] for s in windows if s > WARMUP_STEPS + 1 and s % 2 == 0]
    ratio = rate(after) / rate(between)
    print(f"windows after a save or an evaluation at {ratio:.3f}x the tokens/s of those between")
    # Counted in, the pauses would read those windows at about half the speed; a step left out with them, at twice.
    # The bounds sit between those and 1: a CI host running every test 30 % slower than usual, reclaiming memory
    # (kswapd) as the checkpoints were written back, read 0.801 here (0.92 to 0.97 on a quiet one, before and after
    # the change it ran), the step after a save paying for the save's writeback, which no bound at 0.85 holds
    assert 0.7 < ratio < 1.4, (rate(after), rate(between))
    # What was left out is what the run spent saving and evaluating, and it was much: counted in, those windows
    # would read far below the others (the wall time between their lines, less their `seconds`)
    def wall(w: dict) -> float:
        return w["time"] - windows[w["step"] - 1]["time"]

    paused = sum(wall(w) - w["seconds"] for w in after)
    assert paused > 0.5 * sum(w["seconds"] for w in after), (paused, after[:3])
    assert paused <= m["seconds_saving"] + m["seconds_evaluating"] + 0.5, (paused, m)
    # and the windows between, which paused for nothing, took the wall time their lines say
    walls = sum(wall(w) for w in between)
    assert abs(sum(w["seconds"] for w in between) / walls - 1) < 0.05, (walls, between[:3])
    # the manifest reports those windows' rate
    assert abs(m["tokens_per_second"] / steady["tokens_per_second"] - 1) < 0.01
    assert abs(steady["tokens_per_second"] / rate([w for s, w in windows.items() if s >= steady["from_step"]]) - 1) < 0.01


def test_the_manifest_reports_the_rate_its_metrics_timestamps_give(tmp_path):
    run = tmp_path / "run"
    train("ddp", run, *STEPS, *PLAIN)
    m, logged = manifest(run), lines(run)
    steady = m["metrics"]["steady_state"]
    assert steady["from_step"] > 5 and steady["to_step"] == 100 and m["metrics"]["mfu"] is None  # no GPU: no MFU
    by_step = {x["step"]: x for x in logged}
    # From the wall-clock timestamps alone: the tokens logged after the window before `from_step` closed, over the
    # time between that window's line and the last one.
    tokens = sum(by_step[s]["tokens"] for s in range(steady["from_step"], 101))
    seconds = by_step[100]["time"] - by_step[steady["from_step"] - 1]["time"]
    assert abs(m["metrics"]["tokens_per_second"] / (tokens / seconds) - 1) < 0.03, (m["metrics"], tokens, seconds)
    # every rank's tokens: each window holds both ranks' batches (2 x 8 examples of at most 64 tokens)
    assert all(8 * 2 * 10 < x["tokens"] <= 8 * 2 * 64 for x in logged[1:]), logged[:3]
    assert all(x["tokens_per_second"] > 0 and x["step_seconds"] > 0 for x in logged)
    assert m["metrics"]["seconds_to_first_step"] > 0 and m["metrics"]["seconds_saving"] > 0  # the final model
    said = [x for x in (run / "train.log").read_text().splitlines() if " dockyard.train: step 100/100 · loss " in x]
    assert said and f"{by_step[100]['tokens_per_second']:.0f} tokens/s (" in said[0], said
