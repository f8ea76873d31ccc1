"""The throughput a run reports is the training's own: real runs of the ddp recipe (2 processes, gloo, the tiny
model). Saving a checkpoint at every step and evaluating leave the manifest's tokens/s where a run without either
puts it, and the manifest's figure is what the run's own metrics.jsonl timestamps say.

The 2-core machine this runs on is shared and noisy: runs are long enough for the steady state to hold dozens of
windows, the two kinds are alternated (A B B A, so a slow drift hits both alike) and their middle values compared."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tests.support.training import manifest, train

STEPS = ["--max_steps", "60", "--per_device_train_batch_size", "8", "--max_seq_length", "64", "--logging_steps", "1",
         "--lr_scheduler_type", "constant"]
SAVING = ["--save_steps", "1", "--save_total_limit", "2", "--eval_fraction", "0.05", "--eval_steps", "10",
          "--per_device_eval_batch_size", "8"]
PLAIN = ["--save_strategy", "no"]


def lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_saving_and_evaluating_leave_the_reported_tokens_per_second_alone(tmp_path):
    runs: dict[str, list[dict]] = {"saving": [], "plain": []}
    for i, kind in enumerate(["saving", "plain", "plain", "saving"]):
        run = tmp_path / f"{kind}{i}"
        train("ddp", run, *STEPS, *(SAVING if kind == "saving" else PLAIN))
        runs[kind].append(manifest(run) | {"dir": run})

    for m in runs["saving"]:  # it did save and evaluate at every step, and took the time out
        met = m["metrics"]
        assert len(list((m["dir"] / "checkpoints").glob("checkpoint-*"))) == 2
        assert met["seconds_saving"] > 0 and met["seconds_evaluating"] > 0 and "eval_loss_last" in met
        assert met["steady_state"]["warm_up_left_out"] and met["steady_state"]["to_step"] == 60
    for m in runs["plain"]:
        assert not list((m["dir"] / "checkpoints").glob("checkpoint-*")) and m["metrics"]["seconds_evaluating"] == 0

    saving = statistics.median(m["metrics"]["tokens_per_second"] for m in runs["saving"])
    plain = statistics.median(m["metrics"]["tokens_per_second"] for m in runs["plain"])
    each = {k: [round(m["metrics"]["tokens_per_second"]) for m in v] for k, v in runs.items()}
    print(f"tokens/s with a checkpoint every step vs none: {each}")
    assert abs(saving / plain - 1) < 0.10, f"tokens/s with a checkpoint every step vs none: {each}"


def test_the_manifest_reports_the_rate_its_metrics_timestamps_give(tmp_path):
    run = tmp_path / "run"
    train("ddp", run, *STEPS, *PLAIN)
    m, logged = manifest(run), lines(run)
    steady = m["metrics"]["steady_state"]
    assert steady["from_step"] > 5 and steady["to_step"] == 60 and m["metrics"]["mfu"] is None  # no GPU: no MFU
    by_step = {x["step"]: x for x in logged}
    # From the wall-clock timestamps alone: the tokens logged after the window before `from_step` closed, over the
    # time between that window's line and the last one.
    tokens = sum(by_step[s]["tokens"] for s in range(steady["from_step"], 61))
    seconds = by_step[60]["time"] - by_step[steady["from_step"] - 1]["time"]
    assert abs(m["metrics"]["tokens_per_second"] / (tokens / seconds) - 1) < 0.03, (m["metrics"], tokens, seconds)
    # every rank's tokens: each window holds both ranks' batches (2 x 8 examples of at most 64 tokens)
    assert all(8 * 2 * 10 < x["tokens"] <= 8 * 2 * 64 for x in logged[1:]), logged[:3]
    assert all(x["tokens_per_second"] > 0 and x["step_seconds"] > 0 for x in logged)
    assert m["metrics"]["seconds_to_first_step"] > 0 and m["metrics"]["seconds_saving"] > 0  # the final model
    assert "tokens_per_second" in (run / "train.log").read_text()
