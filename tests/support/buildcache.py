"""The engine's build cache, kept to what the suite needs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

from dockyard import engine
from dockyard.images import build, variants


def drop_context_copies(settings) -> None:
    """BuildKit keeps a copy of each build's context (its wheels: 3-4 GB per CUDA variant) to send only what
    changed next time; the suite has no use for them, and a CI machine may have only ~50 GB free."""
    subprocess.run(engine.docker(settings, "builder", "prune", "-f", "--filter", "type=source.local"),
                   capture_output=True, check=True)


def build_image(settings, variant) -> str:
    """`invoke build --variant=NAME`, as a user runs it, after any build of the same variant already under way has
    finished (.ci/run starts the images' builds in the background while the suite runs; `invoke build` refuses a
    second build of a variant beside the first, so this one waits for it, then takes its layers from the cache).
    The image's reference, once it is there; the build's context copies are dropped."""
    from tests.support.cli import invoke

    _wait_for_ci_background(variant.name, bound=3600)
    lock = build.build_lock(build.staged_context_dir(build.wheelhouse_dir(settings, variant), variant.name))
    for _ in range(3):
        _wait_while_held(lock, bound=3600)
        r = invoke("build", f"--variant={variant.name}", timeout=3600)
        if r.returncode == 0 or "a build of the same variant is under way" not in r.stdout + r.stderr:
            break  # else one started between the wait and this build: wait for it too
    assert r.returncode == 0, f"invoke build --variant={variant.name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    ref = variants.tag(settings, variant)
    assert engine.image_inspect(settings, ref), f"{ref} missing after a successful build"
    drop_context_copies(settings)
    return ref


def _wait_for_ci_background(variant: str, bound: float) -> None:
    """Under .ci/run, until its background job has fetched this variant's wheels and built it (DOCKYARD_CI_BUILDS
    names a folder where the job leaves `<variant>.done`, however its build ended, and its process id in `pid`): the
    suite starts while the CUDA wheels still download. Elsewhere nothing to wait for."""
    folder = os.environ.get("DOCKYARD_CI_BUILDS")
    if not folder:
        return
    done, pid = Path(folder) / f"{variant}.done", Path(folder) / "pid"
    deadline = time.monotonic() + bound
    while not done.exists() and _alive(pid):
        assert time.monotonic() < deadline, f"CI's background build of {variant} still running after {bound:.0f} s"
        time.sleep(5)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _wait_while_held(lock: Path, bound: float) -> None:
    """Until no process holds `lock` (the lock `invoke build` holds while it builds); at most `bound` seconds."""
    if not lock.exists():
        return
    deadline = time.monotonic() + bound
    with open(lock, "rb") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                assert time.monotonic() < deadline, f"a build still held {lock} after {bound:.0f} s"
                time.sleep(5)
            else:
                fcntl.flock(f, fcntl.LOCK_UN)
                return
