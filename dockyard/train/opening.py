"""Opening the run folder, the first of the trainer's steps: the recipe loaded and its settings checked as the host
checks them, the folder made (or, for --resume, found, locked, and continued with the run's own settings), and the
checkpoint a resume starts from, checked before anything unpickles it. __main__.prepare calls open_run_folder."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockyard.common import autos, envvars, runfolder
from dockyard.common.batch import batch_split, check_autos
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES, Recipe, load_recipe
from dockyard.common.run_settings import (
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
from dockyard.common.training_args import check_training_numbers
from dockyard.train import checkpoints, ending, guards, manifest, nodes, universal
from dockyard.train.record import Run

log = logging.getLogger("dockyard.train")  # the trainer's lines, as __main__'s (train.log names the logger)


@dataclass(frozen=True)
class Opened:
    """The run folder, this run's: the recipe and settings it trains with, and the checkpoint a resume starts from."""

    recipe: Recipe
    settings: RunSettings
    training: dict[str, Any]           # TrainingArguments values, `auto` ones still unresolved
    last_checkpoint: str | None
    reshard: universal.Reshard | None  # the checkpoint's ZeRO state, to be loaded on another number of processes


def open_run_folder(overrides: dict[str, Any], run: Run) -> Opened:
    """The recipe and its settings; the run folder made (or, for --resume, found with a checkpoint to continue)."""
    recipe = run.recipe = load_recipe(run.opts.recipe)
    run.record.recipe_files = manifest.recipe_files(recipe, RECIPES / "defaults.yaml")
    run_dir = run.opts.run_dir
    if not str(run.opts.run_dir_given).strip() or run_dir.resolve() == Path.cwd().resolve():
        raise DockyardError(f"--run-dir {str(run.opts.run_dir_given)!r}: that is the folder the trainer was started "
                            "in; give the run a folder of its own (runs/<name>)")
    given = str(run.opts.run_dir_given)
    if given.startswith(runfolder.RUNS_INSIDE + "/") and not runfolder.RUN_ID.fullmatch(
            given[len(runfolder.RUNS_INSIDE) + 1:].rstrip("/")):
        # compose/train.yml's DOCKYARD_RUN_ID, unchecked: ../x was a folder off the mount, lost with the container;
        # .cache the compile cache's folder, exp/1 a folder in another, neither found by `invoke runs` or export
        raise DockyardError(f"--run-dir {given}: that is not a folder of its own in the runs folder "
                            f"({runfolder.RUNS_INSIDE}, the mount of yours) that `invoke runs` and export find; name "
                            "the run with letters, digits, _ . -, starting with a letter or digit (DOCKYARD_RUN_ID, "
                            "--run-id)")
    if run_dir.exists() and not run_dir.is_dir():
        raise DockyardError(f"--run-dir {run_dir} is a file, not a folder: pick a new run folder")
    if run.opts.resume and not run_dir.is_dir():  # a typo: nothing is made
        raise DockyardError(f"--resume: there is no run folder {run_dir}; check the path (or run without --resume)")
    if run.opts.resume and not ending.restarted():  # (a restart continues an attempt that may have failed at once)
        manifest.check_holds_a_run(run_dir)
    # a new run's settings, checked before anything is made: a typo leaves nothing behind (run.sh hands them on
    # unchecked); a resume's once the run's own are merged in, below
    checked = None if run.opts.resume else checked_settings(recipe, overrides)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DockyardError(f"cannot make the run folder {run_dir} ({e.strerror}): the runs folder must be writable "
                            f"by the user the trainer runs as (uid {os.getuid()})") from None
    runfolder.check(run_dir)  # any run's container can write here: a planted link is refused, never followed
    if nodes.node_rank() == 0 and nodes.first_of_node():
        run.training_lock = runfolder.hold(run_dir)  # held until the manifest is written: a resume meanwhile is refused
    last = manifest.check_run_dir(run_dir, run.opts.resume)
    if run.opts.resume:  # a run continues with its own settings: those given now change them
        saved = runfolder.saved_overrides(run_dir)
        overrides, run.kept_overrides, dropped = resumed_with(recipe, saved, overrides)
        if dropped:
            log.warning("--resume: the run's settings %s had no effect on it and are left out now",
                        ", ".join(f"--{k}" for k in dropped))
    run.overrides = run.record.overrides = overrides
    try:
        settings, training = checked or checked_settings(recipe, overrides)
    except DockyardError as e:
        raise blame_kept(e, run.kept_overrides) from None
    run.run_dir_ok = True
    # a resume of a folder holding another node's record alone (both nodes lost, this one before writing its own)
    # treats it as its own: a refused resume leaves it the record the next resume reads (runfolder.records_for)
    run.manifest_found = ((run_dir / runfolder.manifest_file(nodes.node_rank())).exists()
                          or (run.opts.resume and bool(runfolder.record_names(run_dir, nodes.node_rank()))))
    if run.opts.resume:
        manifest.check_same_recipe(run_dir, recipe.name)
    from_saved = [k for k in manifest.INPUT_KEYS if k in run.kept_overrides]
    if last or from_saved:  # with no checkpoint the inputs given now are a fresh start's (data fixed after a refusal)
        manifest.check_same_inputs(run_dir, run_inputs(settings), from_saved, every=bool(last))
    if last:
        check_same_shape(recipe, saved, settings)
    guards.deepspeed_launched(recipe.name, bool(recipe.deepspeed), dict(os.environ))
    guards.gpus_as_the_image_says(os.environ.get("DS_ACCELERATOR", ""), native=not os.environ.get(envvars.VARIANT))
    if last:
        checkpoints.allow()  # the classes DeepSpeed's and the Trainer's checkpoints hold, for every rank's torch.load
    state = None
    if last and nodes.first_of_node():
        # Before DeepSpeed or the Trainer unpickle anything of it. One process per node reads it and says why in its
        # manifest; the others wait for it in the rendezvous (and load weights only anyway: checkpoints.weights_only).
        complete = runfolder.complete_checkpoints(run_dir)
        state = checkpoints.check(Path(last), complete[-2] if len(complete) > 1 else None)  # last is complete[-1]
    if last:
        runfolder.check_steps_left(run_dir, training.get("max_steps"), Path(last), manifest.completed(run_dir))
    if state is not None:  # said once per node, by the process that read the checkpoint
        rescheduled(state.get("max_steps"), training, runfolder.checkpoint_step(last))
    if last and not any(Path(last).glob("rng_state*.pth")):  # what the Trainer leaves out with save_only_model
        weights = ("" if recipe.peft else f" (a full fine-tune from those weights: --model with the folder "
                   f"{run_dir.name}/checkpoints/{Path(last).name} of the runs folder)")
        raise DockyardError(f"cannot resume from {Path(last).name}: it holds the weights alone (saved with "
                            "save_only_model), and the optimizer and the learning-rate schedule would start over "
                            f"without a word. Start a new run instead{weights}; a run meant to be resumed saves with "
                            "--save_only_model false")
    # a ZeRO checkpoint saved by another number of processes is loaded in DeepSpeed's universal form (or refused)
    reshard = universal.needed(Path(last), int(os.environ.get("WORLD_SIZE", 1)), recipe) if last else None
    if last:  # the world size the manifest gives is this attempt's: a reader learns here what it continued
        run.record.resumed = {"from": Path(last).name, "step": runfolder.checkpoint_step(last),
                              **({"saved_by": reshard.saved_by, "universal": True} if reshard else {})}
    if not run.opts.resume and os.environ.get("RANK", "0") == "0":
        # kept as soon as they are checked: a run that fails later (its data, Ctrl-C before the first step) is
        # resumed with them too; a resume rewrites them once it trains (fit), a refused one leaves them as they were
        runfolder.save_overrides(run_dir, run.overrides)
    return Opened(recipe, settings, training, last, reshard)


def run_inputs(settings: RunSettings) -> dict[str, str]:
    """What the run reads, as the manifest's `inputs` records it (and a resume must read again)."""
    return {"model": settings.model, "data": str(settings.data_path), "eval_data": settings.eval_data}


def checked_settings(recipe: Recipe, overrides: dict[str, Any]) -> tuple[RunSettings, dict[str, Any]]:
    """The run's settings and TrainingArguments, checked as `invoke run` checks them on the host: run.sh and native
    runs hand their overrides straight to the trainer."""
    check_known_overrides(overrides)
    settings, training = resolve_settings(recipe, overrides)
    check_known_settings(recipe, training)
    check_training_numbers(training, guards.compile_modes(training.get("torch_compile_mode")))
    # the batch split over this run's processes, as the host checks it (the autos resolve it again, on the GPU)
    batch_split(settings.global_batch, *check_autos(training, recipe), int(os.environ.get("WORLD_SIZE", 1)))
    autos.check_packing(settings.packing, settings.task, settings.padding_free)
    check_evaluation(settings, training)
    check_profile(settings, training)
    guards.check_report_to(training.get("report_to"))
    return settings, training


# the schedules whose rate does not follow the run's total steps
SCHEDULES_OF_NO_TOTAL = ("constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau")


def rescheduled(before: Any, training: dict[str, Any], step: int) -> None:
    """Said on a resume at `step` given another max_steps than the run's (`before`: its checkpoint's
    trainer_state.json): the Trainer works the learning-rate schedule out again over the new total, so the rate changes
    at once where the run continues (a resume at step 215 of 3000 with --max_steps 220 went from 9.9e-4 to 1.3e-5 in
    one step, unsaid)."""
    now, schedule = training.get("max_steps"), str(training.get("lr_scheduler_type", "linear"))
    if isinstance(before, int) and before > 0 and before != now and schedule not in SCHEDULES_OF_NO_TOTAL:
        keep = (f"resume with max_steps {before} to keep the schedule it had" if step < before else
                f"its schedule ended at step {before}: training on takes the new one from step {step + 1}")
        log.warning("--resume: max_steps %s, where the run was started with %s: its %s learning-rate schedule is worked "
                    "out again over %s steps, so the rate changes at once from step %d (%s)", now, before, schedule,
                    now, step + 1, keep)
