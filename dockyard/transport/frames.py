"""Compressed archives made of frames, one per large layer, with a cache of those frames keyed by diff id.

zstd and gzip both read a concatenation of frames (gzip: members) as the concatenation of their contents, so
an archive may be assembled from separately compressed pieces and stay one that `zstd -dc`, `gzip -dc` and
`docker load` read like any other. Each layer of at least MIN_LAYER bytes becomes its own frame; everything
between layers (tar headers, configs, small layers) goes into frames of its own.

On few cores a save is bound by compression: the engine sends nothing for most of `docker save` (it first
writes the layers out), then sends the whole tar at once, faster than a compressor on two cores can take it.
The cache keeps each large layer's frame after a save, so the next save of an image that shares those layers
(the next version after a recipe or code change, the same image again) copies them instead of compressing
them again. A frame is used only when the layer it stands for hashed to the same diff id on the way in, and
the frame itself still hashes to what it did when it was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from dockyard import engine
from dockyard.common import locks
from dockyard.common.errors import DockyardError, loads

MIN_LAYER = 1 << 20          # smaller layers are not worth a frame (or a cache entry) of their own
LOOSE_FLUSH = 64 << 20       # bytes between layers kept in memory before they are compressed
NAMES = "names.json"         # archive member name → diff id, learned from earlier saves (see known())


class StaleNames(DockyardError):
    """The name map said a layer file held one layer and it held another (see LayerCache.known)."""


class LayerCache:
    """Frames of one method and level: <dir>/<method>-<level>/<hex>.frame, with <hex>.sum holding the
    frame's sha256 and size. Written by rename only; the least recently used are removed above max_bytes."""

    def __init__(self, folder: Path, method: str, level: int, max_bytes: int):
        self.dir = folder / f"{method}-{level}"
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        self.bytes_copied = 0
        self.kept: list[Path] = []  # the frames this save added
        self.keeping = True  # False: frames found are used, no new ones are kept (no room for them: save.py)

    def _paths(self, digest: str) -> tuple[Path, Path]:
        hexid = digest.split(":", 1)[1]
        return self.dir / f"{hexid}.frame", self.dir / f"{hexid}.sum"

    def find(self, digest: str) -> Path | None:
        """The frame of a layer, checked against the sum written with it; a damaged one is removed."""
        frame, total = self._paths(digest)
        try:
            want_sha, want_size = total.read_text().split()
        except (OSError, ValueError):
            return None
        h, size = hashlib.sha256(), 0
        try:
            with open(frame, "rb") as f:
                while chunk := f.read(engine.CHUNK):
                    h.update(chunk)
                    size += len(chunk)
        except OSError:
            return None
        if h.hexdigest() != want_sha or size != int(want_size):
            frame.unlink(missing_ok=True)
            total.unlink(missing_ok=True)
            return None
        os.utime(frame)  # least recently used goes first
        return frame

    def partial(self, digest_hint: str) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir / f".{digest_hint}.{os.getpid()}.{locks.host_tag()}-{threading.get_ident()}.partial"

    def keep(self, partial: Path, digest: str, sha: str, size: int) -> None:
        frame, total = self._paths(digest)
        os.replace(partial, frame)
        self.kept.append(frame)
        tmp = total.with_name(total.name + f".{os.getpid()}.partial")
        tmp.write_text(f"{sha} {size}\n")
        os.replace(tmp, total)

    def known(self) -> dict[str, str]:
        """Member names of earlier `docker save` archives → diff ids. Engines that name layer files by an
        id derived from the layer's chain id (`<v1 id>/layer.tar`, before Docker 25) name a layer the same
        way every time, so the name says which frame to use before the layer is read; the layer is still
        hashed on the way and must match."""
        try:
            return loads((self.dir / NAMES).read_text())
        except (OSError, ValueError):
            return {}

    def forget(self) -> None:
        (self.dir / NAMES).unlink(missing_ok=True)

    def learn(self, names: dict[str, str]) -> None:
        merged = {n: d for n, d in {**self.known(), **names}.items() if self._paths(d)[1].exists()}
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{NAMES}.{os.getpid()}.partial"
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, self.dir / NAMES)

    @property
    def bytes_kept(self) -> int:
        """What this save's frames take in the cache now (prune may have removed some, past max_bytes)."""
        return sum(f.stat().st_size for f in self.kept if f.is_file())

    def prune(self) -> None:
        frames = sorted(self.dir.glob("*.frame"), key=lambda p: p.stat().st_mtime, reverse=True)
        total = 0
        for frame in frames:
            total += frame.stat().st_size
            if total > self.max_bytes:
                frame.with_suffix(".sum").unlink(missing_ok=True)
                frame.unlink(missing_ok=True)


class FramedSink:
    """What TarPump writes into when compressing: bytes between layers are gathered and compressed as one
    frame when a layer starts; each large layer is compressed by its own compressor process (or copied
    from the cache). Frames reach `emit` in the order of the tar stream."""

    def __init__(self, compressor: list[str], emit: Callable[[bytes], None], cache: LayerCache | None):
        self.compressor = compressor
        self.emit = emit
        self.cache = cache
        self.loose = bytearray()
        self.mode = "loose"
        self.expect = ""
        self.frame: Path | None = None
        self.proc: engine.Pipeline | None = None
        self.reader: threading.Thread | None = None
        self.failure: list[BaseException] = []
        self.partial: Path | None = None
        self.frame_sha = hashlib.sha256()
        self.frame_bytes = 0

    # --- the stream between layers
    def write(self, chunk: bytes) -> None:
        if self.mode == "compress":
            try:
                self.proc.stdin.write(chunk)
            except BrokenPipeError:
                self.reader.join()
                if self.failure:  # the frame's reader stopped first (e.g. the node it streams to went away)
                    raise self.failure[0] from None
                self.proc.wait()  # the compressor died on its own (killed, out of memory): its exit says so
                raise
        elif self.mode == "loose":
            self.loose += chunk
            if len(self.loose) >= LOOSE_FLUSH:
                self._flush_loose()
        # "cached": the layer's bytes are only hashed (by the pump); its frame is copied at the end

    def _flush_loose(self) -> None:
        if not self.loose:
            return
        done = engine.run(self.compressor, input=bytes(self.loose), capture=True, binary=True, quiet=True,
                          what="compressing the archive")
        self.emit(done.stdout)
        self.loose.clear()

    # --- one layer
    def begin(self, size: int, digest: str = "") -> bool:
        """A layer member's content follows (size bytes with padding). digest: its diff id when known
        before reading. Returns False when the content is not needed (its frame comes from the cache)."""
        if size < MIN_LAYER:
            self.mode = "loose"
            return True
        self._flush_loose()
        if self.cache is not None and digest and (frame := self.cache.find(digest)):
            self.mode, self.expect, self.frame = "cached", digest, frame
            return False
        self.mode = "compress"
        self.proc = engine.Pipeline(self.compressor, stdin=engine.PIPE, stdout=engine.PIPE, quiet=True,
                                    what="compressing a layer")
        self.partial = self.cache.partial(digest.split(":")[-1] or "layer") if self.cache and self.cache.keeping \
            else None
        self.frame_sha, self.frame_bytes = hashlib.sha256(), 0
        self.reader = threading.Thread(target=self._read_frame, args=(self.proc, self.partial), daemon=True)
        self.reader.start()
        return True

    def _read_frame(self, proc: engine.Pipeline, partial: Path | None) -> None:
        try:
            out = open(partial, "wb") if partial else None
            try:
                while chunk := os.read(proc.stdout.fileno(), engine.CHUNK):
                    self.emit(chunk)
                    if out:
                        out.write(chunk)
                        self.frame_sha.update(chunk)
                        self.frame_bytes += len(chunk)
            finally:
                if out:
                    out.close()
        except BaseException as e:  # reported by end()
            self.failure.append(e)
            proc.kill()

    def end(self, digest: str) -> None:
        """The layer's content has been read; digest is what it hashed to."""
        mode, self.mode = self.mode, "loose"
        if mode == "cached":
            if digest != self.expect:
                raise StaleNames(f"the layer cache ({self.cache.dir}) expected {self.expect} for a layer "
                                 f"the engine sent as {digest}; its name map is now cleared: save again")
            with open(self.frame, "rb") as f:
                while chunk := f.read(engine.CHUNK):
                    self.emit(chunk)
            self.cache.hits += 1
            self.cache.bytes_copied += self.frame.stat().st_size
        elif mode == "compress":
            proc, self.proc = self.proc, None
            try:
                proc.wait(check=False)  # closes its stdin first: the compressor finishes the frame
                self.reader.join()
                if self.failure:
                    raise self.failure[0]
                proc.check()
            finally:
                proc.close()
            if self.cache is not None:
                self.cache.misses += 1
            if self.partial is not None:
                self.cache.keep(self.partial, digest, self.frame_sha.hexdigest(), self.frame_bytes)
                self.partial = None

    def close(self) -> None:
        self._flush_loose()

    def abort(self) -> None:
        if self.proc is not None:
            self.proc.kill()
        if self.reader is not None:
            self.reader.join(timeout=10)
        if self.proc is not None:
            self.proc.close()
            self.proc = None
        if self.partial is not None:
            self.partial.unlink(missing_ok=True)
