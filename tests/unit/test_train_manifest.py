"""manifest.json carries every key of the interface contract, natively and in the image."""

from __future__ import annotations

import contextlib
import json

from dockyard.common.recipes import load_recipe
from dockyard.train import manifest, strategy


def test_manifest_has_the_contract_keys_and_reads_losses_from_the_metrics(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 5, "loss": 4.25}\n')
    monkeypatch.setenv("DOCKYARD_VARIANT", "cpu")
    monkeypatch.setenv("DOCKYARD_IMAGE_REF", "dockyard:0.1.0-cpu")
    monkeypatch.setenv("DOCKYARD_IMAGE_ID", "sha256:abc")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    m = manifest.build(tmp_path, load_recipe("zero3-offload"), "completed", 4,
                       strategy.describe("deepspeed", 3, "cpu", "cpu"),
                       {"steps": 5, "tokens_per_second": 10.0, "peak_memory_bytes": 7}, {"probe": {}})
    manifest.write(tmp_path, m)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert {"run_id", "recipe", "variant", "status", "image", "world_size", "nodes", "strategy", "metrics"} <= set(m)
    assert (m["variant"], m["image"]) == ("cpu", {"ref": "dockyard:0.1.0-cpu", "id": "sha256:abc"})
    assert (m["world_size"], m["nodes"], m["recipe"], m["run_id"]) == (4, 2, "zero3-offload", tmp_path.name)
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # torchrun's count of nodes: 1 process on one, 2 on the other
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert manifest.build(tmp_path, load_recipe("ddp"), "completed", 3, None, {}, {})["nodes"] == 2
    assert m["strategy"]["requested"] == "zero3-offload" and m["strategy"]["peft"] is None
    assert set(m["strategy"]["in_effect"]) == {"engine", "zero_stage", "offload_optimizer", "offload_param",
                                               "fsdp_version"}
    assert m["metrics"] == {"steps": 5, "loss_first": 6.5, "loss_last": 4.25, "loss_non_finite_at_step": None,
                            "tokens_per_second": 10.0, "mfu": None,
                            "seconds_to_first_step": None, "seconds_saving": None, "seconds_evaluating": None,
                            "peak_memory_bytes": 7}


def test_a_native_run_says_so(tmp_path, monkeypatch):
    for k in ("DOCKYARD_VARIANT", "DOCKYARD_IMAGE_REF", "DOCKYARD_IMAGE_ID"):
        monkeypatch.delenv(k, raising=False)
    m = manifest.build(tmp_path, load_recipe("ddp"), "failed", 1, None, {}, {"error": "x"})
    assert m["variant"] == "native" and m["image"] == {"ref": "", "id": ""} and m["status"] == "failed"
    assert m["metrics"]["loss_first"] is None and m["error"] == "x"
    assert m["metrics"]["tokens_per_second"] is None and m["metrics"]["peak_memory_bytes"] > 0


def test_a_run_that_failed_mid_way_reports_its_last_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 10, "loss": 5.0}\n')
    m = manifest.build(tmp_path, load_recipe("ddp"), "failed", 2, None, {}, {})
    assert (m["metrics"]["steps"], m["metrics"]["loss_first"], m["metrics"]["loss_last"]) == (10, 6.5, 5.0)


def test_the_summary_of_a_run_that_failed_mid_way_gives_no_rate_it_did_not_measure(tmp_path, capsys):
    """Its manifest has tokens_per_second null: `invoke run` printed "0 tokens/s (steady state)"."""
    import pytest

    from dockyard.common.errors import DockyardError
    from dockyard.launch import summary as launch_summary

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 10, "loss": 5.0}\n')
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "failed", 2, None, {}, {"error": "boom"}))
    with pytest.raises(DockyardError, match="failed: boom"):
        launch_summary.summarise(tmp_path)
    said = capsys.readouterr().out
    assert "steps 10 · loss 6.5000 → 5.0000 · no throughput measured ·" in said and "tokens/s" not in said, said


def test_the_summary_says_when_a_run_was_too_short_for_a_steady_state(tmp_path, capsys):
    """A compiled run of 3 steps printed "25 tokens/s (steady state)": its only windows held the compiling. The
    manifest's steady_state says whether the warm-up was left out; the summary now says which rate it gives."""
    from dockyard.launch import summary as launch_summary

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 3, "loss": 6.0}\n')
    for steady, says in (({"warm_up_left_out": False}, "25 tokens/s (warm-up included: too few steps to leave it out)"),
                         ({"warm_up_left_out": False, "from_step": 2, "to_step": 3},
                          "25 tokens/s (steps 2-3, part of the warm-up included: too few steps to leave all of it out)"),
                         ({"warm_up_left_out": True}, "25 tokens/s (steady state)"),
                         ({"warm_up_left_out": False, "profiled_steps_included": [2, 3]},
                          "25 tokens/s (the profiled steps 2-3 included, slowed by the profiler: too few other steps "
                          "to leave them out)")):
        manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 1, None, {
            "steps": 3, "tokens_per_second": 25.0, "steady_state": steady}, {}))
        launch_summary.summarise(tmp_path)
        assert says in capsys.readouterr().out


def test_the_summary_names_adapters_a_4_bit_base_and_offloading(tmp_path, capsys):
    """"recipe qlora · ddp" or "zero3-offload · deepspeed ZeRO-3" said nothing of LoRA, of the 4-bit base or of the
    state moved to host memory: what a user reads to know what trained."""
    from dockyard.launch import summary as launch_summary

    for recipe, in_effect, extra, says in (
            ("zero3-offload", strategy.describe("deepspeed", 3, "cpu", "cpu"), {},
             "deepspeed ZeRO-3, optimizer offloaded to cpu, parameters offloaded to cpu"),
            ("qlora", strategy.describe("ddp"), {"model": {"format": "adapter", "quantized_layers": 154}},
             "ddp + LoRA adapters on a 4-bit base (154 layers)"),
            ("lora", strategy.describe("ddp"), {"model": {"format": "adapter"}}, "ddp + LoRA adapters\n"),
            ("ddp", strategy.describe("ddp"), {"model": {"format": "full"}}, "· ddp\n")):
        manifest.write(tmp_path, manifest.build(tmp_path, load_recipe(recipe), "completed", 1, in_effect,
                                                {"steps": 3, "tokens_per_second": 25.0}, extra))
        launch_summary.summarise(tmp_path)
        assert says in capsys.readouterr().out


def test_a_run_that_failed_before_its_strategy_took_effect_says_so(tmp_path, capsys):
    """The failed run's line read "world size 2 on 1 node(s) + LoRA adapters": no strategy, and no word why."""
    from dockyard.common.errors import DockyardError
    from dockyard.launch import summary as launch_summary

    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("lora"), "failed", 2, None, {}, {}))
    with contextlib.suppress(DockyardError):  # a failed run is an error, said after its line
        launch_summary.summarise(tmp_path)
    said = capsys.readouterr().out
    assert "world size 2 on 1 node(s) + LoRA adapters · stopped before its strategy took effect" in said, said


def test_a_stopped_run_reports_the_steps_it_trained_not_its_last_logged_one(tmp_path):
    """Interrupted after checkpoint-2 with logging every 5 steps: the manifest said "steps 1" (its last logged step)
    while the run said to continue from checkpoint-2. The Trainer's own count of the steps that ended is reported."""
    from types import SimpleNamespace

    from dockyard.train import ending
    from dockyard.train.callbacks import MetricsLog

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.268}\n')
    log = MetricsLog(tmp_path / "metrics.jsonl", True, 0.0, SimpleNamespace(value=0))
    args, control = SimpleNamespace(world_size=1, device="cpu"), SimpleNamespace(should_save=False,
                                                                                 should_evaluate=False)
    log.on_train_begin(args, SimpleNamespace(global_step=0), control)
    assert "steps" not in ending.measured_so_far(log), "no step ended: the last logged step stays the figure"
    for step in (1, 2):
        log.on_step_end(args, SimpleNamespace(global_step=step, max_steps=8), control)
    m = manifest.build(tmp_path, load_recipe("lora"), "failed", 1, None, ending.measured_so_far(log), {})
    assert (m["metrics"]["steps"], m["metrics"]["loss_last"]) == (2, 6.268)
    log.on_train_begin(args, SimpleNamespace(global_step=6), control)  # a resume from checkpoint-6, stopped at once
    assert ending.measured_so_far(log)["steps"] == 6
