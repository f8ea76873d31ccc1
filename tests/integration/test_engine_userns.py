"""A Docker engine that remaps user namespaces (dockerd --userns-remap, as admins set it on shared servers): every
container uid maps to a subordinate one on the host, so a container started as the user (`--user uid:gid`, what
every dockyard `docker run` does) could not write the user's run folder; and with `--ipc=host` (NCCL's shared
memory) in the remapped namespace, runc could not even start it. Every `invoke run` failed there.

A real second dockerd with --userns-remap=default (its own data root and socket, no network of its own) holds the
Debian base image `invoke setup` made; the containers are started with the project's own argv (docker_run_argv,
and run.sh's) and must leave a file in the run folder, the user's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dockyard import engine
from dockyard.launch import node, runscript
from dockyard.launch import run as launch_run


@pytest.fixture(scope="module")
def remapped(settings, engine_ready, monkeypatch_module):
    """DOCKER_HOST for a userns-remapped dockerd holding the base image; stopped and removed after the module. Its
    data root is outside pytest's folders (0700): the remapped root must be able to pass through every folder above."""
    root = Path(tempfile.mkdtemp(prefix="dockyard-userns-"))
    root.chmod(0o711)
    sock = f"unix://{root}/docker.sock"
    proc = subprocess.Popen(
        ["dockerd", "--userns-remap=default", "--data-root", root / "data", "--exec-root", root / "exec",
         "--pidfile", root / "docker.pid", "-H", sock, "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=open(root / "dockerd.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    env = {**os.environ, "DOCKER_HOST": sock}
    try:
        for _ in range(60):
            if subprocess.run([settings.docker, "info"], env=env, capture_output=True).returncode == 0 \
                    or proc.poll() is not None:
                break
            time.sleep(1)
        if proc.poll() is not None or subprocess.run([settings.docker, "info"], env=env).returncode:
            pytest.fail(f"the userns-remap dockerd did not start: {(root / 'dockerd.log').read_text()[-2000:]}")
        saved = subprocess.Popen([settings.docker, "save", settings.base_image_cpu], stdout=subprocess.PIPE)
        subprocess.run([settings.docker, "load", "-q"], env=env, stdin=saved.stdout, check=True, capture_output=True)
        assert saved.wait() == 0
        monkeypatch_module.setenv("DOCKER_HOST", sock)
        yield proc.pid
    finally:
        ids = subprocess.run([settings.docker, "ps", "-aq"], env=env, capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([settings.docker, "rm", "-f", *ids], env=env, capture_output=True)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-R", root / "data"], capture_output=True)  # what dockerd left mounted, if any
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def memlock_of(pid: int) -> str:
    """The --ulimit a container of this dockerd may have: its own hard limit (`invoke run` reads the system
    dockerd's the same way: engine.daemon_memlock_hard_limit)."""
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max locked memory"))
    return launch_run.memlock_flag(None if line.split()[4] == "unlimited" else int(line.split()[4]), say=False)


def test_a_remapping_engine_is_told_from_docker_info(settings, remapped):
    info = engine.engine_info(settings)
    assert "name=userns" in " ".join(info["SecurityOptions"])
    assert engine.container_user(info)[0] == "--userns=host"


def test_a_container_started_as_the_project_starts_one_writes_the_users_run_folder(settings, remapped, tmp_path):
    """The run folder is the user's (0755, as `invoke run` makes it); what the container writes there is the user's."""
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True, mode=0o755)
    inside = f"{node.RUNS_INSIDE}/{run_dir.name}/train.log"
    argv = launch_run.docker_run_argv(settings, settings.base_image_cpu, gpus=False, run_dir=run_dir, name="dy-userns",
                                      env={}, network_host=False, interactive=False, mounts=[],
                                      command=["sh", "-c", f"echo trained > {inside}"],
                                      engine_info=engine.engine_info(settings), memlock=memlock_of(remapped))
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = run_dir / "train.log"
    assert log.read_text() == "trained\n" and log.stat().st_uid == os.getuid()
    # the flags every run got before: in the remapped namespace the container does not even start (`--ipc=host` there:
    # "mount mqueue ... operation not permitted"), and as a remapped uid it could not write the folder either
    log.unlink()
    at = argv.index("--userns=host")
    before = argv[:at] + engine.container_user({}) + argv[at + 3:]
    proc = subprocess.run(before, capture_output=True, text=True)
    assert proc.returncode != 0 and not log.exists()


def test_run_sh_on_a_remapping_node_runs_as_the_user(settings, remapped, tmp_path):
    """The air-gapped launcher asks the node's engine the same question (`sh run.sh --dry` prints its command)."""
    (tmp_path / "run.sh").write_text(runscript.render(settings, settings.base_image_cpu, "cpu"))
    proc = subprocess.run(["sh", "run.sh", f"--image={settings.base_image_cpu}", "--recipe=ddp", "--dry"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert f"--userns=host --user {os.getuid()}:{os.getgid()}" in proc.stdout

