"""`invoke export --run=ID [--merge] [--out=DIR]`: a run's model as a plain Hugging Face folder.

Runs dockyard.train.export (the writing and the reload check) in the image the run used, on CPU, with the run's
folder and the run's own model folder mounted as they were; a run made with `--native` is exported on this host.

The run's manifest is untrusted (any run's container can write in the runs folder): it may only name an image of
this project for the run's own variant, and only the model folder the run trained on (the same file list and
sizes as the manifest recorded when the run started) is mounted.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from dockyard import engine
from dockyard.common import locks, model_config, runfolder
from dockyard.common.errors import DockyardError, read_bounded, shown
from dockyard.common.runfolder import RunManifest
from dockyard.images import variants
from dockyard.launch import caches, node, preflight, scriptwords
from dockyard.launch import run as launch_run
from dockyard.launch.command import docker_run_argv
from dockyard.launch.inputs import INPUTS
from dockyard.launch.runs import newest_runs
from dockyard.settings import ROOT, Settings

OUT = "/workspace/export"


def export(settings: Settings, *, run: str, merge: bool = False, out: str = "", dry: bool = False,
           native: bool = False) -> Path:
    """Write the folder (default runs/<ID>/export, or runs/<ID>/merged with --merge); returns it. `native`: the
    user's word that the run was trained on this host, whose Python then exports it (never the manifest's alone:
    any container can write it, and would then move the export out of the image onto this host)."""
    runs = settings.path(settings.runs_dir)
    if not run:
        raise DockyardError(f"--run is required: the id of a completed run ({newest_runs(runs)})")
    if why := launch_run.not_a_run_id(run):
        raise DockyardError(f"--run {why}: give the name of a folder in {runs}")
    run_dir = runs / run
    m = runfolder.read_manifest(run_dir) if run_dir.is_dir() or run_dir.is_symlink() else None
    if m is None:
        raise DockyardError(f"no run {run!r} in {runs} (no manifest.json): give the id of a completed run "
                            f"({newest_runs(runs, given=run)})")
    runfolder.check(run_dir)  # the export reads the run's model: never through a link planted in the folder
    # the commands said below, as the run needs them: one trained with --native resumes and exports with it
    native_run = " --native" if m.variant in runfolder.NATIVE_VARIANTS else ""
    if m.status != "completed":  # said here, before an image starts to say it (the trainer's export checks it too)
        # a run that failed before its first checkpoint (a setting, its data) has nothing for --resume to continue
        then = (f"continue it (invoke run --resume --run-id={run}{native_run})" if runfolder.complete_checkpoints(run_dir) else
                f"it saved no checkpoint to resume either: fix what stopped it ({first_line(m.error)}) and start it "
                "again")
        raise DockyardError(f"run {run} did not complete (status {m.status}): it saved no model to export; {then}, or "
                            "export a completed run")
    if merge and m.model and m.model.format == "full":  # it wrote a second copy of the model to merged/
        raise DockyardError(f"run {run} trained the whole model: it has no adapters for --merge to merge; export it "
                            f"as it is: invoke export --run={run}{native_run}")
    # --out: a link of the user's own followed, none in a folder a container writes (checked below, as save's --out)
    target = (runfolder.users_folder(out, caches.container_writable(settings)) if out else
              run_dir / ("merged" if merge else "export"))
    if out:  # before anything is made: the folder's name is printed (the command, where it was written) as it is
        scriptwords.one_line(str(target), "--out", "which would reach the terminal as it is where the export prints "
                                                   "the folder's name: give --out a name without control characters")
    left = left_unfinished(settings, target, run)
    if (target.exists() or target.is_symlink()) and not (left and target.is_dir() and not target.is_symlink()):
        if elsewhere := locks.written_elsewhere(target.parent, {target.name}):
            raise DockyardError(f"{target} is being written by an export on another host, or was left by one killed "
                                f"there (its marker {elsewhere[0].name}; this host cannot tell which): export there, "
                                f"which removes what a killed one left, or remove {target} and that marker once "
                                "nothing writes it")
        raise DockyardError(f"{target} already exists: give a new --out folder (an export never overwrites)")
    if out and target.is_relative_to(run_dir.resolve()):
        raise DockyardError(f"--out={out} is inside the run folder {run_dir}, whose files are the run's own: give a "
                            "folder outside it (or leave out --out: runs/<ID>/export)")
    if out:  # another run's folder (its export mixed into that run's), the runs folder, a cache: every run's
        # container writes there, and could change the exported model before it is loaded or shipped. The run's own
        # export folder is in the runs folder too: said as no way out of their reach, which --out alone gives
        own = run_dir / ("merged" if merge else "export")
        caches.check_out_of_reach(settings, target, "--out", "give --out a folder outside the runs folder and the "
                                  f"caches, out of every run's reach (without --out the export stays in the run's own "
                                  f"folder, {own}, which every run's container can write too)",
                                  use="you load or ship the model")
    if m.variant in runfolder.NATIVE_VARIANTS and not native:
        raise DockyardError(f"run {run} was trained on this host (--native): its export runs here too, in this host's "
                            f"Python; say so: invoke export --run={run} --native")
    if native and m.variant not in runfolder.NATIVE_VARIANTS:
        raise DockyardError(f"run {run} was trained in the {m.variant} image, and is exported there: leave out --native")
    if not (run_dir / "model").is_dir():  # said here, before an image starts to say it
        raise DockyardError(f"run {run} completed, but its folder holds no model/ folder (removed or replaced since): "
                            "nothing to export; train it again")
    if out:  # as the export would make it (a dry run too): a file in the way, a folder this user cannot write
        runfolder.check_makeable(target, "give --out=FOLDER where you can write")
    if native:
        preflight.check_native_python("exports", ("torch", "transformers", "peft"))
    marker = locks.partial(target)  # says the folder is being written until it is checked: see left_unfinished
    argv, env = export_command(settings, m, run_dir, target, merge,
                               None if dry or native else engine.engine_info(settings), container=container_of(marker))
    if dry:
        engine.echo(argv, env)
        if left and target.is_dir():
            print(f"{target} is the folder of an export killed before it finished: the export removes it first")
        return target
    if not native:
        check_image(settings, run_image(settings, m), m.variant)
        caches.prepare(settings, compile_cache=False)
    remove_left_unfinished(target, left)
    made = [target, *(p for p in target.parents if not os.path.lexists(p))]  # removed again if the export fails
    writer = "" if native else f" in container {container_of(marker)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(marker, "x") as f:
            f.write(f"invoke export (process {os.getpid()}) is writing {target.name}/ beside this file{writer}; where "
                    "no such process runs, it was killed before it finished: that folder is no checked export, and the "
                    f"next invoke export of run {run} there removes both, once nothing writes it any more\n")
        if out:
            target.mkdir()
        else:
            runfolder.make_dir(run_dir, target.name)
    except (OSError, DockyardError) as e:  # a file in the way (--out=FILE/x), a folder this user cannot write
        marker.unlink(missing_ok=True)
        if isinstance(e, DockyardError):
            raise
        raise DockyardError(f"cannot make the export folder {target}: {e.strerror or e}; give --out=FOLDER where you "
                            "can write") from None
    try:
        proc = engine.run(argv, env=env, check=False, host_paths=m.variant not in runfolder.NATIVE_VARIANTS)
    except BaseException:  # Ctrl-C, SIGTERM: the files written so far were never reloaded and compared
        remove_unfinished(made, marker)
        raise
    if proc.returncode:
        remove_unfinished(made, marker)
        raise DockyardError(f"export of run {run} failed (exit {proc.returncode}; the reason is above); nothing was "
                            "kept")
    base_on_this_host(target, engine.container_paths_shown(argv) if m.variant not in runfolder.NATIVE_VARIANTS
                      else lambda path: path)  # a native export wrote this host's paths; its base is said too
    marker.unlink()
    return target


def first_line(error: str | None) -> str:
    """A failed run's error as one short line for another message; its train.log where it recorded none."""
    line = (error or "").strip().splitlines()[0] if (error or "").strip() else "see its train.log"
    return shown(line if len(line) <= 160 else line[:157] + "...")


def left_unfinished(settings: Settings, target: Path, run: str) -> list[Path]:
    """The markers beside `target` of exports killed outright (SIGKILL, the OOM killer, a power cut) while they wrote
    it: no clean-up ran, and the folder, with a whole Hugging Face folder's files never reloaded nor compared, blocked
    the same export ("already exists"). Refused while what that export started still writes the folder: `kill -9` of
    `invoke export` alone leaves its container (or, --native, its Python) writing, and the folder was removed under
    it."""
    left = locks.left_behind(target.parent, {target.name})
    for marker in left:
        if writer := still_writing(settings, marker, target):
            raise DockyardError(f"an export of run {run} into {target} is still being written by {writer[0]}, though "
                                f"the invoke export that started it was killed: wait for it to end, or stop it "
                                f"({writer[1]}), then export again; nothing was removed")
    return left


def container_of(marker: Path) -> str:
    """The name of the container an export runs in: its marker's own (the pid, host tag and random part of
    locks.partial's name), so that the marker left by a killed export names the container that may still write its
    folder."""
    pid, token = marker.name.removesuffix(".partial").rsplit(".", 2)[-2:]
    return f"dockyard-export-{pid}-{token}"


def still_writing(settings: Settings, marker: Path, target: Path) -> tuple[str, str] | None:
    """What still writes `target` for the export whose `marker` was left ((what, how to stop it)), or None: the
    container the marker names while the engine has it (created, running or paused; --rm removes it as it ends), else
    a process of this user that is that export's Python (--native) or its `docker run` (which starts the container)."""
    name = container_of(marker)
    try:
        said = read_bounded(marker, 4096, "export marker").decode(errors="replace")
    except (OSError, DockyardError):
        said = ""
    if f"in container {name}" in said:
        proc = engine.run(engine.docker(settings, "container", "inspect", "--format", "{{.State.Status}}", name),
                          capture=True, check=False, quiet=True)
        if proc.returncode == 0 and proc.stdout.strip() not in ("exited", "dead"):
            return f"container {name}", f"docker stop {name}"
        if proc.returncode:
            engine.check_not_missing(proc)  # an engine that does not answer cannot say the container is gone
    if pid := export_process(target, name):
        return f"process {pid}", f"kill {pid}"
    return None


def export_process(target: Path, container: str) -> int | None:
    """A process of this user that writes `target` for an export: `python -m dockyard.train.export ... --out TARGET`
    (--native), or the `docker run --name CONTAINER` that starts the container."""
    import psutil

    out = str(target)
    for proc in psutil.process_iter(["uids", "cmdline"]):  # one ended meanwhile, or not readable: None
        uids, argv = proc.info["uids"], proc.info["cmdline"] or []
        if proc.pid == os.getpid() or uids is None or uids.effective != os.geteuid():
            continue
        native = "dockyard.train.export" in argv and any(
            a == "--out" and b == out for a, b in zip(argv, argv[1:], strict=False))
        if native or ("--name" in argv and container in argv):
            return proc.pid
    return None


def remove_left_unfinished(target: Path, left: list[Path]) -> None:
    """The folder and markers an export killed outright left (left_unfinished), removed and said."""
    if not left:
        return
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
        print(f"removed {target}: an export killed before it finished left it, never reloaded nor compared")
    for p in left:
        p.unlink(missing_ok=True)


def base_on_this_host(target: Path, as_host) -> None:
    """An adapter's base named where it is on this host: an export in the image (of a run older than the trainer's own
    renaming) wrote the path it saw the base at (/workspace/inputs/model, /workspace/runs/ID/base) into
    adapter_config.json and the model card, where peft's AutoPeftModel on this host (or anyone the folder is given to)
    looks for it."""
    base = model_config.rename_base(target, as_host)
    if base is not None:
        print(f"  its base: {base} (peft loads the adapter onto it)")


def remove_unfinished(made: list[Path], marker: Path) -> None:
    """The folder this export made, with what it wrote before it stopped: it looked like a whole Hugging Face folder
    (config.json, weights, tokenizer) that no check had passed, and it blocked the same export ("already exists").
    Then its marker, and the folders above it that the export made, where they are still empty ("nothing was kept")."""
    shutil.rmtree(made[0], ignore_errors=True)  # made new by this export (one that existed was refused)
    marker.unlink(missing_ok=True)
    for parent in made[1:]:
        try:
            parent.rmdir()  # empty only: another process may have put something there since
        except OSError:
            return




def export_command(settings: Settings, m: dict | RunManifest, run_dir: Path, target: Path,
                merge: bool, engine_info: dict | None = None, container: str = "") -> tuple[list[str], dict]:
    """The command that exports (pure but for checking the model folder): `docker run` of the run's image (on the
    engine `engine_info` describes: {} or None, not asked) in a container named `container`, or this host's Python
    for a native run. Every value taken from the manifest is checked first."""
    m = m if isinstance(m, RunManifest) else runfolder.parse_manifest(m, run_dir / runfolder.MANIFEST)
    if m.run_id != run_dir.name:
        raise DockyardError(f"{run_dir}/manifest.json is the manifest of run {m.run_id!r}, not of {run_dir.name!r}: "
                            "refused (a manifest is only read in its own run's folder)")
    tail = ["--merge"] if merge else []
    if m.variant in runfolder.NATIVE_VARIANTS:
        check_native_base(m, run_dir)
        # the weights are read as weights only, here as in the image: a planted pickle cannot run on this host
        return ([sys.executable, "-m", "dockyard.train.export", "--run-dir", str(run_dir), "--out", str(target), *tail],
                {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1",
                 "DS_ACCELERATOR": "cpu"})  # the export runs on CPU, as in the image (DeepSpeed warned it looked)
    image = run_image(settings, m)
    scriptwords.mount_path(str(target), "the export folder (--out)", ":")  # docker's -v splits on ':'
    mounts = [(target, OUT, False)]
    model = m.inputs.get("model")
    if model and model.inside.startswith(INPUTS):  # the run's own model folder, where the run saw it
        mounts.append((run_model(model), model.inside, True))
    command = ["python", "-m", "dockyard.train.export", "--run-dir", node.run_dir_inside(run_dir.name),
               "--out", OUT, *tail]
    env = {"DS_ACCELERATOR": "cpu", "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}
    argv = docker_run_argv(settings, image, gpus=False, run_dir=run_dir,
                           name=container or f"dockyard-export-{os.getpid()}", env=env, network_host=False,
                           interactive="", command=command, mounts=mounts, engine_info=engine_info or {})
    return argv, {}


def check_native_base(m: RunManifest, run_dir: Path) -> None:
    """The base an adapter run's native export reads (the manifest's model.base): the tiny model in the run's folder,
    or the model folder the run recorded as its input, still as it was (its files and sizes). Any other host folder
    the manifest names is refused: its merge would land in the runs folder, for every container to read."""
    if m.model is None or m.model.format != "adapter":
        return  # a full fine-tune's export reads the run's own model/ alone
    base = str(m.model.base or "")
    if base and Path(base).resolve() == (run_dir / "base").resolve():
        return
    given = m.inputs.get("model")
    if given is None or given.path != base:
        raise DockyardError(f"the run's manifest names base model {base!r}, neither its own base/ nor the model it "
                            "recorded as its input: refused")
    check_as_recorded(Path(base), given)


def run_image(settings: Settings, m: RunManifest) -> str:
    """The image the run used: one of this project's images (`<image_name>:<version>-<variant>`) for the run's own
    variant, of this or an earlier version of the project; anything else the manifest names is refused."""
    known = variants.all_variants(settings)
    if m.variant not in known:
        raise DockyardError(f"the run's manifest names variant {m.variant!r}, not one of {', '.join(known)}: refused")
    ref = m.image.ref or variants.tag(settings, known[m.variant])
    if not re.fullmatch(rf"{re.escape(settings.image_name)}:[A-Za-z0-9][A-Za-z0-9_.-]{{0,100}}-{re.escape(m.variant)}",
                        ref):
        raise DockyardError(f"the run's manifest names image {ref!r}, not an image of this project for variant "
                            f"{m.variant} ({variants.tag(settings, known[m.variant])} or another version of it): "
                            "refused, an export runs only the project's own images")
    return ref


def check_image(settings: Settings, ref: str, variant: str) -> None:
    """The image is here and says it is the run's variant (the `dockyard.variant` label every build sets)."""
    info = engine.image_inspect(settings, ref)
    if not info:
        raise DockyardError(f"the run's image {ref} is not here: `invoke load` it (or build that version), then export")
    label = ((info.get("Config") or {}).get("Labels") or {}).get("dockyard.variant")
    if label != variant:
        raise DockyardError(f"image {ref} is labelled variant {label!r}, the run's is {variant!r}: refused")


def run_model(model: runfolder.InputRecord) -> Path:
    """The host folder of the run's model, mounted read-only where the run saw it: only the folder the run
    trained on, as the manifest recorded it (its file list and sizes, or its content)."""
    if model.inside != f"{INPUTS}/model":
        raise DockyardError(f"the run's manifest mounts its model at {model.inside!r}, not {INPUTS}/model: refused")
    host = Path(model.path)
    if not host.is_absolute() or any(c in model.path for c in ":,\n\r\0"):
        raise DockyardError(f"the run's manifest names model folder {model.path!r}, not an absolute path that "
                            "can be mounted: refused")
    if not host.exists():
        raise DockyardError(f"the run's model {host} is gone: the export needs the base it trained on")
    if not host.is_dir() or not (host / "config.json").is_file():  # a socket, a device, an empty folder: their
        # listing is empty, and the hash of an empty listing is anyone's to write into a manifest
        raise DockyardError(f"the run's manifest names model {host}, which is no model folder (a folder with "
                            "config.json, as every run reads): refused")
    check_as_recorded(host, model)
    return host


def check_as_recorded(host: Path, model: runfolder.InputRecord) -> None:
    """The folder is the model the run trained on: its fingerprint (files and sizes) is the one the run recorded."""
    recorded = (model.model_extra or {}).get("files")
    most = min(recorded, runfolder.MODEL_FILES_MAX) if type(recorded) is int and recorded >= 0 \
        else runfolder.MODEL_FILES_MAX  # a manifest's figure, not a licence to walk /usr
    if not model.sha256 or not (found := runfolder.fingerprint(host, most)) or found["sha256"] != model.sha256:
        raise DockyardError(f"{host} is not the model folder the run trained on (its files and sizes differ from what "
                            "the run's manifest recorded): refused; give back the folder the run used")
