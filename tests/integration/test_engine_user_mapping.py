"""Docker engines that map users, as admins set them up on shared servers: rootless Docker (dockerd run by a user,
the container's root mapped to that user, every other uid to a subordinate one) and a rootful dockerd with
--userns-remap (every uid mapped). Every dockyard container ran as `--user $(id -u):$(id -g)` with `--ipc=host`:
on both, runc could not even start it ("mount mqueue ... operation not permitted": the host's IPC namespace from a
user namespace), and as a mapped uid it could not have written the user's run folder. Every `invoke run` failed.

Real engines, each its own data root and socket and no network of its own, holding the Debian base image `invoke
setup` made; containers are started with the project's own argv (docker_run_argv, and run.sh's) and must leave a
file in the run folder, the user's.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dockyard import engine
from dockyard.launch import command as launch_command
from dockyard.launch import node, runscript

ROOTLESS_USER = "dyrootless"  # made here when missing: rootless Docker is a user's own engine
ROOTLESS_SCRIPT = Path("/usr/share/docker.io/contrib/dockerd-rootless.sh")  # Debian's docker.io (rootlesskit, uidmap)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _start(settings, root: Path, argv: list[str], sock: str, user: str | None = None) -> subprocess.Popen:
    """dockerd (as `user` where given) on `sock`, up and holding the base image. It runs in a network namespace of
    its own, empty: a dockerd in this host's, even with --bridge=none, removes the system engine's docker0 bridge, and
    every container of the system engine then fails to start ("could not find bridge docker0")."""
    env = {**os.environ, "DOCKER_HOST": sock}
    argv = ["unshare", "--net", "--", *argv]
    if user:
        pw = pwd.getpwnam(user)
        env |= {"HOME": pw.pw_dir, "USER": user, "XDG_RUNTIME_DIR": str(root / "run"),
                "PATH": f"{ROOTLESS_SCRIPT.parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                # no network of its own (rootlesskit would want a tap device), nothing published
                "DOCKERD_ROOTLESS_ROOTLESSKIT_NET": "host", "DOCKERD_ROOTLESS_ROOTLESSKIT_PORT_DRIVER": "none",
                "DOCKERD_ROOTLESS_ROOTLESSKIT_MTU": "0"}
        argv[3:3] = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    proc = subprocess.Popen(argv, stdout=open(root / "dockerd.log", "wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=root, start_new_session=True)
    for _ in range(60):
        if proc.poll() is not None or subprocess.run(engine.docker(settings, "info"), env=env,
                                                     capture_output=True).returncode == 0:
            break
        time.sleep(1)
    if proc.poll() is not None or subprocess.run(engine.docker(settings, "info"), env=env, capture_output=True).returncode:
        pytest.fail(f"{argv[0]} did not start: {(root / 'dockerd.log').read_text()[-2000:]}")
    saved = subprocess.Popen(engine.docker(settings, "save", settings.base_image_cpu), stdout=subprocess.PIPE,
                             env={**os.environ})
    subprocess.run(engine.docker(settings, "load", "-q"), env=env, stdin=saved.stdout, check=True, capture_output=True)
    assert saved.wait() == 0
    return proc


def _stop(settings, proc: subprocess.Popen, sock: str, root: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": sock}
    ids = subprocess.run(engine.docker(settings, "ps", "-aq"), env=env, capture_output=True, text=True).stdout.split()
    if ids:
        subprocess.run(engine.docker(settings, "rm", "-f", *ids), env=env, capture_output=True)
    os.killpg(proc.pid, 15)  # rootlesskit, its dockerd and containerd are its session
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    subprocess.run(["umount", "-R", root / "data"], capture_output=True)  # what a dockerd left mounted, if any
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["userns-remap", "rootless"])
def mapped(request, settings, engine_ready, monkeypatch_module):
    """(kind, the user whose run folder it is) with DOCKER_HOST set to an engine of that kind; its data root is
    outside pytest's folders (0700), which a mapped root could not pass through."""
    for ids in (Path("/etc/subuid"), Path("/etc/subgid")):  # both engines map through them; usermod and useradd
        ids.touch(mode=0o644, exist_ok=True)                 # add ranges only to files that exist
    root = Path(tempfile.mkdtemp(prefix=f"dockyard-{request.param}-"))
    root.chmod(0o755)
    sock = f"unix://{root}/run/docker.sock"
    (root / "run").mkdir()
    if request.param == "userns-remap":
        argv = ["dockerd", "--userns-remap=default", "--data-root", root / "data", "--exec-root", root / "exec",
                "--pidfile", root / "docker.pid", "-H", sock, "--bridge=none", "--iptables=false", "--ip6tables=false"]
        user = None
        owner = os.getuid()
    else:
        if subprocess.run(["id", ROOTLESS_USER], capture_output=True).returncode:
            subprocess.run(["useradd", "--create-home", ROOTLESS_USER], check=True)
        for ids in (Path("/etc/subuid"), Path("/etc/subgid")):
            _subordinate_ids(ids, ROOTLESS_USER)
        owner = pwd.getpwnam(ROOTLESS_USER).pw_uid
        subprocess.run(["chown", "-R", f"{owner}:{owner}", root], check=True)
        argv = [ROOTLESS_SCRIPT, "--data-root", root / "data", "--exec-root", root / "exec", "--pidfile",
                root / "docker.pid", "-H", sock, "--bridge=none", "--iptables=false"]
        user = ROOTLESS_USER
    bridge = _bridge()
    proc = _start(settings, root, [str(a) for a in argv], sock, user)
    try:
        monkeypatch_module.setenv("DOCKER_HOST", sock)
        yield request.param, owner, proc
    finally:
        monkeypatch_module.delenv("DOCKER_HOST")
        _stop(settings, proc, sock, root)
        assert _bridge() == bridge, "the system engine's docker0 bridge is as it was"


def _subordinate_ids(ids: Path, user: str, count: int = 65536) -> None:
    """A range of subordinate ids for `user` in /etc/subuid (or subgid), after the ranges there: useradd gives one
    only where the file already exists, which a fresh host may not have."""
    lines = ids.read_text().splitlines() if ids.exists() else []
    if any(line.split(":")[0] == user for line in lines):
        return
    ends = [int(f[1]) + int(f[2]) for f in (line.split(":") for line in lines) if len(f) == 3 and f[1].isdigit()
            and f[2].isdigit()]
    with open(ids, "a") as f:
        f.write(f"{user}:{max([300000, *ends])}:{count}\n")


def _bridge() -> bool:
    return subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0


def test_the_engine_s_mapping_is_told_from_docker_info(settings, mapped):
    kind, _, _ = mapped
    assert engine.user_mapping(engine.engine_info(settings)) == kind.split("-")[0]


def test_a_container_started_as_the_project_starts_one_writes_the_users_run_folder(settings, mapped, tmp_path_factory):
    """The run folder is the user's (0755, as `invoke run` makes it); what the container writes there is the user's."""
    kind, owner, proc = mapped
    runs = Path(tempfile.mkdtemp(prefix="dockyard-runs-"))
    try:
        runs.chmod(0o755)
        run_dir = runs / "r1"
        run_dir.mkdir(mode=0o755)
        (runs / "hf").mkdir()
        for folder in (runs, run_dir, runs / "hf"):
            os.chown(folder, owner, owner)
        mine = settings.model_copy(update={"hf_cache": runs / "hf"})  # the user's own, as ~/.cache/huggingface
        inside = f"{node.RUNS_INSIDE}/{run_dir.name}/train.log"
        info = engine.engine_info(settings)
        argv = launch_command.docker_run_argv(mine, settings.base_image_cpu, gpus=False, run_dir=run_dir,
                                              name=f"dy-{kind}", env={}, network_host=False, interactive="", mounts=[],
                                              command=["sh", "-c", f"echo trained > {inside}; df -k /dev/shm"],
                                              engine_info=info, memlock=memlock_of(proc) if kind != "rootless" else None)
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        log = run_dir / "train.log"
        assert log.read_text() == "trained\n" and log.stat().st_uid == owner
        shm_kib = int(done.stdout.splitlines()[-1].split()[1])
        assert shm_kib >= 1 << 20, "a /dev/shm of at least 1 GiB (Docker's own is 64 MB): NCCL needs it"
        # the flags every run got before: the container does not even start
        log.unlink()
        sharing = engine.host_sharing_flags(info)
        at = next(i for i in range(len(argv)) if argv[i:i + len(sharing)] == sharing)
        before = argv[:at] + engine.host_sharing_flags({}) + argv[at + len(sharing):]
        assert subprocess.run(before, capture_output=True, text=True).returncode != 0 and not log.exists()
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def memlock_of(proc: subprocess.Popen) -> str:
    """The --ulimit memlock a container of this dockerd may have. `invoke run` reads the system dockerd's from its pid
    file, and a rootless engine's is its user's (engine.daemon_memlock_hard_limit, which the rootless case takes):
    this test's rootful dockerd is not the system's, so its own, read from /proc."""
    line = next(x for x in Path(f"/proc/{proc.pid}/limits").read_text().splitlines()
                if x.startswith("Max locked memory"))
    hard = line.split()[4]
    return launch_command.memlock_flag(None if hard == "unlimited" else int(hard), say=False)


def test_run_sh_on_such_a_node_starts_the_container_as_invoke_run_does(settings, mapped, tmp_path):
    """The air-gapped launcher asks the node's engine the same question (`sh run.sh --dry` prints its command)."""
    (tmp_path / "run.sh").write_text(runscript.render(settings, settings.base_image_cpu, "cpu"))
    proc = subprocess.run(["sh", "run.sh", f"--image={settings.base_image_cpu}", "--recipe=ddp", "--dry"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert shlex.join(engine.host_sharing_flags(engine.engine_info(settings))) in proc.stdout
