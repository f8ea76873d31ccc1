"""A run whose loss became NaN (ddp -- --learning_rate 1e12 --max_grad_norm 0): metrics.jsonl and manifest.json
held `NaN`, which strict JSON parsers refuse, and the run said completed with no word of it."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import load_recipe
from dockyard.launch import summary as launch_summary
from dockyard.train import manifest
from dockyard.train.callbacks import MetricsLog, TokenCount


def strict(text: str):
    """JSON as a strict parser reads it (NaN and Infinity are not JSON)."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_a_diverged_run_writes_null_for_its_non_finite_numbers_and_says_where_it_diverged(tmp_path, caplog, capsys):
    log = MetricsLog(tmp_path / "metrics.jsonl", True, 0.0, TokenCount())
    args, state = SimpleNamespace(world_size=1, device="cpu"), SimpleNamespace(global_step=0, max_steps=4)
    log.on_train_begin(args, state, None)
    with caplog.at_level(logging.INFO, logger="dockyard.train"):
        for step, loss in enumerate([6.2, math.nan, math.nan, math.inf], 1):
            state.global_step = step
            log.on_log(args, state, None, logs={"loss": loss, "grad_norm": loss, "learning_rate": 1e12})
    rows = [strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in rows] == [(1, 6.2, 6.2), (2, None, None), (3, None, None),
                                                                     (4, None, None)]
    said = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert said == ["the loss became non-finite (nan) at step 2: the run diverged (the model it saves is not usable); "
                    "lower --learning_rate (and keep --max_grad_norm above 0)"]  # once, in train.log

    probe = {"input_ids": [1, 2], "logits": [math.nan, -math.inf, 0.5]}
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None,
                                            {"steps": 4, "tokens_per_second": 100.0}, {"probe": probe}))
    written = strict((tmp_path / "manifest.json").read_text())
    assert written["metrics"]["loss_non_finite_at_step"] == 2 and written["metrics"]["loss_last"] is None
    assert written["probe"]["logits"] == [None, None, 0.5] and written["status"] == "completed"

    assert launch_summary.summarise(tmp_path)["status"] == "completed"
    out = capsys.readouterr().out
    assert "loss 6.2000 → not finite" in out
    assert "warning: the loss became non-finite at step 2: the run diverged" in out


def test_nan_lines_of_an_older_trainer_count_as_diverged_and_are_rewritten_as_json(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 5, "loss": NaN}\n')  # an older trainer
    m = manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None, {}, {})
    assert m["metrics"]["loss_non_finite_at_step"] == 5
    manifest.trim_metrics(tmp_path, 5)
    assert [strict(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [6.5, None]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n')
    assert manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None, {}, {})["metrics"][
        "loss_non_finite_at_step"] is None


def test_the_summary_of_a_failed_run_that_diverged_still_says_so(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 2, "loss": null}\n')
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "failed", 1, None, {}, {"error": "boom"}))
    with pytest.raises(DockyardError, match="failed: boom"):
        launch_summary.summarise(tmp_path)
    assert "non-finite at step 2" in capsys.readouterr().out


def test_a_run_that_diverged_before_its_first_logged_loss_still_shows_its_figures(tmp_path, capsys):
    """--logging_first_step false and a loss already NaN at the first log: loss_first is null too; the summary keeps
    the steps, the throughput and the memory (it printed nothing of them)."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 5, "loss": null}\n{"step": 10, "loss": null}\n')
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None,
                                            {"steps": 10, "tokens_per_second": 22014.0, "peak_memory_bytes": 2**30,
                                             "peak_memory_kind": "rss"}, {}))
    launch_summary.summarise(tmp_path)
    out = capsys.readouterr().out
    assert "steps 10 · loss not finite → not finite · 22014 tokens/s (steady state)" in out
    # what the figure is (it read "peak memory 1024 MiB" on CPU too), and what a finished run is for next
    assert "peak RSS 1024 MiB (the largest process)" in out
    # a run trained on this host (no image: the manifest's variant "native") is exported here: `invoke export`
    # refuses it without --native, which the line left out
    assert f"next: invoke export --run={tmp_path.name} --native writes its model as a plain Hugging Face folder" in out


def test_a_container_runs_summary_names_the_export_without_native(tmp_path, capsys, monkeypatch):
    from dockyard.common import envvars

    monkeypatch.setenv(envvars.VARIANT, "cpu")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 2, "loss": 6.0}\n')
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None, {"steps": 2}, {}))
    launch_summary.summarise(tmp_path)
    assert f"next: invoke export --run={tmp_path.name} writes its model" in capsys.readouterr().out


def test_the_summary_of_a_run_says_how_long_it_took(tmp_path, capsys):
    """A run's last lines said what it trained (steps, loss, tokens/s) and never how long the command took: a
    nohup or CI log's reader compared timestamps, a terminal's had none."""
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 2, None,
                                            {"steps": 30, "tokens_per_second": 100.0}, {}))
    launch_summary.summarise(tmp_path, took=754.0)
    assert capsys.readouterr().out.splitlines()[0].startswith(f"run {tmp_path.name}: completed in 13 min · recipe ddp")

    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "failed", 2, None, {"steps": 3},
                                            {"error": "rank 1 ran out of memory"}))
    with pytest.raises(DockyardError):
        launch_summary.summarise(tmp_path, took=41.0)
    assert capsys.readouterr().out.splitlines()[0].startswith(f"run {tmp_path.name}: failed after 41 s · recipe ddp")
