"""`invoke run --dry` prints the command the run then starts: the same `docker run` line, memlock and image id
included (issue 25: the dry line used to carry an empty DOCKYARD_IMAGE_ID, and the README another memlock)."""

from __future__ import annotations

import os

import pytest

from dockyard import engine
from tests.support.cli import invoke

pytestmark = pytest.mark.engine


def _docker_run_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("+ ") and " run --rm " in line)


def test_the_dry_line_is_the_line_that_runs(cpu_image, settings, tmp_path):
    run_id = f"dry-{os.getpid()}"
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}
    args = ["run", "--variant=cpu", "--recipe=ddp", f"--run-id={run_id}", "--", "--max_steps", "1"]
    dry = invoke(*args[:1], "--dry", *args[1:], env=env)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / run_id).exists(), "a dry run makes nothing"
    real = invoke(*args, env=env, timeout=900)
    assert real.returncode == 0, real.stderr[-3000:]
    assert _docker_run_line(dry.stderr) == _docker_run_line(real.stderr)
    image_id = engine.image_inspect(settings, cpu_image)["Id"]
    assert f"DOCKYARD_IMAGE_ID={image_id}" in _docker_run_line(dry.stderr)
