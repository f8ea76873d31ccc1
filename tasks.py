"""dockyard tasks: flags → dockyard.<concern> → output. All logic lives in the package.

Modules are imported inside each task so `invoke --list` stays fast and the host never needs torch.
Every task docstring is its `invoke --help TASK` text.
"""

from __future__ import annotations

import functools
import sys

from invoke import Exit, task


def _settings(c):
    from dockyard.settings import load

    return load(c.config.get("dockyard", {}))


def _user_errors(fn):
    """Turn a DockyardError into a short message on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from dockyard.errors import DockyardError

        try:
            return fn(*args, **kwargs)
        except DockyardError as e:
            print(f"error: {e}", file=sys.stderr)
            raise Exit(code=e.exit_code) from None

    return wrapper


# --- images ----------------------------------------------------------------------------------

@task(help={"variant": "cpu, cu124, cu130 ... or all (default: all)",
            "dry": "print the uv command and write nothing"})
@_user_errors
def lock(c, variant="all", dry=False):
    """Resolve a variant's pins into its hash-pinned lock file, images/locks/<variant>.txt (uv, linux x86_64)."""
    from dockyard import build

    build.lock(_settings(c), variant, dry=dry)


@task(help={"variant": "auto (default), cpu, cu124, cu130 ...",
            "dry": "print the pip command and download nothing"})
@_user_errors
def wheelhouse(c, variant="auto", dry=False):
    """Download every wheel (and DeepSpeed's source) of a variant's lock into images/wheelhouse/<variant>/.

    The build installs only from there (--no-index), so copying this folder to an air-gapped build host
    is all it needs to build there too.
    """
    from dockyard import build

    build.wheelhouse(_settings(c), variant, dry=dry)


@task(help={"variant": "auto (default): the newest CUDA variant the driver supports, else cpu",
            "no_cache": "rebuild every layer",
            "dry": "print the exact commands and build nothing"})
@_user_errors
def build(c, variant="auto", no_cache=False, dry=False):
    """Build the image of a variant, tagged dockyard:<version>-<variant>.

    Fetches the wheelhouse first when it is missing. DeepSpeed ops are compiled in the image and the build
    fails if one is missing, or if torch/triton/deepspeed differ from the pins.
    """
    from dockyard import build as build_mod

    build_mod.build(_settings(c), variant, no_cache=no_cache, dry=dry)


@task(help={"mirror": "Debian mirror for the cpu base image (default: deb.debian.org)",
            "dry": "print what would be done"})
@_user_errors
def setup(c, mirror="http://deb.debian.org/debian", dry=False):
    """Prepare a fresh host: a Docker engine (installed and started as root on Debian/Ubuntu), the cpu
    base image (debootstrap, where no registry answers), and the wheelhouse of the auto variant."""
    from dockyard import setup as setup_mod

    setup_mod.setup(_settings(c), mirror=mirror, dry=dry)


# --- training --------------------------------------------------------------------------------

@task(help={"recipe": "which strategy (see `invoke recipes`); default zero2",
            "variant": "image variant; default auto",
            "nproc": "processes on this node: default one per GPU, or 2 on a CPU-only host",
            "nodes": "number of nodes (torchrun rendezvous); default 1",
            "node_rank": "this node's rank, 0..nodes-1",
            "master_addr": "address of node 0 (required with --nodes > 1)",
            "master_port": "rendezvous port on node 0 (default 29500)",
            "run_id": "name of the run folder (default: <recipe>-<timestamp>); an existing one is refused",
            "resume": "continue the run named by --run-id from its last checkpoint",
            "disable_require": "set NVIDIA_DISABLE_REQUIRE=1 (only when CUDA forward compatibility applies)",
            "native": "run the entry point on this host instead of in the image (for development)",
            "dry": "print the exact command and run nothing"})
@_user_errors
def run(c, recipe="zero2", variant="auto", nproc=0, nodes=1, node_rank=0, master_addr="",
        master_port=29500, run_id="", resume=False, disable_require=False, native=False, dry=False):
    """Train a recipe in the image, one process per GPU (torchrun). Trainer overrides go after `--`,
    e.g. `invoke run --recipe=zero2 -- --max_steps 50 --learning_rate 1e-4`."""
    from dockyard import launch

    launch.run(_settings(c), recipe=recipe, variant=variant, nproc=nproc, nodes=nodes,
               node_rank=node_rank, master_addr=master_addr, master_port=master_port, run_id=run_id,
               resume=resume, disable_require=disable_require, native=native, dry=dry, overrides=_remainder(c))


def _remainder(c) -> list[str]:
    import shlex

    return shlex.split(getattr(c, "remainder", "") or "")


@task
@_user_errors
def recipes(c):
    """List the recipes, each with the one line that says when to pick it."""
    from dockyard import recipes as recipes_mod

    recipes_mod.print_table(_settings(c))


@task(help={"variant": "image variant; default auto", "dry": "print the command and run nothing"})
@_user_errors
def shell(c, variant="auto", dry=False):
    """An interactive shell in the image, with the same mounts, user and flags as `invoke run`."""
    from dockyard import launch

    launch.shell(_settings(c), variant=variant, dry=dry)


# --- the machine -----------------------------------------------------------------------------

@task(help={"json": "print the checks as JSON instead of a table"})
@_user_errors
def doctor(c, json=False):
    """Check this host: Docker engine and BuildKit, NVIDIA runtime, GPUs and driver, which image variants the
    driver runs, /dev/shm and ulimits in a run container, the engine's free disk, the image's DeepSpeed ops.
    Each check says how to fix it; exits non-zero when one fails. A host without GPUs passes (cpu variant)."""
    from dockyard import doctor as doctor_mod
    from dockyard.errors import DockyardError

    checks = doctor_mod.run(_settings(c))
    print(doctor_mod.to_json(checks)) if json else doctor_mod.print_table(checks)
    failed = doctor_mod.failures(checks)
    if failed:
        raise DockyardError(f"{len(failed)} check(s) failed: {', '.join(f.name for f in failed)}")


@task(help={"model": "a local model folder (config.json; no weights are read) or a parameter count: 8B, 1.5B, 350M",
            "gpus": "GPUs per node (default: what NVML sees)",
            "gpu_mem": "GiB per GPU (default: what NVML sees)",
            "cpu_mem": "GiB of host memory per node (default: this host's)",
            "seq_len": "tokens per sequence (default 2048)",
            "batch": "sequences per GPU per step (default 1)",
            "json": "print the plan as JSON"})
@_user_errors
def plan(c, model="", gpus=0, gpu_mem=0.0, cpu_mem=0.0, seq_len=2048, batch=1, json=False):
    """Estimate GPU memory per device and host memory per node for every recipe (model states as DeepSpeed
    counts them, plus activations with and without gradient checkpointing), and recommend the fastest that fits."""
    from dockyard import plan as plan_mod

    result = plan_mod.run(model, gpus=gpus, gpu_mem_gib=gpu_mem, cpu_mem_gib=cpu_mem, seq_len=seq_len, batch=batch)
    print(plan_mod.to_json(result)) if json else plan_mod.print_plan(result)


# --- project ---------------------------------------------------------------------------------

@task(help={"k": "only tests matching this pytest -k expression", "x": "stop at the first failure"})
def test(c, k="", x=False):
    """Run the test suite (what .ci/run calls). Tests that need a GPU skip, saying why, where there is none."""
    args = [sys.executable, "-m", "pytest", "-ra", "tests"]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    import shlex

    c.run(shlex.join(args), pty=False)
