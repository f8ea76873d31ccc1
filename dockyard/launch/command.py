"""The command that trains one node, built without running anything: `docker run` of the image, or --native's
torchrun on this host (RunCommand), and the host checks the image's command needs first (GPUs, the NVIDIA runtime,
the driver against the image's CUDA).

docker_run_argv is the one place that builds a `docker run`: `invoke run` and `invoke shell` (dockyard.launch.run),
run.sh (runscript), export and doctor's probes all ask it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dockyard import engine
from dockyard.common import envvars
from dockyard.common.errors import DockyardError
from dockyard.gpus import Host, docker_gpus
from dockyard.images import variants
from dockyard.images.variants import Variant
from dockyard.launch import caches, inputs, multinode, node, scriptwords
from dockyard.launch.node import CPU_NPROC, Rendezvous
from dockyard.settings import ROOT, Settings


@dataclass
class RunCommand:
    """What trains one node: the argv (and for --native its environment), and the run folder it writes."""

    argv: list[str]
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Topology:
    """This node's processes and where the nodes meet, checked (validate_topology)."""

    nproc: int
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = node.PORT
    rendezvous: Rendezvous | None = None  # several nodes: torchrun's c10d rendezvous
    max_restarts: int = 0  # one node: torchrun's restarts (several: in the rendezvous' flags)


def run_command(settings: Settings, *, recipe: str, variant: Variant, host: Host, engine_info: dict,
                topo: Topology, run_dir: Path, overrides: list[str], resume: bool = False,
                disable_require: bool = False, image_id: str = "", memlock: str = "memlock=-1",
                cpu: bool = False, data: str = "", model: str = "", checkout_recipes: bool = True,
                ib_root: Path = multinode.INFINIBAND, summarised: bool = True,
                fabric: dict[str, str] | None = None) -> RunCommand:
    """The `docker run` that trains `recipe` in the image of `variant` (pure: runs nothing).

    `cpu`: no GPU even in a CUDA image (gloo, DeepSpeed's CPU accelerator): checks an image's stack on a
    host without GPUs. `checkout_recipes`: this checkout's recipes/ over the image's (run.sh has no checkout).
    `recipe` is --recipe as given (a name or a folder), which run() has already loaded. `summarised`: the command
    prints the run's summary (`invoke run`; run.sh does not), so the trainer need not. `fabric`: the node's NCCL_*, FI_*
    and UCX_* settings (node.fabric_env) where it is a node of several, given on as they are, a file one names mounted
    read-only where it is (node.fabric_files); no other variable of the host's reaches the trainer."""
    if not cpu:
        check_gpu_host(settings, variant, host, engine_info, disable_require)
    image = variants.tag(settings, variant)
    seen = inputs.read_only_mounts(settings, recipe, overrides, data=data, model=model, checkout_recipes=checkout_recipes)
    env = {envvars.IMAGE_REF: image, envvars.IMAGE_ID: image_id, envvars.VARIANT: variant.name,
           **({envvars.SUMMARISED: "1"} if summarised else {})}
    if disable_require:
        env["NVIDIA_DISABLE_REQUIRE"] = "1"
    if cpu and variant.is_cuda:
        env["DS_ACCELERATOR"] = "cpu"  # the image says cuda; DeepSpeed would look for a GPU
    env |= node_env(topo) | (fabric or {})
    gpu = variant.is_cuda and not cpu
    command = torchrun_argv(topo) + node.entry_argv(seen.recipe, node.run_dir_inside(run_dir.name), seen.overrides,
                                                    resume)
    argv = docker_run_argv(settings, image, gpus=gpu and docker_gpus(host), run_dir=run_dir,
                           name=container_name(run_dir.name, topo.nodes, topo.node_rank),
                           env=env, network_host=topo.nodes > 1, interactive="", command=command,
                           mounts=[*seen.volumes, *node.fabric_files(fabric or {})], engine_info=engine_info,
                           memlock=memlock,
                           devices=multinode.infiniband_flags(ib_root) if gpu and topo.nodes > 1 else [],
                           compile_cache=True, host_paths=True)  # every folder mounted, as run.sh names them
    return RunCommand(argv, run_dir)


def native_command(settings: Settings, *, recipe: str, topo: Topology, run_dir: Path, overrides: list[str],
                   resume: bool = False, cpu: bool = True, data: str = "", model: str = "",
                   visible: str = "", fabric: dict[str, str] | None = None) -> RunCommand:
    """The same entry point on this host, without a container (development, or GPU hosts without Docker); `recipe`
    as in run_command; `visible`: the GPUs picked (--gpus, --nproc), by nvidia-smi's indices; `fabric`: as in
    run_command (this host's environment is the trainer's already: given, its NCCL_SOCKET_IFNAME is the user's)."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), envvars.SUMMARISED: "1"}
    # on GPUs the trainer refuses a torch that finds none (a CPU build, a driver older than its CUDA): it trained on
    # CPU and said completed
    env["DS_ACCELERATOR"] = "cpu" if cpu else "cuda"
    if visible and not cpu:  # `--native --gpus=2,3` trained on GPUs 0 and 1; CUDA counts in nvidia-smi's order so
        env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible}
    env |= node_env(topo) | (fabric or {})
    launcher = [sys.executable, "-m", "dockyard.train.torchrun"]  # torchrun, without its traceback on a failure
    # the inputs given by flag or by invoke.yaml (a run in the image mounts both; the trainer reads neither setting,
    # and a native run with `model:` set trained the sample model); those after -- are in the overrides already, and
    # the recipe's own the trainer reads from the recipe
    given = list(inputs.resolved(settings, overrides, data=data, model=model))
    for _, value, where in given:  # no script carries them, but the terminal and the manifest would, as they are
        scriptwords.one_line(value, where, "which would reach the terminal as it is where the run prints it; rename it")
    overrides = [*overrides, *(a for key, value, where in given if not where.startswith("-- ") for a in (f"--{key}", value))]
    return RunCommand(torchrun_argv(topo, launcher) + node.entry_argv(recipe, str(run_dir), overrides, resume), run_dir,
                      env)


def docker_run_argv(settings: Settings, image: str, *, gpus: bool | str, run_dir: Path | None, name: str,
                    env: dict[str, str], network_host: bool, interactive: str, command: list[str],
                    mounts: list[tuple[Path, str, bool]], engine_info: dict, memlock: str | None = None,
                    devices: list[str] | None = None, compile_cache: bool = False, keep: bool = False,
                    host_paths: bool = False) -> list[str]:
    """Every `docker run` of the project: same flags for training, `invoke shell` and doctor's probes.
    `engine_info`: `docker info` of the engine that runs it (rootless or remapped, it decides the user), {} on --dry.
    `compile_cache`: mount it (what trains); caches.prepare() makes the folders first. `interactive`: "tty" (a
    terminal, -it), "stdin" (the commands piped in, -i), or "" (none). `keep`: the container is not removed when it
    ends (`invoke shell --keep`, to commit it). `host_paths`: tell the trainer the host path of every folder mounted
    (DOCKYARD_HOST_PATHS, from the -v list itself), which it writes into train.log and the manifest's error."""
    memlock = memlock or memlock_flag(engine.daemon_memlock_hard_limit(engine_info), say=False)
    argv = engine.docker(settings, "run", *([] if keep else ["--rm"]), "--init", *engine.host_sharing_flags(engine_info),
                         "--ulimit", memlock, "--ulimit", "stack=67108864", "--name", name)
    if interactive:
        argv += ["-it"] if interactive == "tty" else ["-i"]
    if gpus:
        argv += ["--gpus", gpus if isinstance(gpus, str) else "all"]  # a str: gpus.docker_gpus()
    if network_host:  # the host's /etc/hosts is the container's: an --add-host would replace it with docker's own
        argv += ["--network", "host"]
    else:
        argv += ["--add-host", ":".join(node.LOOPBACK_V4MAPPED)]
    argv += devices or []  # multinode.infiniband_flags()
    # docker's -v splits on ':' (the user's files and recipes are checked where they are named: inputs.py)
    vols = caches.volumes(settings, compile_cache, runs=run_dir.parent if run_dir is not None else None) + mounts
    if host_paths:
        env = {**env, envvars.HOST_PATHS: json.dumps({inside: str(host) for host, inside, _ in vols}, sort_keys=True)}
    cache_env = caches.compile_env(settings) if compile_cache else {}
    for k, v in {**node.container_env(), **cache_env, **env}.items():
        argv += ["-e", f"{k}={v}"]
    for host_path, target, ro in vols:
        argv += ["-v", f"{host_path}:{target}{':ro' if ro else ''}"]
    return argv + ["-w", node.WORKDIR, image, *command]


def validate_topology(nproc: int, nodes: int, node_rank: int, master_addr: str, master_port: int,
                      host: Host, variant: Variant, cpu: bool = False) -> Topology:
    """The node's processes (one per GPU, all of them when --nproc is not given; CPU_NPROC on CPU) and the flags of
    several nodes, checked against this host."""
    node.check_nodes(nodes)
    if nodes > 1 and not master_addr:
        raise DockyardError("--nodes > 1 needs --master-addr: the address of node 0, reachable from every node")
    node.check_rank_and_port(node_rank, nodes, master_port)
    if variant.is_cuda and not cpu:
        if not host.gpus:
            raise no_gpus(variant, host)
        if nproc > host.count:  # of the GPUs chosen, where chosen: "this host has 1" read as a GPU unseen
            has = (f"{host.count} GPU(s) are chosen ({host.visible}, by --gpus or CUDA_VISIBLE_DEVICES)" if host.visible
                   else f"this host has {host.count} GPU(s)")
            raise DockyardError(f"--nproc={nproc} but {has}: one process per GPU")
        nproc = nproc or host.count
    else:
        nproc = nproc or CPU_NPROC
    if nproc < 1:
        raise DockyardError(f"--nproc must be at least 1 (got {nproc})")
    return Topology(nproc, nodes, node_rank, master_addr, master_port)


def container_name(run_id: str, nodes: int, node_rank: int) -> str:
    """The run's container: dockyard-<run-id>, and its node's rank where the run has several nodes, so that two of
    them on one host (a test of several nodes on one machine) are not refused by docker as one name used twice."""
    return f"dockyard-{run_id}" + (f"-node{node_rank}" if nodes > 1 else "")


def torchrun_argv(topo: Topology, launcher: list[str] | None = None) -> list[str]:
    """torchrun for this node: alone, or through the rendezvous of several (multinode.rendezvous())."""
    return node.torchrun_argv(topo.nproc, topo.nodes, topo.rendezvous.torchrun_flags() if topo.nodes > 1 else None,
                              launcher, max_restarts=topo.max_restarts)


def node_env(topo: Topology) -> dict[str, str]:
    """What the trainer of a node of several reads: the rendezvous, and which node it is."""
    if not topo.rendezvous:
        return {}
    # and how long the nodes wait to see each other's files in the run folder, where the user said
    shared = {envvars.SHARED_TIMEOUT: f"{envvars.shared_timeout():g}"} if os.environ.get(envvars.SHARED_TIMEOUT) else {}
    return topo.rendezvous.env() | {envvars.NODE_RANK: str(topo.node_rank)} | shared


def memlock_flag(daemon_hard_limit: int | None, say: bool = True) -> str:
    """Unlimited locked memory (NCCL, RDMA, pinned buffers), or the most the engine can grant. An engine reached
    through DOCKER_HOST has limits this host cannot read: DOCKYARD_MEMLOCK=BYTES says them (as for compose). `say`:
    note a limit, for GPU runs (a CPU run needs no locked memory: doctor passes it)."""
    daemon_hard_limit = memlock_given(daemon_hard_limit)
    if daemon_hard_limit is None:
        return "memlock=-1"
    if say:
        print(f"note: dockerd's hard memlock limit is {daemon_hard_limit} bytes, so containers get that, not "
              "unlimited; for NCCL/RDMA set LimitMEMLOCK=infinity for the docker service (systemctl edit docker)",
              file=sys.stderr)
    return f"memlock={daemon_hard_limit}"


def memlock_given(daemon_hard_limit: int | None) -> int | None:
    """The engine's hard memlock limit in bytes as DOCKYARD_MEMLOCK says it, where set (-1 or `unlimited`: none, as
    compose reads -1), else `daemon_hard_limit`; None: unlimited."""
    value = os.environ.get(envvars.MEMLOCK, "").strip()
    if not value:
        return daemon_hard_limit
    if value.lower() in ("-1", "unlimited"):
        return None
    if not re.fullmatch(r"[0-9]{1,18}", value):  # docker reads an int64
        raise DockyardError(f"{envvars.MEMLOCK}={value!r}: give the engine's hard memlock limit in bytes (a whole "
                            "number, 0 or more), or -1 or `unlimited` where it has none")
    return int(value)


def check_gpu_host(settings: Settings, variant: Variant, host: Host, engine_info: dict,
                   disable_require: bool) -> None:
    """Refuse before starting what would fail inside the container with a cryptic message."""
    if not variant.is_cuda:
        return
    if not host.gpus:
        raise no_gpus(variant, host)
    # engine_info is {} on `run --dry`, which asks no engine: nothing known about its runtimes then
    if engine_info and "nvidia" not in (engine_info.get("Runtimes") or {}) \
            and not engine.which("nvidia-container-runtime-hook"):
        raise DockyardError(
            "GPUs found, but the Docker engine has no NVIDIA runtime (`docker info` lists none): install the "
            "NVIDIA Container Toolkit, run `sudo nvidia-ctk runtime configure --runtime=docker`, restart dockerd")
    # the GPUs first: a torch without their code runs on no driver, and a V100 on 535 given cu132 was told to
    # upgrade the driver to 580, after which it was refused for this
    lacking = variants.gpus_without_code(variants.cuda_archs(variant), host)
    if lacking:
        raise DockyardError(
            f"image {variant.name}'s torch has no code for {', '.join(lacking)} (it holds "
            f"{variants.cuda_archs(variant)}): use --variant=auto (picks one that has), or --gpus to leave it out")
    if variants.driver_runs(variant.cuda, host) is False and not disable_require:  # None: cannot tell, the user chose
        raise DockyardError(driver_too_old(settings, variant, host))


def check_require(tag: str, variant: Variant, image: dict | None, host: Host) -> None:
    """An image (`image`, its inspect) whose NVIDIA_REQUIRE_CUDA leaves this driver out: docker's refusal at start,
    said before anything starts, with the way out (run and shell; --disable-require skips it)."""
    unmet, way_out = variants.require_unmet(variant, image, host)
    if unmet:
        raise DockyardError(f"image {tag} {unmet}. {way_out}")


def no_gpus(variant: Variant, host: Host) -> DockyardError:
    """A CUDA variant asked for on a host where NVML sees no GPU: why, and what to run instead."""
    return DockyardError(f"variant {variant.name} needs NVIDIA GPUs but {host.error or 'NVML sees none'}; "
                         "use --variant=cpu (or --cpu to try this image's stack on CPU)")


def driver_too_old(settings: Settings, variant: Variant, host: Host) -> str:
    """Why `variant` cannot run on this driver, naming the variant that does (as run.sh names the image to load) and
    the driver it needs. NVIDIA_DISABLE_REQUIRE only lifts the toolkit's check: a CUDA build newer than the driver
    then runs only on CUDA's forward-compatibility libraries inside the image, which a registry-free build lacks, so
    torch would find no usable GPU."""
    instead = variants.runs_instead(settings, host)
    least = variants.MIN_DRIVER.get(variants.cuda_version(variant.cuda)[0])
    use = (f"use --variant={instead.name} (CUDA {instead.cuda}, which this driver runs; --variant=auto picks it) or "
           if instead else "")
    return (f"image {variant.name} needs CUDA {variant.cuda} but {variants.short_of(variant.cuda, host)}: {use}"
            f"upgrade the driver{f' to {least} or newer' if least else ''}. --disable-require starts it anyway, which helps only "
            "an image holding CUDA's forward-compatibility libraries (an nvidia/cuda base's /usr/local/cuda/compat; "
            "the Debian-based builds hold none)")
