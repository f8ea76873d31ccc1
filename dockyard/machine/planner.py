"""`invoke plan`: memory per recipe before a run, as a table, and which recipe to pick.

The memory model itself (shapes, model states, activations, the GPU peak) is dockyard.common.memory, which the
trainer reads too; this module is its front end: `--model` read as a folder or a count, every recipe's row (with
what it writes to disk, dockyard.common.disk), the recommendation, the table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from dockyard.common import autos, disk, model_config, recipes
from dockyard.common.batch import batch_split, check_autos
from dockyard.common.errors import DockyardError
from dockyard.common.memory import (
    MARGIN,
    Regime,
    Shape,
    budget,
    fits,
    micro_batch_estimate,
    shape_from_count,
    shape_from_folder,
)
from dockyard.common.model_config import MAX_PARAMS, cached_snapshot
from dockyard.common.recipes import Recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.common.training_args import AUTO
from dockyard.common.units import GIB
from dockyard.gpus import Host
from dockyard.images.variants import Variant, pick_auto

SEQ_LEN = 2048  # what `invoke plan` sizes a sequence at where it is not told (the model's context where shorter)


def plan_model(model: str, *, gpus: int = 0, gpu_mem_gib: float = 0.0, cpu_mem_gib: float = 0.0, seq_len: int = 0,
               batch: int = 0, host: Host | None = None, hub_home: Path | None = None, where: str = "--model",
               variants: Callable[[], dict[str, Variant]] | None = None) -> dict:
    """`invoke plan`: fill GPU count and memory from NVML (and host memory from the OS) where not given; `batch` 0
    is auto, `seq_len` 0 is SEQ_LEN or the model's context where that is shorter (a plan for 2048 tokens of a model
    of 1024 positions printed a command the trainer refuses). `variants`: reads the images, to say where this host's
    GPUs, planned, run none of them (a CUDA 11 driver), as `invoke run` would refuse the plan's command; read only
    then."""
    if seq_len < 0:
        raise DockyardError("--seq-len must be auto or at least 1")
    if batch < 0:
        raise DockyardError("--batch must be auto or at least 1")
    for flag, value in (("--gpus", gpus), ("--gpu-mem", gpu_mem_gib), ("--cpu-mem", cpu_mem_gib)):
        if value < 0:
            raise DockyardError(f"{flag}={value}: must be positive (or 0 for what this host has)")
        if flag != "--gpus" and 0 < value < 1:  # 1e-300 planned a GPU of 0 bytes: "no recipe fits"
            raise DockyardError(f"{flag}={value:g}: it is in GiB, and no GPU or host has under 1 GiB to train in "
                                f"(e.g. {flag}=80; 0 for what this host has)")
    shape = shape_for(model, hub_home, where)
    shorter = shape.context if 0 < shape.context < SEQ_LEN else 0
    seq_from = "--seq-len" if seq_len else "the model's context" if shorter else "default"
    seq_len = seq_len or shorter or SEQ_LEN
    device = None
    from dockyard.gpus import REPLAY_ENV

    # GPUs said, maybe another server's; or a recorded server's (DOCKYARD_NVML_REPLAY), beside this one's RAM
    elsewhere = bool(gpus or gpu_mem_gib or os.environ.get(REPLAY_ENV))
    gpus_given = gpus
    per_node = 0  # this host's GPUs, where the plan is for more of them than it has: several such nodes
    if not gpus or not gpu_mem_gib:
        if host is None:
            from dockyard.gpus import read_host, select

            host = select(read_host())  # the GPUs CUDA_VISIBLE_DEVICES leaves, as `invoke run` takes them
        if not host.gpus:
            missing = " and ".join(f for f, v in (("--gpus", gpus), ("--gpu-mem", gpu_mem_gib)) if not v)
            said = host.error if host.error.startswith("CUDA_VISIBLE_DEVICES") else "NVML sees no GPU on this host"
            raise DockyardError(f"{said}: say what to plan for, with {missing} too (0, the default, is this "
                                f"host's; e.g. --gpus={gpus or 8} --gpu-mem={gpu_mem_gib or 80:g})")
        mig = [str(g.index) for g in host.gpus if g.mig]
        if mig and not gpu_mem_gib:
            raise DockyardError(f"GPU {', '.join(mig)} is in MIG mode: a process gets one slice's memory, not the "
                                "GPU's that NVML reports; say the slice's: --gpu-mem=GiB (`nvidia-smi -L` lists them)")
        gpus = gpus or host.count
        per_node = host.count if gpus > host.count else 0
        unread = [str(g.index) for g in host.gpus if g.memory_bytes < GIB]
        if unread and not gpu_mem_gib:  # NVML gave no figure (or a byte): not a GPU on which "nothing fits"
            raise DockyardError(f"NVML could not read the memory of GPU {', '.join(unread)} (it said under 1 GiB): say "
                                "how much each has, --gpu-mem=GiB (nvidia-smi's memory.total)")
        gpu_mem_gib = gpu_mem_gib or min(g.memory_bytes for g in host.gpus) / GIB
        seen = autos.device_from_host(host)  # its compute capability decides compiling
        device = autos.Device(seen.name, int(gpu_mem_gib * GIB), seen.capability)
    this_host = not cpu_mem_gib
    if this_host:
        import psutil

        cpu_mem_gib = psutil.virtual_memory().total / GIB
    result = plan(shape, gpus=gpus, gpu_mem=int(gpu_mem_gib * GIB), cpu_mem=int(cpu_mem_gib * GIB),
                  seq_len=seq_len, batch=batch, device=device)
    result["cpu_mem_from"] = "this host" if this_host else "--cpu-mem"
    result["seq_len_from"] = seq_from
    result["cpu_mem_elsewhere"] = this_host and elsewhere  # GPUs said for another server, with this one's RAM
    if rec := result["recommendation"]["recipe"]:
        result["recommendation"]["command"] = run_command(rec, model, shape, gpus_given, seq_len, batch, per_node)
        result["recommendation"]["refused_here"] = refused_here(variants, host) if device else ""
    return result


def refused_here(variants: Callable[[], dict[str, Variant]] | None, host: Host | None) -> str:
    """Why `invoke run` on this host, whose GPUs the plan read, would pick no image (auto's refusal), else "". A
    plan needs no image: where the variants cannot be read (a project without images/), it says nothing of them."""
    if variants is None or host is None or not host.gpus:
        return ""
    try:
        known = variants()
    except DockyardError:
        return ""
    try:
        pick_auto(known, host)
    except DockyardError as e:
        return str(e)
    return ""


def run_command(recipe: str, model: str, shape: Shape, gpus: int, seq_len: int, batch: int, per_node: int = 0) -> str:
    """The `invoke run` of the run the plan sized: its model (a count names none: MODEL_FOLDER to fill in), as many
    GPUs as it planned where it was told how many (a run takes every GPU it sees), its sequence length (a run's
    default is 128 tokens, a plan's 2048) and micro-batch. `per_node`: this host's GPUs, where the plan is for more:
    the run of each of the fewest nodes like it that share them out evenly (`--gpus=0,...,15` on a host of 8 was
    refused, GPU 8 not being there)."""
    counted = shape.source.startswith("assumed")
    if per_node:
        nodes = next(n for n in range(-(-gpus // per_node), gpus + 1) if gpus % n == 0)
        spread = [f"--nodes={nodes}", "--node-rank=RANK", "--master-addr=NODE0_ADDR", "--run-id=RUN_ID",
                  *([f"--nproc={gpus // nodes}"] if gpus // nodes < per_node else [])]
    else:
        spread = [f"--gpus={','.join(map(str, range(gpus)))}"] if gpus else []
    words = ["invoke", "run", f"--recipe={recipe}", "--model=MODEL_FOLDER" if counted else f"--model={model}",
             *spread, "--", "--max_seq_length", str(seq_len),
             *(["--per_device_train_batch_size", str(batch)] if batch else [])]
    return shlex.join(words)


# --- the model: a folder, a hub id or a parameter count ------------------------------------------------

def parse_count(text: str) -> int | None:
    """"8B", "1.5b", "350M", "8030261248" → a parameter count; None when it is not a count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return int(round(float(m.group(1)) * scale))


def format_count(n: float) -> str:
    """A parameter count as parse_count reads it: "8.03 B", "230 M", "140 K" (a tiny model is not "0.00 B")."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit in "TB" else f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


MIN_PARAMS = 10**6  # a bare "8" is 8B with the unit left out, not a model of 8 parameters


def shape_for(model: str, hub_home: Path | None = None, where: str = "--model") -> Shape:
    """`--model`: a local folder with config.json, a hub id whose snapshot is in the Hugging Face cache under
    `hub_home` (as `invoke run` takes it: runs are offline), or a parameter count like 8B."""
    if not model:
        raise DockyardError("say which model: --model=PATH (a folder with config.json) or --model=8B")
    folder = Path(os.path.expanduser(model))
    count = parse_count(model)
    also = folder.is_dir() and count is not None and "/" not in model  # `7B`: a count, though a folder 7B is here
    if folder.is_dir() and not also:
        return shape_from_folder(folder)
    if hub_home is not None and (snapshot := cached_snapshot(hub_home, model)):
        return shape_from_folder(snapshot)
    named = f"{where}={model}" if where.startswith("--") else f"{where} {model}"
    if count is None:
        hub = f", a model in the Hugging Face cache {hub_home}" if hub_home is not None else ""
        fetch = (f"; the plan needs only its config.json: on a machine with internet, `HF_HOME={hub_home} hf download "
                 f"{model} config.json` (the cache folder then goes where the runs are)"
                 if hub_home is not None and model_config.HUB_ID.fullmatch(model) else "")
        raise DockyardError(f"{named}: neither a folder{hub} nor a parameter count like 8B, 1.5B, 350M{fetch}")
    if count > MAX_PARAMS:
        raise DockyardError(f"{named}: more than {MAX_PARAMS / 1e12:.0f}T parameters; give a count like 8B or "
                            "405B")
    if count < MIN_PARAMS:
        unit = ("give the unit, as in 8B or 350M" if model.strip().replace(".", "", 1).isdigit()
                else f"give at least {MIN_PARAMS // 10**6}M")  # a bare "8" is 8B with the unit left out
        raise DockyardError(f"{named}: {model.strip()} parameters is no language model; {unit}")
    shape = shape_from_count(count)
    if also:
        return replace(shape, source=f"{shape.source}; read as a parameter count, though a folder {model} is here: "
                                     f"write ./{model} to plan that folder")
    return shape


def disk_columns(shape: Shape, recipe: Recipe) -> dict:
    """What a long run of the recipe writes with its settings (dockyard.common.disk.for_recipe): a checkpoint, how
    many are kept (save_total_limit), how many are on disk at the peak, and the peak with the final model."""
    need = disk.for_recipe(shape, recipe)
    return {"checkpoint_bytes": need["checkpoint_bytes"], "checkpoints_kept": need["checkpoints"],
            "checkpoints_at_peak": need["checkpoints_at_peak"], "disk_bytes": need["total_bytes"]}


# --- all recipes and a recommendation ---------------------------------------------------------------

ASSUMED_CAPABILITY = (8, 0)  # a GPU given by --gpu-mem alone: every variant's GPUs compile (Volta and newer)


def plan(shape: Shape, *, gpus: int, gpu_mem: int, cpu_mem: int, seq_len: int, batch: int = 0,
         device: autos.Device | None = None) -> dict:
    """Every recipe (every folder under recipes/, in the registry's order) on `gpus` GPUs of `gpu_mem` bytes
    with `cpu_mem` bytes of host memory, and the pick. Each row is the run the trainer takes with the recipe's
    settings on that GPU (`size_run`): `batch` 0 is a run with no tuning flags (the micro-batch auto), a `batch`
    above 0 a run given `-- --per_device_train_batch_size batch`."""
    if gpus < 1:
        raise DockyardError("--gpus must be at least 1")
    device = device or autos.Device(f"{gpu_mem / GIB:.0f} GiB GPU", gpu_mem, ASSUMED_CAPABILITY)
    rows = []
    listed, broken = recipes.read_recipes()
    for recipe in listed:
        given = {"max_seq_length": seq_len, **({"per_device_train_batch_size": batch} if batch else {})}
        try:
            size = size_run(shape, recipe, given, gpus=gpus, device=device)
        except DockyardError as e:  # its settings: the other recipes are still planned
            broken[recipe.name] = str(e).removeprefix(f"recipe {recipe.name}: ")
            continue
        plain, ckpt = (micro_batch_estimate(shape, recipe, world_size=gpus, gpus_per_node=gpus, seq_len=seq_len,
                                            batch=size["micro_batch"], per_rank=size["per_rank"], checkpointing=g,
                                            regime=size["regime"]) for g in (False, True))
        # Offloaded states live in host memory all run long; without offload the host figure is only the
        # loading-time worst case (every rank holding a copy), which low-memory loading avoids: shown, not gated.
        offloads = recipe.strategy_spec.offloads and not recipe.peft
        host_ok = not offloads or plain["host_bytes"] <= cpu_mem
        rows.append({
            "recipe": recipe.name,
            "strategy": recipe.strategy,
            "peft": recipe.peft,
            "offloads": offloads,
            "recommendable": recipe.strategy_spec.recommend,
            "micro_batch": size["micro_batch"],
            "gradient_accumulation_steps": size["per_rank"] // size["micro_batch"],
            "torch_compile": size["regime"].compiled,
            "use_liger_kernel": size["regime"].liger,
            "model_states_bytes": plain["gpu_model_states_bytes"],
            "activation_bytes": plain["gpu_activation_bytes"],
            "activation_bytes_checkpointed": ckpt["gpu_activation_bytes"],
            "gpu_bytes": plain["gpu_bytes"],
            "gpu_bytes_checkpointed": ckpt["gpu_bytes"],
            "host_bytes": plain["host_bytes"],
            "fits": host_ok and size["checkpointing"] is False,
            "fits_checkpointed": host_ok and size["checkpointing"] is not None and fits(ckpt, gpu_mem),
            **disk_columns(shape, recipe),
        })
    return {"model": asdict(shape), "gpus": gpus, "gpu_mem_bytes": gpu_mem, "gpu_budget_bytes": budget(gpu_mem),
            "cpu_mem_bytes": cpu_mem, "seq_len": seq_len, "batch": batch or AUTO, "recipes": rows,
            "recommendation": recommend(rows, gpus=gpus, gpu_mem=gpu_mem, cpu_mem=cpu_mem), "broken_recipes": broken}


def size_run(shape: Shape, recipe: Recipe, given: dict, *, gpus: int, device: autos.Device) -> dict:
    """The run of the recipe on `gpus` GPUs like `device` with the trainer overrides `given`, as the trainer's autos
    take it (dockyard.common.autos, with the Liger kernels the CUDA images hold): {"micro_batch", "per_rank",
    "checkpointing": False, True, or None where nothing fits (then the smallest micro-batch, sized plainly),
    "regime": how it computes (compiled, Liger, accumulation)}."""
    settings, training = resolve_settings(recipe, given)
    try:
        split = batch_split(settings.global_batch, *check_autos(training, recipe), gpus)
    except DockyardError as e:
        raise DockyardError(f"recipe {recipe.name}: {e}") from None
    regime = Regime(lora_dropout=settings.lora_dropout, lora_r=settings.lora_r, dtype=settings.dtype,
                    logits=settings.task == "causal_lm", half=autos.computes_in_half(device, training))
    try:
        r = autos.resolve(recipe, settings, training, world_size=gpus, gpus_per_node=gpus, device=device, shape=shape,
                          kind=shape.model_type, liger=autos.LIGER_TYPES)
    except autos.DoesNotFit:
        return {"micro_batch": split.given_micro or 1, "per_rank": split.per_process, "checkpointing": None,
                "regime": regime}
    except DockyardError as e:  # the recipe's own settings contradict each other (Liger and compile both on)
        raise DockyardError(f"recipe {recipe.name}: {e}") from None
    micro, ckpt = r.overrides["per_device_train_batch_size"], r.overrides["gradient_checkpointing"]
    if split.given_micro and not fits(micro_batch_estimate(
            shape, recipe, world_size=gpus, gpus_per_node=gpus, seq_len=settings.max_seq_length, batch=micro,
            per_rank=split.per_process, checkpointing=ckpt, regime=r.regime), device.memory_bytes):
        ckpt = None  # the micro-batch given, which the trainer runs as asked: it does not fit
    return {"micro_batch": micro, "per_rank": split.per_process, "checkpointing": ckpt, "regime": r.regime}


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def recommend(rows: list[dict], *, gpus: int, gpu_mem: int, cpu_mem: int) -> dict:
    """The first recipe in the registry's order (the fastest) that fits, without checkpointing if it can,
    with one line of why."""
    candidates = [r for r in rows if r["recommendable"]]
    skipped: list[dict] = []
    room = f"{_gib(budget(gpu_mem))} per GPU ({1 - MARGIN:.0%} of {_gib(gpu_mem)})"
    for r in candidates:
        if r["fits"] or r["fits_checkpointed"]:
            ckpt = not r["fits"]
            need = r["gpu_bytes_checkpointed"] if ckpt else r["gpu_bytes"]
            why = (f"{r['recipe']} is the fastest recipe that fits: {_gib(need)} of {room} at {_micro_batch(r)}"
                   + _how(r, ckpt)
                   + (f", {_gib(r['host_bytes'])} of {_gib(cpu_mem)} host memory" if r["offloads"] else ""))
            if skipped:
                why += f"; {skipped[0]['recipe']} needs {_too_big(skipped[0], gpu_mem, cpu_mem)}"
            if r["peft"]:
                why += "; full fine-tuning fits nowhere, so this trains adapters only"
            if r["peft"] == "qlora":
                why += " (QLoRA buys memory, not speed: slower per token than bf16 LoRA)"
            return {"recipe": r["recipe"], "gradient_checkpointing": ckpt, "micro_batch": r["micro_batch"],
                    "gradient_accumulation_steps": r["gradient_accumulation_steps"], "why": why}
        skipped.append(r)
    last = f"even {skipped[-1]['recipe']} needs {_too_big(skipped[-1], gpu_mem, cpu_mem)}; " if skipped else ""
    return {"recipe": None, "gradient_checkpointing": None, "micro_batch": None, "gradient_accumulation_steps": None,
            "why": f"nothing fits in {room} on {gpus} GPU(s): {last}use more or larger GPUs, "
                   f"or a shorter --seq-len"}


def _short_of_host(r: dict, cpu_mem: int) -> bool:
    """An offload recipe whose states, kept in host memory all run long, need more than the host has."""
    return r["offloads"] and r["host_bytes"] > cpu_mem


def _too_big(r: dict, gpu_mem: int, cpu_mem: int) -> str:
    if _short_of_host(r, cpu_mem):
        return f"{_gib(r['host_bytes'])} of host memory (have {_gib(cpu_mem)})"
    return f"{_gib(r['gpu_bytes_checkpointed'])} per GPU even with gradient checkpointing at {_micro_batch(r)}"


def _micro_batch(r: dict) -> str:
    """A row's micro-batch and accumulation, in words."""
    a = r["gradient_accumulation_steps"]
    return f"micro-batch {r['micro_batch']}" + (f" × {a} accumulated" if a > 1 else "")


def _how(r: dict, checkpointing: bool) -> str:
    """What the trainer turns on for a row that fits, in words: " with gradient checkpointing and ..."."""
    on = [w for w, yes in (("gradient checkpointing", checkpointing), ("torch.compile", r["torch_compile"]),
                           ("Liger's kernels", r["use_liger_kernel"])) if yes]
    return f" with {' and '.join(on)}" if on else ""


# --- what it prints ---------------------------------------------------------------------------------------

def print_plan(result: dict) -> None:
    from rich.console import Console
    from rich.markup import escape  # a folder's name, a recipe's, a reason: text, never rich's [tags]
    from rich.table import Table

    m = result["model"]
    console = Console()
    console.print(f"model: {format_count(m['params'])} parameters, largest layer {format_count(m['largest_layer'])} "
                  f"({escape(str(m['source']))})")
    mine = " (this host's; --cpu-mem)" if result.get("cpu_mem_elsewhere") else ""
    context = " (the model's context)" if result.get("seq_len_from") == "the model's context" else ""
    table = Table(title=f"sizes in GiB · {result['gpus']} GPU(s) × {_gib(result['gpu_mem_bytes'])}, host "
                        f"{_gib(result['cpu_mem_bytes'])}{mine}, seq {result['seq_len']}{context}, micro-batch "
                        f"{result['batch']}")
    # GiB without the unit in each cell, two-line headers, whole GiB from 100: the table fits 80 columns with every
    # recipe name, header and cell whole (a long name of one's own recipe wraps)
    for col in ("recipe", "states", "activ.", "per\nGPU", "w/\nckpt", "host", "fits", "disk"):
        table.add_column(col, justify="left" if col in ("recipe", "fits") else "right", no_wrap=col != "recipe")
    for r in result["recipes"]:
        fits = ("yes" if r["fits"] else "ckpt" if r["fits_checkpointed"] else "no") + \
            f" {r['micro_batch']}×{r['gradient_accumulation_steps']}" + \
            (" C" if r["torch_compile"] else "") + (" L" if r["use_liger_kernel"] else "")
        if _short_of_host(r, result["cpu_mem_bytes"]):
            fits = "no RAM"  # whatever the GPUs hold
        how = r["strategy"] + (f" + {r['peft']}" if r["peft"] else "")  # a recipe of one's own: its strategy
        table.add_row(escape(r["recipe"] if r["recipe"] in (r["strategy"], r["peft"]) else f"{r['recipe']} ({how})"),
                      *(_gib_cell(r[k]) for k in ("model_states_bytes", "activation_bytes", "gpu_bytes",
                                                  "gpu_bytes_checkpointed")),
                      _gib_cell(r["host_bytes"]) + ("" if r["offloads"] else "*"),  # the loading worst case
                      f"[green]{fits}[/]" if r["fits"] else f"[yellow]{fits}[/]" if r["fits_checkpointed"] else f"[red]{fits}[/]",
                      _gib_cell(r["disk_bytes"]))  # a long run's peak: the footnote says so, --json itemises
    console.print(table)
    for name, error in result["broken_recipes"].items():
        console.print(f"[yellow]left out: recipe {escape(name)}: {escape(error)}[/]")
    rec = result["recommendation"]
    console.print(("[bold]recommended: " + escape(rec["recipe"]) + "[/]" if rec["recipe"] else
                   "[bold red]no recipe fits[/]") + f" — {escape(rec['why'])}")
    if rec.get("command"):
        fill = " (MODEL_FOLDER: the folder of a model of that size)" if "MODEL_FOLDER" in rec["command"] else ""
        if "--node-rank=RANK" in rec["command"]:
            fill += (" (on each node: RANK its number from 0, NODE0_ADDR node 0's address, RUN_ID one name for all; "
                     "docs/multinode.md)")
        console.print(f"run it: {escape(rec['command'])}{fill}", soft_wrap=True)  # whole, to copy
        if rec.get("refused_here"):
            console.print(f"[yellow]  but not on this host as it is: {escape(rec['refused_here'])}[/]")
        # the recipes' max_steps and learning rate are sized for the sample model, and the default data is a sample
        console.print("  with your data (--data=PATH) and your run's length and learning rate after -- "
                      "(--max_steps N --learning_rate LR): the recipes' own suit the tiny sample model")
    # the key to the cells; what each figure is made of: docs/machine.md
    console.print(f"[dim]fits: yes, ckpt (only with gradient checkpointing) or no, within {1 - MARGIN:.0%} of each GPU "
                  "(the trainer's margin), at micro-batch × accumulation steps as the trainer picks them; C compiled, L "
                  "Liger's kernels, where the trainer turns them on by itself. per GPU: a step's peak, calibrated on "
                  "measured runs (not states + activ.); w/ ckpt: the same with gradient checkpointing. host: what "
                  "offloading holds in RAM all run (no RAM: more than this host has); host*: RAM only while the "
                  "checkpoint loads, not counted. disk: a long run's peak (its checkpoints and the final "
                  "model). How each is worked out: docs/machine.md.[/]")


def _gib_cell(b: float) -> str:
    return f"{b / GIB:.1f}" if b < 100 * GIB else f"{b / GIB:.0f}"


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2)
