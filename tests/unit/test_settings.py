"""The settings as a task uses them: what the model keeps is what is run (a `~` expanded once, where it is checked),
and a command setting that cannot be run is refused by name before any task starts."""

from __future__ import annotations

import subprocess

import pytest

from dockyard import engine
from dockyard.cli import release_setting_overrides
from dockyard.settings import Settings
from dockyard.transport import remote
from dockyard.transport.remote import Remote
from tests.support.cli import invoke_here, short_error

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


@pytest.mark.parametrize("key,value,says", [
    ("SSH", "ssh -o 'x", "cannot be split into words as a shell would (no closing quotation)"),
    ("SSH", "", "must name a command and its options, as in ssh"),
    ("SSH", "   ", "must name a command and its options"),
    ("COMPOSE", 'docker "compose', "no closing quotation"),
    ("COMPOSE", "", "as in docker compose"),
])
def test_a_command_setting_that_cannot_be_run_is_refused_naming_it(key, value, says):
    """`INVOKE_DOCKYARD_SSH="ssh -o 'x"` was a ValueError traceback from shlex in `doctor --peer`, and an empty one
    ssh's "`-G` not found"."""
    r = invoke_here("doctor", "--peer=127.0.0.1", env={f"INVOKE_DOCKYARD_{key}": value})
    short_error(r, f"INVOKE_DOCKYARD_{key}=")
    assert says in r.stderr


def test_the_ssh_setting_reads_a_config_file_under_home_as_a_shell_would(tmp_path, monkeypatch):
    """invoke.yaml's example `ssh -F ~/.ssh/cluster.conf`: ssh does not expand a `~` given to -F, a shell does."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "cluster.conf").write_text("Host node7\n  Port 2299\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = remote.ssh_argv(Settings(ssh="ssh -F ~/.ssh/cluster.conf -o 'User gpu'"), Remote("node7"), "true")
    said = subprocess.run([*argv[:-3], "-G", *argv[-3:-1]], capture_output=True, text=True, check=True).stdout
    assert "port 2299" in said.splitlines() and "user gpu" in said.splitlines()
