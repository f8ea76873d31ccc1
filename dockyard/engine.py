"""The Docker CLI: which client binary to use, argv builders, and the ONE runner every task uses.

The runner echoes each command, streams its output, and on failure raises a DockyardError that
quotes the exact command, its exit code and the end of its output.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from dockyard.errors import DockyardError

NO_ENGINE_HELP = (
    "no Docker engine answers. Install and start one: `sudo invoke setup` (Debian/Ubuntu), or "
    "`apt-get install docker.io && systemctl start docker`; where no init system runs, "
    "`setsid dockerd >dockerd.log 2>&1 &`. Set DOCKER_HOST if your engine listens elsewhere."
)


def quote(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def echo(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    print(f"+ {prefix + ' ' if prefix else ''}{quote(argv)}", file=sys.stderr, flush=True)


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
) -> subprocess.CompletedProcess:
    """Run one command. `env` is added to the current environment.

    capture=True returns stdout (text) without printing it; otherwise output streams to the terminal
    and only its last lines are kept for the error message; `on_line` sees each streamed line.
    """
    argv = [str(a) for a in argv]
    if not quiet:
        echo(argv, env)
    full_env = {**os.environ, **(env or {})}
    try:
        if capture:
            proc = subprocess.run(argv, env=full_env, cwd=cwd, input=input, capture_output=True)
            out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
            tail = err.strip().splitlines()[-20:]
        else:
            tail_lines: collections.deque[str] = collections.deque(maxlen=20)
            p = subprocess.Popen(
                argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if input is not None else None,
            )
            if input is not None:
                p.stdin.write(input)
                p.stdin.close()
            for raw in p.stdout:
                line = raw.decode(errors="replace")
                sys.stdout.write(line)
                sys.stdout.flush()
                tail_lines.append(line.rstrip())
                if on_line:
                    on_line(line.rstrip())
            p.wait()
            proc = subprocess.CompletedProcess(argv, p.returncode, "", "")
            out, tail = "", list(tail_lines)
    except FileNotFoundError:
        raise DockyardError(f"`{argv[0]}` not found: install it or set its path in invoke.yaml") from None
    except KeyboardInterrupt:
        raise DockyardError(f"interrupted: {quote(argv)}", exit_code=130) from None
    if check and proc.returncode != 0:
        label = f"{what} failed" if what else "command failed"
        detail = "\n".join(f"  | {l}" for l in tail)
        raise DockyardError(f"{label} (exit {proc.returncode}): {quote(argv)}\n{detail}".rstrip())
    return subprocess.CompletedProcess(argv, proc.returncode, out, "\n".join(tail))


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


@functools.lru_cache(maxsize=None)
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
    raise DockyardError("no `docker` client on PATH. " + NO_ENGINE_HELP)


def docker(settings, *args: str) -> list[str]:
    """argv for one docker CLI call."""
    return [docker_binary(settings.docker), *args]


def build_env() -> dict[str, str]:
    return {"DOCKER_BUILDKIT": "1"}


def engine_info(settings) -> dict:
    """`docker info` as a dict; raises a DockyardError with install hints when no engine answers."""
    proc = run(docker(settings, "info", "--format", "{{json .}}"), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        raise DockyardError(NO_ENGINE_HELP + f"\n  ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no answer'})")
    info = json.loads(proc.stdout)
    if info.get("ServerErrors"):
        raise DockyardError(NO_ENGINE_HELP + "\n  (" + "; ".join(info["ServerErrors"]) + ")")
    return info


def image_inspect(settings, ref: str) -> dict | None:
    """`docker image inspect` of one image, or None when the engine does not hold it."""
    proc = run(docker(settings, "image", "inspect", ref), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def daemon_memlock_hard_limit() -> int | None:
    """The local dockerd's hard RLIMIT_MEMLOCK in bytes (None: unlimited or unknown).

    A container cannot get more than the engine's own hard limit: `--ulimit memlock=-1` then fails with
    "error setting rlimit type 8". Where dockerd is local and limited, the launcher asks for that limit instead.
    """
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
