"""The TrainingArguments the run hands the Trainer as they are given, which the Trainer reads only as it starts or not at
all: each value checked here as the pinned transformers would read it, without transformers (the host has none), so
`invoke run --dry`, `invoke plan`, slurm and k8s refuse it before an image starts; the trainer runs the same checks
again (training_args.check_training_numbers) and asks transformers itself (dockyard.train.guards).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from dockyard.common.errors import DockyardError, cut, short, shown


def check(training: dict[str, Any]) -> None:
    """Every pass-through value of the run's TrainingArguments (`training`) one the Trainer takes and reads."""
    for key, value in training.items():
        if key != "optim_args":  # text, not a mapping: check_optim_args says the pairs meant
            check_colons(key, value)
    check_schedule_kwargs(training.get("lr_scheduler_kwargs"), training.get("lr_scheduler_type", "linear"))
    check_optim_args(training.get("optim_args"))
    check_label_names(training.get("label_names"))
    check_report_to(training.get("report_to"))
    check_liger_config(training.get("liger_kernel_config"))
    check_accelerator_config(training.get("accelerator_config"))


# --- a mapping's `a:1` ----------------------------------------------------------------------------------------------

def check_colons(key: str, given: Any) -> None:
    """A mapping-valued setting (lr_scheduler_kwargs, accelerator_config, gradient_checkpointing_kwargs, ...) typed
    `{min_lr:1e-5}`, without the blank YAML wants after the colon: YAML reads the key `min_lr:1e-5` with no value, which
    each setting's own check refused as an unknown key of that name."""
    if not isinstance(given, dict) or not (bare := colon_keys(given)):
        return
    raise DockyardError(f"{key} {short(given)}: {without_blank(bare)}: write --{key} '{cut(_written(given), 80)}'")


def colon_keys(given: dict) -> list[str]:
    """The keys of `given`, however deep in mappings, that YAML read from `a:1` typed without the blank."""
    inner = [k for v in given.values() if isinstance(v, dict) for k in colon_keys(v)]
    return [str(k) for k, v in given.items() if v is None and ":" in str(k)] + inner


def without_blank(keys: list[str]) -> str:
    """Why `keys` were read as keys with no value (every mapping-valued setting's words, and optim_args')."""
    return f"YAML reads {cut(', '.join(keys), 40)} as a key without a value (a value follows ': ', with its blank)"


def _written(given: Any) -> str:
    """A mapping as the flow YAML meant, `a:1` with its blank (`{a: 1}`)."""
    if not isinstance(given, dict):
        return json.dumps(given, default=str)
    pairs = (f"{str(k).partition(':')[0].strip()}: {str(k).partition(':')[2].strip()}" if v is None and ":" in str(k)
             else f"{k}: {_written(v)}" for k, v in given.items())
    return "{" + ", ".join(pairs) + "}"


# --- lr_scheduler_kwargs ---------------------------------------------------------------------------------------------

# The lr_scheduler_kwargs each lr_scheduler_type reads, as the pinned transformers' get_scheduler makes it (its
# function's parameters less those get_scheduler sets; constant and constant_with_warmup are handed none): what
# guards.schedule_kwargs asks of transformers in the trainer; reduce_lr_on_plateau and greedy hand them on to a class
# (torch's ReduceLROnPlateau, transformers' GreedyLR): its parameters, which it refused only as the Trainer made it,
# after the model had loaded (a test keeps this current)
PLATEAU = ("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps")
SCHEDULE_KWARGS: dict[str, tuple[str, ...]] = {
    "linear": (), "cosine": ("num_cycles",), "cosine_with_restarts": ("num_cycles",),
    "polynomial": ("lr_end", "power"), "constant": (), "constant_with_warmup": (), "inverse_sqrt": ("timescale",),
    "reduce_lr_on_plateau": PLATEAU, "cosine_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio",
                            "num_cycles"),
    "greedy": (*PLATEAU[:6], "warmup", "min_lr", "max_lr", "eps", "verbose", "smooth", "window_size", "reset_start"),
}
HANDED_NONE = ("constant", "constant_with_warmup")  # get_scheduler drops their kwargs, where the others' are a TypeError
# The schedules that cannot be made without one of these kwargs: transformers' ValueError ("One of min_lr or min_lr_rate
# should be set") or TypeError (num_decay_steps) as the Trainer made the schedule, after the model had loaded
SCHEDULE_NEEDS = {"cosine_with_min_lr": ("min_lr", "min_lr_rate"), "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
                  "warmup_stable_decay": ("num_decay_steps",)}


def check_schedule_kwargs(given: Any, kind: Any) -> None:
    """lr_scheduler_kwargs a mapping of the keys schedule `kind` reads, holding those it needs (`--lr_scheduler_kwargs
    '{foo: 1}'` passed --dry and stopped the run once the model had loaded, or trained as if not given)."""
    kind = str(kind)
    if kind not in SCHEDULE_KWARGS:  # not a schedule: check_number says so
        return
    needs = SCHEDULE_NEEDS.get(kind, ())
    if given is None and not needs:
        return
    if given is not None and not isinstance(given, dict):
        raise DockyardError(f"lr_scheduler_kwargs {short(given)}: takes a mapping of the schedule's settings, as in "
                            "--lr_scheduler_kwargs '{num_cycles: 0.5}'")
    given = given or {}
    takes = SCHEDULE_KWARGS[kind]
    unread = [str(k) for k in given if k not in takes]
    if unread:
        said, it = cut(", ".join(unread), 80), "it" if len(unread) == 1 else "them"
        elsewhere = [t for t, keys in SCHEDULE_KWARGS.items() if keys and unread[0] in keys]
        why = (f"reads no {said} (it takes {', '.join(takes)})" if takes else
               f"reads no kwargs (the Trainer would drop {it} without a word)" if kind in HANDED_NONE else
               "takes no kwargs")
        raise DockyardError(f"lr_scheduler_kwargs {said}: lr_scheduler_type {kind} {why}; leave {it} out"
                            + (f", or pick a schedule that reads {unread[0]} ({', '.join(elsewhere)})" if elsewhere
                               else ""))
    valued = [k for k in needs if given.get(k) is not None]  # `{min_lr: null}`: given, yet none for transformers
    if needs and not valued:
        null = next((f" ({k}: null gives none)" for k in needs if k in given), "")
        raise DockyardError(f"lr_scheduler_type {kind} needs {' or '.join(needs)} in lr_scheduler_kwargs{null}: give "
                            f"it, as in --lr_scheduler_kwargs '{{{needs[0]}: {EXAMPLES[needs[0]]}}}'")
    if len(valued) > 1:  # transformers' "Only one of min_lr or min_lr_rate should be set", as the Trainer made it
        raise DockyardError(f"lr_scheduler_kwargs gives {' and '.join(valued)}: lr_scheduler_type {kind} takes one of "
                            "them; leave the other out")


EXAMPLES = {"min_lr": 1e-5, "min_lr_rate": 0.1, "num_decay_steps": 10}


# --- optim_args ------------------------------------------------------------------------------------------------------

OPTIM_ARGS = "key=value pairs, comma-separated, as in --optim_args momentum=0.9,nesterov=True (with --optim sgd)"
KEY = re.compile(r"[A-Za-z_]\w*")  # a keyword argument of the optimizer's maker


def check_optim_args(given: Any) -> None:
    """optim_args the text the Trainer splits into key=value pairs (its _parse_optim_args): a number, a mapping, or a
    pair without its `=` passed --dry and stopped the run in the trainer, or with a traceback on every rank. Which keys
    the optimizer reads is asked of transformers in the trainer, before the model loads (guards.check_optim)."""
    if given is None or given == "":
        return
    if given is True:  # `-- --optim_args` with no value reads as a switch
        raise DockyardError(f"--optim_args was given no value: give {OPTIM_ARGS}")
    if isinstance(given, dict):  # `--optim_args '{momentum: 0.9}'`, read as a mapping
        pairs = ",".join(_as_pair(k, v) for k, v in given.items())
        bare = [str(k) for k, v in given.items() if v is None]  # `{a:1}`: the key `a:1`, no value (`a=None` was said)
        why = f"{without_blank(bare)}, and " if bare else ""
        raise DockyardError(f"optim_args {short(given)}: {why}the Trainer reads it as text, not a mapping: write "
                            f"--optim_args {cut(pairs, 80)} ({OPTIM_ARGS.split(', as in')[0]})")
    if not isinstance(given, str):
        raise DockyardError(f"optim_args {short(given)}: takes {OPTIM_ARGS}")
    for pair in given.replace(" ", "").split(","):
        key, eq, value = pair.partition("=")
        if not eq or "=" in value or not KEY.fullmatch(key):
            raise DockyardError(f"optim_args {short(given)}: {cut(pair, 40)!r} is not a key=value pair; give "
                                f"{OPTIM_ARGS}")


def _as_pair(key: Any, value: Any) -> str:
    """One entry of a mapping given as optim_args, as the key=value pair meant: a key YAML read without a value is
    `a:1` typed without a blank (a=1), or a key alone (a=VALUE)."""
    if value is not None:
        return f"{key}={value}"
    name, colon, meant = str(key).partition(":")
    return f"{name.strip()}={meant.strip() if colon and meant.strip() else 'VALUE'}"


# --- label_names -----------------------------------------------------------------------------------------------------

LABELS = "labels"  # the one label column of the run's batches, either task's (dockyard.train.data), the models' own name


def check_label_names(given: Any) -> None:
    """label_names none (the model's own, `labels`) or [labels]: the Trainer looks each name up in every evaluation
    batch, where the run's hold their labels as `labels` alone. `--label_names labels` (text, not a list) stopped the
    run with a TypeError once the model had loaded; `[label]` trained and evaluated with no loss, unsaid."""
    if given is None or given == [LABELS]:
        return
    if not isinstance(given, list) or not given or not all(isinstance(n, str) and n for n in given):
        raise DockyardError(f"label_names {short(given)}: takes a list of names, as in --label_names '[{LABELS}]' "
                            "(the default); leave it out")
    other = ", ".join(n for n in given if n != LABELS)
    if not other:  # [labels, labels]: each read as a label of its own
        raise DockyardError(f"label_names {short(given)}: names {LABELS} more than once; leave label_names out")
    raise DockyardError(f"label_names {short(given)}: the run's batches hold their labels as {LABELS} alone, and an "
                        f"evaluation would find no {cut(other, 60)} and compute no loss: leave label_names out "
                        f"(the model's own, {LABELS})")


# --- accelerator_config, and its gradient_accumulation_kwargs ---------------------------------------------------------

# transformers' AcceleratorConfig fields (trainer_pt_utils, the pin; a test keeps them current)
ACCELERATOR_CONFIG = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
                      "gradient_accumulation_kwargs", "use_configured_state")
# accelerate's GradientAccumulationPlugin, less num_steps (the pin; a test keeps them current)
ACCUMULATION_KWARGS = ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch")


def check_accelerator_config(given: Any) -> None:
    """accelerator_config a mapping of AcceleratorConfig's own keys, without split_batches; its
    gradient_accumulation_kwargs as check_accumulation_kwargs says."""
    if given is None:
        return
    if not isinstance(given, dict):
        # a file's path: the Trainer reads it in each process, unchecked (split_batches in it; a fifo hung the run)
        raise DockyardError(f"accelerator_config {shown(str(given))[:80]!r}: give its settings as a mapping after --, "
                            "as in --accelerator_config '{even_batches: false}', not a file's name")
    if "split_batches" in json.dumps(given, default=str):
        # each process then takes its share of one micro-batch: the run trained half (of 2 processes) the global
        # batch it reported
        raise DockyardError("accelerator_config: leave split_batches out: global_batch says what each step trains over "
                            "all processes, and the project splits it (split_batches would train less than it says)")
    # TrainingArguments' TypeError once the image had started: --dry took any key
    if unknown := sorted(set(given) - set(ACCELERATOR_CONFIG), key=str):
        raise DockyardError(f"accelerator_config: unknown key(s) {cut(', '.join(map(str, unknown)), 80)}; transformers' "
                            f"AcceleratorConfig takes {', '.join(k for k in ACCELERATOR_CONFIG if k != 'split_batches')}")
    check_accumulation_kwargs(given.get("gradient_accumulation_kwargs"))


def check_accumulation_kwargs(given: Any) -> None:
    """accelerator_config's gradient_accumulation_kwargs, which the Trainer hands to accelerate's
    GradientAccumulationPlugin as it is made, once the model has loaded: a mapping of its settings (5, or a key it has
    not, was its TypeError there), without num_steps, which replaced the gradient_accumulation_steps the run settles
    from global_batch (each step then trained num_steps times the global batch the run said; above 1, a ValueError)."""
    if given is None:
        return
    example = "as in --accelerator_config '{gradient_accumulation_kwargs: {sync_each_batch: true}}'"
    if not isinstance(given, dict):
        raise DockyardError(f"accelerator_config: gradient_accumulation_kwargs {short(given)}: takes a mapping of "
                            f"accelerate's settings ({', '.join(ACCUMULATION_KWARGS)}), {example}")
    if "num_steps" in given:
        raise DockyardError("accelerator_config: gradient_accumulation_kwargs: leave num_steps out: global_batch says "
                            "what each step trains over all processes, and the run settles gradient_accumulation_steps "
                            "from it (num_steps would replace it, and each step train more than it says); give "
                            "--global_batch, or --gradient_accumulation_steps")
    if unknown := [str(k) for k in given if k not in ACCUMULATION_KWARGS]:
        raise DockyardError(f"accelerator_config: gradient_accumulation_kwargs: unknown key(s) "
                            f"{cut(', '.join(unknown), 80)}; accelerate takes {', '.join(ACCUMULATION_KWARGS)}")


# --- liger_kernel_config ---------------------------------------------------------------------------------------------


def check_liger_config(given: Any) -> None:
    """liger_kernel_config a mapping of Liger's kernels to true or false: transformers spreads it as keyword arguments
    into Liger's patch of the model as the Trainer is made (apply_liger_kernel: `**kernel_config`), once the model has
    loaded, wherever use_liger_kernel is on (auto: GPU runs), so 5 or a list was a TypeError there. Which kernels a model
    has is Liger's to say: it leaves out those the model's patch does not take."""
    if given is None:
        return
    if not isinstance(given, dict) or not all(isinstance(k, str) for k in given):  # keyword arguments: names
        raise DockyardError(f"liger_kernel_config {short(given)}: takes a mapping of Liger's kernels to true or false, "
                            "as in --liger_kernel_config '{rope: false}', or leave it out (every kernel the model has)")


# --- report_to -------------------------------------------------------------------------------------------------------

# transformers' reporting integrations (integration_utils.INTEGRATION_TO_CALLBACK of the pin; a test keeps them current).
# These send the run elsewhere: to a service on the internet, which the training nodes cannot reach (runs are offline),
# or to Kubeflow's trainer server, which no run of dockyard's is given:
REMOTE = {"azure_ml": "Azure ML", "comet_ml": "Comet's servers", "neptune": "Neptune's servers",
          "wandb": "Weights & Biases' servers", "clearml": "a ClearML server", "dagshub": "DagsHub's servers",
          "swanlab": "SwanLab's cloud", "kubeflow": "Kubeflow's trainer server (KUBEFLOW_TRAINER_SERVER_URL)"}
# these write where the run trains, once one of their packages is installed there (transformers' is_*_available)
LOCAL = {"tensorboard": ("tensorboard", "tensorboardx"), "mlflow": ("mlflow", "mlflow-skinny"), "trackio": ("trackio",),
         "codecarbon": ("codecarbon",), "flyte": ("flytekit",), "dvclive": ("dvclive",)}
# the packages (canonical names) that make transformers count a REMOTE integration installed (integration_utils'
# is_*_available), which `report_to all` then reports to: dagshub's needs mlflow too, azure_ml's counts only without it
REMOTE_PACKAGES = {"wandb": ("wandb",), "comet_ml": ("comet-ml",), "neptune": ("neptune", "neptune-client"),
                   "clearml": ("clearml",), "swanlab": ("swanlab",), "dagshub": ("dagshub",), "azure_ml": ("azureml-core",)}
ALONE = ("none", "all")  # transformers reads them as the whole value only: in a list with others, a ValueError
LEAVE = "leave it out (report_to none: the run's metrics are in its metrics.jsonl and loss.png)"


def check_report_to(given: Any) -> None:
    """report_to none, all, or integrations transformers knows that report where the run trains (installed there:
    check_installed): `--report_to wandb` passed --dry and stopped the run in the trainer (no such package in any
    image; offline, no server). An empty list is none, as transformers reads `none` itself."""
    if given is None or given == []:
        return
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise DockyardError(f"report_to {short(given)}: takes an integration's name, a list of them, or none")
    if len(names) > 1 and set(names) & set(ALONE):
        raise DockyardError(f"report_to {short(given)}: none and all stand alone (transformers refuses them in a "
                            "list): give none, all, or the integrations' names")
    known = (*ALONE, *LOCAL, *REMOTE)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise DockyardError(f"report_to {cut(name, 60)}: " + (f"did you mean {close[0]}? " if close else "")
                                + f"transformers reports to {', '.join(sorted((*LOCAL, *REMOTE)))}, or none")
        if name in REMOTE:
            raise DockyardError(f"report_to {name}: it sends the run to {REMOTE[name]}, which the training nodes "
                                f"cannot reach (runs are offline); {LEAVE}")


# --- what the settings need installed where the run trains -----------------------------------------------------------

# The optimizers whose maker imports a package of its own (pip's name), as the pinned transformers' get_optimizer_cls_and
# _kwargs does: without it, its ImportError (or ValueError) in the trainer, once the image had started (a test keeps
# this current)
BNB = "bitsandbytes"
OPTIM_PACKAGES = {
    "adamw_torch_xla": "torch-xla", "adamw_torch_npu_fused": "torch-npu", "adamw_anyprecision": "torchdistx",
    **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), "torchao"),
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
                     "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit",
                     "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit"), BNB),
    **dict.fromkeys(("galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
                     "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise"), "galore-torch"),
    **dict.fromkeys(("lomo", "adalomo"), "lomo-optim"), "grokadamw": "grokadamw",
    **dict.fromkeys(("schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"), "schedulefree"),
    **dict.fromkeys(("apollo_adamw", "apollo_adamw_layerwise"), "apollo-torch"), "stable_adamw": "torch-optimi",
}


def check_installed(training: dict[str, Any], packages: frozenset[str], where: str) -> None:
    """What report_to and optim name installed where the run trains (`packages`: the canonical names, PEP 503, of
    those `where` has, as launch.preflight.installed gives them): `--optim galore_adamw` or `--report_to tensorboard`
    passed --dry, and the trainer refused them once the image had started. A recipe whose DeepSpeed config makes its
    own optimizer never gets here with optim (resolve_settings)."""
    optim = training.get("optim")
    if optim in OPTIM_PACKAGES and OPTIM_PACKAGES[optim] not in packages:
        raise DockyardError(f"optim {optim}: needs {OPTIM_PACKAGES[optim]}, which {where} has not; use the default "
                            f"(adamw_torch_fused), or install {OPTIM_PACKAGES[optim]} in {where}")
    given = training.get("report_to")
    check_all_reports_here(given, remote_installed(packages), where)
    reporting = tuple(n for n, needs in LOCAL.items() if packages & set(needs))
    missing = [n for n in ([given] if isinstance(given, str) else given or []) if n in LOCAL and n not in reporting]
    if missing:
        raise DockyardError(f"report_to {', '.join(missing)}: not installed in {where} (installed: "
                            f"{', '.join(reporting) or 'none'}); {LEAVE}, or install {LOCAL[missing[0]][0]} in {where}")


def remote_installed(packages: frozenset[str]) -> list[str]:
    """The REMOTE integrations transformers counts as installed where `packages` are (report_to all's, of those)."""
    mlflow = bool(packages & set(LOCAL["mlflow"]))
    return [n for n, needs in REMOTE_PACKAGES.items() if packages & set(needs)
            and (n != "dagshub" or mlflow) and (n != "azure_ml" or not mlflow)]


def check_all_reports_here(given: Any, remote: list[str], where: str) -> None:
    """report_to all reports to every integration installed where the run trains (`remote`: those of them that send the
    run elsewhere): `--report_to all` on a host whose Python has wandb passed --dry, where `--report_to wandb` is
    refused, and the run then reported to W&B's servers, or stopped in the trainer where it could not reach them."""
    if remote and given in ("all", ["all"]):
        raise DockyardError(f"report_to all: reports to every integration installed in {where}, and "
                            f"{', '.join(remote)} {'sends' if len(remote) == 1 else 'send'} the run to "
                            f"{REMOTE[remote[0]]}, which the training nodes cannot reach (runs are offline): name the "
                            f"integrations to report to (as in --report_to tensorboard), or {LEAVE}")
