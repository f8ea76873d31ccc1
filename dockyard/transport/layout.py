"""An archive set on disk, and the compression methods it may use.

An archive is a plain `docker save` tar, compressed, with three files beside it: `<name>.sha256`
(sha256sum -c format, covering the archive AND the manifest), `<name>.manifest.json` (what is inside),
`load.sh` (the same verify-then-load for nodes without the project) and, for dockyard images, `run.sh`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dockyard import engine
from dockyard.common.errors import DockyardError, MiB, read_bounded
from dockyard.common.locks import partial

FORMAT = "dockyard-archive/1"
SUFFIXES = {"zstd": ".tar.zst", "gzip": ".tar.gz", "none": ".tar"}
# zstd 2: on 2 cores smaller than `gzip -6` and close to the speed of `docker save` itself
# (benchmarks/results/transport.md); 3 is about 7 % smaller and 15 % slower.
DEFAULT_LEVEL = {"zstd": 2, "gzip": 6, "none": 0}
LEVELS = {"zstd": range(1, 23), "gzip": range(1, 10), "none": range(0, 1)}
LOADER_TEMPLATE = Path(__file__).parent / "load.sh"
LOADER_MARK = b"# Loads a dockyard image archive"  # in every load.sh a save wrote (its second line)

# what the small files of an archive set may hold (they are read whole, as untrusted input): a manifest lists a few
# images and their layers, a .sha256 three lines, an ssh signature about 300 bytes (load.sh copies as much)
MANIFEST_LIMIT, SUMS_LIMIT, SIGNATURE_LIMIT = 16 * MiB, 64 * 1024, 64 * 1024


def archives_in(folder: Path, most: int = 3) -> str:
    """The archives in `folder` (those `invoke save` writes, by their suffix), named: at most `most`, then how many
    more; "" where there are none."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(tuple(SUFFIXES.values())) and p.is_file())
    except OSError:
        return ""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(str(folder / name) for name in names[:most]) + more


@dataclass(frozen=True)
class ArchivePaths:
    """The files of one archive: `<base><suffix>` and its companions in the same folder."""

    archive: Path

    @property
    def base(self) -> str:
        name = self.archive.name
        for suffix in SUFFIXES.values():
            if name.endswith(suffix):
                return name[: -len(suffix)]
        # `--file=images/dist`, the folder the save printed, or load.sh beside the archive: name the archive(s) there
        folder = self.archive if self.archive.is_dir() else self.archive.parent
        found = archives_in(folder)
        raise DockyardError(f"{self.archive} is {'a folder, ' if folder is self.archive else ''}not an image archive: "
                            f"expected a name ending in {', '.join(SUFFIXES.values())}"
                            + (f"; {'it' if folder is self.archive else 'its folder'} holds {found}" if found else ""))

    @property
    def method(self) -> str:
        return next(m for m, s in SUFFIXES.items() if self.archive.name.endswith(s))

    def _beside(self, suffix: str) -> Path:
        return self.archive.with_name(self.base + suffix)

    def other_compressions(self) -> list[Path]:
        """Archives of the same name in another compression (x.tar.gz beside x.tar.zst): they share the .sha256 and
        .manifest.json, which describe only the one saved last."""
        return [p for suffix in SUFFIXES.values()
                if (p := self._beside(suffix)) != self.archive and (p.exists() or p.is_symlink())]

    def check_whole(self, missing: str) -> None:
        """The archive, its .sha256 and .manifest.json each there as a file; `missing` says how to get a set whole."""
        for p in (self.archive, self.sha256, self.manifest):
            if p.is_dir():
                raise DockyardError(f"{p} is a folder, not a file of an archive set: --file names the archive "
                                    "(NAME.tar.zst), its .sha256 and .manifest.json beside it")
            if not p.exists():
                other = self.other_compressions() if p == self.archive else []  # x.tar.gz given, x.tar.zst here
                raise DockyardError(f"{p} is missing: " + (f"did you mean {other[0]}?" if other else missing))

    def manifest_bytes(self) -> bytes:
        """The .manifest.json as it is on disk, read as untrusted (bounded: not a pipe, at most MANIFEST_LIMIT)."""
        return read_bounded(self.manifest, MANIFEST_LIMIT, "archive manifest (.manifest.json)")

    def signature_bytes(self) -> bytes:
        """The .manifest.json.sig, read as untrusted (a link to /dev/zero never ended, a pipe waited for ever)."""
        return read_bounded(self.signature, SIGNATURE_LIMIT, "signature (.manifest.json.sig, as invoke save --sign "
                            "writes it)")

    def sums_bytes(self) -> bytes:
        return sums_bytes(self.sha256)

    @property
    def sha256(self) -> Path:
        return self._beside(".sha256")

    @property
    def manifest(self) -> Path:
        return self._beside(".manifest.json")

    @property
    def signature(self) -> Path:
        return self._beside(".manifest.json.sig")

    @property
    def loader(self) -> Path:
        return self.archive.with_name("load.sh")

    @property
    def runner(self) -> Path:
        """run.sh: trains in the loaded image (runscript.py); only beside archives of dockyard images."""
        return self.archive.with_name("run.sh")


def archive_name(refs: list[str], method: str, thin: bool) -> str:
    """A file name that says what is inside: `dockyard_0.1.0-cpu.tar.zst`, `..-thin.tar.zst`. A name of refs of the
    form name[:tag] reads back as one set of refs (its `_` is the `:`); any other ref's (a registry path, a digest,
    a `_` of its own) ends in @ and a hash of the refs: a/b:c and a_b:c were both a_b_c.tar.zst, and the second save
    replaced the first's archive without a word."""
    stem = "+".join(r.replace("/", "_").replace(":", "_").replace("@", "_") for r in refs)
    if not all(PLAIN_REF.fullmatch(r) for r in refs):  # no plain ref's name holds an @
        stem = stem[:100] + "@" + hashlib.sha256("\n".join(refs).encode()).hexdigest()[:12]
    elif len(stem) > 120:
        stem = stem[:100] + "+" + hashlib.sha256(stem.encode()).hexdigest()[:12]
    return stem + ("-thin" if thin else "") + SUFFIXES[method]


# a ref whose archive name is the ref with its `:` as `_`: no `_`, `/` or `@` of its own, and not ending in -thin
# (`x:1-thin` was named as a thin archive of x:1)
PLAIN_REF = re.compile(r"[A-Za-z0-9.-]+(:[A-Za-z0-9.-]+)?(?<!-thin)", re.ASCII)


def sums_bytes(path: Path) -> bytes:
    """A .sha256 file as it is on disk, read as untrusted (bounded: not a pipe, at most SUMS_LIMIT)."""
    return read_bounded(path, SUMS_LIMIT, "checksum file (.sha256)")


def read_sums(path: Path) -> dict[str, str]:
    """A .sha256 file (sha256sum format) as file name → digest."""
    sums = {}
    raw = sums_bytes(path)
    for line in raw.decode(errors="replace").splitlines():  # a damaged file is refused, not a crash
        digest, _, name = line.partition("  ")
        if name:
            sums[name.lstrip("*")] = digest.lower()  # hex digits in either case, as sha256sum -c takes them
    return sums


def write_loader(folder: Path) -> Path:
    """Puts load.sh beside the archives. It is the same for every archive: it reads the manifest."""
    loader = folder / "load.sh"
    written = partial(loader)
    try:
        with open(written, "xb") as f:
            f.write(LOADER_TEMPLATE.read_bytes())
            os.fchmod(f.fileno(), 0o755)
        os.replace(written, loader)
    finally:
        written.unlink(missing_ok=True)
    return loader


# --- compressors ---------------------------------------------------------------------------------

def check_method(method: str, level: int) -> int:
    """The level to use (0 = the method's default); refuses unknown methods and levels."""
    if method not in SUFFIXES:
        raise DockyardError(f"--compress={method}: choose zstd, gzip or none")
    level = level or DEFAULT_LEVEL[method]
    if level not in LEVELS[method]:
        r = LEVELS[method]
        raise DockyardError(f"--level={level} does not fit --compress={method}: use {r.start}..{r.stop - 1}")
    return level


def compressor_argv(method: str, level: int) -> list[str] | None:
    """zstd on every core; pigz where installed (same gzip format, every core), else gzip."""
    if method == "zstd":
        return ["zstd", "-T0", f"-{level}", *(["--ultra"] if level > 19 else []), "-q", "-c"]
    if method == "gzip":
        return [engine.which("pigz") or "gzip", f"-{level}", "-c"]
    return None


def decompressor_argv(method: str) -> list[str] | None:
    return {"zstd": ["zstd", "-dc", "-q"], "gzip": ["gzip", "-dc"]}.get(method)
