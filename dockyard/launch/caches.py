"""The host folders a run's container writes, mounted read-write (and so no place for a file the host later runs:
check_out_of_reach, from the same list, writable_folders):

  runs_dir       the runs folder (every run's folder in it)
  hf_cache       Hugging Face's cache (HF_HOME inside)
  compile_cache  torch.compile's and Triton's caches, and the C++ ops torch builds on first use (TORCHINDUCTOR_CACHE_DIR,
                 TRITON_CACHE_DIR, DOCKYARD_OPS_CACHE inside: DeepSpeed's cpu_adam in a CUDA image run with --cpu):
                 what one run compiled is loaded by the next instead of compiled again. Without it every run starts
                 from the container's empty /tmp and compiles everything anew.

`volumes` and `compile_env` are pure (what `--dry` prints); `prepare` makes the folders as the user before `docker
run` would make a missing one as root, and checks the compile cache: the runs execute what is in it (compiled
modules, pickled graphs), so it must be the user's own folder, writable by nobody else.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dockyard import ROOT
from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.launch import node, scriptwords
from dockyard.settings import Settings

COMPILE_INSIDE = f"{node.WORKSPACE}/.cache/compile"  # the compile cache, as the container sees it
HF_FIX = "set the hf_cache setting (INVOKE_DOCKYARD_HF_CACHE) to a folder you can write"
HF_EXAMPLE = "INVOKE_DOCKYARD_HF_CACHE=~/.cache/huggingface"
COMPILE_EXAMPLE = "INVOKE_DOCKYARD_COMPILE_CACHE=~/.cache/dockyard/compile"
COMPILE_FIX = ('set the compile_cache setting (INVOKE_DOCKYARD_COMPILE_CACHE) to a folder of yours, or to "" for '
               "none (every run then compiles from scratch)")


def compile_folder(settings: Settings) -> Path | None:
    """The compile cache on the host; None where the setting is "" (no cache)."""
    return settings.path(settings.compile_cache) if settings.compile_cache.strip() else None


def compile_env(settings: Settings) -> dict[str, str]:
    """The trainer's environment for the compile cache: torch's inductor and Triton each in a folder of it."""
    if compile_folder(settings) is None:
        return {}
    return node.compile_cache_env(COMPILE_INSIDE)


# Folders a container must never be given read-write, whole: the system's, and (own_folder) the home folder, the
# checkout and every folder above them
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
                  "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var")
# and nothing inside these either (/etc/cron.d, /usr/local/bin: a root container writes the host's system there);
# /home, /opt, /srv, /tmp and /mnt hold users' own folders
SYSTEM_TREES = tuple(Path(p) for p in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run",
                                       "/sbin", "/sys", "/usr", "/var/lib", "/var/run"))


def writable_mount(path: Path, setting: str, example: str, separators: str = ":") -> Path:
    """A host folder given read-write to the run's containers: a path the runtime's mount list can hold (separators:
    what it splits on), and a folder of its own (own_folder). `example` is the environment setting that moves it."""
    scriptwords.mount_path(str(path), f"the {setting} setting ({example.partition('=')[0]})", separators)
    return own_folder(path, setting, example)


def own_folder(path: Path, setting: str, example: str) -> Path:
    """A folder mounted read-write into the run's containers, which run untrusted code (a model's, a data file's):
    refused where it is / or a system folder, or holds the home folder or the checkout (`INVOKE_DOCKYARD_HF_CACHE=~`
    gave every container ~/.ssh to write)."""
    real = Path(os.path.realpath(path))
    home = Path(os.path.realpath(os.path.expanduser("~")))
    holds = next((what for what, inner in (("your home folder", home), ("the project's checkout", ROOT.resolve()))
                  if real == inner or real in inner.parents), "")
    if holds and str(real) != "/":
        why = f"holds {holds}"
    elif str(real) in SYSTEM_FOLDERS:
        why = "is a system folder"
    elif any(tree == real or tree in real.parents for tree in SYSTEM_TREES):
        why = "is inside a system folder"
    else:
        return path
    raise DockyardError(f"the {setting} setting {str(path)!r} {why}, which every run's container would be given to "
                        f"write: give it a folder of its own, e.g. {example}")


def check_out_of_reach(settings: Settings, path: Path, named: str, fix: str,
                       use: str = "you hand it to the cluster") -> None:
    """A file the user later hands to a cluster as it is (`invoke slurm`'s sbatch script, `invoke k8s`'s manifests) is
    never written where a run's container can write: the runs folder, the Hugging Face cache, the compile cache. Code
    in a container (a model's, a data loader's) rewrote the script there, and the user's next `sbatch` ran it.
    `named`: where the path came from (--out, the jobs_dir setting); `fix`: what to give instead; `use`: what the
    user does with it next (`invoke save`'s load.sh and run.sh: run them on another host)."""
    # the path with its `..` taken as written, and as the kernel takes them (after the link before them): each walked
    # from / as the kernel walks it, a link at a time, and stopped as soon as it is inside the folder (by its path,
    # as written or resolved, or by what it is: through a bind mount of it), before a link planted there is followed
    places = {Path(os.path.abspath(path)), Path(path).absolute()}
    for setting, folder, _ in _every_writable(settings):
        inner = {Path(os.path.abspath(folder)), Path(os.path.realpath(folder))}
        if any(runfolder.led_into(p, inner) is not None for p in places):
            raise DockyardError(f"{named} {path} is inside {folder} (the {setting} setting), which every run's container "
                                f"can write: a run could change what is written there before {use}; {fix}")


def volumes(settings: Settings, compile_cache: bool, separators: str = ":",
            runs: Path | None = None) -> list[tuple[Path, str, bool]]:
    """(host, inside, read-only) of every folder a container is given to write (writable_folders): the caches, the
    compile cache only for what trains (`compile_cache`), and the runs folder `runs` where given. `separators`: what
    the runtime's mount list splits on (docker's -v: ':'; pyxis and Apptainer: ',' too)."""
    return [(writable_mount(folder, setting, EXAMPLES[setting], separators), inside, False)
            for setting, folder, inside in writable_folders(settings, compile_cache, runs)]


def writable_folders(settings: Settings, compile_cache: bool, runs: Path | None) -> list[tuple[str, Path, str]]:
    """The host folders a container is given to write, each as (its setting, the folder, where the container sees it):
    what volumes() mounts, and check_out_of_reach keeps every file the host later runs out of. One list, so that a
    folder mounted for a container to write is one refused for such a file."""
    folder = compile_folder(settings) if compile_cache else None
    return [*([("runs_dir", runs, node.RUNS_INSIDE)] if runs is not None else []),
            ("hf_cache", settings.path(settings.hf_cache), node.HF_INSIDE),
            *([("compile_cache", folder, COMPILE_INSIDE)] if folder is not None else [])]


def container_writable(settings: Settings) -> list[Path]:
    """Every host folder some run's container is given to write (the runs folder, the caches): where a link may have
    been planted (runfolder.users_folder follows none there)."""
    return [folder for _, folder, _ in _every_writable(settings)]


def _every_writable(settings: Settings) -> list[tuple[str, Path, str]]:
    return writable_folders(settings, True, settings.path(settings.runs_dir))


EXAMPLES = {"runs_dir": "INVOKE_DOCKYARD_RUNS_DIR=/shared/runs", "hf_cache": HF_EXAMPLE, "compile_cache": COMPILE_EXAMPLE}


def prepare(settings: Settings, compile_cache: bool) -> None:
    """Make the folders `volumes` mounts where missing (as this user: docker would make them as root, and the user
    could then write neither), and refuse a compile cache another user could write. A folder own_folder refuses
    is refused first: nothing is made in a system folder."""
    hf = own_folder(settings.path(settings.hf_cache), "hf_cache", HF_EXAMPLE)
    folder = compile_folder(settings) if compile_cache else None
    if folder is not None:
        own_folder(folder, "compile_cache", COMPILE_EXAMPLE)
    runfolder.make_folders(hf, HF_FIX)
    if folder is None:
        return
    if not os.path.lexists(folder):
        old = os.umask(0o077)  # the folders made here are this user's alone
        try:
            runfolder.make_folders(folder, COMPILE_FIX)
        finally:
            os.umask(old)
    check_private(folder)


def check_compile_cache(settings: Settings) -> None:
    """What prepare() would refuse in the compile cache, making nothing (`invoke run --dry`): a folder that holds
    the checkout is said as such, before a shared one above it (/tmp) is found to be everyone's."""
    folder = compile_folder(settings)
    if folder is not None:
        own_folder(folder, "compile_cache", COMPILE_EXAMPLE)
    if folder is not None and os.path.lexists(folder):
        check_private(folder)


def check_private(folder: Path) -> None:
    """`folder` (a link: where it leads) is a folder of this user's that no one else can write."""
    try:
        st = os.stat(folder)
    except OSError as e:
        raise DockyardError(f"the compile cache {folder}: {e.strerror or e}; {COMPILE_FIX}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DockyardError(f"the compile cache {folder} is not a folder; {COMPILE_FIX}")
    if st.st_uid != os.geteuid():  # files are made as the effective uid (run.sh's `[ -O ]` too)
        raise DockyardError(f"the compile cache {folder} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                            f"runs execute the code compiled into it; {COMPILE_FIX}")
    if st.st_mode & 0o022 and st.st_mode & stat.S_ISVTX:  # /tmp and its like: never to be chmod'ed
        raise DockyardError(f"the compile cache {folder} is a folder every user shares (mode "
                            f"{stat.filemode(st.st_mode)}): runs execute the code compiled into it; {COMPILE_FIX}")
    if st.st_mode & 0o022:
        raise DockyardError(f"the compile cache {folder} can be written by others (mode {stat.filemode(st.st_mode)}): "
                            f"runs execute the code compiled into it; `chmod go-w {folder}`, or {COMPILE_FIX}")
