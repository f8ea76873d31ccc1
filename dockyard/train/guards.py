"""Checks and fixes the trainer applies by itself, each against a failure people meet in practice.

Plain functions over plain data (no torch import at module level), so each is tested on its own;
__main__ and the steps it calls (opening, arguments) call every one of them on the way to the Trainer.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
from pathlib import Path
from typing import Any

from dockyard.common import archs, passthrough, recipes
from dockyard.common.errors import DockyardError, cut, json_object, problems, short
from dockyard.common.training_args import COMPILE_MODES
from dockyard.common.units import GIB


def one_process_per_gpu(n_gpu: int) -> None:
    """The HF Trainer wraps the model in nn.DataParallel when one process sees several GPUs: one GPU works,
    the others idle, and it is slower than one GPU."""
    if n_gpu > 1:
        raise DockyardError(
            f"this process sees {n_gpu} GPUs: training them from one process (DataParallel) is slower than one GPU. "
            f"Start one process per GPU: `invoke run` does, or `torchrun --nproc-per-node {n_gpu} -m dockyard.train ...`")


def gpus_as_the_image_says(accelerator: str, native: bool = False) -> None:
    """A CUDA image sets DS_ACCELERATOR=cuda (`--cpu` sets cpu), as `invoke run --native` does on a host with GPUs: a
    process that finds no usable GPU (a driver older than the image's CUDA, a driver that fails, a container started
    without --gpus; natively, a CPU build of torch) would train on CPU and call the run completed, or die in
    DeepSpeed's traceback. A process started without DS_ACCELERATOR (python -m dockyard.train) is left as it is."""
    if accelerator != "cuda":
        return
    import torch

    if torch.cuda.is_available():
        gpu_has_code(torch, native)
        return
    try:
        torch.cuda.init()
        reason = "torch sees no GPU"
    except Exception as e:  # torch's reason, first sentence: "The NVIDIA driver on your system is too old (...)"
        said = str(e).strip().splitlines()
        reason = said[0].split(". ")[0].rstrip(".") if said else type(e).__name__
    if native:
        raise DockyardError(f"--native on a host with GPUs: this host's torch {torch.__version__} finds no usable GPU: "
                            f"{reason}. Install a torch built for a CUDA this driver supports (`nvidia-smi` says which), "
                            "or add --cpu to train on CPU")
    raise DockyardError(f"this CUDA image (DS_ACCELERATOR=cuda) finds no usable GPU: {reason}. Check with nvidia-smi "
                        "that the driver works and supports the image's CUDA, and that the container was given the GPUs "
                        "(docker run --gpus); --cpu (invoke run, run.sh) trains on CPU instead (elsewhere: DS_ACCELERATOR=cpu)")


def gpu_has_code(torch: Any, native: bool = False) -> None:
    """This rank's GPU against the kernels its torch holds: a V100 (7.0) in the cu132 image, which a Slurm job's
    container runtime, Kubernetes or compose start with no host check, met torch's "no kernel image is available for
    execution on the device" at its first kernel, a traceback from every rank."""
    held = archs.from_torch(torch.cuda.get_arch_list())
    if not held:  # a torch that does not say: left to it
        return
    index = int(os.environ.get("LOCAL_RANK", "0"))
    major, minor = torch.cuda.get_device_capability(index)
    if archs.arch_runs(held, f"{major}.{minor}"):
        return
    whose = "this host's torch" if native else "this image's torch"
    raise DockyardError(
        f"{whose} {torch.__version__} has no code for GPU {index} ({torch.cuda.get_device_name(index)}, compute "
        f"{major}.{minor}): it holds {held}. Use an image of a variant whose torch has (docs/images.md: a V100 takes "
        f"cu128; invoke run's --variant=auto picks it), or leave this GPU out (CUDA_VISIBLE_DEVICES)")


def deepspeed_launched(recipe_name: str, deepspeed: bool, environ: dict[str, str]) -> None:
    """DeepSpeed forms its process group from torchrun's variables; a process started without them (plain
    `python -m dockyard.train --recipe zero2`) falls back to MPI discovery, which images without mpi4py end in a
    ModuleNotFoundError traceback after the model has loaded."""
    import importlib.util

    torchrun = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    if not deepspeed or all(k in environ for k in torchrun) or importlib.util.find_spec("mpi4py"):
        return
    raise DockyardError(f"recipe {recipe_name} runs DeepSpeed, which needs torchrun's process group: start it with "
                        "`torchrun --nproc-per-node N -m dockyard.train ...` (or `invoke run`, `invoke run --native`), "
                        "not plain python")


def device_map(strategy: str, local_rank: int, cuda: bool) -> dict[str, int] | None:
    """Where from_pretrained puts the weights. Never "auto" when distributed: it splits the layers over the
    GPUs of one process and runs them one after another (or the Trainer refuses the model)."""
    if recipes.strategy(strategy).engine == "ddp" and cuda:
        return {"": local_rank}  # each DDP/LoRA/QLoRA process loads the whole model onto its own GPU
    return None  # DeepSpeed and FSDP place (and shard) the weights themselves


def peft_training_args(args: dict[str, Any], peft: str | None) -> dict[str, Any]:
    """LoRA/QLoRA with gradient checkpointing under DDP: reentrant checkpointing marks the adapter weights
    ready twice ("Expected to mark a variable ready only once"), and unused-parameter search fails the same way."""
    if not peft or not args.get("gradient_checkpointing"):
        return args
    given = [f"{k} true" for k, v in (("ddp_find_unused_parameters", args.get("ddp_find_unused_parameters")),
                                      ("use_reentrant", (args.get("gradient_checkpointing_kwargs") or {}).get(
                                          "use_reentrant"))) if v is True]
    if given:  # said, not refused: the recipe's own fix, which a run of one process would not need
        logging.getLogger("dockyard.train").warning(
            "%s: set to false for %s with gradient checkpointing (under DDP the adapters' gradients would be marked "
            "ready twice)", ", ".join(given), peft)
    return {**args, "ddp_find_unused_parameters": False,
            "gradient_checkpointing_kwargs": {**(args.get("gradient_checkpointing_kwargs") or {}),
                                              "use_reentrant": False}}


def check_report_to(value: Any) -> None:
    """`report_to` names only integrations this image has: the Trainer raises a RuntimeError for one that is not
    installed, after the model has loaded. "none" is always fine, "all" (every one installed) where none installed
    sends the run elsewhere (passthrough.REMOTE)."""
    from transformers.integrations import get_available_reporting_integrations

    names = [value] if value is None or isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DockyardError(f"report_to {short(value)}: takes an integration's name, a list of them, or none")
    have = get_available_reporting_integrations()
    passthrough.check_all_reports_here(value, [n for n in have if n in passthrough.REMOTE],
                                       "the Python this run trains with")
    missing = [n for n in names if n not in ("none", "all", *have)]
    if missing:
        # cut, as every value said back: a name of 5,000 characters was said whole
        raise DockyardError(f"report_to {cut(', '.join(missing))}: not installed in this image (installed: "
                            f"{', '.join(have) or 'none'}); use --report_to none, or install it in an image "
                            "of your own")


def compile_modes(given: Any) -> tuple[str, ...]:
    """torch.compile's modes as this torch names them, for a run given a torch_compile_mode (the host checks the
    pinned torch's, training_args.COMPILE_MODES; importing inductor takes a second, so only where one is given)."""
    if given is None:
        return COMPILE_MODES
    try:
        from torch._inductor import list_mode_options
    except ImportError:  # a torch without inductor's table: the pinned torch's
        return COMPILE_MODES
    return tuple(list_mode_options())


def check_optim(args: Any) -> None:
    """`optim` names an optimizer this image can make: 22 of the Trainer's choices need a package no image has
    (galore_torch, schedulefree, torchao, lomo_optim, ...), which the Trainer said in an ImportError traceback on every
    rank, after the model had loaded. Asked here of the Trainer's own lookup, before the model loads."""
    from transformers import Trainer

    # DeepSpeed makes its own from the section (the Trainer's optim is not used); without one (zero2, zero3), the
    # Trainer builds optim and ZeRO wraps it
    if "optimizer" in deepspeed_sections(args):
        return
    name = getattr(args.optim, "value", args.optim)
    try:
        _, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    except (ImportError, ValueError) as e:
        said = " ".join(str(e).split())
        if isinstance(e, ImportError) or "install" in said.lower():
            raise DockyardError(f"optim {name}: its package is not in this image ({said[:160]}); use the "
                                "default (adamw_torch_fused), adamw_8bit or adafactor, or install it in an image of "
                                "your own") from None
        if "model" not in said.lower():  # one that needs the model to be made is the Trainer's to check, later
            raise DockyardError(f"optim {name}, optim_args {short(args.optim_args)}: {said[:200]}; optim_args takes "
                                "key=value pairs, comma-separated (as in momentum=0.9 for sgd)") from None
        return
    check_optim_args_read(args, kwargs, name)


def deepspeed_sections(args: Any) -> dict[str, Any]:
    """The DeepSpeed config the Trainer was given (a dict, or the file its TrainingArguments read), {} without one: its
    optimizer and scheduler sections replace the Trainer's optim and lr_scheduler_type."""
    if not args.deepspeed:
        return {}
    return args.deepspeed if isinstance(args.deepspeed, dict) else getattr(args.hf_deepspeed_config, "config", {})


# set by the Trainer on each parameter group, over what the optimizer was made with: in optim_args it does nothing
PER_GROUP = {"weight_decay": "--weight_decay"}


def check_optim_args_read(args: Any, kwargs: dict[str, Any], name: str) -> None:
    """Each key of optim_args one the optimizer reads: the Trainer hands an optimizer only the keys its maker looks
    up and drops the rest without a word (`--optim_args momentum=0.9` trained adamw_torch_fused as if not given;
    `--optim sgd --optim_args weight_decay=0.1` trained with --weight_decay's 0, which every parameter group sets).
    Asked of the Trainer's own lookup: a key is read where leaving it out, or giving it another value, changes what
    the optimizer is made with (a value that is the maker's default, `--optim ademamix --optim_args alpha=5.0`, changes
    nothing left out, yet is read)."""
    pairs = [p.partition("=") for p in str(args.optim_args or "").replace(" ", "").split(",") if p]
    for key, _, value in pairs:
        if key in PER_GROUP:
            raise DockyardError(f"optim_args {cut(f'{key}={value}')}: the Trainer sets {key} on every parameter "
                                f"group, over what optim_args gives the optimizer; give {PER_GROUP[key]} {cut(value, 40)} "
                                "instead")
        without = [f"{k}={v}" for k, _, v in pairs if k != key]
        if made_with(args, without) == kwargs and made_with(args, [*without, f"{key}={OTHER_VALUE}"]) == kwargs:
            raise DockyardError(f"optim_args {cut(f'{key}={value}')}: optim {name} reads no {cut(key, 40)} (the Trainer "
                                "would leave it out without a word); leave it out, or pick an optimizer that takes it (sgd: "
                                "momentum, dampening, nesterov; rmsprop: momentum, alpha, eps, centered; adagrad: "
                                "lr_decay, eps)")


def made_with(args: Any, optim_args: list[str]) -> Any:
    """What the Trainer makes the optimizer of `args` with, given `optim_args` (key=value texts) instead of its own; the
    error where the maker could not read one (a value it parses, as `OTHER_VALUE`, that is no number or name)."""
    from transformers import Trainer

    other = copy.copy(args)
    other.optim_args = ",".join(optim_args) or None
    try:
        return Trainer.get_optimizer_cls_and_kwargs(other)[1]
    except Exception as e:  # noqa: BLE001 - any error says the value was read
        return e


OTHER_VALUE = "dockyard-other-value"  # a value no maker takes as it is given: one that reads the key differs or fails


def check_schedule_kwargs(args: Any) -> None:
    """Each key of lr_scheduler_kwargs one the schedule reads: transformers' get_scheduler hands constant and
    constant_with_warmup none of them (`--lr_scheduler_type constant --lr_scheduler_kwargs '{num_cycles: 5}'` trained
    as if not given), and the others' makers take only their own (a TypeError once the model had loaded). What each
    reads is asked of transformers: its schedule function's parameters, less those get_scheduler sets itself, where
    get_scheduler hands the kwargs on at all. Before the model loads."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, SchedulerType

    given = args.lr_scheduler_kwargs
    # DeepSpeed's section makes its own schedule
    if not given or not isinstance(given, dict) or "scheduler" in deepspeed_sections(args):
        return
    kind = SchedulerType(args.lr_scheduler_type)
    takes = schedule_kwargs(kind)
    if takes is None:  # handed on to a class (ReduceLROnPlateau), which names a key it lacks itself
        return
    unread = [k for k in given if k not in takes]
    if not unread:
        return
    said, it = ", ".join(unread), "it" if len(unread) == 1 else "them"
    why = (f"reads no {said} (it takes {', '.join(takes)})" if takes else "takes no kwargs"
           if hands_on_kwargs(kind) else f"reads no kwargs (the Trainer would drop {it} without a word)")
    # the other schedules asked only now, for the refusal: each question makes a schedule (hands_on_kwargs)
    elsewhere = [t.value for t in TYPE_TO_SCHEDULER_FUNCTION if unread[0] in (schedule_kwargs(t) or ())]
    raise DockyardError(f"lr_scheduler_kwargs {said}: lr_scheduler_type {kind.value} {why}; leave {it} out"
                        + (f", or pick a schedule that reads {unread[0]} ({', '.join(elsewhere)})" if elsewhere else ""))


def schedule_kwargs(kind: Any) -> tuple[str, ...] | None:
    """The lr_scheduler_kwargs schedule `kind` reads, as transformers' get_scheduler makes it; None where its function
    hands them on as **kwargs (to a class of torch's or its own)."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, get_scheduler

    params = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[kind]).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    if not hands_on_kwargs(kind):
        return ()
    # last_epoch: torch's step to start from, which the Trainer sets from the checkpoint it resumes
    return tuple(n for n in params if n not in inspect.signature(get_scheduler).parameters and n != "last_epoch")


def hands_on_kwargs(kind: Any) -> bool:
    """Whether get_scheduler gives schedule `kind` the lr_scheduler_kwargs at all (constant and constant_with_warmup get
    none), asked of it with a key no schedule has: handed on, it is a TypeError."""
    import torch
    from transformers.optimization import get_scheduler

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        get_scheduler(kind, probe, num_warmup_steps=1, num_training_steps=2,
                      scheduler_specific_kwargs={"dockyard_probe": 0})
    except TypeError:
        return True
    return False


# lr_scheduler_kwargs that are a learning rate or a share of one: below 0, the schedules clamp the rate to 0
RATES = ("min_lr", "min_lr_rate", "min_lr_ratio", "lr_end")
ALL_STEPS = 200_000  # schedules of up to this many steps are read at every step; longer ones at both ends and between


def check_schedule(schedule: Any, max_steps: int, args: Any) -> None:
    """The learning-rate schedule the Trainer made (a LambdaLR: the rate at step n is base × lambda(n)) a finite rate of
    at least 0 at every step of the run. The Trainer takes lr_scheduler_kwargs as given and the schedule reads them
    step by step: `polynomial` with `{power: -1}` trained the whole run and then stopped at its last step with
    ZeroDivisionError (no model saved), `inverse_sqrt` with `{timescale: 0}` at its first; `cosine` with
    `{num_cycles: .nan}` and `cosine_with_min_lr` with a negative `min_lr` trained at a rate of 0, unsaid. Read here,
    as training begins, before the first step."""
    from torch.optim.lr_scheduler import LambdaLR

    schedule = getattr(schedule, "scheduler", schedule)  # accelerate's wrapper under DeepSpeed
    if not isinstance(schedule, LambdaLR) or max_steps < 1:
        return
    given = getattr(args, "lr_scheduler_kwargs", None) or {}
    named = f"lr_scheduler_type {getattr(args.lr_scheduler_type, 'value', args.lr_scheduler_type)}" + (
        f" with lr_scheduler_kwargs {given}" if given else "")
    for key, value in (given.items() if isinstance(given, dict) else ()):
        if isinstance(value, float) and not math.isfinite(value):  # cosine clamps a nan rate to 0
            raise DockyardError(f"{named}: {key} {value}: give a finite number")
        if key in RATES and isinstance(value, (int, float)) and not value >= 0:
            raise DockyardError(f"{named}: {key} {value} is below 0, and the schedule would clamp the learning rate to "
                                f"0 there: give {key} of 0 or more")
    steps = range(max_steps + 1) if max_steps <= ALL_STEPS else sorted(
        {*range(10_000), *range(max_steps - 10_000, max_steps + 1), *range(0, max_steps, max_steps // 10_000)})
    for rate in schedule.lr_lambdas:
        for step in steps:
            try:
                factor = float(rate(step))
            except (ArithmeticError, ValueError, TypeError) as e:
                raise DockyardError(f"{named}: the schedule cannot give the learning rate at step {step} of "
                                    f"{max_steps} ({type(e).__name__}: {e}): check the schedule's settings (the "
                                    "Trainer's schedules: transformers.get_scheduler)") from None
            if not factor >= 0 or math.isinf(factor):
                raise DockyardError(f"{named}: the schedule makes the learning rate {factor:g} × learning_rate at step "
                                    f"{step} of {max_steps}, not a finite rate of 0 or more: check the schedule's "
                                    "settings (the Trainer's schedules: transformers.get_scheduler)")


def reject_prequantized(model_dir: str, strategy: str) -> None:
    """GPTQ/AWQ checkpoints cannot be sharded by ZeRO-3 or FSDP: every rank would hold the whole model."""
    cfg = Path(model_dir, "config.json") if model_dir else None
    if not cfg or not cfg.is_file() or not recipes.strategy(strategy).shards_parameters:
        return
    quantized = json_object(cfg, "a model's config").get("quantization_config") or {}
    if not isinstance(quantized, dict):  # "gptq" as text: an AttributeError traceback in every process
        raise DockyardError(f"{cfg}: quantization_config is {type(quantized).__name__}, where from_pretrained reads "
                            "an object (quant_method and its settings): fix or remove it")
    method = quantized.get("quant_method", "")
    if str(method).lower() in ("gptq", "awq"):
        raise DockyardError(f"{model_dir} is a pre-quantized {method.upper()} checkpoint, which {strategy} cannot "
                            f"shard; use the unquantized model (qlora quantizes it itself) or the lora/qlora recipe")


# --- DeepSpeed ---------------------------------------------------------------------------------

def deepspeed_config(path: Path, strategy: str) -> dict[str, Any]:
    """The recipe's DeepSpeed JSON, validated, with the settings its strategy cannot do without."""
    cfg = recipes.read_deepspeed_config(path)  # zero_optimization an object, its stage 0-3
    spec = recipes.strategy(strategy)
    recipes.deepspeed_matches(cfg, spec, path)  # a zero_optimization section of the strategy's stage and offloads
    stage = spec.zero_stage
    _validate_sections(path, cfg)
    _check_constructor_params(path, cfg)
    _check_cuda_ops(cfg, path)
    # the Trainer fills only keys that say "auto": one left out (DeepSpeed's smallest example has none) would be
    # DeepSpeed's "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided" traceback
    cfg = {**{key: "auto" for key in recipes.DEEPSPEED_BATCH_KEYS}, **copy.deepcopy(cfg)}
    if stage == 3:
        # Without this ZeRO-3 saves a model file of a few KB: every rank holds only its shard.
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    return cfg


def deepspeed_agrees(hf_config: Any, path: Path) -> None:
    """A DeepSpeed value the TrainingArguments also set (gradient_clipping and max_grad_norm, the optimizer's lr and
    learning_rate, bf16...) must agree with them: the HF Trainer lists every mismatch when it builds the
    TrainingArguments but raises only minutes later, as a traceback, once the model has loaded."""
    mismatches = [m.removeprefix("- ") for m in getattr(hf_config, "mismatches", None) or []]
    if mismatches:
        raise DockyardError(f"{path} disagrees with the run's settings ({'; '.join(mismatches)}): write \"auto\" "
                            "for those keys (the run fills them in), or give the same value after --")


def _check_cuda_ops(cfg: dict[str, Any], path: Path) -> None:
    """On GPUs, an op the config needs must be prebuilt when nothing here can compile it (an image without nvcc):
    refused now rather than failing in DeepSpeed's JIT build minutes in."""
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available() or cpp_extension.CUDA_HOME is not None:
        return
    from deepspeed.git_version_info import installed_ops

    recipes.check_deepspeed_ops(cfg, str(path), {k for k, v in installed_ops.items() if v}, "this image")


# The sections DeepSpeed reads through pydantic models that forbid unknown keys: a misspelt key ("enable" for
# "enabled") stops the run with a ValidationError traceback, but only in deepspeed.initialize, once the model
# has loaded. The section → the module and class DeepSpeed reads it with.
SECTION_MODELS = {
    "zero_optimization": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    "bf16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "bfloat16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "fp16": ("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    "compile": ("deepspeed.compile.config", "CompileConfig"),
    "comms_logger": ("deepspeed.comm.config", "CommsLoggerConfig"),
    "tensorboard": ("deepspeed.monitor.config", "TensorBoardConfig"),
    "wandb": ("deepspeed.monitor.config", "WandbConfig"),
    "csv_monitor": ("deepspeed.monitor.config", "CSVConfig"),
    "comet": ("deepspeed.monitor.config", "CometConfig"),
    "hybrid_engine": ("deepspeed.runtime.config", "HybridEngineConfig"),
}


def _validate_sections(path: Path, cfg: dict[str, Any]) -> None:
    """Each section DeepSpeed validates with its own model, validated by that model now, leaving out the "auto"
    values the HF Trainer fills in later. Their keys and sets of values were checked already, as the host checks them
    (recipes.check_deepspeed_sections, from a snapshot of these models): what is left here is a value of the wrong
    type ("enabled": "yes please")."""
    import importlib

    from pydantic import ValidationError

    for key in [k for k in SECTION_MODELS if isinstance(cfg.get(k), dict)]:
        module, name = SECTION_MODELS[key]
        model = getattr(importlib.import_module(module), name)
        try:
            model(**{k: v for k, v in cfg[key].items() if v != "auto"})
        except ValidationError as e:
            raise DockyardError(f"{path}: {key}: {problems(e)}") from None


# Adam's settings DeepSpeed takes out of optimizer.params itself before it builds the optimizer (engine.py's
# _configure_basic_optimizer and get_optimizer_configuration); and the optimizers it imports from mup, not here
ADAM_OWN_PARAMS = {"adam_w_mode", "torch_adam", "fp32_optimizer_states"}
MUP_OPTIMIZERS = {"muadam", "muadamw", "musgd", "muon"}


# What DeepSpeed passes DeepSpeedCPUAdam itself, beside the params (adamw_mode from adam_w_mode): the same key in the
# params was "got multiple values for keyword argument"
CPU_ADAM_PASSED = {"adamw_mode"}


def _optimizer_class(kind: str, params: dict[str, Any], offloaded: bool) -> tuple[Any, set[str], set[str]] | None:
    """The class DeepSpeed builds for an `optimizer` section of this type, the params it takes out before, and the
    arguments it passes the class itself; None for a type it does not know (neither its own nor a torch.optim class
    of that exact name)."""
    import torch

    lower = kind.lower()
    if lower in ("adam", "adamw"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

        if params.get("torch_adam"):  # AdamW's decoupled decay unless "Adam" with adam_w_mode false, as DeepSpeed
            decoupled = lower == "adamw" or params.get("adam_w_mode", True)
            return (torch.optim.AdamW if decoupled else torch.optim.Adam), ADAM_OWN_PARAMS | {"foreach"}, set()
        if offloaded:
            return DeepSpeedCPUAdam, ADAM_OWN_PARAMS, CPU_ADAM_PASSED
        return FusedAdam, ADAM_OWN_PARAMS, set()
    if lower == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return (DeepSpeedCPUAdagrad if offloaded else torch.optim.Adagrad), set(), set()
    if lower == "lamb":
        from deepspeed.ops.lamb import FusedLamb

        return FusedLamb, set(), set()
    if lower == "lion":
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return (DeepSpeedCPULion if offloaded else FusedLion), set(), set()
    found = getattr(torch.optim, kind, None)
    return (found, set(), set()) if isinstance(found, type) and issubclass(found, torch.optim.Optimizer) else None


def _check_zero_optimizer(cfg: dict[str, Any], path: Path, kind: str, cls: Any) -> None:
    """The class DeepSpeed builds for the `optimizer` section one of those its ZeRO trains with (as the host checks
    the type by name, recipes.ZERO_OPTIMIZERS): any other stopped every rank with DeepSpeed's AssertionError
    ("untested ZeRO Optimizer") in deepspeed.initialize, after the model loaded."""
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    if cfg["zero_optimization"].get("stage", 0) and not cfg.get(recipes.ZERO_UNTESTED) \
            and cls not in ZERO_SUPPORTED_OPTIMIZERS:
        raise recipes.untested_zero_optimizer(path, kind)


def _unknown_params(cls: Any, given: dict[str, Any], taken: set[str],
                    passed: set[str]) -> tuple[list[str], list[str]]:
    """The keys of `given` the constructor of `cls` would refuse (a TypeError, or "got multiple values" for one of
    those DeepSpeed `passed` itself), and the ones it takes; `taken`: those DeepSpeed takes out of them first."""
    import inspect

    sig = inspect.signature(cls)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return [], []
    # the first is the parameters (or the optimizer) it is given
    accepted = (set(list(sig.parameters)[1:]) - passed) | taken
    return sorted(set(given) - accepted), sorted(accepted)


def _check_constructor_params(path: Path, cfg: dict[str, Any]) -> None:
    """optimizer.params and scheduler.params become keyword arguments of the class DeepSpeed builds: a misspelt
    one is a TypeError traceback in deepspeed.initialize, after the model loaded. Checked against that class."""
    import torch
    from deepspeed.runtime import lr_schedules

    opt, sched = cfg.get("optimizer"), cfg.get("scheduler")
    for section, value, example in (("optimizer", opt, "AdamW"), ("scheduler", sched, "WarmupLR")):
        if isinstance(value, dict) and "type" in value and not isinstance(value["type"], str):
            raise DockyardError(f"{path}: {section}.type {value['type']!r}: the name of one, in quotes "
                                f'("type": "{example}")')
    found = []
    if isinstance(opt, dict) and isinstance(opt.get("type"), str) and opt["type"].lower() not in MUP_OPTIMIZERS:
        params = opt.get("params") or {}
        built = _optimizer_class(opt["type"], params, recipes.optimizer_offloaded(cfg))
        if built is None:
            raise DockyardError(f'{path}: optimizer.type "{opt["type"]}": DeepSpeed knows Adam, AdamW, Adagrad, Lamb, '
                                "Lion, or a torch.optim class by its exact name (ZeRO trains with one only where "
                                f'"{recipes.ZERO_UNTESTED}" is true): check the spelling')
        _check_zero_optimizer(cfg, path, opt["type"], built[0])
        found.append(("optimizer", opt["type"], *built, params))
    if isinstance(sched, dict) and isinstance(sched.get("type"), str):
        kind = sched["type"]
        cls = getattr(lr_schedules, kind, None) if kind in lr_schedules.VALID_LR_SCHEDULES else None
        cls = cls or getattr(torch.optim.lr_scheduler, kind, None)
        if not isinstance(cls, type):
            raise DockyardError(f'{path}: scheduler.type "{kind}": DeepSpeed knows '
                                f"{', '.join(lr_schedules.VALID_LR_SCHEDULES)}, or a torch.optim.lr_scheduler class by "
                                "its exact name (CosineAnnealingLR): check the spelling")
        found.append(("scheduler", kind, cls, set(), set(), sched.get("params") or {}))
    for section, kind, cls, taken, passed, params in found:
        unknown, accepted = _unknown_params(cls, params, taken, passed)
        if unknown:
            raise DockyardError(f"{path}: {section}.params: {', '.join(unknown)} not known to {kind} (it takes "
                                f"{', '.join(accepted)}): check the spelling")


# --- FSDP --------------------------------------------------------------------------------------

def fsdp_settings(path: Path) -> dict[str, Any]:
    """The recipe's FSDP file (TrainingArguments' `fsdp` and `fsdp_config`), with a full state dict on save:
    a sharded one leaves one file per rank that from_pretrained cannot read."""
    raw = recipes.read_fsdp_file(path)
    return {**raw, "fsdp_config": {**raw["fsdp_config"], "state_dict_type": "FULL_STATE_DICT"}}


def fsdp_environment(fsdp_config: dict[str, Any]) -> dict[str, str]:
    """What from_pretrained reads to load once per node: transformers honours cpu_ram_efficient_loading only
    with ACCELERATE_USE_FSDP set before the model loads, which plain torchrun never does (every rank would read
    the full model into host RAM)."""
    on = str(fsdp_config.get("cpu_ram_efficient_loading", "")).lower() in ("true", "1")
    return {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"} if on else {}


# --- host memory for offload -------------------------------------------------------------------

def host_memory_available(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """What this node (or its container: the cgroup limit is what the OOM killer uses) still has free."""
    import psutil

    free = psutil.virtual_memory().available
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isascii() and limit.isdigit() and int(limit) < 2**60:
            free = min(free, int(limit) - usage)
        break
    return free


def check_offload_memory(strategy: str, need: int, params: int, available: int) -> None:
    """CPU offload needs host RAM for the offloaded states (`need`: dockyard.machine.planner's estimate, DeepSpeed's
    formulas); short of it the OOM killer ends the run at the first step, after minutes of loading."""
    if need > available:
        raise DockyardError(
            f"{strategy} needs about {need / GIB:.1f} GiB of host RAM for {params / 1e9:.2f} B parameters on this "
            f"node, and only {available / GIB:.1f} GiB is free (container limit included). Use more nodes, "
            f"a recipe that offloads less (invoke plan), or raise the container's memory limit")


def cpu_collectives_as_built(world_size: int) -> bool:
    """On CPU, DeepSpeed's shared-memory allreduce (its deepspeed_shm_comm op) where the image holds it built for
    the CPU: the cpu variant. Elsewhere (a CUDA image trained with --cpu, a native run) DeepSpeed compiled it at every
    start, in a container whose compile cache starts empty: 1-2 minutes of g++ on every process before the first
    step, for a run that checks a stack. Such a run uses gloo's collectives, as torch does: False. So does a run of
    one process, which has no other to share memory with (loading the op printed "DeepSpeed ... deepspeed_shm_comm_op
    built successfully" on the console, of an op built into the image)."""
    import deepspeed.ops
    from deepspeed.git_version_info import accelerator_name, installed_ops

    if installed_ops.get("deepspeed_shm_comm") and accelerator_name == "cpu" and world_size > 1:
        return True
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # read by deepspeed.comm when it starts
    return False
