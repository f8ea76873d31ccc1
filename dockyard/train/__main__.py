"""The trainer's entry point, one process per GPU (or per CPU worker) under torchrun:

    torchrun --nproc-per-node N -m dockyard.train --recipe NAME_OR_DIR --run-dir DIR [--resume] [-- --key value ...]

Everything after `--` overrides recipes/defaults.yaml: the project's settings (model, data, task, ...) or
any TrainingArguments field; here they may also follow the options without the `--` (`invoke run` needs it).
The run writes DIR/train.log, DIR/metrics.jsonl, checkpoints under DIR/checkpoints, the final model (or
LoRA adapter) in DIR/model, and DIR/manifest.json, also when it fails.
"""
# Read top to bottom: main, then train's steps in the order they run (open the run folder, the model's source and
# size, the `auto` settings, TrainingArguments, the data, the estimates, the model, fit, save and measure), each
# giving its typed part of the run's Record (dockyard.train.record). dockyard.train.ending writes the manifest from
# it, on every way out. Steps of their own concern live in modules named for them: opening (the run folder opened,
# the settings checked, a resume's checkpoint), arguments (TrainingArguments), logs (train.log and the console),
# trainer_errors (the Trainer's errors in fit, in one line).

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pickle
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers  # a lazy module: its submodules load when first used

from dockyard.common import autos, disk, envvars, memory, model_config, runfolder
from dockyard.common.batch import check_batch_within_data
from dockyard.common.errors import DockyardError, Stopped, first_line, on_host
from dockyard.common.overrides import parse_overrides
from dockyard.common.recipes import Recipe
from dockyard.common.run_settings import RunSettings
from dockyard.common.runfolder import METRICS
from dockyard.train import (
    LAUNCHER,
    arguments,
    checkpoints,
    cpus,
    data,
    ending,
    environment,
    fourbit,
    guards,
    logs,
    manifest,
    mfu,
    nodes,
    opening,
    strategy,
    trainer_errors,
    universal,
)
from dockyard.train import model as models
from dockyard.train.data.batches import collate, collate_packed
from dockyard.train.export import PROBE_TOKENS
from dockyard.train.precision import of_args as half_of
from dockyard.train.record import Estimates, ModelRecord, Run

# Imported inside functions, on purpose: transformers' Trainer, TrainingArguments (dockyard.train.arguments) and our
# callbacks (subclasses of its TrainerCallback) load accelerate and may load DeepSpeed, which reads DS_ACCELERATOR
# once, at import: main() sets it first on a host without GPUs.

log = logging.getLogger("dockyard.train")


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """`started`: when the run began, on time.perf_counter's clock (the process's start, for the module run as a
    program: its interpreter and imports are time to the first step too); by default, now."""
    try:
        return _main(argv, started)
    finally:
        logs.stop_quiet()  # rank 0's "still ..." lines end with the run


def _main(argv: list[str] | None, started: float | None) -> int:
    started = time.perf_counter() if started is None else started
    ending.begin()
    # Growable CUDA segments instead of fixed blocks: less fragmentation, the usual cause of ZeRO-2 running
    # out of memory with free memory left. Read when the allocator starts, so before any CUDA tensor.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if not torch.cuda.is_available():
        environment.quiet_toolkit_without_gpu()
        if not os.environ.get("DS_ACCELERATOR"):
            os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's own detection would look for a GPU
    checkpoints.weights_only()  # every torch.load of this run, DeepSpeed's included: weights, never code
    # DeepSpeed's ZeRO gathers with the collective torch >= 2.13 calls deprecated: every rank warned of it at its first
    # step and at every save, about a call the user cannot change
    warnings.filterwarnings("ignore", category=FutureWarning, message=r"`torch\.distributed\."
                            r"(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")  # ZeRO-3: both
    environment.quiet_libraries()  # bitsandbytes' "pip install kernels", the checkpoint rotation's mtime
    if not nodes.first_of_node():  # loading and saving weights: one progress bar per node, not per GPU
        transformers.utils.logging.disable_progress_bar()

    # before torch._dynamo is imported (by transformers, for one): its import makes the inductor cache's folder
    unusable_caches = environment.compile_cache()
    # Rank 0 alone writes the manifest, also when a run fails before torch.distributed is set up.
    run = None
    try:
        try:
            ending.interrupt_at_ctrl_c()  # Ctrl-C from here on: the clean-up below
            nodes.check_launcher_numbers()  # before anything reads them as numbers
            nodes.node_rank()  # a node rank of no number is said here, before anything would record it
            nodes.pin_interface()  # before torch.distributed starts
            opts, overrides = parse_args(sys.argv[1:] if argv is None else argv)
            opts.resume = opts.resume or ending.restarted()
            run = Run(opts, started, is_main=os.environ.get("RANK", "0") == "0",
                      world_size=int(os.environ.get("WORLD_SIZE", 1)), unusable_caches=unusable_caches)
            if nodes.several():
                run.heartbeat = nodes.Heartbeat(lambda message: ending.lost(run, message)).start()
            train(overrides, run)
        except BaseException as raised:
            return ending.failed(raised, run)
    except (DockyardError, Stopped) as e:
        # _stopped's SIGTERM (it raises once) while `failed` handled another error, before finish() took over: a
        # BrokenPipeError from a progress bar writing to the pipe of a launcher killed with its process group, whose
        # SIGTERM came during launcher_gone's wait (one such run in three to five had no manifest); torchrun's SIGTERM
        # while a collective's error from a rank that failed first was handled. The run is still recorded.
        first = ending.ours_within(e)
        if isinstance(first, KeyboardInterrupt):  # Ctrl-C's, in the moment before `failed` guarded it
            return ending.failed(first, run)
        if run:
            ending.finish(run, str(e))
        return e.exit_code
    ending.finish(run, None)
    ending.say_done(run)
    if run.heartbeat:
        run.doing("finishing")
        run.heartbeat.done()
    if dist.is_initialized():
        dist.barrier()  # every rank is done talking (and rank 0 has written the manifest)
        dist.destroy_process_group()
    return 0


@dataclass
class Prepared:
    """Everything the Trainer needs, checked and loaded."""

    recipe: Recipe
    settings: RunSettings
    args: Any                          # TrainingArguments
    model: Any
    tokenizer: Any
    examples: list[dict[str, Any]]
    eval_examples: list[dict[str, Any]]  # empty: no evaluation
    resume_from: str | None
    padding_free: bool = False         # batches packed into one row (autos.resolve_padding_free)
    shape: Any = None                  # memory.Shape, or None where the model could not be sized


# --- the steps ------------------------------------------------------------------------------------------

def in_words(recipe: Recipe, settings: RunSettings) -> str:
    """What trains, as the start-up line says it: the strategy, with LoRA and the 4-bit base where the recipe has them."""
    strategy = recipe.strategy_spec
    said = strategy.name + "".join(f", {what} offloaded" for what, on in (("optimizer", strategy.offload_optimizer),
                                                                           ("parameters", strategy.offload_param)) if on)
    if recipe.peft in ("lora", "qlora"):
        said += f" + LoRA r={settings.lora_r}" + (" on a 4-bit base" if recipe.peft == "qlora" else "")
    return said


def run_in_words(args: Any, settings: RunSettings, resolved: dict[str, dict[str, Any]], base: str = "") -> str:
    """The start-up line of what the run does, the `auto` settings as they resolved (the manifest's settings_resolved
    says why); it printed the settings as given, `auto` and the LoRA rank of a run with no adapters in them."""
    # by epochs, "1 epoch(s) of 16 examples" read as an epoch of 16 examples: the 16 are each step's
    length = (f"{args.max_steps} step{'s' * (args.max_steps != 1)} of" if args.max_steps > 0
              else f"{args.num_train_epochs:g} epoch(s) in steps of")
    precision = half_of(args) or "fp32"
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    said = [f"{length} {per_step} examples ({args.per_device_train_batch_size} per process x "
            f"{args.gradient_accumulation_steps} accumulated x {args.world_size} process(es)), "
            f"up to {settings.max_seq_length} tokens each",
            f"lr {args.learning_rate:g}", precision + (f", {base} base weights" if base else ""),
            f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}",
            f"torch_compile {'on' if args.torch_compile else 'off'}"]
    for name in ("use_liger_kernel", "padding_free", "packing", "numa_binding"):
        if (resolved.get(name) or {}).get("value") is True:
            said.append(f"{name} on")
    return " · ".join(said)


def train(overrides: dict[str, Any], run: Run) -> None:
    """Everything from a parsed command line to the saved model; `run` collects what the manifest needs."""
    prepared = prepare(overrides, run)
    try:
        trainer, metrics = fit(prepared, run)
        save_and_measure(prepared, trainer, metrics, run)
    except Exception as e:
        if isinstance(e, DockyardError) or not disk.disk_full(e, run.opts.run_dir):
            raise
        need = run.record.estimates.disk if run.record.estimates else None
        raise DockyardError(disk.full_message(e, run.opts.run_dir, need)) from None
    run.status = "completed"


def prepare(overrides: dict[str, Any], run: Run) -> Prepared:
    """The recipe and settings, the run folder, the guards, TrainingArguments, the data and the model."""
    opened = opening.open_run_folder(overrides, run)
    recipe, settings, last = opened.recipe, opened.settings, opened.last_checkpoint
    model_dir, shape = model_source(settings, recipe, run)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device = environment.device_from_torch()
    liger, liger_broken = environment.liger_kinds()
    resolved = autos.resolve(recipe, settings, opened.training, world_size=world_size, gpus_per_node=local,
                             device=device, shape=shape, kind=shape.model_type if shape else "", liger=liger,
                             liger_broken=liger_broken, model=manifest.host_path(settings.model))
    run.record.settings_resolved = resolved.record
    if recipe.strategy_spec.offloads and shape:
        # as `invoke plan` counts it, with the run's regime: ZeRO-2's weights loaded in 16 bits take half the bytes (a
        # node of 8 GPUs the plan gave zero2-offload was asked for twice that, and refused)
        _, need = memory.model_states(recipe.strategy, recipe.peft, shape, world_size, local, resolved.regime)
        guards.check_offload_memory(recipe.strategy, need, shape.params, guards.host_memory_available())
    run.record.inputs = manifest.inputs_record(opening.run_inputs(settings))  # the nodes compare them (start_processes)
    args = start_processes(recipe, settings, resolved.overrides, run, resumed_from=last,
                           load_universal=opened.reshard is not None)
    environment.weight_bars(args.disable_tqdm)  # the recipe's "no progress bars", for loading and saving weights too
    if liger_broken and device is not None and nodes.first_of_node():  # one line per node
        log.warning("%s: the run goes without Liger's kernels", liger_broken)
    if args.torch_compile and nodes.first_of_node():  # every process dropped it; one per node says so
        for why in run.unusable_caches:
            log.warning("compile cache not used: %s; this run compiles into its /tmp. The runs execute what is in "
                        "the cache: it must be a folder of the run's user that no one else can write", why)
    bound, why = cpus.bind_near_gpu(settings.numa_binding, device)  # before the model and the data loader's workers
    run.record.settings_resolved["numa_binding"] = {"value": bound, "why": why}
    what = in_words(recipe, settings)
    log.info("recipe %s%s with %d process(es), %d CPU thread(s) each%s", recipe.name,
             f" ({what})" if what != recipe.name else "", args.world_size, torch.get_num_threads(),
             f" (NUMA: {why})" if bound else "")
    # an adapter recipe's frozen base is loaded in 16 bits (model.weights_dtype), whatever the compute precision
    base = str(models.weights_dtype(settings, recipe)).removeprefix("torch.") if recipe.peft == "lora" else ""
    if settings.dtype == "auto":
        loaded_as, why = models.resolved_dtype(settings, recipe, half_of(args))
        run.record.settings_resolved["dtype"] = {"value": loaded_as, "why": why}
    log.info("%s", run_in_words(args, settings, resolved.record, base))
    if opened.reshard:
        run.doing("converting the checkpoint to DeepSpeed's universal form")
        if said := universal.ready(opened.reshard, args.process_index == 0, recipe):
            log.info("%s", said)
        run.doing("loading the data and the model")

    # the tokenizer, the data and the model's files are read alike by every process: what one refuses, all do, and
    # the node's first says it (a bad row was said once per process, a line per GPU); a process's own failure among
    # them (its memory) is said by itself, SAY_ONCE_S later
    run.same_everywhere = True
    tokenizer = models.load_tokenizer(model_dir)
    loaded = data.load(settings, tokenizer, args.seed, lambda fmt: autos.resolve_packing(
        settings.packing, fmt, settings.task, device, settings.padding_free))
    run.record.data = loaded.info
    check_batch_within_data(args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size,
                            len(loaded.train), loaded.packing[0], world_size)
    if shape:
        run.record.estimates = estimates(shape, recipe, settings, args, local, resolved.regime)

    transformers.set_seed(args.seed)
    model = load_model(model_dir, recipe, settings, tokenizer, loaded.labels, args, run.record.model)
    models.check_examples_fit(model, loaded.train + loaded.eval, model_dir, tokenizer.pad_token_id)
    run.same_everywhere = False
    packed, why = autos.resolve_padding_free(settings.padding_free, loaded.info["format"], settings.task, device,
                                             getattr(model.config, "_attn_implementation", "") or "",
                                             args.per_device_train_batch_size, settings.max_seq_length)
    run.record.settings_resolved["padding_free"] = {"value": packed, "why": why}
    joined, joined_why = loaded.packing
    run.record.settings_resolved["packing"] = {"value": joined, "why": joined_why}
    return Prepared(recipe, settings, args, model, tokenizer, loaded.train, loaded.eval, last, packed, shape)


def kept_for_resume(run: Run) -> dict[str, Any]:
    """The run's settings as a later --resume takes them again: those given after `--`, and the global batch it
    trains over (`auto`: 8 examples per process). A resume on another number of processes (a node short of a GPU,
    `--nproc`) trained over another batch, said nowhere, and skipped batches of that size to find its place."""
    kept = dict(run.overrides)
    resolved = (run.record.settings_resolved or {}).get("global_batch", {}).get("value")
    if "global_batch" not in kept and isinstance(resolved, int) and not isinstance(resolved, bool):
        kept["global_batch"] = resolved
    return kept


def began(run: Run, p: Prepared) -> None:
    """This attempt's first step starts (callbacks.FirstStep): from here the run folder's manifest is its own."""
    run.training = True
    if run.is_main:  # the lines of steps that run again go: all of them from the start (a run killed before its
        # first checkpoint leaves metrics.jsonl and no manifest, and the folder may be used again)
        manifest.trim_metrics(run.opts.run_dir, runfolder.checkpoint_step(p.resume_from) if p.resume_from else 0)
        runfolder.save_overrides(run.opts.run_dir, kept_for_resume(run))  # what a later --resume trains with again
    if run.manifest_found and nodes.first_of_node():
        # the folder's manifest is the attempt's before ("completed", say, beside its model/): from here it would say
        # so of a run this attempt changes, were this process killed (out of memory, SIGKILL) before it records how it
        # ended; finish() replaces it
        step = runfolder.checkpoint_step(p.resume_from) if p.resume_from else 0
        said = (f"resumed from step {step}, {ending.UNRECORDED} (killed: out of memory, or SIGKILL?); "
                "--resume continues it from its last complete checkpoint")
        record = manifest.build(run.opts.run_dir, run.recipe, "failed", run.world_size, None, {},
                                {**run.record.to_json(), "error": said})
        with contextlib.suppress(OSError):  # a full disk: the run's own end says it
            manifest.write(run.opts.run_dir, record, runfolder.manifest_file(nodes.node_rank()))


def model_source(settings: RunSettings, recipe: Recipe, run: Run) -> tuple[str, Any]:
    """The model folder (the tiny model made in the run folder when none is given) and its shape (memory.Shape,
    None when it cannot be sized); the model's part of the record."""
    model_dir = models.resolve_model(settings.model) if settings.model else ""
    if not model_dir:
        model_dir = str(run.opts.run_dir / "base")
        models.materialize_tiny_model(Path(model_dir))
    shape = model_shape(Path(model_dir), run)
    run.record.model = ModelRecord(base=model_dir, parameters=shape.params if shape else None,
                                   format="adapter" if recipe.peft else "full")
    run.record.task = settings.task
    return model_dir, shape


def model_shape(model_dir: Path, run: Run) -> Any:
    """The model's size from its config, built on the meta device (nothing loaded), or None when that cannot
    be done: the offload RAM check and the manifest's estimate are then skipped, and the run goes on.
    Called before TrainingArguments exist: once they hold a ZeRO-3 config, building any model (even on
    meta) goes through deepspeed.zero.Init."""
    try:
        return models.model_shape(model_dir)
    except DockyardError:
        raise  # no config.json: the model folder is wrong, say so now
    except Exception as e:  # noqa: BLE001 - see the docstring
        run.record.sizing_error = f"cannot size the model: {type(e).__name__}: {e}"
        return None


def start_processes(recipe: Recipe, settings: RunSettings, overrides: dict[str, Any], run: Run,
                    resumed_from: str | None, load_universal: bool) -> Any:
    """TrainingArguments, which form the process group; then the logs, and the checks that need every process.
    `load_universal`: DeepSpeed loads the checkpoint in its universal form (dockyard.train.universal)."""
    run.doing("setting up the process group")
    # every process, before any forms the group, in which DeepSpeed loads its ops (cpu_adam once the Trainer makes an
    # offloaded optimizer; shm_comm on the CPU only as built into the image): a lock a killed build of one left would
    # hang the run without a word
    removed, kept = environment.build_locks(loads=recipe.deepspeed_ops())
    args = arguments.training_arguments(recipe, settings, overrides, run.opts.run_dir, load_universal)
    run.same_everywhere = False  # from here a process may fail on its own (its GPU, its shard, its data)
    run.world_size, run.is_main = args.world_size, args.process_index == 0  # what torch.distributed formed
    logs.setup_logging(run.opts.run_dir, run.is_main, lambda: run.phase)
    for line in removed + (kept if nodes.first_of_node() else []):  # a removal by the process that removed it
        log.warning("%s", line)
    if nodes.first_of_node():  # once per node (every process said them)
        if ending.restarted():
            log.warning(f"torchrun restarted the workers (restart {ending.restarts()}): the "
                        "run " + (f"continues from {Path(resumed_from).name}" if resumed_from else "starts again (it "
                                  "failed before its first complete checkpoint)"))
        elif run.opts.resume and not resumed_from:
            log.warning("--resume: the run failed before its first complete checkpoint; training from the start")
    if run.kept_overrides and not ending.restarted():
        log.info("--resume: with the run's own settings %s (give any after `--` to change it)",
                 ", ".join(f"{k} {v}" for k, v in run.kept_overrides.items()))
    guards.one_process_per_gpu(args.n_gpu)
    if nodes.several():
        _ = args.device  # NCCL's collectives need this rank's GPU chosen
        run.doing("checking that the run folder is shared")
        started_with = nodes.started_with(recipe, run.opts.resume, overrides, run.record.recipe_files,
                                          run.record.inputs)
        run.record.nodes_seen = nodes.check_shared(run.opts.run_dir, started_with)
    run.doing("loading the data and the model")
    return args


def estimates(shape: Any, recipe: Recipe, settings: RunSettings, args: Any, gpus_per_node: int,
              regime: Any) -> Estimates:
    """The estimates' part of the record (each an error where it cannot be made)."""
    return Estimates(predicted(shape, recipe, settings, args, gpus_per_node, regime),
                     disk_needed(shape, recipe, settings, args))


def predicted(shape: Any, recipe: Recipe, settings: RunSettings, args: Any, gpus_per_node: int,
              regime: Any) -> dict[str, Any]:
    """`invoke plan`'s estimate for this run, next to the measured peak in the manifest. Only a record:
    an estimate that cannot be made never fails the run."""
    try:
        return memory.estimate(shape, recipe, world_size=args.world_size, gpus_per_node=gpus_per_node,
                               seq_len=settings.max_seq_length, batch=args.per_device_train_batch_size,
                               gradient_checkpointing=args.gradient_checkpointing, regime=regime)
    except Exception as e:  # noqa: BLE001 - see the docstring
        return {"error": f"{type(e).__name__}: {e}"}


def disk_needed(shape: Any, recipe: Recipe, settings: RunSettings, args: Any) -> dict[str, Any]:
    """What the run writes (dockyard.common.disk): said again if a save runs out of space. Only a record."""
    try:
        return disk.run_bytes(shape, strategy=recipe.strategy, peft=recipe.peft, dtype=settings.dtype,
                              half_on_gpu=bool(args.bf16 or args.fp16), optimizer=not args.save_only_model,
                              max_steps=args.max_steps, save_steps=args.save_steps,
                              save_strategy=str(args.save_strategy), save_total_limit=args.save_total_limit,
                              lora_r=settings.lora_r)
    except Exception as e:  # noqa: BLE001 - see the docstring
        return {"error": f"{type(e).__name__}: {e}"}


def load_model(model_dir: str, recipe: Recipe, settings: RunSettings, tokenizer: Any, labels: Any, args: Any,
               record: ModelRecord) -> Any:
    """The model as the recipe trains it (precision, quantisation, adapters); what was loaded goes in its record."""
    model = models.load_model(model_dir, recipe, settings, tokenizer, labels, args.local_process_index, half_of(args))
    record.footprint_bytes = footprint(model)  # the base's weights as loaded
    if recipe.peft == "qlora":
        record.quantized_layers = models.count_4bit_layers(model)
    if recipe.peft:
        model = models.add_lora(model, recipe, settings, args.gradient_checkpointing)
    if recipe.peft == "qlora" and settings.qlora_lean:  # the base's 4-bit layers are still there, inside peft's
        fourbit.plain_scales(model)
        fourbit.lean_adapters(model)
    return model


def footprint(model: Any) -> int:
    """The bytes of the model's weights and buffers as loaded, whole: under ZeRO-3 each parameter is a placeholder of
    its shard (get_memory_footprint said 64 bytes for 164,160 parameters), its full size in ds_numel."""
    if not any(hasattr(p, "ds_numel") for p in model.parameters()):
        return int(model.get_memory_footprint())
    weights = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters())
    return int(weights + sum(b.numel() * b.element_size() for b in model.buffers()))


def fit(p: Prepared, run: Run) -> tuple[Any, Any]:
    """The HF Trainer, with the strategy check and the metrics log, trained to the end."""
    from transformers import Trainer  # lazy, as TrainingArguments: see the note on the imports
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from dockyard.train.callbacks import (
        FirstStep,
        MetricsLog,
        PublishCheckpoint,
        ResumedRate,
        ScheduleCheck,
        StrategyCheck,
        TokenCount,
    )
    from dockyard.train.profiler import StepProfiler

    class CountingTrainer(Trainer):
        """The HF Trainer, counting the tokens of each step's batches as it takes them (not as the loader makes them:
        it makes the next step's ahead)."""

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
            tokens.add(batches)
            return batches, items

    run.doing("setting up the Trainer and its engine")
    check = StrategyCheck(p.recipe.strategy, run.world_size)
    tokens = TokenCount()
    metrics = MetricsLog(run.opts.run_dir / METRICS, run.is_main, run.started, tokens, *flops_and_peak(p),
                         profiled=p.settings.profiled)
    as_host = (lambda base: base_for_host(p.settings, base)) if p.recipe.peft else None  # a checkpoint's adapter
    profile = ([StepProfiler(run.opts.run_dir, p.settings.profiled, p.args.process_index, run.world_size)]
               if p.settings.profiled else [])
    try:
        # publish first: saves are timed to the end; the profiler before the metrics: what it writes once the last
        # profiled step ends falls in a window the steady state leaves out
        trainer = CountingTrainer(model=p.model, args=p.args, train_dataset=p.examples,
                                  eval_dataset=p.eval_examples or None, processing_class=p.tokenizer,
                                  data_collator=(collate_packed() if p.padding_free else collate(p.tokenizer.pad_token_id)),
                                  callbacks=[FirstStep(lambda: began(run, p)), check, ScheduleCheck(), ResumedRate(),
                                             PublishCheckpoint(as_host), *profile, metrics])
    except ValueError as e:  # the Trainer's own check of its arguments together (TrainingArguments checked each)
        raise DockyardError(f"invalid training settings: {' '.join(str(e).split())}") from None
    for cb in (PrinterCallback, ProgressCallback):  # metrics.jsonl and train.log carry the losses
        trainer.remove_callback(cb)
    check.trainer = trainer
    run.check = check
    run.log = metrics
    run.doing("training (or saving a checkpoint)")
    if p.recipe.strategy_spec.offload_optimizer:
        logs.cpu_adam_to_train_log()  # its C++ "Adam Optimizer #0 is created with ..." lines
    if p.recipe.strategy_spec.offload_optimizer and nodes.first_of_node() and (folder := environment.cpu_adam_to_compile()):
        kept = os.environ.get(envvars.OPS_CACHE)  # the compile cache's (environment.compile_cache)
        log.warning("DeepSpeed compiles its cpu_adam op for the offloaded optimizer now: minutes without output%s",
                    f", once: the next runs load it from the compile cache ({folder})" if kept else f" (into {folder})")
    try:
        with models.adapter_inputs_as_given(p.model, p.recipe, p.args):
            trainer.train(resume_from_checkpoint=p.resume_from)
    except pickle.UnpicklingError as e:  # torch.load refused a file that is not weights (checkpoints.weights_only)
        raise checkpoints.explain(e) from None
    except torch.OutOfMemoryError as e:
        raise trainer_errors.out_of_memory(e, p.args, p.settings) from None
    except ImportError as e:  # a package a setting needs that this image lacks (guards.check_optim asks most before)
        if run.training:
            raise
        raise trainer_errors.before_the_first_step(e, p.recipe, run.overrides) from e
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError) as e:  # not RuntimeError:
        # NCCL, CUDA, ...; ArithmeticError: a schedule that divides by a setting of 0 as it is made (inverse_sqrt's
        # timescale)
        if run.training:
            raise
        if p.resume_from and not trainer_errors.made_from_the_settings(e):
            # the Trainer's own traceback from a checkpoint file that loads as weights but is not what it wrote (a
            # trainer_state.json of other keys, an optimizer.pt of no param_groups, an rng state of other shapes)
            earlier = [c for c in runfolder.checkpoints_started(run.opts.run_dir)
                       if c.name != Path(p.resume_from).name]
            fix = f"remove it to resume from {earlier[-1].name}" if earlier else "start a new run (another --run-id)"
            raise DockyardError(f"cannot resume from {Path(p.resume_from).name}: it is not a checkpoint the Trainer "
                                f"wrote for this run ({type(e).__name__}: {first_line(e, 200)}): {fix}") from None
        raise trainer_errors.before_the_first_step(e, p.recipe, run.overrides) from e
    finally:
        if profile and profile[0].record:
            run.record.profile = profile[0].record
    return trainer, metrics


def flops_and_peak(p: Prepared) -> tuple[float | None, float | None]:
    """FLOPs per trained token and one GPU's dense peak in the dtype this run computes in (dockyard.train.mfu), for
    MFU; (None, None) on CPU, in fp32, on a GPU not in the table or for a model that could not be sized."""
    args = p.args
    # the mixed precision's dtype, or else the weights' own (a bf16 LoRA base with --bf16 false computes in bf16)
    weights = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(getattr(p.model, "dtype", None), "")
    half = half_of(args) or weights
    if not (torch.cuda.is_available() and half and p.shape and p.shape.layers and p.shape.hidden):
        return None, None
    peak = mfu.peak_flops(torch.cuda.get_device_name(args.local_process_index), half)
    config = getattr(p.model, "config", None)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    params = p.shape.params  # sized as a causal LM (models.model_shape): its output head multiplies every token
    if p.settings.task == "seq_cls":  # a classifier has no vocab × hidden head (its hidden × labels one is negligible)
        params -= 0 if tied else p.shape.vocab * p.shape.hidden
        tied = False  # no head multiplies by the embedding: it is a lookup only
    # LoRA, QLoRA: the adapters (and a classifier's head) are what trains, each weight through all three matmuls
    trained = (sum(getattr(w, "ds_numel", w.numel()) for w in p.model.parameters() if w.requires_grad)
               if p.recipe.peft else 0)  # ds_numel: a ZeRO-3 placeholder's full size
    flops = mfu.flops_per_token(parameters=params, vocab=p.shape.vocab, hidden=p.shape.hidden,
                                attention_width=p.shape.q_width, layers=p.shape.layers, tied=tied,
                                adapters=bool(p.recipe.peft), adapter_params=trained,
                                seq_len=mfu.attention_length([len(ex["input_ids"]) for ex in p.examples]))
    return flops, peak


def save_and_measure(p: Prepared, trainer: Any, metrics: Any, run: Run) -> None:
    """The reference logits, the saved model, and the run's figures (peak memory, throughput) over all ranks."""
    from dockyard.train.callbacks import over_ranks  # lazy: see the note on the imports

    args = p.args
    compiled = strategy.compile_cache_use()  # training's graphs (the reference logits below may compile more)
    run.doing("saving the model")
    run.record.reference_logits = reference_logits(trainer.model, p.examples[0]["input_ids"][:PROBE_TOKENS], args.device,
                                                   models.weights_dtype(p.settings, p.recipe, half_of(args)))
    saving = time.perf_counter()
    trainer.save_model(str(run.opts.run_dir / runfolder.MODEL))
    if p.recipe.peft and args.should_save:  # the process that saved it
        model_config.rename_base(run.opts.run_dir / runfolder.MODEL, lambda base: base_for_host(p.settings, base))
    runfolder.share_weights(run.opts.run_dir / runfolder.MODEL)  # every rank, as each may have written: a chmod is idempotent
    final_save = time.perf_counter() - saving  # after training: never taken out of its time (metrics.seconds)
    trained, (peak, peak_rank) = over_ranks(metrics.tokens_trained, manifest.peak_memory_bytes(), run.world_size,
                                            args.device)
    # The steady state: logging windows after warm-up, saves and evaluation left out (callbacks.MetricsLog);
    # with nothing logged, the whole run less saves and evaluation.
    steady = metrics.steady_state() or {
        "tokens": trained, "seconds": round(metrics.seconds, 4), "warm_up_left_out": False,
        "tokens_per_second": round(trained / metrics.seconds, 2) if metrics.seconds > 0 else 0.0, "mfu": None}
    run.metrics = {"steps": trainer.state.global_step,
                   "tokens_per_second": steady["tokens_per_second"],
                   "mfu": steady["mfu"],
                   "seconds_to_first_step": metrics.seconds_to_first_step,
                   "seconds_saving": round(metrics.seconds_saving + final_save, 3),
                   "seconds_evaluating": round(metrics.seconds_evaluating, 3),
                   "compile_cache": compiled,
                   "steady_state": steady,
                   "peak_memory_bytes": peak, "peak_memory_kind": manifest.peak_memory_kind(),
                   "peak_memory_rank": peak_rank}


def base_for_host(settings: RunSettings, base: str) -> str:
    """The base an adapter names (peft writes the path this process loaded it from) as the user has it: a hub model
    by its id (the cache's snapshot folder inside the image is no path of theirs), a folder by its path on the host
    (/workspace/inputs/model, /workspace/runs/ID/base are the container's: AutoPeftModel on the host found nothing
    there); a native run's path is the host's already."""
    if settings.model and not Path(settings.model).is_dir():
        return settings.model
    return on_host(base)


def reference_logits(model: Any, input_ids: list[int], device: Any, dtype: Any) -> dict[str, Any]:
    """Logits of one fixed input at the end of training (the manifest's `probe`), so anyone can check that the saved
    model, reloaded, is the model that was trained (ZeRO-3 used to save empty weights). All ranks take part: under
    ZeRO-3 and FSDP the forward pass gathers the sharded weights."""
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([input_ids], device=device)).logits.float()
    last = out[0, -1] if out.dim() == 3 else out[0]
    return {"input_ids": input_ids, "logits": [round(x, 5) for x in last[:16].tolist()],
            "dtype": str(dtype).removeprefix("torch.")}  # the dtype to reload the weights in


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    head, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m dockyard.train", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, help="a recipe name (recipes/<name>/) or a recipe folder")
    parser.add_argument("--run-dir", required=True, help="where the run writes everything")
    parser.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    opts, extra = parser.parse_known_args(head)
    opts.run_dir_given, opts.run_dir = opts.run_dir, Path(opts.run_dir)  # "" is a Path of "." (the folder it ran in)
    return opts, parse_overrides(extra + rest)


if __name__ == "__main__":
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker of torchrun's agent, which started this module
        environment.die_with_launcher(LAUNCHER)
    # the process's start, not main()'s: importing torch, transformers and DeepSpeed takes seconds of the first step's
    ending.leave(main(started=time.perf_counter() - environment.seconds_since_start()))
