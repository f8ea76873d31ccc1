"""The trainer's entry point in one process, without torchrun: the TrainingArguments it builds per recipe."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest

from dockyard.common import autos
from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.train.arguments import training_arguments


@pytest.fixture(autouse=True)
def fresh_signal_state(monkeypatch):
    """The trainer's once-per-process events (a SIGTERM came; the manifest is written) as a new process has them:
    a test that ran main() or _stopped before must not change what another sees."""
    import threading

    from dockyard.train import ending

    monkeypatch.setattr(ending, "_signalled", threading.Event())
    monkeypatch.setattr(ending, "_recorded", threading.Event())


def cpu_arguments(name: str, given: dict, run_dir, checked: bool = True):
    """TrainingArguments as the trainer builds them on CPU: settings checked (`checked`: as the trainer checks them
    first), then the autos resolved, then the arguments."""
    from dockyard.train.opening import checked_settings

    recipe = load_recipe(name)
    settings, overrides = (checked_settings if checked else resolve_settings)(recipe, given)
    resolved = autos.resolve(recipe, settings, overrides, world_size=1, gpus_per_node=1, device=None, shape=None,
                              kind="", liger=())
    return training_arguments(recipe, settings, resolved.overrides, run_dir)


@pytest.mark.parametrize("name", ["lora", "qlora"])
def test_adapters_train_with_non_reentrant_checkpointing_and_no_unused_parameter_search(tmp_path, name):
    """Reentrant checkpointing under DDP marks the adapter weights ready twice and the run dies at step 1:
    the arguments the trainer really hands the HF Trainer must carry the fix."""
    args = cpu_arguments(name, {}, tmp_path)
    assert args.gradient_checkpointing is True  # auto on CPU: on for the adapter recipes, as they always were
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert args.ddp_find_unused_parameters is False


def test_full_fine_tuning_does_not_search_for_unused_parameters(tmp_path):
    args = cpu_arguments("ddp", {"gradient_checkpointing": True}, tmp_path)
    assert args.gradient_checkpointing is True and args.ddp_find_unused_parameters is False
    assert args.output_dir == str(tmp_path / "checkpoints")


def test_fsdp_cpu_ram_efficient_loading_is_set_before_the_model_loads(tmp_path, monkeypatch):
    import os

    from transformers.integrations.fsdp import is_fsdp_enabled

    for k in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        monkeypatch.setenv(k, "")  # recorded, so the teardown also removes what training_arguments sets below
        monkeypatch.delenv(k)      # (a delenv of an absent variable records nothing: the FSDP flags leaked into
                                   # the later tests' torchrun runs, which then asked for an accelerator)
    cpu_arguments("fsdp", {}, tmp_path)  # what the trainer runs before from_pretrained
    assert os.environ.get("ACCELERATE_USE_FSDP") == "true"
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: True)
    assert is_fsdp_enabled()  # what from_pretrained asks (distributed faked: no process group here)


def test_a_run_folder_that_cannot_be_made_is_a_short_error_not_a_traceback(tmp_path, capsys):
    from dockyard.train.__main__ import main

    (tmp_path / "runs").write_text("a file where the runs folder should be")
    code = main(["--recipe", "zero2", "--run-dir", str(tmp_path / "runs" / "r1")])
    err = capsys.readouterr().err
    assert code != 0 and "error: cannot make the run folder" in err and "must be writable" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("given", [None, "max_split_size_mb:128"])
def test_the_trainer_asks_for_growable_cuda_segments_unless_the_user_set_the_allocator(tmp_path, monkeypatch, given):
    """ZeRO-2 ran out of GPU memory with memory free, fragmented (the pitfalls: DeepSpeedExamples#336): the trainer
    sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before any CUDA tensor, natively too (the image's ENV is
    not there), and keeps a value the user set."""
    from dockyard.train.__main__ import main

    if given is None:
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", given)
    (tmp_path / "runs").write_text("a file: the run ends before its model loads")
    assert main(["--recipe", "zero2", "--run-dir", str(tmp_path / "runs" / "r1")]) != 0
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == (given or "expandable_segments:True")


@pytest.mark.parametrize("held", [[], ["runA/"], ["notes.txt"]], ids=["empty", "the-runs-folder", "a-folder-of-ones-own"])
def test_resume_of_a_folder_that_holds_no_run_is_refused_and_writes_nothing_there(tmp_path, capsys, held):
    """--resume of the runs folder itself (or an empty folder, a typo of one's own) was taken for a run that failed
    early: "training from the start", and a new run's files were written beside what the folder held."""
    from dockyard.train.__main__ import main

    folder = tmp_path / "runs"
    folder.mkdir()
    for name in held:
        (folder / name.rstrip("/")).mkdir() if name.endswith("/") else (folder / name).write_text("mine")
    code = main(["--recipe", "ddp", "--run-dir", str(folder), "--resume"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"error: --resume: {folder} holds no run"), err
    assert sorted(p.name for p in folder.iterdir()) == sorted(n.rstrip("/") for n in held), "nothing was written"

@pytest.mark.parametrize("given", [{"activation_checkpointing": True}, {"gradient_checkpointing": True}])
def test_checkpointing_under_either_name_reaches_the_trainer_without_a_deprecation_warning(tmp_path, given):
    """transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name warns in every run's
    log, and goes in v6): either name in a recipe turns it on, and the Trainer is handed the new one."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        args = cpu_arguments("ddp", given, tmp_path)
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert not [w for w in seen if "gradient_checkpointing" in str(w.message)], [str(w.message) for w in seen]


def test_the_new_checkpointing_name_is_what_the_autos_resolve():
    """A user who writes transformers' new name overrides the defaults' `gradient_checkpointing: auto`, and the plan
    and the manifest see the one setting."""
    from dockyard.common.errors import DockyardError

    _, overrides = resolve_settings(load_recipe("lora"), {"activation_checkpointing": False})
    assert overrides["gradient_checkpointing"] is False and "activation_checkpointing" not in overrides
    with pytest.raises(DockyardError, match="gradient_checkpointing True and activation_checkpointing False are one"):
        resolve_settings(load_recipe("lora"), {"activation_checkpointing": False, "gradient_checkpointing": True})


@pytest.mark.parametrize("name", ["ddp", "lora"])
def test_checkpointing_kwargs_that_are_not_a_mapping_are_a_short_error(tmp_path, name):
    """`-- --activation_checkpointing_kwargs 3` was a TypeError traceback in the lora recipe (its guard merges them)."""
    from dockyard.common.errors import DockyardError

    with pytest.raises(DockyardError, match=r"activation_checkpointing_kwargs\) 3: takes a mapping, as in"):
        cpu_arguments(name, {"activation_checkpointing_kwargs": 3}, tmp_path)
    args = cpu_arguments(name, {"activation_checkpointing_kwargs": {"use_reentrant": False},
                                "activation_checkpointing": True}, tmp_path)
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.parametrize("override,says", [
    (["--learning_rate", "inf"], "learning_rate inf: TrainingArguments.learning_rate takes a finite number"),
    (["--learning_rate", "fast"], "learning_rate 'fast': TrainingArguments.learning_rate takes a finite number"),
    (["--max_steps", "nan"], "max_steps nan: TrainingArguments.max_steps takes a whole number"),
    (["--max_steps", "abc"], "max_steps 'abc': TrainingArguments.max_steps takes a whole number"),
    (["--max_steps", "1e30"], "max_steps 1e+30: TrainingArguments.max_steps takes a whole number"),
    (["--seed", "nan"], "seed nan: TrainingArguments.seed takes a whole number"),
    (["--num_train_epochs", "inf", "--max_steps", "-1"], "num_train_epochs inf: TrainingArguments.num_train_epochs"),
    (["--report_to", "tensorboard"], "report_to tensorboard: not installed in this image (installed: "),
    (["--report_to", "wandb"], "report_to wandb: it sends the run to Weights & Biases' servers, which the training "
                               "nodes cannot reach (runs are offline)"),
    # KeyError in the Trainer's table of levels; torch's uniform_ at the first step; the Trainer's "evaluation requires
    # an eval_dataset"; peft's error for a name of no layer
    (["--log_level", "foo"], "log_level 'foo': give one of detail, debug, info, warning, error, critical, passive"),
    (["--neftune_noise_alpha", "-1"], "neftune_noise_alpha -1: TrainingArguments.neftune_noise_alpha takes a number "
                                      "from 0 to 1000"),
    (["--neftune_noise_alpha", "1e300"], "neftune_noise_alpha 1e+300: TrainingArguments.neftune_noise_alpha takes a "
                                         "number from 0 to 1000"),
    (["--eval_on_start", "true"], "eval_on_start needs held-out data: add --eval_fraction 0.05 or --eval_data FILE"),
    (["--eval_data", "data/sample.jsonl", "--eval_fraction", "0.1"], "eval_data and eval_fraction are both set (0.1)"),
    # what TrainingArguments refused once the run folder was made (native and run.sh runs: the trainer's own check)
    (["--dataloader_prefetch_factor", "2"], "dataloader_prefetch_factor works with dataloader_num_workers above 0"),
    (["--torch_empty_cache_steps", "0"], "torch_empty_cache_steps 0: TrainingArguments.torch_empty_cache_steps takes "
                                         "a number 1 or more"),
    (["--load_best_model_at_end", "true"], "load_best_model_at_end true needs an evaluation to choose the best"),
    (["--lr_scheduler_type", "reduce_lr_on_plateau"], "lr_scheduler_type reduce_lr_on_plateau needs an evaluation"),
    (["--lora_r", "8"], "lora_r in the overrides after --: recipe ddp trains the whole model, with no LoRA adapters"),
    (["--bf16", "true", "--fp16", "true"], "bf16 and fp16 are both true: give one"),
    # the fourth red-team pass: 10 for 10 % pushed the right token's probability down; split_batches trained half
    # the global batch the run reported, over 2 processes
    (["--label_smoothing_factor", "10"], "label_smoothing_factor 10: TrainingArguments.label_smoothing_factor takes "
                                         "a number from 0 up to (not including) 1"),
    (["--accelerator_config", '{"split_batches": true}'], "accelerator_config: leave split_batches out"),
    # the tenth: a file's name went around that check (the Trainer reads the file: split_batches in it; a fifo hung)
    (["--accelerator_config", "/tmp/acc.json"], "accelerator_config '/tmp/acc.json': give its settings as a mapping"),
    # the eleventh: 10**5 workers forked per process; a prefetch factor of 10**18 spun every rank before its first
    # batch; accelerate padded an evaluation batch of 10**12 by doubling a list until the kernel killed the run
    (["--dataloader_num_workers", "100000"], "dataloader_num_workers 100000: TrainingArguments.dataloader_num_workers "
                                             "takes a number from 0 to 64"),
    (["--dataloader_num_workers", "1", "--dataloader_prefetch_factor", "1000000000000000000"],
     "dataloader_prefetch_factor 1000000000000000000: TrainingArguments.dataloader_prefetch_factor takes a number "
     "from 1 to 64"),
    (["--per_device_eval_batch_size", "1000000000000"], "per_device_eval_batch_size 1000000000000: TrainingArguments."
                                                        "per_device_eval_batch_size takes a number from 1 to 65536"),
    (["--qlora_lean", "false"], "qlora_lean in the overrides after --: recipe ddp has no 4-bit layers"),
    # a traceback on every rank, or after the first evaluation, each
    (["--parallelism_config", "foo"], "parallelism_config cannot be given as a setting"),
    (["--metric_for_best_model", "foo"], "metric_for_best_model 'foo': a run computes no metric but the evaluation "
                                         "loss"),
    (["--include_for_metrics", "5"], "include_for_metrics 5: takes a list of inputs and loss"),
    # torch's RuntimeError after the model loaded; the Trainer's random sampler and no count, without a word
    (["--torch_compile", "true", "--torch_compile_mode", "fastest"], "torch_compile_mode 'fastest': give one of "
                                                                      "default, lite, reduce-overhead"),
    (["--train_sampling_strategy", "bogus"], "train_sampling_strategy 'bogus': give one of random, sequential"),
    (["--include_num_input_tokens_seen", "bogus"], "include_num_input_tokens_seen 'bogus': give one of all, "
                                                   "non_padding, no"),
    # the split of the batch, refused once the run folder was made (run.sh, native)
    (["--global_batch", "3", "--per_device_train_batch_size", "2"], "per_device_train_batch_size 2 does not divide "
                                                                     "the 3 examples each of the 1 process(es)"),
])
def test_a_bad_training_number_given_to_the_trainer_itself_is_the_hosts_one_error_line(tmp_path, capsys, override,
                                                                                       says):
    """run.sh and native runs hand their overrides straight to the trainer: `--learning_rate inf` trained on NaN and
    was recorded as completed, `--max_steps nan` was a traceback. The trainer refuses them in the host's words."""

    from dockyard.train.__main__ import main

    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", *override])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {says}" in err and "Traceback" not in err, err
    assert not (tmp_path / "r1").exists(), "refused before the run folder was made: nothing is left behind"


@pytest.mark.parametrize("override,says", [
    (["--optim", "galore_adamw"], "optim galore_adamw: its package is not in this image (You need to install "
                                  "`galore_torch`"),
    (["--optim", "schedule_free_adamw"], "optim schedule_free_adamw: its package is not in this image"),
    (["--optim", "sgd", "--optim_args", "momentum=fast"], "optim sgd, optim_args 'momentum=fast': "),
])
def test_an_optimizer_this_image_cannot_make_is_one_line_before_the_model_loads(tmp_path, capsys, override, says):
    """The twelfth red-team pass: 22 of the Trainer's optim choices need a package no image has; each was an
    ImportError traceback on every rank once the model had loaded."""
    from dockyard.train.__main__ import main

    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1", *override])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {says}" in err and "Traceback" not in err, err
    record = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert record["status"] == "failed" and says.split(":")[0] in record["error"]


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_an_optimizer_this_image_cannot_make_is_refused_under_zero_without_an_optimizer_section(tmp_path, name):
    """zero2's and zero3's ds_config.json have no `optimizer` section: the Trainer builds `optim` and ZeRO wraps it, so
    `--optim galore_adamw` was an ImportError traceback in deepspeed_init once the model had loaded."""
    from dockyard.common.errors import DockyardError

    with pytest.raises(DockyardError, match="optim galore_adamw: its package is not in this image"):
        cpu_arguments(name, {"optim": "galore_adamw"}, tmp_path / "r1")
    assert cpu_arguments(name, {"optim": "adamw_torch"}, tmp_path / "r2").optim == "adamw_torch"


@pytest.mark.parametrize("name", ["ddp", "zero2", "lora"])
def test_optim_args_the_optimizer_never_reads_are_refused_not_dropped(tmp_path, name):
    """Red-team pass: the Trainer hands an optimizer only the optim_args keys its maker looks up, and drops the rest
    without a word: `--optim_args momentum=0.9` trained the default AdamW as if not given (the run completed), and
    `--optim sgd --optim_args weight_decay=0.1` trained with --weight_decay's 0, which every parameter group sets (the
    guard's own example of optim_args was that one)."""
    from dockyard.common.errors import DockyardError

    with pytest.raises(DockyardError, match="optim_args momentum=0.9: optim adamw_torch_fused reads no momentum"):
        cpu_arguments(name, {"optim": "adamw_torch_fused", "optim_args": "momentum=0.9"}, tmp_path / "r1")
    with pytest.raises(DockyardError, match="optim_args foo=1: optim sgd reads no foo"):
        cpu_arguments(name, {"optim": "sgd", "optim_args": "momentum=0.9,foo=1"}, tmp_path / "r2")
    with pytest.raises(DockyardError, match="the Trainer sets weight_decay on every parameter group, over what "
                                            "optim_args gives the optimizer; give --weight_decay 0.1 instead"):
        cpu_arguments(name, {"optim": "sgd", "optim_args": "weight_decay=0.1"}, tmp_path / "r3")
    taken = cpu_arguments(name, {"optim": "sgd", "optim_args": "momentum=0.9, nesterov=true"}, tmp_path / "r4")
    assert taken.optim == "sgd" and taken.optim_args == "momentum=0.9, nesterov=true"


def test_optim_args_given_at_the_optimizers_own_default_are_taken(tmp_path):
    """Review: the check above asked only whether leaving a key out changed what the optimizer is made with, so a key
    the maker reads, given at its default (`--optim ademamix --optim_args alpha=5.0`, bitsandbytes' AdEMAMix reads
    alpha, beta3, ...), was refused as "optim ademamix reads no alpha"."""
    from dockyard.common.errors import DockyardError

    taken = cpu_arguments("ddp", {"optim": "ademamix", "optim_args": "alpha=5.0,beta3=0.9999"}, tmp_path / "r1")
    assert taken.optim == "ademamix" and taken.optim_args == "alpha=5.0,beta3=0.9999"
    with pytest.raises(DockyardError, match="optim_args foo=5.0: optim ademamix reads no foo"):
        cpu_arguments("ddp", {"optim": "ademamix", "optim_args": "alpha=5.0,foo=5.0"}, tmp_path / "r2")


@pytest.mark.parametrize("kind, kwargs, says", [
    ("constant", {"num_cycles": 5}, "lr_scheduler_kwargs num_cycles: lr_scheduler_type constant reads no kwargs (the "
     "Trainer would drop it without a word); leave it out, or pick a schedule that reads num_cycles (cosine, "
     "cosine_with_restarts, cosine_with_min_lr, cosine_warmup_with_min_lr, warmup_stable_decay)"),
    ("constant_with_warmup", {"a": 1, "b": 2}, "lr_scheduler_kwargs a, b: lr_scheduler_type constant_with_warmup reads "
     "no kwargs (the Trainer would drop them without a word); leave them out"),
    ("cosine", {"min_lr": 1e-5}, "lr_scheduler_kwargs min_lr: lr_scheduler_type cosine reads no min_lr (it takes "
     "num_cycles); leave it out, or pick a schedule that reads min_lr (reduce_lr_on_plateau, cosine_with_min_lr, "
     "cosine_warmup_with_min_lr, greedy)"),
    ("polynomial", {"power": 2.0, "foo": 1}, "lr_scheduler_kwargs foo: lr_scheduler_type polynomial reads no foo (it "
     "takes lr_end, power); leave it out"),
])
def test_schedule_kwargs_the_schedule_never_reads_are_refused_before_the_model_loads(tmp_path, kind, kwargs, says):
    """Red-team pass: transformers' get_scheduler hands constant and constant_with_warmup no lr_scheduler_kwargs, so
    `--lr_scheduler_type constant --lr_scheduler_kwargs '{num_cycles: 5}'` completed as if they were not given; the
    other schedules' makers take only their own (a TypeError once the model had loaded). What each takes is
    transformers' own schedule function's."""
    from dockyard.common.errors import DockyardError

    with pytest.raises(DockyardError, match=f"^{re.escape(says)}$"):
        cpu_arguments("ddp", {"lr_scheduler_type": kind, "lr_scheduler_kwargs": kwargs}, tmp_path / "r1")
    taken = {"cosine": {"num_cycles": 1.0}, "polynomial": {"power": 2.0, "lr_end": 0.0}}.get(kind)
    if taken:
        args = cpu_arguments("ddp", {"lr_scheduler_type": kind, "lr_scheduler_kwargs": taken}, tmp_path / "r2")
        assert args.lr_scheduler_kwargs == taken


def _without_tokenizer(folder):
    for f in folder.glob("tokenizer*"):
        f.unlink()


def _config_cut_short(folder):
    config = folder / "config.json"
    config.write_text(config.read_text()[:40])


def _weights_empty(folder):
    (folder / "model.safetensors").write_bytes(b"")


def _weights_cut_short(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _code_in_the_tokenizer(folder):
    """A tokenizer whose class is a .py file of the folder; importing it leaves the file PWNED beside it."""
    import json

    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="EvilTok", auto_map={"AutoTokenizer": ["evil.EvilTok", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(folder / 'PWNED')!r}, 'w')\nclass EvilTok:\n    pass\n")


def _code_in_the_config(folder):
    import json

    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evilmodel", auto_map={"AutoConfig": "evil.C", "AutoModelForCausalLM": "evil.M"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(folder / 'PWNED')!r}, 'w')\n")


def _dtype_of_no_name(folder):
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "evil", "torch_dtype": "evil"}))


def _vocab_size_as_text(folder):
    """huggingface_hub's validation error (none of Python's own) was said as a tokenizer that does not load."""
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": "many"}))


def _shards_outside(folder):
    """An index naming weights outside the folder: transformers joined the name onto the folder and loaded it."""
    import json

    (folder / "model.safetensors").rename(folder.parent / "other-run.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "../other-run.safetensors"}}))


def _adapter(folder):
    import json

    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": str(folder), "r": 8, "target_modules": ["q_proj"]}))


def _adapter_beside(folder):
    """A base with an adapter's files copied in: transformers loaded the adapter onto it, froze the rest, and a full
    fine-tune then trained nothing (DDP's "does not need a module without parameters requiring grad" traceback)."""
    _adapter(folder)


def _adapter_alone(folder):
    """An unmerged LoRA export given as the model: "has no config.json", not saying what the folder is."""
    _adapter(folder)
    (folder / "config.json").unlink()


@pytest.mark.parametrize("damage,says", [
    (_without_tokenizer, "cannot load its tokenizer (it holds no tokenizer: none of tokenizer.json"),
    (_code_in_the_tokenizer, "needs Python code from the folder (auto_map"),
    (_code_in_the_config, "needs Python code from the folder (auto_map"),
    (_shards_outside, "names the weights file '../other-run.safetensors', which is not a file of the folder"),
    (_adapter_beside, "holds a LoRA adapter (adapter_config.json) beside the model, which transformers would load"),
    (_adapter_alone, "a LoRA adapter (adapter_config.json), not a model: pass the base it was trained on"),
    (_dtype_of_no_name, "config.json: transformers cannot build a model from it (AttributeError"),
    (_vocab_size_as_text, "config.json: transformers cannot build a model from it (StrictDataclassFieldValidationError: "
                          "Validation error for field 'vocab_size': TypeError: Field 'vocab_size' expected int"),
    (_config_cut_short, "config.json is not valid JSON"),
    (_weights_empty, "a weights file is damaged (Error while deserializing header"),
    (_weights_cut_short, "a weights file is damaged ("),
])
def test_a_model_folder_without_a_tokenizer_or_with_a_broken_config_is_one_error_line(tmp_path, capsys, monkeypatch,
                                                                                        damage, says):
    """A weights-only export was a ValueError traceback from AutoTokenizer, a config.json cut short an OSError one,
    an empty or cut-short model.safetensors (a copy that did not finish) safetensors' SafetensorError one. A folder
    whose tokenizer or config needs its own code made transformers ask on the terminal, and a "y" ran it."""
    import io
    import logging

    from dockyard.train import model as models
    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)  # not an earlier test's captured stderr
    folder = tmp_path / "m"
    models.materialize_tiny_model(folder)
    damage(folder)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # a user who answers transformers' "run the code? [y/N]"
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--model", str(folder)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert f"error: {folder}" in err and says in err, err
    assert not (folder / "PWNED").exists(), "the folder's code ran"


def test_a_run_folder_that_is_a_file_or_a_resume_of_no_folder_is_refused_and_nothing_made(tmp_path, capsys):
    """`--run-dir FILE` said the runs folder must be writable; `--run-dir /typo/x --resume` made /typo/x."""
    from dockyard.train.__main__ import main

    (tmp_path / "r1").write_text("a file")
    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1")]) == 1
    assert f"error: --run-dir {tmp_path / 'r1'} is a file, not a folder" in capsys.readouterr().err
    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "typo" / "x"), "--resume"]) == 1
    assert "error: --resume: there is no run folder" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_an_escape_sequence_in_a_model_config_reaches_the_terminal_as_text(tmp_path, capsys):
    """A config.json's model_type holding ESC[31m was printed raw in the trainer's error line: a crafted file
    drove the terminal of whoever ran it."""
    import json

    from dockyard.common.run_settings import TINY_MODEL
    from dockyard.train.__main__ import main

    folder = tmp_path / "m"
    folder.mkdir()
    cfg = {**json.loads((TINY_MODEL / "config.json").read_text()), "model_type": "x\u001b[31m"}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--model", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "error: " in err and "\x1b" not in err and "x\\x1b[31m" in err, repr(err)


def test_a_global_batch_larger_than_the_data_is_refused_before_the_model_loads(tmp_path, capsys):
    """4,096 examples a step over the 2,000-example sample: transformers took one step per epoch over what there
    was, while the start-up line and the manifest said 4,096."""
    from dockyard.train.__main__ import main

    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--global_batch", "4096"]) == 1
    err = capsys.readouterr().err
    assert "error: global_batch 4096: the training data holds 2000 examples, fewer than one optimizer step takes; " \
           "set global_batch" in err and "at most 2000" in err, err
    assert "Traceback" not in err


def test_the_global_batch_a_too_small_data_set_is_offered_splits_over_the_runs_processes():
    """Red-team pass: 15 examples on 2 processes were offered `at most 15`, and 1 example `at most 1`: both a global
    batch the run refuses ("cannot be split evenly over 2 processes")."""
    from dockyard.common.batch import check_batch_within_data
    from dockyard.common.errors import DockyardError

    with pytest.raises(DockyardError, match=r"holds 15 examples, .* to at most 14, or give more data"):
        check_batch_within_data(16, 15, False, processes=2)
    with pytest.raises(DockyardError, match=r"holds 1 example, .*each of the run's 2 processes takes one example a "
                                            r"step at least: give fewer processes \(--nproc\), or give more data"):
        check_batch_within_data(2, 1, False, processes=2)
    check_batch_within_data(16, 16, False, processes=2)


@pytest.mark.parametrize("run_id", ["../escaped", "..", ".", "a/../../escaped"])
def test_a_run_folder_off_the_containers_runs_mount_is_refused_and_nothing_made(capsys, run_id):
    """compose/train.yml puts DOCKYARD_RUN_ID in /workspace/runs/ID unchecked: "../x" made the run folder outside the
    runs mount, inside the container, where everything the run wrote went with it."""
    from dockyard.train.__main__ import main

    assert main(["--recipe", "ddp", "--run-dir", f"/workspace/runs/{run_id}"]) == 1
    err = capsys.readouterr().err
    assert f"error: --run-dir /workspace/runs/{run_id}: that is not a folder of its own in the runs folder" in err, err
    assert "DOCKYARD_RUN_ID" in err and "Traceback" not in err
    assert not Path("/workspace/escaped").exists() and not Path("/workspace/runs").exists()


@pytest.mark.parametrize("run_id", [".cache", ".cache/compile", "exp/1", "-x", "_x"])
def test_a_run_folder_no_run_id_names_in_the_runs_mount_is_refused_and_nothing_made(capsys, monkeypatch, tmp_path,
                                                                                      run_id):
    """compose/train.yml's DOCKYARD_RUN_ID=.cache trained into the folder of the compile cache the runs execute, and
    exp/1 into a folder within another: runs `invoke runs` never listed and export refused. Refused by the name,
    before any folder is made (the mount here a folder of the test's)."""
    from dockyard.common import runfolder
    from dockyard.train.__main__ import main

    runs = tmp_path / "runs"
    (runs / ".cache" / "compile").mkdir(parents=True)
    monkeypatch.setattr(runfolder, "RUNS_INSIDE", str(runs))

    def went_on(path):  # the step after the folder is made: never reached
        raise AssertionError(f"the run went on in {path}")
    monkeypatch.setattr(runfolder, "check", went_on)
    assert main(["--recipe", "ddp", "--run-dir", f"{runs}/{run_id}"]) == 1
    err = capsys.readouterr().err
    assert f"error: --run-dir {runs}/{run_id}: that is not a folder of its own in the runs folder" in err, err
    assert "DOCKYARD_RUN_ID" in err and "Traceback" not in err
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*")) == [".cache", ".cache/compile"]


def test_a_fresh_start_in_a_folder_a_killed_run_left_starts_metrics_afresh(tmp_path):
    """A run killed before its first checkpoint leaves metrics.jsonl and no manifest: the next run in that folder
    appended its lines to the old ones."""
    import json
    import logging

    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)  # not an earlier test's captured stderr
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 9.0}) + "\n")
    (run_dir / "train.log").write_text("the killed run's log\n")
    assert main(["--recipe", "ddp", "--run-dir", str(run_dir), "--", "--max_steps", "2", "--save_strategy", "no",
                 "--max_seq_length", "32"]) == 0
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_an_evaluation_without_held_out_data_is_one_error_line_before_anything_loads(tmp_path, capsys, strategy):
    """`-- --eval_strategy steps` without eval data was the HF Trainer's ValueError traceback, after the model and the
    data had loaded."""

    from dockyard.train.__main__ import main

    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "4",
                 "--eval_strategy", strategy, "--eval_steps", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert (f"error: eval_strategy {strategy} needs held-out data: add --eval_fraction 0.05 or --eval_data FILE "
            "(or --eval_strategy no)") in err, err
    assert not (tmp_path / "r1").exists(), "refused before the run folder (and the data) was made"


def test_held_out_data_or_no_evaluation_passes_the_evaluation_check(tmp_path):
    assert cpu_arguments("ddp", {"eval_strategy": "steps", "eval_fraction": 0.25}, tmp_path).eval_strategy == "steps"
    assert cpu_arguments("ddp", {"eval_strategy": False}, tmp_path).eval_strategy == "no"  # `--eval_strategy no`
    assert cpu_arguments("ddp", {"eval_fraction": 0.25}, tmp_path).eval_strategy == "steps"  # on by itself


def test_a_share_held_out_and_never_evaluated_is_said(tmp_path, caplog):
    """`--eval_fraction 0.5 --eval_strategy no` trained on half the data, saying nothing of the other half. Said,
    not refused: a run may mean to split its data as another run does (tests/integration/test_throughput.py)."""
    caplog.set_level("WARNING", logger="dockyard.train")
    assert cpu_arguments("ddp", {"eval_fraction": 0.5, "eval_strategy": False}, tmp_path).eval_strategy == "no"
    assert "eval_fraction 0.5 holds examples out of training that eval_strategy no never evaluates" in caplog.text


def test_the_trainers_own_check_of_the_settings_together_is_one_error_line(tmp_path, capsys):
    """Settings each valid but refused together by the HF Trainer as it is built (after the model loaded): its
    ValueError was a traceback; TrainingArguments' several-line refusals are one line too."""
    import logging

    from dockyard.common.errors import DockyardError
    from dockyard.train.__main__ import main

    with pytest.raises(DockyardError, match=r"^invalid training setting: --load_best_model_at_end requires the save "
                                            r"and eval strategy to match.*- Evaluation strategy") as refused:
        # past the trainer's own check of it (check_evaluation), as a combination it does not know would come
        cpu_arguments("ddp", {"load_best_model_at_end": True}, tmp_path, checked=False)
    assert "\n" not in str(refused.value)

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)  # not an earlier test's captured stderr
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "2",
                 "--save_strategy", "best", "--max_seq_length", "32"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    line = next(x for x in err.splitlines() if x.startswith("error: "))
    assert line.startswith("error: invalid training settings: `args.metric_for_best_model` must be provided"), err


def _zero2_with(folder, ds_config: dict):
    """recipes/zero2 copied to `folder`, with this DeepSpeed config."""
    import json
    import shutil

    shutil.copytree(load_recipe("zero2").folder, folder)
    (folder / "ds_config.json").write_text(json.dumps(ds_config))
    return str(folder)


def test_a_deepspeed_config_without_batch_keys_gets_the_runs_batch(tmp_path):
    """DeepSpeed's smallest config ({"zero_optimization": {"stage": 2}}) was DeepSpeed's traceback "Either
    train_batch_size or train_micro_batch_size_per_gpu needs to be provided" once the model had loaded: the Trainer
    fills only keys that say auto."""
    recipe = _zero2_with(tmp_path / "mine", {"zero_optimization": {"stage": 2}})
    args = cpu_arguments(recipe, {"global_batch": 8, "per_device_train_batch_size": 4}, tmp_path / "r1")
    ds = args.hf_deepspeed_config.config
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (4, 2, 8)


def test_an_explicit_deepspeed_batch_is_refused_in_one_line_where_the_recipe_is_read(tmp_path):
    """`"train_micro_batch_size_per_gpu": 4` disagreed with the micro-batch the run picks: the HF Trainer's
    several-line ValueError traceback minutes into the run; now `invoke run --dry` and the trainer refuse it alike."""
    from dockyard.common.errors import DockyardError

    recipe = _zero2_with(tmp_path / "mine", {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4})
    with pytest.raises(DockyardError, match=r'train_micro_batch_size_per_gpu 4: the run sets the batch, so write '
                                            r'"auto" here .* give per_device_train_batch_size'):
        load_recipe(recipe)


def test_a_deepspeed_value_that_disagrees_with_the_settings_is_one_line_before_the_model_loads(tmp_path):
    from dockyard.common.errors import DockyardError

    recipe = _zero2_with(tmp_path / "mine", {"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5})
    with pytest.raises(DockyardError, match=r"disagrees with the run's settings \(ds gradient_clipping=0.5 vs hf "
                                            r"max_grad_norm=1.0\): write \"auto\"") as refused:
        cpu_arguments(recipe, {}, tmp_path / "r1")
    assert "\n" not in str(refused.value)
    assert cpu_arguments(recipe, {"max_grad_norm": 0.5}, tmp_path / "r2").hf_deepspeed_config.config[
        "gradient_clipping"] == 0.5  # the same value given to both is fine


def test_a_deepspeed_recipe_started_without_torchrun_is_one_error_line_before_anything_loads(tmp_path, capsys,
                                                                                             monkeypatch):
    """`python -m dockyard.train --recipe zero2` made the tiny base, then died in DeepSpeed's MPI discovery:
    "ModuleNotFoundError: No module named 'mpi4py'", a traceback. It says how to start it instead."""
    import json
    import logging

    from dockyard.train.__main__ import main

    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = main(["--recipe", "zero2", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "error: recipe zero2 runs DeepSpeed, which needs torchrun's process group: start it with `torchrun" in err
    assert json.loads((tmp_path / "r1" / "manifest.json").read_text())["status"] == "failed"
    assert not (tmp_path / "r1" / "base").exists(), "refused before anything was loaded"


@contextlib.contextmanager
def real_loggers():
    """The trainer's logging set up for real inside, and this process's put back after (handlers, levels)."""
    import logging

    import transformers

    root, level = logging.root.handlers[:], logging.root.level
    verbosity = transformers.utils.logging.get_verbosity()
    try:
        yield
    finally:
        for h in logging.root.handlers:
            if h not in root:
                h.close()
        logging.root.handlers[:] = root
        logging.root.setLevel(level)
        logging.getLogger("dockyard.train.data").setLevel(logging.NOTSET)
        logging.getLogger("transformers.trainer_utils").setLevel(logging.NOTSET)
        transformers.utils.logging.set_verbosity(verbosity)


def test_the_console_gets_the_runs_own_lines_and_warnings_train_log_gets_every_librarys_info(tmp_path, capsys):
    """A 6-step run printed about 130 console lines, most of them transformers' INFO (the model's config twice, each
    file saved, "share your model on huggingface.co"). Real loggers and real transformers reading the trainer's tiny
    model, as the trainer sets them up on rank 0. train.log keeps the libraries' INFO but the configs printed whole
    as JSON (90 of a 12-step run's 128 lines), the repeated "Offline mode" line and "share your model"."""
    import logging

    from transformers import AutoConfig, GenerationConfig

    from dockyard.common.run_settings import TINY_MODEL
    from dockyard.train.logs import setup_logging

    with real_loggers():
        setup_logging(tmp_path, is_main=True)
        AutoConfig.from_pretrained(TINY_MODEL)
        GenerationConfig(bos_token_id=1).save_pretrained(tmp_path / "gen")  # as a model folder holds it
        GenerationConfig.from_pretrained(tmp_path / "gen")
        logging.getLogger("transformers.trainer").info("***** Running training *****")
        logging.getLogger("transformers.trainer").info("\n\nTraining completed. Do not forget to share your model "
                                                       "on huggingface.co/models =)\n\n")  # the Trainer's words
        logging.getLogger("transformers.trainer").warning("a library's warning")
        logging.getLogger("dockyard.train").info('{"step": 1, "loss": 6.2}')
        for h in logging.root.handlers:
            h.flush()
    console = capsys.readouterr().err
    log = (tmp_path / "train.log").read_text()
    assert "loading configuration file" not in console and "a library's warning" in console
    assert '{"step": 1' in console
    assert all(line in log for line in ("loading configuration file", "Running training", "a library's warning",
                                        '{"step": 1'))
    assert not any(noise in log for noise in ("Model config", "Generate config", '"vocab_size"', "huggingface.co"))


def test_a_host_path_no_utf_8_can_write_is_said_in_train_log_not_a_logging_error(tmp_path, capfd, monkeypatch):
    """A runs folder whose name is not UTF-8 (a Latin-1 'r\xe9seau' on an old file server): since 85af2df train.log
    names the host's paths (DOCKYARD_HOST_PATHS, which Python reads with its surrogates), and every line naming the
    run folder was logging's '--- Logging error --- UnicodeEncodeError: surrogates not allowed' traceback on the
    console, the line lost from train.log. The character is written escaped, as the console writes it."""
    import logging

    from dockyard.train.logs import setup_logging

    monkeypatch.setenv("DOCKYARD_HOST_PATHS", json.dumps({"/workspace/runs": "/srv/r\udce9seau/runs"}))
    with real_loggers():
        setup_logging(tmp_path, is_main=True)
        logging.getLogger("dockyard.train").info("the model is in /workspace/runs/r1/model")
        for h in logging.root.handlers:
            h.flush()
    console = capfd.readouterr().err  # the real stderr, whose errors are backslashreplace
    assert "Logging error" not in console and "Traceback" not in console, console
    assert "the model is in /srv/r\\udce9seau/runs/r1/model" in (tmp_path / "train.log").read_text()


def test_deepspeeds_cpu_adam_lines_go_to_train_log_not_the_console(tmp_path, capfd, monkeypatch):
    """An offload run's console had, between 'data ...' and 'step 1/...', DeepSpeed's C++ lines "Adam Optimizer #0 is
    created with AVX512 arithmetic capability." and "Config: alpha=0.001000, ...": printf's, no logger's, so no
    filter of the console's saw them. They go to train.log now; what the op says on stderr (where errors go) still
    reaches the console. The real DeepSpeedCPUAdam, its C++ op a stand-in that prints as the real one does (C's
    printf, held in stdio's buffer)."""
    import ctypes
    import logging

    import torch
    from deepspeed.ops.adam import cpu_adam

    from dockyard.train import logs

    libc = ctypes.CDLL(None)

    class Op:
        def create_adam(self, opt_id, *args):
            libc.printf(b"Adam Optimizer #%d is created with %s arithmetic capability.\n", opt_id, b"AVX512")
            os.write(2, b"cpu_adam: an error of its own\n")
            return 0

        def destroy_adam(self, opt_id):
            return 0

    class StandIn:
        def load(self):
            return Op()

    monkeypatch.setattr(cpu_adam, "CPUAdamBuilder", StandIn)
    with real_loggers():
        try:
            logs.setup_logging(tmp_path, is_main=True)
            logs.cpu_adam_to_train_log()
            cpu_adam.DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])
            logging.getLogger("dockyard.train").info("step 1/3")
            for h in logging.root.handlers:
                h.flush()
        finally:
            logs.stop_quiet()
    libc.fflush(None)
    console = "".join(capfd.readouterr())
    assert "step 1/3" in console and "cpu_adam: an error of its own" in console, console
    assert "Adam Optimizer" not in console, console
    assert "deepspeed.ops.adam: Adam Optimizer #0 is created with AVX512" in (tmp_path / "train.log").read_text()


def test_a_data_warning_is_said_by_the_first_process_alone(tmp_path, capsys):
    """Every process reads the same data: each printed the same warnings (fields not trained on, examples cut),
    twice on two GPUs, eight times on eight. A process's own warnings are still said by each. The same for the
    Trainer's alignment of a model config without a pad token to the tokenizer's (real transformers, on the
    trainer's own tiny model with its config's pad_token_id taken out)."""
    import logging

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import align_special_tokens

    from dockyard.common.run_settings import TINY_MODEL
    from dockyard.train import data
    from dockyard.train.logs import setup_logging

    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    with real_loggers():
        for is_main in (False, True):
            setup_logging(tmp_path, is_main)
            data.log.warning("the field system is not trained on")
            logging.getLogger("dockyard.train").warning("this process's own GPU is slow")
            config = AutoConfig.from_pretrained(TINY_MODEL, pad_token_id=None)
            align_special_tokens(AutoModelForCausalLM.from_config(config), tokenizer)
            said = capsys.readouterr().err
            assert ("field system" in said) is is_main and "own GPU is slow" in said, said
            assert ("The tokenizer has new PAD/BOS/EOS tokens" in said) is is_main, said


def test_a_refusal_made_alike_by_every_process_is_said_by_the_first_and_by_another_only_if_the_first_went_on(
        monkeypatch):
    """The node's other processes wait for torchrun to stop them once its first has said the refusal and exited;
    a process whose error was its own (the first went on) says it itself after the wait, never silently."""
    import signal
    import threading

    from dockyard.train import ending as entry

    monkeypatch.setattr(entry, "SAY_ONCE_S", 0.2)
    assert entry._said_by_the_first() is False, "nobody stopped it: it says its error itself"
    old = signal.signal(signal.SIGTERM, entry._stopped)
    torchrun = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGTERM))  # the first having failed
    try:
        torchrun.start()
        monkeypatch.setattr(entry, "SAY_ONCE_S", 30)
        assert entry._said_by_the_first() is True
    finally:
        torchrun.cancel()  # a timer late past the wait must not send its SIGTERM to pytest, once the handler is gone
        torchrun.join()
        signal.signal(signal.SIGTERM, old)
        entry._signalled.clear()


@pytest.mark.parametrize("recipe, override, says", [
    ("ddp", ["--lr_scheduler_type", "reduce_lr_on_plateau", "--lr_scheduler_kwargs", "{mode: sideways}",
             "--eval_fraction", "0.1"], "the Trainer stopped before its first step: ValueError: mode sideways is "
     "unknown!. The learning-rate schedule read --lr_scheduler_type reduce_lr_on_plateau, --lr_scheduler_kwargs "
     "{'mode': 'sideways'}, with warmup_steps 0 of recipes/defaults.yaml: check them; the traceback is in the run's "
     "train.log"),
    # a kwarg the schedule cannot be made without: refused with the other settings, before the model loads
    ("ddp", ["--lr_scheduler_type", "warmup_stable_decay"], "lr_scheduler_type warmup_stable_decay needs num_decay_steps "
     "in lr_scheduler_kwargs"),
    ("ddp", ["--optim_args", "foo"], "optim_args 'foo': 'foo' is not a key=value pair; give key=value pairs"),
    ("ddp", ["--accelerator_config", "notajson"], "accelerator_config 'notajson': give its settings as a mapping "
     "after --"),
    ("ddp", ["--gradient_checkpointing", "true", "--gradient_checkpointing_kwargs", "{foo: 1}"],
     "gradient_checkpointing_kwargs (or activation_checkpointing_kwargs): unknown key(s) foo; torch.utils.checkpoint "
     "takes debug, determinism_check, early_stop, preserve_rng_state, use_reentrant"),
    ("lora", ["--lora_target_modules", "[foo]"], "lora_target_modules ['foo']: matches no layer of the model; give "
     "the names of its linear layers"),
    # red-team pass: the schedule reads its kwargs step by step. polynomial's negative power trained the whole run, then
    # stopped at its last step with a ZeroDivisionError traceback (no model saved); inverse_sqrt's timescale 0 divided
    # by zero as the schedule was made (a traceback: not one of the errors said in one line); a nan num_cycles and a
    # negative min_lr trained at a rate of 0, unsaid
    ("ddp", ["--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", "{power: -1}"],
     "lr_scheduler_type polynomial with lr_scheduler_kwargs {'power': -1}: the schedule cannot give the learning rate "
     "at step 1 of 1 (ZeroDivisionError: 0.0 cannot be raised to a negative power)"),
    ("ddp", ["--lr_scheduler_type", "inverse_sqrt", "--lr_scheduler_kwargs", "{timescale: 0}"],
     "the Trainer stopped before its first step: ZeroDivisionError: division by zero. The learning-rate schedule read "
     "--lr_scheduler_type inverse_sqrt, --lr_scheduler_kwargs {'timescale': 0}"),
    ("ddp", ["--lr_scheduler_kwargs", "{num_cycles: .nan}"],
     "lr_scheduler_type cosine with lr_scheduler_kwargs {'num_cycles': nan}: num_cycles nan: give a finite number"),
    ("ddp", ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", "{min_lr: -0.01}"],
     "lr_scheduler_type cosine_with_min_lr with lr_scheduler_kwargs {'min_lr': -0.01}: min_lr -0.01 is below 0, and "
     "the schedule would clamp the learning rate to 0 there: give min_lr of 0 or more"),
])
def test_a_setting_the_trainer_reads_only_as_it_starts_is_one_error_line(tmp_path, capsys, recipe, override, says):
    """Each was a traceback from the Trainer, peft or torch, on every rank, after the model had loaded."""
    import logging

    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)  # not an earlier test's captured stderr
    run = tmp_path / "r1"
    code = main(["--recipe", recipe, "--run-dir", str(run), "--", "--max_steps", "1", *override])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {says}" in err and "Traceback" not in err, err
    if "train.log" in says:
        assert "Traceback (most recent call last)" in (run / "train.log").read_text()


def test_a_resume_given_a_schedule_the_trainer_cannot_make_blames_the_setting_not_the_checkpoint(tmp_path, capsys):
    """Red-team pass: a resume given `--lr_scheduler_kwargs '{foo: 1}'` was told "cannot resume from checkpoint-1: it
    is not a checkpoint the Trainer wrote for this run ...: start a new run", and with an earlier checkpoint "remove it
    to resume from" that one: a sound checkpoint blamed (and its removal advised) for a setting given now."""
    import logging

    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    run = tmp_path / "r1"
    assert main(["--recipe", "ddp", "--run-dir", str(run), "--", "--max_steps", "1", "--save_steps", "1"]) == 0
    record = (run / "manifest.json").read_text()
    capsys.readouterr()
    code = main(["--recipe", "ddp", "--run-dir", str(run), "--resume", "--", "--max_steps", "2",
                 "--lr_scheduler_type", "inverse_sqrt", "--lr_scheduler_kwargs", "{timescale: 0}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert ("error: the Trainer stopped before its first step: ZeroDivisionError: division by zero. The learning-rate "
            "schedule read --lr_scheduler_type inverse_sqrt, --lr_scheduler_kwargs {'timescale': 0}") in err
    assert "not a checkpoint the Trainer wrote" not in err, err
    assert (run / "manifest.json").read_text() == record and (run / "checkpoints" / "checkpoint-1").is_dir()


def test_a_package_a_setting_needs_that_the_trainer_meets_only_as_it_starts_is_one_error_line(tmp_path, capsys,
                                                                                               monkeypatch):
    """An ImportError the Trainer raises building what a setting names (an optimizer whose package is missing, where
    guards.check_optim could not ask first) was a traceback on every rank."""
    import logging

    from dockyard.train import guards
    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    monkeypatch.setattr(guards, "check_optim", lambda args: None)  # as under a check that could not ask
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1", "--optim",
                 "galore_adamw"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "error: the Trainer stopped before its first step: ImportError: You need to install `galore_torch`" in err
    assert "The optimizer read --optim galore_adamw" in err


def test_a_setting_of_the_recipe_the_trainer_refuses_as_it_starts_is_one_line_naming_the_recipe(tmp_path, capsys):
    """A schedule the Trainer cannot make from a recipe's `settings:` was its raw traceback (only `--` overrides were
    caught); now it is one line naming the setting and the recipe.yaml it came from."""
    import logging

    from dockyard.train.__main__ import main

    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    recipe = tmp_path / "wsd"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text("# invoke run --recipe=wsd\nwhen: a schedule it cannot make\nstrategy: ddp\n"
                                        "settings: {lr_scheduler_type: inverse_sqrt, lr_scheduler_kwargs: {timescale: 0},"
                                        " max_steps: 1}\n")
    code = main(["--recipe", str(recipe), "--run-dir", str(tmp_path / "r1")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert ("error: the Trainer stopped before its first step: ZeroDivisionError: division by zero. The learning-rate "
            f"schedule read lr_scheduler_type inverse_sqrt in the recipe's settings: ({recipe / 'recipe.yaml'}), "
            f"lr_scheduler_kwargs {{'timescale': 0}} in the recipe's settings: ({recipe / 'recipe.yaml'}), with "
            "warmup_steps 0 of recipes/defaults.yaml: check them; the traceback is in the run's train.log") in err, err


def test_a_deepspeed_config_value_the_trainer_disagrees_with_is_said_not_the_overrides(tmp_path):
    """transformers lists each value of the DeepSpeed config that disagrees with TrainingArguments on lines of their
    own: the line kept the heading alone ("... mismatch TrainingArguments values:.") and blamed `--max_steps`. The
    error is transformers' own, from the check the Trainer makes before its first step (DeepSpeed needs torchrun's
    process group, which this process has none of)."""
    import shutil
    from types import SimpleNamespace

    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from dockyard.common.recipes import RECIPES
    from dockyard.train.trainer_errors import before_the_first_step

    folder = tmp_path / "z2"
    shutil.copytree(RECIPES / "zero2", folder)
    config = json.loads((folder / "ds_config.json").read_text())
    config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}
    (folder / "ds_config.json").write_text(json.dumps(config))
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
    with pytest.raises(ValueError) as raised:
        HfTrainerDeepSpeedConfig(config).trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda n: 0), model, 1)
    said = str(before_the_first_step(raised.value, load_recipe(folder), {"max_steps": 1}))
    assert said == (f"the Trainer stopped before its first step: the DeepSpeed config {folder / 'ds_config.json'} "
                    "disagrees with the training settings: scheduler.params.warmup_num_steps -5 where the Trainer has "
                    "warmup_steps 1. Set each of these to \"auto\" in ds_config.json (the Trainer fills in its value) "
                    "or to the Trainer's value; the traceback is in the run's train.log"), said


def test_lora_target_modules_written_with_commas_are_the_names_they_list(tmp_path):
    """`--lora_target_modules q_proj,v_proj` (the way most write it) was one name to peft, which matched nothing."""
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    settings, _ = resolve_settings(load_recipe("lora"), {"lora_target_modules": "q_proj, v_proj"})
    assert settings.lora_target_modules == ["q_proj", "v_proj"]
    for odd in (5, ",", ""):
        with pytest.raises(DockyardError, match="lora_target_modules .*: give the names of the model's linear layers"):
            resolve_settings(load_recipe("lora"), {"lora_target_modules": odd})
    assert resolve_settings(load_recipe("lora"), {})[0].lora_target_modules == "all-linear"


def test_a_gpu_out_of_memory_is_one_line_with_the_ways_out(tmp_path, capsys, monkeypatch):
    """torch's "CUDA out of memory" traceback, once per rank. No GPU here: Trainer.train is FAKED to raise what torch
    raises on one (torch.OutOfMemoryError), at the first step."""
    import logging

    import torch
    import transformers

    from dockyard.train.__main__ import main

    def out_of_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.19 GiB of which 1.06 GiB is free.\nOf the allocated memory ...")

    monkeypatch.setattr(transformers.Trainer, "train", out_of_memory)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1",
                 "--per_device_train_batch_size", "4"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert ("error: out of GPU memory at micro-batch 4 x 128 tokens (CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.): lower --per_device_train_batch_size"
            in err), err


@pytest.mark.parametrize("given", ["", "."])
def test_the_folder_the_trainer_was_started_in_is_not_taken_as_the_run_folder(tmp_path, capsys, monkeypatch, given):
    """`--run-dir ""` trained into the current folder, writing base/, checkpoints/ and a manifest among its files."""
    from dockyard.train.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    code = main(["--recipe", "ddp", "--run-dir", given, "--", "--max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 1 and f"error: --run-dir {given!r}: that is the folder the trainer was started in" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_nodes_that_advertise_loopback_to_each_other_are_told_which_variables_fix_it(tmp_path, monkeypatch):
    """torchrun started by hand on hosts whose name resolves to 127.0.1.1: gloo gave the other nodes a loopback
    address and every rank printed a 40-line RuntimeError. No second node here: TrainingArguments is FAKED to raise
    what gloo raises forming the process group."""
    import transformers

    from dockyard.common.errors import DockyardError

    def gloo_refused(*args, **kwargs):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:144] Gloo connectFullMesh failed with "
                           "[...] connect: Connection refused, remote=[127.0.1.1]:51234")

    def cuda_fault(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(transformers.TrainingArguments, "__init__", gloo_refused)
    with pytest.raises(DockyardError, match="gloo advertised a loopback address .* set GLOO_SOCKET_IFNAME and "
                                            "NCCL_SOCKET_IFNAME to the interface that reaches them"):
        cpu_arguments("ddp", {}, tmp_path)
    monkeypatch.setattr(transformers.TrainingArguments, "__init__", cuda_fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):  # any other error is as it was
        cpu_arguments("ddp", {}, tmp_path)


def test_a_run_stopped_while_a_library_wraps_the_stop_in_its_own_error_is_one_line_and_recorded_as_stopped(
        tmp_path, capsys, monkeypatch):
    """Cancelled while DeepSpeed compiled cpu_adam: DeepSpeed re-raised the SIGTERM's error as "RuntimeError:
    DeepSpeedCPUAdam requires the cpu_adam op, which failed to build/load", 150 lines of traceback per rank, and the
    manifest recorded that as the run's error. Trainer.train is a stand-in that wraps it as DeepSpeed does; the
    SIGTERM is real, sent to this process."""
    import json
    import logging
    import signal
    import time

    import transformers

    from dockyard.train.__main__ import main

    def compile_cancelled(self, *args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the compile, which the signal stops
        except Exception as e:
            raise RuntimeError("DeepSpeedCPUAdam requires the cpu_adam op, which failed to build/load.") from e

    monkeypatch.setattr(transformers.Trainer, "train", compile_cancelled)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    old = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    finally:
        signal.signal(signal.SIGTERM, old)
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM and "Traceback" not in err and "cpu_adam" not in err, err
    assert "error: stopped by SIGTERM: a process failed, on this node or another, or the run was cancelled" in err
    m = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("stopped by SIGTERM"), m["error"]


# liger-kernel, as a signal finds its import (seconds: triton, transformers' models): the class its import builds
# holds a dataclass field, in whose __set_name__ the signal lands
LIGER_IMPORTING = """
import os, signal


class Field:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.{sig})  # torchrun's SIGTERM, or Ctrl-C, landing while the class is built
        for _ in range(1000):  # where Python looks for signals
            pass


class LigerConfig:
    rms_norm = Field()


monkey_patch = None
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_landing_while_a_library_import_builds_a_class_is_not_taken_for_the_library_s_failure(
        tmp_path, capsys, monkeypatch, sig):
    """A signal landing while an import built a class (a dataclass's fields) was raised by Python 3.11 wrapped in
    'RuntimeError: Error calling __set_name__ ...', which the libraries' and the trainer's own `except Exception`
    around an import took for a failure of the import: the trainer's check of liger-kernel said it "does not
    import", and the run went on to train, its stop spent (every later SIGTERM ignored, until torchrun's SIGKILL: no
    manifest). The trainer's signals are now raised once the class is built. liger-kernel is a stand-in whose
    import gets the signal; Trainer.train one that says the run went on."""
    import logging
    import signal
    import sys

    import transformers

    from dockyard.train.__main__ import main

    (tmp_path / "liger_kernel" / "transformers").mkdir(parents=True)
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (tmp_path / "liger_kernel" / "transformers" / "__init__.py").write_text(
        LIGER_IMPORTING.replace("{sig}", sig) + "_apply_liger_kernel_to_instance = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("liger_kernel")]:
        monkeypatch.delitem(sys.modules, name)

    def went_on(self, *args, **kwargs):
        trained.append(sig)
        raise AssertionError("the run went on to train past its stop")

    trained: list[str] = []

    monkeypatch.setattr(transformers.Trainer, "train", went_on)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err
    m = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert trained == [] and code == 128 + getattr(signal, sig), (trained, code, err[-2000:])
    assert m["status"] == "failed" and m["error"].startswith(
        "stopped by SIGTERM" if sig == "SIGTERM" else "interrupted (SIGINT)"), m["error"]
    assert "went on to train" not in m["error"] and m["metrics"]["steps"] == 0


def test_ctrl_c_before_the_first_checkpoint_does_not_point_to_one(tmp_path, capsys, monkeypatch):
    """"continue it from its last complete checkpoint with --resume" when no checkpoint had been saved: --resume then
    started from step 0. Trainer.train is a stand-in raising what Ctrl-C raises."""
    import logging

    import transformers

    from dockyard.train.__main__ import main

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.Trainer, "train", interrupted)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 130 and ("error: interrupted (SIGINT): the run stopped; no checkpoint was saved yet, so --resume "
                            "would start it again from the first step") in err, err


def test_a_run_no_command_summarises_ends_on_a_line_of_how_it_went_and_where_the_model_is(tmp_path, caplog,
                                                                                          monkeypatch):
    """Started by run.sh, an sbatch script or a pod, the console ended on the last save's progress bar; `invoke run`
    prints its own summary from the manifest (DOCKYARD_SUMMARISED), so the trainer says nothing more there."""
    import argparse

    from dockyard.common import envvars
    from dockyard.train import manifest
    from dockyard.train.ending import say_done
    from dockyard.train.record import Run

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.5}\n{"step": 4, "loss": 5.25}\n')
    manifest.write(tmp_path, manifest.build(tmp_path, load_recipe("ddp"), "completed", 2, None,
                                            {"steps": 4, "tokens_per_second": 5849.2}, {}))
    run = Run(opts=argparse.Namespace(run_dir=tmp_path), started=0.0, is_main=True)
    caplog.set_level("INFO", logger="dockyard.train")
    monkeypatch.delenv(envvars.SUMMARISED, raising=False)
    say_done(run)
    assert (f"run {tmp_path.name} completed: 4 steps · loss 6.5000 → 5.2500 · 5849 tokens/s; the model is in "
            f"{tmp_path / 'model'}, the record in {tmp_path / 'manifest.json'}") in caplog.text
    caplog.clear()
    monkeypatch.setenv(envvars.SUMMARISED, "1")
    say_done(run)
    assert "completed" not in caplog.text


def test_the_start_up_lines_say_what_trains_as_resolved_not_the_settings_as_given(tmp_path):
    """"recipe lora (ddp) ...; settings {'model': '', ..., 'global_batch': 'auto', 'lora_r': 16, ...}": `auto` where
    the run had a number, LoRA's rank on runs without adapters, nothing of the batch, steps or precision."""
    from dockyard.train.__main__ import in_words, run_in_words

    recipe = load_recipe("qlora")
    settings, overrides = resolve_settings(recipe, {"max_steps": 3, "lora_r": 8})
    assert in_words(recipe, settings) == "ddp + LoRA r=8 on a 4-bit base"
    assert in_words(load_recipe("zero3-offload"), settings) == ("zero3-offload, optimizer offloaded, parameters "
                                                                "offloaded")
    assert in_words(load_recipe("fsdp"), settings) == "fsdp"
    args = cpu_arguments("ddp", {"max_steps": 3, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
                         tmp_path)
    said = run_in_words(args, settings, {"padding_free": {"value": True, "why": "chat data"},
                                         "packing": {"value": False, "why": "-"}})
    assert said == ("3 steps of 8 examples (4 per process x 2 accumulated x 1 process(es)), up to 128 tokens each · "
                    f"lr {args.learning_rate:g} · fp32 · gradient checkpointing off · torch_compile off · padding_free on")
    # a LoRA base on CPU is bf16 under fp32 compute: the line said "fp32" alone, the manifest and export bfloat16
    assert " · fp32, bfloat16 base weights · " in run_in_words(args, settings, {}, "bfloat16")
    # the newcomer audit: a run by epochs said "1 epoch(s) of 16 examples", an epoch of 16 examples
    by_epochs = cpu_arguments("ddp", {"max_steps": -1, "num_train_epochs": 1, "per_device_train_batch_size": 4}, tmp_path)
    assert run_in_words(by_epochs, settings, {}).startswith("1 epoch(s) in steps of 4 examples (4 per process x 1 "
                                                            "accumulated x 1 process(es)), up to 128 tokens each · ")


@pytest.mark.parametrize("when", ["as the library unwinds", "as the record is written"])
def test_ctrl_c_followed_by_torchruns_sigterm_is_recorded_as_interrupted(tmp_path, capsys, monkeypatch, when):
    """Ctrl-C reaches every process of the terminal's group: the workers' KeyboardInterrupt, and torchrun, which
    then sends the workers SIGTERM. Landing while a worker unwound or recorded the interrupt, the SIGTERM made the
    record "stopped by SIGTERM" (exit 143), which reads as a cancel or another rank's failure. Trainer.train is a
    stand-in raising what Ctrl-C raises; the SIGTERM is real, sent to this process at that moment."""
    import json
    import logging
    import signal

    import transformers

    from dockyard.train import __main__ as entry
    from dockyard.train import ending

    def interrupted(self, *args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            if when == "as the library unwinds":
                os.kill(os.getpid(), signal.SIGTERM)

    how_to_continue = ending._how_to_continue

    def sigterm_then(run):
        if when == "as the record is written":
            os.kill(os.getpid(), signal.SIGTERM)
        return how_to_continue(run)

    monkeypatch.setattr(transformers.Trainer, "train", interrupted)
    monkeypatch.setattr(ending, "_how_to_continue", sigterm_then)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    old = signal.getsignal(signal.SIGTERM)
    try:
        code = entry.main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    finally:
        signal.signal(signal.SIGTERM, old)
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err and "SIGTERM" not in err, err
    m = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("interrupted (SIGINT): the run stopped"), m["error"]


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"])
def test_a_launcher_count_set_as_a_word_is_one_line_before_anything_is_made(tmp_path, capsys, monkeypatch, name):
    """The twelfth red-team pass: `WORLD_SIZE=abc` (torchrun's variables set by hand) was int()'s traceback."""
    from dockyard.train.__main__ import main

    monkeypatch.setenv(name, "abc")
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1")])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {name}='abc' is not a whole number: torchrun sets it" in err, err
    assert "Traceback" not in err and not (tmp_path / "r1").exists()


@pytest.mark.parametrize("bars", [None, "false"], ids=["recipe-default", "disable_tqdm-false"])
def test_a_run_says_its_steps_without_the_libraries_progress_bars_or_their_mtime_warning(tmp_path, capsys, bars):
    """recipes/defaults.yaml sets disable_tqdm (progress bars garble log files), yet every run's console had
    transformers' "Loading weights: 0%|..." bar and one "Writing model shards" bar per save, and at the first
    checkpoint rotation "WARNING transformers.trainer_utils: mtime may not be reliable on this filesystem, falling
    back to numerical ordering" (checkpoints written within a second: the numerical order, checkpoint-STEP, is the
    right one, and the one kept). `--disable_tqdm false` brings the bars back. A real run, in this process."""
    import logging

    import transformers

    from dockyard.train.__main__ import main

    shown = transformers.utils.logging.is_progress_bar_enabled()
    logging.Logger.warning_once.cache_clear()  # transformers says it once per process: as a new one
    transformers.utils.logging.enable_progress_bar()  # as a new process has them
    try:
        with real_loggers():
            code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "3",
                         "--save_steps", "1", "--save_total_limit", "1", *(["--disable_tqdm", bars] if bars else [])])
            for h in logging.root.handlers:
                h.flush()
    finally:
        (transformers.utils.logging.enable_progress_bar if shown else transformers.utils.logging.disable_progress_bar)()
    err = capsys.readouterr().err
    assert code == 0, err
    assert "step 3/3" in err and "mtime" not in err, err
    assert sorted(p.name for p in (tmp_path / "r1" / "checkpoints").iterdir()) == ["checkpoint-3"]
    for bar in ("Loading weights", "Writing model shards"):
        assert (bar in err) is (bars == "false"), err


def test_a_deepspeed_section_replaces_the_trainers_optimizer_and_schedule_for_both_guards():
    """Review: check_optim and check_schedule_kwargs each read the DeepSpeed config of the Trainer's arguments in a copy
    of the same expression; one helper (guards.deepspeed_sections) now answers both: where DeepSpeed's own section
    makes the optimizer or the schedule, neither guard asks the Trainer about its own."""
    from types import SimpleNamespace

    from dockyard.train import guards

    sections = {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}}
    given = SimpleNamespace(deepspeed=sections, hf_deepspeed_config=None, optim="no_such_optimizer",
                            optim_args="foo=1", lr_scheduler_type="constant", lr_scheduler_kwargs={"foo": 1})
    assert guards.deepspeed_sections(given) == sections
    assert guards.deepspeed_sections(SimpleNamespace(deepspeed="ds.json", hf_deepspeed_config=SimpleNamespace(
        config=sections))) == sections
    assert guards.deepspeed_sections(SimpleNamespace(deepspeed=None)) == {}
    guards.check_optim(given)  # neither refuses: DeepSpeed's sections are used, not the Trainer's settings
    guards.check_schedule_kwargs(given)


def test_the_lines_a_run_in_a_container_prints_name_the_hosts_paths_of_its_mounts(tmp_path, capsys, monkeypatch):
    """A run.sh user read "data /workspace/inputs/data/x.jsonl: format ...", "the model is in /workspace/runs/r1/model,
    the record in ..." and "error: cannot read /workspace/inputs/data/x.jsonl:2: ...": the container's paths, which
    they do not have (invoke run rewrites the lines it streams; run.sh hands them on as they are). The trainer says
    the host's paths of the mounts DOCKYARD_HOST_PATHS names (run.sh names them all). Here tmp_path/inside plays the
    container's side."""
    import logging

    from dockyard.common import envvars
    from dockyard.train.__main__ import main

    inside = tmp_path / "inside"
    data = inside / "inputs" / "x.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}"}) + "\n" for i in range(16)))
    monkeypatch.setenv(envvars.HOST_PATHS, json.dumps({str(inside / "runs"): "/node/my runs",
                                                       str(data): "/node/data/x.jsonl"}))
    monkeypatch.delenv(envvars.SUMMARISED, raising=False)  # as run.sh starts it: the trainer says how it went
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = main(["--recipe", "ddp", "--run-dir", str(inside / "runs" / "r1"), "--", "--data", str(data),
                 "--max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "data /node/data/x.jsonl: format prompt_completion" in err
    assert "the model is in /node/my runs/r1/model, the record in /node/my runs/r1/manifest.json" in err
    assert str(inside) not in err
    assert json.loads((inside / "runs" / "r1" / "manifest.json").read_text())["inputs"]["data"]["path"] == \
        "/node/data/x.jsonl", "the record is as before"

    data.write_text(data.read_text() + "{not json\n")
    code = main(["--recipe", "ddp", "--run-dir", str(inside / "runs" / "r2"), "--", "--data", str(data)])
    err = capsys.readouterr().err
    assert code == 1 and "error: cannot read /node/data/x.jsonl:17: not JSON" in err and str(inside) not in err, err


def test_a_failed_run_in_a_container_records_its_error_and_train_log_with_the_host_s_paths(tmp_path, capsys,
                                                                                              monkeypatch):
    """The console said "error: /tmp/w73/bad.jsonl: example 41's text is int" (errors.on_host), but the manifest's
    error, which `invoke run`'s last line, `invoke runs` and a user read on the host, kept the container's path
    (/workspace/inputs/data/bad.jsonl), and so did train.log's lines ("loading configuration file
    /workspace/runs/r1/base/config.json"). Both are written with the host's paths of the mounts DOCKYARD_HOST_PATHS
    names now (invoke run names them all, as run.sh does). Here tmp_path/inside plays the container's side."""
    import logging

    from dockyard.common import envvars
    from dockyard.train.__main__ import main

    inside = tmp_path / "inside"
    data = inside / "inputs" / "x.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}"}) + "\n" for i in range(16))
                    + "{not json\n")
    monkeypatch.setenv(envvars.HOST_PATHS, json.dumps({str(inside / "runs"): "/node/my runs",
                                                       str(data): "/node/data/x.jsonl"}))
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = main(["--recipe", "ddp", "--run-dir", str(inside / "runs" / "r1"), "--", "--data", str(data)])
    capsys.readouterr()
    assert code == 1
    error = json.loads((inside / "runs" / "r1" / "manifest.json").read_text())["error"]
    assert "/node/data/x.jsonl:17: not JSON" in error and str(inside) not in error, error
    log = (inside / "runs" / "r1" / "train.log").read_text()
    assert "/node/my runs/r1" in log and str(inside) not in log, log


@pytest.mark.parametrize("share, refused", [(1.0, False), (0.6, True)])
def test_a_node_with_the_host_memory_the_plan_counts_for_an_offload_run_is_not_refused_by_the_trainer(
        tmp_path, capsys, monkeypatch, share, refused):
    """zero2-offload on a node of 8 GPUs in bf16: `invoke plan` counts each process loading 16-bit weights (2 bytes a
    weight, 8d48016), the trainer's host-memory guard counted 4: it asked the node for twice what the plan said and
    refused the very run the plan recommended. No GPU here: the device is said as an H100's, the host's free memory
    is the plan's figure (or less), and the run stops where the process group would form."""
    import logging

    from dockyard.common import memory
    from dockyard.common.errors import DockyardError
    from dockyard.machine import planner
    from dockyard.train import __main__ as entry
    from dockyard.train import environment, guards

    h100 = autos.Device("NVIDIA H100 80GB HBM3", 80 << 30, (9, 0))
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(environment, "device_from_torch", lambda: h100)
    run_dir = tmp_path / "r1"

    def as_planned() -> int:  # the model is the tiny one the trainer makes in the run folder
        shape = memory.shape_from_folder(run_dir / "base")
        rows = planner.plan(shape, gpus=8, gpu_mem=h100.memory_bytes, cpu_mem=1 << 40, seq_len=128,
                            device=h100)["recipes"]
        return int(next(r for r in rows if r["recipe"] == "zero2-offload")["host_bytes"] * share)

    def formed(*args, **kwargs):
        raise DockyardError("the process group would form here")

    monkeypatch.setattr(guards, "host_memory_available", as_planned)
    monkeypatch.setattr(entry, "start_processes", formed)
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)
    code = entry.main(["--recipe", "zero2-offload", "--run-dir", str(run_dir), "--", "--max_steps", "1",
                       "--max_seq_length", "128"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert ("host RAM" in err) is refused and ("the process group would form here" in err) is not refused, err


def test_the_trainers_report_to_and_optim_args_refusals_say_a_long_value_cut(tmp_path):
    """report_to and optim_args are read by the trainer as it starts (the host takes any text): a name of 5,000
    characters was said whole in 'report_to <it>: not installed in this image', and optim_args' refusals the same.
    Each says it cut, as every value said back, in one short line."""
    from transformers import TrainingArguments

    from dockyard.common.errors import DockyardError
    from dockyard.train import guards

    long = "q" * 5000
    said = []
    for refuse in (lambda: guards.check_report_to(long), lambda: guards.check_report_to([long, long]),
                   lambda: guards.check_optim(TrainingArguments(output_dir=str(tmp_path), optim_args=long)),
                   lambda: guards.check_optim(TrainingArguments(output_dir=str(tmp_path), optim="sgd",
                                                                optim_args=f"{long}=1")),
                   lambda: guards.check_optim(TrainingArguments(output_dir=str(tmp_path), optim="sgd",
                                                                optim_args="weight_decay=0." + "1" * 5000))):
        with pytest.raises(DockyardError) as refused:
            refuse()
        said.append(str(refused.value))
    assert [s.split(" ")[0] for s in said] == ["report_to"] * 2 + ["optim"] + ["optim_args"] * 2, said
    assert all(len(s) < 400 and "\n" not in s for s in said), [len(s) for s in said]


def test_a_stop_that_cannot_be_deferred_for_want_of_a_thread_is_raised_not_lost(monkeypatch):
    """Inside a class being built, the trainer's signal is sent again from a thread; a process at its pid limit has
    no thread to give (Timer.start: "can't start new thread", a stand-in here), and that RuntimeError took the
    signal's place, the stop lost. The stop is then raised where it landed (wrapped, which the trainer unwraps)."""
    import os
    import signal
    import threading

    from dockyard.common.errors import raised_outside_a_class_being_built, wrapped_signal

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop(signum)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    class Field:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGUSR1)  # the signal lands here, while the class is built

    monkeypatch.setattr(threading.Timer, "start", no_thread)
    before = signal.signal(signal.SIGUSR1, raised_outside_a_class_being_built(stop))
    try:
        with pytest.raises((RuntimeError, Stop)) as raised:  # wrapped by Python 3.11; 3.12 and later raise it as it is
            class Built:  # noqa: F841 - built for its field's __set_name__
                buffer = Field()
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert isinstance(raised.value, Stop) or isinstance(wrapped_signal(raised.value, (Stop,)), Stop), \
        raised.value.__cause__
