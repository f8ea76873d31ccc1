"""The trainer's throughput accounting (callbacks.MetricsLog) driven through the Trainer's callback order for a
few steps on one process: a save's time and an evaluation's time and tokens stay out of the windows, warm-up
stays out of the steady state. The callback reads a clock this test advances by known lengths (steps, saves,
evaluations), so the figures are exact whatever the load of the machine running it."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from dockyard.train import callbacks
from dockyard.train.callbacks import MetricsLog, TokenCount


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
    tokens = TokenCount()
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), tokens, flops=1e6, peak=1e9)
    args = SimpleNamespace(world_size=1, device="cpu")
    state = SimpleNamespace(global_step=0, max_steps=12)
    log.on_train_begin(args, state, None)
    for step in range(1, 13):
        tokens.add([{"input_ids": torch.ones(2, 60), "attention_mask": torch.ones(2, 60)[:, :50]}])  # the step's
        clock.sleep(0.01)     # the step
        state.global_step = step
        control = SimpleNamespace(should_save=step == 8, should_evaluate=step == 8, should_log=True)
        log.on_step_end(args, state, control)
        log.on_log(args, state, control, logs={"loss": 1.0})
        if step == 8:
            clock.sleep(0.3)  # evaluation batches never reach the count (TokenCount counts the steps' batches)
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


def test_the_steps_under_the_profiler_are_left_out_of_the_steady_state(tmp_path, monkeypatch):
    """profile_steps 7-8: the profiler slows those steps (and writes its traces after the last): the windows holding
    them are marked in metrics.jsonl and the steady state is the other windows' rate."""
    log = _logged_run(tmp_path, monkeypatch, 14, profiled=(7, 8), logs=lambda step: step % 2 == 0,
                      seconds=lambda step: 0.5 if step in (7, 8) else 0.01)  # profiled: 50x slower
    lines = {x["step"]: x for x in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert [s for s, x in lines.items() if x.get("profiled")] == [8]  # the window of steps 7-8
    steady = log.steady_state()
    assert steady["tokens_per_second"] == pytest.approx(10000.0)  # 100 tokens in 0.01 s, as every other step
    assert (steady["from_step"], steady["to_step"], steady["tokens"]) == (6, 14, 700)  # steps 6 and 9-14 (a window
    # ends with the warm-up at step 5)
    assert steady["profiled_steps_left_out"] == [7, 8]


def _logged_run(tmp_path, monkeypatch, steps: int, *, seconds, logs, first_step: int = 0,
                profiled: tuple[int, int] | None = None, max_steps: int = 0) -> MetricsLog:
    """MetricsLog through steps first_step + 1 to `steps` in the Trainer's callback order: step s takes
    `seconds(s)` and holds 100 tokens; the Trainer asks for a window where `logs(s)`, the callback where it must;
    `max_steps`: the run's, where it stopped before (`steps` by default)."""
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    tokens = TokenCount()
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), tokens, profiled=profiled)
    args = SimpleNamespace(world_size=1, device="cpu")
    state = SimpleNamespace(global_step=first_step, max_steps=max_steps or steps)
    log.on_train_begin(args, state, None)
    for step in range(first_step + 1, steps + 1):
        tokens.add([{"input_ids": torch.ones(1, 100)}])
        clock.sleep(seconds(step))
        state.global_step = step
        control = SimpleNamespace(should_save=False, should_evaluate=False, should_log=logs(step))
        log.on_step_end(args, state, control)
        if control.should_log:
            log.on_log(args, state, control, logs={"loss": 1.0})
    return log


def _profiled_run(tmp_path, monkeypatch, steps: int, profiled: tuple[int, int]) -> dict:
    """A run of `steps` steps logged every step, the profiled ones 50x slower (the profiler writing its trace)."""
    return _logged_run(tmp_path, monkeypatch, steps, profiled=profiled, logs=lambda step: True,
                       seconds=lambda step: 0.5 if profiled[0] <= step <= profiled[1] else 0.01).steady_state()


def test_profiled_last_steps_stay_out_of_the_rate_even_where_the_warm_up_must_count(tmp_path, monkeypatch):
    """--max_steps 8 --logging_steps 1 --profile_steps 6-8: every window after the warm-up was profiled, and the
    rate fell back to all windows but the first, profiled ones included: 8531 tokens/s on a CPU run whose steps ran
    at 25-29k, with nothing saying the profiled steps were counted."""
    steady = _profiled_run(tmp_path, monkeypatch, 8, (6, 8))
    assert steady["tokens_per_second"] == pytest.approx(10000.0)  # steps 2-5, at the unprofiled rate
    assert (steady["from_step"], steady["to_step"], steady["warm_up_left_out"]) == (2, 5, False)
    assert steady["profiled_steps_left_out"] == [6, 8] and "profiled_steps_included" not in steady
    # nothing else to measure: counted, and said
    (tmp_path / "all").mkdir()
    steady = _profiled_run(tmp_path / "all", monkeypatch, 3, (2, 3))
    assert steady["tokens_per_second"] == pytest.approx(200.0) and steady["profiled_steps_included"] == [2, 3]
    assert "profiled_steps_left_out" not in steady


def test_a_resume_past_the_profiled_steps_start_flags_no_window_as_profiled(tmp_path, monkeypatch):
    """profile_steps 8-14 kept in overrides.json, the run resumed at step 9: the profiler ran no step (it says so),
    yet the windows of steps 9-14 were flagged profiled and left out of the rate, said "(profiled)"."""
    log = _logged_run(tmp_path, monkeypatch, 30, first_step=9, profiled=(8, 14), logs=lambda step: step % 5 == 0,
                      seconds=lambda step: 0.01)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not any(x.get("profiled") for x in lines)
    steady = log.steady_state()
    assert (steady["from_step"], steady["to_step"]) == (15, 30) and "profiled_steps_left_out" not in steady


def test_the_last_step_always_closes_a_window(tmp_path, monkeypatch):
    """With --max_steps 12 --logging_steps 5, steps 11-12 were in no window (missing from metrics.jsonl); with
    --max_steps 4 --logging_steps 10 loss_last was step 1's."""
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), TokenCount())
    args, state = SimpleNamespace(world_size=1, device="cpu"), SimpleNamespace(global_step=0, max_steps=12)
    log.on_train_begin(args, state, None)
    asked = []
    for step in range(1, 13):
        state.global_step = step
        control = SimpleNamespace(should_save=False, should_evaluate=False, should_log=step % 5 == 0)
        log.on_step_end(args, state, control)
        asked.append(control.should_log)
    assert [step for step, logged in enumerate(asked, 1) if logged] == [5, 10, 12]


@pytest.mark.parametrize("first_step, windows", [(0, [1, 5, 10, 20]), (8, [9, 10, 13, 20])])
def test_a_window_ends_with_the_warm_up_whatever_the_logging_steps(tmp_path, monkeypatch, first_step, windows):
    """At --logging_steps 10 (logging_first_step on) the window of steps 2-10 counted in the steady state, step 2's
    recompile under torch_compile included: a CPU run reported 414 tokens/s where its steps 6-30 ran at 19,380. A
    resumed run (from step 8) warms up again."""
    log = _logged_run(tmp_path, monkeypatch, 50, first_step=first_step,
                      logs=lambda step: step == first_step + 1 or step % 10 == 0,
                      seconds=lambda step: 5.0 if step == first_step + 2 else 0.1)  # step 2: a recompile
    steady = log.steady_state()
    warm = first_step + callbacks.WARMUP_STEPS
    assert (steady["from_step"], steady["to_step"], steady["warm_up_left_out"]) == (warm + 1, 50, True)
    assert steady["tokens_per_second"] == pytest.approx(100 / 0.1)  # every step after warm-up: 100 tokens in 0.1 s
    assert [w["step"] for w in log.windows][:4] == windows


def test_the_tokens_of_a_window_are_its_steps_not_the_batches_made_ahead():
    """The loader makes the next step's batch before this step trains: counted as they were made, the first window
    held two batches (its tokens/s 2x too high). Counted as the Trainer takes them: padded batches by their mask,
    padding-free rows whole."""
    count = TokenCount()
    count.add([{"input_ids": torch.ones(2, 5), "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])}])
    assert count.value == 7
    count.add([{"input_ids": torch.ones(1, 21), "position_ids": torch.zeros(1, 21)}])
    assert count.value == 28


def test_the_final_save_is_not_taken_out_of_the_training_time(tmp_path, monkeypatch):
    """The model saved after training was subtracted from the training time: with a slow final save the steady
    state's seconds went negative and its tokens/s 0.0."""
    import dockyard.train.__main__ as trainer_main

    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    monkeypatch.setattr(trainer_main, "time", clock)
    monkeypatch.setattr(trainer_main, "reference_logits", lambda *a: {})
    monkeypatch.setattr(trainer_main.models, "weights_dtype", lambda *a: None)
    tokens = TokenCount()
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), tokens)
    args = SimpleNamespace(world_size=1, device="cpu", bf16=False, fp16=False)
    log.on_train_begin(args, SimpleNamespace(global_step=0), None)
    tokens.add([{"input_ids": torch.ones(1, 1000)}])
    clock.sleep(2.0)  # training, nothing logged
    log.on_train_end(args, None, None)
    trainer = SimpleNamespace(model=None, state=SimpleNamespace(global_step=3),
                              save_model=lambda path: clock.sleep(5.0))  # a slow final save
    p = SimpleNamespace(args=args, examples=[{"input_ids": [1]}], settings=None, recipe=SimpleNamespace(peft=None))
    run = SimpleNamespace(doing=lambda phase: None, opts=SimpleNamespace(run_dir=tmp_path), world_size=1,
                          record=SimpleNamespace(reference_logits=None), metrics={})
    trainer_main.save_and_measure(p, trainer, log, run)
    steady = run.metrics["steady_state"]
    assert steady["seconds"] == pytest.approx(2.0) and steady["tokens_per_second"] == pytest.approx(500.0)
    assert run.metrics["tokens_per_second"] == pytest.approx(500.0)
    assert run.metrics["seconds_saving"] == pytest.approx(5.0)  # the manifest still says what saving took


@pytest.mark.parametrize("tied", [False, True])
def test_a_classifier_s_mfu_counts_no_vocabulary_head(monkeypatch, tied):
    """A seq_cls model has no vocab × hidden output head; the FLOPs per token counted it (1.27x too high an MFU for a
    tied 1B Llama). The GPU is faked (torch.cuda's two reads), the shape is the causal LM's the trainer sizes."""
    from dockyard.common.memory import Shape
    from dockyard.train import __main__ as train_main
    from dockyard.train import mfu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    vocab, hidden, layers = 32000, 2048, 22
    embedding = vocab * hidden
    body = 900_000_000  # the decoder layers
    shape = Shape(params=body + embedding * (1 if tied else 2), largest_layer=embedding, hidden=hidden, layers=layers,
                  vocab=vocab, intermediate=5632, kv_hidden=256, linear_params=body, lora_params=0)

    def prepared(task):
        return SimpleNamespace(args=SimpleNamespace(bf16=True, fp16=False, local_process_index=0), shape=shape,
                               model=SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=tied)),
                               recipe=SimpleNamespace(peft=None), settings=SimpleNamespace(task=task),
                               examples=[{"input_ids": [0] * 1024}])

    attention = 12 * layers * hidden * 1024
    lm, peak = train_main.flops_and_peak(prepared("causal_lm"))
    classifier, _ = train_main.flops_and_peak(prepared("seq_cls"))
    assert peak == mfu.peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert lm == 6 * (body + embedding) + attention  # the head multiplies; the input embedding is a lookup
    assert classifier == 6 * body + attention


def test_writing_a_windows_line_counts_in_every_window_not_as_the_next_saves_pause(tmp_path, monkeypatch):
    """Rank 0 writes each window's line after closing it, so the writing falls in the next window. Before a save it
    was counted as the save's pause instead, and the windows after a save read faster than the others (1.05-1.10x
    in tests/integration/test_throughput.py, a CI failed on it)."""
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    monkeypatch.setattr(callbacks.log, "info", lambda *a: clock.sleep(0.004))  # writing the line to train.log
    tokens = TokenCount()
    log = MetricsLog(tmp_path / "metrics.jsonl", True, clock.perf_counter(), tokens)
    args = SimpleNamespace(world_size=1, device="cpu")
    state = SimpleNamespace(global_step=0, max_steps=12)
    log.on_train_begin(args, state, None)
    for step in range(1, 13):
        tokens.add([{"input_ids": torch.ones(2, 60)}])
        clock.sleep(0.01)
        state.global_step = step
        control = SimpleNamespace(should_save=step % 2 == 0, should_evaluate=False, should_log=True)
        log.on_step_end(args, state, control)
        log.on_log(args, state, control, logs={"loss": 1.0})
        if control.should_save:
            clock.sleep(0.5)
            log.on_save(args, state, control)
    seconds = {w["step"]: w["seconds"] for w in log.windows}
    assert all(seconds[s] == pytest.approx(0.014) for s in range(2, 13)), seconds  # the step and the line before
    assert log.seconds_saving == pytest.approx(6 * 0.5)


def test_a_window_is_said_on_the_console_as_a_line_to_read_and_kept_whole_in_metrics_jsonl():
    """The console printed metrics.jsonl's JSON line: `"learning_rate": 0.0002500000000000001`, `"epoch":
    0.01680672268907563`, a Unix time beside the log's own."""
    from dockyard.train.callbacks import window_line

    logs = {"loss": 6.006850242614746, "grad_norm": 1.4774765968322754, "learning_rate": 0.0002500000000000001,
            "epoch": 0.024, "tokens": 1546, "seconds": 0.2716, "step_seconds": 0.1358, "tokens_per_second": 5692.86}
    assert window_line(3, 60, logs) == ("step 3/60 · loss 6.0069 · grad_norm 1.48 · lr 0.00025 · 5693 tokens/s "
                                        "(0.136 s/step) · about 8 s left")
    assert window_line(3, 60, {**logs, "mfu": 0.4123}).endswith("5693 tokens/s (0.136 s/step), MFU 41.2% · about 8 s left")
    assert window_line(60, 60, logs).endswith("(0.136 s/step)")  # the last step: nothing left to say
    assert window_line(2, 4, {"eval_loss": 5.9479756355285645, "eval_runtime": 0.5336, "epoch": 0.0168}) == (
        "step 2/4 · eval_loss 5.9480 (0.534 s)")
    assert window_line(5, 9, {"loss": None, "learning_rate": 1e-3}) == "step 5/9 · loss not finite · lr 0.001"


def test_the_time_to_the_first_step_counts_from_the_process_start(tmp_path):
    """It counted from main(), after torch, transformers and DeepSpeed had been imported (4-5 s here, more in an
    image): 6.9 s said where the step-1 line came 9.6 s after the command started."""
    import os
    import subprocess
    import sys

    from dockyard import ROOT

    run = tmp_path / "run"
    began = time.time()
    r = subprocess.run([sys.executable, "-m", "dockyard.train", "--recipe", "ddp", "--run-dir", str(run), "--",
                        "--max_steps", "1", "--save_strategy", "no", "--max_seq_length", "32", "--logging_steps", "1"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = json.loads((run / "manifest.json").read_text())["metrics"]["seconds_to_first_step"]
    step_1_line = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["time"]  # written as step 1 ends
    assert step_1_line - began - 1.5 < said <= step_1_line - began + 0.1, (said, step_1_line - began)


@pytest.mark.parametrize("first_step, steps, said", [
    # resumed at 6 with --max_steps 8 (logging_steps 5): steps 7-8 are all of this attempt, its first window (the
    # data already trained skipped) included
    (6, 8, "(steps 7-8 since the resume at step 6, all of them warm-up: too few to leave it out)"),
    (6, 14, "(steady state of steps 12-14, since the resume at step 6)"),
    (0, 3, "(steps 2-3, part of the warm-up included: too few steps to leave all of it out)"),
    (0, 2, "(step 2, part of the warm-up included: too few steps to leave all of it out)"),  # not "steps 2-2"
    (0, 14, "(steady state)"),
])
def test_the_summary_says_which_steps_a_resumed_runs_rate_counts(tmp_path, monkeypatch, capsys, first_step, steps,
                                                                 said):
    """A resume of 2 steps said "10522 tokens/s (steps 7-8, part of the warm-up included: too few steps to leave all
    of it out)": steps 7-8 were the whole attempt, every one of them warm-up; and a longer resume's "(steady state)"
    did not say the rate is the resumed steps' alone (the earlier attempt's are not in it)."""
    from dockyard.common.recipes import load_recipe
    from dockyard.launch import summary as launch_summary
    from dockyard.train import manifest

    log = _logged_run(tmp_path, monkeypatch, steps, first_step=first_step, seconds=lambda step: 0.01,
                      logs=lambda step: step % 5 == 0 or step == 1)
    steady = log.steady_state()
    # by hand: the windows of this attempt, its first left out where another follows, then those after its warm-up
    windows = [w for w in log.windows if w["from_step"] > first_step]
    after = [w for w in windows[1:] if w["step"] > first_step + callbacks.WARMUP_STEPS] or windows[1:] or windows
    assert (steady["from_step"], steady["to_step"]) == (after[0]["from_step"], after[-1]["step"])
    resumed = {"resumed": {"from": f"checkpoint-{first_step}", "step": first_step}} if first_step else {}
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None, {
        "steps": steps, "tokens_per_second": steady["tokens_per_second"], "steady_state": steady}, resumed))
    launch_summary.summarise(tmp_path)
    assert f"{steady['tokens_per_second']:.0f} tokens/s {said} ·" in capsys.readouterr().out


@pytest.mark.parametrize("rank", [16, 64])
def test_a_lora_run_s_mfu_counts_the_adapters_own_matmuls(monkeypatch, rank):
    """LoRA's FLOPs per token were 4·N for the frozen base alone, "the adapters' own FLOPs being negligible": the
    adapters go through all three matmuls (forward, activation and weight gradients), 6 per trained weight, 1.8 % of
    the FLOPs of a 1.1B Llama at rank 16 and 7.3 % at rank 64, left out of its MFU. The GPU is faked (torch.cuda's two
    reads); the adapters are real modules of rank `rank` on each linear layer of a 1.1B Llama's shape."""
    from dockyard.common.memory import Shape
    from dockyard.train import __main__ as train_main
    from dockyard.train import mfu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    vocab, hidden, inter, kv, layers = 32000, 2048, 5632, 256, 22
    linears = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inter), (hidden, inter),
               (inter, hidden)]
    body = layers * sum(a * b for a, b in linears)
    shape = Shape(params=body + 2 * vocab * hidden, largest_layer=vocab * hidden, hidden=hidden, layers=layers,
                  vocab=vocab, intermediate=inter, kv_hidden=kv, linear_params=body, lora_params=0)
    # one layer's adapters as PEFT adds them (A: in x r, B: r x out, trained), on every layer, and a frozen weight
    layer = torch.nn.ModuleList([*(torch.nn.Linear(a, rank, bias=False, device="meta") for a, _ in linears),
                                 *(torch.nn.Linear(rank, b, bias=False, device="meta") for _, b in linears)])
    frozen = torch.nn.Linear(8, 8, device="meta").requires_grad_(False)
    adapters = layers * sum(rank * (a + b) for a, b in linears)
    model = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=False), parameters=lambda: [
        *(w for _ in range(layers) for w in layer.parameters()), *frozen.parameters()])
    p = SimpleNamespace(args=SimpleNamespace(bf16=True, fp16=False, local_process_index=0), shape=shape, model=model,
                        recipe=SimpleNamespace(peft="lora"), settings=SimpleNamespace(task="causal_lm"),
                        examples=[{"input_ids": [0] * 1024}])
    flops, peak = train_main.flops_and_peak(p)
    base = body + vocab * hidden  # the decoder's linear layers and the untied head; the input embedding is a lookup
    assert flops == 4 * base + 6 * adapters + 12 * layers * hidden * 1024
    assert peak == mfu.peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert abs(6 * adapters / (4 * base) - {16: 0.018, 64: 0.073}[rank]) < 0.001  # what the docstring says it adds


def test_a_stopped_run_reports_the_rate_of_the_windows_it_logged(tmp_path, monkeypatch, capsys):
    """Ctrl-C at step 69 of a ddp run logging every 5 steps: metrics.jsonl held 14 windows, and the manifest's
    tokens_per_second was null, `invoke run` saying "no throughput measured". The windows it logged are measured: the
    rate after warm-up is theirs, as a completed run's."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.launch import summary as launch_summary
    from dockyard.train import ending, manifest

    # stopped at step 69 of 2000: the window of steps 66-69 never closed (max_steps is the Trainer's 2000)
    log = _logged_run(tmp_path, monkeypatch, 69, seconds=lambda step: 0.05 if step <= 5 else 0.01,
                      logs=lambda step: step % 5 == 0 or step == 1, max_steps=2000)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    after = [x for x in lines if x["step"] > callbacks.WARMUP_STEPS]  # by hand: steps 6-65, 100 tokens each
    by_hand = sum(x["tokens"] for x in after) / sum(x["seconds"] for x in after)
    assert by_hand == pytest.approx(100 / 0.01)
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "failed", 1, None,
                                            ending.measured_so_far(log), {"error": "interrupted (SIGINT)"}))
    with pytest.raises(DockyardError, match="interrupted"):
        launch_summary.summarise(tmp_path)
    said = capsys.readouterr().out
    m = json.loads((tmp_path / "manifest.json").read_text())["metrics"]
    assert m["tokens_per_second"] == pytest.approx(by_hand, rel=1e-3), m
    assert (m["steady_state"]["from_step"], m["steady_state"]["to_step"]) == (6, 65)
    assert f"{m['tokens_per_second']:.0f} tokens/s (steady state)" in said and "no throughput" not in said, said


def test_a_long_run_says_how_long_it_has_left_at_each_window():
    """A line said 'step 100/5000 · ... (2.4 s/step)' and left the user to work out that the run had over three hours
    to go; a CI log or Slurm's output file of a run is read for exactly that."""
    from dockyard.train.callbacks import window_line

    logs = {"loss": 2.5, "learning_rate": 1e-4, "tokens_per_second": 3400.0, "step_seconds": 2.4}
    assert window_line(100, 5000, logs).endswith("(2.4 s/step) · about 3.3 h left")
    assert window_line(4000, 5000, logs).endswith("(2.4 s/step) · about 40 min left")
    assert window_line(4990, 5000, logs).endswith("(2.4 s/step) · about 24 s left")
    assert window_line(4999, 5000, {**logs, "step_seconds": 0.04}).endswith("(0.04 s/step) · less than a second left")
