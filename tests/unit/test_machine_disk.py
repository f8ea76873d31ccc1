"""What a run writes, as `invoke plan` shows it and `invoke run` checks the runs folder for (dockyard.common.disk)."""

from __future__ import annotations

import json

import pytest

from dockyard.common import disk, memory
from dockyard.common.errors import DockyardError, causes
from dockyard.common.recipes import load_recipe
from dockyard.common.units import GIB
from dockyard.machine import planner

GB = 1_000_000_000


def test_the_plan_says_what_each_recipe_writes():
    rows = {r["recipe"]: r for r in planner.plan(memory.shape_from_count(GB), gpus=1, gpu_mem=80 * GIB,
                                              cpu_mem=64 * GIB, seq_len=2048)["recipes"]}
    # full fine-tuning: fp32 weights (4 bytes) and AdamW's two moments (8) per parameter; defaults.yaml's
    # save_total_limit 2 kept, and in a run longer than the default 50 steps a third while the next is written (the
    # plan counted the default's two, 28 GB, below what a real run needs at its peak)
    ddp = rows["ddp"]
    assert ddp["checkpoint_bytes"] == 12 * GB and ddp["checkpoints_kept"] == 2 and ddp["checkpoints_at_peak"] == 3
    assert ddp["disk_bytes"] == 3 * 12 * GB
    # ZeRO-2 on a GPU: the bf16 module twice (the Trainer's model file, DeepSpeed's model states) and fp32
    # master weights plus moments: 2 + 2 + 12 bytes per parameter; ZeRO-3 has no whole-module copy
    assert rows["zero2"]["checkpoint_bytes"] == 16 * GB and rows["zero3"]["checkpoint_bytes"] == 14 * GB
    assert rows["lora"]["disk_bytes"] < ddp["disk_bytes"] / 50  # adapters alone


@pytest.mark.parametrize("steps, every, limit, expected", [
    (50, 25, 2, (2, 2)),        # saves at 25 and 50
    (100, 10, 2, (2, 3)),       # ten saves, two kept, a third while the next is written
    (100, 10, None, (10, 10)),  # no limit: all of them
    (100, 0.5, 5, (2, 2)),      # a fraction of the run
    (-1, 500, 3, (3, 4)),       # epochs: what the limit keeps
])
def test_checkpoints_on_disk(steps, every, limit, expected):
    assert disk.checkpoints_written(max_steps=steps, save_steps=every, save_strategy="steps",
                                    save_total_limit=limit) == expected
    assert disk.checkpoints_written(max_steps=steps, save_steps=every, save_strategy="SaveStrategy.NO",
                                    save_total_limit=limit) == (0, 0)


def test_a_model_only_checkpoint_leaves_the_optimizer_out():
    shape = memory.shape_from_count(GB)
    full = disk.run_bytes(shape, strategy="ddp", peft=None, dtype="auto", half_on_gpu=True, optimizer=True,
                          max_steps=10, save_steps=10, save_strategy="steps", save_total_limit=1)
    lean = disk.run_bytes(shape, strategy="ddp", peft=None, dtype="bfloat16", half_on_gpu=True, optimizer=False,
                          max_steps=10, save_steps=10, save_strategy="steps", save_total_limit=1)
    assert (full["total_bytes"], lean["total_bytes"]) == (16 * GB, 4 * GB)


def test_invoke_run_counts_its_own_runs_checkpoints():
    """The plan counts a long run's peak; a run checks for what it will write with its own steps."""
    from dockyard.common.run_settings import resolve_settings

    shape, recipe = memory.shape_from_count(GB), load_recipe("ddp")
    # (settings, checkpoints at the peak, GB on disk at the peak: the larger of those and the kept ones + the model)
    for given, peak, total in (({}, 2, 2 * 12 + 4), ({"max_steps": 1000}, 3, 3 * 12),
                               ({"max_steps": 1000, "save_total_limit": 4}, 5, 5 * 12)):
        run_settings, training = resolve_settings(recipe, given)
        need = disk.for_settings(shape, recipe, run_settings, training, half_on_gpu=True)
        assert (need["checkpoints_at_peak"], need["total_bytes"]) == (peak, total * GB), given
        assert not need["unbounded"]
    # by epochs, keeping every checkpoint: said as a lower bound with the way to bound it (it read "1 checkpoint")
    run_settings, training = resolve_settings(recipe, {"max_steps": -1, "num_train_epochs": 100, "save_total_limit": 0})
    need = disk.for_settings(shape, recipe, run_settings, training, half_on_gpu=True)
    assert need["unbounded"] and disk.describe(need).startswith("at least: one checkpoint of 11.2 GiB every save_steps, "
                                                                "every one kept") and "--save_total_limit N" in \
        disk.describe(need)


def test_no_room_is_refused_with_the_ways_out(tmp_path, monkeypatch):
    need = disk.for_recipe(memory.shape_from_count(GB), load_recipe("zero2"))
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 10 * GIB)
    with pytest.raises(DockyardError) as e:
        disk.check_room(tmp_path / "runs", need)
    text = str(e.value)
    assert f"writes about {disk.size(need['total_bytes'])}" in text and "10.0 GiB is free" in text
    assert "--save_total_limit 1" in text and "save_only_model" in text and "runs_dir" in text
    disk.check_room(tmp_path / "runs", need, already=need["total_bytes"])  # a resumed run holds it already


def test_a_full_disk_is_told_from_another_failure(tmp_path, monkeypatch):
    enospc = OSError(28, "No space left on device")
    assert disk.disk_full(enospc, tmp_path)
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 100 * GB)
    assert not disk.disk_full(RuntimeError("CUDA out of memory. Tried to allocate"), tmp_path)
    # torch.save says only that writing failed: the disk's free space tells
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 4096)
    err = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0. PytorchStreamWriter failed")
    assert disk.disk_full(err, tmp_path)
    text = disk.full_message(err, tmp_path, None)
    assert text.endswith("The error: RuntimeError: " + str(err))  # whole, not cut at its first dot


def test_a_full_disk_under_a_librarys_own_error_is_told(tmp_path, monkeypatch):
    """`datasets` raises its DatasetGenerationError from the OSError of a full disk, with its own words only; on a
    disk with room again (it removed its partial copy) the free space alone would not tell."""
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 100 * GB)

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except Exception as e:
                raise RuntimeError("An error occurred while generating the dataset") from e
        except RuntimeError as outer:
            return outer

    full = wrapped(OSError(28, "No space left on device"))
    assert disk.disk_full(full, tmp_path)
    assert causes(full)[-1].errno == 28
    assert not disk.disk_full(wrapped(OSError(13, "Permission denied")), tmp_path)
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 4096)  # a bad file on a disk nearly full is the file's
    assert not disk.disk_full(wrapped(ValueError("JSON parse error")), tmp_path, by_free_space=False)


def test_a_resume_is_sized_with_the_runs_own_settings(settings, tmp_path):
    """`--resume` was sized with the recipe's defaults: a run started with `--max_steps 400 --save_steps 50` keeps
    one more checkpoint while the next is written, which the check left out (on a large model, the one that fills
    the disk). The trainer continues with the run's overrides.json, and the host sizes what it will write so."""
    from dockyard.launch import preflight

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    ddp = load_recipe("ddp")

    def need(resume: bool, overrides: tuple[str, ...] = (), run=run_dir) -> dict:
        sized = preflight.sized_run(settings, ddp, list(overrides), model="", run_dir=run, resume=resume)
        return preflight.check_runs_disk(ddp, sized, run_dir=run, gpu=False, resume=resume)

    (run_dir / "overrides.json").write_text(json.dumps({"max_steps": 400, "save_steps": 50, "data": "/x/y"}))
    fresh = need(False, ("--max_steps", "400", "--save_steps", "50"), tmp_path / "r2")
    assert need(resume=True)["total_bytes"] == fresh["total_bytes"] > need(resume=False)["total_bytes"]
    (run_dir / "overrides.json").write_text("[1, 2]")  # not the trainer's: refused by the settings' check, not here
    assert need(resume=True) is None and need(resume=False)["total_bytes"] < fresh["total_bytes"]


def test_save_strategy_no_as_typed_writes_no_checkpoint(settings, tmp_path):
    """`-- --save_strategy no` is YAML's false: the host sized the run's checkpoints all the same (two of 54 GiB for
    a 2.8B model under zero2) and refused it for the disk, where the trainer, which reads false as "no", saves none."""
    from dockyard.launch import preflight

    zero2 = load_recipe("zero2")

    def need(*overrides: str) -> dict:
        sized = preflight.sized_run(settings, zero2, list(overrides), model="", run_dir=tmp_path / "r", resume=False)
        return disk.for_settings(sized.shape, zero2, sized.settings, sized.training, half_on_gpu=True)

    assert need("--save_strategy", "no")["checkpoints"] == 0 < need()["checkpoints"]


def test_a_resume_of_a_hub_id_run_is_sized_by_that_model(settings, tmp_path):
    """A resume drops the run's own input paths (the container's), and was then sized as the sample model: a run of
    a hub model, which a resume reads again from the cache, passed the disk and fit checks whatever it was."""
    from dockyard import ROOT
    from dockyard.launch import preflight

    snapshot = tmp_path / "hf" / "hub" / "models--org--llama8" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b" /
                                           "config.json").read_text())
    s = settings.model_copy(update={"hf_cache": tmp_path / "hf"})
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "overrides.json").write_text(json.dumps({"model": "org/llama8", "max_steps": 10}))
    shape, _, training, model = preflight.sized_run(s, load_recipe("lora"), [], model="", run_dir=run_dir, resume=True)
    assert model == "org/llama8"  # as a refusal's `invoke plan --model=...` names it
    assert shape.params == memory.shape_from_folder(snapshot).params > 8e9
    assert training["max_steps"] == 10
