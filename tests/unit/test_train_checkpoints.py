"""Checkpoint files are read as weights (issue 27): what the trainer's checkpoints hold loads, a pickle that runs
code is refused by name before it is loaded, and torch.load itself refuses it even where a caller asks for a full
unpickle (DeepSpeed's `weights_only=False`). Real torch.save files; the training runs: tests/integration."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import shlex
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.train import checkpoints, manifest


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _genuine(folder):
    """The kinds of objects the Trainer's and DeepSpeed's files hold (rng_state_N.pth, ZeRO optimizer states)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    folder.mkdir(parents=True)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               folder / "rng_state_0.pth")
    scalers = {"loss_scaler": LossScaler(1.0), "dynamic": DynamicLossScaler(2.0**16, 1000, 1.0, 2, False)}
    torch.save({"optimizer_state_dict": {**scalers, "zero_stage": ZeroStageEnum(2), "state": {0: torch.zeros(3)}}},
               folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    save_file({"w": torch.zeros(16)}, folder / "model.safetensors")


def test_what_the_trainer_and_deepspeed_save_passes_and_loads_as_weights(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    _genuine(tmp_path / "checkpoint-2")
    checkpoints.allow()
    checkpoints.check(tmp_path / "checkpoint-2")
    checkpoints.weights_only()
    state = torch.load(tmp_path / "checkpoint-2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    assert int(state["optimizer_state_dict"]["zero_stage"]) == 2
    assert torch.load(tmp_path / "checkpoint-2" / "rng_state_0.pth")["numpy"][0] == "MT19937"


@pytest.mark.parametrize("how", ["torch.save", "bare pickle", "nested"])
def test_a_planted_pickle_is_refused_by_name_and_never_runs(tmp_path, monkeypatch, how):
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    folder = tmp_path / "checkpoint-2"
    _genuine(folder)
    marker = tmp_path / "ran"
    target = folder / ("global_step2/mp_rank_00_model_states.pt" if how == "nested" else "rng_state_0.pth")
    target.parent.mkdir(exist_ok=True)
    if how == "bare pickle":
        target.write_bytes(pickle.dumps({"rng": Planted(marker)}))
    else:
        torch.save({"module": {"w": torch.zeros(2)}, "x": Planted(marker)}, target)
    checkpoints.allow()
    with pytest.raises(DockyardError, match=f"--resume refused: {target} holds"):
        checkpoints.check(folder)
    assert not marker.exists()


def test_torch_load_refuses_the_pickle_even_when_asked_for_a_full_unpickle(tmp_path, monkeypatch):
    """What DeepSpeed does on resume: torch.load(path, weights_only=False). The trainer's environment overrides it."""
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    marker = tmp_path / "ran"
    torch.save({"x": Planted(marker)}, tmp_path / "bad.pt")
    checkpoints.weights_only()
    with pytest.raises(pickle.UnpicklingError) as e:
        torch.load(tmp_path / "bad.pt", weights_only=False)
    assert not marker.exists()
    said = str(checkpoints.explain(e.value))
    assert "posix.system" in said and "\n" not in said


class _ByName:
    """What the image's Python writes for an enum member: getattr(Class, 'name') (protocol 2, as DeepSpeed saves)."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return (getattr, (self.cls, self.name))


def test_an_enum_member_pickled_by_name_loads_and_no_other_getattr_does(tmp_path):
    from deepspeed.runtime.zero.config import ZeroStageEnum

    checkpoints.allow()
    _genuine(tmp_path / "checkpoint-2")
    good, evil = tmp_path / "checkpoint-2" / "optim_states.pt", tmp_path / "evil.pt"
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "gradients")}, good, pickle_protocol=2)
    torch.save({"x": _ByName(np.ndarray, "tofile")}, evil, pickle_protocol=2)
    checkpoints.check(tmp_path / "checkpoint-2")  # a ZeRO checkpoint written by the image's Python is resumed
    assert torch.load(good, weights_only=True) == {"zero_stage": ZeroStageEnum.gradients}
    with pytest.raises(pickle.UnpicklingError, match="not a member of an enum the trainer allows"):
        torch.load(evil, weights_only=True)


def _run_with_checkpoints(run_dir, *steps, recipe="ddp"):
    """A run folder as a completed run leaves it: its manifest and complete checkpoints (what the Trainer writes)."""
    for step in steps:
        folder = run_dir / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        save_file({"w": torch.zeros(64)}, folder / "model.safetensors")
        torch.save({"state": {0: {"exp_avg": torch.zeros(64)}}}, folder / "optimizer.pt")
        torch.save({"cpu": torch.get_rng_state()}, folder / "rng_state.pth")
        manifest.mark_complete(folder, step)
    record = json.dumps({"run_id": run_dir.name, "recipe": recipe, "status": "completed", "metrics": {"steps": 12}})
    (run_dir / "manifest.json").write_text(record)
    return record


def _resume(run_dir, capsys, *overrides, recipe="ddp"):
    from dockyard.train.__main__ import main

    code = main(["--recipe", recipe, "--run-dir", str(run_dir), "--resume", "--", "--max_steps", "20", *overrides])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    return err


def _sparse(path, size):
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _sparse_header(path, size):
    """A safetensors file whose header length is the whole file: reading the header read all of it."""
    _sparse(path, size)
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", size - 8))


def _cut(path):
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


@pytest.mark.parametrize("damage,says", [
    (lambda ck: _cut(ck / "model.safetensors"), "model.safetensors: cut short"),
    (lambda ck: (ck / "trainer_state.json").write_text("{bad"), "trainer_state.json: not the Trainer's JSON"),
    (lambda ck: (ck / "trainer_state.json").write_text("{}"), "trainer_state.json: no global_step in it"),
    # the run took its step from the name (12 < max_steps 20: trains on), the Trainer from the state (1000: trained
    # nothing, and the run said "completed")
    (lambda ck: (ck / "trainer_state.json").write_text('{"global_step": 1000}'),
     "trainer_state.json: global_step 1000, where the checkpoint's name says 12"),
    # the thirteenth red-team pass: the Trainer loaded these as they were, and failed at its first log on every rank
    (lambda ck: (ck / "trainer_state.json").write_text('{"global_step": 12, "log_history": 5}'),
     "trainer_state.json: log_history is 5, where the Trainer writes a list"),
    (lambda ck: (ck / "trainer_state.json").write_text('{"global_step": 12, "log_history": [5]}'),
     "trainer_state.json: log_history holds entries that are not records of a step"),
    (lambda ck: (ck / "trainer_state.json").write_text('{"global_step": 12, "epoch": "1.5"}'),
     "trainer_state.json: epoch is \"1.5\", where the Trainer writes a number"),
    (lambda ck: _cut(ck / "optimizer.pt"), "optimizer.pt: not a whole torch.save file"),
    (lambda ck: (ck / "model.safetensors").unlink(), "model.safetensors: missing"),
    (lambda ck: (ck / "trainer_state.json").unlink(), "trainer_state.json: missing"),
    (lambda ck: (ck / "optimizer.pt").write_bytes(b""), "optimizer.pt: cut short: 0 bytes, not a torch.save file"),
    # sparse files of a GiB (no disk, any container can plant them): each was read whole, a GiB of memory or more
    (lambda ck: _sparse(ck / "trainer_state.json", 1 << 30),
     "trainer_state.json: not a plain file of at most 256 MiB"),
    (lambda ck: _sparse_header(ck / "extra.safetensors", 1 << 30),
     "extra.safetensors: not a safetensors file (its header says 1073741816 bytes; safetensors allows 100000000)"),
])
def test_a_damaged_checkpoint_is_named_with_the_one_to_resume_from_and_the_runs_record_stays(tmp_path, capsys,
                                                                                               damage, says):
    """A checkpoint cut short (a full disk, a copy) or missing a file was a traceback from safetensors, json, torch or
    the Trainer, and the refused resume replaced the completed run's manifest with `failed`."""
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 10, 12)
    damage(run_dir / "checkpoints" / "checkpoint-12")
    err = _resume(run_dir, capsys)
    assert f"error: checkpoint-12 is damaged ({says}" in err and "remove it to resume from checkpoint-10" in err, err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_damaged_only_checkpoint_says_to_start_again(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _run_with_checkpoints(run_dir, 12)
    _cut(run_dir / "checkpoints" / "checkpoint-12" / "model.safetensors")
    assert "it is the run's only complete checkpoint" in _resume(run_dir, capsys)


def test_a_resume_with_another_recipe_is_refused_naming_both(tmp_path, capsys):
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 12, recipe="zero2")
    err = _resume(run_dir, capsys, recipe="ddp")
    assert "error: --resume: " in err and "was trained with recipe zero2, not ddp: resume it with --recipe zero2" in err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_resume_that_would_change_the_shape_of_the_adapters_is_refused_and_the_record_stays(tmp_path, capsys):
    """Red-team pass: run.sh or a native run resumed with another lora_r failed in every rank's load_state_dict (a
    size-mismatch traceback); other lora_target_modules as a checkpoint "not written for this run, remove it"."""
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 12, recipe="lora")
    runfolder.save_overrides(run_dir, {"lora_target_modules": ["q_proj", "v_proj"]})
    err = _resume(run_dir, capsys, "--lora_r", "8", recipe="lora")
    assert "error: --lora_r 8: the run trained with lora_r 16, and its checkpoints hold tensors of that shape" in err
    err = _resume(run_dir, capsys, "--lora_target_modules", "all-linear", recipe="lora")
    assert "--lora_target_modules all-linear: the run trained with lora_target_modules q_proj,v_proj" in err, err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_resume_without_the_runs_own_model_and_data_is_refused_and_the_record_stays(tmp_path, capsys):
    """`invoke run --resume --run-id=X` of a run started with --model/--data continued from the tiny default model and
    the sample data: the checkpoint did not fit that model (a size-mismatch traceback from both ranks) and the
    completed run's manifest was rewritten as failed; a model of the same shape would have trained on other data."""
    data = tmp_path / "chat.jsonl"
    data.write_text('{"text": "my own data"}\n' * 8)
    run_dir = tmp_path / "run"
    _run_with_checkpoints(run_dir, 12)
    record = json.loads((run_dir / "manifest.json").read_text())
    record["inputs"] = manifest.inputs_record({"data": str(data)})
    (run_dir / "manifest.json").write_text(json.dumps(record))
    err = _resume(run_dir, capsys)
    assert f"error: --resume: run was trained with data {data}, not " in err and "sample.jsonl" in err, err
    assert "resume it with the --data it was started with" in err
    assert json.loads((run_dir / "manifest.json").read_text()) == record
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "other data"}\n' * 8)
    assert "was trained with data" in _resume(run_dir, capsys, "--data", str(other))
    with pytest.raises(DockyardError, match="trained with model the default, not "):
        manifest.check_same_inputs(run_dir, {"model": str(tmp_path), "data": str(data)})
    manifest.check_same_inputs(run_dir, {"model": "", "data": str(data), "eval_data": ""})  # its own: taken
    # the same path, other bytes or none there: said so ("trained with data X, not X" named one path twice)
    data.write_text('{"text": "edited since"}\n' * 8)
    with pytest.raises(DockyardError, match=f"trained with data {data}, which now holds other content: put back"):
        manifest.check_same_inputs(run_dir, {"model": "", "data": str(data)})
    data.unlink()
    with pytest.raises(DockyardError, match=f"trained with data {data}, which now cannot be read here: put back"):
        manifest.check_same_inputs(run_dir, {"model": "", "data": str(data)})


def test_a_resume_is_not_refused_for_a_hidden_file_beside_the_data_and_is_for_other_data(tmp_path):
    """A data folder's fingerprint held its hidden files, which the trainer never reads: a resume while vim had a.jsonl
    open (its .a.jsonl.swp in the folder), or of a model folder `hf download --local-dir` refreshed (its .cache/), was
    refused, "run was trained with data DIR, which now holds other content: put back what it trained on". The resume
    compares the files the trainer reads; another data file is still refused."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "my own data"}\n' * 8)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"status": "failed",
                                                       "inputs": manifest.inputs_record({"data": str(data)})}))
    (data / ".a.jsonl.swp").write_text("vim's swap file")
    (data / ".git").mkdir()
    (data / ".git" / "index").write_text("x" * 99)
    manifest.check_same_inputs(run_dir, {"data": str(data)})
    (data / "b.jsonl").write_text('{"text": "more"}\n')
    with pytest.raises(DockyardError, match=f"trained with data {data}, which now holds other content: put back"):
        manifest.check_same_inputs(run_dir, {"data": str(data)})


def test_a_resume_after_both_nodes_were_lost_is_held_against_the_record_node_1_left(tmp_path, capsys):
    """Both nodes of a run lost: node 1 failed and wrote its manifest-node1.json, node 0 went down without a record, so
    there is no manifest.json. The resume was held against no record at all: other data (or another recipe) trained on
    from the checkpoint without a word. Held against node 1's record now, as against a manifest.json of node 1's."""
    data = tmp_path / "chat.jsonl"
    data.write_text('{"text": "my own data"}\n' * 8)
    run_dir = tmp_path / "run"
    _run_with_checkpoints(run_dir, 12)
    record = json.loads((run_dir / "manifest.json").read_text())
    record |= {"status": "failed", "nodes": 2, "node_rank": 1, "error": "out of GPU memory at micro-batch 8",
               "inputs": manifest.inputs_record({"data": str(data)})}
    (run_dir / "manifest-node1.json").write_text(json.dumps(record))
    (run_dir / "manifest.json").unlink()
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "other data"}\n' * 8)
    err = _resume(run_dir, capsys, "--data", str(other))
    assert f"error: --resume: run was trained with data {data}, not {other}" in err, err
    with pytest.raises(DockyardError, match="was trained with recipe ddp, not zero2"):
        manifest.check_same_recipe(run_dir, "zero2")
    manifest.check_same_inputs(run_dir, {"model": "", "data": str(data), "eval_data": ""})  # its own: taken
    assert not (run_dir / "manifest.json").exists()  # a refused resume writes no record


def test_a_resume_reads_no_data_path_from_the_run_folder_without_the_manifests_record(tmp_path, capsys):
    """The fourth red-team pass: overrides.json naming another file, the manifest's `inputs` removed (anything that
    trained in the folder can write both): the resume trained on that file and reported completed."""
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"text": "not for this run"}\n' * 8)
    run_dir = tmp_path / "run"
    _run_with_checkpoints(run_dir, 12)
    record = json.loads((run_dir / "manifest.json").read_text())
    record.pop("inputs", None)
    (run_dir / "manifest.json").write_text(json.dumps(record))
    (run_dir / "overrides.json").write_text(json.dumps({"max_steps": 20, "data": str(secret)}))
    err = _resume(run_dir, capsys)
    assert f"overrides.json names data {secret}, and its manifest holds no record" in err, err
    with pytest.raises(DockyardError, match="give them again as the run was started"):
        manifest.check_same_inputs(run_dir, {"data": str(secret)}, from_saved=["data"])
    manifest.check_same_inputs(run_dir, {"data": str(secret)})  # given now, by the user: taken


def test_a_resume_already_at_max_steps_trains_nothing(tmp_path, capsys):
    """`--resume -- --max_steps 12` from checkpoint-12 trained step 13 and recorded 13 steps."""
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 12)
    err = _resume(run_dir, capsys, "--max_steps", "12")
    assert "error: already at max_steps 12 (checkpoint-12): raise it to train on (-- --max_steps N" in err
    assert (run_dir / "manifest.json").read_text() == record
    assert not (run_dir / "checkpoints" / "checkpoint-13").exists()
    (run_dir / "model").mkdir()  # its final model: where a completed run's weights are to be used from
    err = _resume(run_dir, capsys, "--max_steps", "12")
    assert (f"error: already at max_steps 12 (checkpoint-12), and completed: its model is in {run_dir / 'model'}: "
            "raise it to train on") in err
    assert "(from_pretrained reads them)" in err
    # a LoRA run's checkpoint holds its adapter, which from_pretrained alone does not load as a model
    (run_dir / "checkpoints" / "checkpoint-12" / "adapter_config.json").write_text("{}")
    with pytest.raises(DockyardError, match=r"\(an adapter: peft's PeftModel\.from_pretrained reads it onto the "
                                            r"base model\)$"):
        runfolder.check_steps_left(run_dir, 12, run_dir / "checkpoints" / "checkpoint-12", False)


def test_a_checkpoint_of_the_weights_alone_is_not_resumed_as_if_it_held_the_optimizer(tmp_path, capsys):
    """A run saved with save_only_model resumed with a fresh optimizer and its cosine schedule started over (learning
    rate 8.5e-4 at step 4 of 4), and said "completed"."""
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 4)
    for name in ("optimizer.pt", "rng_state.pth"):  # what the Trainer writes with save_only_model: the weights alone
        (run_dir / "checkpoints" / "checkpoint-4" / name).unlink()
    err = _resume(run_dir, capsys)
    assert "error: cannot resume from checkpoint-4: it holds the weights alone (saved with save_only_model)" in err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_checkpoint_folder_named_with_a_digit_int_cannot_read_is_no_checkpoint(tmp_path):
    """checkpoint-² (a digit to str.isdigit, not to int) made every resume, and the host's look at the run, a
    ValueError traceback."""
    from dockyard.common import runfolder

    _run_with_checkpoints(tmp_path / "run", 4)
    (tmp_path / "run" / "checkpoints" / "checkpoint-²").mkdir()
    assert [p.name for p in runfolder.checkpoints_started(tmp_path / "run")] == ["checkpoint-4"]


def test_a_second_resume_of_a_run_at_once_is_refused_and_its_record_stays(tmp_path, capsys):
    """The same resume started twice (two terminals, a script run again): both trained, into the same checkpoints,
    metrics (steps 1, 4, 5, 5, 10, 10) and model. The first holds the run's lock (here: the test holds it)."""
    import fcntl

    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 4)
    with open(run_dir / ".resume.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        err = _resume(run_dir, capsys)
    assert "error: run run is being trained by another process now (it holds " in err, err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_runs_folder_that_takes_no_locks_trains_unguarded_not_refused(tmp_path, monkeypatch):
    """Every run now holds its folder's lock while it trains; on a file system without locks (NFS without its lock
    service: flock fails with ENOLCK) that was an OSError traceback before the first step. Such a folder trains as it
    did before there was a lock, and `invoke run --resume` does not refuse it."""
    import errno
    import fcntl

    from dockyard.common import runfolder

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert runfolder.hold(tmp_path) is None
    runfolder.check_idle(tmp_path)  # refuses nothing


def test_a_resume_refused_for_a_setting_the_run_saved_says_where_it_comes_from(tmp_path, capsys):
    """A run started with a setting since refused: its --resume named the setting, not that it came from the run's
    own overrides.json, nor how to change it."""
    run_dir = tmp_path / "run"
    record = _run_with_checkpoints(run_dir, 4)
    (run_dir / "overrides.json").write_text(json.dumps({"optim": "sgdx"}))
    err = _resume(run_dir, capsys)
    assert "error: optim 'sgdx': did you mean sgd? " in err, err
    assert "(the run's own settings, from its overrides.json: --optim sgdx; give one again after -- to change it)" \
        in err
    assert (run_dir / "manifest.json").read_text() == record


def test_a_resumed_run_that_trains_no_longer_says_it_completed_until_it_records_its_end(tmp_path, monkeypatch):
    """A completed run resumed to train on, then killed (out of memory, SIGKILL: nothing can record that), kept its
    manifest "completed" beside the old model/, which `invoke export` would then hand on as the run's. From its first
    step the resumed attempt's manifest says it has not recorded its end; finish() replaces it."""
    import argparse
    from types import SimpleNamespace

    from dockyard.common.recipes import load_recipe
    from dockyard.train import __main__ as trainer
    from dockyard.train.record import Run

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    recipe = load_recipe("ddp")
    manifest.write(tmp_path, manifest.build(tmp_path, recipe, "completed", 1, None, {"steps": 2}, {}))
    run = Run(argparse.Namespace(run_dir=tmp_path), 0.0, is_main=True, run_dir_ok=True, manifest_found=True,
              recipe=recipe)
    trainer.began(run, SimpleNamespace(resume_from=str(tmp_path / "checkpoints" / "checkpoint-2")))
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("resumed from step 2, then stopped without a record")


def test_a_resume_given_another_max_steps_says_the_schedule_is_worked_out_again(tmp_path, caplog):
    """A run of 3000 steps stopped at 215 and resumed with --max_steps 220: its cosine rate went from 9.9e-4 to
    1.3e-5 in one step, and the resume said nothing of it. The run's total is its checkpoint's own (defaults.yaml
    may have changed since): what checkpoints.check read of its trainer_state.json."""
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings
    from dockyard.train.opening import rescheduled

    _genuine(tmp_path / "checkpoint-215")
    (tmp_path / "checkpoint-215" / "trainer_state.json").write_text(json.dumps({"global_step": 215, "max_steps": 3000}))
    checkpoints.allow()
    before = checkpoints.check(tmp_path / "checkpoint-215")["max_steps"]
    recipe = load_recipe("ddp")
    caplog.set_level("WARNING", logger="dockyard.train")
    rescheduled(before, resolve_settings(recipe, {"max_steps": 220})[1], 215)
    assert ("--resume: max_steps 220, where the run was started with 3000: its cosine learning-rate schedule is "
            "worked out again over 220 steps, so the rate changes at once from step 216 (resume with max_steps 3000 to "
            "keep the schedule it had)") in caplog.text
    caplog.clear()
    # a finished run trained on: its schedule had ended, nothing to keep
    rescheduled(3000, resolve_settings(recipe, {"max_steps": 5000})[1], 3000)
    assert "from step 3001 (its schedule ended at step 3000: training on takes the new one from step 3001)" in caplog.text
    caplog.clear()
    rescheduled(before, resolve_settings(recipe, {"max_steps": 3000})[1], 215)  # the same total
    for schedule in ("constant", "inverse_sqrt"):  # a rate that does not follow the total
        rescheduled(before, resolve_settings(recipe, {"max_steps": 220, "lr_scheduler_type": schedule})[1], 215)
    rescheduled(None, resolve_settings(recipe, {"max_steps": 220})[1], 215)  # a state of no max_steps
    assert caplog.text == ""


@pytest.mark.parametrize("wrapped", [False, True], ids=["torch", "accelerate-wrapped (DeepSpeed)"])
@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_a_resumes_first_step_trains_at_the_rate_of_the_schedule_it_now_has(wrapped, schedule):
    """A run of 4 steps resumed with --max_steps 6 trained step 5 at the old schedule's rate: 0, where it had
    ended (the Trainer loads the checkpoint's optimizer, whose rate the old schedule set, and the new scheduler
    sets one only after step 5). The Trainer's own load, done by hand: both states saved at step 4, loaded into an
    optimizer and scheduler made for 6 steps. A rate that does not follow the total stays as it was."""
    from types import SimpleNamespace

    import torch
    from transformers import get_scheduler

    from dockyard.train.callbacks import ResumedRate

    def made(total):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        return opt, get_scheduler(schedule, opt, num_warmup_steps=0, num_training_steps=total)

    opt, sched = made(4)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = opt.state_dict(), sched.state_dict()
    opt, sched = made(6)
    opt.load_state_dict(saved[0])
    sched.load_state_dict(saved[1])
    ResumedRate().on_train_begin(None, SimpleNamespace(global_step=4), None,
                                 lr_scheduler=SimpleNamespace(scheduler=sched) if wrapped else sched)
    fresh_opt, fresh = made(6)
    for _ in range(4):
        fresh_opt.step()
        fresh.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(fresh_opt.param_groups[0]["lr"])
    assert sched.get_last_lr() == pytest.approx(fresh.get_last_lr())
    if schedule == "cosine":
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 4 / 6)))


def test_a_resume_on_another_number_of_processes_trains_over_the_runs_own_global_batch(tmp_path):
    """A ddp run of 2 processes (global batch auto: 8 each, 16) resumed with --nproc=1 trained over 8 examples a
    step, said nowhere, and skipped batches of 8 to find its place. The batch the run resolved is kept with its
    settings, so the resume on 1 process accumulates 2 micro-batches of 8: 16 again. A global batch given is kept
    as given, and one given with the resume takes its place."""
    from types import SimpleNamespace

    from dockyard.common.batch import batch_split
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import blame_kept, resolve_settings, resumed_with
    from dockyard.train.__main__ import kept_for_resume

    recipe = load_recipe("ddp")
    first = SimpleNamespace(overrides={"max_steps": 2},
                            record=SimpleNamespace(settings_resolved={"global_batch": {"value": 16, "why": "auto"}}))
    runfolder.save_overrides(tmp_path, kept_for_resume(first))
    merged, kept, _ = resumed_with(recipe, runfolder.saved_overrides(tmp_path), {"max_steps": 4})
    settings, training = resolve_settings(recipe, merged)
    batch = batch_split(settings.global_batch, "auto", "auto", 1)
    assert (batch.global_batch, batch.per_process, kept) == (16, 16, {"global_batch": 16})
    assert resumed_with(recipe, runfolder.saved_overrides(tmp_path), {"global_batch": 8})[0]["global_batch"] == 8
    given = SimpleNamespace(overrides={"global_batch": 32}, record=first.record)
    assert kept_for_resume(given)["global_batch"] == 32
    # a micro-batch and accumulation of the run's own that cannot make its batch on 1 process: said as kept, and how
    # to work the batch out again
    fixed = SimpleNamespace(overrides={"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
                            record=first.record)
    runfolder.save_overrides(tmp_path, kept_for_resume(fixed))
    merged, kept, _ = resumed_with(recipe, runfolder.saved_overrides(tmp_path), {})
    with pytest.raises(DockyardError) as refused:
        try:
            batch_split(resolve_settings(recipe, merged)[0].global_batch, 4, 2, 1)
        except DockyardError as e:
            raise blame_kept(e, kept) from None
    assert "--global_batch 16" in str(refused.value) and "-- --global_batch auto works it out again" in str(
        refused.value)
    merged, _, _ = resumed_with(recipe, runfolder.saved_overrides(tmp_path), {"global_batch": "auto"})
    settings, _ = resolve_settings(recipe, merged)
    assert batch_split(settings.global_batch, 4, 2, 1).global_batch == 8
