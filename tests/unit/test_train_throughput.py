"""The trainer's throughput accounting (callbacks.MetricsLog) driven through the Trainer's callback order for a
few steps on one process: a save's time and an evaluation's time and tokens stay out of the windows, warm-up
stays out of the steady state. The callback reads a clock this test advances by known lengths (steps, saves,
evaluations), so the figures are exact whatever the load of the machine running it."""

from __future__ import annotations

import json
import multiprocessing
import time
from types import SimpleNamespace

import pytest

from dockyard.train import callbacks
from dockyard.train.callbacks import MetricsLog


class Clock:
    """time.perf_counter for the callback, moved by `sleep` only."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    @staticmethod
    def time() -> float:
        return time.time()


def test_saves_and_evaluation_are_left_out_of_the_windows(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    tokens = multiprocessing.Value("q", 0)
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), tokens, flops=1e6, peak=1e9)
    args = SimpleNamespace(world_size=1, device="cpu")
    state = SimpleNamespace(global_step=0)
    log.on_train_begin(args, state, None)
    for step in range(1, 13):
        tokens.value += 100  # the collator made this step's batch
        clock.sleep(0.01)     # the step
        state.global_step = step
        control = SimpleNamespace(should_save=step == 8, should_evaluate=step == 8)
        log.on_step_end(args, state, control)
        log.on_log(args, state, control, logs={"loss": 1.0})
        if step == 8:
            tokens.value += 5000  # evaluation batches go through the same collator
            clock.sleep(0.3)
            log.on_log(args, state, control, logs={"eval_loss": 2.0})
            log.on_evaluate(args, state, control)
            clock.sleep(0.5)  # the checkpoint
            log.on_save(args, state, control)
    log.on_train_end(args, state, None)

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [x for x in lines if "loss" in x]
    assert [w["tokens"] for w in windows] == [100] * 12  # the evaluation's 5000 tokens are in no window
    after_save = windows[8]  # step 9: its window began before the evaluation and the save
    assert after_save["seconds"] == pytest.approx(0.01), after_save  # its own step only
    assert log.seconds_evaluating == pytest.approx(0.3) and log.seconds_saving == pytest.approx(0.5)
    assert all(w["mfu"] == float(f"{w['tokens_per_second'] * 1e6 / 1e9:.4g}") for w in windows)
    steady = log.steady_state()
    assert (steady["from_step"], steady["to_step"], steady["tokens"]) == (6, 12, 700) and steady["warm_up_left_out"]
    assert abs(steady["tokens_per_second"] / (700 / sum(w["seconds"] for w in windows[5:])) - 1) < 0.01
    assert log.tokens_trained == 1200
