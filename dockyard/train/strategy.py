"""What is really running, read from the wrapped model, against what the recipe asked for.

Never trust the requested strategy: asked for FSDP on CPU, the HF Trainer silently wraps the model in
DistributedDataParallel instead. So after the Trainer has wrapped the model we look at the objects
themselves (the DeepSpeed engine and its ZeRO optimizer, FSDP's wrappers, DDP) and stop on a mismatch.
"""

from __future__ import annotations

from typing import Any

from dockyard.common import recipes
from dockyard.common.errors import DockyardError

FIELDS = ("engine", "zero_stage", "offload_optimizer", "offload_param", "fsdp_version")


def describe(engine: str, zero_stage: int | None = None, offload_optimizer: str | None = None,
             offload_param: str | None = None, fsdp_version: int | None = None) -> dict[str, Any]:
    return {"engine": engine, "zero_stage": zero_stage, "offload_optimizer": offload_optimizer,
            "offload_param": offload_param, "fsdp_version": fsdp_version}


def expected(strategy_name: str, world_size: int) -> dict[str, Any]:
    """What a recipe's strategy must look like once the Trainer has wrapped the model (from the registry)."""
    return recipes.strategy(strategy_name).in_effect(world_size)


def in_effect(wrapped: Any) -> dict[str, Any]:
    """Read the strategy from the model object the Trainer trains (trainer.model_wrapped)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    # torch_compile wraps the DDP (or single) model in an OptimizedModule (accelerate compiles last): look inside.
    while isinstance(getattr(wrapped, "_orig_mod", None), torch.nn.Module):
        wrapped = wrapped._orig_mod
    try:
        from deepspeed import DeepSpeedEngine
    except ImportError:  # a stack without DeepSpeed cannot be running it
        DeepSpeedEngine = ()
    if DeepSpeedEngine and isinstance(wrapped, DeepSpeedEngine):
        return _deepspeed(wrapped)
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    inner = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
    if isinstance(wrapped, FullyShardedDataParallel):
        return describe("fsdp", fsdp_version=1)
    if isinstance(inner, torch.nn.Module) and any(isinstance(m, FSDPModule) for m in inner.modules()):
        return describe("fsdp", fsdp_version=2)
    if isinstance(wrapped, DistributedDataParallel):
        return describe("ddp")
    return describe("single")


def compiled(wrapped: Any) -> str | None:
    """How torch.compile applies to the model the Trainer trains, read from the objects: the whole model (one
    OptimizedModule around it), block by block (compiled submodules: torch.compile's wrappers, or the in-place
    Module.compile DeepSpeed's and FSDP2's regional compilation use), or not at all (None)."""
    import torch

    if isinstance(wrapped, torch._dynamo.eval_frame.OptimizedModule):
        return "the whole model"
    n = sum(1 for m in wrapped.modules() if isinstance(m, torch._dynamo.eval_frame.OptimizedModule)
            or getattr(m, "_compiled_call_impl", None) is not None)
    return f"block by block ({n} modules)" if n else None


def compile_cache_use() -> dict[str, int] | None:
    """The graphs torch.compile's inductor has built in this process so far: loaded from its cache (`hits`, the
    compile cache `invoke run` mounts), compiled (`misses`), or compiled where the cache cannot serve (`bypassed`);
    None where nothing was compiled."""
    from torch._dynamo.utils import counters

    c = counters["inductor"]
    use = {"hits": c["fxgraph_cache_hit"], "misses": c["fxgraph_cache_miss"], "bypassed": c["fxgraph_cache_bypass"]}
    return use if any(use.values()) else None


def _deepspeed(engine: Any) -> dict[str, Any]:
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    opt = engine.optimizer
    # The stage the optimizer really implements, not the one the config names.
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3):
        stage, off_opt, off_param = 3, opt.offload_optimizer, opt.offload_param
    elif isinstance(opt, DeepSpeedZeroOptimizer):
        stage, off_opt, off_param = engine.zero_optimization_stage(), opt.cpu_offload, False
    else:
        stage, off_opt, off_param = 0, False, False

    def device(flag: bool, cfg: Any) -> str | None:
        return (str(getattr(cfg.device, "value", cfg.device)) if cfg is not None else "cpu") if flag else None

    return describe("deepspeed", zero_stage=stage,
                    offload_optimizer=device(off_opt, engine.zero_offload_optimizer()),
                    offload_param=device(off_param, engine.zero_offload_param()))


def check(strategy: str, actual: dict[str, Any], world_size: int) -> None:
    want = expected(strategy, world_size)
    if world_size == 1 and want["engine"] == "single" and actual["engine"] == "ddp":
        # accelerate wraps even one CPU process in DDP (torchrun's variables make it MULTI_CPU): with nobody to
        # talk to, that is the single-process run asked for
        actual = {**actual, "engine": "single"}
    wrong = [f"{k}: asked {want[k]!r}, running {actual[k]!r}" for k in FIELDS if want[k] != actual[k]]
    if wrong:
        raise DockyardError(
            f"strategy mismatch: the recipe asks for {strategy} but the Trainer is running {actual['engine']} "
            f"({'; '.join(wrong)}). Stopped instead of training with another strategy. "
            f"{_hint(strategy, actual)}".strip())


def _hint(strategy: str, actual: dict[str, Any]) -> str:
    if recipes.strategy(strategy).engine == "fsdp" and actual["engine"] == "ddp":
        return "The HF Trainer runs FSDP only on GPUs (on CPU it falls back to DDP): run this recipe on GPUs."
    return ""
