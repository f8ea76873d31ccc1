"""TrainingArguments the run hands the Trainer as given, whose nonsense values passed `invoke run --dry` and stopped the
run minutes later inside the trainer (or trained it wrong): refused on the host now, in one `error:` line naming the
setting, and the values transformers takes (and trains with) still taken. Through the real CLI, in this process."""

from __future__ import annotations

import inspect
import re

import pytest

import tasks  # noqa: F401 - the tasks the CLI runs
from dockyard.common.errors import DockyardError
from tests.support.cli import invoke_here, short_error


@pytest.fixture
def dry(tmp_path):
    runs = tmp_path / "runs"

    def run(*overrides: str, recipe: str = "ddp", native: bool = False):
        r = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={recipe}", *(["--native"] if native else []),
                        "--", *overrides, env={"INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
        assert "Traceback" not in r.stdout + r.stderr
        return r

    yield run
    assert not runs.exists() or not any(runs.iterdir()), "a dry run makes no run folder"


def refused(r, *says: str) -> None:
    short_error(r, says[0])
    assert all(s in r.stderr for s in says), r.stderr
    assert "-m dockyard.train" not in r.stderr, "refused before the command"


def test_a_learning_rate_no_run_means_is_refused_and_any_optimizers_own_is_taken(dry):
    """`--learning_rate 1e20` (or 3e4, for 3e-4) passed --dry: torch takes any rate of 0 or more, and the run trained
    to nan."""
    for typed in ("1e20", "3e4", "101"):
        refused(dry("--learning_rate", typed), "learning_rate", "takes a number from 0 to 100")
    for fine in ("1e-4", "0.5", "1", "30"):  # 30: SGD's, in AWD-LSTM
        assert dry("--learning_rate", fine, "--optim", "sgd").returncode == 0


def test_schedule_kwargs_the_schedule_does_not_read_or_cannot_do_without_are_refused_before_the_run(dry):
    """`--lr_scheduler_kwargs '{foo: 1}'` (or `5`, or a schedule's kwarg given to another) passed --dry: the trainer
    refused it once the image had started (reduce_lr_on_plateau's: torch, once the model had loaded), and
    `warmup_stable_decay` or `cosine_with_min_lr` without the kwarg it needs stopped the run once the model had
    loaded."""
    refused(dry("--lr_scheduler_kwargs", "{foo: 1}"), "lr_scheduler_kwargs foo: lr_scheduler_type cosine reads no foo "
                                                     "(it takes num_cycles); leave it out")
    refused(dry("--lr_scheduler_kwargs", "5"), "lr_scheduler_kwargs 5: takes a mapping")
    refused(dry("--lr_scheduler_type", "constant", "--lr_scheduler_kwargs", "{num_cycles: 5}"),
            "lr_scheduler_type constant reads no kwargs", "pick a schedule that reads num_cycles (cosine,")
    refused(dry("--lr_scheduler_type", "warmup_stable_decay"), "lr_scheduler_type warmup_stable_decay needs "
                                                             "num_decay_steps in lr_scheduler_kwargs")
    refused(dry("--lr_scheduler_type", "reduce_lr_on_plateau", "--lr_scheduler_kwargs", "{foo: 1}", "--eval_fraction",
                "0.1"), "lr_scheduler_type reduce_lr_on_plateau reads no foo (it takes mode, factor, patience")
    refused(dry("--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", "{num_cycles: 0.5}"),
            "needs min_lr or min_lr_rate")
    # a kwarg it needs given as null (none, to transformers), or both of two it takes one of: passed --dry, and
    # stopped the run once the model had loaded
    refused(dry("--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", "{min_lr: null}"),
            "lr_scheduler_type cosine_with_min_lr needs min_lr or min_lr_rate in lr_scheduler_kwargs (min_lr: null "
            "gives none): give it, as in --lr_scheduler_kwargs '{min_lr: 1e-05}'")
    refused(dry("--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs", "{num_decay_steps: ~}"),
            "needs num_decay_steps in lr_scheduler_kwargs (num_decay_steps: null gives none)")
    refused(dry("--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", "{min_lr: 1e-5, min_lr_rate: 0.1}"),
            "lr_scheduler_kwargs gives min_lr and min_lr_rate: lr_scheduler_type cosine_with_min_lr takes one of them")
    for fine in (["--lr_scheduler_kwargs", "{num_cycles: 0.25}"],
                 ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", "{min_lr: 1e-5}"],
                 ["--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs", "{num_decay_steps: 10}"],
                 ["--lr_scheduler_type", "reduce_lr_on_plateau", "--lr_scheduler_kwargs", "{patience: 2}",
                  "--eval_fraction", "0.1"]):
        assert dry(*fine).returncode == 0, fine


def test_the_schedules_kwargs_the_host_knows_are_what_the_pinned_transformers_reads():
    """What the host checks lr_scheduler_kwargs against, asked of transformers as the trainer asks it; and each
    schedule said to need a kwarg is one transformers cannot make without it (and can with it)."""
    import torch
    from torch.optim.lr_scheduler import ReduceLROnPlateau
    from transformers.optimization import GreedyLR, SchedulerType, get_scheduler

    from dockyard.common import passthrough
    from dockyard.train import guards

    handed_to = {"reduce_lr_on_plateau": ReduceLROnPlateau, "greedy": GreedyLR}  # their kwargs: the class's parameters
    read = {t.value: guards.schedule_kwargs(t) for t in SchedulerType}
    assert {t for t, keys in read.items() if keys is None} == set(handed_to)
    read |= {t: tuple(inspect.signature(c).parameters)[1:] for t, c in handed_to.items()}  # less the optimizer
    assert passthrough.SCHEDULE_KWARGS == read
    assert set(passthrough.HANDED_NONE) == {t.value for t in SchedulerType if not guards.hands_on_kwargs(t)}

    def made(kind, kwargs) -> bool:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        try:
            get_scheduler(kind, optimizer, num_warmup_steps=1, num_training_steps=10, scheduler_specific_kwargs=kwargs)
        except (TypeError, ValueError):
            return False
        return True

    for kind in passthrough.SCHEDULE_KWARGS:
        needs = passthrough.SCHEDULE_NEEDS.get(kind, ())
        assert made(kind, {}) == (not needs), kind
        assert all(made(kind, {key: passthrough.EXAMPLES[key]}) for key in needs), kind
        assert not any(made(kind, {key: None}) for key in needs), kind  # null: not given
        assert len(needs) < 2 or not made(kind, {key: passthrough.EXAMPLES[key] for key in needs}), kind  # one of them


def test_optim_args_the_trainer_cannot_split_into_pairs_are_refused_before_the_run(dry, tmp_path):
    """`--optim_args foo` (or 5, or a mapping, or a trailing comma) passed --dry and stopped the run in the trainer;
    each is text transformers' own parser cannot split into key=value pairs, or no text at all."""
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_optimizer import _parse_optim_args

    for typed in ("foo", "momentum=0.9,", "a=b=c", "=3", "momentum=0.9;nesterov=True"):
        refused(dry("--optim", "sgd", "--optim_args", typed), f"optim_args {typed!r}: ", "is not a key=value pair")
        try:  # transformers' refusal too, or a key no optimizer reads
            assert "" in _parse_optim_args(typed)
        except ValueError:
            pass
    refused(dry("--optim_args", "5"), "optim_args 5: takes key=value pairs, comma-separated")
    refused(dry("--optim", "sgd", "--optim_args", "{momentum: 0.9, nesterov: true}"),
            "optim_args {'momentum': 0.9, 'nesterov': True}: the Trainer reads it as text, not a mapping: write "
            "--optim_args momentum=0.9,nesterov=True")
    refused(dry("--optim_args"), "--optim_args was given no value")
    # `{a:1}` without the blank YAML wants is the key `a:1` with no value: `a:1=None` was the pair suggested
    refused(dry("--optim", "sgd", "--optim_args", "{momentum:0.9, nesterov: true, dampening}"),
            "optim_args {'momentum:0.9': None, 'nesterov': True, 'dampening': None}: YAML reads momentum:0.9, dampening "
            "as a key without a value (a value follows ': ', with its blank), and the Trainer reads it as text, not a "
            "mapping: write --optim_args momentum=0.9,nesterov=True,dampening=VALUE")
    for fine in ("momentum=0.9,nesterov=True", " momentum = 0.9 ", "momentum=0.9,dampening=0"):
        assert dry("--optim", "sgd", "--optim_args", fine).returncode == 0, fine
        args = TrainingArguments(output_dir=str(tmp_path), optim="sgd", optim_args=fine, use_cpu=True)
        assert Trainer.get_optimizer_cls_and_kwargs(args)[1]["momentum"] == 0.9  # transformers takes it


def test_label_names_other_than_the_batches_labels_are_refused_before_the_run(dry):
    """`--label_names labels` (text, not a list) passed --dry and stopped the run with a TypeError once the model had
    loaded; `--label_names '[foo]'` passed, trained, and evaluated with no loss: metrics.jsonl held no eval_loss, and the
    run said completed. The run's batches hold their labels as `labels`, either task's."""
    for typed in ("labels", "5", "[1]", "[]", "{a: 1}"):
        refused(dry("--label_names", typed), "label_names", "takes a list of names, as in --label_names '[labels]'")
    refused(dry("--label_names", "[label]", "--eval_fraction", "0.1"),
            "label_names ['label']: the run's batches hold their labels as labels alone, and an evaluation would find "
            "no label and compute no loss")
    assert dry("--label_names", "[labels]", "--eval_fraction", "0.1").returncode == 0
    assert dry("--label_names", "[labels]", "--task", "seq_cls").returncode == 0


def test_report_to_an_integration_the_run_cannot_report_to_is_refused_before_the_run(dry, monkeypatch):
    """`--report_to wandb` (or a misspelt name, or 5) passed --dry: the run stopped once the model had loaded, wandb
    being in no image, and its servers out of the offline training nodes' reach. Now: a name transformers knows, none
    and all alone, none that reports to a server, and installed where the run trains (the image's lock; --native, this
    host's Python)."""
    from types import SimpleNamespace

    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_reporting_integration_callbacks,
    )

    from dockyard.common import passthrough

    assert set(passthrough.REMOTE) | set(passthrough.LOCAL) == set(INTEGRATION_TO_CALLBACK)
    assert not set(passthrough.REMOTE) & set(passthrough.LOCAL)
    for name in ("wandb", "comet_ml", "neptune", "clearml"):
        refused(dry("--report_to", name), f"report_to {name}: it sends the run to ", "cannot reach (runs are offline)")
    refused(dry("--report_to", "tensorbord"), "report_to tensorbord: did you mean tensorboard?")
    refused(dry("--report_to", "5"), "report_to 5: takes an integration's name, a list of them, or none")
    for typed in ("[none, tensorboard]", "[all, mlflow]"):
        refused(dry("--report_to", typed), "none and all stand alone")
        with pytest.raises(ValueError):  # as transformers' Trainer refuses them
            get_reporting_integration_callbacks(read_as_an_override(typed))
    with pytest.raises(ValueError):
        get_reporting_integration_callbacks(["tensorbord"])
    refused(dry("--report_to", "tensorboard"), "report_to tensorboard: not installed in the cpu image (installed: none)")
    for fine in ("none", "all", "[none]"):
        assert dry("--report_to", fine).returncode == 0, fine
    # --native: this host's Python, with the package and without
    have = [SimpleNamespace(metadata={"Name": "tensorboardX"})]
    monkeypatch.setattr("importlib.metadata.distributions", lambda: iter(have))
    assert dry("--report_to", "[tensorboard]", native=True).returncode == 0
    have.clear()
    refused(dry("--report_to", "tensorboard", native=True), "not installed in this host's Python (--native)")


def test_report_to_an_empty_list_reports_nowhere_as_transformers_reads_it(dry):
    """`report_to: []` (a recipe's settings, or `-- --report_to '[]'`) is what transformers makes of `none`: the
    trainer's guard took it before e8865a0, whose host check refused it as 'takes an integration's name, a list of
    them, or none', and the trainer's check_training_numbers the same."""
    from transformers import TrainingArguments
    from transformers.integrations.integration_utils import get_reporting_integration_callbacks

    from dockyard.common.training_args import check_training_numbers

    assert TrainingArguments(output_dir="/nonexistent", report_to="none").report_to == []
    assert get_reporting_integration_callbacks(read_as_an_override("[]")) == []
    r = dry("--report_to", "[]")
    assert r.returncode == 0, r.stderr
    check_training_numbers({"report_to": []})  # the trainer's check: no refusal


def read_as_an_override(typed: str, key: str = "report_to"):
    from dockyard.common.overrides import parse_overrides

    return parse_overrides([f"--{key}", typed])[key]


def test_a_dataloader_start_method_torch_refuses_is_refused_before_the_run(dry):
    """`--dataloader_multiprocessing_context spawn` with the default 0 workers (or a start method torch has not) passed
    --dry; torch's DataLoader refused it as the Trainer made it, once the model had loaded."""
    import torch
    from torch.utils.data import DataLoader

    for given in (["spawn"], ["sideways", "--dataloader_num_workers", "2"]):
        refused(dry("--dataloader_multiprocessing_context", *given), "dataloader_multiprocessing_context",
                "with dataloader_num_workers above 0: set both")
        with pytest.raises(ValueError):  # as torch refuses it
            DataLoader(range(4), num_workers=int(given[2]) if len(given) > 1 else 0, multiprocessing_context=given[0])
    assert dry("--dataloader_multiprocessing_context", "spawn", "--dataloader_num_workers", "2").returncode == 0
    DataLoader(range(4), num_workers=2, multiprocessing_context="spawn")  # torch takes it

    from dockyard.common.training_args import START_METHODS

    assert set(START_METHODS) == set(torch.multiprocessing.get_all_start_methods())


def test_an_accelerator_config_key_transformers_does_not_know_is_refused_before_the_run(dry):
    """`--accelerator_config '{even_batch: false}'` (a misspelt key) passed --dry; TrainingArguments refused it with
    a TypeError once the image had started and read the data."""
    from dataclasses import fields

    from transformers.trainer_pt_utils import AcceleratorConfig

    refused(dry("--accelerator_config", "{even_batch: false}"), "accelerator_config: unknown key(s) even_batch; "
                                                               "transformers' AcceleratorConfig takes dispatch_batches")
    with pytest.raises(TypeError):
        AcceleratorConfig(even_batch=False)
    assert dry("--accelerator_config", "{even_batches: false, non_blocking: true}").returncode == 0
    AcceleratorConfig(even_batches=False, non_blocking=True)

    from dockyard.common.passthrough import ACCELERATOR_CONFIG

    assert ACCELERATOR_CONFIG == tuple(f.name for f in fields(AcceleratorConfig))


def test_a_debug_option_transformers_does_not_know_or_that_does_nothing_here_is_refused_before_the_run(dry, tmp_path):
    """`--debug underflow` passed --dry and was TrainingArguments' ValueError once the image had started; written as a
    list (`'[underflow]'`) it went unread, and tpu_metrics_debug does nothing off a TPU."""
    from transformers import TrainingArguments
    from transformers.debug_utils import DebugOption

    refused(dry("--debug", "underflow"), "debug 'underflow': give underflow_overflow")
    with pytest.raises(ValueError):
        TrainingArguments(output_dir=str(tmp_path), debug="underflow", use_cpu=True)
    refused(dry("--debug", "[underflow]"), "debug ['underflow']: give underflow_overflow")
    refused(dry("--debug", "tpu_metrics_debug"), "tpu_metrics_debug prints a TPU's metrics")
    for fine in ("underflow_overflow", "[underflow_overflow]", ""):
        assert dry("--debug", fine).returncode == 0, fine
    assert TrainingArguments(output_dir=str(tmp_path), debug="underflow_overflow", use_cpu=True).debug == [
        DebugOption.UNDERFLOW_OVERFLOW]

    from dockyard.common.training_args import DEBUG_OPTIONS

    assert DEBUG_OPTIONS == tuple(d.value for d in DebugOption)


def test_an_optimizer_whose_package_is_not_where_the_run_trains_is_refused_before_the_run(dry, monkeypatch, tmp_path):
    """`--optim galore_adamw` (and 21 more whose package no image has) passed --dry: the trainer refused it once the
    image had started. The host asks the image's lock (--native: this host's Python) for the package the optimizer's
    maker imports."""
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments
    from transformers.training_args import OptimizerNames

    refused(dry("--optim", "galore_adamw"), "optim galore_adamw: needs galore-torch, which the cpu image has not")
    refused(dry("--optim", "schedule_free_adamw", recipe="zero2"), "needs schedulefree")
    assert dry("--optim", "adamw_bnb_8bit").returncode == 0  # bitsandbytes: in every image's lock
    have = [SimpleNamespace(metadata={"Name": "schedulefree"})]
    monkeypatch.setattr("importlib.metadata.distributions", lambda: iter(have))
    assert dry("--optim", "schedule_free_adamw", native=True).returncode == 0
    refused(dry("--optim", "adamw_8bit", native=True), "optim adamw_8bit: needs bitsandbytes, which this host's Python "
                                                       "(--native) has not")
    monkeypatch.undo()

    from dockyard.common import passthrough

    # each optimizer this Python's transformers cannot make is one said to need a package it has not: the same set
    unmade = {}
    for name in OptimizerNames:
        try:
            Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True))
        except (ImportError, ValueError) as e:
            unmade[name.value] = str(e)
    import importlib.util

    module = {"torch-optimi": "optimi"}  # the package's import name, where it is not its pip name's
    absent = {o: p for o, p in passthrough.OPTIM_PACKAGES.items()
              if importlib.util.find_spec(module.get(p, p.replace("-", "_"))) is None}
    assert set(unmade) == set(absent)
    assert all(p in said or p.replace("-", "_") in said for o, p in absent.items() for said in [unmade[o]])


def test_each_optimizer_transformers_makes_with_a_package_is_said_to_need_it(dry, monkeypatch):
    """`--optim ademamix` (bitsandbytes' AdEMAMix, as ademamix_8bit) was missing from OPTIM_PACKAGES: --native on a
    host without bitsandbytes passed --dry, and the trainer refused it once it had started. The test above cannot see
    it where bitsandbytes is installed (this venv), so each of transformers' own tables of optimizers made by a
    package is read here."""
    from transformers import trainer_optimizer as made

    from dockyard.common import passthrough

    tables = {"_BITSANDBYTES_OPTIMIZERS": "bitsandbytes", "_GALORE_OPTIMIZERS": "galore-torch",
              "_APOLLO_OPTIMIZERS": "apollo-torch", "_TORCHAO_OPTIMIZERS": "torchao",
              "_SCHEDULE_FREE_OPTIMIZERS": "schedulefree"}
    for table, package in tables.items():
        for name in getattr(made, table):
            assert passthrough.OPTIM_PACKAGES.get(name.value) == package, (name.value, package)
    monkeypatch.setattr("importlib.metadata.distributions", lambda: iter([]))
    refused(dry("--optim", "ademamix", native=True), "optim ademamix: needs bitsandbytes, which this host's Python "
                                                     "(--native) has not")


def test_a_collective_timeout_no_process_group_can_keep_is_refused_before_the_run(dry):
    """`--ddp_timeout 0` (meant as "never") passed --dry, and every process of the run timed out as it connected
    ("The client socket has timed out after 0ms"); 10**13 seconds was gloo's "Invalid timeout" (its nanoseconds past
    int64). Both met once the image had started."""
    for typed in ("0", "-5", "10000000000000"):
        refused(dry("--ddp_timeout", typed), f"ddp_timeout {typed}: TrainingArguments.ddp_timeout takes a number from 1 "
                                             "to 1000000000")
    for fine in ("1800", "86400", "1000000000"):  # a day; 31 years
        assert dry("--ddp_timeout", fine).returncode == 0, fine


def test_load_best_model_at_end_with_checkpoints_not_saved_where_the_run_evaluates_is_refused_before_the_run(
        dry, tmp_path):
    """`--load_best_model_at_end true --eval_strategy epoch --save_strategy steps` passed --dry; TrainingArguments
    refused it once the image had started. Each refused here is refused by TrainingArguments too, given the
    strategies the trainer gives it (an evaluation every logging step with held-out data), and each taken is taken."""
    from transformers import TrainingArguments

    def trainer_takes(**given) -> bool:
        args = {"eval_strategy": "steps", "eval_steps": given.get("logging_steps", 5), "save_steps": 25, **given}
        try:
            TrainingArguments(output_dir=str(tmp_path), use_cpu=True, load_best_model_at_end=True, **args)
        except ValueError:
            return False
        return True

    best = ("--load_best_model_at_end", "true", "--eval_fraction", "0.1")
    for given, says in (({"eval_strategy": "epoch", "save_strategy": "steps"},
                         "found eval_strategy epoch and save_strategy steps: give --save_strategy epoch (or best)"),
                        ({"save_strategy": "epoch"}, "found eval_strategy steps and save_strategy epoch"),
                        ({"logging_steps": 10}, "found save_steps 25 and eval_steps 10: give --save_steps a multiple "
                                                "of 10"),
                        ({"eval_steps": 0.3, "save_steps": 0.5}, "found save_steps 0.5 and eval_steps 0.3"),
                        ({"eval_steps": 0.3}, "found save_steps 25 and eval_steps 0.3")):
        typed = [x for k, v in given.items() for x in (f"--{k}", str(v))]
        refused(dry(*best, *typed), "load_best_model_at_end true requires the ", says)
        assert not trainer_takes(**given), given
    for given in ({}, {"save_strategy": "best"}, {"eval_strategy": "epoch", "save_strategy": "epoch"},
                  {"eval_steps": 5, "save_steps": 50}, {"eval_steps": 0.1, "save_steps": 0.3}):
        typed = [x for k, v in given.items() for x in (f"--{k}", str(v))]
        assert dry(*best, *typed).returncode == 0, given
        assert trainer_takes(**given), given


def test_a_schedule_steered_by_the_evaluation_loss_without_an_evaluation_is_refused_before_the_run(dry):
    """`--lr_scheduler_type greedy` (transformers' GreedyLR, steered by the evaluation loss, as reduce_lr_on_plateau)
    with no held-out data passed --dry; TrainingArguments refused it only inside the trainer ("requires an eval
    strategy")."""
    for kind in ("greedy", "reduce_lr_on_plateau"):
        refused(dry("--lr_scheduler_type", kind), f"lr_scheduler_type {kind} needs an evaluation",
                "--eval_fraction 0.05")
        refused(dry("--lr_scheduler_type", kind, "--eval_fraction", "0.1", "--eval_strategy", "no"),
                f"lr_scheduler_type {kind} needs an evaluation")
        assert dry("--lr_scheduler_type", kind, "--eval_fraction", "0.1").returncode == 0


def test_report_to_all_where_an_integration_that_reports_elsewhere_is_installed_is_refused_before_the_run(
        dry, monkeypatch):
    """`--report_to all` reports to every integration installed where the run trains: on a host whose Python has wandb
    (--native), it passed --dry, where `--report_to wandb` is refused, and the run reported to W&B's servers (or stopped
    in the trainer, out of their reach). Refused by the host and the trainer's guard; all is still taken where only
    local integrations are installed, as dagshub without mlflow (which transformers does not count)."""
    from types import SimpleNamespace

    import transformers.integrations

    from dockyard.train import guards

    have = [SimpleNamespace(metadata={"Name": "wandb"}), SimpleNamespace(metadata={"Name": "tensorboard"})]
    monkeypatch.setattr("importlib.metadata.distributions", lambda: iter(have))
    for typed in ("all", "[all]"):
        refused(dry("--report_to", typed, native=True), "report_to all: reports to every integration installed in "
                "this host's Python (--native), and wandb sends the run to Weights & Biases' servers")
    assert dry("--report_to", "tensorboard", native=True).returncode == 0  # named: reported there alone
    have[:] = [SimpleNamespace(metadata={"Name": n}) for n in ("tensorboard", "dagshub")]
    assert dry("--report_to", "all", native=True).returncode == 0
    have.append(SimpleNamespace(metadata={"Name": "mlflow"}))
    refused(dry("--report_to", "all", native=True), "dagshub sends the run to DagsHub's servers")
    monkeypatch.undo()  # transformers' lazy imports read the real distributions

    # the trainer's guard, which run.sh's and --native's runs meet: transformers' own count of what is installed
    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations",
                        lambda: ["tensorboard", "comet_ml"])
    with pytest.raises(DockyardError, match="report_to all: .* comet_ml sends the run to Comet's servers"):
        guards.check_report_to("all")
    guards.check_report_to("tensorboard")
    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations", lambda: ["tensorboard"])
    guards.check_report_to("all")


def test_gradient_accumulation_kwargs_accelerate_cannot_take_or_that_replace_the_runs_accumulation_are_refused(dry):
    """accelerator_config's gradient_accumulation_kwargs is handed to accelerate's GradientAccumulationPlugin as the
    Trainer is made, after the model has loaded: `{gradient_accumulation_kwargs: 5}` (or a key it has not) passed --dry
    and stopped the run there with a TypeError, and `{num_steps: 8}` replaced the gradient_accumulation_steps the run
    settles from global_batch (where it is 1: each step trained 8 times the global batch the run said and recorded;
    above 1, a ValueError there). Refused by the host and the trainer's check; accelerate's own settings still taken."""
    from dataclasses import fields

    from accelerate.utils import GradientAccumulationPlugin

    from dockyard.common import passthrough
    from dockyard.common.training_args import check_training_numbers

    for typed, says in (("{gradient_accumulation_kwargs: 5}", "gradient_accumulation_kwargs 5: takes a mapping"),
                        ("{gradient_accumulation_kwargs: {foo: 1}}", "gradient_accumulation_kwargs: unknown key(s) foo"),
                        ("{gradient_accumulation_kwargs: {num_steps: 8}}", "gradient_accumulation_kwargs: leave num_steps out")):
        refused(dry("--accelerator_config", typed), f"accelerator_config: {says}")
        with pytest.raises(DockyardError, match=re.escape(says)):  # the trainer's check, for run.sh and --native
            check_training_numbers({"accelerator_config": read_as_an_override(typed, "accelerator_config")})
    assert dry("--accelerator_config", "{gradient_accumulation_kwargs: {sync_each_batch: true}}").returncode == 0
    GradientAccumulationPlugin(sync_each_batch=True)
    assert set(passthrough.ACCUMULATION_KWARGS) == {f.name for f in fields(GradientAccumulationPlugin)} - {"num_steps"}


def test_a_liger_kernel_config_that_is_not_a_mapping_of_kernel_names_is_refused_before_the_run(dry):
    """liger_kernel_config is spread as keyword arguments into Liger's patch of the model (transformers'
    apply_liger_kernel: `**kernel_config`) as the Trainer is made, after the model has loaded, wherever
    use_liger_kernel is on (defaults.yaml's auto: every GPU run Liger applies to): `-- --liger_kernel_config 5` (or
    '[rope]', or a key that is no name) passed --dry and stopped the run there with a TypeError. Refused by the host
    and the trainer's check; a mapping of kernel names to true or false is still taken."""
    import inspect

    from transformers.integrations import liger

    from dockyard.common.training_args import check_training_numbers

    assert "**kernel_config" in inspect.getsource(liger.apply_liger_kernel)  # how the pinned transformers reads it
    for typed in ("5", "[rope]", "{1: true}"):
        refused(dry("--liger_kernel_config", typed), "liger_kernel_config ", "takes a mapping of Liger's kernels")
        with pytest.raises(DockyardError, match="takes a mapping of Liger's kernels"):  # the trainer's check
            check_training_numbers({"liger_kernel_config": read_as_an_override(typed, "liger_kernel_config")})
    assert dry("--liger_kernel_config", "{rope: false, swiglu: true}").returncode == 0


def test_a_package_of_the_hosts_python_whose_metadata_cannot_be_read_is_passed_over_not_a_traceback(dry, monkeypatch):
    """--native asks this host's Python which packages it has (report_to's integrations, optim's makers): a package
    whose METADATA is not UTF-8 (a half-written install, a dist-info copied from elsewhere, on PYTHONPATH) ended
    `invoke run --native --dry` in a UnicodeDecodeError traceback. It is passed over; the others are read."""
    from types import SimpleNamespace

    class Unreadable:
        @property
        def metadata(self):
            return b"Name: bad\xff".decode()

    have = [Unreadable(), SimpleNamespace(metadata={"Name": "tensorboard"})]
    monkeypatch.setattr("importlib.metadata.distributions", lambda: iter(have))
    r = dry("--report_to", "tensorboard", native=True)
    assert r.returncode == 0, r.stderr
    refused(dry("--optim", "galore_adamw", native=True), "optim galore_adamw: needs galore-torch")


@pytest.mark.parametrize("key, typed, meant, other", [
    ("lr_scheduler_kwargs", "{min_lr:1e-5}", "{min_lr: 1e-5}", ("--lr_scheduler_type", "cosine_with_min_lr")),
    ("lr_scheduler_kwargs", "{num_cycles: 0.5, min_lr:1e-5}", "{num_cycles: 0.5, min_lr: 1e-5}",
     ("--lr_scheduler_type", "cosine_with_min_lr")),
    ("accelerator_config", "{even_batches:false}", "{even_batches: false}", ()),
    ("accelerator_config", "{gradient_accumulation_kwargs: {sync_each_batch:true}}",
     "{gradient_accumulation_kwargs: {sync_each_batch: true}}", ()),
    ("gradient_checkpointing_kwargs", "{use_reentrant:false}", "{use_reentrant: false}", ()),
])
def test_a_mapping_setting_typed_without_the_blank_after_a_colon_is_said_so_with_the_mapping_meant(
        dry, key, typed, meant, other):
    """`--lr_scheduler_kwargs '{min_lr:1e-5}'` (no blank after the colon: YAML reads one key `min_lr:1e-5`, no value)
    was refused as an unknown key `min_lr:1e-5`, accelerator_config's and gradient_checkpointing_kwargs' too, where
    optim_args said why: every mapping-valued setting now says it in optim_args' words, with the mapping meant, which
    the run then takes."""
    r = dry(*other, f"--{key}", typed)
    refused(r, f"{key} ", "as a key without a value (a value follows ': ', with its blank): "
            f"write --{key} '{meant}'")
    assert dry(*other, f"--{key}", meant).returncode == 0
