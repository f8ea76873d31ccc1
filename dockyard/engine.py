"""The Docker CLI: which client binary to use, argv builders, and the ONE runner every task uses.

The runner (`run` for one command, `Pipeline` for commands connected by pipes, `start_detached` for a
daemon) echoes each command and, on failure, raises a DockyardError that quotes the exact command, its
exit code and the end of its output (`failure`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import io
import itertools
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from dockyard import console
from dockyard.common.errors import DockyardError, paths_as, raised_outside_a_class_being_built, short
from dockyard.settings import IMAGE_NAME, Settings

# `invoke setup` as root, by this Python's path: a venv's invoke is not on root's PATH, so `sudo invoke setup` fails
SUDO_SETUP = f"sudo {shlex.quote(sys.executable)} -m invoke setup"


def no_engine_help() -> str:
    """How to get an engine, said to whoever runs the task: root is given no `sudo` (many root hosts have none:
    "sudo: command not found")."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    return (f"no Docker engine answers. Install and start one: `{sudo}{SUDO_SETUP.removeprefix('sudo ')}` "
            f"(Debian/Ubuntu), or `{sudo}apt-get install docker.io && {sudo}systemctl start docker`; where no init "
            f"system runs, `{sudo}setsid dockerd >dockerd.log 2>&1 &`. Set DOCKER_HOST if your engine listens elsewhere.")


# The engine runs, but its socket lets in only root and the docker group (load.sh and run.sh say the same)
NO_ACCESS_HELP = (
    "the Docker engine's socket lets in only root and the docker group: add your user to it, "
    "`sudo usermod -aG docker $(id -un)`, then log in again; or run the task as root, "
    f"`sudo {shlex.quote(sys.executable)} -m invoke TASK`."
)


def no_engine(said: str) -> DockyardError:
    """No engine answered docker, whose last words were `said`: a socket that refuses this user is no missing engine.
    Said in docker's words for its socket ("... the Docker daemon socket at", 28's "... the docker API at"): ssh's
    "Permission denied (publickey)" for a DOCKER_HOST=ssh:// is no matter of this host's docker group."""
    denied = "permission denied while trying to connect to the docker" in said.lower()
    return DockyardError(f"{NO_ACCESS_HELP if denied else no_engine_help()}\n  ({said})")


def quote(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def familiar(ref: str) -> str:
    """An image reference as `docker image ls` shows it: `t:1` for docker.io/library/t:1 (and library/t:1)."""
    short = ref.removeprefix("docker.io/")
    return short.removeprefix("library/") if short.count("/") == 1 else short


# The user part of a URL (`https://alice:TOKEN@pypi.corp/simple`, `https://TOKEN@host`): a private index's token in
# the index_url setting. What is printed (the echo, --dry, an error quoting its command) says `***` instead.
_URL_USER = re.compile(r"(://)[^/\s]*@")  # to the last @ before the host, as pip and uv split it


def shown(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A command (with the environment it is given) as printed for a user: shell-quoted, credentials hidden."""
    words = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()] + [shlex.quote(str(a)) for a in argv]
    return _URL_USER.sub(r"\1***@", " ".join(words))


def echo(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    print(f"+ {shown(argv, env)}", file=sys.stderr, flush=True)


def echo_pipeline(*argvs: Sequence[str]) -> None:
    print("+ " + " | ".join(shown(a) for a in argvs), file=sys.stderr, flush=True)


def failure(argv: Sequence[str], returncode: int, output: Sequence[str], what: str = "") -> DockyardError:
    """How every failed command is reported: what failed, the exit code, the command, its last output lines."""
    label = f"{what} failed" if what else "command failed"
    return DockyardError(f"{label} (exit {returncode}): {shown(argv)}\n{console.tail(output)}".rstrip())


# The commands a setting names (settings.Settings): docker's client, compose and ssh; any other is found on PATH
COMMAND_SETTINGS = {"docker": "docker", "docker-compose": "compose", "ssh": "ssh"}


def _not_found(argv: Sequence[str]) -> DockyardError:
    """A command that is not there: where a setting names it, said with the setting (it said so for zstd too)."""
    setting = COMMAND_SETTINGS.get(os.path.basename(argv[0]))
    where = (f", or give its path as `{setting}:` under `dockyard:` in invoke.yaml (INVOKE_DOCKYARD_{setting.upper()})"
             if setting else " (it is looked for on PATH)" if "/" not in argv[0] else "")
    return DockyardError(f"`{argv[0]}` not found: install it{where}")


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
    check: bool = True,
    quiet: bool = False,
    input: bytes | None = None,
    cwd: Path | None = None,
    what: str = "",
    on_line=None,
    binary: bool = False,
    merge_stderr: bool = False,
    timeout: float | None = None,
    host_paths: bool = False,
    progress: Callable[[str], bool] | None = None,
) -> subprocess.CompletedProcess:
    """Run one command. `env` is added to the current environment.

    capture=True returns stdout (text, or bytes with binary=True) without printing it, with stderr in it too
    where merge_stderr; otherwise output streams to the terminal and only its last lines are kept for the error
    message; `on_line` sees each streamed line. `timeout` (capture only): seconds before it is stopped, an error.
    `host_paths`: a `docker run`'s streamed lines say the paths it mounts as this host's (container_paths_shown).
    `progress`: the output is read as frames ended by \r or \n (a progress line redrawn in place, rsync's), each
    offered to it as it comes; one it takes (True) is not printed, the others are, as lines.
    """
    argv = [str(a) for a in argv]
    if not quiet:
        echo(argv, env)
    full_env = {**os.environ, **(env or {})}
    p = None
    as_host = container_paths_shown(argv) if host_paths else (lambda text: text)
    try:
        if capture:
            proc = subprocess.run(argv, env=full_env, cwd=cwd, input=input, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, timeout=timeout)
            out = proc.stdout if binary else proc.stdout.decode(errors="replace")
            err = out if merge_stderr and not binary else (proc.stderr or b"").decode(errors="replace")
            tail = err.strip().splitlines()[-console.TAIL_LINES:]
        else:
            tail_lines: collections.deque[str] = collections.deque(maxlen=console.TAIL_LINES)
            started: list[subprocess.Popen] = []
            # the SIGTERM handler before the command starts: one between the two killed this process outright, the
            # command (a training container) left running
            with sigterm_as_interrupt(started):
                p = subprocess.Popen(
                    argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE if input is not None else None,
                )
                started.append(p)
                if input is not None:
                    p.stdin.write(input)
                    p.stdin.close()
                # universal newlines: a \r ends a frame, read as it comes (read by \n, a redrawn line waited for the end)
                frames = io.TextIOWrapper(p.stdout, errors="replace", newline=None) if progress else None
                for raw in frames or p.stdout:
                    line = as_host(raw if frames else raw.decode(errors="replace"))
                    if progress and (not line.strip() or progress(line.strip())):
                        continue  # (a frame's \r after a \n reads as an empty line between them)
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    tail_lines.append(line.rstrip())
                    if on_line:
                        on_line(line.rstrip())
                p.wait()
            proc = subprocess.CompletedProcess(argv, p.returncode, "", "")
            out, tail = "", list(tail_lines)
    except FileNotFoundError:
        raise _not_found(argv) from None
    except subprocess.TimeoutExpired:
        raise DockyardError(f"no answer in {timeout:g} s: {shown(argv)}") from None
    except KeyboardInterrupt as e:
        code = interrupt_status(e)
        if p is not None and p.stdout is not None:
            # Ctrl-C reached the command too (one process group): its last words are shown while it stops
            rest = threading.Thread(target=_show_rest, args=(p.stdout, as_host), daemon=True)
            rest.start()
            with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):  # another Ctrl-C: at once
                p.wait(timeout=STOP_WAIT)
                rest.join(timeout=2)  # its last lines, printed before what this says
        _INTERRUPTED.append(code)
        raise Interrupted(f"interrupted: {shown(argv)}", stopped=p is None or p.poll() is not None,
                          exit_code=code) from None
    if check and proc.returncode != 0:
        raise failure(argv, proc.returncode, tail, what)
    return subprocess.CompletedProcess(argv, proc.returncode, out, "\n".join(tail))


@contextlib.contextmanager
def sigterm_as_interrupt(commands: list[subprocess.Popen] | None = None):
    """SIGTERM (systemd, a CI job's end, `kill`) while the block runs is raised as KeyboardInterrupt("SIGTERM"), so
    that the task's own clean-up for Ctrl-C runs for both (interrupt_status gives each its exit status); main thread
    only. The commands the block runs (`commands`, filled as it starts them) are sent the SIGTERM first: Ctrl-C
    reaches the whole process group, SIGTERM reached this process alone, which died and left the command running (a
    training container went on, holding the name its resume needs). Never raised inside a class being built
    (raised_outside_a_class_being_built): Python 3.11 raised it there wrapped in a RuntimeError, a traceback and
    status 1 (cli.ctrl_c_outside_classes_being_built, for Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        for p in commands or ():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)  # `docker run` passes it to the container's init; torchrun to its workers
        raise KeyboardInterrupt(signal.Signals(signum).name)

    handler = raised_outside_a_class_being_built(stop)
    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        try:
            handler.flush()  # a SIGTERM held back in the block's last moment: raised here, before the one put back
        finally:
            signal.signal(signal.SIGTERM, before)


class Interrupted(DockyardError):
    """Ctrl-C: `stopped` says whether the command had ended by the time this returned (within STOP_WAIT)."""

    def __init__(self, message: str, stopped: bool, exit_code: int | None = None):
        super().__init__(message, exit_code=exit_code or INTERRUPTED)  # 130 for Ctrl-C, 143 for SIGTERM
        self.stopped = stopped


# The statuses of the commands a signal interrupted (run's Interrupted), until the task's end takes them
# (interrupted_commands): an Interrupted is a DockyardError, which code that runs a command as a check takes for the
# check's failure (doctor's container probe: "1 check(s) failed", status 1) and goes on from
_INTERRUPTED: list[int] = []


def interrupted_commands() -> int | None:
    """The status (130 for Ctrl-C, 143 for SIGTERM) of the first command a signal interrupted since the last call, or
    None; forgotten once said (cli.checked: a task ends as interrupted, whatever it made of it)."""
    first = _INTERRUPTED[0] if _INTERRUPTED else None
    _INTERRUPTED.clear()
    return first


def interrupt_status(e: KeyboardInterrupt) -> int:
    """The exit status of a task a signal interrupted: Ctrl-C's KeyboardInterrupt, or one a SIGTERM handler raised
    with the signal's name (sigterm_as_interrupt): 128 + its number."""
    return 128 + getattr(signal, str(e) or "SIGINT", signal.SIGINT)


def _show_rest(stream, as_host) -> None:
    with contextlib.suppress(OSError, ValueError):
        for raw in stream:
            sys.stdout.write(as_host(raw.decode(errors="replace")))
            sys.stdout.flush()


def mounts_of(argv: list[str]) -> dict[str, str]:
    """The folders a `docker run` mounts, by its `-v HOST:INSIDE[:ro]` flags: {inside: host}."""
    return {inside: host for flag, value in itertools.pairwise(argv) if flag == "-v" and ":" in value
            for host, inside in [value.split(":")[:2]]}


def container_paths_shown(argv: list[str]):
    """A function turning the paths a `docker run` mounts into this host's in a line of its output (errors.paths_as)."""
    return paths_as(mounts_of(argv))


PIPE, DEVNULL = subprocess.PIPE, subprocess.DEVNULL
INTERRUPTED = 130  # the exit status of a command stopped with Ctrl-C (128 + SIGINT)
STOP_WAIT = 60     # seconds a command stopped with Ctrl-C gets to stop (a run's container, its workers) before this
                   # returns; another Ctrl-C returns at once
TAIL = "tail"      # Pipeline(stdout=TAIL): the last command's output is kept with its stderr, for errors
CHUNK = 1 << 20    # the width of every pipe, and the size of the pieces copied through them


class Pipeline:
    """Commands connected by pipes (`a | b | c`), started together: the runner for streams.

    stdin: None (inherited), PIPE (the caller writes into `.stdin`) or an open file. stdout: None
    (inherited), PIPE (the caller reads `.stdout`), DEVNULL, an open file, or TAIL. Each command's stderr
    is kept for the error message. Pipes are 1 MiB wide: fewer wake-ups between the stages.
    Use it as a context manager: leaving it by an exception kills what still runs.
    """

    def __init__(self, *argvs: Sequence[str], stdin=None, stdout=None, what: str = "", quiet: bool = False,
                 env: Mapping[str, str] | None = None):
        self.argvs = [[str(a) for a in argv] for argv in argvs]
        self.what = what
        self.returncodes: list[int] = []
        if not quiet:
            echo_pipeline(*self.argvs)
        self.errs = [tempfile.TemporaryFile() for _ in self.argvs]
        self.procs: list[subprocess.Popen] = []
        full_env = {**os.environ, **(env or {})}
        prev = stdin
        try:
            for i, (argv, err) in enumerate(zip(self.argvs, self.errs, strict=True)):
                last = i == len(self.argvs) - 1
                out = (err if stdout == TAIL else stdout) if last else PIPE
                p = subprocess.Popen(argv, stdin=prev, stdout=out, stderr=err, env=full_env)
                if i:
                    prev.close()  # our copy of the pipe between two stages: theirs is enough
                self.procs.append(p)
                widen(p.stdin, p.stdout)
                prev = p.stdout
        except FileNotFoundError:
            self.close(kill=True)
            raise _not_found(argv) from None
        except BaseException:
            self.close(kill=True)
            raise
        self.stdin: IO[bytes] | None = self.procs[0].stdin
        self.stdout: IO[bytes] | None = self.procs[-1].stdout

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(kill=kind is not None)

    def wait(self, check: bool = True) -> list[int]:
        """Close our end of stdin, wait for every command; raise (check) when one failed."""
        if self.stdin is not None and not self.stdin.closed:
            try:
                self.stdin.close()
            except BrokenPipeError:
                pass
        self.returncodes = [p.wait() for p in self.procs]
        if check:
            self.check()
        return self.returncodes

    def check(self) -> None:
        """After wait(check=False): raise for the commands that failed, each quoted like `run` does."""
        failed = [failure(argv, rc, console.last_lines(err), self.what)
                  for argv, rc, err in zip(self.argvs, self.returncodes, self.errs, strict=True) if rc != 0]
        if failed:
            raise DockyardError("\n".join(str(e) for e in failed))

    def output(self, whole: bool = False) -> list[str]:
        """The last lines of the last command's stderr (and its stdout with TAIL); with whole, every line."""
        if not whole:
            return console.last_lines(self.errs[-1])
        self.errs[-1].seek(0)
        return self.errs[-1].read().decode(errors="replace").splitlines()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def close(self, kill: bool = False) -> None:
        """Release the pipes and files; with kill, stop whatever still runs first."""
        if kill:
            self.kill()
        for p in self.procs:
            for f in (p.stdin, p.stdout):
                if f is not None and not f.closed:
                    try:
                        f.close()
                    except BrokenPipeError:
                        pass
            p.wait()
        for f in self.errs:
            f.close()


def widen(*pipes) -> None:
    """Pipes of 1 MiB instead of 64 KiB (where a pipe is given and the system allows it)."""
    for pipe in pipes:
        if pipe is None:
            continue
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, CHUNK)
        except (OSError, AttributeError):  # above /proc/sys/fs/pipe-max-size, or not a pipe
            pass


def start_detached(argv: Sequence[str], log: Path) -> int:
    """Start a daemon in a session of its own, its output appended to `log`; returns its pid."""
    argv = [str(a) for a in argv]
    echo(argv)
    try:
        with open(log, "ab") as f:
            return subprocess.Popen(argv, stdin=DEVNULL, stdout=f, stderr=f, start_new_session=True).pid
    except FileNotFoundError:
        raise _not_found(argv) from None


# --- the docker client ------------------------------------------------------------------------

def _client_ok(binary: str) -> bool:
    """A client that can build with BuildKit: has the buildx plugin, or is older than 23 (built in)."""
    try:
        if subprocess.run([binary, "buildx", "version"], capture_output=True, timeout=20).returncode == 0:
            return True
        v = subprocess.run([binary, "version", "--format", "{{.Client.Version}}"],
                           capture_output=True, timeout=20, text=True).stdout.strip()
        return bool(v) and int(v.split(".")[0]) < 23
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False


@functools.cache
def docker_binary(setting: str = "") -> str:
    """The docker client: the setting when given, else the first `docker` on PATH that can use BuildKit."""
    if setting:
        return setting
    seen: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]:
        cand = os.path.join(d, "docker")
        if os.access(cand, os.X_OK) and os.path.realpath(cand) not in seen:
            seen.append(os.path.realpath(cand))
            if _client_ok(cand):
                return cand
    if seen:
        return seen[0]
    raise DockyardError("no `docker` client on PATH. " + no_engine_help())


def docker(settings: Settings, *args: str) -> list[str]:
    """argv for one docker CLI call."""
    return [docker_binary(settings.docker), *args]


def build_env() -> dict[str, str]:
    return {"DOCKER_BUILDKIT": "1"}


def engine_info(settings: Settings) -> dict:
    """`docker info` as a dict; raises a DockyardError with install hints when no engine answers."""
    proc = run(docker(settings, "info", "--format", "{{json .}}"), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no answer"
        raise no_engine(last)
    info = docker_json(settings, proc.stdout, "info", dict)
    if info.get("ServerErrors"):
        raise no_engine("; ".join(info["ServerErrors"]))
    return info


def check_not_missing(proc: subprocess.CompletedProcess) -> None:
    """A failed `docker ... inspect` that is not "No such image/container/object" (the one answer meaning the engine
    lacks it): the engine did not answer, said with the client's own reason."""
    said = (proc.stderr or "").strip()
    if "No such " not in said:
        raise no_engine(said.splitlines()[-1] if said else "no answer")


ROOTLESS_SHM = "16g"  # /dev/shm where the host's cannot be shared (rootless), as `invoke k8s` gives its pods


def host_sharing_flags(info: dict) -> list[str]:
    """The `docker run` flags that give a run container the host's shared memory (NCCL, DataLoader workers) and make
    the files it writes the user's, for the engine `info` describes ({}: an engine not asked, as on --dry).
    A rootful engine: --ipc=host, the user's uid:gid. Rootless Docker maps the container's root to the user who runs
    the engine and every other uid to a subordinate one, which cannot write the user's folders: root there (the user,
    outside); and runc cannot join the host's IPC namespace from the engine's user namespace, so a /dev/shm of its
    own. An engine with userns-remap maps every uid, the user's too, and cannot share the host's IPC either: the
    container leaves the remapping (--userns=host) and runs as the user."""
    user = ["--user", f"{os.getuid()}:{os.getgid()}"]
    mapping = user_mapping(info)
    if mapping == "rootless":
        return [f"--shm-size={ROOTLESS_SHM}", "--user", "0:0"]
    if mapping == "userns":
        return ["--userns=host", "--ipc=host", *user]
    return ["--ipc=host", *user]


def user_mapping(info: dict) -> str:
    """"rootless", "userns" (dockerd --userns-remap) or "" for an engine whose uids are the host's."""
    options = " ".join(info.get("SecurityOptions") or [])
    return next((m for m in ("rootless", "userns") if f"name={m}" in options), "")


def reference(ref: str, what: str = "image") -> str:
    """`ref` if it can be an image or container name, id or digest; refused otherwise, before docker reads a
    leading '-' as one of its options."""
    if not ref or ref.startswith("-") or len(ref) > 512 or not all(c.isprintable() and not c.isspace() for c in ref):
        raise DockyardError(f"{what} {short(ref)} is not a docker reference (a name[:tag], an id or a digest)")
    return ref


def image_name(ref: str, what: str = "--image") -> str:
    """`ref` if it is an image name a registry takes (IMAGE_NAME), refused with the form otherwise."""
    if not IMAGE_NAME.fullmatch(reference(ref, what)) or len(ref) > 255:
        raise DockyardError(f"{what} {ref!r} is not an image name: [registry[:port]/]name[:tag] with the name in "
                            "lowercase letters, digits and . _ - /, e.g. registry.local:5000/dockyard:0.1.0-cu132")
    return ref


def image_inspect(settings: Settings, ref: str) -> dict | None:
    """`docker image inspect` of one image, or None when the engine does not hold it; an engine that does not answer
    is said as such (it was "no image X: build it", for an image the engine holds)."""
    proc = run(docker(settings, "image", "inspect", reference(ref)), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        check_not_missing(proc)
        return None
    found = docker_json(settings, proc.stdout, "image inspect", list)
    return found[0] if found and isinstance(found[0], dict) else None


def docker_json(settings: Settings, text: str, what: str, kind: type):
    """What `docker WHAT` printed, as JSON of `kind`; one error line where the docker setting names a program that
    is no Docker client (INVOKE_DOCKYARD_DOCKER=/bin/echo was a JSONDecodeError traceback)."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, kind):
        raise DockyardError(f"`{shown(docker(settings, *what.split()))}` did not answer as a Docker client does (JSON): "
                            "the docker setting (INVOKE_DOCKYARD_DOCKER) must name the docker program")
    return data


LOCAL_ENGINE = "unix:///var/run/docker.sock"


def daemon_memlock_hard_limit(info: dict | None = None) -> int | None:
    """The local dockerd's hard RLIMIT_MEMLOCK in bytes (None: unlimited or unknown).

    A container cannot get more than the engine's own hard limit: `--ulimit memlock=-1` then fails with
    "error setting rlimit type 8". Where dockerd is local and limited, the launcher asks for that limit instead.
    An engine elsewhere (DOCKER_HOST) has limits this host cannot read: the local pid file says nothing about it.
    A rootless engine (`info` says so) runs as this user, with this user's limits.
    """
    if user_mapping(info or {}) == "rootless":
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        return None if hard == resource.RLIM_INFINITY else hard
    if os.environ.get("DOCKER_HOST", LOCAL_ENGINE) not in (LOCAL_ENGINE, "unix:///run/docker.sock"):
        return None
    try:
        pid = Path("/var/run/docker.pid").read_text().strip()
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max locked memory"):
                hard = line.split()[4]
                return None if hard == "unlimited" else int(hard)
    except (OSError, ValueError, IndexError):
        pass
    return None


def which(name: str) -> str | None:
    return shutil.which(name)
