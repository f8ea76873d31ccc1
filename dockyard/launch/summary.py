"""A run's outcome in a few lines, for `invoke run`: the trainer's manifest, read as untrusted, said as status,
strategy, loss, throughput and peak memory, and a failed run raised as an error in the manifest's own words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.units import duration


def summarise(run_dir: Path, node_rank: int = 0, took: float | None = None,
              as_host: Callable[[str], str] = lambda text: text) -> dict:
    """Read the trainer's manifest (node 0's, or this node's on the others) and print the lines a user looks at;
    a failed run is an error, said with the manifest's own words. The manifest is read as untrusted (any
    container could have written it): checked with pydantic, never through a link. `took`: the seconds the
    command ran the trainer, said beside the status. `as_host`: the container's paths in the manifest's error said as
    this host's (engine.container_paths_shown; an image from before the trainer wrote them so)."""
    m = runfolder.read_manifest(run_dir, runfolder.manifest_file(node_rank))
    if m is None:
        log = (f"see {run_dir}/train.log" if (run_dir / runfolder.TRAIN_LOG).is_file() else
               "the trainer did not start on this node (the reason is above)")
        raise DockyardError(f"the run wrote no manifest ({run_dir / runfolder.manifest_file(node_rank)}): {log}")
    eff = (m.strategy.in_effect if m.strategy else None) or runfolder.InEffect()  # null: failed before the wrap
    met = m.metrics
    took_said = "" if took is None else f" {'in' if m.status == 'completed' else 'after'} {duration(took)}"
    print(f"run {m.run_id}: {m.status}{took_said} · recipe {m.recipe} · world size {m.world_size} on {m.nodes} node(s)"
          + (f" · {eff.engine}" if eff.engine else "")
          + (f" ZeRO-{eff.zero_stage}" if eff.zero_stage is not None else "")
          + "".join(f", {what} offloaded to {to}" for what, to in (("optimizer", eff.offload_optimizer),
                                                                   ("parameters", eff.offload_param))
                    if to in ("cpu", "nvme"))
          + _adapters(m)
          + (f" · compiled {eff.compiled.split(' (')[0]}" if eff.compiled else "")
          + _from_cache(met.compile_cache if met else None)
          + (" · stopped before its strategy took effect" if not eff.engine and m.status != "completed" else ""))
    diverged = met.loss_non_finite_at_step if met else None
    if met and (diverged is not None or (met.loss_first is not None and met.loss_last is not None)):
        # a run that failed early logged no loss; a failed run measured no throughput (null): no rate, not 0 tokens/s;
        # a diverged run's losses are null where they were not finite
        def loss(x: float | None) -> str:
            return f"{x:.4f}" if x is not None else "not finite"

        print(f"  steps {met.steps} · loss {loss(met.loss_first)} → {loss(met.loss_last)}"
              + (f" · {met.tokens_per_second:.0f} tokens/s {_rate_kind(met, _resumed_at(m))}" if met.tokens_per_second is not None
                 else " · no throughput measured")
              + (f" · MFU {met.mfu:.1%}" if met.mfu else "") + " · " + _peak(met))
    if m.profile and len(m.profile.steps) == 2:
        busy = (f"GPU busy {m.profile.gpu_busy:.0%} of it, by kind of kernel" if m.profile.gpu_busy is not None
                else "CPU operators only")
        print(f"  profile of steps {m.profile.steps[0]}-{m.profile.steps[1]}: {busy} in "
              f"{run_dir / runfolder.PROFILE / runfolder.PROFILE_SUMMARY}")
    if diverged is not None:
        print(f"  warning: the loss became non-finite at step {diverged}: the run diverged (the model it saved is not "
              "usable); lower --learning_rate (and keep --max_grad_norm above 0)")
    print(f"  {run_dir}")
    if m.status != "completed":
        raise DockyardError(f"run {m.run_id} {m.status}: {as_host(m.error or f'see {run_dir}/train.log')}")
    merge = " (--merge: one model with the adapters in it)" if _adapters(m) else ""
    native = " --native" if m.variant in runfolder.NATIVE_VARIANTS else ""  # export refuses a native run's export without it
    print(f"  next: invoke export --run={m.run_id}{native}{merge} writes its model as a plain Hugging Face folder")
    return m.model_dump()


def _peak(met: runfolder.MetricsRecord) -> str:
    """The peak memory as measured: torch's GPU pool of the largest rank, or the largest process's RSS on CPU."""
    size = met.peak_memory_bytes or 0
    shown = f"{size / 2**30:.1f} GiB" if size >= 10 * 2**30 else f"{size / 2**20:.0f} MiB"
    largest = f"the largest: rank {met.peak_memory_rank}" if met.peak_memory_rank is not None else None
    kind = {"rss": f"peak RSS {{}} ({largest or 'the largest process'})",
            "gpu_reserved": f"peak GPU memory {{}} (reserved, {largest or 'the largest rank'})"}.get(
        met.peak_memory_kind or "", "peak memory {}")
    return kind.format(shown)


def _adapters(m: runfolder.RunManifest) -> str:
    """What a LoRA or QLoRA run trained: adapters, on a base held in 4 bits (as the model record measured it)."""
    peft = m.strategy.peft if m.strategy else None
    if peft not in ("lora", "qlora"):
        return ""
    layers = m.model.quantized_layers if m.model else None
    return " + LoRA adapters" + (f" on a 4-bit base ({layers} layers)" if peft == "qlora" and layers else
                                 " on a 4-bit base" if peft == "qlora" else "")


def _resumed_at(m: runfolder.RunManifest) -> int:
    """The step this attempt resumed from (0: it started the run): its tokens/s counts the steps after it alone."""
    return (m.resumed.step or 0) if m.resumed else 0


def _rate_kind(met: runfolder.MetricsRecord, resumed_at: int = 0) -> str:
    """What the run's tokens/s is: its steady state, or (a run of a few steps) one that holds the warm-up; for a resume,
    of the steps it trained since (the rate of the steps before is the earlier attempt's, in metrics.jsonl)."""
    steady = met.steady_state
    since = f"since the resume at step {resumed_at}" if resumed_at else ""
    included = steady.profiled_steps_included if steady else None
    if included and len(included) == 2:
        return (f"(the profiled steps {included[0]}-{included[1]} included, slowed by the profiler: too few other "
                f"steps{' ' + since if since else ''} to leave them out)")
    steps = "" if not (steady and steady.from_step and steady.to_step) else (
        f"step {steady.to_step}" if steady.from_step == steady.to_step else f"steps {steady.from_step}-{steady.to_step}")
    if steady and steady.warm_up_left_out is False:
        if steps and steady.from_step > resumed_at + 1:  # only the attempt's first window was left out
            return (f"({steps}{' ' + since if since else ''}, part of the warm-up included: too few steps to leave "
                    "all of it out)")
        if since:
            return f"({steps + ' ' if steps else 'steps '}{since}, all of them warm-up: too few to leave it out)"
        return "(warm-up included: too few steps to leave it out)"
    left_out = steady.profiled_steps_left_out if steady else None
    profiled = (f", the profiled steps {left_out[0]}-{left_out[1]} left out" if left_out and len(left_out) == 2
                else "")
    if since:
        return f"(steady state{' of ' + steps if steps else ''}, {since}{profiled})"
    return f"(steady state{profiled})"


def _from_cache(use: dict[str, int] | None) -> str:
    """How many of the graphs the run compiled came from the compile cache (caches.py), where it compiled any."""
    built = sum((use or {}).get(k, 0) for k in ("hits", "misses", "bypassed"))
    return f" ({use.get('hits', 0)} of {built} graphs from the compile cache)" if built else ""
