"""GPU kernels in a torch.profiler trace (Chrome trace format, as Kineto writes it: `kernel`, `gpu_memcpy` and
`gpu_memset` events with `ts` and `dur` in µs, `tid` the CUDA stream): how long the GPU was busy, with what kind
of work, and when. Read by the trainer (profile_steps' summary, dockyard.train.profiler) and by the host (the
profile's timeline plot, dockyard.launch.monitor). Torch-free."""

from __future__ import annotations

from typing import Any

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
# Kinds of GPU kernel, told from their names (a heuristic: cuBLAS, CUTLASS, FlashAttention, NCCL, torch.compile's
# inductor and Liger name their kernels so), first match wins; the rest are elementwise work, norms, activations, losses,
# reductions. Inductor's own Triton kernels: triton_poi_ (pointwise), triton_red_ and triton_per_ (reductions), each
# fusing many operators (their names list them, attention's softmax or scaling among them: hence before attention);
# triton_tem_ its templates (matmuls, and flex attention, which says so).
KINDS = (("communication", ("nccl",)),
         ("fused by torch.compile", ("triton_poi_", "triton_red_", "triton_per_")),
         # Liger's Triton kernels, named after their Python functions: its norms, SwiGLU/GeGLU, RoPE and the loss
         # (cross-entropy and the gradient scaling of its fused linear cross-entropy)
         ("Liger's kernels", ("liger_", "_rms_norm_forward", "_rms_norm_backward", "_swiglu_", "_geglu_",
                              "element_mul_kernel", "_triton_rope", "_layer_norm_forward", "_layer_norm_backward")),
         ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),  # before matmul: fmha_cutlass..., cuDNN's
         ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "cublas", "xmma", "matmul", "splitk", "triton_tem_")),
         ("optimizer", ("multi_tensor_apply", "adam")),
         ("memory copies", ("memcpy", "memset")))
OTHER = "other kernels"


def gpu_events(trace: Any) -> list[dict[str, Any]]:
    """The trace's GPU kernels and copies that have a start and a duration (anything else in it is skipped: a
    trace may come from anywhere)."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    return [e for e in events or [] if isinstance(e, dict) and e.get("cat") in GPU_EVENTS and _timed(e)]


def _timed(e: dict[str, Any]) -> bool:
    return all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool) for k in ("ts", "dur"))


def gpu_time(trace: Any) -> dict[str, Any] | None:
    """The span of everything the trace recorded, the time at least one GPU kernel (or copy) ran within it, each
    counted once where streams overlap, and each kind's kernel time, all in µs. None when no GPU work was recorded
    (a CPU run)."""
    gpu = gpu_events(trace)
    if not gpu:
        return None
    timed = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and _timed(e)]
    span = max(e["ts"] + e["dur"] for e in timed + gpu) - min(e["ts"] for e in timed + gpu)
    busy, end = 0.0, float("-inf")
    for e in sorted(gpu, key=lambda e: e["ts"]):  # the union of the kernels' intervals
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    kinds: dict[str, float] = {}
    for e in gpu:
        kind = event_kind(e)
        kinds[kind] = kinds.get(kind, 0.0) + e["dur"]
    return {"span_us": max(span, 1e-9), "busy_us": busy, "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]))}


ALL = "all kernels"


def timeline(trace: Any) -> dict[str, list[tuple[float, float]]]:
    """Each CUDA stream's kernels as (start, duration) in ms from the first GPU event: all of them (the gaps are
    the stream waiting), then each kind's, in KINDS' order: {"stream 7 / all kernels": [...], "stream 7 /
    matmul": [...], ...}; empty without GPU work."""
    gpu = gpu_events(trace)
    if not gpu:
        return {}
    t0 = min(e["ts"] for e in gpu)
    order = [ALL] + [kind for kind, _ in KINDS] + [OTHER]
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e in sorted(gpu, key=lambda e: e["ts"]):
        stream, at = str(e.get("tid"))[:12], ((e["ts"] - t0) / 1000, e["dur"] / 1000)
        for kind in (ALL, event_kind(e)):
            rows.setdefault((stream, order.index(kind)), []).append(at)
    return {f"stream {stream} / {order[i]}": rows[stream, i] for stream, i in sorted(rows)}


TIMELINE_POINTS = 2000  # per row: intervals closer than the profiled span / this are drawn as one (sub-pixel gaps)
TIMELINE_ROWS = 64      # streams x kinds a timeline may hold (a GPU run uses a handful of streams)


def timeline_record(trace: Any) -> dict[str, Any] | None:
    """What the timeline plot needs, small whatever the trace's size: each row of `timeline` with its intervals
    closer than the span / TIMELINE_POINTS merged (at most TIMELINE_POINTS + 1 a row: their gaps fill the span), and
    the share of the span the GPU was busy. The trainer writes it beside the trace (profile/timeline.json), so that
    the host draws from it and never parses a trace of hundreds of MB. None without GPU work."""
    busy = gpu_time(trace)
    if busy is None:
        return None
    rows = timeline(trace)
    gap = busy["span_us"] / 1000 / TIMELINE_POINTS
    return {"busy": busy["busy_us"] / busy["span_us"],
            "rows": {name: _merged(at, gap) for name, at in list(rows.items())[:TIMELINE_ROWS]}}


def _merged(intervals: list[tuple[float, float]], gap: float) -> list[list[float]]:
    """(start, duration) intervals sorted by start, those less than `gap` apart drawn as one."""
    out: list[list[float]] = []
    for start, dur in intervals:
        if out and start - (out[-1][0] + out[-1][1]) < gap:
            out[-1][1] = max(out[-1][1], start + dur - out[-1][0])
        else:
            out.append([start, dur])
    return [[round(start, 4), round(dur, 4)] for start, dur in out]


def event_kind(e: dict[str, Any]) -> str:
    return kernel_kind(str(e.get("name", "")), e.get("cat") != "kernel")


def kernel_kind(name: str, copy: bool = False) -> str:
    """What a GPU kernel does, told from its name (KINDS)."""
    if copy:
        return "memory copies"
    low = name.lower()
    return next((kind for kind, words in KINDS if any(w in low for w in words)), OTHER)
