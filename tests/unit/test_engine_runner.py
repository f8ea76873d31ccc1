"""The one runner: single commands and pipelines, and how their failures are quoted."""

from __future__ import annotations

import pytest

from dockyard import engine
from dockyard.common.errors import DockyardError


def test_a_failed_command_is_quoted_with_its_exit_code_and_output():
    with pytest.raises(DockyardError) as e:
        engine.run(["sh", "-c", "echo 'no space left' >&2; exit 3"], capture=True, quiet=True, what="copying x")
    assert str(e.value) == "copying x failed (exit 3): sh -c 'echo '\"'\"'no space left'\"'\"' >&2; exit 3'\n" \
                           "  | no space left"
    with pytest.raises(DockyardError, match="`no-such-tool-here` not found"):
        engine.run(["no-such-tool-here"], quiet=True)


def test_a_missing_command_points_to_its_setting_only_where_one_names_it(tmp_path):
    """Every missing tool was told to "set its path in invoke.yaml", zstd and pigz too, which no setting names."""
    with pytest.raises(DockyardError) as e:
        engine.run([str(tmp_path / "ssh"), "-V"], quiet=True)
    assert str(e.value) == (f"`{tmp_path / 'ssh'}` not found: install it, or give its path as `ssh:` under "
                            "`dockyard:` in invoke.yaml (INVOKE_DOCKYARD_SSH)")
    with pytest.raises(DockyardError) as e:
        engine.run(["zstd-not-here", "-V"], quiet=True)
    assert str(e.value) == "`zstd-not-here` not found: install it (it is looked for on PATH)"
    with pytest.raises(DockyardError) as e:  # a path is not looked for on PATH
        engine.run([str(tmp_path / "zstd"), "-V"], quiet=True)
    assert str(e.value) == f"`{tmp_path / 'zstd'}` not found: install it"


def test_binary_output_stays_bytes():
    assert engine.run(["printf", "\\377\\000"], capture=True, binary=True, quiet=True).stdout == b"\xff\x00"


def test_a_pipeline_streams_between_its_commands(capsys):
    with engine.Pipeline(["cat"], ["tr", "a-z", "A-Z"], stdin=engine.PIPE, stdout=engine.PIPE) as p:
        p.stdin.write(b"hello\n")
        p.stdin.close()
        assert p.stdout.read() == b"HELLO\n"
        assert p.wait() == [0, 0]
    assert capsys.readouterr().err == "+ cat | tr a-z A-Z\n"


def test_a_failing_stage_is_quoted_like_a_single_command(capsys):
    failing = ["sh", "-c", "cat > /dev/null; echo 'docker load: invalid tar header' >&2; exit 1"]
    with engine.Pipeline(["printf", "data"], failing, stdout=engine.TAIL, what="loading x.tar.zst") as p:
        with pytest.raises(DockyardError) as e:
            p.wait()
    assert str(e.value) == (f"loading x.tar.zst failed (exit 1): {engine.quote(failing)}\n"
                            "  | docker load: invalid tar header")
    assert p.returncodes == [0, 1]


def test_the_last_commands_output_can_be_kept_for_the_error(capsys):
    with engine.Pipeline(["sh", "-c", "echo out; echo err >&2"], stdout=engine.TAIL, quiet=True) as p:
        p.wait()
        assert p.output() == ["out", "err"]
    assert capsys.readouterr() == ("", "")


def test_leaving_a_pipeline_by_an_exception_stops_its_commands():
    with pytest.raises(KeyError):
        with engine.Pipeline(["sleep", "60"], quiet=True) as p:
            raise KeyError("the caller failed")
    assert p.procs[0].returncode is not None and p.procs[0].returncode < 0
    with pytest.raises(DockyardError, match="`no-such-tool-here` not found"):
        engine.Pipeline(["cat"], ["no-such-tool-here"], stdin=engine.PIPE, quiet=True)


@pytest.mark.parametrize("euid", [1000, 0], ids=["a user", "root"])
def test_no_engine_advice_gives_a_setup_command_root_can_run_from_a_venv(tmp_path, monkeypatch, euid):
    """`sudo invoke setup` fails from a venv (root's PATH has no invoke): the advice names this Python instead.
    Root was told `sudo ...` too, where many root hosts (a cloud VM, a container) have no sudo: root is given none."""
    import shlex
    import sys

    from dockyard.settings import Settings

    monkeypatch.setattr(engine.os, "geteuid", lambda: euid)
    silent = tmp_path / "docker"
    silent.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    silent.chmod(0o755)
    with pytest.raises(DockyardError) as e:
        engine.engine_info(Settings(docker=str(silent)))
    said = str(e.value)
    sudo = "sudo " if euid else ""
    assert f"`{sudo}{shlex.quote(sys.executable)} -m invoke setup`" in said and "`sudo invoke setup`" not in said
    assert f"`{sudo}apt-get install docker.io && {sudo}systemctl start docker`" in said
    assert ("sudo" in said) == bool(euid)
    assert "(Cannot connect to the Docker daemon)" in said


RUNS_A_COMMAND = """
import sys
from dockyard import engine
try:
    engine.run(["sh", "-c", "trap 'echo TERM > got; exit 0' TERM; echo started; sleep 60 & wait"], check=False)
except engine.Interrupted as e:
    print(f"interrupted, stopped={e.stopped}", flush=True)
    sys.exit(e.exit_code)
"""


def test_sigterm_reaches_the_command_and_ends_as_an_interrupt_does(tmp_path):
    """SIGTERM to `invoke run` (systemd, a CI job's end, kill) ended invoke alone: its docker client died and the
    training container ran on, holding the name its resume needs. Now the command gets it too, and the task ends
    through Ctrl-C's path (the command that continues the run), with 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from dockyard import ROOT

    p = subprocess.Popen([sys.executable, "-c", RUNS_A_COMMAND], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "started"
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)  # to this process alone, not its group
    out, _ = p.communicate(timeout=60)
    assert (tmp_path / "got").read_text().strip() == "TERM", "the command was not told"
    assert "interrupted, stopped=True" in out and p.returncode == 143, out


def test_a_docker_setting_that_names_no_docker_client_is_one_error_line(tmp_path):
    """INVOKE_DOCKYARD_DOCKER=/bin/echo: `invoke doctor` and `invoke run` were a JSONDecodeError traceback."""
    from dockyard.settings import load

    settings = load({"docker": "/bin/echo"}, environ={})  # not the INVOKE_DOCKYARD_DOCKER this runs with
    with pytest.raises(DockyardError, match=r"`/bin/echo image inspect` did not answer as a Docker client does"):
        engine.image_inspect(settings, "dockyard:0.1.0-cpu")
    with pytest.raises(DockyardError, match=r"`/bin/echo info` did not answer as a Docker client does"):
        engine.engine_info(settings)


def test_a_client_that_is_no_docker_client_is_named_as_found_when_the_setting_is_left_empty(monkeypatch):
    """The docker setting is "" by default (the first client on PATH): the error said "`` info` did not answer"."""
    from dockyard.settings import load

    monkeypatch.setattr(engine, "docker_binary", lambda setting="": setting or "/bin/echo")
    settings = load({"docker": ""}, environ={})
    with pytest.raises(DockyardError, match=r"^`/bin/echo info` did not answer as a Docker client does"):
        engine.engine_info(settings)


@pytest.mark.parametrize("args", [("save", "--variant=cpu"), ("commit", "--container=abc"),
                                  ("ship", "--image=dockyard:0.1.0-cpu", "--to=127.0.0.1")])
def test_an_engine_that_does_not_answer_is_said_as_such_not_as_a_missing_image(args, tmp_path):
    """The real docker client, pointed at a socket nothing listens on: save and ship said "no image
    dockyard:0.1.0-cpu in the engine: build it", commit "no container abc", sending the user to build what was built."""
    from tests.support.cli import invoke_here, short_error

    r = invoke_here(*args, env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock", "INVOKE_DOCKYARD_DOCKER": ""})
    short_error(r, "no Docker engine answers")
    assert "Cannot connect to the Docker daemon" in r.stderr and "build it" not in r.stderr


DENIED = ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
          "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/info\": dial unix /var/run/docker.sock: connect: permission denied")


def test_a_user_outside_the_docker_group_is_told_to_join_it_not_to_install_an_engine(tmp_path):
    """The newcomer's first `invoke build` after `sudo .venv/bin/invoke setup`: the engine runs, the socket refuses
    a user outside the docker group, and every task (doctor's fix column too) said "no Docker engine answers.
    Install and start one: `sudo ... invoke setup`", which was done and changes nothing. load.sh and run.sh said the
    fix; the tasks now say the same."""
    from dockyard.machine import doctor
    from dockyard.settings import load

    client = tmp_path / "docker"
    client.write_text(f"#!/bin/sh\necho '{DENIED}' >&2\nexit 1\n")
    client.chmod(0o755)
    settings = load({"docker": str(client)}, environ={})
    with pytest.raises(DockyardError) as e:
        engine.engine_info(settings)
    said = str(e.value)
    assert "sudo usermod -aG docker" in said and "log in again" in said and "Install and start" not in said
    assert said.splitlines()[-1] == f"  ({DENIED})"
    assert "usermod -aG docker" in doctor.check_engine_down(e.value).fix


def test_an_engine_reached_over_ssh_that_refuses_the_key_is_not_a_matter_of_the_docker_group(tmp_path):
    """DOCKER_HOST=ssh://... with a key the remote host refuses: docker's last words end in ssh's "Permission denied
    (publickey)", and the user was told to join this host's docker group, which changes nothing."""
    from dockyard.settings import load

    said = ('error during connect: Get "http://docker.example.com/v1.47/info": command [ssh -o ConnectTimeout=30 -T '
            "-l alice -- gpu-a docker system dial-stdio] has exited with exit status 255, make sure the URL is valid, "
            "and Docker 18.09 or later is installed on the remote host: stderr=alice@gpu-a: Permission denied (publickey).")
    client = tmp_path / "docker"
    client.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 1\n")
    client.chmod(0o755)
    with pytest.raises(DockyardError) as e:
        engine.engine_info(load({"docker": str(client)}, environ={}))
    assert "usermod" not in str(e.value) and "Set DOCKER_HOST" in str(e.value)
    assert str(e.value).splitlines()[-1] == f"  ({said})"
