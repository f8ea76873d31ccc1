"""How close `invoke plan` is: predicted against measured, side by side in one run.

1. Activations: plan's bytes against what autograd really saves for backward (saved-tensor hooks, bf16, CPU,
   SDPA attention) for several decoder shapes, sequence lengths and batch sizes, with and without gradient
   checkpointing.
2. Model states: plan's per-GPU and per-node bytes against DeepSpeed's own estimator functions.

    python -m benchmarks.plan_accuracy

Writes benchmarks/results/plan_accuracy.md. Peak GPU memory of real runs goes into each run's manifest.json
next to plan's prediction (needs a GPU).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import report
from dockyard.common import memory
from dockyard.machine import planner

SHAPES = [  # (architecture, hidden, intermediate, heads, kv heads, layers, vocab)
    ("llama", 256, 704, 8, 2, 4, 4000),
    ("llama", 512, 1792, 8, 8, 2, 32000),
    ("llama", 384, 1024, 6, 2, 6, 8000),
    ("qwen2", 256, 896, 8, 2, 4, 6000),
]
RUNS = [(1, 256), (4, 128), (2, 512)]  # (batch, seq)


def saved_bytes(model, ids) -> int:
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() != 0:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def activations() -> list[str]:
    import torch
    import transformers

    rows = ["| model | hidden/inter/kv/layers/vocab | batch × seq | checkpointing | predicted MiB | measured MiB | ratio |",
            "|---|---|---|---|---|---|---|"]
    for arch, h, inter, heads, kv_heads, layers, vocab in SHAPES:
        cfg_cls = transformers.AutoConfig.for_model(arch).__class__
        cfg = cfg_cls(hidden_size=h, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      num_hidden_layers=layers, vocab_size=vocab, attn_implementation="sdpa")
        with tempfile.TemporaryDirectory() as d:
            cfg.save_pretrained(d)
            shape = memory.shape_from_folder(Path(d))
        for ckpt in (False, True):
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).train()
            if ckpt:
                model.activation_checkpointing_enable({"use_reentrant": False})
            for batch, seq in RUNS:
                measured = saved_bytes(model, torch.randint(0, vocab, (batch, seq)))
                predicted = memory.activation_bytes(shape, seq, batch, ckpt)
                if ckpt:  # plan adds the one layer recomputed during backward: transient, not saved by the outer graph
                    predicted -= batch * seq * (20 * shape.hidden + 4 * shape.kv_hidden + 8 * shape.intermediate)
                rows.append(f"| {arch} | {h}/{inter}/{shape.kv_hidden}/{layers}/{vocab} | {batch} × {seq} | "
                            f"{'yes' if ckpt else 'no'} | {predicted / 2**20:.2f} | {measured / 2**20:.2f} | "
                            f"{predicted / measured:.3f} |")
    return rows


def model_states() -> list[str]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2

    rows = ["| params | GPUs (per node × nodes) | recipe | plan GPU GiB | DeepSpeed GPU GiB | ratio "
            "| plan host GiB | DeepSpeed host GiB | ratio |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in ("1B", "8.03B", "70B"):
        shape = planner.shape_for(name)
        p, big = shape.params, shape.largest_layer
        for gpn, nodes in ((1, 1), (8, 1), (8, 4)):
            ds = {"zero2": z2(p, gpn, nodes, cpu_offload=False)[::-1],
                  "zero2-offload": z2(p, gpn, nodes, cpu_offload=True)[::-1],
                  "zero3": z3(p, big, gpn, nodes, cpu_offload=False)[1::-1],
                  "zero3-offload": z3(p, big, gpn, nodes, cpu_offload=True, cpu_offload_params=True)[1::-1]}
            for recipe, (ds_gpu, ds_cpu) in ds.items():
                gpu, host = memory.model_states(recipe, None, shape, gpn * nodes, gpn)
                rows.append(f"| {name} | {gpn} × {nodes} | {recipe} | {gpu / 2**30:.2f} | {ds_gpu / 2**30:.2f} | "
                            f"{gpu / ds_gpu:.4f} | {host / 2**30:.1f} | {ds_cpu / 2**30:.1f} | {host / ds_cpu:.4f} |")
    return rows


def main() -> None:
    act, states = activations(), model_states()
    report.write("plan_accuracy", [
        *report.header("plan accuracy", "Measured by `python -m benchmarks.plan_accuracy` (CPU, bf16, torch SDPA; "
                       "ratio = predicted / measured)"),
        "## Activations: plan against the bytes autograd saves for backward", "", *act, "",
        "## Model states: plan against DeepSpeed's estimators (zero_init, buffer factor 1.5)", "", *states])


if __name__ == "__main__":
    main()
