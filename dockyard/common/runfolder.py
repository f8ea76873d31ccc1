"""The run folder's contract (the names of its files) and safe access to it.

A run folder is untrusted ground: every run's container has the whole runs folder mounted read-write, so
anything in runs/<id>/ may have been planted by code that ran in some container. What the host and the trainer
do there:

- `write` a file: a new temporary file in the folder, then os.replace over the name, so a symbolic link
  planted at the name is replaced by a regular file, never followed (monitor.json, plots, manifest.json);
- `create` a file only where nothing has its name yet (the run's manifest.json written by a node that lost node 0);
- `append` to and `read` a file: opened with O_NOFOLLOW, regular files only (a link, a fifo is refused with
  a short error: metrics.jsonl, train.log, monitor.jsonl, manifest.json read back by the host);
- `check` a folder: refused when it is a link or holds one anywhere below (before the host resumes a run,
  before the trainer writes in one, before a checkpoint is loaded or an export reads the model);
- `claim` a new run folder with one os.mkdir: of two runs given the same --run-id at once, one gets it;
- `read_manifest`: the trainer's manifest read as untrusted JSON, checked with pydantic before any field is used;
- `fingerprint` what a run used (the trainer records it; `invoke export` checks the model folder against it).

Every name is a plain file name in the folder; the folder itself is opened without following a link, and the
file is opened relative to it, so a folder swapped for a link after the check is not followed either.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from dockyard.common import tree
from dockyard.common.errors import DockyardError, loads, problems

MANIFEST_LIMIT = 64 << 20  # bytes: a manifest is a few KiB; a bigger "manifest" is not one the trainer wrote
RUNS_INSIDE = "/workspace/runs"  # the runs folder as a container sees it (dockyard.launch.node mounts it there)
# a run's name, its folder's in the runs folder (invoke run --run-id, compose's DOCKYARD_RUN_ID): no dot folder
# (.cache holds the compile cache), no folder within another, which `invoke runs` and export never find
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# The files of runs/<id>/, written by the trainer (T) or by the host (H), and read by the other.
MANIFEST = "manifest.json"       # T: node 0's record of the run (status, strategy in effect, metrics)
METRICS = "metrics.jsonl"        # T: one line per logging window
TRAIN_LOG = "train.log"          # H: the trainer's output
LOSS_PLOT = "loss.png"           # H: the monitor's plot of METRICS
MONITOR_SAMPLES = "monitor.jsonl"  # H: the monitor's samples, one line a second
MONITOR_VERDICT = "monitor.json"   # H: the monitor's verdict (balance, idle devices, its plots)
MODEL = "model"                  # T: the final model (or LoRA adapter), as the manifest's model.saved says
CHECKPOINTS = "checkpoints"      # T: the Trainer's output_dir: checkpoint-<step>/ folders
PROFILE = "profile"              # T: profile_steps' traces (one per rank) and summary (dockyard.train.profiler)
PROFILE_TRACE = "trace-rank{}.json.gz"  # T: in profile/, each rank's (Chrome trace format, gzip)
PROFILE_SUMMARY = "summary.txt"  # T: in profile/, rank 0's account of its GPU's time
PROFILE_TIMELINE = "timeline.png"  # H: in profile/, the monitor's plot of rank 0's GPU kernels...
PROFILE_TIMELINE_DATA = "timeline.json"  # T: ...drawn from this, rank 0's kernels over time (kernels.timeline_record)
NATIVE_VARIANTS = ("", "native")  # what a run made with --native records as its variant (the manifest's)
OVERRIDES = "overrides.json"     # T: the settings given after `--` (the run's own, and those a resume gave): --resume
                                 # trains with them again
COMPLETE = "complete.json"       # T: in a checkpoint-<step>/, written last by rank 0 once every rank saved its part
SHARED_TOKEN = ".shared-check"   # T: node 0 writes it, the others read it: is the run folder one shared folder?
LOST_NODE = ".lost-node"         # T: the first rank that sees which node was lost says it here, for the others
CLAIM = ".claimed-by-node0"      # H: node 0's claim on a run folder the other nodes may have made first
TRAINING_LOCK = ".resume.lock"   # T: held by node 0's first process while it trains (a run or a resume): `hold`
RANK_FAILED = ".failed-rank"     # T: + the global rank: why a process that writes no manifest failed, for the one that
                                 # does (torchrun stops it with SIGTERM, which alone says nothing)
# What the other nodes of a multi-node run write beside node 0's files (manifest-node1.json, monitor-node1.jsonl):
# launched at the same moment (Slurm, Kubernetes), node 1 may be there first, and that is not an earlier run.
OTHER_NODES_FILE = re.compile(r"[^.]+-node[1-9][0-9]*(\.[a-z]+)+")


def write(folder: Path, name: str, data: bytes | str, mode: int | None = None) -> None:
    """Replace folder/name with `data` in one step (never half-written, never through a link); `mode`: chmod it."""
    write_all(folder, {name: data}, mode)


def write_all(folder: Path, files: dict[str, bytes | str], mode: int | None = None) -> None:
    """Replace each folder/name with its data, as one set (a k8s job.yaml and trainjob.yaml): every file is written
    aside before any is put in place, so a full disk or a Ctrl-C while writing leaves the folder as it was; then each
    is renamed into place (never half-written, never through a link); `mode`: chmod them."""
    dfd = _open_folder(folder)
    aside: list[str] = []
    try:
        for name, data in files.items():
            aside.append(_aside(dfd, name, data, mode))
        for name, tmp in zip(files, list(aside), strict=True):
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            aside.remove(tmp)
    except IsADirectoryError:
        raise DockyardError(f"{folder / name} is a folder, where a file is written: remove it") from None
    finally:
        for tmp in aside:  # those not renamed: a failure or an interrupt before
            _unlink(tmp, dfd)
        os.close(dfd)


def create(folder: Path, name: str, data: bytes | str) -> bool:
    """Make folder/name with `data` where nothing has that name yet: whole or not at all (written aside, then linked to
    the name, which link(2) never follows nor replaces). False where something has it: another writer's file, even one
    made a moment ago, or a link planted there."""
    dfd = _open_folder(folder)
    try:
        tmp = _aside(dfd, name, data)
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            return False
        finally:
            _unlink(tmp, dfd)
        return True
    finally:
        os.close(dfd)


def _aside(dfd: int, name: str, data: bytes | str, mode: int | None = None) -> str:
    """A new file of a name of its own in the folder `dfd`, holding `data` (`mode`: chmod it), for the caller to put
    in place of `name`; its name. Removed again where it cannot be written whole (a full disk)."""
    tmp = f".{_plain(name)}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
    except BaseException:
        _unlink(tmp, dfd)
        raise
    return tmp


def append(folder: Path, name: str) -> IO[str]:
    """folder/name opened to append text (made when missing); a link or anything but a regular file refused. A
    character UTF-8 cannot hold (a host path's byte that is not UTF-8, which Python reads as a surrogate) is written
    escaped, as the console writes it: train.log raised on each line naming such a runs folder."""
    dfd = _open_folder(folder)
    try:
        fd = _open(folder, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, dfd)
    finally:
        os.close(dfd)
    return os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")


def read(folder: Path, name: str, limit: int | None = None) -> bytes | None:
    """The bytes of folder/name, None when there is no such file; a link, a fifo, a file over `limit` refused."""
    f = open_file(folder, name, limit)
    if f is None:
        return None
    with f:
        return f.read()


def open_file(folder: Path, name: str, limit: int | None = None) -> IO[bytes] | None:
    """folder/name open for reading, None when there is no such file; a link, a fifo, a file over `limit` refused."""
    dfd = _open_folder(folder)
    try:
        fd = _open(folder, name, os.O_RDONLY | os.O_NONBLOCK, dfd)
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)
    f = os.fdopen(fd, "rb")
    if limit is not None and os.fstat(fd).st_size > limit:
        f.close()
        raise DockyardError(f"{folder / name} is over {limit >> 20} MiB: not a file dockyard wrote there")
    return f


def read_text(folder: Path, name: str, limit: int | None = None) -> str | None:
    raw = read(folder, name, limit)
    return None if raw is None else raw.decode("utf-8", errors="replace")


OVERRIDES_LIMIT = 1 << 20  # bytes: overrides.json (the trainer's hold a few settings)


def saved_overrides(run_dir: Path) -> dict[str, Any]:
    """The settings the run was given after `--`, which --resume trains with again: its overrides.json, else those
    its manifest records (the file removed or lost: the run's own settings, not the defaults); {} for a run from
    before they were kept, or one killed before it trained. Untrusted: read through no link, and refused unless the
    trainer's shape."""
    where = run_dir / OVERRIDES
    try:
        raw = read_text(run_dir, OVERRIDES, OVERRIDES_LIMIT)
        if raw is not None:
            saved = loads(raw)
        else:
            where = run_dir / MANIFEST
            recorded = read_manifest(run_dir)
            saved = (recorded.model_extra or {}).get("overrides", {}) if recorded is not None else {}
    except (OSError, ValueError, DockyardError) as e:
        saved = e
    if not (isinstance(saved, dict) and all(isinstance(k, str) and k.isidentifier() for k in saved)):
        if where.name == MANIFEST:
            raise DockyardError(f"--resume: {run_dir / OVERRIDES} is gone and the settings {where} records are not "
                                f"the list the trainer wrote: write the run's settings to {OVERRIDES} as JSON (e.g. "
                                '{"max_steps": 60}, or {} for none) and resume again')
        raise DockyardError(f"--resume: {where} is not the list of settings the trainer wrote; remove it and give the "
                            "run's settings again after `--`")
    return saved


def save_overrides(run_dir: Path, overrides: dict[str, Any]) -> None:
    write(run_dir, OVERRIDES, json.dumps(overrides, indent=1, default=str) + "\n")


def check(folder: Path) -> None:
    """Refuse a run folder that is a link or holds a link, a fifo or a device anywhere below it."""
    os.close(_open_folder(folder))
    for root, dirs, files in tree.walk(folder):  # never descends into a linked folder: it is listed, and refused
        for name in dirs + files:
            path = Path(root, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue  # replaced meanwhile (another node's temporary file): what took its name is checked on use
            if stat.S_ISLNK(mode):
                raise _link_error(path)
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise DockyardError(f"{path} is not a regular file or folder: a run folder holds nothing else; "
                                    "remove it (something that ran with the runs folder mounted made it)")


def hold(run_dir: Path) -> int | None:
    """An exclusive lock on the run folder's TRAINING_LOCK, kept open (and held) until the process ends or closes it:
    a resume started while the run (or another resume of it) still trained read the checkpoints being written and
    rotated, and trained into the same checkpoints, metrics and model. None where the runs folder takes no locks
    (NFS without its lock service: ENOLCK): the run trains unguarded, as it did before there was a lock."""
    try:
        fd = os.open(run_dir / TRAINING_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise DockyardError(f"cannot open {run_dir / TRAINING_LOCK} ({e.strerror}): remove it if it is a link") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DockyardError(_training_now(run_dir)) from None
    except OSError:  # ENOLCK, EOPNOTSUPP: a file system without locks
        os.close(fd)
        return None
    return fd


def check_idle(run_dir: Path) -> None:
    """Refuse a run folder whose TRAINING_LOCK a process holds (`hold`), before anything starts; makes nothing."""
    if training_now(run_dir):
        raise DockyardError(f"--resume: {_training_now(run_dir)}")


def training_now(run_dir: Path) -> bool:
    """Whether a process holds the run folder's TRAINING_LOCK (`hold`) now; takes nothing, makes nothing."""
    try:
        fd = os.open(run_dir / TRAINING_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none: no run took it; a link or a fifo: refused by the trainer's own `hold`
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks (hold): nothing to tell
        pass
    finally:
        os.close(fd)
    return False


def _training_now(run_dir: Path) -> str:
    return (f"run {run_dir.name} is being trained by another process now (it holds {run_dir / TRAINING_LOCK}): wait "
            "for it to end, or stop it, then resume")


def claim(folder: Path, marker: str | None = None) -> None:
    """Make a new run folder, atomically: an existing one (another run's, even one made a moment ago) is refused
    and left as it is. With `marker`, the folder may already exist (the other nodes of a run make it too) and the
    claim is that file, made with O_EXCL. The runs folder above it is made when missing."""
    try:
        _claim(folder, marker)
    except FileExistsError:
        raise DockyardError(f"run folder {folder} already holds a run (another run has this id, or one started with "
                            "it at the same moment): pick another --run-id, or add --resume to continue it") from None


def claim_free(folder: Path) -> Path:
    """claim() for a run id dockyard chose (the recipe and the second): the folder, or where another run holds it
    (two runs started in the same second), the first of folder-2, folder-3, ... that none holds, each one os.mkdir.
    The folder claimed. One node's alone: a run of several nodes is given its id (the other nodes must know it)."""
    for mine in _free_names(folder):
        try:
            _claim(mine, None)
            return mine
        except FileExistsError:
            continue
    raise DockyardError(_all_taken(folder))


def first_free(folder: Path) -> Path:
    """The folder claim_free would claim now, claiming nothing (a dry run shows the id the real run would take)."""
    mine = next((mine for mine in _free_names(folder) if not os.path.lexists(mine)), None)
    if mine is None:
        raise DockyardError(_all_taken(folder))
    return mine


def _free_names(folder: Path):
    """The folders claim_free tries, in turn: folder, folder-2, folder-3, ..."""
    for n in range(1, FREE_TRIES + 1):
        yield folder if n == 1 else folder.with_name(f"{folder.name}-{n}")


def _all_taken(folder: Path) -> str:
    return f"run folders {folder} to {folder.name}-{FREE_TRIES} are all taken: give the run an id of its own (--run-id=ID)"


FREE_TRIES = 99  # runs of one recipe started in the same second that get an id of their own


def _claim(folder: Path, marker: str | None) -> None:
    """claim's making of the folder (or its marker); FileExistsError where it is another run's."""
    make_folders(folder.parent, RUNS_FIX)
    try:
        if marker is None:
            os.mkdir(folder)
        else:
            folder.mkdir(exist_ok=True)
            dfd = _open_folder(folder)
            try:
                fd = os.open(_plain(marker), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666, dir_fd=dfd)
                mine, made_by = os.fstat(fd).st_uid, os.fstat(dfd).st_uid
                os.close(fd)
                if made_by != mine:  # by the marker's owner: this process as the file system sees it (NFS squashes)
                    _unlink(marker, dfd)
                    raise DockyardError(_others_folder(folder, made_by))
            finally:
                os.close(dfd)
    except FileExistsError:
        raise
    except OSError as e:  # a runs folder this user cannot write, a read-only file system
        raise DockyardError(f"cannot make the run folder {folder}: {e.strerror or e}; {RUNS_FIX}") from None


def _others_folder(folder: Path, uid: int) -> str:
    """A run folder of several nodes that another user made before node 0 claimed it (a shared runs folder, an id
    known ahead: a job script's): its owner may rename and replace any file a run writes there, the checkpoints a
    resume loads among them."""
    return (f"run folder {folder} was made by another user (uid {uid}), who can replace what a run writes in it (its "
            "checkpoints among them): pick another --run-id, or remove that folder first where it is a leftover of "
            "yours")


RUNS_FIX = "set the runs_dir setting (INVOKE_DOCKYARD_RUNS_DIR) to a folder you can write"
# where invoke slurm and k8s write by default: "give --out" alone left the setting that named it unsaid
JOBS_FIX = "set the jobs_dir setting (INVOKE_DOCKYARD_JOBS_DIR) to a folder you can write"


NAME_MAX = 64  # of a recipe's name in a run id: room for the date (or -slurm-JOBID) within the id's 128 characters


def recipe_name(recipe: str) -> str:
    """A recipe's name as run ids, Slurm's job and script names carry it: a folder's own name (`.`, `../mine/` given),
    else the name given, in letters, digits, _ . - and at most NAME_MAX of them (a longer folder name made a default
    run id past the 128 characters one may hold, refused at job time)."""
    folder = Path(os.path.expanduser(recipe))
    name = folder.resolve().name if (folder / "recipe.yaml").is_file() else recipe
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name).lstrip("-._")[:NAME_MAX] or "run"


def users_folder(folder: Path | str, writable: list[Path]) -> Path:
    """A folder the user named for an output (--out): a link on its way there (~/jobs -> /scratch/jobs) is the user's
    own, followed; inside a folder a run's container can write (`writable`: caches.container_writable, the runs folder
    and the caches), where code in a container could have planted one, none is: the path as typed is what the check
    that follows (caches.check_out_of_reach) refuses. Such a folder is known as written and where its links lead, and
    the path typed through a link of the user's own to it (~ a link to /nfs/home/u, the runs folder resolved) is
    followed as far as that folder and no further: compared as written alone, it was missed, and a planted link
    followed."""
    absolute = Path(os.path.abspath(os.path.expanduser(folder)))
    inner = {Path(route(w)) for w in writable for route in (os.path.abspath, os.path.realpath)}
    if any(absolute.is_relative_to(w) for w in inner):
        return absolute
    led = led_into(absolute, inner)
    return led if led is not None else followed(absolute, "--out")


def led_into(path: Path, inner: set[Path]) -> Path | None:
    """`path` (absolute) with its links followed one at a time from /, as the kernel does: the path reached as soon as
    it is inside one of `inner` (the rest as typed, none of its links followed), else None. realpath follows a chain
    of links at once: ~/latest -> runs/exp1, exp1 a link a container planted, resolved past the runs folder without a
    trace of it. A folder of `inner` is known by its path and by what it is (its device and inode): reached through a
    second mount point (a bind mount of it, or of a folder above it), it is the same folder under another name."""
    parts, now, hops = list(path.parts[1:]), Path("/"), 0
    known = {i for i in map(_identity, inner) if i is not None}
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        step = now.parent if part == ".." else now / part
        same = _identity(step) in known  # (its device and inode: the folder itself, under another mount point)
        if same or any(step.is_relative_to(w) for w in inner):
            if parts[:1] == [".."] and not os.path.islink(step) and (same or step in inner):
                now = step  # the folder itself and out by `..`: its parent, which no container changes (runs/../jobs)
                continue
            return step.joinpath(*parts)
        if part != ".." and os.path.islink(step) and hops < 40:  # past 40 (a loop): followed() says so
            hops += 1
            target = Path(os.readlink(step))
            parts = [*target.parts[1:], *parts] if target.is_absolute() else [*target.parts, *parts]
            now = Path("/") if target.is_absolute() else now
            continue
        now = step
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    """What a folder is, whatever path names it (the same under every mount point): None where nothing is there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, not searchable, a name too long
        return None
    return st.st_dev, st.st_ino


def followed(path: Path | str, flag: str) -> Path:
    """A path the user named, `~` expanded and the links on its way followed (their own: ~/out -> /scratch/out); a loop
    of links on the way (~/proj -> ~/scratch -> ~/proj, a link made twice) is refused naming `flag`: pathlib's
    'RuntimeError: Symlink loop' was a traceback."""
    try:
        return Path(os.path.expanduser(path)).resolve()
    except RuntimeError:
        raise DockyardError(f"{flag}={path}: a link on its way leads round a loop of links (a link made twice?): give "
                            "a path without it") from None


def make_folders(folder: Path, fix: str) -> Path:
    """`folder`, and the folders above it, where missing; one that cannot be made is an error naming it, why, and
    `fix` (what to give instead)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's word for a file where the folder would be
        raise DockyardError(f"cannot make the folder {folder}: a file of that name is in the way; {fix}") from None
    except OSError as e:
        raise DockyardError(f"cannot make the folder {folder}: {e.strerror or e}; {fix}") from None
    return folder


def check_makeable(folder: Path, fix: str) -> None:
    """What make_folders would refuse, found without making anything (a dry run): the nearest existing folder on
    the way must be a folder this user can write into."""
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    where = "" if existing == folder else f"cannot make the folder {folder}: "
    if not existing.is_dir():
        what = ("a link that leads to no folder (to nothing, or round a loop of links)" if existing.is_symlink()
                and not existing.exists() else "a file, not a folder")
        raise DockyardError(f"{where}{existing} is {what}; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DockyardError(f"{where}{existing} is not writable by you (uid {os.geteuid()}); {fix}")


def share_weights(folder: Path) -> None:
    """The .safetensors files in `folder` (and below) readable as this process's umask makes its other files: the
    safetensors library writes them 0600, so the users of a shared runs folder (a serving container of another uid)
    could read the config and tokenizer of a model, not its weights. Never through a link."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = 0o022
    for root, _dirs, files in tree.walk(folder):  # follows no link to a folder
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".safetensors") and not os.path.islink(path):
                try:
                    os.chmod(path, 0o666 & ~umask)
                except OSError:
                    pass  # another user's file (a shared folder): theirs to share


def make_dir(folder: Path, name: str) -> Path:
    """A new folder inside a run folder (an export's output); an existing name, a link included, is refused."""
    dfd = _open_folder(folder)
    try:
        os.mkdir(_plain(name), dir_fd=dfd)
    except FileExistsError:
        raise DockyardError(f"{folder / name} already exists: give a new --out folder (an export never overwrites)") \
            from None
    finally:
        os.close(dfd)
    return folder / name


SMALL = 64 << 20  # files up to this size are hashed whole; bigger ones and folders by their list of files and sizes


MODEL_FILES_MAX = 10_000  # files in a model folder whose manifest record says no count (the largest hold a few hundred)


def fingerprint(path: Path, most_files: int | None = None, hidden: bool = True) -> dict[str, Any] | None:
    """What a run used, recorded so it can be checked later: size, and a sha256 of the file (small files) or of
    its list of (relative name, size) (big files and folders: hashing gigabytes of weights would delay every
    run). `most_files`: None where the folder holds more files than that (the walk stops there: a manifest's
    recorded folder checked against /usr took minutes). `hidden=False`: a folder's hidden files and folders left out,
    which the trainer never reads (a model's .cache/ that `hf download --local-dir` writes, a .git/)."""
    if path.is_file():
        files = [path]
    else:
        files = []
        for p in tree.files(path):
            if not hidden and any(part.startswith(".") for part in p.relative_to(path).parts):
                continue
            files.append(p)
            if most_files is not None and len(files) > most_files:
                return None
        files.sort()
    size = sum(f.stat().st_size for f in files)
    h = hashlib.sha256()
    if path.is_file() and size <= SMALL:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return {"bytes": size, "sha256": h.hexdigest(), "hash_of": "content"}
    for f in files:
        h.update(f"{f.relative_to(path).as_posix() if f != path else f.name}\t{f.stat().st_size}\n".encode())
    return {"bytes": size, "files": len(files), "sha256": h.hexdigest(), "hash_of": "file list with sizes"}


# --- the manifest, as the host reads it ---------------------------------------------------------------

class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


def _printable(v: str) -> str:
    if not v.isprintable():  # "completed\x1b[31m...": the run's summary printed it to the terminal as it was
        raise ValueError("holds a control character, which no trainer writes")
    return v


Words = Annotated[str, AfterValidator(_printable)]  # what the host prints of the manifest
Count = Annotated[int, Field(ge=0, le=2**63)]  # 10**400 bytes of peak memory was an OverflowError in the summary


class InEffect(_Loose):
    engine: Words | None = None
    zero_stage: Count | None = None
    offload_optimizer: Words | None = None  # "cpu" (or "nvme") where ZeRO moved the optimizer's state off the GPU
    offload_param: Words | None = None
    compiled: Words | None = None  # "the whole model", "block by block (N modules)" or null


class StrategyRecord(_Loose):
    requested: Words | None = None
    in_effect: InEffect | None = None  # null when the run failed before the model was wrapped
    peft: Words | None = None


class MetricsRecord(_Loose):
    steps: Count | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    loss_non_finite_at_step: Count | None = None  # the run diverged there
    tokens_per_second: float | None = None
    mfu: float | None = None
    peak_memory_bytes: Count | None = None
    peak_memory_kind: Words | None = None  # "gpu_reserved" (torch's pool, the largest rank) or "rss" (CPU)
    peak_memory_rank: Count | None = None  # the rank whose peak it is
    compile_cache: dict[str, int] | None = None  # graphs loaded from the compile cache (hits) or compiled (misses)
    steady_state: SteadyState | None = None


class SteadyState(_Loose):
    warm_up_left_out: bool | None = None  # false: too few logging windows to leave the warm-up out
    from_step: int | None = None  # the steps the rate counts (the first window is always left out, where any follows)
    to_step: int | None = None
    profiled_steps_left_out: list[int] | None = None  # profile_steps: the windows the profiler slowed
    profiled_steps_included: list[int] | None = None  # ...counted, the run having no other windows to measure


class ResumedRecord(_Loose):
    step: Count | None = None  # the checkpoint's step this attempt continued from


class ProfileRecord(_Loose):
    steps: list[int]
    gpu_busy: float | None = None  # None: no GPU kernel recorded (CPU)


class ImageRecord(_Loose):
    ref: str = ""
    id: str = ""


class InputRecord(_Loose):
    path: str = ""
    inside: str = ""
    sha256: str | None = None
    hash_of: str | None = None


class ModelSummary(_Loose):
    base: Words | None = None               # the model the run started from, as the trainer saw it
    format: Words | None = None             # "adapter" (LoRA/QLoRA) or "full"
    quantized_layers: Count | None = None   # QLoRA: the linear layers held in 4 bits


class RunManifest(_Loose):
    """The keys the host uses (summaries, `invoke export`), typed; everything else is kept as it is."""

    run_id: Words
    status: Words
    recipe: Words = ""
    variant: Words = "native"
    world_size: Count | None = None
    nodes: Count | None = None
    node_rank: Count | None = None          # whose record: node 0's manifest.json may be another node's (it lost node 0)
    image: ImageRecord = ImageRecord()
    strategy: StrategyRecord | None = None
    model: ModelSummary | None = None
    metrics: MetricsRecord | None = None
    inputs: dict[str, InputRecord] = {}
    profile: ProfileRecord | None = None
    resumed: ResumedRecord | None = None    # a resume: its tokens/s counts this attempt's steps alone
    error: str | None = None


def read_manifest(folder: Path, name: str = MANIFEST, fix: str = "") -> RunManifest | None:
    """The run's manifest, checked; None when the run wrote none. `fix`: what the refusal of one that is no manifest
    (cut short, another program's) tells the user to do."""
    text = read_text(folder, name, MANIFEST_LIMIT)
    if text is None:
        return None
    try:
        return parse_manifest(loads(text), folder / name, fix)
    except ValueError as e:  # json.JSONDecodeError
        raise DockyardError(f"{folder / name} is not valid JSON ({e}): not a manifest the trainer wrote{fix}") from None


def parse_manifest(raw: object, where: Path | str, fix: str = "") -> RunManifest:
    try:
        return RunManifest.model_validate(raw)
    except ValidationError as e:
        raise DockyardError(f"{where} is not a manifest the trainer writes ({problems(e, 'manifest')}){fix}") from None


# --- below: opening by name, never through a link -------------------------------------------------------

def _plain(name: str) -> str:
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    return name


def _open_folder(folder: Path) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            raise _link_error(Path(folder)) from None
        if e.errno == errno.ENOTDIR:
            raise DockyardError(f"{folder} is not a folder: a run folder is a plain folder") from None
        raise


def _open(folder: Path, name: str, flags: int, dfd: int) -> int:
    try:
        fd = os.open(_plain(name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_error(folder / name) from None
        if e.errno == errno.EISDIR:
            raise DockyardError(f"{folder / name} is a folder, where dockyard keeps a file: remove it") from None
        # opened by its name in the folder (dir_fd): the error said "manifest.json: Permission denied", of no folder
        raise OSError(e.errno, e.strerror, str(folder / name)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DockyardError(f"{folder / name} is not a regular file: remove it (something that ran with the runs "
                            "folder mounted made it)")
    return fd


def _link_error(path: Path) -> DockyardError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return DockyardError(f"{path} is a symbolic link{target}: dockyard never follows a link in a run folder. "
                         "Something that ran with the runs folder mounted made it: remove it, and check what ran")


def _unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


def checkpoints_started(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders (checkpoints/checkpoint-<step>), complete or not, by step."""
    return sorted((p for p in (run_dir / CHECKPOINTS).glob("checkpoint-*") if p.name[11:].isascii() and p.name[11:].isdigit()),
                  key=lambda p: int(p.name[11:]))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints every rank finished writing (the COMPLETE marker in each), by step."""
    return [p for p in checkpoints_started(run_dir) if (p / COMPLETE).is_file()]


# where the runs that no launcher of ours gives the compile cache (compose, the pods of `invoke k8s`) keep it: in the
# runs folder they mount (dockyard.launch.node.COMPILE_IN_RUNS)
CACHES_IN_RUNS = ".cache"

# folders of the runs folder that tasks other than `invoke run` write, or wrote (run.shell; slurm and k8s before
# the jobs folder), or runs write beside their own: no run's
TOOL_FOLDERS = {"slurm": "the sbatch scripts `invoke slurm` wrote before it wrote them into the jobs folder",
                "k8s": "the manifests `invoke k8s` wrote before it wrote them into the jobs folder",
                "shell": "the files of `invoke shell` sessions",
                CACHES_IN_RUNS: "the compile cache of compose runs and of the pods of `invoke k8s`"}


def checkpoint_step(checkpoint: Path | str) -> int:
    """The step a checkpoint folder's name says (checkpoint-<step>)."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


def check_steps_left(run_dir: Path, max_steps: Any, last: Path | None, completed: bool) -> None:
    """A resume whose last checkpoint is at `max_steps` already (the trainer's, and the host's before an image
    starts): nothing to train. `completed`: the run's manifest says so."""
    if last is None or not isinstance(max_steps, int) or not 0 < max_steps <= checkpoint_step(last):
        return
    done = (f", and completed: its model is in {run_dir / MODEL}" if completed and (run_dir / MODEL).is_dir()
            else "")
    reads = ("an adapter: peft's PeftModel.from_pretrained reads it onto the base model" if
             (last / "adapter_config.json").is_file() else "from_pretrained reads them")
    raise DockyardError(f"already at max_steps {max_steps} ({last.name}){done}: raise it to train on (-- "
                        f"--max_steps N, after the task's flags); the weights of that step are in {last} ({reads})")


def manifest_file(node_rank: int) -> str:
    """Node 0's manifest is the run's; every other node of a multi-node run writes its own beside it."""
    return MANIFEST if node_rank == 0 else f"manifest-node{node_rank}.json"


NODE_MANIFEST = re.compile(r"manifest-node([1-9][0-9]{0,5})\.json")


def record_for(run_dir: Path, node_rank: int) -> tuple[str, RunManifest] | None:
    """The record a node's --resume reads the run from, and its file's name (records_for's first); None where no
    node wrote one."""
    return next(records_for(run_dir, node_rank), None)


def records_for(run_dir: Path, node_rank: int) -> Iterator[tuple[str, RunManifest]]:
    """The run's records a node's --resume may read (record_names), each with its file's name, best first. Another
    node's that is no manifest is passed over: only the fallback, not this node's to refuse."""
    for name in record_names(run_dir, node_rank):
        path = shlex.quote(str(run_dir / name))
        try:  # was refused without a way on: "... is not valid JSON (...): not a manifest the trainer wrote"
            m = read_manifest(run_dir, name, f"; move it aside (mv {path} {path}.broken) and resume again, as a node "
                                             "that wrote no record (--resume then says what to give)")
        except DockyardError:
            if name in (manifest_file(node_rank), MANIFEST):
                raise
            continue
        if m is not None:
            yield name, m


def record_names(run_dir: Path, node_rank: int) -> list[str]:
    """The files of the run's records in run_dir that a node's --resume may read, best first: the node's own; where it
    wrote none (lost before it could), the run's manifest.json, then the other nodes' records, lowest node first (both
    nodes lost: node 1 failed and wrote its own, node 0 went down without one, and node 1, having lost no node 0, made
    no manifest.json of its record: node 0's resume was refused as a run that had written no record at all)."""
    try:
        names = set(os.listdir(run_dir))
    except OSError:
        return []
    others = sorted(int(found[1]) for name in names if (found := NODE_MANIFEST.fullmatch(name)))
    return [name for name in dict.fromkeys([manifest_file(node_rank), MANIFEST, *map(manifest_file, others)])
            if name in names]


def run_dir_of(cmd: list[str]) -> str:
    """The trainer's --run-dir in a command line; "" where it names none."""
    for word, after in zip(cmd, [*cmd[1:], ""], strict=True):
        if word == "--run-dir":
            return after
        if word.startswith("--run-dir="):
            return word.partition("=")[2]
    return ""
