"""Model FLOPs utilisation: the FLOPs a step must do, over what the GPUs could do at their dense peak. The one
formula: the trainer's metrics (metrics.jsonl, manifest.json) and benchmarks/ both use it.

Per token (PaLM's accounting, appendix B): 6·N for the weight matmuls (forward 2N, backward 2N for the activation
gradients and 2N for the weight gradients) plus 12·L·q·S for attention scores and values, q the width attention
runs at (heads × head_dim: the hidden size in most models, not in all). N counts every matmul
weight: the input embedding is a lookup, not a matmul, so it is left out (a tied output head still multiplies, so it
stays in). With adapters (LoRA, QLoRA) the frozen base gets no weight gradients: 4·N, plus 6 per trained adapter
weight (each goes through all three matmuls: 1.8 % more FLOPs at rank 16 on a 1.1B Llama, 7.3 % at rank 64).
Recomputation under gradient checkpointing is not useful work and is not counted. S is the length attention runs
over: for examples of different lengths, the token-weighted mean length Σℓ²/Σℓ.
"""

from __future__ import annotations

# Dense (no sparsity) tensor-core peak per GPU, by part and by the dtype a recipe trains in (NVIDIA data sheets).
# A name matches when every word of the key is one of its words, in any case: "A10" is not "A10G", "L4" not "L40S",
# "H100 PCIe" is not SXM.
PEAK = [
    (("H100", "NVL"), {"bf16": 835e12, "fp16": 835e12}),
    (("H100", "PCIe"), {"bf16": 756e12, "fp16": 756e12}),
    (("H100",), {"bf16": 989e12, "fp16": 989e12}),  # SXM ("NVIDIA H100 80GB HBM3")
    (("H200", "NVL"), {"bf16": 835e12, "fp16": 835e12}),
    (("H200",), {"bf16": 989e12, "fp16": 989e12}),  # SXM ("NVIDIA H200")
    (("GH200",), {"bf16": 989e12, "fp16": 989e12}),  # its GPU is an H100 SXM's ("NVIDIA GH200 480GB")
    (("H800", "PCIe"), {"bf16": 756e12, "fp16": 756e12}),
    (("H800",), {"bf16": 989e12, "fp16": 989e12}),
    (("H20",), {"bf16": 148e12, "fp16": 148e12}),
    (("B200",), {"bf16": 2250e12, "fp16": 2250e12}),
    (("A100",), {"bf16": 312e12, "fp16": 312e12}),
    (("L40S",), {"bf16": 362e12, "fp16": 362e12}),
    (("L40",), {"bf16": 181e12, "fp16": 181e12}),
    (("L4",), {"bf16": 121e12, "fp16": 121e12}),
    (("A40",), {"bf16": 150e12, "fp16": 150e12}),
    (("A10",), {"bf16": 125e12, "fp16": 125e12}),
    (("V100", "PCIe"), {"fp16": 112e12}),  # Volta: no bf16 tensor cores ("Tesla V100-PCIE-32GB")
    (("V100",), {"fp16": 125e12}),  # SXM2
    (("T4",), {"fp16": 65e12}),  # Turing: no bf16 tensor cores
]


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak of one GPU of this name in this dtype; None for a part (or dtype) not in the table, and for a
    MIG slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"): it has a share of the part's compute, not all of it."""
    words = set(device_name.replace("-", " ").upper().split())
    if "MIG" in words:
        return None
    for key, by_dtype in PEAK:
        if {k.upper() for k in key} <= words:
            return by_dtype.get(dtype)
    return None


def flops_per_token(*, parameters: int, vocab: int, hidden: int, layers: int, seq_len: float, tied: bool,
                    adapters: bool, attention_width: int = 0, adapter_params: int = 0) -> float:
    """Training FLOPs per token of a decoder of `parameters` (all of them, embeddings included); `attention_width`:
    heads × head_dim where it differs from `hidden`; `adapter_params`: the adapters' trainable weights (adapters)."""
    matmul = parameters - (0 if tied else vocab * hidden)
    return ((4 * matmul + 6 * adapter_params) if adapters else 6 * matmul) + 12 * layers * (attention_width or hidden) * seq_len


def attention_length(lengths: list[int]) -> float:
    """S of the formula for examples of these lengths: each token attends over its own example, Σℓ²/Σℓ."""
    total = sum(lengths)
    return sum(n * n for n in lengths) / total if total else 0.0


def mfu(tokens_per_second: float, flops: float, peak: float | None, gpus: int) -> float | None:
    return tokens_per_second * flops / (peak * gpus) if peak else None
