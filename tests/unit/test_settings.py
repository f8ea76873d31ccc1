"""The settings as a task uses them: what the model keeps is what is run (a `~` expanded once, where it is checked),
and a command setting that cannot be run is refused by name before any task starts."""

from __future__ import annotations

from dockyard import engine
from dockyard.cli import release_setting_overrides
from dockyard.settings import Settings
from tests.support.cli import invoke_here

release_setting_overrides()  # importing tasks.py (through invoke_here) holds INVOKE_DOCKYARD_* back


def a_client(home) -> str:
    (home / "bin").mkdir(parents=True)
    client = home / "bin" / "docker"
    client.write_text("#!/bin/sh\nexit 1\n")
    client.chmod(0o755)
    return str(client)


def test_a_docker_client_under_home_is_run_by_the_path_it_names(tmp_path, monkeypatch):
    client = a_client(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert engine.docker(Settings(docker="~/bin/docker"), "info")[0] == client
    r = invoke_here("run", "--dry", "--variant=cpu", env={"HOME": str(tmp_path), "INVOKE_DOCKYARD_DOCKER": "~/bin/docker",
                                                        "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert f"+ {client} run --rm" in r.stderr and "'~/bin/docker'" not in r.stderr
