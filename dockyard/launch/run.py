"""`invoke run` and `invoke shell`: check the request, then dispatch it.

A run is: pick the variant → check what would fail later (the host's GPUs and driver, the topology, the trainer's
settings, the inputs, the disk: dockyard.launch.preflight) → the command that trains (dockyard.launch.command:
`docker run` of `torchrun ... -m dockyard.train`, or --native on this host) → claim runs/<run-id>/ → run it under the
monitor → summarise the manifest the trainer wrote (dockyard.launch.summary). `--dry` stops at the command, printed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import reprlib
import shlex
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dockyard import engine, gpus
from dockyard.common import autos, cores, disk, envvars, runfolder
from dockyard.common.errors import DockyardError, cut
from dockyard.common.recipes import RECIPES, load_recipe
from dockyard.gpus import Host, docker_gpus, read_host, select
from dockyard.images import build, variants
from dockyard.images.variants import Variant
from dockyard.launch import caches, inputs, monitor, multinode, node, preflight
from dockyard.launch.command import (
    RunCommand,
    check_gpu_host,
    check_require,
    container_name,
    docker_run_argv,
    memlock_flag,
    native_command,
    run_command,
    validate_topology,
)
from dockyard.launch.runs import newest_runs
from dockyard.launch.summary import summarise
from dockyard.settings import Settings

DEFAULT_RECIPE = "zero2"  # a new run's, when --recipe is not given


@dataclass(frozen=True)
class RunRequest:
    """What `invoke run` was asked, its flags already checked (dockyard/flags.py): the one object tasks.py passes."""

    recipe: str = ""  # not given: DEFAULT_RECIPE, or on --resume the run's own
    variant: str = "auto"
    nproc: int = 0
    nodes: int = 1
    node_rank: int = 0  # -1: not given (required with several nodes)
    master_addr: str = ""
    master_port: int = node.PORT
    run_id: str = ""
    resume: bool = False
    dry: bool = False
    native: bool = False
    cpu: bool = False
    disable_require: bool = False
    gpus: str = ""
    data: str = ""
    model: str = ""
    iface: str = ""
    join_timeout: int = node.JOIN_TIMEOUT
    max_restarts: int = 0
    overrides: tuple[str, ...] = ()


def run(settings: Settings, r: RunRequest) -> dict | None:
    """`invoke run`: validate the request (topology, what the trainer would refuse, disk) into the command that trains,
    then dispatch it: print it (--dry), or run it and summarise the run from its manifest."""
    r = replace(r, node_rank=node.given_rank(r.node_rank, r.nodes))  # -1, not given: 0 on one node (refused on more)
    command, devices = prepare(settings, r)
    if r.dry:
        engine.echo(command.argv, command.env)
        return None
    return execute(settings, r, command, devices)


def prepare(settings: Settings, r: RunRequest) -> tuple[RunCommand, list[int]]:
    """Every check a run passes before anything is made, and the command that trains (in the image, or --native on this
    host), with the GPUs it is given by index ([] on CPU: the monitor watches no other). Runs nothing, makes nothing.
    `r`: its node rank settled (run)."""
    overrides = list(r.overrides)
    if r.cpu and r.gpus.strip():
        raise DockyardError(f"--gpus={cut(r.gpus, 60)} picks GPUs to train on, and --cpu trains on none: give one of them")
    every = read_host()
    host = select(every, r.gpus)
    hidden = "" if r.gpus.strip() or r.cpu else gpus.hidden_by_environment(every, host)
    if len(host.gpus) == 1 and r.gpus.strip() == str(host.gpus[0].index) and host.gpus[0].index > 1:  # two meant?
        n = host.gpus[0].index
        print(f"--gpus={n} is GPU {n} alone (--gpus takes indices, as CUDA_VISIBLE_DEVICES); {n} GPUs: "
              f"--gpus={','.join(map(str, range(n)))}", file=sys.stderr)
    if r.native:
        chosen = native_variant(settings, r, host)
    else:
        chosen, why = variants.resolve_with_cpu(settings, r.variant, host, cpu=r.cpu, on_cpu="train on CPU")
        variants.say(why)
        if not r.cpu:  # an image that cannot run here is said first, not after the run's other lines
            check_gpu_host(settings, chosen, host, {}, r.disable_require)
    if hidden and chosen.is_cuda:  # said where it trains on GPUs, beside the other lines of which GPUs
        print(f"{hidden}: the run takes no other (unset CUDA_VISIBLE_DEVICES for every GPU, or --gpus=LIST)",
              file=sys.stderr)
    mig, advice = gpus.mig_advice(host)
    if mig and chosen.is_cuda and not r.cpu:
        print(f"warning: {mig}: {advice}", file=sys.stderr)
    topo = validate_topology(r.nproc, r.nodes, r.node_rank, r.master_addr, r.master_port, host, chosen, r.cpu)
    if chosen.is_cuda and not r.cpu and topo.nproc < host.count:  # the processes' GPUs alone, given and watched
        kept = host.gpus[:topo.nproc]
        print(f"--nproc={topo.nproc}: trains on GPU {', '.join(str(g.index) for g in kept)} of the {host.count} "
              "(--gpus=LIST picks which)", file=sys.stderr)
        host = replace(host, gpus=kept, visible=",".join(str(g.index) for g in kept))
    if r.native:  # this host's Python trains: no image is chosen, only whether the GPUs are used
        print(f"--native: this host's Python trains, on {f'{host.count} GPU(s)' if chosen.is_cuda and not r.cpu else 'CPU'}")
        check_native(r, chosen)
    if not (chosen.is_cuda and not r.cpu) and r.nproc > (usable := cores.usable_cores()):  # said, not refused
        print(f"warning: --nproc={r.nproc} CPU processes on {usable} usable core(s) of this host: each gets less than a "
              f"core, and every step waits for the slowest; --nproc={usable} gives each one", file=sys.stderr)
    if r.nodes == 1:
        check_one_node(r)
        topo.max_restarts = r.max_restarts
    else:
        topo.rendezvous = multinode.rendezvous(master_addr=r.master_addr, master_port=r.master_port, node_rank=r.node_rank,
                                               run_id=r.run_id, join_timeout=r.join_timeout,
                                               max_restarts=r.max_restarts, recipe=r.recipe or DEFAULT_RECIPE,
                                               iface=r.iface)
    preflight.check_resume(settings, r.resume, r.run_id)
    # the recipe, loaded once here: a bad --recipe is reported as such, not through the run id derived from it;
    # a resumed run keeps its own (its manifest names it); then what the trainer would refuse
    resumed = new_run_dir(settings, "", r.run_id, True, r.node_rank) if r.resume else None
    if resumed and r.node_rank == 0:  # the other nodes' trainers start beside node 0's, which holds it
        runfolder.check_idle(resumed)
    recipe_arg = preflight.resumed_recipe(resumed, r.recipe) if resumed else r.recipe or DEFAULT_RECIPE
    if resumed and (native := preflight.trained_where(resumed, r.node_rank)) is not None and native != r.native:
        # its paths are the host's, or the container's: the other way the trainer met them as another data file
        raise DockyardError(f"--resume: run {r.run_id} was trained "
                            f"{'on this host (--native)' if native else 'in an image'}, and resumes the same way: "
                            f"{resume_command(replace(r, native=native), r.run_id)}")
    if resumed and not r.native:
        given = {"data": r.data, "model": r.model, **inputs.override_values(overrides)}
        again, whose, record = preflight.inputs_to_give_again(resumed, r.node_rank, given)
        if again:
            fixed = replace(r, data=again.get("data", r.data), model=again.get("model", r.model),
                            overrides=(*r.overrides, *(["--eval_data", again["eval_data"]] if "eval_data" in again
                                                       else [])))
            read = ", ".join(f"{k} {v}" for k, v in again.items())
            if whose != r.node_rank:
                # another node's paths: said as theirs, offered where this node's are the same (shared storage, as a
                # run of several nodes mostly has); the trainer holds what it is given against that record's fingerprint
                raise DockyardError(f"--resume: run {r.run_id} holds no record of what node {r.node_rank} read (it "
                                    f"wrote none, lost before it could; {record} is node {whose}'s), and a "
                                    f"resume mounts what its command names: give node {r.node_rank}'s as it was "
                                    f"started. Node {whose} read {read}; where node {r.node_rank}'s "
                                    f"{'is' if len(again) == 1 else 'are'} there too: {resume_command(fixed, r.run_id)}")
            raise DockyardError(f"--resume: run {r.run_id} read {read}, and a resume mounts what its command names: "
                                f"give {'it' if len(again) == 1 else 'them'} again: {resume_command(fixed, r.run_id)}")
    recipe = load_recipe(recipe_arg)
    on_gpus = chosen.is_cuda and not r.cpu
    no_liger = preflight.liger_absent(on_gpus, chosen, r.native)
    preflight.check_run(settings, recipe=recipe, overrides=overrides, data=r.data, model=r.model,
                        gpus_in_effect=on_gpus, processes=topo.nproc * topo.nodes, resumed=resumed,
                        liger_absent=no_liger, installed=preflight.installed(chosen, r.native))
    if r.native:
        preflight.check_native_python()
    run_dir = resumed or new_run_dir(settings, recipe_arg, r.run_id, r.resume, r.node_rank)
    if r.dry and not (resumed or r.run_id):  # the id execute's claim_free would take now, taken by no one here
        run_dir = runfolder.first_free(run_dir)
    runfolder.check_makeable(run_dir.parent, runfolder.RUNS_FIX)  # what claiming the run folder would find, --dry too
    runfolder.check_makeable(settings.path(settings.hf_cache), caches.HF_FIX)  # what caches.prepare would find
    if not r.native:
        caches.check_compile_cache(settings)  # what caches.prepare would refuse, --dry too
    sized = preflight.sized_run(settings, recipe, overrides, model=r.model, run_dir=run_dir, resume=r.resume)
    fits = preflight.check_fits(recipe, sized, device=autos.device_from_host(host) if on_gpus else None,
                                processes=topo.nproc * topo.nodes, per_node=topo.nproc, liger=not no_liger)
    if fits and fits.said():  # what a newcomer asks first of a run on GPUs: what the `auto` settings become
        print(f"autos, by the plan's estimate for this GPU: {fits.said()} (the trainer settles them as it starts; the "
              "manifest's settings_resolved says why each)", file=sys.stderr)
    need = preflight.check_runs_disk(recipe, sized, run_dir=run_dir, gpu=on_gpus, resume=r.resume)
    if need:
        print(f"disk: the run writes about {disk.size(need['total_bytes'])} ({disk.describe(need)}); "
              f"{disk.size(disk.free_bytes(run_dir.parent))} free in {run_dir.parent}", file=sys.stderr)
    # the node's NCCL_*, FI_*, UCX_* settings, where the container has the host's network and InfiniBand devices (a
    # node of several): a one-node run's has its own network and no such device, whose names (NCCL_SOCKET_IFNAME=ib0,
    # NCCL_NET=IB) would stop NCCL there, and gets NCCL's settings of its own transport and log alone
    # (NCCL_P2P_DISABLE, NCCL_DEBUG); a run without a container has its host's environment as it is
    fabric = node.fabric_env(os.environ, r.iface) if r.nodes > 1 else node.local_nccl_env(os.environ)
    if r.native:
        command = native_command(settings, recipe=recipe_arg, topo=topo, run_dir=run_dir, overrides=overrides,
                                 resume=r.resume, cpu=r.cpu or not chosen.is_cuda, data=r.data, model=r.model,
                                 visible=host.visible, fabric=fabric)
    else:
        info, image = {}, {}
        if r.dry:
            image = _image_if_there(settings, variants.tag(settings, chosen), chosen.name, envvars.IMAGE_ID)
            if image:  # what the run would say: the dry run is where one looks before starting
                build.warn_if_stale(image, variants.tag(settings, chosen))
        else:
            info = engine.engine_info(settings)
            image = engine.image_inspect(settings, variants.tag(settings, chosen))
            if not image:
                raise DockyardError(_no_image(variants.tag(settings, chosen), chosen.name, recipe_arg, topo.nodes))
            build.warn_if_stale(image, variants.tag(settings, chosen))
        if on_gpus and not r.disable_require:
            check_require(variants.tag(settings, chosen), chosen, image, host)
        if on_gpus:
            preflight.check_cuda_ops(recipe, variants.tag(settings, chosen), variants.cuda_ops_the_image_can_load(
                chosen, ((image or {}).get("Config") or {}).get("Labels")))
        command = run_command(settings, recipe=recipe_arg, variant=chosen, host=host, engine_info=info, topo=topo,
                              run_dir=run_dir, overrides=overrides, resume=r.resume,
                              disable_require=r.disable_require, image_id=image.get("Id", ""),
                              memlock=memlock_flag(engine.daemon_memlock_hard_limit(info), say=on_gpus),
                              cpu=r.cpu, data=r.data, model=r.model, fabric=fabric)
    return command, [g.index for g in host.gpus] if on_gpus else []


def execute(settings: Settings, r: RunRequest, command: RunCommand, devices: list[int]) -> dict:
    """Claim the run folder, run the command under the monitor, and say the outcome: the summary of the manifest, or
    why the run did not start, keeping nothing that would block the same command again."""
    run_dir = command.run_dir
    if not r.native:
        caches.prepare(settings, compile_cache=True)  # before the run folder: a refusal leaves nothing behind
    made = not r.resume and r.node_rank == 0
    if made and not r.run_id:
        # an id of dockyard's choosing: another run started in the same second may have claimed it since it was
        # chosen; this one takes the next free (-2, -3, ...), and its command is planned again for it (said once).
        # One node's: --nodes > 1 needs --run-id (multinode.rendezvous)
        run_dir = runfolder.claim_free(run_dir)
        if run_dir != command.run_dir:
            r = replace(r, run_id=run_dir.name)
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    command, devices = prepare(settings, r)
            except BaseException:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()  # what this run claimed, empty
                raise
    elif made:
        # One os.mkdir (or, on a folder the other r.nodes share, one O_EXCL file): of two runs given the same
        # --run-id at once, one gets the folder and the other stops here, touching nothing of it.
        runfolder.claim(run_dir, runfolder.CLAIM if r.nodes > 1 else None)
    else:
        made_here = not run_dir.exists()  # (another node's) a folder for node 0 to claim, which this node made first
        run_dir.mkdir(parents=True, exist_ok=True)  # node 0's, on a shared folder; or the run being resumed
    before = _traces(run_dir, r.node_rank)
    # the GPUs this run was given (--gpus, CUDA_VISIBLE_DEVICES), none on CPU: the others are no part of its verdict
    interrupted = None
    with monitor.watch(run_dir, node_rank=r.node_rank, devices=devices) as watching:
        started = time.monotonic()
        try:
            proc = engine.run(command.argv, env=command.env, check=False, host_paths=not r.native)
        except engine.Interrupted as e:
            interrupted = e
        else:
            after = _traces(run_dir, r.node_rank)
            refused = bool(proc.returncode and r.resume and before[0] and after == before)
            never_started = bool(proc.returncode and made and not _trainer_wrote(run_dir, r.node_rank))
            # another node's that never met node 0 (or was refused by it): node 0 keeps nothing; nor does it
            not_here = bool(proc.returncode and not made and not r.resume and not _trainer_wrote(run_dir, r.node_rank))
            if (refused or never_started or not_here) and watching:  # the run's plots and verdict stay those of the run it
                watching.discard()  # was; a run that never started has none ("balanced" said of a refusal)
    if interrupted:
        raise _interrupted(r, run_dir, interrupted, made) from None
    if proc.returncode and r.resume and before[0] and after[0] == before[0]:
        # The manifest is what the run was before this command ("completed" perhaps), not its outcome: the trainer
        # refused to continue and left the record alone, or it trained on and was killed before rewriting it.
        if refused and not r.native and "is already in use by container" in (proc.stderr or ""):
            name = container_name(run_dir.name, r.nodes, r.node_rank)  # docker's: the run's container is there already
            raise DockyardError(f"--resume of run {run_dir.name}: its container {name} is there already (the run is "
                                f"being trained now, or its container was left): wait for it to end, or stop it "
                                f"(docker stop {name}), then resume; the run is as it was")
        if refused:
            raise DockyardError(f"--resume of run {run_dir.name} was refused (exit {proc.returncode}; the trainer's "
                                "reason is above): the run is as it was")
        newest = f"; its newest checkpoint is {after[2][-1]}" if after[2] else ""
        raise DockyardError(f"--resume of run {run_dir.name} trained on and then failed (exit {proc.returncode}; see "
                            f"{run_dir}/train.log){newest}: its manifest was not rewritten and still describes the run "
                            "before this resume")
    if not_here:
        # its monitor's empty samples file was all it left (listed by `invoke runs` as a run with no manifest)
        with contextlib.suppress(OSError):
            samples = run_dir / watching.name(runfolder.MONITOR_SAMPLES) if watching else None
            if samples and samples.stat(follow_symlinks=False).st_size == 0:
                samples.unlink()
            if made_here:
                run_dir.rmdir()  # empty: node 0 made nothing there since
        raise DockyardError(f"the run did not start on this node (exit {proc.returncode}, {_refused(proc, command.argv)}); "
                            "nothing of this node's was kept, so the same command can be run again")
    if never_started:
        # The trainer refused before its log, or never started (docker refused the run): keep nothing that would
        # block the same --run-id. The reason is the line above, whoever said it (the trainer, torchrun, docker).
        shutil.rmtree(run_dir, ignore_errors=True)
        why = _refused(proc, command.argv)
        raise DockyardError(f"the run did not start (exit {proc.returncode}, {why}); nothing was kept, so the same "
                            "command can be run again")
    return summarise(run_dir, r.node_rank, took=time.monotonic() - started,
                     as_host=(lambda text: text) if r.native else engine.container_paths_shown(command.argv))


def _refused(proc: subprocess.CompletedProcess, argv: list[str]) -> str:
    """Why the run did not start, where docker's words say a way out: the NVIDIA toolkit refusing the image's
    NVIDIA_REQUIRE_CUDA, or an engine that may not raise the containers' locked memory (one whose limit this host
    cannot read: reached through DOCKER_HOST, or a dockerd without the right to raise it); else the reason above."""
    said = proc.stderr or ""
    if variants.require_refused(said):
        return variants.REQUIRE_FIX
    if "rlimit type 8" in said:
        asked = next((a for a in argv if a.startswith("memlock=")), "memlock")
        return (f"the engine cannot give the containers the locked memory asked for (--ulimit {asked}): set "
                f"{envvars.MEMLOCK} to its hard limit in bytes (`invoke doctor` prints it on its ulimits line), or "
                "let dockerd raise it (systemd: LimitMEMLOCK=infinity)")
    return "for the reason above"


def _interrupted(r: RunRequest, run_dir: Path, e: engine.Interrupted, made: bool) -> DockyardError:
    """Ctrl-C (or SIGTERM) during a run: how to continue it; a folder this command made, where the trainer never
    started (waiting for the other nodes, or for the image), is removed, so the same command can run again."""
    every = " on every node" if r.nodes > 1 else ""
    if e.stopped and not r.resume and not _trainer_wrote(run_dir, r.node_rank):
        if made:  # node 0's: the other nodes' folder is node 0's (shared), theirs to keep or remove
            shutil.rmtree(run_dir, ignore_errors=True)
        return DockyardError(f"interrupted before run {run_dir.name} started training{' here' if not made else ''}: "
                             f"{'nothing was kept, so ' if made else ''}the same command can be run again{every}",
                             exit_code=e.exit_code)
    how = ("stopped" if e.stopped else "is still stopping" if r.native
           else f"is still stopping (docker stop {container_name(run_dir.name, r.nodes, r.node_rank)} stops it at once)")
    if not runfolder.complete_checkpoints(run_dir):
        return DockyardError(f"interrupted: run {run_dir.name} {how} before its first checkpoint. Continuing it starts "
                             f"again from the first step, with its own settings{every}: "
                             f"{resume_command(r, run_dir.name)}", exit_code=e.exit_code)
    return DockyardError(f"interrupted: run {run_dir.name} {how}. Continue it from its last complete checkpoint, with "
                         f"its own settings{every}: {resume_command(r, run_dir.name)}", exit_code=e.exit_code)


def _trainer_wrote(run_dir: Path, node_rank: int) -> bool:
    """The trainer started in the run folder: its log or this node's manifest is there."""
    return any(os.path.lexists(run_dir / n) for n in (runfolder.TRAIN_LOG, runfolder.manifest_file(node_rank)))


def _traces(run_dir: Path, node_rank: int) -> tuple:
    """What a run leaves as it goes: its manifest's and metrics.jsonl's (mtime in ns, size), None where there is
    none, and its checkpoints' names by step; whether a trainer wrote, trained or saved meanwhile."""
    def stat(name: str) -> tuple[int, int] | None:
        try:
            st = (run_dir / name).lstat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    return (stat(runfolder.manifest_file(node_rank)), stat(runfolder.METRICS),
            [p.name for p in runfolder.checkpoints_started(run_dir)])


def shell(settings: Settings, *, variant: str = "auto", dry: bool = False, cpu: bool = False,
          keep: bool = False, disable_require: bool = False) -> None:
    """`cpu`: no GPU even in a CUDA image, as `invoke run --cpu` (a build host without GPUs works in a CUDA image's
    stack). `keep`: the container stays after the shell ends, for `invoke commit` (removed otherwise).
    `disable_require`: as `invoke run --disable-require` (a --devel image on an older CUDA 12 driver, which the NVIDIA
    toolkit refuses by the image's NVIDIA_REQUIRE_CUDA: refused here first, with that way out)."""
    host = select(read_host())  # CUDA_VISIBLE_DEVICES, as for `invoke run`
    chosen, why = variants.resolve_with_cpu(settings, variant, host, cpu=cpu, on_cpu="work on CPU")
    variants.say(why, err=True)
    image = variants.tag(settings, chosen)
    gpus = chosen.is_cuda and not cpu
    info = {} if dry else engine.engine_info(settings)  # --dry asks no engine, as `run --dry`: what the host tells
    if gpus:
        check_gpu_host(settings, chosen, host, info, disable_require)
    env = {envvars.IMAGE_REF: image, envvars.VARIANT: chosen.name}
    if gpus and disable_require:
        env["NVIDIA_DISABLE_REQUIRE"] = "1"
    if chosen.is_cuda and cpu:
        env["DS_ACCELERATOR"] = "cpu"  # the image says cuda; DeepSpeed would look for a GPU
    mounts = inputs.read_only_mounts(settings, "", []).volumes
    runs = settings.path(settings.runs_dir)
    name = f"dockyard-shell-{os.getpid()}"
    argv = docker_run_argv(settings, image, gpus=gpus and docker_gpus(host), run_dir=runs / "shell", name=name,
                           env=env, network_host=False, interactive="tty" if sys.stdin.isatty() else "stdin",
                           command=["bash"], mounts=mounts, engine_info=info,
                           memlock=memlock_flag(engine.daemon_memlock_hard_limit(info), say=gpus), compile_cache=True,
                           keep=keep)
    if keep:
        print(f"the container stays when you leave it: `invoke commit --container={name}` makes an image of what you "
              f"changed (`{engine.shown(engine.docker(settings, 'rm', name))}` drops it)", file=sys.stderr)
    built = _image_if_there(settings, image, chosen.name) if dry else engine.image_inspect(settings, image)
    if not built and not dry:  # docker run would look for it in a registry (docker.io/library/...), in a project of none
        raise DockyardError(f"image {image} not built: `invoke build --variant={chosen.name}`")
    if gpus and not disable_require:
        check_require(image, chosen, built, host)
    if dry:
        engine.echo(argv)
        return
    build.warn_if_stale(built, image)
    runs.mkdir(parents=True, exist_ok=True)
    caches.prepare(settings, compile_cache=True)
    engine.echo(argv)
    os.execvp(argv[0], argv)


def check_one_node(r: RunRequest) -> None:
    """The flags of several nodes, given for one, do nothing (torchrun runs standalone): said, not refused (a job
    script that always passes them may run one node)."""
    node.check_restarts(r.max_restarts)
    given = [f for f, value, default in (("--master-addr", r.master_addr, ""), ("--master-port", r.master_port, node.PORT),
                                         ("--iface", r.iface, ""), ("--join-timeout", r.join_timeout, node.JOIN_TIMEOUT))
             if value != default]
    if given:
        print(f"warning: {', '.join(given)}: for several nodes (--nodes=N); this run has one node, so "
              f"{'it does' if len(given) == 1 else 'they do'} nothing", file=sys.stderr)


def native_variant(settings: Settings, r: RunRequest, host: Host) -> Variant:
    """--native trains with this host's torch, in no image: what `auto` weighs to pick an image (the CUDA the driver
    runs, the GPUs an image's torch has code for) is no rule of this run's, and a CUDA 11 driver with a torch built for
    it was refused as "older than every CUDA variant". A variant says here only whether the run trains on the GPUs:
    where NVML sees some, unless --cpu (the trainer refuses a torch that finds none: native_command)."""
    if r.variant == "auto" and host.gpus and not r.cpu:
        cuda = [v for v in variants.all_variants(settings).values() if v.is_cuda]
        if cuda:
            return cuda[0]
    chosen = variants.resolve_with_cpu(settings, r.variant, host, cpu=r.cpu, on_cpu="train on CPU")[0]
    if chosen.is_cuda and not r.cpu and not host.gpus:  # no image's stack to try on CPU (no_gpus): this host's own
        raise DockyardError(f"--native --variant={r.variant} trains on this host's NVIDIA GPUs but "
                            f"{host.error or 'NVML sees none'}; add --cpu to train on its CPUs with its own torch, or "
                            "run it on a host with GPUs")
    return chosen


def check_native(r: RunRequest, chosen: Variant) -> None:
    """The flags of an image, given with --native, do nothing (no image, no container): said, not refused, as the flags
    of several nodes given for one. --variant=cpu is left alone: it trains on CPU, as --cpu."""
    given = [*([f"--variant={r.variant}"] if r.variant != "auto" and chosen.is_cuda else []),
             *(["--disable-require"] if r.disable_require else [])]
    if given:
        print(f"warning: {', '.join(given)}: for the image a run trains in; --native trains with this host's Python and "
              f"its own torch, in no container, so {'it does' if len(given) == 1 else 'they do'} nothing", file=sys.stderr)


RUN_ID = runfolder.RUN_ID
RUN_ID_CHARS = 128


def not_a_run_id(run_id: str) -> str:
    """Why `run_id` names no run folder, said of the value (its first characters), or ""."""
    if RUN_ID.fullmatch(run_id):
        return ""
    shown = reprlib.repr(run_id)
    if len(run_id) > RUN_ID_CHARS and RUN_ID.fullmatch(run_id[:RUN_ID_CHARS]):
        return f"{shown} is {len(run_id):,} characters: use at most {RUN_ID_CHARS}"
    return f"{shown}: use letters, digits, '_', '.' and '-', starting with a letter or digit, at most {RUN_ID_CHARS}"


def _others_may_swap(runs: Path) -> str:
    """A runs folder every user may write, not sticky (a shared folder made with chmod 777): any of them may rename a
    run folder of this user's and put one of theirs in its place, checkpoints a resume loads included. So too a folder
    above it (`/shared` of 777 holding the runs folder invoke run made): the runs folder itself may be renamed away.
    Said, not refused: a volume shared by design (a cluster's, every pod's uid) is often so. The folders a link on the
    way leads through too (~/proj a link to /shared/proj: /shared of 777 was never looked at)."""
    try:
        real = runs.resolve()
    except (OSError, RuntimeError):  # a loop of links on the way: refused, in words, where the folder is made
        real = runs
    for folder in dict.fromkeys((runs, *runs.parents, real, *real.parents)):
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if not st.st_mode & stat.S_IWOTH or st.st_mode & stat.S_ISVTX:
            continue
        mode = stat.filemode(st.st_mode)
        if folder in (runs, real):
            return (f"the runs folder {runs} can be written by every user and is not sticky (mode {mode}): any of them "
                    f"could rename a run folder of yours and put theirs in its place, checkpoints included; "
                    f"`chmod +t {runs}` keeps each user's folders their own, as in /tmp")
        through = f" (through a link: {real})" if real != runs and folder not in runs.parents else ""
        return (f"the folder {folder}, on the way to the runs folder {runs}{through}, can be written by every user and is not "
                f"sticky (mode {mode}): any of them could rename the folder it holds there and put theirs in its place, "
                f"run folders and checkpoints included; `chmod +t {folder}` keeps each user's folders their own, as "
                "in /tmp")
    return ""


def new_run_dir(settings: Settings, recipe: str, run_id: str, resume: bool, node_rank: int = 0) -> Path:
    """runs/<run-id>/, refusing to overwrite a run. Only node 0 owns the folder: on a shared filesystem the
    other nodes find it already made by node 0 (and they must be given the same --run-id)."""
    runs = settings.path(settings.runs_dir)
    if swappable := _others_may_swap(runs):
        print(f"warning: {swappable}", file=sys.stderr)
    if node_rank > 0 and not run_id:
        raise DockyardError("with --node-rank > 0, give the same --run-id as node 0")
    ours = not run_id  # the recipe and the second: of runs started in the same second, each claims the first free
    # of the id, its -2, -3, ... as it starts (execute), so that one taken is no refusal here
    run_id = run_id or f"{runfolder.recipe_name(recipe)}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    if why := not_a_run_id(run_id):
        # It names the container too (dockyard-<run-id>): docker's rule, checked before anything is made.
        raise DockyardError(f"--run-id {why} (it names the run folder and the container)")
    if run_id in runfolder.TOOL_FOLDERS:
        raise DockyardError(f"--run-id {run_id}: the runs folder's {run_id}/ holds {runfolder.TOOL_FOLDERS[run_id]}, not a run: "
                            "pick another --run-id")
    d = runs / run_id
    if resume:
        if not d.is_dir() and not d.is_symlink():
            raise DockyardError(f"--resume: no run folder {d} to resume ({newest_runs(runs, given=run_id)})")
        runfolder.check(d)  # a link planted in it (monitor.json -> ~/.bashrc) is refused before anything runs
    elif node_rank == 0 and not ours and d.exists() and any(not runfolder.OTHER_NODES_FILE.fullmatch(p.name)
                                                            for p in d.iterdir()):
        raise DockyardError(f"run folder {d} already holds a run{_never_trained(d)}: pick another --run-id, or add "
                            "--resume to continue it")
    elif node_rank > 0 and (d / runfolder.manifest_file(node_rank)).is_file():
        # this node's own record: an earlier start of this id (a new run's node I writes it only as it ends). Node 0
        # refuses such a folder; this node waited out the join timeout, then summarised that old record as its run's
        raise DockyardError(f"run folder {d} already holds a run (this node's record "
                            f"{runfolder.manifest_file(node_rank)}, of an earlier start){_never_trained(d)}: pick "
                            "another --run-id, or add --resume to continue it")
    return d


def _never_trained(run_dir: Path) -> str:
    """", which failed before it trained (...); `rm -r` it to use the id again" where the manifest says so (a bad
    data file found in the container, say), else ""."""
    try:
        m = runfolder.read_manifest(run_dir)
    except (DockyardError, OSError):
        return ""
    if m is None or m.status != "failed" or (m.metrics and m.metrics.steps) or runfolder.checkpoints_started(run_dir):
        return ""
    error = " ".join((m.error or "").split())[:160]
    return (f", which failed before it trained{f' ({error})' if error else ''}; to use the id again, remove it: "
            f"rm -r {shlex.quote(str(run_dir))}. Otherwise")


def _no_image(tag: str, variant: str, recipe: str, nodes: int) -> str:
    """What to do where the engine lacks the run's image: build it; on a node of several, ship the one built on another
    node (every node runs the same image: docs/multinode.md), not build another here."""
    if nodes > 1:
        return (f"image {tag} is not on this node: every node runs the same image, built once: from the node that has "
                f"it, `invoke ship --image={tag} --to=THIS_NODE` (or `invoke save --image={tag}` there and `invoke load "
                f"--file=...` here); where no node has it yet, `invoke build --variant={variant}` on one, then ship it")
    return f"image {tag} not built: `invoke build --variant={variant}` (or `invoke build run --recipe={recipe}`)"


def resume_command(r: RunRequest, run_id: str) -> str:
    """The `invoke run` that continues run `run_id` as `r` started it: what the host needs again (a recipe folder of
    one's own, the model and data it mounts, where the processes ran, every flag given away from its default); the
    other overrides stay in the run (overrides.json)."""
    folder = Path(os.path.expanduser(r.recipe)) if r.recipe else None
    # a recipe folder of one's own (from any folder); a recipe of the checkout's the run's manifest names
    own = folder and (folder / "recipe.yaml").is_file() and folder.resolve() != (RECIPES / r.recipe).resolve()
    recipe = str(folder.resolve()) if own else ""
    flags = [f"--run-id={run_id}", *(f"--{k}={v}" for k, v in (("recipe", recipe),
                                                                 ("variant", r.variant if r.variant != "auto" else ""),
                                                                 ("nproc", r.nproc or ""), ("gpus", r.gpus),
                                                                 ("data", r.data), ("model", r.model)) if v),
             *(f"--{k}" for k, on in (("cpu", r.cpu), ("native", r.native), ("disable-require", r.disable_require))
               if on),
             *([f"--nodes={r.nodes}", f"--node-rank={r.node_rank}", f"--master-addr={r.master_addr}",
                f"--master-port={r.master_port}"] if r.nodes > 1 else []),
             # every other flag the run was given away from its default (where the nodes meet, how long they wait)
             *(f"--{k}={v}" for k, v, default in (("iface", r.iface, ""),
                                                  ("join-timeout", r.join_timeout, node.JOIN_TIMEOUT),
                                                  ("max-restarts", r.max_restarts, 0)) if v != default)]
    mounted = inputs.override_values(list(r.overrides))  # inputs given after --: mounted only where given again
    tail = ["--", *(w for k, v in mounted.items() for w in (f"--{k}", v))] if mounted else []
    return shlex.join(["invoke", "run", "--resume", *flags, *tail])


def _image_if_there(settings: Settings, tag: str, variant: str, blank: str = "") -> dict:
    """`run --dry`, `shell --dry`: the image where an engine answers and holds it, so the command printed is the one
    that runs; else a note says what is missing, how to make it, and what the command printed leaves `blank`."""
    try:
        image = engine.image_inspect(settings, tag) or {}
        missing = f"{tag} is not built yet: `invoke build --variant={variant}` builds it (without --dry this stops here)"
    except DockyardError as e:
        image, missing = {}, f"{str(e).splitlines()[0].rstrip('.')}; whether {tag} is built is not known"
    if not image:
        print(f"note: {missing}" + (f"; {blank} below is left empty until then" if blank else ""), file=sys.stderr)
    return image
