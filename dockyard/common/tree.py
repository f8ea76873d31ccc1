"""Folders read as untrusted input (run folders, recipe folders, model folders, checkpoints): walked without recursion
and without following a link to a folder.

Python 3.11's os.walk and Path.rglob recurse once per level: a folder nested 1,200 deep, which anything that ran with
the runs folder mounted can make, was a RecursionError traceback in `invoke export`, `run --resume` and `run --dry`.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def near(path: Path, keep: Callable[[Path], bool] = lambda p: True) -> Path | None:
    """The entry beside `path` (which is not there) whose name is closest to its name, of those `keep` takes, or
    None: the path meant where its last part has a slip (chat.jsnl for chat.jsonl). A thousand entries are looked
    at, at most."""
    try:
        beside = [p.name for p in itertools.islice(path.parent.iterdir(), 1000) if keep(p)]
    except OSError:  # no such folder, or not ours to read
        return None
    meant = difflib.get_close_matches(path.name, beside, n=1, cutoff=0.75)
    return path.parent / meant[0] if meant else None


def walk(top: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """os.walk's (folder, its folders, its other entries), top-down: a link to a folder is listed among the folders,
    as os.walk lists it, and never entered. Removing a name from the folders skips it. A folder that cannot be read
    is left out, as os.walk leaves it."""
    stack = [Path(top)]
    while stack:
        root = stack.pop()
        dirs: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(root) as entries:
                for entry in entries:
                    (dirs if _is_dir(entry) else files).append(entry.name)
        except OSError:
            continue
        yield root, dirs, files
        stack.extend(root / d for d in reversed(dirs) if not (root / d).is_symlink())


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a loop of links (ELOOP): listed among the files, where a check of links finds it
        return False


def files(top: Path) -> Iterator[Path]:
    """Every file below `top` (a link to a file included, as Path.rglob gives it), in the walk's order, one at a
    time (a caller may stop early); no folder reached through a link."""
    for root, _dirs, names in walk(top):
        for name in names:
            if (root / name).is_file():
                yield root / name


def paths(top: Path) -> list[Path]:
    """Every entry below `top` (files, folders, links), sorted, as sorted(top.rglob("*")) without entering links."""
    return sorted(root / name for root, dirs, names in walk(top) for name in dirs + names)


PACKAGE = Path(__file__).resolve().parents[1]  # dockyard/, in a checkout as in an image


def code_hash(package: Path = PACKAGE) -> str:
    """sha256 over a package's files (names and contents; dockyard's own by default), as the build copies them: the
    image's label and the checkout's are equal exactly when the image runs this checkout's code, and two nodes' are
    equal exactly when they train with the same code."""
    h = hashlib.sha256()
    for f in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
