"""Files in folders other users may write (/tmp, a shared --out folder): one process at a time (an exclusive,
non-blocking lock, refused at once with the caller's words), this user's private folder, and names for files being
written that no one can have planted a link under."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dockyard.common.errors import DockyardError


@contextlib.contextmanager
def held_alone(lock_file: Path, busy: str, *, remove: bool = False) -> Iterator[None]:
    """Hold `lock_file` (made if missing) for the block; DockyardError(busy) when another process holds it.
    Opened without following a link and without truncating: a link planted under its name writes nothing.
    `remove`: the file goes as the block ends (one per archive path ever saved stayed in the private folder for good),
    unlinked while still held. Every holder of such a file checks, once it holds it, that the name still leads to the
    file it locked: a process that opened it just before the last holder unlinked it locks a file no name leads to,
    and would run beside the next one, which makes and locks a new file under the name; it opens the name again."""
    for _ in range(100):  # another try only where a holder unlinked the file between this open and this lock
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise DockyardError(f"cannot open the lock file {lock_file} ({e.strerror}): remove it if it is a link or "
                                "not yours") from None
        with os.fdopen(fd, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DockyardError(busy) from None
            if remove and not names(lock_file, fd):
                continue
            try:
                yield
            finally:
                if remove:
                    lock_file.unlink(missing_ok=True)  # before the lock goes: see above
            return
    raise DockyardError(busy)


def names(path: Path, fd: int) -> bool:
    """Whether `path` (not followed, if a link) is the file open as `fd`."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def private_folder() -> Path:
    """This user's own folder in the temporary folder (/tmp/dockyard-<uid>, made 0700) for lock files: in /tmp
    itself another user can plant a link or a file under a name that is known in advance. Refused when it is a link,
    another user's, or others may write in it."""
    folder = Path(tempfile.gettempdir()) / f"dockyard-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    st = folder.lstat()
    why = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder" if not stat.S_ISDIR(st.st_mode)
           else f"owned by uid {st.st_uid}" if st.st_uid != os.geteuid()
           else "writable by others" if st.st_mode & 0o022 else "")
    if why:
        raise DockyardError(f"{folder} is {why}, not a private folder of yours: someone else made it; remove it, or "
                            "set TMPDIR to a folder of your own")
    return folder


def partial(path: Path) -> Path:
    """A name beside `path` to write it under until whole, which no one can guess: in a folder others may write, a
    link planted under a predictable name (`<name>.<pid>.partial`) was written through and chmod'ed. Open it with
    mode "x" (O_EXCL: made new, never through a link). It names the writer's host too (host_tag): see left_behind."""
    return path.with_name(f"{path.name}.{os.getpid()}.{host_tag()}-{secrets.token_hex(6)}.partial")


def host_tag() -> str:
    """8 hex digits naming this host (of its host name), put in partial() names beside the writer's pid. Of the name's
    bytes, as load.sh's (uname -n): a name that is not UTF-8 (sethostname takes any bytes) was hashed with a ? for
    each byte, another tag, and invoke load took this host's killed load.sh folders for another host's."""
    return hashlib.sha256(os.fsencode(socket.gethostname())).hexdigest()[:8]


# partial()'s names: the pid is the writer's, on the host the tag names (names made before the tag have none)
LEFT_PARTIAL = re.compile(r".*\.(\d+)\.(?:([0-9a-f]{8})-)?[0-9a-f]+\.partial(\.sig)?")


def gone(pid: int) -> bool:
    """Whether no process of that id runs on this host (one that does may be another than the writer: kept)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # past any pid_t: digits a name made up (os.kill's OverflowError)
        return True
    except OSError:  # another user's
        return False
    return False


def left_behind(folder: Path, names: set[str] | None = None) -> list[Path]:
    """This user's partial() files (of `names`, or any) in `folder` whose writer is gone (killed with SIGKILL, a
    power cut): nothing else ever removes them. Only those written on this host: a folder on shared storage (NFS: the
    runs folder of several nodes, a home's layer cache, a team's --out) holds another node's, whose pid says nothing
    here; those were removed under their live writer (its save or export then failed, or exported nothing)."""
    return [p for p, m, st in _partials(folder, names)
            if m[2] in (None, host_tag()) and gone(int(m[1])) and stat.S_ISREG(st.st_mode)]


def written_elsewhere(folder: Path, names: set[str]) -> list[Path]:
    """This user's partial() files of `names` in `folder` that another host wrote (its tag): left to that host, whose
    writer may still run (left_behind)."""
    return [p for p, m, _ in _partials(folder, names) if m[2] not in (None, host_tag())]


def _partials(folder: Path, names: set[str] | None) -> Iterator[tuple[Path, re.Match[str], os.stat_result]]:
    """This user's partial() names in `folder` (of `names`, or any), each with its match of LEFT_PARTIAL (pid, host
    tag) and its lstat; a folder or file that cannot be read is none."""
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            m = LEFT_PARTIAL.fullmatch(p.name)
            if not m or (names is not None and p.name[:m.start(1) - 1] not in names):
                continue
            try:
                st = p.lstat()
            except OSError:
                continue
            if st.st_uid == os.geteuid():
                yield p, m, st


def names_a_folder(v: str) -> bool:
    """Whether a path as the user wrote it can only be a folder: it ends in `/`, `.` or `..` (`DIR/.` would
    otherwise read as the file DIR), or a folder is there."""
    return v.endswith("/") or os.path.basename(v) in (".", "..") or os.path.isdir(v)


def check_ours(path: Path | str, flag: str, marker: bytes, what: str) -> None:
    """A plain file under `path` that the task did not write (its first 4 KiB lack `marker`) is refused, not replaced:
    `--record=~/.bashrc` or `--out=notes.txt` was written over without a word. Nothing there, an empty file, or one
    of the task's own is fine; a link under the name is replaced, never read through."""
    if not_ours(path, marker):
        raise DockyardError(f"{flag}={path} holds a file that is not {what}: give another name, or remove that file "
                            "first (it is replaced whole)")


def not_ours(path: Path | str, marker: bytes) -> bool:
    """Whether `path` is a plain file, not empty, whose first 4 KiB lack `marker`: one a task that writes that name
    whole did not write. Nothing there, or a link (replaced, never read through), is not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # nothing there, a link, or what check_named_output and the write say
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(4096) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    return bool(head) and marker not in head


def not_written_by(path: Path | str, marker: bytes) -> bool:
    """Whether a name a task writes on its own (a companion the user did not name) holds anything that task did not
    write: a link (the user's run.sh -> scripts/train.sh), an empty file, a fifo or a folder, or a plain file whose
    first 4 KiB lack `marker`. The task writes a plain file holding `marker`, or nothing is there."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a link, a fifo, a folder
            return True
    except OSError:  # nothing there, or no folder to hold it (a file, a loop of links on the way): the caller says so
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # swapped for a link since, or unreadable: not the task's own either way
        return True
    with os.fdopen(fd, "rb") as f:
        return not (stat.S_ISREG(os.fstat(fd).st_mode) and marker in f.read(4096))


def check_named_output(path: Path | str, flag: str) -> None:
    """A file the user named for a task to write whole (--out, --record): refused where that name holds, or links to,
    anything but a plain file (/dev/null, /dev/stdout, a fifo, a socket), or names a folder (as written: `DIR/.` is
    no file DIR). The file is written beside it and renamed over it, so a device node or a link to one (as root:
    /dev/stdout, /dev/null) was replaced by a plain file."""
    if Path(path).name == "-":  # read as "standard output" by the user, a file named "-" by the write
        raise DockyardError(f"{flag}=-: the file is written whole, never to standard output; name a file (then `cat` "
                            "it to see it)")
    if names_a_folder(str(path)):
        raise DockyardError(f"{flag}={path}: that names a folder; name a file in it, as in "
                            f"{os.path.join(str(path), 'host.json')}")
    path = Path(path)
    try:
        st = os.stat(path)  # through links: /dev/stdout -> /proc/self/fd/1 -> the terminal
    except NotADirectoryError:  # mkdir's "File exists" otherwise, naming nothing
        file = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise DockyardError(f"{flag}={path}: {file} is a file, not a folder: name a file in a folder") from None
    except FileNotFoundError:
        return  # nothing there yet (or a dangling link, replaced as before)
    except OSError:
        return  # said by the write itself
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        kind = ("a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a pipe" if stat.S_ISFIFO(st.st_mode) else "a socket")
        raise DockyardError(f"{flag}={path}: {'links to ' if path.is_symlink() else 'is '}{kind}, not a file; the "
                            "file is written whole and put in place of what the name holds: name a plain file "
                            "(then `cat` it to see it)")


def replace_file(path: Path, text: str, mode: int | None = None) -> None:
    """Write `path` whole under a partial() name, then put it in place: a link planted under its name is replaced,
    not written through, and a write cut short (a full disk, Ctrl-C) leaves the old file as it was."""
    written = partial(path)
    try:
        with open(written, "x") as f:
            f.write(text)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)
