"""What the trainer finds where it runs: for the `auto` settings (dockyard.common.autos decides them), the GPUs
torch sees and which model types the installed liger-kernel has kernels for; and whether the compile cache its
launcher named (torch.compile's kernels, Triton's, and the C++ ops torch builds on first use) is one it may use."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import signal
import stat
from collections.abc import Collection, MutableMapping
from pathlib import Path

from dockyard.common import envvars
from dockyard.common.autos import LIGER_TYPES, Device

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher(launcher: int) -> None:
    """SIGTERM to this process when its launcher (torchrun's agent, pid `launcher`) dies. torchrun starts its workers
    in sessions of their own, so a launcher killed with its process group (SIGKILL, an OOM kill) left them training
    on to the end, writing into the run folder, and recording a BrokenPipeError when their output had nowhere to
    go. SIGTERM is what torchrun stops them with: the run is recorded as stopped."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: torchrun's own shutdown is all there is
        return
    if os.getppid() != launcher:  # it died before the request: nothing would send the signal
        os.kill(os.getpid(), signal.SIGTERM)


def seconds_since_start() -> float:
    """How long ago this process started, from the kernel's clock since boot (/proc: the process's start time and
    the uptime, both to 10 ms; psutil's create_time adds the boot time, which the kernel gives in whole seconds);
    0 where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def quiet_toolkit_without_gpu() -> None:
    """A CUDA image trained with --cpu holds a CUDA toolkit and no GPU: torch warned of it ("No CUDA runtime is found,
    using CUDA_HOME=...") on every rank as DeepSpeed loaded, which is what --cpu asks for, not a fault."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


# transformers' checkpoint rotation orders the checkpoints by mtime, and where the first and last were written
# within a second of each other (a few quick steps between saves) it warned "mtime may not be reliable on this
# filesystem, falling back to numerical ordering" at the first rotation: nothing is wrong with the filesystem, and
# the numerical order (checkpoint-STEP, the only names the Trainer and --resume write) is the right one
MTIME_FALLBACK = "mtime may not be reliable on this filesystem"


def _not_mtime_fallback(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(MTIME_FALLBACK)


def _not_missing_mpu(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("MPU is not provided")


ACCUMULATION_MISMATCH = "Gradient accumulation steps mismatch: GradientAccumulationPlugin has"


def _not_accumulation_mismatch(record: logging.LogRecord) -> bool:
    return ACCUMULATION_MISMATCH not in str(record.msg)


def quiet_libraries() -> None:
    """What the libraries say that is no fault of the run and that the user can do nothing about, left off the
    console by the trainer and the exporter alike."""
    # bitsandbytes on a CPU with AVX512-BF16 asks the `kernels` package for a kernel from the Hub when it is imported,
    # and each rank (and every `invoke export` of an adapter) warned "Failed to load CPU gemm_4bit_forward from
    # kernels-community ... pip install kernels": a download the image must not make (nodes without internet); its
    # own CPU kernels run instead
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    logging.getLogger("transformers.trainer_utils").addFilter(_not_mtime_fallback)  # once, however often called
    # DeepSpeed loading a universal checkpoint (dockyard.train.universal) warned on every rank that it was given no
    # model-parallel unit, of a run that has no tensor parallelism to give
    logging.getLogger("DeepSpeed").addFilter(_not_missing_mpu)
    # accelerate, preparing DeepSpeed for a run that accumulates, warned on every rank of a "mismatch" between its
    # own plugin's 1 and the ds_config's steps it then uses: the Trainer's accumulation, as the run asked (its line
    # says "8 per process x 2 accumulated")
    logging.getLogger("accelerate.accelerator").addFilter(_not_accumulation_mismatch)


def weight_bars(disable_tqdm: bool) -> None:
    """The progress bars of loading and saving weights ("Loading weights", "Writing model shards"), for the trainer
    and the exporter alike: kept on a terminal, where they are the progress of minutes of loading a large model; taken
    out where `disable_tqdm` (recipes/defaults.yaml: on) asks and stderr is redirected (a pipe, a log file), where
    tqdm's redrawn lines garble the output."""
    import sys

    import transformers

    if disable_tqdm and not sys.stderr.isatty():
        transformers.utils.logging.disable_progress_bar()


def device_from_torch() -> Device | None:
    """The smallest GPU this process can see (every rank then resolves the same values), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    p = min(props, key=lambda p: p.total_memory)
    return Device(p.name, int(p.total_memory), (p.major, p.minor))


def liger_kinds() -> tuple[tuple[str, ...], str]:
    """The model types liger-kernel patches here (the installed package's own table, our list where a version has
    none; () without liger-kernel), and why there are none where it is installed but does not import."""
    if importlib.util.find_spec("liger_kernel") is None:
        return (), ""
    try:  # what the Trainer imports once training starts: an install that fails here would fail there, too late
        from liger_kernel.transformers import (
            _apply_liger_kernel_to_instance,  # noqa: F401
            monkey_patch,
        )
    except Exception as e:  # noqa: BLE001 - any failure (a triton it was not built for, a missing library)
        first = str(e).splitlines()[0] if str(e) else ""
        return (), f"liger-kernel is installed but does not import ({type(e).__name__}: {first})"
    return tuple(getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", LIGER_TYPES)), ""  # a version without the table


# torch's inductor cache, Triton's, and the C++/CUDA ops torch builds on first use (DeepSpeed's cpu_adam in a CUDA image
# run with --cpu)
COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", envvars.OPS_CACHE)


def compile_cache(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Check the compile cache folders the launcher named (invoke run, run.sh, compose, the Kubernetes pods): each
    must be a folder this process can make and write, its own, that no one else can write, since the run executes
    what is in it (compiled modules, pickled graphs). A folder that is not is dropped from `environ`, so torch
    compiles into the container's /tmp instead; returns what was dropped and why."""
    dropped = []
    for var in COMPILE_CACHES:
        folder = environ.get(var, "")
        why = _unusable(folder) if folder else ""
        if why:
            del environ[var]
            dropped.append(f"{var}={folder} {why}")
    if environ.get(envvars.OPS_CACHE) and not environ.get("TORCH_EXTENSIONS_DIR"):  # (one the user set stays theirs)
        environ["TORCH_EXTENSIONS_DIR"] = extensions_folder(environ[envvars.OPS_CACHE])
    return dropped


def extensions_folder(root: str) -> str:
    """The ops of this Python and torch build, in a folder of their own under the cache: torch names its default
    folder by the Python and CUDA versions (py311_cu128), but takes TORCH_EXTENSIONS_DIR as it is, and would load an
    op that another image's torch built (its rebuild check hashes the sources and flags, not torch's version). So
    the launchers name the cache's folder (DOCKYARD_OPS_CACHE), not TORCH_EXTENSIONS_DIR: a shell in the image
    (`invoke shell`) builds in its own /tmp."""
    import sys

    import torch

    folder = Path(root) / f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"
    old = os.umask(0o077)
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        pass  # torch says so when it builds there; nothing else reads it
    finally:
        os.umask(old)
    return str(folder)


def _unusable(folder: str) -> str:
    """Why `folder` cannot serve as this process's compile cache ("" where it can); made 0700 where missing. The
    folder may be writable by this process's own group: Kubernetes' fsGroup makes a volume's files so."""
    if os.path.lexists(folder) and not os.path.isdir(folder):
        return "is not a folder"
    old = os.umask(0o077)
    try:
        os.makedirs(folder, exist_ok=True)
        st = os.stat(folder)
    except OSError as e:
        return f"cannot be made ({e.strerror or e})"
    finally:
        os.umask(old)
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}"
    if _others_write(st):
        return f"can be written by other users (mode {stat.filemode(st.st_mode)})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot be written (mode {stat.filemode(st.st_mode)})"
    # and no folder above it another user could swap it out of (rename it, put their own in its place) once checked
    for above in Path(folder).resolve().parents:
        st = os.stat(above)
        whose = f"belongs to uid {st.st_uid}" if st.st_uid not in (os.geteuid(), 0) else ""
        if whose or (_others_write(st) and not st.st_mode & stat.S_ISVTX):  # sticky (/tmp): none can rename it
            return (f"sits in {above}, which {whose or 'other users can write'} (mode {stat.filemode(st.st_mode)}): "
                    "they could put code of theirs in its place")
    return ""


def _others_write(st: os.stat_result) -> bool:
    """Writable by other users: everyone, or a group other than this process's own."""
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid()))


def cpu_adam_to_compile() -> str | None:
    """The folder DeepSpeed will compile its cpu_adam op into as the optimizer is made (an offload recipe), or None
    where it is built in or compiled already. The compile takes minutes of silence that looked like a hang: it is
    built into the CUDA images for their GPUs and into the cpu image for the CPU, but a CUDA image run on the CPU
    (--cpu) compiles it into the torch extensions cache."""
    try:
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops
        from torch.utils.cpp_extension import _get_build_directory
    except ImportError:
        return None
    try:
        accelerator = get_accelerator()
        # built in for the accelerator it was built for (the cpu image's for the CPU; a CUDA image's for its GPUs):
        # a CUDA image run with --cpu compiles it for the CPU
        if installed_ops.get("cpu_adam") and accelerator.device_name() in (accelerator_name, "cuda"):
            return None
        name = accelerator.create_op_builder("CPUAdamBuilder").name
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or _get_build_directory("", verbose=False)
    except Exception:  # noqa: BLE001 - only a notice: never a reason to fail the run
        return None
    folder = Path(root) / name  # as torch builds it, without making it (its _get_build_directory makes it)
    return None if any(folder.glob("*.so")) else str(folder)


# A build of an op writes its build folder at least every few minutes (ninja's files, the objects, the library): one
# untouched for longer, with no process here holding its lock, was killed
STALE_BUILD_S = 600


def build_locks(root: str | None = None, now: float | None = None,
                loads: Collection[str] | None = None) -> tuple[list[str], list[str]]:
    """The locks torch's builds of C++ ops left in the extensions folder (`root`, else torch's own), as (removed,
    kept) lines to say. torch builds an op under a lock file it makes and removes when done, and every other process
    loading that op waits until the file is gone, saying nothing: a build killed by SIGKILL (the OOM killer, torchrun
    after its grace period) left its lock, and every later run of an offload recipe sat silent forever before its
    first step. The lock records no owner, so one counts as left behind when no process this one can see has it
    open and nothing in its folder changed for STALE_BUILD_S; it is then removed, and the op built again. Any other
    is said, with the file to remove, since the run waits on it, where the op is one the run `loads` (None: any): a
    lora run, or a zero2 one (the Trainer's torch AdamW), beside an offload run's first build of cpu_adam was told it
    waited for it, and did not."""
    import time

    if root is None:
        try:
            from torch.utils.cpp_extension import _get_build_directory

            root = os.environ.get("TORCH_EXTENSIONS_DIR") or _get_build_directory("", verbose=False)
        except Exception:  # noqa: BLE001 - a torch without it: nothing to look at
            return [], []
    now = time.time() if now is None else now
    removed, kept = [], []
    for lock in sorted(Path(root).glob("*/lock")):
        try:
            untouched = now - max(f.lstat().st_mtime for f in (lock.parent, *lock.parent.iterdir()))
        except OSError:  # gone meanwhile: its build ended
            continue
        op, since = lock.parent.name, time.strftime("%H:%M:%S", time.localtime(now - untouched))
        holder = _holder(lock)
        if (holder or untouched <= STALE_BUILD_S) and loads is not None and op not in loads:
            continue
        if holder:
            kept.append(f"DeepSpeed's {op} op is being built by process {holder} (nothing changed in its folder "
                        f"since {since}): this run waits for it")
        elif untouched > STALE_BUILD_S:
            try:
                lock.unlink()
            except FileNotFoundError:  # another process of this run removed it first: that one says so
                continue
            except OSError as e:
                kept.append(f"{lock} was left by a build of {op} that was killed, and cannot be removed "
                            f"({e.strerror}): every run loading {op} waits on it; remove it")
                continue
            removed.append(f"removed {lock}, left by a build of the op {op} that was killed (nothing changed in "
                           f"its folder since {since}): every run loading {op} waited on it, silently")
        else:
            kept.append(f"the op {op} is locked by a build no process here runs (another container's run?), its "
                        f"folder last changed at {since}: this run waits for it; if no other run is building {op}, "
                        f"that build was killed: remove {lock}")
    return removed, kept


def _holder(lock: Path) -> int | None:
    """The pid of a process this one can see that has `lock` open (torch's builder keeps it open while it builds)."""
    target = str(lock.resolve())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd) == target:
                    return int(fd_dir.parent.name)
        except OSError:  # ended, or another user's
            continue
    return None
