"""The run's transformers.TrainingArguments, from the recipe and its settings (the `auto` ones resolved by then:
dockyard.common.autos): precision, evaluation, the DeepSpeed config or FSDP settings, each checked. Making them forms
the process group. __main__.start_processes calls training_arguments."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from dockyard.common import precision as common_precision
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import Recipe
from dockyard.common.run_settings import RunSettings
from dockyard.common.runfolder import CHECKPOINTS
from dockyard.common.training_args import CHECKPOINTING_NAMES
from dockyard.train import guards, precision

# transformers' TrainingArguments is imported inside training_arguments, on purpose: see the note on the imports in
# dockyard.train.__main__ (DeepSpeed reads DS_ACCELERATOR once, at import, and main() sets it first).

log = logging.getLogger("dockyard.train")  # the trainer's lines, as __main__'s (train.log names the logger)


def training_arguments(recipe: Recipe, settings: RunSettings, overrides: dict[str, Any], run_dir: Path,
                       load_universal: bool = False) -> Any:
    from transformers import TrainingArguments  # lazy: see the note on the imports

    known = {f.name for f in fields(TrainingArguments)} | set(CHECKPOINTING_NAMES.values())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise DockyardError(f"unknown setting(s): {', '.join(unknown)}. Valid: the keys of recipes/defaults.yaml "
                            f"and any transformers.TrainingArguments field")
    cuda = torch.cuda.is_available()
    # YAML reads `--save_strategy no` as false: the strategies' "no" is what was meant
    overrides = {k: "no" if k.endswith("_strategy") and v is False else v for k, v in overrides.items()}
    args: dict[str, Any] = {
        **common_precision.mixed_precision(precision.capability(), overrides),
        # every parameter of these models gets a gradient: the Trainer's default (True for this model) makes
        # DDP walk the graph after every backward for nothing
        "ddp_find_unused_parameters": False,
        **evaluation(settings, overrides),
        **{k: v for k, v in overrides.items() if k not in ("bf16", "fp16")},
        "output_dir": str(run_dir / CHECKPOINTS),
        "use_cpu": not cuda,
    }
    if recipe.deepspeed:
        args["deepspeed"] = guards.deepspeed_config(recipe.file(recipe.deepspeed), recipe.strategy)
        if load_universal:
            ds = args["deepspeed"]
            ds["checkpoint"] = {**(ds.get("checkpoint") or {}), "load_universal": True}
    if recipe.fsdp:
        args.update(guards.fsdp_settings(recipe.file(recipe.fsdp)))
        os.environ.update(guards.fsdp_environment(args["fsdp_config"]))
    args = guards.peft_training_args(args, recipe.peft)
    if args.get("torch_compile") is True:
        # Compiled block by block (accelerate's regional compilation, torchtitan's recipe): one block compiles once
        # for every layer (seconds, where the whole model takes minutes: benchmarks/compile.py), and FSDP2 shards
        # and DeepSpeed hooks each layer, which one whole-model graph would cut across. Under DDP the blocks sit
        # inside a copy of the DDP wrapper; the Trainer still saves the model it was given, uncompiled.
        os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"
    if "activation_checkpointing" in known:  # transformers >= 5: its name for gradient checkpointing (no warning)
        trainers = {old: new for new, old in CHECKPOINTING_NAMES.items()}
        args = {trainers.get(k, k): v for k, v in args.items()}
    try:
        targs = TrainingArguments(**args)
    except (ValueError, TypeError) as e:
        raise DockyardError(f"invalid training setting: {' '.join(str(e).split())}") from None  # some say it in lines
    except RuntimeError as e:  # the process group forms here: gloo told the other nodes to connect to loopback
        if "connectFullMesh" not in str(e) or not re.search(r"remote=\[?127\.", str(e)):
            raise
        raise DockyardError("the nodes could not connect: gloo advertised a loopback address (this host's name "
                            "resolves to 127.x), which the other nodes cannot reach; set GLOO_SOCKET_IFNAME and "
                            "NCCL_SOCKET_IFNAME to the interface that reaches them, or start the nodes with invoke run "
                            "--nodes=N (it picks the interface)") from None
    except OSError as e:  # accelerator_config: a mapping, or the path of a JSON file of one
        raise DockyardError(f"invalid training setting: {e.filename}: {e.strerror} (accelerator_config takes a "
                            "mapping, as in '{split_batches: true}')") from None
    guards.deepspeed_agrees(getattr(targs, "hf_deepspeed_config", None), recipe.file(recipe.deepspeed or ""))
    guards.check_optim(targs)
    guards.check_schedule_kwargs(targs)
    if recipe.deepspeed and not cuda:
        # before DeepSpeed's communication starts (here, or in the Trainer): torchrun's WORLD_SIZE, all nodes' processes
        guards.cpu_collectives_as_built(int(os.environ.get("WORLD_SIZE", "1")))
    if recipe.deepspeed and not cuda and targs.world_size > 1:
        # On CPU the Trainer sets up a plain gloo process group and leaves DeepSpeed's communication layer
        # uninitialised: ZeRO-3's zero.Init would then see a world of one and refuse the batch sizes.
        import deepspeed  # lazy: only CPU runs of DeepSpeed recipes need it here

        said = io.StringIO()
        with contextlib.redirect_stdout(said):  # "DeepSpeed deepspeed_shm_comm_op built successfully" from every
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # process, of a prebuilt op
        sys.stdout.write("".join(line for line in said.getvalue().splitlines(keepends=True)
                                 if "built successfully" not in line))
    return targs


def evaluation(settings: RunSettings, overrides: dict[str, Any]) -> dict[str, Any]:
    """With held-out data, an evaluation at every logging step (eval_loss beside loss), unless set otherwise (an
    evaluation asked for without any was refused with the other settings: opening.checked_settings)."""
    if not (settings.eval_data or settings.eval_fraction):
        return {}
    if settings.eval_fraction and overrides.get("eval_strategy") in ("no", False):  # YAML reads `no` as false
        log.warning("eval_fraction %g holds examples out of training that eval_strategy no never evaluates (leave out "
                    "one of them, unless that is what you mean: a split like another run's)", settings.eval_fraction)
    steps = overrides.get("eval_steps") or overrides.get("logging_steps") or 5
    return {"eval_strategy": "steps", "eval_steps": steps}
