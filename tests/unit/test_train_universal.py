"""A ZeRO checkpoint resumed on another number of processes is loaded in DeepSpeed's universal form: when that is
needed, when it is refused and why, and that rank 0 makes it once, beside the original, which stays as it was. The
folders here hold empty stand-ins for ZeRO's files and DeepSpeed's converter is stood in for; the real conversion and
the resume it makes possible: tests/integration/test_resume_universal.py."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES, load_recipe
from dockyard.train import universal


def _checkpoint(tmp_path, ranks, prefix=""):
    """checkpoints/checkpoint-2 as DeepSpeed leaves it: global_step2 with a part of the optimizer's state per rank."""
    step = tmp_path / "run" / "checkpoints" / "checkpoint-2" / "global_step2"
    step.mkdir(parents=True)
    (step.parent / "latest").write_text("global_step2")
    (step / "mp_rank_00_model_states.pt").write_bytes(b"model")
    for r in ranks:
        (step / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"part %d" % r)
    return step.parent


def _recipe(tmp_path, name="zero2", peft="", checkpoint=""):
    """A recipe folder of the user's: the shipped one, with LoRA or a DeepSpeed `checkpoint` section added."""
    folder = tmp_path / f"my-{name}"
    shutil.copytree(RECIPES / name, folder)
    if peft:
        (folder / "recipe.yaml").write_text((folder / "recipe.yaml").read_text() + f"peft: {peft}\n")
    if checkpoint:
        config = (folder / "ds_config.json").read_text()
        (folder / "ds_config.json").write_text(config.replace("{", '{"checkpoint": ' + checkpoint + ",", 1))
    return load_recipe(folder)


@pytest.mark.parametrize("ranks, world, prefix, saved_by", [
    ([0, 1], 1, "", 2),           # preempted on 2, resumed on 1
    ([0], 2, "", 1),              # and the other way
    ([0, 1, 2, 3], 2, "bf16_", 4),  # bf16's optimizer names its files so
    ([0, 1], 2, "", None),        # as many: loaded as it is
    ([], 3, "", None),            # no ZeRO parts (a stage-0 config)
])
def test_the_universal_form_is_needed_where_another_number_of_processes_resumes(tmp_path, monkeypatch, ranks, world,
                                                                              prefix, saved_by):
    from deepspeed.checkpoint import ds_to_universal

    checkpoint = _checkpoint(tmp_path, ranks, prefix)
    reshard = universal.needed(checkpoint, world, load_recipe("zero2"))
    if saved_by is None:
        assert reshard is None
        return
    if saved_by == 1:  # said of one process as of one
        monkeypatch.setattr(ds_to_universal, "main", StandIn())
        assert universal.ready(reshard, writer=True, recipe=load_recipe("zero2")).startswith(
            "checkpoint-2 was saved by 1 process; converted to DeepSpeed's universal form for 2 ")
    assert (reshard.saved_by, reshard.world, reshard.source) == (saved_by, world, checkpoint / "global_step2")
    assert reshard.folder == checkpoint / "global_step2_universal"
    assert universal.needed(checkpoint, world, load_recipe("ddp")) is None  # DeepSpeed's files, of no ddp run's


@pytest.mark.parametrize("case", ["a part missing", "node-local storage", "node-local storage, LoRA"])
def test_a_checkpoint_no_universal_form_can_be_made_of_is_refused_with_the_reason_and_the_ways_out(tmp_path, case):
    """Refused before the model loads, as every resume on another number was (DeepSpeed's ZeRORuntimeException came
    on every rank once the model had loaded), now saying why the conversion cannot help."""
    checkpoint = _checkpoint(tmp_path, [0, 2] if case == "a part missing" else [0, 1])
    recipe = (load_recipe("zero2") if case == "a part missing" else
              _recipe(tmp_path, peft="lora" if "LoRA" in case else "", checkpoint='{"use_node_local_storage": true}'))
    with pytest.raises(DockyardError) as refused:
        universal.needed(checkpoint, 1, recipe)
    said, saved_by = str(refused.value), 3 if case == "a part missing" else 2
    assert said.startswith(f"cannot resume from checkpoint-2 with 1 process(es): it was saved by {saved_by}, and ZeRO "
                           "split the optimizer's state over them; DeepSpeed's universal form, which loads on any "
                           "number, cannot be made of it: "), said
    assert f"Resume on {saved_by} (--nproc={saved_by}, or as many GPUs)" in said
    why = ("global_step2 lacks the part of process(es) 1 (it holds 2 of 3)" if case == "a part missing" else
           "keeps each node's part on the node (checkpoint.use_node_local_storage)")
    assert why in said
    # a full fine-tune's checkpoint holds the weights a new run can start from; an adapter's does not
    assert ("--model with the folder run/checkpoints/checkpoint-2" in said) == ("LoRA" not in case)


class StandIn:
    """ds_to_universal.main as far as the trainer sees it: the form's folder, and latest_universal beside it."""

    def __init__(self, fails=False):
        self.calls, self.fails = 0, fails

    def __call__(self, args):
        self.calls += 1
        out = os.path.join(args.output_folder, "zero", "lm_head.weight")
        os.makedirs(out)
        with open(os.path.join(out, "fp32.pt"), "wb") as f:
            f.write(b"half a tens")
        if self.fails:
            raise AssertionError("Required universal_checkpoint_info state is missing in checkpoint.")
        with open(os.path.join(os.path.dirname(args.output_folder), "latest_universal"), "w") as f:
            f.write(os.path.basename(args.output_folder))


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rank_0_converts_once_beside_the_original_and_a_later_attempt_loads_what_it_made(tmp_path, monkeypatch):
    from deepspeed.checkpoint import ds_to_universal

    checkpoint = _checkpoint(tmp_path, [0, 1])
    original = _files(checkpoint)
    convert = StandIn()
    monkeypatch.setattr(ds_to_universal, "main", convert)
    reshard = universal.needed(checkpoint, 1, load_recipe("zero2"))
    said = universal.ready(reshard, writer=True, recipe=load_recipe("zero2"))
    assert said.startswith("checkpoint-2 was saved by 2 processes; converted to DeepSpeed's universal form for 1 (into "
                           "checkpoint-2/global_step2_universal in "), said
    assert (checkpoint / "latest_universal").read_text() == "global_step2_universal"
    assert (checkpoint / "global_step2_universal" / "zero" / "lm_head.weight" / "fp32.pt").is_file()
    now = _files(checkpoint)
    assert {k: v for k, v in now.items() if k in original} == original  # the original, as it was: only added to
    assert not (checkpoint.parent / universal.SCRATCH).exists()

    # a resume after this one failed (out of memory at its first step, say) loads the same form, on any number
    again = universal.needed(checkpoint, 3, load_recipe("zero2"))
    assert universal.ready(again, writer=True, recipe=load_recipe("zero2")) == (
        "checkpoint-2 was saved by 2 processes; loading on 3 the universal form an earlier resume converted it to "
        "(checkpoint-2/global_step2_universal)")
    assert universal.ready(again, writer=False, recipe=load_recipe("zero2")) == ""  # the others say nothing
    assert convert.calls == 1

    # the checkpoint saved again (a resume of an earlier one retraining this step): its files changed, converted again
    part = checkpoint / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    part.write_bytes(b"part 1, saved again")
    assert "converted to DeepSpeed's universal form" in universal.ready(again, writer=True, recipe=load_recipe("zero2"))
    assert convert.calls == 2


def test_the_other_ranks_wait_for_rank_0s_conversion(tmp_path, monkeypatch):
    from deepspeed.checkpoint import ds_to_universal

    monkeypatch.setattr(ds_to_universal, "main", StandIn())
    monkeypatch.setattr(universal, "WAIT_S", 0.01)
    reshard = universal.needed(_checkpoint(tmp_path, [0, 1]), 1, load_recipe("zero2"))
    other = threading.Thread(target=universal.ready, args=(reshard, False, load_recipe("zero2")), daemon=True)
    other.start()
    other.join(0.3)
    assert other.is_alive()  # nothing made yet: it waits
    universal.ready(reshard, writer=True, recipe=load_recipe("zero2"))
    other.join(5)
    assert not other.is_alive()


@pytest.mark.parametrize("how", ["DeepSpeed fails", "no room", "cut short before"])
def test_a_conversion_that_cannot_finish_leaves_nothing_a_resume_would_load(tmp_path, monkeypatch, how):
    """Refused with DeepSpeed's reason (or the disk's), the resume's ways out with it; nothing of the attempt left in
    the checkpoint (a half-written form would be loaded, or refused as damaged, by the next resume)."""
    from deepspeed.checkpoint import ds_to_universal

    checkpoint = _checkpoint(tmp_path, [0, 1])
    original = _files(checkpoint)
    convert = StandIn(fails=how != "cut short before")
    monkeypatch.setattr(ds_to_universal, "main", convert)
    if how == "no room":
        monkeypatch.setattr(universal.disk, "free_bytes", lambda folder: 10)
    if how == "cut short before":  # a conversion killed midway (Ctrl-C, out of memory) leaves its scratch folder
        (checkpoint.parent / universal.SCRATCH / "global_step2_universal" / "zero").mkdir(parents=True)
    reshard = universal.needed(checkpoint, 1, load_recipe("zero2"))
    if how == "cut short before":
        assert "converted" in universal.ready(reshard, writer=True, recipe=load_recipe("zero2"))
        assert not (checkpoint.parent / universal.SCRATCH).exists()
        return
    with pytest.raises(DockyardError) as refused:
        universal.ready(reshard, writer=True, recipe=load_recipe("zero2"))
    said = str(refused.value)
    assert said.startswith("cannot resume from checkpoint-2 with 1 process(es): it was saved by 2"), said
    assert ("DeepSpeed's conversion failed (AssertionError: Required universal_checkpoint_info state is missing"
            if how == "DeepSpeed fails" else "converting it takes about") in said
    assert "Resume on 2 (--nproc=2, or as many GPUs)" in said
    assert _files(checkpoint) == original and not (checkpoint.parent / universal.SCRATCH).exists()
    assert convert.calls == (how == "DeepSpeed fails")


def test_a_part_named_for_a_process_far_past_the_others_is_refused_in_a_line_of_its_own_size(tmp_path):
    """A file named zero_pp_rank_999999 (planted, or left by a run on far more processes) makes the checkpoint one of
    a million processes, 999,997 of them missing: the refusal names a few and counts the rest (it listed them all,
    7.9 MB in one line, on the console and in the run's manifest)."""
    checkpoint = _checkpoint(tmp_path, [0, 1, 999999])
    with pytest.raises(DockyardError) as refused:
        universal.needed(checkpoint, 1, load_recipe("zero2"))
    said = str(refused.value)
    assert len(said) < 1000, said[:1000]
    assert ("global_step2 lacks the part of process(es) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 999,987 more (it holds 3 "
            "of 1000000)") in said


@pytest.mark.timeout(60)  # unfixed, a fifo held rank 0 and every other rank for ever
@pytest.mark.parametrize("planted", ["nested", "huge", "fifo", "a link"])
def test_a_record_of_the_form_that_is_not_one_rank_0_wrote_is_converted_again_not_a_traceback(tmp_path, monkeypatch,
                                                                                             planted):
    """converted.json and latest_universal are read as what they are, untrusted files of the runs folder: JSON nested
    past the recursion limit (a RecursionError traceback on every rank), a file of gigabytes (read whole, by every
    waiting rank, twice a second), a fifo (a waiting rank blocked on it) or a link are no record of a conversion: rank 0
    makes the form again and the other ranks wait for that."""
    from deepspeed.checkpoint import ds_to_universal

    convert = StandIn()
    monkeypatch.setattr(ds_to_universal, "main", convert)
    monkeypatch.setattr(universal, "WAIT_S", 0.01)
    reshard = universal.needed(_checkpoint(tmp_path, [0, 1]), 1, load_recipe("zero2"))
    reshard.folder.mkdir()
    (reshard.checkpoint / "latest_universal").write_text(reshard.folder.name)
    record = reshard.folder / "converted.json"
    outside = tmp_path / "made-elsewhere.json"
    outside.write_text(json.dumps(universal.made_from(reshard)))
    if planted == "nested":
        record.write_text("[" * 100_000)
    elif planted == "huge":
        with open(record, "wb") as f:
            f.truncate(universal.RECORD_LIMIT + 1)  # sparse: nothing is written to the disk
    elif planted == "fifo":
        os.mkfifo(record)
    else:
        record.symlink_to(outside)
    other = threading.Thread(target=universal.ready, args=(reshard, False, load_recipe("zero2")), daemon=True)
    other.start()
    other.join(0.3)
    assert other.is_alive()  # no form made yet: it waits, reading no more than a record's size
    assert "converted to DeepSpeed's universal form" in universal.ready(reshard, writer=True,
                                                                        recipe=load_recipe("zero2"))
    other.join(5)
    assert not other.is_alive() and convert.calls == 1
    assert not record.is_symlink() and json.loads(outside.read_text()) == universal.made_from(reshard)


@pytest.mark.parametrize("planted", ["scratch link", "scratch file", "form file", "form link"])
def test_what_lies_where_the_conversion_writes_is_replaced_never_written_through(tmp_path, monkeypatch, planted):
    """The scratch folder (checkpoints/.universal-partial) and the form's folder, found as a link (planted once the
    run folder was checked) or a file: ds_to_universal wrote its whole output through the link, out of the runs
    folder, and left latest_universal there; a file made DeepSpeed's conversion "fail" on every resume after."""
    from deepspeed.checkpoint import ds_to_universal

    monkeypatch.setattr(ds_to_universal, "main", StandIn())
    checkpoint = _checkpoint(tmp_path, [0, 1])
    outside = tmp_path / "outside"
    outside.mkdir()
    where = checkpoint.parent / universal.SCRATCH if planted.startswith("scratch") else checkpoint / "global_step2_universal"
    if planted.endswith("link"):
        where.symlink_to(outside, target_is_directory=True)
    else:
        where.write_text("not a folder")
    reshard = universal.needed(checkpoint, 1, load_recipe("zero2"))
    assert "converted to DeepSpeed's universal form" in universal.ready(reshard, writer=True,
                                                                        recipe=load_recipe("zero2"))
    assert list(outside.iterdir()) == []
    assert (checkpoint / "global_step2_universal" / "zero" / "lm_head.weight" / "fp32.pt").is_file()
    assert not (checkpoint / "global_step2_universal").is_symlink()
    assert not os.path.lexists(checkpoint.parent / universal.SCRATCH)
