"""A run whose container docker refuses to start leaves nothing behind that blocks running it again (issue 11)."""

from __future__ import annotations

import os
import subprocess

import pytest

from dockyard import engine
from tests.support.cli import invoke

pytestmark = pytest.mark.engine


def test_a_run_docker_refused_to_start_can_be_run_again(cpu_image, settings, tmp_path):
    run_id = f"retry-{os.getpid()}"
    blocker = f"dockyard-{run_id}"  # the run's container name, already taken: docker refuses to start it
    subprocess.run(engine.docker(settings, "create", "--name", blocker, cpu_image, "true"), check=True,
                   capture_output=True)
    try:
        env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)}
        r = invoke("run", "--variant=cpu", f"--run-id={run_id}", "--", "--max_steps", "1", env=env, timeout=600)
        assert r.returncode != 0 and "nothing was kept" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / run_id).exists()
        again = invoke("run", "--dry", "--variant=cpu", f"--run-id={run_id}", env=env)
        assert again.returncode == 0 and "already holds a run" not in again.stderr
    finally:
        subprocess.run(engine.docker(settings, "rm", "-f", blocker), capture_output=True)
