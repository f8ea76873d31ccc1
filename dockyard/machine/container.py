"""What a container started the way `invoke run` starts one sees: /dev/shm, ulimits, the engine's free disk,
and the image's DeepSpeed ops (its saved ds_report). `invoke doctor` starts one such probe container."""

from __future__ import annotations

import os
import re
import shutil
import socket

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.common.units import GIB, human
from dockyard.images import variants
from dockyard.launch import caches
from dockyard.launch.command import docker_run_argv
from dockyard.machine.check import FAIL, PASS, WARN, Check
from dockyard.settings import Settings

SHM_MIN = 1 * GIB                   # NCCL and DataLoader workers need far more than Docker's default 64 MB
STACK_MIN_KIB = 64 * 1024           # --ulimit stack=67108864, NVIDIA's recommended run flags
DISK_FAIL, DISK_WARN = 10 * GIB, 50 * GIB  # a CUDA image is 7-8.5 GB, and `docker load` unpacks a copy first
REPORT = "/opt/dockyard/ds_report.txt"
# What the probe container prints: /dev/shm and the data root's disk (the overlay root reports its backing
# filesystem, so this works for a remote engine too), the ulimits, then the image's saved ds_report.
PROBE_SCRIPT = (f"df -Pk /dev/shm | tail -n 1; df -Pk / | tail -n 1; echo memlock=$(ulimit -l); "
                f"echo stack=$(ulimit -s); echo ---; cat {REPORT} 2>/dev/null || true")


def parse_probe(text: str) -> dict:
    """The probe container's output → shm and disk bytes, memlock/stack (KiB or "unlimited"), ds_report."""
    head, _, report = text.partition("---\n")
    lines = head.strip().splitlines()
    df = [ln.split() for ln in lines if len(ln.split()) >= 6 and ln.split()[1].isdigit()]
    limits = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    return {"shm_bytes": int(df[0][1]) * 1024 if df else 0,
            "disk_free_bytes": int(df[1][3]) * 1024 if len(df) > 1 else 0,
            "memlock": limits.get("memlock", ""), "stack": limits.get("stack", ""), "ds_report": report}


def check_shm(shm_bytes: int) -> Check:
    detail = f"/dev/shm in a run container: {shm_bytes / GIB:.1f} GiB"
    if shm_bytes < SHM_MIN:
        return Check("shared memory", FAIL, detail,
                     "NCCL and DataLoader workers crash (bus error, exit -7) with a small /dev/shm: the host's "
                     "/dev/shm is what --ipc=host gives; mount a larger tmpfs there")
    return Check("shared memory", PASS, detail)


def check_ulimits(memlock: str, stack: str, gpu: bool) -> Check:
    def kib(limit: str) -> str:  # `ulimit -l` and `-s` count KiB: "memlock 8192, stack 65536 KiB" read as 8192 bytes
        return f"{int(limit) / 1024:g} MiB" if limit.isascii() and limit.isdigit() else (limit or "?")

    detail = f"memlock {kib(memlock)}, stack {kib(stack)}"
    if memlock.isascii() and memlock.isdigit():  # what `invoke run` passes by itself; compose asks for unlimited
        detail += f" (to run with compose: DOCKYARD_MEMLOCK={int(memlock) * 1024} docker compose ...)"
    small_stack = stack != "unlimited" and (not (stack.isascii() and stack.isdigit()) or int(stack) < STACK_MIN_KIB)
    if not gpu:
        return Check("ulimits", PASS, detail + " (only GPU runs need memlock unlimited)")
    if memlock != "unlimited" or small_stack:
        # invoke run asks for dockerd's own hard limit (command.memlock_flag) whatever its defaults: --default-ulimit,
        # the advice this gave, changed nothing
        return Check("ulimits", WARN, detail,
                     "RDMA/NCCL want memlock unlimited and stack ≥ 64 MiB, and a container gets no more than dockerd's "
                     "own hard limits: raise them for the docker service (`sudo systemctl edit docker`: [Service] "
                     "LimitMEMLOCK=infinity, LimitSTACK=infinity), then `sudo systemctl restart docker`")
    return Check("ulimits", PASS, detail)


def check_disk(free: int, data_root: str, image: str, image_bytes: int | None) -> Check:
    """The engine's free disk; `image` is what auto picks on this host, `image_bytes` its size (None: not here)."""
    detail = f"{free / GIB:.0f} GiB free under the engine's data root {data_root}"
    if free < DISK_FAIL:
        return Check("disk", FAIL, detail, "free space there: `docker image prune`, or move the data root "
                                           "(dockerd --data-root) to a larger disk")
    if free < DISK_WARN:
        size = f"takes {human(image_bytes)}" if image_bytes else "is not here yet"
        return Check("disk", WARN, detail, f"{image} (what auto picks here) {size}, and `docker load` unpacks a copy "
                                           f"of an image first: keep {DISK_WARN // GIB} GiB free")
    return Check("disk", PASS, detail)


def disk_here(info: dict, image: str) -> Check | None:
    """The engine's free disk read on this host, where no image is here to probe it in (a fresh host, before
    `invoke setup`: when it matters most); None where the engine runs elsewhere (DOCKER_HOST, a docker context,
    Docker Desktop's VM: its data root names another machine's folder) or its data root cannot be read."""
    root = info.get("DockerRootDir") or ""
    if info.get("Name") != socket.gethostname() or not root:
        return None
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return None
    return check_disk(free, root, image, None)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OP_LINE = re.compile(r"^(\w+)\s*\.*\s*\[(YES|NO)\]\s*\.+\s*\[(OKAY|NO)\]", re.M)


def parse_ds_report(text: str) -> dict[str, tuple[bool, bool]]:
    """op name → (installed, compatible) from `ds_report` output (colour codes or not)."""
    return {m[1]: (m[2] == "YES", m[3] == "OKAY") for m in _OP_LINE.finditer(_ANSI.sub("", text))}


def check_ds_report(report: str, variant, image: str) -> Check:
    ops = parse_ds_report(report)
    if not ops:
        return Check("deepspeed ops", WARN, f"{image} has no readable {REPORT}",
                     f"rebuild it: invoke build --variant={variant.name}")
    wanted = variants.ds_ops(variant).split(",")  # the op names ds_report prints
    missing = [op for op in wanted if not ops.get(op, (False, False))[0]]
    aio = ops.get("async_io", (False, False))
    libaio = "libaio found (async_io usable)" if aio[0] or aio[1] else "no libaio (async_io/NVMe offload unusable)"
    detail = f"{image}: built {', '.join(op for op in wanted if op not in missing) or 'none'}; {libaio}"
    if missing:
        return Check("deepspeed ops", FAIL, detail + f"; NOT built: {', '.join(missing)}",
                     f"rebuild without cache: invoke build --variant={variant.name} --no-cache")
    if "async_io" in wanted and not aio[1]:
        return Check("deepspeed ops", FAIL, detail, "the image lacks libaio-dev: add it to the variant's os_packages")
    return Check("deepspeed ops", PASS, detail)


def probe_argv(settings: Settings, image: str, name: str, command: list[str] | None = None,
               gpus: bool = False) -> list[str]:
    """A container started the way `invoke run` starts one (the launcher's own flags), running PROBE_SCRIPT."""
    return docker_run_argv(settings, image, gpus=gpus, run_dir=None, name=name, env={}, network_host=False,
                           interactive="", command=command or ["sh", "-c", PROBE_SCRIPT], mounts=[],
                           engine_info=engine.engine_info(settings))


def without_ulimits(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--ulimit":
            skip = True
        else:
            out.append(a)
    return out


def probe_container(settings: Settings, image: str) -> tuple[dict, Check | None]:
    """Read what a run container sees. When the engine refuses the run's ulimits, say so (a check) and
    probe again without them, so the other checks still get their facts."""
    caches.prepare(settings, compile_cache=False)  # the probe mounts the HF cache: made as the user, not by docker as root
    argv = probe_argv(settings, image, f"dockyard-doctor-{os.getpid()}")
    proc = engine.run(argv, capture=True, check=False, quiet=True)
    refused = None
    if proc.returncode != 0 and "rlimit" in proc.stderr:
        refused = Check("ulimits", FAIL, "the engine cannot give containers the run's --ulimit flags: "
                        + proc.stderr.strip().splitlines()[-1][-160:],
                        "dockerd's own hard limit is too low and it may not raise it (no CAP_SYS_RESOURCE): "
                        "start it with `ulimit -l unlimited -s unlimited` (systemd: LimitMEMLOCK=infinity)")
        proc = engine.run(without_ulimits(argv), capture=True, check=False, quiet=True)
    if proc.returncode != 0:
        raise DockyardError(f"probe container failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return parse_probe(proc.stdout), refused


