"""Memory per recipe before a run, and which recipe to pick.

Model states (weights, gradients, optimizer) follow DeepSpeed's own estimators
(`estimate_zero2/3_model_states_mem_needs`, tests check the numbers agree). Activations are what autograd
saves for the backward pass of a Llama-shaped decoder with SDPA attention (no seq×seq matrix), measured on
CPU with saved-tensor hooks: per token and layer 20·h + 4·kv + 8·i bytes in bf16 (h hidden, kv the K/V width,
i the MLP width), plus 4·vocab for the fp32 log-softmax of the loss; with gradient checkpointing only each
layer's 2·h input is kept, and one layer is recomputed at a time.

This module runs inside the image too (the trainer puts its prediction next to the measured peak in
manifest.json): it needs only the standard library at import time; torch and transformers are imported
only to read a model folder.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from dockyard.errors import DockyardError

GIB = 2**30
RECIPES = ("ddp", "zero2", "zero2-offload", "zero3", "zero3-offload", "fsdp", "lora", "qlora")
# Fastest first. Full fine-tuning always beats adapters when it fits; fsdp needs what zero3 needs, so it is
# shown but never the one recommended (pick it to stay PyTorch-native).
FULL_ORDER = ("ddp", "zero2", "zero2-offload", "zero3", "zero3-offload")
ADAPTER_ORDER = ("lora", "qlora")
BUFFER = 1.5           # DeepSpeed's additional_buffer_factor for host memory
OVERHEAD = 1 * GIB     # per GPU: CUDA context, NCCL buffers, allocator slack
LORA_RANK = 16         # the adapters' rank on every linear layer of the decoder (the recipes' default)
NF4_BYTES = 0.52       # 4-bit NF4 with double-quantised scales, per quantised weight
# `--model 8B` with no config: a Llama-3-shaped decoder (vocab 128256, MLP 3.5·h, K/V h/4, h/128 layers)
ASSUMED_VOCAB = 128256


@dataclass(frozen=True)
class Shape:
    """What the estimate needs to know about a model."""

    params: int          # P: all parameters (tied ones once)
    largest_layer: int   # L: parameters of the largest single module (DeepSpeed's "largest layer")
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    kv_hidden: int       # width of the K (and V) projection: hidden for MHA, less with grouped-query attention
    linear_params: int   # weights of the decoder's linear layers: what QLoRA quantises
    lora_params: int     # trainable parameters of a rank-LORA_RANK adapter on those layers
    source: str = ""


def parse_count(text: str) -> int | None:
    """"8B", "1.5b", "350M", "8030261248" → a parameter count; None when it is not a count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return int(round(float(m.group(1)) * scale))


def _decoder_shape(hidden: int, layers: int, intermediate: int, kv: int) -> tuple[int, int]:
    """(linear weights, LoRA params) of a Llama-style decoder: q, k, v, o, gate, up, down in every layer."""
    linear = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate)
    lora = layers * LORA_RANK * (9 * hidden + 2 * kv + 3 * intermediate)
    return linear, lora


def shape_from_count(params: int) -> Shape:
    """A Llama-3-shaped guess for a bare parameter count: P ≈ 13·h²·(h/128) + 2·vocab·h, solved for h."""
    if params <= 0:
        raise DockyardError(f"a model needs parameters, got {params}")
    v = ASSUMED_VOCAB
    lo, hi = 1.0, 1e6
    for _ in range(200):  # bisection: P is increasing in h
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 13 * mid**3 / 128 + 2 * v * mid < params else (lo, mid)
    hidden = max(128, int(round(lo / 128)) * 128)
    layers, inter, kv = max(1, hidden // 128), int(3.5 * hidden), hidden // 4
    linear, lora = _decoder_shape(hidden, layers, inter, kv)
    return Shape(params=params, largest_layer=max(v * hidden, hidden * inter), hidden=hidden, layers=layers,
                 vocab=v, intermediate=inter, kv_hidden=kv, linear_params=min(linear, params), lora_params=lora,
                 source=f"assumed Llama-3-like shape (hidden {hidden}, {layers} layers, vocab {v}); "
                        "pass a model folder for exact numbers")


def shape_from_model(model, config, source: str = "") -> Shape:
    """Count a built model (on the meta device is enough): P, the largest module, linear layers, LoRA size."""
    import torch

    def numel(p) -> int:  # under ZeRO-3 a partitioned parameter holds nothing locally; ds_numel is its size
        return getattr(p, "ds_numel", None) or p.numel()

    params = sum(numel(p) for p in model.parameters())  # parameters() yields tied weights once
    largest = max((sum(numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    linear = lora = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] not in ("lm_head", "score", "classifier"):
            linear += m.weight.numel()
            lora += LORA_RANK * (m.in_features + m.out_features)
    hidden = getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0)
    heads = getattr(config, "num_attention_heads", 0) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return Shape(params=params, largest_layer=largest, hidden=hidden,
                 layers=getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0),
                 vocab=getattr(config, "vocab_size", 0),
                 intermediate=getattr(config, "intermediate_size", 0) or 4 * hidden,
                 kv_hidden=hidden * kv_heads // heads, linear_params=linear, lora_params=lora, source=source)


def shape_from_folder(folder: Path) -> Shape:
    """Read config.json and build the model on the meta device: exact counts, no weights, no download."""
    if not (folder / "config.json").is_file():
        raise DockyardError(f"{folder} has no config.json: pass a model folder or a count like --model=8B")
    try:
        import torch
        import transformers
    except ImportError:
        raise DockyardError("reading a model folder needs torch and transformers (pip install -e '.[train]'); "
                            "or pass a parameter count, e.g. --model=8B") from None
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # building heads without weights makes it chatty
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            try:
                model = transformers.AutoModelForCausalLM.from_config(config)
            except ValueError:  # an encoder (BERT...): no causal-LM head, count the bare model
                model = transformers.AutoModel.from_config(config)
    except (OSError, ValueError, KeyError) as e:
        raise DockyardError(f"cannot build the model of {folder}/config.json: {e}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return shape_from_model(model, config, source=f"{folder}/config.json")


def shape_for(model: str) -> Shape:
    """`--model`: a local folder with config.json, or a parameter count like 8B."""
    if not model:
        raise DockyardError("say which model: --model=PATH (a folder with config.json) or --model=8B")
    folder = Path(model).expanduser()
    if folder.is_dir():
        return shape_from_folder(folder)
    count = parse_count(model)
    if count is None:
        raise DockyardError(f"--model={model}: neither a folder nor a parameter count like 8B, 1.5B, 350M")
    return shape_from_count(count)


# --- model states: DeepSpeed's accounting ---------------------------------------------------------

def model_states(recipe: str, shape: Shape, world_size: int, gpus_per_node: int) -> tuple[int, int]:
    """(GPU bytes per device, host bytes per node) for weights, gradients and optimizer states.

    zero2/zero3 (and their offload variants) are DeepSpeed's formulas with zero.Init; ddp keeps everything on
    every GPU (fp32 weights 4 + fp32 grads 4 + Adam 8 + bf16 working copies 2 = 18 bytes per parameter);
    fsdp (FULL_SHARD) shards like zero3; lora/qlora keep frozen weights (bf16, or NF4 for the quantised linear
    layers) plus 18 bytes per trainable adapter parameter. Host memory without offload is what loading the
    checkpoint takes (every rank holds a copy while loading), as DeepSpeed counts it.
    """
    p, big, n = shape.params, shape.largest_layer, world_size
    nodes = max(1, math.ceil(world_size / gpus_per_node))
    if recipe == "ddp":
        return 18 * p, int(p * 4 * gpus_per_node * BUFFER)
    if recipe == "zero2":
        return 2 * p + int(18 * p / n), int(p * 4 * gpus_per_node * BUFFER)
    if recipe == "zero2-offload":
        return 2 * p, int(p * max(4 * n, 16) * BUFFER)
    if recipe in ("zero3", "fsdp"):
        return 4 * big + int(18 * p / n), int(big * 4 * gpus_per_node * BUFFER)
    if recipe == "zero3-offload":  # parameters and optimizer both on the CPU
        return 4 * big, int(p * 18 * (1 / nodes) * BUFFER)
    if recipe == "lora":
        return 2 * p + 18 * shape.lora_params, int(p * 2 * gpus_per_node * BUFFER)
    if recipe == "qlora":
        frozen = int(NF4_BYTES * shape.linear_params) + 2 * (p - shape.linear_params)
        return frozen + 18 * shape.lora_params, int(p * 2 * gpus_per_node * BUFFER)
    raise DockyardError(f"unknown recipe {recipe!r}; valid: {', '.join(RECIPES)}")


def activation_bytes(shape: Shape, seq_len: int, batch: int, checkpointing: bool) -> int:
    """Bytes autograd keeps for backward, per GPU, for one micro-batch (see the module docstring)."""
    h, kv, inter = shape.hidden, shape.kv_hidden, shape.intermediate
    tokens = seq_len * batch
    layer = 20 * h + 4 * kv + 8 * inter
    head = 4 * shape.vocab + 8 * h  # fp32 log-softmax of the logits, and the final norm
    if checkpointing:
        return tokens * (shape.layers * 2 * h + layer + head)
    return tokens * (shape.layers * layer + head)


def estimate(shape: Shape, recipe: str, *, world_size: int, gpus_per_node: int, seq_len: int, batch: int,
             gradient_checkpointing: bool) -> dict:
    """One recipe's prediction: GPU bytes per device (model states + activations + overhead), host bytes per node."""
    states, host = model_states(recipe, shape, world_size, gpus_per_node)
    act = activation_bytes(shape, seq_len, batch, gradient_checkpointing)
    return {"recipe": recipe, "world_size": world_size, "gpus_per_node": gpus_per_node, "seq_len": seq_len,
            "batch": batch, "gradient_checkpointing": gradient_checkpointing,
            "gpu_model_states_bytes": states, "gpu_activation_bytes": act, "gpu_overhead_bytes": OVERHEAD,
            "gpu_bytes": states + act + OVERHEAD, "host_bytes": host}


def estimate_run(num_params: int, largest_layer_params: int, recipe: str, world_size: int, gpus_per_node: int,
                 seq_len: int, batch: int, hidden: int, layers: int, gradient_checkpointing: bool, *,
                 vocab: int = 0, intermediate: int = 0, kv_hidden: int = 0, trainable_params: int = 0,
                 linear_params: int = 0) -> dict:
    """What `plan` predicts for a run, from numbers the trainer knows; goes into manifest.json.

    Optional shape details default to a Llama-like decoder (MLP 3.5·hidden, K/V = hidden); for lora/qlora pass
    the adapter's `trainable_params`, and for qlora the quantised `linear_params`.
    """
    inter = intermediate or int(3.5 * hidden)
    kv = kv_hidden or hidden
    linear, lora = _decoder_shape(hidden, layers, inter, kv)
    shape = Shape(params=num_params, largest_layer=largest_layer_params, hidden=hidden, layers=layers,
                  vocab=vocab, intermediate=inter, kv_hidden=kv,
                  linear_params=min(linear_params or linear, num_params), lora_params=trainable_params or lora)
    return estimate(shape, recipe, world_size=world_size, gpus_per_node=gpus_per_node, seq_len=seq_len,
                    batch=batch, gradient_checkpointing=gradient_checkpointing)


# --- all recipes and a recommendation ---------------------------------------------------------------

def plan(shape: Shape, *, gpus: int, gpu_mem: int, cpu_mem: int, seq_len: int, batch: int) -> dict:
    """Every recipe on `gpus` GPUs of `gpu_mem` bytes with `cpu_mem` bytes of host memory, and the pick."""
    if gpus < 1:
        raise DockyardError("--gpus must be at least 1")
    rows = []
    for recipe in RECIPES:
        plain, ckpt = (estimate(shape, recipe, world_size=gpus, gpus_per_node=gpus, seq_len=seq_len,
                                batch=batch, gradient_checkpointing=g) for g in (False, True))
        # Offloaded states live in host memory all run long; without offload the host figure is only the
        # loading-time worst case (every rank holding a copy), which low-memory loading avoids: shown, not gated.
        host_ok = "offload" not in recipe or plain["host_bytes"] <= cpu_mem
        rows.append({
            "recipe": recipe,
            "model_states_bytes": plain["gpu_model_states_bytes"],
            "activation_bytes": plain["gpu_activation_bytes"],
            "activation_bytes_checkpointed": ckpt["gpu_activation_bytes"],
            "gpu_bytes": plain["gpu_bytes"],
            "gpu_bytes_checkpointed": ckpt["gpu_bytes"],
            "host_bytes": plain["host_bytes"],
            "fits": host_ok and plain["gpu_bytes"] <= gpu_mem,
            "fits_checkpointed": host_ok and ckpt["gpu_bytes"] <= gpu_mem,
        })
    return {"model": asdict(shape), "gpus": gpus, "gpu_mem_bytes": gpu_mem, "cpu_mem_bytes": cpu_mem,
            "seq_len": seq_len, "batch": batch, "recipes": rows,
            "recommendation": recommend(rows, gpus=gpus, gpu_mem=gpu_mem, cpu_mem=cpu_mem)}


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def recommend(rows: list[dict], *, gpus: int, gpu_mem: int, cpu_mem: int) -> dict:
    """The fastest recipe that fits (without checkpointing if it can), with one line of why."""
    by = {r["recipe"]: r for r in rows}
    skipped: list[str] = []
    for recipe in FULL_ORDER + ADAPTER_ORDER:
        r = by[recipe]
        if r["fits"] or r["fits_checkpointed"]:
            ckpt = not r["fits"]
            need = r["gpu_bytes_checkpointed"] if ckpt else r["gpu_bytes"]
            why = (f"{recipe} is the fastest recipe that fits: {_gib(need)} of {_gib(gpu_mem)} per GPU"
                   + (" with gradient checkpointing" if ckpt else "")
                   + (f", {_gib(r['host_bytes'])} of {_gib(cpu_mem)} host memory" if "offload" in recipe else ""))
            if skipped:
                why += f"; {skipped[0]} needs {_too_big(by[skipped[0]], gpu_mem, cpu_mem)}"
            if recipe in ADAPTER_ORDER:
                why += "; full fine-tuning fits nowhere, so this trains adapters only"
            if recipe == "qlora":
                why += " (QLoRA buys memory, not speed: slower per token than bf16 LoRA)"
            return {"recipe": recipe, "gradient_checkpointing": ckpt, "why": why}
        skipped.append(recipe)
    q = by["qlora"]
    return {"recipe": None, "gradient_checkpointing": None,
            "why": f"nothing fits on {gpus} GPU(s) of {_gib(gpu_mem)}: even qlora needs "
                   f"{_too_big(q, gpu_mem, cpu_mem)}; use more or larger GPUs, or a shorter --seq-len"}


def _too_big(r: dict, gpu_mem: int, cpu_mem: int) -> str:
    if "offload" in r["recipe"] and r["host_bytes"] > cpu_mem:
        return f"{_gib(r['host_bytes'])} of host memory (have {_gib(cpu_mem)})"
    return f"{_gib(r['gpu_bytes_checkpointed'])} per GPU even with gradient checkpointing"


# --- the task's front end -----------------------------------------------------------------------------

def run(model: str, *, gpus: int = 0, gpu_mem_gib: float = 0.0, cpu_mem_gib: float = 0.0, seq_len: int = 2048,
        batch: int = 1, host=None) -> dict:
    """`invoke plan`: fill GPU count and memory from NVML (and host memory from the OS) where not given."""
    if seq_len < 1 or batch < 1:
        raise DockyardError("--seq-len and --batch must be at least 1")
    shape = shape_for(model)
    if not gpus or not gpu_mem_gib:
        if host is None:
            from dockyard.gpus import probe

            host = probe()
        if not host.gpus:
            raise DockyardError("NVML sees no GPU on this host: say what to plan for, e.g. --gpus=8 --gpu-mem=80")
        gpus = gpus or host.count
        gpu_mem_gib = gpu_mem_gib or min(g.memory_bytes for g in host.gpus) / GIB
    if not cpu_mem_gib:
        import psutil

        cpu_mem_gib = psutil.virtual_memory().total / GIB
    return plan(shape, gpus=gpus, gpu_mem=int(gpu_mem_gib * GIB), cpu_mem=int(cpu_mem_gib * GIB),
                seq_len=seq_len, batch=batch)


def print_plan(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result["model"]
    console = Console()
    console.print(f"model: {m['params'] / 1e9:.2f} B parameters, largest layer {m['largest_layer'] / 1e6:.0f} M "
                  f"({m['source']})")
    table = Table(title=f"{result['gpus']} GPU(s) × {_gib(result['gpu_mem_bytes'])}, host "
                        f"{_gib(result['cpu_mem_bytes'])}, seq {result['seq_len']} × batch {result['batch']} per GPU")
    for col in ("recipe", "states", "+ activations", "= per GPU", "checkpointed", "host/node", "fits"):
        table.add_column(col, justify="left" if col in ("recipe", "fits") else "right")
    for r in result["recipes"]:
        fits = "yes" if r["fits"] else "with checkpointing" if r["fits_checkpointed"] else "no"
        table.add_row(r["recipe"], _gib(r["model_states_bytes"]), _gib(r["activation_bytes"]), _gib(r["gpu_bytes"]),
                      _gib(r["gpu_bytes_checkpointed"]), _gib(r["host_bytes"]),
                      f"[green]{fits}[/]" if r["fits"] else f"[yellow]{fits}[/]" if r["fits_checkpointed"] else f"[red]{fits}[/]")
    console.print(table)
    rec = result["recommendation"]
    console.print(("[bold]recommended: " + rec["recipe"] + "[/]" if rec["recipe"] else "[bold red]no recipe fits[/]")
                  + f" — {rec['why']}")
    console.print("[dim]per GPU includes 1 GiB for the CUDA context and NCCL; fsdp needs what zero3 needs; host/node "
                  "is what offloading keeps in RAM, else the worst case while loading the checkpoint.[/]")


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2)
