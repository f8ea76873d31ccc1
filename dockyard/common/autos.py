"""The settings that may be `auto` (recipes/defaults.yaml): what each becomes on the GPU at hand, and why.

    per_device_train_batch_size, gradient_accumulation_steps, gradient_checkpointing: the largest micro-batch
        the plan's memory model says fits this GPU with its margin (dockyard.common.memory), checkpointing only
        where no micro-batch dividing the examples per process fits without it, accumulation making up
        `global_batch`;
    torch_compile: on for ddp, zero2, lora and qlora (where its gain was measured on a GPU) when the run is long
        enough to repay the compilation, over what Liger's kernels save where they would go on instead, and
        checkpointing stays off (decided once checkpointing is);
    use_liger_kernel: on wherever its kernels apply and the run is not compiled: measured faster (ddp and fsdp of a
        1.1B Llama, 1.31x on an H200) and lighter (its fused loss never holds the fp32 logits, and under fp32 weights
        its norms and MLP keep less);
    padding_free: examples packed into one row (position ids restarting per example) for instruction and chat data;
    packing: text documents joined end to end and cut into blocks of max_seq_length tokens;
    numa_binding: each process on the cores of its GPU's NUMA node, where the run's GPUs hang off every one.

On CPU every auto is what the project did before: micro-batch 8, no accumulation, checkpointing for the adapter
recipes only, no compilation, no Liger, padded batches, one example per text document, no CPU binding. What each
became is written into the manifest (`settings_resolved`, with the reason); any of them can be set instead (recipe
file or `-- --key value`).
Plain, torch-free functions over plain data, so that what the trainer runs and what `invoke plan` says are one
rule: the trainer passes the GPU it sees (dockyard.train.environment), the plan the GPU it plans for, tests recorded
hosts.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dockyard.common import memory, precision
from dockyard.common.batch import LIGER_AND_COMPILE, PER_PROCESS, auto_switch, batch_split, check_autos
from dockyard.common.errors import DockyardError, short
from dockyard.common.recipes import Recipe
from dockyard.common.training_args import AUTO, AUTO_TRAINING_ARGUMENTS
from dockyard.common.units import GIB

SET = "set"                    # the why of a setting given in a recipe or on the command line, not resolved
# torch.compile pays when the time it saves exceeds the time it takes. The step time the saving is taken from is an
# H100's uncompiled rate for the 944M benchmark model (48.5k tokens/s × 6.38 GFLOP per token); a slower GPU takes
# longer per step, so compilation pays sooner there: the rule errs towards leaving it off.
UNCOMPILED_FLOPS = 3.1e14
COMPILE_MIN_CAPABILITY = (7, 0)  # triton's kernels need Volta or newer
# The auto compiles only without checkpointing; where checkpointing goes on, compiling goes off (and the micro-batch
# is sized uncompiled: COMPILED was calibrated without checkpointing).
COMPILE_CHECKPOINTED = "gradient checkpointing is on: compiling recomputed layers is not measured here"
# Liger's kernels cover these model types (liger_kernel.transformers' table: the trainer reads the installed
# package's own; `invoke plan`, on a host without it, this list).
LIGER_TYPES = ("llama", "mistral", "mixtral", "gemma", "gemma2", "gemma3", "qwen2", "qwen3", "phi3", "granite",
               "olmo2", "glm4")
LIGER_ABSENT = "liger-kernel is not installed in this environment"
LIGER_ON_CPU = ("use_liger_kernel true: Liger's kernels are Triton's, for GPUs only, and this run trains on CPU; set "
                "it to auto or false")
PADDING_FREE_FORMATS = ("prompt_completion", "messages", "alpaca", "sharegpt")
# With SDPA, transformers masks a packed row block-diagonally (exact) but still computes attention over the whole
# row: worth it only while the row is short next to the linear layers' work.
PACKED_SDPA_MAX_TOKENS = 4096
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


class DoesNotFit(DockyardError):
    """No micro-batch fits the GPU by the memory model: the trainer stops with it, `invoke plan` says "no"."""


@dataclass(frozen=True)
class CompileGain:
    """What compiling block by block costs and saves for one kind of recipe on the 944M model (22 layers,
    micro-batch 8, seq 2048; benchmarks/results/recipes_gpu.md): the compile time before the first step, per layer,
    and the share of each step's time it saves. Measured for zero2 and ddp; for lora taken from zero2 and its
    whole-model run (below). Where two figures exist, the smaller saving and the longer compile are kept."""

    seconds_per_layer: float
    saving: float


# Every recipe compiles block by block (accelerate's regional compilation): one block compiled serves every layer.
# ZeRO-2, measured: H200 54.4k -> 71.3k tokens/s (saves 24 %), 7 s more before the first step (19 s against 12 s).
BLOCKS_ZERO2 = CompileGain(0.5, 0.24)
# ddp, block by block, measured (2026-12-04): H200 47.4k -> 69.2k tokens/s on the 1.1B model (saves 31 % of each
# step), 9 s more before the first step (21 s against 12 s; 0.42 s a layer). Where Liger's kernels would go on
# instead (they save 24 %), compiling pays only by what it saves beyond them: 9 % of Liger's step.
BLOCKS_DDP = CompileGain(0.5, 0.31)
# lora: zero2's compile time and saving; its whole model compiled saved 28 % (H200 51.5k -> 71.9k, 68 s). Its own
# block-by-block speed is not measured on a GPU yet (`sh benchmarks/gpu_check.sh bench lora` does).
BLOCKS_LORA = CompileGain(0.5, 0.24)
# qlora, block by block, measured side by side (2026-12-04, H200, the 1.1B model): 57.7k tokens/s with Liger's
# kernels (which save qlora nothing: LIGER_MEASURED) -> 74.0k compiled, saving 22 % of each step; 14 s more before
# the first step (37 s against 23), and the ~3 s Liger's kernels take to build: 0.75 s a layer.
BLOCKS_QLORA = CompileGain(0.75, 0.22)


# Liger's kernels (RMSNorm, SwiGLU, RoPE and the loss without fp32 logits), measured on one H200 (2026-12-04, the
# 1.1B model at micro-batch 8, seq 2048; benchmarks/results/recipes_gpu.md): tokens/s without and with them. ddp,
# fsdp and qlora side by side; zero2 and lora a lease apart. Triton builds the kernels once per process, ~3 s before
# the first step, which the compile rule leaves out. Every peak fell 13-16 GiB.
LIGER_MEASURED = {"ddp": (47_388, 62_281), "zero2": (47_418, 54_263), "lora": (53_578, 68_577),
                  "qlora": (47_667, 47_178), "fsdp": (48_622, 63_930)}
# Savings measured a run apart, on a shared machine, are not told apart closer than this
SAVINGS_APART = 0.02


def liger_saving(recipe: Recipe) -> tuple[float, str]:
    """The share of each step Liger's kernels save for this recipe (0 where not measured, or where they save none),
    and what was measured, in words."""
    kind = recipe.peft or recipe.strategy_spec.name
    if kind not in LIGER_MEASURED:
        without, with_ = LIGER_MEASURED["ddp"]
        return 0.0, f"measured for ddp of a 1.1B Llama ({with_ / without:.2f}x as fast on an H200), not yet for {kind}"
    without, with_ = LIGER_MEASURED[kind]
    speed = (f"{with_ / without:.2f}x as fast" if with_ > without * (1 + SAVINGS_APART)
             else "no slower" if with_ > without * (1 - SAVINGS_APART) else f"{with_ / without:.2f}x the speed")
    return max(0.0, 1 - without / with_), f"{kind} of a 1.1B Llama measured {speed} with them on an H200"


def compile_gain(recipe: Recipe) -> CompileGain | str:
    """The gain of compiling this recipe, or why compiling is not turned on by itself for it."""
    spec = recipe.strategy_spec
    if recipe.peft == "lora" and spec.engine == "ddp":
        return BLOCKS_LORA
    if recipe.peft == "qlora" and spec.engine == "ddp":
        return BLOCKS_QLORA
    if recipe.peft:
        return (f"{recipe.peft} trains compiled (block by block), but its speed on a GPU is not measured "
                "yet: set torch_compile true to try it")
    if spec.engine == "ddp":
        return BLOCKS_DDP
    if spec.engine == "deepspeed" and spec.zero_stage == 2 and not spec.offloads:
        return BLOCKS_ZERO2
    how = "trains compiled block by block (tests/gpu)" if spec.engine == "fsdp" else "compiles block by block as zero2 does"
    return (f"{spec.name} {how}, but its speed on a GPU is not measured yet"
            + (" (its optimizer step runs on the CPU, which compiling does not touch)" if spec.offloads else "")
            + ": set torch_compile true to try it")


@dataclass(frozen=True)
class Device:
    """The GPU the run plans for: the smallest of this node's."""

    name: str
    memory_bytes: int
    capability: tuple[int, int]


def device_from_host(host: Any) -> Device | None:
    """From what NVML says on the host (a dockyard.gpus.Host, read there: the trainer imports no host module): the
    GPU with the least memory, or None without GPUs."""
    if not host.gpus:
        return None
    g = min(host.gpus, key=lambda g: g.memory_bytes)
    major, _, minor = (g.capability or "0.0").partition(".")
    return Device(g.name, g.memory_bytes, (int(major or 0), int(minor or 0)))


@dataclass
class Resolved:
    overrides: dict[str, Any]                  # TrainingArguments values with every auto replaced
    record: dict[str, dict[str, Any]] = field(default_factory=dict)  # manifest's settings_resolved
    regime: memory.Regime = memory.Regime()        # what the plan needs to know about the run

    def note(self, key: str, value: Any, why: str) -> None:
        self.record[key] = {"value": value, "why": why}

    def said(self) -> str:
        """The autos in a few words (`micro-batch 8 × accumulation 1, gradient checkpointing off, ...`), "" where
        none was resolved."""
        words = {"per_device_train_batch_size": "micro-batch", "gradient_accumulation_steps": "accumulation",
                 "gradient_checkpointing": "gradient checkpointing", "use_liger_kernel": "Liger's kernels",
                 "torch_compile": "torch_compile"}
        return ", ".join(f"{word} {({True: 'on', False: 'off'}.get(v, v) if isinstance(v, bool) else v)}"
                         for key, word in words.items() if key in self.record
                         for v in [self.record[key]["value"]])


def computes_in_half(device: Device | None, overrides: dict[str, Any]) -> bool:
    """Whether the run trains in 16-bit mixed precision, as the trainer will decide (by the GPU's capability and
    the run's bf16/fp16)."""
    return bool(precision.in_half(device.capability if device else None, overrides))


# --- the training settings (before TrainingArguments) --------------------------------------------------

def resolve(recipe: Recipe, settings: Any, overrides: dict[str, Any], *, world_size: int, gpus_per_node: int,
            device: Device | None, shape: memory.Shape | None, kind: str, liger: tuple[str, ...],
            liger_broken: str = "", model: str = "") -> Resolved:
    """Every training auto: batch sizes, checkpointing, compilation, Liger. `kind` is the model_type,
    `liger` the model types liger-kernel has kernels for where the run trains (empty: not installed; the trainer
    asks the installed package, `invoke plan` takes LIGER_TYPES: the CUDA images pin it). `model`: the model as the
    host names it, for the `invoke plan` a refusal offers."""
    out = Resolved({**overrides})
    micro, accum = check_autos(overrides, recipe)  # as the host checked them (dockyard.launch.preflight)
    batch = batch_split(settings.global_batch, micro, accum, world_size)
    gc = auto_switch(overrides.get("gradient_checkpointing", AUTO), "gradient_checkpointing")
    compile_ = auto_switch(overrides.get("torch_compile", AUTO), "torch_compile")
    use_liger = auto_switch(overrides.get("use_liger_kernel", AUTO), "use_liger_kernel")

    per_rank = batch.per_process
    if settings.global_batch == AUTO:
        out.note("global_batch", batch.global_batch, f"{per_rank} examples per process per step"
                 + (" (the default micro-batch)" if micro == AUTO and accum == AUTO else "")
                 + f" × {world_size} process(es)")
    def liger_ok(compiling: bool) -> bool:  # Liger may go on by itself
        return use_liger == AUTO and _liger_applies(recipe, settings, device, kind, liger, compiling)

    # Liger goes on where the run is not compiled: compiling must pay over what its kernels save
    pays = _compile(out, compile_, recipe, device, shape, per_rank, settings.max_seq_length,
                    overrides.get("max_steps"), gc, liger_set=use_liger is True,
                    liger_saving=liger_saving(recipe)[0] if liger_ok(False) else 0.0)
    absent = liger_broken or LIGER_ABSENT
    if use_liger is True and not liger:
        raise DockyardError(f"use_liger_kernel true needs liger-kernel: {absent} (the CUDA images pin it); set it to "
                            "auto or false")
    if use_liger is True and device is None:
        raise DockyardError(LIGER_ON_CPU)
    if use_liger is True and kind and kind not in liger:  # liger-kernel skips the model, saying so only at info level
        raise DockyardError(liger_uncovered(kind, liger))
    if use_liger is True and pays:
        raise DockyardError(LIGER_AND_COMPILE)

    def compiled(ckpt: bool) -> bool:  # the auto compiles only without checkpointing (COMPILE_CHECKPOINTED)
        return pays and (compile_ is True or not ckpt)

    # what sizes the run besides the autos: the adapters' rank and dropout, the base's dtype
    regime = memory.Regime(float(settings.lora_dropout), lora_r=settings.lora_r, dtype=settings.dtype,
                           logits=settings.task == "causal_lm", half=computes_in_half(device, overrides))
    given = batch.given_micro
    if device is None or shape is None:
        m = given or _cpu_micro(per_rank)
        gc_on = gc if gc != AUTO else bool(recipe.peft)
        lig = use_liger is True
        cpu = device is None
        if micro == AUTO and accum == AUTO:
            out.note("per_device_train_batch_size", m, ("CPU: " if cpu else "the model could not be sized, so as on "
                     "CPU: ") + (f"{m}, the default" if m == PER_PROCESS else f"{m}, the largest divisor of the "
                     f"{per_rank} examples per process up to {PER_PROCESS}, the default"))
        if gc == AUTO:
            out.note("gradient_checkpointing", gc_on, "CPU: on for the adapter recipes, off for full fine-"
                     "tuning" if cpu else "the model could not be sized: as on CPU")
        on = compiled(gc_on)
        if use_liger == AUTO:
            out.note("use_liger_kernel", False, _liger_off_reason(recipe, settings, device, kind, liger, on, absent)
                     or "the model could not be sized: off, as on CPU")
    else:
        m, gc_on, lig = _fit(out, recipe, shape, device, world_size, gpus_per_node, settings.max_seq_length,
                             per_rank, given, gc, use_liger, liger_ok, compiled, regime,
                             global_auto=settings.global_batch == AUTO, plan=plan_command(model, settings.max_seq_length))
        on = compiled(gc_on)
        if on != pays:
            out.note("torch_compile", False, COMPILE_CHECKPOINTED)
        if use_liger == AUTO and not liger_ok(on):
            out.note("use_liger_kernel", False, _liger_off_reason(recipe, settings, device, kind, liger, on, absent))
    a = per_rank // m
    if micro == AUTO and accum != AUTO:
        out.note("per_device_train_batch_size", m, f"global_batch {batch.global_batch} / (gradient_accumulation_steps "
                 f"{accum} × {world_size} process(es))")
    if accum == AUTO:
        out.note("gradient_accumulation_steps", a, f"global_batch {batch.global_batch} / ({m} per micro-batch × "
                 f"{world_size} process(es))")
    out.overrides.update(per_device_train_batch_size=m, gradient_accumulation_steps=a,
                         gradient_checkpointing=bool(gc_on), torch_compile=on, use_liger_kernel=bool(lig))
    for key, value in (("global_batch", batch.global_batch), *((k, out.overrides[k]) for k in AUTO_TRAINING_ARGUMENTS)):
        out.record.setdefault(key, {"value": value, "why": SET})
    out.regime = replace(regime, compiled=on, liger=bool(lig), accumulation=a)
    return out


def _cpu_micro(per_rank: int) -> int:
    return max(d for d in range(1, min(per_rank, PER_PROCESS) + 1) if per_rank % d == 0)


def _compile(out: Resolved, value: bool | str, recipe: Recipe, device: Device | None, shape: memory.Shape | None,
             per_rank: int, seq_len: int, max_steps: Any, gc: bool | str, liger_set: bool = False,
             liger_saving: float = 0.0) -> bool:
    """Whether the run compiles; `liger_saving`: the share of each step Liger's kernels save where they go on
    instead (0 where they would not), which compiling must better."""
    if value != AUTO:
        return bool(value)
    why = ""
    gain = compile_gain(recipe)
    if device is None:
        why = "CPU: off (compiling pays on GPUs)"
    elif liger_set:
        why = "use_liger_kernel is set true, and Liger's kernels fail under torch.compile (or give a wrong loss)"
    elif isinstance(gain, str):
        why = gain
    elif device.capability < COMPILE_MIN_CAPABILITY:
        why = f"{device.name} (compute {device.capability[0]}.{device.capability[1]}) is older than triton supports"
    elif gc is True:
        why = COMPILE_CHECKPOINTED
    elif shape is None:
        why = "the model could not be sized"
    elif liger_saving and gain.saving < liger_saving + SAVINGS_APART:
        why = (f"Liger's kernels go on instead: they save about as much of each step ({liger_saving:.0%}) as compiling "
               f"({gain.saving:.0%}), with no compiling first")
    elif not isinstance(max_steps, int) or max_steps <= 0:
        why = "the run's length is in epochs: its steps are not known before the data loads; set it for a long run"
    else:
        cost = gain.seconds_per_layer * shape.layers
        step = per_rank * seq_len * 6 * shape.params / UNCOMPILED_FLOPS * (1 - liger_saving)
        saving = 1 - (1 - gain.saving) / (1 - liger_saving)  # of the step it would run instead
        saved = max_steps * step * saving
        on = saved >= cost
        out.note("torch_compile", on, f"{max_steps} steps of about {step:.2f} s"
                 + (" (with Liger's kernels, which compiling replaces)" if liger_saving else "")
                 + f" would save {saved:.0f} s ({saving:.0%} each) against about {cost:.0f} s of compiling (block by "
                 f"block, {shape.layers} layers): "
                 + ("it pays" if on else f"it pays from about {int(cost / (step * saving)) + 1} steps"))
        return on
    out.note("torch_compile", False, why)
    return False


def liger_uncovered(kind: str, covered: tuple[str, ...] = LIGER_TYPES) -> str:
    """Why `use_liger_kernel true` is refused for a model type Liger has no kernels for."""
    return (f"use_liger_kernel true: Liger has no kernels for model type {kind!r} (it covers {', '.join(covered)}), "
            "so none would run, and the run would be sized as if they did; set it to auto or false")


def _liger_off_reason(recipe: Recipe, settings: Any, device: Device | None, kind: str, liger: tuple[str, ...],
                      compiled: bool, absent: str = "") -> str:
    """Why Liger stays off ("" where it may go on); `absent`: why `liger` is empty."""
    if device is None:
        return "CPU: off (Liger's kernels are triton, GPU only)"
    if not liger:
        return absent or LIGER_ABSENT
    if settings.task != "causal_lm":
        return "its fused loss is for causal language models"
    if kind not in liger:
        return f"Liger has no kernels for model type {kind or '(none)'!r}"
    if compiled:
        return "torch_compile is on, and Liger's kernels fail under torch.compile (or give a wrong loss)"
    if recipe.strategy_spec.zero_stage == 3:
        return ("its fused loss reads the output layer's weight directly, which ZeRO-3 keeps partitioned outside "
                "that layer's own forward")
    return ""


def _liger_on(recipe: Recipe) -> str:
    return (f"the run is not compiled and its kernels apply: {liger_saving(recipe)[1]}, and they keep less (no fp32 "
            "logits)")


def _liger_applies(recipe: Recipe, settings: Any, device: Device | None, kind: str, liger: tuple[str, ...],
                   compiled: bool) -> bool:
    return not _liger_off_reason(recipe, settings, device, kind, liger, compiled)


def _fit(out: Resolved, recipe: Recipe, shape: memory.Shape, device: Device, world: int, gpn: int, seq: int,
         per_rank: int, given: int | None, gc: bool | str, use_liger: bool | str, liger_ok: Callable[[bool], bool],
         compiled: Callable[[bool], bool], regime: memory.Regime, global_auto: bool,
         plan: str) -> tuple[int, bool, bool]:
    """The micro-batch (the largest that fits, or the one given), checkpointing and Liger from the plan's memory
    model on this GPU; each micro-batch sized compiled or not as it would run (`compiled(checkpointing)`), and with
    Liger where it may go on (`liger_ok(compiled)`). `global_auto`: global_batch is auto, so a micro-batch set
    alone sets the examples per process too."""
    def largest(ckpt: bool, lig: bool):
        return memory.largest_micro_batch(shape, recipe, world_size=world, gpus_per_node=gpn, seq_len=seq,
                                          per_rank=per_rank, gpu_mem=device.memory_bytes, checkpointing=ckpt,
                                          regime=replace(regime, compiled=compiled(ckpt), liger=lig),
                                          candidates=[given] if given else None)

    def with_liger(ckpt: bool) -> bool:  # Liger on, by itself or as set
        return liger_ok(compiled(ckpt)) or use_liger is True

    def alone(ckpt: bool) -> dict:  # one example per process and no accumulation: no gradients held between steps
        return memory.estimate(shape, recipe, world_size=world, gpus_per_node=gpn, seq_len=seq, batch=1,
                               gradient_checkpointing=ckpt,
                               regime=replace(regime, compiled=compiled(ckpt), liger=with_liger(ckpt)))

    budget = f"{memory.budget(device.memory_bytes) / GIB:.1f} GiB ({1 - memory.MARGIN:.0%} of the {device.name})"
    for ckpt in ([False, True] if gc == AUTO else [gc]):
        lig = with_liger(ckpt)
        found = largest(ckpt, lig)
        if not found:
            continue
        m, est = found
        need = f"{est['gpu_bytes'] / GIB:.1f} GiB"
        if not given:
            out.note("per_device_train_batch_size", m, f"all {per_rank} examples per process fit at once: {need} of "
                     f"{budget}" if m == per_rank else f"the largest divisor of the {per_rank} examples per process "
                     f"that fits: {need} of {budget}; accumulation makes up the rest")
        if gc == AUTO:
            out.note("gradient_checkpointing", ckpt, _why_checkpointed(given, per_rank, alone, device) if ckpt
                     else f"not needed: micro-batch {m} fits without it ({need} of {budget})")
        if liger_ok(compiled(ckpt)):
            plain = largest(ckpt, False)
            out.note("use_liger_kernel", True, _liger_on(recipe) + (
                f"; memory binds too: micro-batch {m} fits with them, {plain[0]} without" if plain and plain[0] < m
                else f"; memory binds too: micro-batch {m} fits with them, not without" if not plain else ""))
        return m, ckpt, lig
    if given:  # the user's micro-batch: run it as asked, with checkpointing unless told otherwise
        ckpt = gc if gc != AUTO else True
        if gc == AUTO:
            out.note("gradient_checkpointing", True, f"micro-batch {given} does not fit {budget} even with it by the "
                     "plan's estimate: on, and the run goes as asked")
        if liger_ok(compiled(ckpt)):
            out.note("use_liger_kernel", True, _liger_on(recipe) + f"; micro-batch {given} does not fit even with them")
        return given, ckpt, with_liger(ckpt)
    ckpt = gc is not False
    said = " with gradient checkpointing" if ckpt else ""
    one = alone(ckpt)
    if per_rank > 1 and memory.fits(one, device.memory_bytes):  # accumulation's gradients are what does not fit
        # a micro-batch of 1 set alone means one example per process only while global_batch is auto; beside a
        # global_batch set, it is accumulated again
        micro_too = " (or per_device_train_batch_size 1)" if global_auto else ""
        raise DoesNotFit(f"{recipe.name}: no micro-batch that divides the {per_rank} examples each process takes per "
                            f"step (global_batch {per_rank * world}) fits in {budget}{said} by the plan's estimate: "
                            "accumulating keeps the gradients allocated between micro-batches. One example per "
                            f"process without accumulation fits ({one['gpu_bytes'] / GIB:.1f} GiB): set global_batch "
                            f"{world}{micro_too}, or run `{plan}` for a recipe that fits")
    # the model's states at their largest in a step (DDP's gradient buckets, ZeRO-2's step partition), before any
    # example: where they alone overflow, no sequence length helps
    states = max(memory.gpu_states_at_peak(shape, recipe, world, gpn, replace(regime, accumulation=1))) + memory.OVERHEAD
    if not memory.fits({"gpu_bytes": states}, device.memory_bytes):
        raise DoesNotFit(f"{recipe.name}: the model alone does not fit: its weights, gradients and optimizer states "
                         f"take {states / GIB:.1f} GiB per GPU at their peak in a step, of {budget}, by the plan's "
                         f"estimate; run `{plan}` for a recipe that fits {world} GPU(s) "
                         "(sharded, offloaded or adapters), or use more GPUs")
    raise DoesNotFit(f"{recipe.name}: not even one example of {seq} tokens fits in {budget}{said} by the plan's "
                        f"estimate; run `{plan}` for a recipe that fits, or lower max_seq_length")


def plan_command(model: str, seq: int) -> str:
    """The `invoke plan` that compares the recipes for this run's model (MODEL_FOLDER where it is not known here)."""
    return f"invoke plan --model={shlex.quote(model) if model else 'MODEL_FOLDER'} --seq-len={seq}"


def _why_checkpointed(given: int | None, per_rank: int, alone: Callable[[bool], dict], device: Device) -> str:
    """Why checkpointing went on by itself: the micro-batch given does not fit without it, or none dividing the
    examples per process does; of those, either not even one example fits, or one would alone but the gradients
    that accumulation holds between micro-batches do not (`alone(False)`: one example, no accumulation)."""
    if given:
        return f"needed: micro-batch {given} does not fit without it"
    if per_rank > 1 and memory.fits(alone(False), device.memory_bytes):
        return (f"needed: no micro-batch dividing the {per_rank} examples per process fits without it (the "
                "accumulation holds the gradients)")
    return "needed: not even one example fits without it"


# --- padding-free batches (once the data and the model are loaded) -----------------------------------------

def resolve_padding_free(value: Any, fmt: str, task: str, device: Device | None, attention: str, micro: int,
                         seq_len: int) -> tuple[bool, str]:
    """(on, why) for packing each batch into one row with position ids restarting per example."""
    if value is True:
        check_packing(False, task, padding_free=value)  # the padding_free checks alone
        return True, "set"
    if value is False:
        return False, "set"
    if value != AUTO:
        raise DockyardError(f"padding_free must be true, false or auto (got {short(value)})")
    if device is None:
        return False, "CPU: padded batches"
    if task != "causal_lm" or fmt not in PADDING_FREE_FORMATS:
        return False, (f"the {fmt} format: padding-free rows are for instruction and chat data "
                       f"({', '.join(PADDING_FREE_FORMATS)}); text documents have packing")
    if attention in VARLEN_ATTENTION:
        return True, f"{attention} attends to each packed example on its own: no padding, no extra work"
    row = micro * seq_len
    if attention != "sdpa":
        return False, (f"the model's {attention or 'unknown'} attention would compute attention over the whole packed "
                       f"row of up to {row} tokens; padding costs less. flash_attention_2 packs without that cost "
                       f"(sdpa too while the row is at most {PACKED_SDPA_MAX_TOKENS} tokens)")
    if row <= PACKED_SDPA_MAX_TOKENS:
        return True, (f"sdpa masks the packed row per example; the row ({row} tokens at most) is short enough that "
                      f"attention over it costs less than the padding it saves")
    return False, (f"sdpa would compute attention over the whole packed row of up to {row} tokens (more than "
                   f"{PACKED_SDPA_MAX_TOKENS}); padding costs less. flash_attention_2 packs without that cost")


# --- packed text (before the data is tokenized) ------------------------------------------------------------

def check_packing(value: Any, task: str, padding_free: Any) -> None:
    """What packing and padding_free refuse without reading the data (the host checks it before a run:
    dockyard.launch.preflight; the trainer before the model loads)."""
    if value is True and task != "causal_lm":
        raise DockyardError(f"packing joins text documents for causal language modelling, not {task}: set it to auto "
                            "or false")
    if value is True and padding_free is True:
        raise DockyardError("packing and padding_free are both true: packing fills every row already; set one")
    if padding_free is True and task != "causal_lm":
        raise DockyardError(f"padding_free applies to causal language modelling, not {task}: set it to auto or false")


def check_packing_format(value: Any, fmt: str) -> None:
    """packing set true for data of another format than text (the trainer once the data is read; the host from the
    data_format setting or a JSON Lines file's first example)."""
    if value is True and fmt != "text":
        raise DockyardError(f"packing joins text documents (the text format), and this data is {fmt}: instruction "
                            "and chat examples keep their boundaries; padding_free packs those. Set packing to "
                            "auto or false")


def resolve_packing(value: Any, fmt: str, task: str, device: Device | None, padding_free: Any) -> tuple[bool, str]:
    """(on, why) for joining text documents end to end (EOS between them) and cutting the stream into blocks of
    max_seq_length tokens, as pretraining does: no padding, and a long document is split across blocks instead of
    cut short. A block's tokens attend to the documents before them in the block (the EOS says where one ends):
    the SDPA kernels stay the fast causal ones."""
    check_packing(value, task, padding_free)
    check_packing_format(value, fmt)
    if value is True:
        return True, SET
    if value is False:
        return False, SET
    if value != AUTO:
        raise DockyardError(f"packing must be true, false or auto (got {short(value)})")
    if device is None:
        return False, "CPU: one example per document, cut at max_seq_length"
    if task != "causal_lm" or fmt != "text":
        return False, f"the {fmt} format: only text documents are joined (instruction and chat data: padding_free)"
    if padding_free is True:
        return False, "padding_free is set: its rows are packed already"
    return True, ("text documents joined end to end and cut into max_seq_length blocks: no padding, and no "
                  "document cut short")


# --- NUMA binding (once the process knows its GPU) ---------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where one process's GPU sits and the CPUs it may use there (read by dockyard.train.cpus)."""

    gpu: int                      # the process's GPU (its local rank: torch's index among the visible GPUs)
    address: str                  # its PCI address, as sysfs and `lspci -D` write it (0000:18:00.0)
    node: int                     # that GPU's NUMA node; -1 where the firmware does not say on a host of several
    nodes: int                    # NUMA nodes holding CPUs this process may use
    cpus: frozenset[int]          # the CPUs of the GPU's node this process may use (its affinity within the node)
    cores: int                    # physical cores among them (hyperthreads' siblings count once)
    sharing: int                  # this node's processes whose GPU is on the same NUMA node (this one included)
    idle: tuple[int, ...] = ()    # NUMA nodes with usable CPUs but none of this node's processes' GPUs

    @property
    def threads(self) -> int:
        """Each of the processes sharing the node's cores gets an equal part of them."""
        return max(1, self.cores // max(1, self.sharing))


def resolve_numa_binding(value: Any, device: Device | None, place: Placement | None) -> tuple[bool, str]:
    """(on, why) for binding this process to the CPUs of its GPU's NUMA node (dockyard.train.cpus); `place` is
    where its GPU sits, None where the host's NUMA topology is not readable. The auto binds only where the run's
    GPUs sit on every NUMA node it may use: bound, a process runs on its GPU's node alone, so a node without GPUs
    would keep its cores (and its memory's bandwidth, which CPU Adam lives on) out of the run."""
    if value is False:
        return False, SET
    if value not in (True, AUTO):
        raise DockyardError(f"numa_binding must be true, false or auto (got {short(value)})")
    why_not = ""
    if device is None:
        why_not = "CPU: no GPU to bind near"
    elif place is None:
        why_not = "this host's NUMA topology is not readable (/sys/devices/system/node)"
    elif place.node >= 0 and not place.cpus:
        why_not = (f"this process may use none of NUMA node {place.node}'s CPUs, where its GPU {place.gpu} "
                   f"({place.address}) is: its CPU affinity (Slurm's, or the container's cpuset) holds it elsewhere")
    elif value == AUTO and place.nodes < 2:
        return False, "one NUMA node: every core is as near the GPUs as any other"
    elif place.node < 0:
        why_not = f"GPU {place.gpu} ({place.address})'s NUMA node is not known: its firmware does not say (sysfs reads -1)"
    elif value == AUTO and place.idle:
        return False, (f"NUMA node(s) {', '.join(map(str, place.idle))} hold(s) none of this run's GPUs: bound near "
                       "their GPUs, the processes would leave those cores idle (set it true to bind even so)")
    if why_not:
        if value is True:
            raise DockyardError(f"numa_binding true cannot bind: {why_not}; set it to auto or false")
        return False, why_not
    assert place is not None
    return True, (f"GPU {place.gpu} ({place.address}) is on NUMA node {place.node}: bound to its {place.cores} "
                  f"core(s) (CPUs {cpu_ranges(place.cpus)}), shared by {place.sharing} process(es)")


def cpu_ranges(cpus: frozenset[int]) -> str:
    """{0, 1, 2, 5} as sysfs writes it: 0-2,5."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
