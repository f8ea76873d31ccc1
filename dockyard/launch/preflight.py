"""What `invoke run` checks on the host before anything starts, `--dry` included: what the trainer would refuse
minutes later, inside the container, refused now with the same reason and no engine asked.

- the trainer overrides (`-- --max_steps 5`): every key a project setting or a TrainingArguments field (a misspelt
  one names the closest), the project's settings valid (recipes/defaults.yaml ← recipe ← overrides), and every
  TrainingArguments number a finite number (a whole one where the field is an int), every `auto` setting's value
  valid and the batch settings split over the run's processes (global_batch, the micro-batch and the accumulation
  dividing it) as the trainer's autos check them, and an eval_strategy with held-out data to evaluate on (eval_data
  or eval_fraction);
- the strategy against the host: FSDP without GPUs (the HF Trainer would fall back to DDP; the trainer stops);
- the inputs against what the trainer reads: a data file of a known type that is not empty (or a folder of them)
  and holds a step's worth of examples (check_enough_examples), a model folder with config.json, a hub id that is
  in the Hugging Face cache (runs are offline);
- `--resume` names the run it continues (`--run-id`), and continues it with the recipe it was started with;
- the runs folder's disk has room for the checkpoints and the model the run writes (check_runs_disk);
- on GPUs, at least one example fits the smallest of them by the plan's estimate, as the trainer's autos size the
  run (check_fits).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from dockyard.common import autos, disk, memory, model_config, passthrough, runfolder
from dockyard.common.autos import (
    LIGER_TYPES,
    Device,
    check_packing,
    check_packing_format,
    liger_uncovered,
    resolve_numa_binding,
)
from dockyard.common.batch import Batch, auto_switch, batch_split, check_autos, check_batch_within_data
from dockyard.common.data_files import (
    BUILDERS,
    COUNT_LIMIT,
    bad_role,
    csv_header,
    data_files_in,
    examples_for,
    examples_in,
    first_format,
    format_of,
    held_out,
    holds_text,
    left_out,
    mixed_formats,
    not_examples,
    other_format,
    saved_by_datasets,
    unknown_format,
    unknown_type,
)
from dockyard.common.errors import DockyardError, json_object
from dockyard.common.model_config import check_model_folder
from dockyard.common.overrides import parse_overrides
from dockyard.common.recipes import Recipe, check_deepspeed_ops, read_deepspeed_config, recipe_names, strategy
from dockyard.common.run_settings import (
    TINY_MODEL,
    RunSettings,
    blame_kept,
    check_evaluation,
    check_known_overrides,
    check_known_settings,
    check_profile,
    check_same_shape,
    resolve_settings,
    resumed_with,
)
from dockyard.common.training_args import AUTO, check_training_numbers
from dockyard.common.units import GIB
from dockyard.images.variants import Variant, canonical_name, parse_lock_pins
from dockyard.launch import inputs
from dockyard.launch.inputs import host_path
from dockyard.launch.runs import newest_runs
from dockyard.settings import Settings

T = TypeVar("T")


def check_resume(settings: Settings, resume: bool, run_id: str) -> None:
    """`--resume` names the run folder it continues."""
    if resume and not run_id:
        raise DockyardError(f"--resume needs --run-id: the run folder to continue "
                            f"({newest_runs(settings.path(settings.runs_dir))})")


def trained_where(run_dir: Path, node_rank: int) -> bool | None:
    """Whether the run in run_dir trained on this host (--native), as its manifest says; None without one."""
    found = runfolder.record_for(run_dir, node_rank)
    return None if found is None else found[1].variant in runfolder.NATIVE_VARIANTS


def inputs_to_give_again(run_dir: Path, node_rank: int, given: dict[str, str]) -> tuple[dict[str, str], int, str]:
    """`--resume` of a run trained in a container: the host paths of the inputs it mounted (its manifest's `inputs`)
    that this command does not give again, the node whose record names them, and that record's file. The run's
    settings hold the paths inside the container, and a resume mounts only what its command names (a manifest any
    container can write never chooses a host folder to mount): without them the trainer refused after the container
    had started, naming a /workspace path the user never typed. A node that wrote no record of its own (lost before it
    could) finds the run's manifest.json, or another node's record (runfolder.record_for): those are that node's host
    paths, not this one's."""
    found = runfolder.record_for(run_dir, node_rank)
    if found is None:
        return {}, node_rank, runfolder.manifest_file(node_rank)
    name, m = found
    own = name == runfolder.manifest_file(node_rank)
    whose = m.node_rank if m.node_rank is not None else node_rank if own else 0  # one of before node_rank: node 0's
    return {key: rec.path for key in ("data", "model", "eval_data")
            if (rec := m.inputs.get(key)) and rec.path and rec.inside.startswith(inputs.INPUTS + "/")
            and not given.get(key)}, whose, name


def resumed_recipe(run_dir: Path, given: str) -> str:
    """`--resume`: the recipe the run was started with, as its manifest names it; a --recipe naming another is
    refused (DeepSpeed cannot continue another strategy's checkpoint, and the failed try would overwrite the record
    of the run). The manifest names a recipe folder of your own by the folder's name: that one is given again."""
    # the run's, read as every node's trainer holds the resume to it (manifest.check_same_recipe: manifest.json
    # first): read this node's own first, a record naming another recipe had the host refuse the --recipe the trainer
    # asked for, and the trainer the one the host took
    recorded = next((m.recipe for _, m in runfolder.records_for(run_dir, 0) if m.recipe), "")
    if given:
        folder = Path(os.path.expanduser(given))
        name = folder.resolve().name if (folder / "recipe.yaml").is_file() else given
        if recorded and name != recorded:
            raise DockyardError(f"--recipe {given}: run {run_dir.name} was started with recipe {recorded}, and a run "
                                f"continues with its own: leave --recipe out, or train {given} as a new run "
                                "(another --run-id)")
        return given
    if not recorded:
        raise DockyardError(f"--resume: run {run_dir.name} has no manifest naming its recipe (it stopped before "
                            "writing one): give the recipe it was started with, --recipe=NAME")
    if recorded not in recipe_names():
        raise DockyardError(f"--resume: run {run_dir.name} was started with recipe {recorded}, a folder of your own: "
                            "give that folder again, --recipe=FOLDER")
    return recorded


def check_run(settings: Settings, *, recipe: Recipe, overrides: list[str], gpus_in_effect: bool, processes: int,
              data: str = "", model: str = "", resumed: Path | None = None, liger_absent: str = "",
              installed: Installed | None = None, gpus_fix: str = "run it on GPUs") -> None:
    """Refuse what the run would refuse (pure: reads files, runs nothing); `processes`: all the run's, every node's;
    `resumed`: the run folder --resume continues, whose own settings the run keeps; `liger_absent`: why liger-kernel
    is not where the run trains ("": it is); `installed`: the packages installed where the run trains (None: not
    known here); `gpus_fix`: how to give a recipe that needs GPUs some."""
    saved = resumed_settings(resumed) if resumed else None
    run_settings, training = check_overrides(recipe, overrides, processes, saved=saved, liger_absent=liger_absent,
                                             installed=installed)
    if resumed:  # a run at its max_steps already: refused here, not once the image has started
        complete, m = runfolder.complete_checkpoints(resumed), runfolder.read_manifest(resumed)
        if complete:
            check_same_shape(recipe, saved, run_settings)
        runfolder.check_steps_left(resumed, training.get("max_steps"), complete[-1] if complete else None,
                                   bool(m and m.status == "completed"))
    check_on_gpus(recipe, gpus_in_effect, gpus_fix)
    if not gpus_in_effect:  # what the trainer would say once the image had started
        resolve_numa_binding(run_settings.numa_binding, None, None)
        check_cpu_training(training)
    liger = auto_switch(training.get("use_liger_kernel", AUTO), "use_liger_kernel") is True
    # the examples of one optimizer step, all processes' (the autos pick how each process splits its share)
    batch = batch_split(run_settings.global_batch, *check_autos(training, recipe), processes) if processes else None
    trained = ("", "")  # the training data's format and where it is given
    for key, value, where in inputs.resolved(settings, overrides, data=data, model=model,
                                             recipe_settings=recipe.settings):
        files = check_input(key, value, where, settings, liger)
        fmt, fields = "", []
        if run_settings.task == "causal_lm" and run_settings.data_format == "auto":
            # the format the data's fields name (a named one: check_overrides), and those fields
            fmt, fields = check_data_fields(files)
            if key == "data" and fmt:
                check_packing_format(run_settings.packing, fmt)
                trained = (fmt, f"{where} {value}")
            if key == "eval_data" and fields and (other := other_format(f"{where} {value}", fields, *trained)):
                raise other
        if run_settings.task == "causal_lm":
            check_chat_roles(files, fmt if run_settings.data_format == AUTO else run_settings.data_format)
        if key == "data" and batch:
            check_enough_examples(f"{where} {value}", files, run_settings, batch, fmt or format_of(fields),
                                  gpus_in_effect)


def check_enough_examples(given: str, files: list[Path], run_settings: RunSettings, batch: Batch, fmt: str,
                          gpus: bool) -> None:
    """Data of fewer examples than one optimizer step takes (`batch`), refused in the trainer's words
    (check_batch_within_data), which it said once the image had started and the data and model were read: counted
    here up to a step's worth (data_files.examples_in); none at all (a .csv header alone) said as that. `given`: the
    data as given (`--data PATH`); `fmt`: the format the data's fields name ("": not known here). eval_fraction's
    share is held out as data.split holds it out (data_files.held_out): 2 of 11 examples at 0.2, where the host held
    out one and passed 9 for a step of 10. Left to the trainer where the host cannot count: documents that may be
    packed into blocks of tokens (packing true, or auto on GPUs for text: autos.resolve_packing), a hub dataset,
    Parquet, examples of megabytes each."""
    fmt = fmt or ("text" if any(f.suffix == ".txt" for f in files) else
                  run_settings.data_format if run_settings.data_format != AUTO else "")
    packs = run_settings.packing is True or (run_settings.packing == AUTO and gpus and run_settings.task == "causal_lm"
                                             and run_settings.padding_free is not True and fmt in ("text", ""))
    fraction = run_settings.eval_fraction  # its share, held out of training as data.split holds it out
    enough = examples_for(batch.global_batch, fraction)
    if not files or packs or (counted := examples_in(files, enough)) is None:
        return
    if not counted:
        raise DockyardError(f"{given}: holds no examples (a header, or blank lines, alone): give the data your examples "
                            "are in (formats: docs/data.md)")
    if fraction and counted < 2:
        raise DockyardError("eval_fraction needs at least 2 examples")  # data.split's words
    held = held_out(counted, fraction) if fraction else 0
    share = f" at most (of its {counted}, eval_fraction {fraction:g} holds out {held})"
    check_batch_within_data(batch.global_batch, counted - held, False, batch.processes, share if held else "")


def check_model_config(folder: Path, liger: bool) -> None:
    """What the trainer would refuse in the model's config.json, before an image starts: for a family plan counts
    exactly, sizes transformers cannot build a model from (model_config.count's checks; another family's keys are
    its own, left to the trainer); with `liger` (use_liger_kernel true), a model type Liger has no kernels for."""
    cfg = json_object(folder / "config.json", "model settings")
    model_config.check_sizes(folder / "config.json", cfg)  # any family's: the trainer builds each layer it asks for
    kind = cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else ""  # not as text: count says so
    if kind in model_config.FAMILIES and all(k in cfg for k in model_config.REQUIRED):  # else transformers' defaults
        model_config.count(folder, memory.LORA_RANK)
    if liger and kind not in LIGER_TYPES:
        raise DockyardError(liger_uncovered(kind or "(none)"))


def check_data_fields(files: list[Path]) -> tuple[str, list[str]]:
    """A JSON Lines (or JSON) file whose first example is not a JSON object, or a JSON or .csv file whose fields name
    no format, refused as the trainer refuses it, but before the image starts (and leaves a failed run folder
    behind); the format the first JSON file's fields name ("": not read here), and the fields of its first example
    (or the first .csv file's header; [] where none was read). A .csv header names every column, where the trainer
    counts those the first rows fill: it can only refuse here, not tell the format."""
    fields: list[str] = []
    for f in sorted(f for f in files if f.suffix == ".csv"):
        if (header := readable(f, csv_header)) is not None and not format_of(header):
            raise unknown_format(str(f), header)
        fields = fields or header or []
    json_files = sorted(f for f in files if f.suffix in (".jsonl", ".json"))  # a .json of one array: its first object
    first = readable(json_files[0], first_format) if json_files else None
    fmt, fields = first or ("", fields)
    try:  # the first file's first example, read once
        mixed = mixed_formats(json_files, {json_files[0]: first}) if len(json_files) > 1 else None
    except OSError as e:
        raise DockyardError(f"cannot read the data file {e.filename}: {e.strerror or e}") from None
    if mixed:
        raise mixed
    return fmt, fields


def check_chat_roles(files: list[Path], fmt: str) -> None:
    """A chat turn whose role the trainer refuses (a ShareGPT `from` it does not know, a `messages` role that is not
    text), named by its file and line before the image starts (data_files.bad_role)."""
    for f in sorted(files):
        if said := readable(f, lambda p: bad_role(p, fmt)):
            raise DockyardError(said)


def check_holds_text(files: list[Path], given: str, one: bool) -> bool:
    """Data files of whitespace alone refused, each read up to its first other byte and no further than COUNT_LIMIT (a
    blank file of gigabytes was read to its end here): one whose first COUNT_LIMIT bytes are whitespace alone is said
    in a warning and left to the trainer, which reads on (True: not read again here)."""
    found = []
    for f in files:
        found.append(readable(f, lambda p: holds_text(p, COUNT_LIMIT)))
        if found[-1]:
            return False
    if None in found:
        whose = "its" if one else "each of its files'"
        print(f"warning: {given}: whitespace alone (blank lines, spaces) in {whose} "
              f"first {COUNT_LIMIT >> 20} MiB, no example: not read further here; the trainer reads on and says what "
              "it finds", file=sys.stderr)
        return True
    empty = "the file is empty" if one else "its files are empty"
    raise DockyardError(f"{given}: holds no examples ({empty}): give the data your examples are in (formats: "
                        "docs/data.md)")


def readable(path: Path, read: Callable[[Path], T]) -> T:
    """`read(path)`, a data file the host cannot read (the run reads it as this user) refused in one line."""
    try:
        return read(path)
    except OSError as e:
        fix = " (make it readable to you: chmod a+r)" if isinstance(e, PermissionError) else ""
        raise DockyardError(f"cannot read the data file {path}: {e.strerror or e}{fix}") from None


def liger_absent(gpus: bool, variant: Variant | None = None, native: bool = False) -> str:
    """Why Liger's kernels cannot run where the run trains, "" where they can: on GPUs, where the image's lock pins
    liger-kernel (the CUDA images; None: a cluster's, a CUDA one) or this host's Python has it (--native)."""
    if not gpus:
        return "this run trains on CPU, where Liger's kernels (Triton's) do not run"
    if native:
        return "" if importlib.util.find_spec("liger_kernel") else "this host's Python has no liger-kernel (--native)"
    if variant is None:
        return ""
    pinned = installed(variant)  # the lock's pins, by canonical name, as report_to's and optim's checks read them
    return "" if pinned and "liger-kernel" in pinned.packages else (f"the {variant.name} image has no liger-kernel (the "
                                                                    "CUDA images pin it)")


class Installed(NamedTuple):
    """The packages installed where a run trains (their canonical names, PEP 503), and the words for that place."""

    packages: frozenset[str]
    where: str


def installed(variant: Variant | None = None, native: bool = False) -> Installed | None:
    """What the run's settings can ask of the packages where it trains (report_to's integrations, optim's makers): those
    the image's lock pins, or this host's Python has (--native); None where the image is not known here (a cluster's)."""
    if native:
        return Installed(host_packages(), "this host's Python (--native)")
    if variant is None or not variant.lock_file.is_file():
        return None
    return Installed(frozenset(parse_lock_pins(variant.lock_file.read_text())), f"the {variant.name} image")


def host_packages() -> frozenset[str]:
    """The packages this host's Python has, by canonical name; one whose metadata cannot be read (not UTF-8: a
    half-written install, a dist-info copied from elsewhere on PYTHONPATH) is passed over, where it was a traceback."""
    names = set()
    for d in importlib.metadata.distributions():
        try:
            names.add(canonical_name(d.metadata["Name"] or ""))
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            continue
    return frozenset(names)


def check_native_python(does: str = "trains", needs: tuple[str, ...] = ("torch", "transformers", "deepspeed")) -> None:
    """`--native` trains (or exports) with this host's Python: the host install (`pip install -e .`) has no torch,
    and torchrun then failed with "No module named 'torch'" and a line blaming docker (export: a traceback)."""
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise DockyardError(f"--native {does} with this host's Python ({sys.executable}), which lacks "
                            f"{', '.join(missing)}: install the training stack (`pip install -e '.[train]'`), or "
                            f"leave out --native to use the image")


def check_on_gpus(recipe: Recipe, gpus: bool, fix: str = "run it on GPUs") -> None:
    """A recipe the trainer would stop without GPUs (FSDP) is refused where the run has none."""
    if strategy(recipe.strategy).engine == "fsdp" and not gpus:
        raise DockyardError(f"recipe {recipe.name} is FSDP, which the HF Trainer runs only on GPUs (on CPU it would "
                            f"fall back to DDP, so the trainer stops): {fix}, or pick zero3 for sharding on CPU "
                            "(invoke recipes)")


def check_cuda_ops(recipe: Recipe, image: str, loadable: set[str] | None) -> None:
    """A recipe whose DeepSpeed config needs a CUDA op the image can neither load nor compile is refused (GPU runs)."""
    if loadable is None or not recipe.deepspeed:
        return
    path = recipe.file(recipe.deepspeed)
    check_deepspeed_ops(read_deepspeed_config(path), str(path), loadable, image)


class Sized(NamedTuple):
    """What sized_run finds: the model's shape, the run's settings, and the model as the host names it."""

    shape: memory.Shape
    settings: RunSettings
    training: dict[str, Any]
    model: str


def sized_run(settings: Settings, recipe: Recipe, overrides: list[str], *, model: str, run_dir: Path,
              resume: bool) -> Sized | None:
    """The model's shape (read from its config.json on the host) and the run's settings, a resume's own (its
    overrides.json) with those given now on top; None where the model cannot be sized here (a hub id not in the
    cache, which the trainer refuses; a resumed container run's own path) or the settings are refused (the checks
    before say so)."""
    try:
        seen = inputs.read_only_mounts(settings, "", overrides, model=model, checkout_recipes=False,  # the model's
                                       recipe_settings=recipe.settings)
        given = parse_overrides(seen.overrides)
        named = given.get("model")  # a hub id, passed on as it is
        if resume:  # the run continues with its own settings (its overrides.json), those given now on top
            named = named or runfolder.saved_overrides(run_dir).get("model")  # its hub id, or a native run's folder
            given, _, _ = resumed_with(recipe, resumed_settings(run_dir), given)
        folder = seen.host_paths.get(f"{inputs.INPUTS}/model")  # a folder mounted: the model given on this host
        name = folder
        if folder is None and not named:
            folder = name = TINY_MODEL
        elif folder is None and isinstance(named, str) and Path(named).is_absolute() and Path(named).is_dir():
            folder = name = named
        elif folder is None:  # a hub id, named so to `invoke plan --model` too
            folder, name = model_config.cached_snapshot(settings.path(settings.hf_cache), str(named)), named
        if not folder:
            return None
        run_settings, training = resolve_settings(recipe, given)
        return Sized(memory.shape_from_folder(Path(folder)), run_settings, training, str(name))
    except DockyardError:
        return None


def check_runs_disk(recipe: Recipe, sized: Sized | None, *, run_dir: Path, gpu: bool,
                    resume: bool) -> dict[str, Any] | None:
    """`invoke run`: what the run will write (dockyard.common.disk), refused before anything starts when the runs
    folder's disk lacks the room. Settings the trainer would refuse, or a model that cannot be sized here (`sized`
    None), are left to the trainer: None, no check."""
    if sized is None:
        return None
    shape, run_settings, training, _ = sized
    try:
        need = disk.for_settings(shape, recipe, run_settings, training, half_on_gpu=gpu)
    except DockyardError:
        return None
    disk.check_room(run_dir.parent, need, disk.folder_bytes(run_dir) if resume else 0)
    return need


def check_fits(recipe: Recipe, sized: Sized | None, *, device: Device | None, processes: int, per_node: int,
               liger: bool) -> autos.Resolved | None:
    """`invoke run` on GPUs: a run of which not even one example fits the smallest GPU by the plan's estimate (or
    none that accumulation divides), refused as the trainer's autos refuse it once the image has started
    (autos.DoesNotFit), with the same reason. Never what the trainer would take: NVML's total is at least torch's;
    only a model of a family counted exactly (model_config.FAMILIES: another is counted as a Llama, up to 30 % over);
    and, where the run may have Liger's kernels, only what does not fit with them or without them (which the image
    has for which model types, and so what the autos choose, is known there). Returns the autos as they resolve here
    (with Liger's kernels where the run may have them), None where that is not known."""
    if device is None or device.memory_bytes < GIB or sized is None:  # 0 bytes: NVML gave no figure (torch will)
        return None
    shape, run_settings, training, model = sized
    if shape.model_type not in model_config.FAMILIES:
        return None

    def resolved(covered: tuple[str, ...]) -> autos.Resolved | autos.DoesNotFit | None:
        try:
            return autos.resolve(recipe, run_settings, training, world_size=processes, gpus_per_node=per_node,
                                 device=device, shape=shape, kind=shape.model_type, liger=covered, model=model)
        except autos.DoesNotFit as e:
            return e
        except DockyardError:  # the trainer's to say
            return None

    first = resolved((shape.model_type,) if liger else ())
    if not isinstance(first, autos.DoesNotFit):
        return first
    second = resolved(()) if liger else first
    if isinstance(second, autos.DoesNotFit):
        raise first
    return second


def resumed_settings(run_dir: Path) -> dict[str, Any]:
    """The settings a run was given after `--`, as the trainer merges them on --resume, less its inputs (the paths
    inside its container: a resume mounts what its command names); refused where unreadable, as the trainer refuses
    them."""
    saved = runfolder.saved_overrides(run_dir)
    return {k: v for k, v in saved.items() if k not in ("data", "model", "eval_data")}


def check_cpu_training(training: dict[str, Any]) -> None:
    """Switches of GPUs alone, given to a run on CPUs: Transformers' or torch's refusal once the image had started."""
    if training.get("tf32") is True:
        raise DockyardError("tf32 true is a mode of NVIDIA GPUs (Ampere and newer), and this run trains on CPU: leave "
                            "it out")
    if training.get("ddp_backend") == "nccl":
        raise DockyardError("ddp_backend nccl needs GPUs, and this run trains on CPU: leave it out (gloo)")


def check_overrides(spec, overrides: list[str], processes: int = 0, saved: dict[str, Any] | None = None,
                    liger_absent: str = "", installed: Installed | None = None) -> tuple[RunSettings, dict[str, Any]]:
    """Every override a known key with a valid value, as the trainer checks them (dockyard.common.run_settings), and
    the batch settings split over the run's `processes` (0: not known here; the trainer checks the split); a resume's
    on top of the run's own (`saved`), as the trainer merges them. `liger_absent`: why liger-kernel is not where
    the run trains ("": it is, or not known here); `installed`: the packages installed there."""
    given = parse_overrides(overrides)
    check_known_overrides(given)
    given, kept, _ = resumed_with(spec, saved or {}, given)
    try:
        run_settings, training = resolve_settings(spec, given)
        check_known_settings(spec, training)
        check_training_numbers(training)
        if installed:
            passthrough.check_installed(training, installed.packages, installed.where)
        micro, accumulation = check_autos(training, spec)
        if liger_absent and auto_switch(training.get("use_liger_kernel", AUTO), "use_liger_kernel") is True:
            raise DockyardError(f"use_liger_kernel true cannot run here: {liger_absent}; set it to auto or false")
        check_packing(run_settings.packing, run_settings.task, run_settings.padding_free)
        if run_settings.task == "causal_lm" and run_settings.data_format != "auto":  # the format named, any data
            check_packing_format(run_settings.packing, run_settings.data_format)
        if processes:
            batch_split(run_settings.global_batch, micro, accumulation, processes)
        check_evaluation(run_settings, training)
        check_profile(run_settings, training)
    except DockyardError as e:
        raise blame_kept(e, kept) from None
    return run_settings, training


def check_input(key: str, value: str, where: str, settings: Settings, liger: bool = False) -> list[Path]:
    """A host path of the right kind, or a hub id in the cache; the data files it names ([] for a model, a hub id, or
    data whose first COUNT_LIMIT bytes are whitespace alone: the trainer's to read on). `liger`: use_liger_kernel is
    set true, which the model's type must have kernels for."""
    path = host_path(value, where, settings, key)
    if path is None:
        return []  # a hub id found in the cache
    if key == "model":
        check_model_folder(path, f"{where} {value}")
        check_model_config(path, liger)
        return []
    if not path.is_file() and not path.is_dir():
        raise DockyardError(f"{where} {value}: neither a file nor a folder (a device, pipe or socket): give a data "
                            "file, or a folder of them (docs/data.md)")
    suffix = Path(inputs.given_name(value, path)).suffix  # a link's own name: what the run sees it as
    if path.is_file() and suffix not in BUILDERS:
        raise DockyardError(f"{where} {value}: unknown data file type {suffix or '(none)'}{unknown_type(suffix)}; use "
                            f"{', '.join(BUILDERS)} (docs/data.md)")
    # a file by the name given (a link's, as the run sees it): the Hugging Face cache's snapshots/REV/train.jsonl ->
    # blobs/<sha256> has no suffix, and its fields went unread here
    files = [Path(os.path.expanduser(value))] if path.is_file() else []
    if path.is_dir():
        if saved := saved_by_datasets(path):
            raise DockyardError(f"{where} {value}: {saved}")
        files = data_files_in(path)
        kinds = {BUILDERS[f.suffix] for f in files}
        if not kinds:
            raise DockyardError(f"{where} {value}: the folder holds no {', '.join(BUILDERS)} file")
        if len(kinds) > 1:
            raise DockyardError(f"{where} {value}: the folder mixes data files of different kinds "
                                f"({', '.join(sorted(kinds))}): keep one kind per folder, or point at one file")
        if skipped := left_out(path):
            print(f"warning: {where} {value}: not read (only {', '.join(BUILDERS)} files not hidden are data): "
                  f"{', '.join(skipped[:10])}" + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""),
                  file=sys.stderr)
    if said := next((said for f in files if f.suffix in (".json", ".jsonl") and (said := readable(f, not_examples))),
                    ""):
        raise DockyardError(said)
    for f in (f for f in files if f.suffix == ".csv"):  # its header (a column named twice), whatever the task
        readable(f, csv_header)
    blank = bool(files) and check_holds_text(files, f"{where} {value}", path.is_file())
    if link := next((f for f in files if f.is_symlink() and not f.resolve().is_relative_to(path)), None):
        raise DockyardError(f"{where} {value}: {link.name} is a link to {os.readlink(link)}, outside the folder, "
                            "which is mounted alone into the run (the link would point at nothing there): copy the "
                            "file into the folder, or give the file itself")
    return [] if blank else files  # whitespace as far as the host reads: no format or count to find in it here
