"""`invoke export --run=ID [--merge] [--out=DIR]`: a run's model as a plain Hugging Face folder.

Runs dockyard.train.export (the writing and the reload check) in the image the run used, on CPU, with the run's
folder and the run's own model folder mounted as they were; a run made with `--native` is exported on this host.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dockyard import engine, launch, variants
from dockyard.errors import DockyardError
from dockyard.inputs import INPUTS
from dockyard.settings import ROOT, Settings

OUT = "/workspace/export"


def export(settings: Settings, *, run: str, merge: bool = False, out: str = "", dry: bool = False) -> Path:
    """Write the folder (default runs/<ID>/export, or runs/<ID>/merged with --merge); returns it."""
    if not run:
        raise DockyardError("--run is required: a run id (a folder under the runs folder)")
    runs = settings.path(settings.runs_dir)
    run_dir = runs / run
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        raise DockyardError(f"no run {run!r} in {runs} (no {manifest.name}): give the id of a completed run")
    m = json.loads(manifest.read_text())
    target = Path(os.path.expanduser(out)).resolve() if out else run_dir / ("merged" if merge else "export")
    if target.exists():
        raise DockyardError(f"{target} already exists: give a new --out folder (an export never overwrites)")
    argv, env = plan_export(settings, m, run_dir, target, merge)
    if dry:
        engine.echo(argv, env)
        return target
    target.mkdir(parents=True)
    proc = engine.run(argv, env=env, check=False)
    if proc.returncode:
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        raise DockyardError(f"export of run {run} failed (exit {proc.returncode}; the reason is above)")
    return target


def plan_export(settings: Settings, m: dict, run_dir: Path, target: Path, merge: bool) -> tuple[list[str], dict]:
    """The command that exports (pure): `docker run` of the run's image, or this host's Python for a native run."""
    tail = ["--merge"] if merge else []
    if m.get("variant") in (None, "", "native"):
        return ([sys.executable, "-m", "dockyard.train.export", "--run-dir", str(run_dir), "--out", str(target), *tail],
                {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    image = (m.get("image") or {}).get("ref") or variants.tag(settings, variants.resolve(settings, m["variant"])[0])
    mounts = [(target, OUT, False)]
    model = (m.get("inputs") or {}).get("model") or {}
    if model.get("inside", "").startswith(INPUTS):  # the run's own model folder, where the run saw it
        host = Path(model["path"])
        if not host.exists():
            raise DockyardError(f"the run's model {host} is gone: the export needs the base it trained on")
        mounts.append((host, model["inside"], True))
    command = ["python", "-m", "dockyard.train.export", "--run-dir", f"{launch.WORKSPACE}/runs/{run_dir.name}",
               "--out", OUT, *tail]
    argv = launch.docker_run_argv(settings, image, gpus=False, run_dir=run_dir, name=f"dockyard-export-{os.getpid()}",
                                  env={"DS_ACCELERATOR": "cpu"}, network_host=False, interactive=False,
                                  command=command, mounts=mounts)
    return argv, {}
