"""The memory model: a model's shape (from config.json, or guessed from a parameter count) and what a recipe needs
per GPU and per node, before a run. `invoke plan` tabulates it (dockyard.machine.planner); the trainer puts its
prediction next to the measured peak in manifest.json and picks the `auto` micro-batch from it.

Model states (weights, gradients, optimizer) are the registry's formulas (dockyard.common.recipes: DeepSpeed's
own estimators for ZeRO, tests check the numbers agree). Activations are what autograd saves for the
backward pass of a Llama-shaped decoder with SDPA attention (no seq×seq matrix), measured on CPU with
saved-tensor hooks: per token and layer 16·h + 4·q + 4·kv + 8·i bytes in bf16 (h hidden, q the query width,
h for most models, kv the K/V width, i the MLP width), plus 4·vocab for the fp32 log-softmax of the loss;
with gradient checkpointing only each layer's 2·h input is kept, and one layer is recomputed at a time. At the
peak, the first step of the backward pass, the loss holds 12·vocab bytes per token: that log-softmax, the gradient
coming into it and the one it makes, all fp32 (measured on CPU with torch's allocator; a 128k vocabulary at
micro-batch 8 × 2048 is 25 GB of it).

The GPU peak (`gpu_reserved_bytes`: what torch reserves, the manifest's `peak_memory_bytes`) puts both together
the way a training step holds them, calibrated on one H100 80GB against issue 24's measurements (tests pin
every figure within 10 %): see "the GPU peak" below.

Torch-free: a model folder is sized from its config.json (dockyard.common.model_config), no weights read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from dockyard.common import model_config, recipes
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import Recipe, Sizes
from dockyard.common.run_settings import RunSettings
from dockyard.common.units import GIB

OVERHEAD = 1 * GIB     # per GPU: CUDA context, NCCL buffers, allocator slack
# the adapters' rank on every linear layer of the decoder the shapes count: the run settings' lora_r default
LORA_RANK: int = RunSettings.model_fields["lora_r"].default
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
    q_hidden: int = 0    # width of the Q projection (heads × head_dim): 0 = hidden, as in most models
    model_type: str = "" # config.json's model_type (which kernels apply: Liger's)
    tied: bool = False   # input and output embeddings shared (tie_word_embeddings, or the family's default)
    context: int = 0     # the positions config.json gives the model (max_position_embeddings); 0 = not said

    @property
    def q_width(self) -> int:
        return self.q_hidden or self.hidden

    def adapter_params(self, rank: int) -> int:
        """Trainable parameters of rank-`rank` adapters on the linear layers (lora_params is rank LORA_RANK's:
        an adapter's size is linear in its rank)."""
        return self.lora_params * rank // LORA_RANK


@dataclass(frozen=True)
class Regime:
    """How a run computes, as far as its memory goes: what the trainer resolves for it (autos included), and the
    settings that size what it trains (recipes/defaults.yaml's defaults)."""

    lora_dropout: float = 0.0    # recipes/defaults.yaml's default
    compiled: bool = False       # torch_compile
    liger: bool = False          # Liger's fused linear cross-entropy: no fp32 logits
    accumulation: int = 1        # gradient accumulation steps: above 1, gradients stay allocated between steps
    lora_r: int = LORA_RANK      # the adapters' rank (lora, qlora)
    dtype: str = "auto"          # the weights' dtype setting: an adapter recipe's frozen base is 16-bit unless float32
    half: bool = False           # computes in 16-bit mixed precision (GPUs, unless bf16/fp16 say otherwise: autos)
    logits: bool = True          # a causal LM's vocabulary-wide logits; a classifier (task seq_cls) has none


def _decoder_shape(hidden: int, layers: int, intermediate: int, kv: int) -> tuple[int, int]:
    """(linear weights, LoRA params) of a Llama-style decoder: q, k, v, o, gate, up, down in every layer."""
    linear = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate)
    lora = layers * LORA_RANK * (9 * hidden + 2 * kv + 3 * intermediate)
    return linear, lora


@dataclass(frozen=True)
class Published:
    """A published decoder: the settings of its config.json that size it, which a bare count near its size is
    planned with (counted by model_config, as its own config.json would be)."""

    name: str
    repo: str            # its hub id: `hf download REPO config.json` fetches what plans it exactly
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False   # tie_word_embeddings
    head_dim: int = 0    # where config.json sets it apart from hidden / heads (Qwen3's 128, Gemma's 256)

    def config(self) -> dict:
        return {"model_type": self.model_type, "hidden_size": self.hidden, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "intermediate_size": self.intermediate, "vocab_size": self.vocab,
                "tie_word_embeddings": self.tied} | ({"head_dim": self.head_dim} if self.head_dim else {})

    def shape(self) -> Shape:
        return Shape(**model_config.count_settings(self.config(), Path(self.repo, "config.json"), LORA_RANK))


# the models people mean by "1B", "7B", "70B", from their config.json (tests hold each count to the one transformers
# builds): a count within NEAR of one of these takes its shape (the guess of shape_from_count made 7B a model of
# hidden 3840 and 30 layers, no model anyone trains: its activations 12 % short)
PUBLISHED = (
    Published("Qwen2.5 0.5B", "Qwen/Qwen2.5-0.5B", "qwen2", 896, 24, 14, 2, 4864, 151936, tied=True),
    Published("Qwen3 0.6B", "Qwen/Qwen3-0.6B", "qwen3", 1024, 28, 16, 8, 3072, 151936, tied=True, head_dim=128),
    Published("TinyLlama 1.1B", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "llama", 2048, 22, 32, 4,
              5632, 32000),
    Published("Llama 3.2 1B", "meta-llama/Llama-3.2-1B", "llama", 2048, 16, 32, 8, 8192, 128256, tied=True),
    Published("Qwen2.5 1.5B", "Qwen/Qwen2.5-1.5B", "qwen2", 1536, 28, 12, 2, 8960, 151936, tied=True),
    Published("Qwen3 1.7B", "Qwen/Qwen3-1.7B", "qwen3", 2048, 28, 16, 8, 6144, 151936, tied=True, head_dim=128),
    Published("Gemma 2B", "google/gemma-2b", "gemma", 2048, 18, 8, 1, 16384, 256000, tied=True, head_dim=256),
    Published("Gemma 2 2B", "google/gemma-2-2b", "gemma2", 2304, 26, 8, 4, 9216, 256000, tied=True, head_dim=256),
    Published("Qwen2.5 3B", "Qwen/Qwen2.5-3B", "qwen2", 2048, 36, 16, 2, 11008, 151936, tied=True),
    Published("Llama 3.2 3B", "meta-llama/Llama-3.2-3B", "llama", 3072, 28, 24, 8, 8192, 128256, tied=True),
    Published("Qwen3 4B", "Qwen/Qwen3-4B", "qwen3", 2560, 36, 32, 8, 9728, 151936, tied=True, head_dim=128),
    Published("Llama 2 7B", "meta-llama/Llama-2-7b-hf", "llama", 4096, 32, 32, 32, 11008, 32000),
    Published("Mistral 7B", "mistralai/Mistral-7B-v0.1", "mistral", 4096, 32, 32, 8, 14336, 32000),
    Published("Qwen2.5 7B", "Qwen/Qwen2.5-7B", "qwen2", 3584, 28, 28, 4, 18944, 152064),
    Published("Llama 3.1 8B", "meta-llama/Llama-3.1-8B", "llama", 4096, 32, 32, 8, 14336, 128256),
    Published("Qwen3 8B", "Qwen/Qwen3-8B", "qwen3", 4096, 36, 32, 8, 12288, 151936, head_dim=128),
    Published("Gemma 7B", "google/gemma-7b", "gemma", 3072, 28, 16, 16, 24576, 256000, tied=True, head_dim=256),
    Published("Gemma 2 9B", "google/gemma-2-9b", "gemma2", 3584, 42, 16, 8, 14336, 256000, tied=True,
              head_dim=256),
    Published("Llama 2 13B", "meta-llama/Llama-2-13b-hf", "llama", 5120, 40, 40, 40, 13824, 32000),
    Published("Qwen2.5 14B", "Qwen/Qwen2.5-14B", "qwen2", 5120, 48, 40, 8, 13824, 152064),
    Published("Qwen3 14B", "Qwen/Qwen3-14B", "qwen3", 5120, 40, 40, 8, 17408, 151936, head_dim=128),
    Published("Gemma 2 27B", "google/gemma-2-27b", "gemma2", 4608, 46, 32, 16, 36864, 256000, tied=True,
              head_dim=128),
    Published("Qwen2.5 32B", "Qwen/Qwen2.5-32B", "qwen2", 5120, 64, 40, 8, 27648, 152064),
    Published("Qwen3 32B", "Qwen/Qwen3-32B", "qwen3", 5120, 64, 64, 8, 25600, 151936, head_dim=128),
    Published("Llama 3.1 70B", "meta-llama/Llama-3.1-70B", "llama", 8192, 80, 64, 8, 28672, 128256),
    Published("Qwen2.5 72B", "Qwen/Qwen2.5-72B", "qwen2", 8192, 80, 64, 8, 29568, 152064),
    Published("Llama 3.1 405B", "meta-llama/Llama-3.1-405B", "llama", 16384, 126, 128, 8, 53248, 128256),
)
NEAR = 1.15  # a count within 15 % of a published model's


def _per_token(shape: Shape) -> int:
    """Activation bytes per token at the GPU peak, before any recipe's factor: what autograd keeps of every layer
    (activation_bytes) and the fp32 loss head's 12·vocab (see gpu_activation_bytes). Linear in the tokens (SDPA
    keeps no seq×seq matrix), so the model it ranks first is the same at every sequence length and micro-batch; with
    checkpointing too. (Liger's kernels, which drop the head, can put Llama 3.1 8B 2 % over Qwen2.5 7B: within the
    plan's margin.)"""
    return activation_bytes(shape, 1, 1, False) + 8 * shape.vocab


def shape_from_count(params: int) -> Shape:
    """The shape of a published model near a bare parameter count (within NEAR), else a Llama-3-shaped guess:
    P ≈ 13·h²·(h/128) + 2·vocab·h, solved for h. Where several are near (7B: Llama 2 7B, Mistral 7B, Qwen2.5 7B,
    Llama 3.1 8B), the one whose activations take the most memory, so that a plan's "fits" holds for whichever the
    user means; unless the count is one's to three figures (8.03B), which names that model. The guess: Llama 3's
    vocabulary while its embeddings take at most half the count; a small model's vocabulary shrinks to that half (a
    125M model with 128k entries would be embeddings and little else)."""
    if params <= 0:
        raise DockyardError(f"a model needs parameters, got {params}")
    near = [(m, shape) for m in PUBLISHED if max(params / (shape := m.shape()).params, shape.params / params) <= NEAR]
    # its count, or its count to three figures (8.03B: Llama 3.1 8B, 7.24B: Mistral 7B), names that model; a round
    # count (7B, 8B, 70B) is any of those near it
    named = [(m, shape) for m, shape in near if params in (shape.params, int(float(f"{shape.params:.3g}")))]
    if near:
        model, shape = named[0] if named else max(near, key=lambda ms: _per_token(ms[1]))
        others = [] if named else [m.name for m, _ in near if m is not model]
        why = (f"of the published models near {params / 1e9:.3g}B ({', '.join(others)} too) the one whose activations "
               "take the most memory" if others else f"the published model {'of' if named else 'nearest'} "
               f"{params / 1e9:.3g}B")
        linear = min(shape.linear_params, params)
        return replace(shape, params=params, linear_params=linear, source=(
            f"assumed {model.name}'s shape (hidden {shape.hidden}, {shape.layers} layers, vocab {shape.vocab}), "
            f"{why}; for exact numbers give --model your model's folder (its config.json alone will do: "
            f"{model.repo}'s, for this one)"))
    lo, hi = 1.0, 1e6
    for _ in range(200):  # bisection: P is increasing in h
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 13 * mid**3 / 128 + min(2 * ASSUMED_VOCAB * mid, params / 2) < params else (lo, mid)
    hidden = max(128, int(round(lo / 128)) * 128)
    v = min(ASSUMED_VOCAB, max(256, params // (4 * hidden) // 64 * 64))
    layers, inter, kv = max(1, hidden // 128), int(3.5 * hidden), hidden // 4
    return _shape_of(params, hidden, layers, inter, kv, v,
                     f"assumed Llama-3-like shape (hidden {hidden}, {layers} layers, vocab {v})")


def _shape_of(params: int, hidden: int, layers: int, inter: int, kv: int, vocab: int, assumed: str) -> Shape:
    linear, lora = _decoder_shape(hidden, layers, inter, kv)
    return Shape(params=params, largest_layer=max(vocab * hidden, hidden * inter), hidden=hidden, layers=layers,
                 vocab=vocab, intermediate=inter, kv_hidden=kv, linear_params=min(linear, params), lora_params=lora,
                 model_type="llama", source=f"{assumed}; pass a model folder for exact numbers")


def shape_from_folder(folder: Path) -> Shape:
    """Read config.json alone: exact counts for the common decoder families, no torch, no weights."""
    return Shape(**model_config.count(folder, LORA_RANK))


# --- model states: the registry's formulas ---------------------------------------------------------

def loaded_bytes(spec: recipes.Strategy, peft: str | None, regime: Regime) -> int:
    """Bytes a full fine-tune's weight takes as each process loads it (model.weights_dtype decides the same way):
    float32, but 16 bits where the dtype setting says so, or where the engine would cast it there anyway."""
    if peft or regime.dtype == "float32":
        return 4
    return 2 if regime.dtype != "auto" or (regime.half and spec.casts_weights_to_half) else 4


def model_states(strategy: str, peft: str | None, shape: Shape, world_size: int, gpus_per_node: int,
                 regime: Regime = Regime()) -> tuple[int, int]:
    """(GPU bytes per device, host bytes per node) for weights, gradients and optimizer states, with the run's
    adapter rank and, for an adapter recipe, its base's dtype (the registry's formulas hold a 16-bit base)."""
    gpu, host = recipes.model_states(strategy, peft, Sizes(
        params=shape.params, largest_layer=shape.largest_layer, world_size=world_size, gpus_per_node=gpus_per_node,
        linear_params=shape.linear_params, lora_params=shape.adapter_params(regime.lora_r),
        loaded_bytes=loaded_bytes(recipes.strategy(strategy), peft, regime)))
    if peft and regime.dtype == "float32":  # 2 bytes more per weight that is not quantised, loaded twice as large
        gpu += 2 * (shape.params - (shape.linear_params if peft == "qlora" else 0))
        host *= 2
    return gpu, host


def activation_bytes(shape: Shape, seq_len: int, batch: int, checkpointing: bool) -> int:
    """Bytes autograd keeps for backward, per GPU, for one micro-batch (see the module docstring)."""
    h, q, kv, inter = shape.hidden, shape.q_width, shape.kv_hidden, shape.intermediate
    tokens = seq_len * batch
    layer = 16 * h + 4 * q + 4 * kv + 8 * inter
    if checkpointing:
        return tokens * (shape.layers * 2 * h + layer) + head_activation_bytes(shape, seq_len, batch)
    return tokens * shape.layers * layer + head_activation_bytes(shape, seq_len, batch)


def head_activation_bytes(shape: Shape, seq_len: int, batch: int) -> int:
    """The part of activation_bytes after the last layer: the fp32 log-softmax of the logits, and the final norm."""
    return seq_len * batch * (4 * shape.vocab + 8 * shape.hidden)


# --- the GPU peak --------------------------------------------------------------------------------------
# Calibrated on one H100 80GB (issue 24: a 944M Llama-shaped model, seq 2048, micro-batch 1 and 8, torch's peak
# reserved memory); the test holding that table checks every figure within 10 %.
#
# The decoder blocks' activations, as a multiple of the bf16 bytes autograd saves (activation_bytes, measured on
# CPU); the loss head is fp32 whatever the recipe, 12·vocab bytes per token at the peak (the module docstring).
# Fitted with the head at that size (it was 4·vocab × these factors, which fitted the measured 32k vocabulary and
# left a Llama-3 vocabulary's run ~10 GiB short at micro-batch 8):
FP32_RESIDUAL = 0.30   # fp32 weights under bf16 autocast (ddp and fsdp full fine-tuning): the residual stream,
                       # the norms and their outputs stay fp32, and each linear layer keeps a bf16 copy of its input
                       # (0.21 measured on CPU; the rest is the GPU allocator's)
FSDP_RESIDUAL = 0.20   # the same under FSDP2, whose peak holds less of it: fitted to the H100's 944M run (48.9 GiB at
                       # micro-batch 8) and one H200's 1.1B runs (53.5, 37.3 with Liger's kernels), which the ddp
                       # factor put 6 % and 16 % over
# LoRA under mixed precision saves nothing measurable beside its base layers (their rank-r intermediates): the H200's
# 944M run at micro-batch 16 (2026-11-27, 64.8 GiB) is within 5 % with no factor of its own
COMPILED = 0.59        # torch.compile (ddp, measured): fused kernels save fewer intermediates (1.30 → 0.77); the
                       # trainer compiles block by block, so the loss head after the last block keeps its eager size.
                       # Measured on one GPU only: full fine-tuning under DDP on several is sized uncompiled, since
                       # dynamo splits each compiled block at DDP's gradient buckets (25 MB) and every split keeps
                       # its outputs for backward (compiled_saves)
COMPILED_QLORA = 0.78  # QLoRA compiled saves less of its (bf16) blocks: one H200, the 1.1B model at micro-batch 8
                       # (2026-12-04), 29.9 GiB compiled against 34.8 eager, where COMPILED said 24.3. Its 4-bit
                       # layers' matmul is bitsandbytes' own autograd function, which the compiled graph fuses around,
                       # not through, so each one keeps its input as in eager mode
LIGER_KEEPS_LESS = (2, 6)  # Liger's kernels (the Trainer applies them all): per token and decoder layer, a·i + b·h
                       # fewer bytes kept. Its SwiGLU recomputes the silu output (2·i, computed); its RMSNorm keeps its
                       # input and not the fp32 product the eager norm saves (8·h for the two norms, computed). One
                       # H200 measured 6.5·h under fp32 weights (ddp, Llama 3's vocabulary, micro-batch 16, 77.6 GiB)
                       # and 5.5-6.8·h where the model is bf16 (zero2, lora, qlora of the 1.1B model at micro-batch
                       # 8, 2026-12-04: 13.3-14.1 GiB less than without them), so the plan counts 6·h everywhere
# lora_dropout > 0 adds each adapter's dropout mask, one byte per input feature per token (computed, not fitted).
# Model states: the registry's formulas, with what is not yet allocated when activations peak (the start of the
# backward pass) left out, and what the engines add:
STAGE_EXTRA = {2: int(0.7 * GIB), 3: int(1.2 * GIB)}  # DeepSpeed's buckets (allgather 2e8 elements) and slack
ZERO2_STEP = 4         # ZeRO-2 makes its fp32 gradient partition in its step, from the bf16 gradients: bytes per
                       # parameter of the partition absent while activations peak, and held again (with as much of
                       # the step's own work) at its end. Fitted: the H100's zero2 at micro-batch 1 (21.8 GiB, the
                       # step's peak) and 8 (46.7), one H200's 1.1B model at 8 (51.1, and 37.0 with Liger's kernels)
MARGIN = 0.10          # the auto micro-batch (and `invoke plan`) leave this share of the GPU free: the calibration's
                       # error bound


def _fp32_residual(recipe: Recipe, regime: Regime) -> bool:
    """Full fine-tuning under the HF Trainer's autocast keeps fp32 weights (DDP, FSDP2); DeepSpeed casts the model
    to bf16 itself; a LoRA/QLoRA base is loaded in 16 bits, unless its dtype is set to float32."""
    if recipe.peft:
        return regime.dtype == "float32"
    return recipe.strategy_spec.engine in ("ddp", "fsdp")


def adapter_inputs(shape: Shape) -> int:
    """Input features of every adapted linear layer of one decoder layer (q, k, v, gate, up: h; o: q; down: i)."""
    return 5 * shape.hidden + shape.q_width + shape.intermediate


def liger_gradients(shape: Shape, recipe: Recipe, tokens: int) -> int:
    """What Liger's fused linear cross-entropy keeps from its forward pass for the backward: the gradient of its
    input (tokens × hidden, at most fp32) and, where the output layer trains, of its weight (vocab × hidden, the
    weight's dtype: fp32 under the Trainer's autocast, bf16 under DeepSpeed). Computed from liger-kernel's
    forward (its grad_input and grad_weight buffers), not fitted: ~1 GiB for a 128k vocabulary at hidden 2048."""
    weight = 0
    if not recipe.peft:
        weight = shape.vocab * shape.hidden * (4 if recipe.strategy_spec.engine in ("ddp", "fsdp") else 2)
    return tokens * shape.hidden * 4 + weight


def gpu_activation_bytes(shape: Shape, recipe: Recipe, seq_len: int, batch: int, checkpointing: bool,
                         regime: Regime = Regime()) -> int:
    """Activations at the peak of a step on a GPU, for this recipe's precision (see the factors above)."""
    head = head_activation_bytes(shape, seq_len, batch)
    blocks = activation_bytes(shape, seq_len, batch, checkpointing) - head
    if not regime.logits:  # a classifier has none
        head -= seq_len * batch * 4 * shape.vocab
    elif regime.liger:  # Liger's fused loss never makes them, but computes its gradients in the forward pass
        head += liger_gradients(shape, recipe, seq_len * batch) - seq_len * batch * 4 * shape.vocab
    else:  # the backward pass starts with the log-softmax's gradient, coming in and going out, beside it
        head += seq_len * batch * 8 * shape.vocab
    residual = FSDP_RESIDUAL if recipe.strategy_spec.engine == "fsdp" else FP32_RESIDUAL
    factor = 1 + (residual if _fp32_residual(recipe, regime) else 0)
    held = seq_len * batch * (1 if checkpointing else shape.layers)  # token-layers whose activations are kept
    masks = held * adapter_inputs(shape) if recipe.peft and regime.lora_dropout > 0 else 0
    kernels = 0
    if regime.liger:
        per_intermediate, per_hidden = LIGER_KEEPS_LESS
        kernels = held * (per_intermediate * shape.intermediate + per_hidden * shape.hidden)
    compiled = (COMPILED_QLORA if recipe.peft == "qlora" else COMPILED) if regime.compiled else 1
    return int(blocks * factor * compiled + head) + masks - kernels


def gpu_states_at_peak(shape: Shape, recipe: Recipe, world_size: int, gpus_per_node: int,
                       regime: Regime = Regime()) -> tuple[int, int]:
    """(model states held while activations peak, model states at the end of the backward pass), per GPU."""
    states, _ = model_states(recipe.strategy, recipe.peft, shape, world_size, gpus_per_node, regime)
    spec = recipe.strategy_spec
    at_peak = states + STAGE_EXTRA.get(spec.zero_stage or 0, 0)
    shard = shape.params / world_size if spec.shards_parameters else shape.params
    if spec.engine == "deepspeed" and spec.zero_stage == 2 and not spec.offloads and not recipe.peft:
        partition = int(ZERO2_STEP * shape.params / world_size)
        at_peak -= partition
        states += partition
    if not recipe.peft and spec.engine in ("ddp", "fsdp"):
        if regime.accumulation == 1:
            at_peak -= int(4 * shard)  # the Trainer frees the gradients after each step: they come back during backward
        if spec.engine == "fsdp":
            at_peak -= int(2 * shard)  # FSDP gathers one layer at a time: no full bf16 working copy
        elif world_size > 1:
            at_peak += 4 * shape.params  # DDP's gradient buckets (a second copy of the gradients)
            states += 4 * shape.params
    return at_peak, states


def compiled_saves(recipe: Recipe, world_size: int) -> bool:
    """Whether COMPILED applies: not yet to full fine-tuning under DDP on several GPUs (see COMPILED), where the
    saving is unmeasured and an over-promise is an out-of-memory at the first step."""
    return world_size == 1 or bool(recipe.peft) or recipe.strategy_spec.engine != "ddp"


def estimate(shape: Shape, recipe: Recipe, *, world_size: int, gpus_per_node: int, seq_len: int, batch: int,
             gradient_checkpointing: bool, regime: Regime = Regime()) -> dict:
    """One recipe's prediction: torch's peak reserved memory per GPU (model states held at the peak + activations),
    the GPU bytes per device with the CUDA context and NCCL on top, and host bytes per node."""
    if regime.compiled and not compiled_saves(recipe, world_size):
        regime = replace(regime, compiled=False)
    states, host = model_states(recipe.strategy, recipe.peft, shape, world_size, gpus_per_node, regime)
    at_peak, at_end = gpu_states_at_peak(shape, recipe, world_size, gpus_per_node, regime)
    act = gpu_activation_bytes(shape, recipe, seq_len, batch, gradient_checkpointing, regime)
    reserved = max(at_peak + act, at_end)
    return {"recipe": recipe.name, "strategy": recipe.strategy, "peft": recipe.peft, "world_size": world_size,
            "gpus_per_node": gpus_per_node, "seq_len": seq_len,
            "batch": batch, "gradient_checkpointing": gradient_checkpointing,
            "gpu_model_states_bytes": states, "gpu_activation_bytes": act, "gpu_overhead_bytes": OVERHEAD,
            "gpu_reserved_bytes": reserved, "gpu_bytes": reserved + OVERHEAD, "host_bytes": host}


def micro_batch_estimate(shape: Shape, recipe: Recipe, *, world_size: int, gpus_per_node: int, seq_len: int,
                         batch: int, per_rank: int, checkpointing: bool, regime: Regime = Regime()) -> dict:
    """estimate() for micro-batch `batch` of a run whose processes each take `per_rank` examples per optimizer step,
    with the accumulation that makes (above 1, the gradients stay allocated between micro-batches): how the trainer's
    auto micro-batch and `invoke plan` both size a run, so that they agree."""
    return estimate(shape, recipe, world_size=world_size, gpus_per_node=gpus_per_node, seq_len=seq_len, batch=batch,
                    gradient_checkpointing=checkpointing, regime=replace(regime, accumulation=max(1, per_rank // batch)))


def budget(gpu_mem: int) -> int:
    """What a step may take of a GPU's memory: all but MARGIN (the trainer's auto micro-batch, `invoke plan`'s fits)."""
    return int(gpu_mem * (1 - MARGIN))


def fits(est: dict, gpu_mem: int) -> bool:
    return est["gpu_bytes"] <= budget(gpu_mem)


def divisors(n: int) -> list[int]:
    """Every divisor of n, smallest first (up to √n steps: a global batch of a billion still answers at once)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def largest_micro_batch(shape: Shape, recipe: Recipe, *, world_size: int, gpus_per_node: int, seq_len: int,
                        per_rank: int, gpu_mem: int, checkpointing: bool, regime: Regime = Regime(),
                        candidates: list[int] | None = None) -> tuple[int, dict] | None:
    """The largest micro-batch dividing `per_rank` (the examples each rank takes per optimizer step; or the
    largest of `candidates`) whose predicted GPU bytes fit the budget of `gpu_mem`, with its estimate; None when
    none fits."""
    for m in sorted(candidates or divisors(per_rank), reverse=True):
        est = micro_batch_estimate(shape, recipe, world_size=world_size, gpus_per_node=gpus_per_node, seq_len=seq_len,
                                   batch=m, per_rank=per_rank, checkpointing=checkpointing, regime=regime)
        if fits(est, gpu_mem):
            return m, est
    return None
