"""The `docker save` tar stream, read on its way to the compressor (TarPump).

It records every layer file's size and sha256, so each archive is checked against the images' diff ids
before it is kept (the engine can leave blobs out silently, moby#49473), and it drops the layer files a
thin archive leaves out. Classic engines name layer files by a legacy id that says nothing about the
layer, so for thin archives each layer is spooled while it is hashed, then kept or dropped, unless the
layer cache's name map (frames.LayerCache.known) already says which layer a name holds.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from dockyard.common.errors import DockyardError, cut, loads
from dockyard.engine import CHUNK
from dockyard.transport.frames import FramedSink, StaleNames

BLOCK = 512
SPOOL_IN_MEMORY = 256 << 20


class TarPump:
    """Copies a `docker save` tar from `src` to `write`, member by member.

    Records each layer file's sha256 and size, symlinked layer files, docker's manifest.json, and
    leaves out the layer files whose diff id is in `omit`.
    """

    def __init__(self, omit: Iterable[str] = (), spool_dir: Path | None = None,
                 on_read: Callable[[int], None] = lambda n: None):
        self.omit = set(omit)
        self.spool_dir = spool_dir
        self.on_read = on_read
        self.layers: dict[str, tuple[str, int]] = {}  # member name → (diff id, bytes)
        self.links: dict[str, str] = {}              # layer file name → the layer file it links to
        self.omitted: set[str] = set()
        self.docker_manifest: list[dict] = []
        self.bytes_read = 0
        self.bytes_left_out = 0  # of bytes_read: the omitted members, headers included (never written)
        self.frames: FramedSink | None = None  # set when compressing: layers become frames of their own
        self.known: dict[str, str] = {}        # member name → diff id, from earlier saves (LayerCache.known)

    def _read(self, src, n: int) -> bytes:
        data = src.read(n)
        if len(data) < n:
            raise DockyardError("the `docker save` stream ended in the middle of a file")
        self.bytes_read += n
        self.on_read(n)
        return data

    def _copy(self, src, n: int, write, h=None, content: int = 0) -> None:
        """Copy n bytes; the first `content` of them (the member without its padding) into h."""
        while n:
            chunk = self._read(src, min(n, CHUNK))
            n -= len(chunk)
            if h is not None and content > 0:
                h.update(chunk if len(chunk) <= content else chunk[:content])
                content -= len(chunk)
            if write is not None:
                write(chunk)

    def run(self, src, write) -> None:
        ext: list[bytes] = []          # PAX / GNU long-name headers that belong to the next member
        over: dict[str, str] = {}
        while True:
            header = self._read(src, BLOCK)
            if not any(header):        # end-of-archive marker: pass it and whatever follows
                write(header)
                while chunk := src.read(CHUNK):
                    write(chunk)
                return
            kind, size = header[156:157], _number(header[124:136])
            if kind in (b"x", b"L", b"K"):
                data = self._read(src, _padded(size))
                ext += [header, data]
                if kind == b"x":
                    over.update(_pax(data[:size]))
                else:
                    over["path" if kind == b"L" else "linkpath"] = _cstr(data[:size])
                continue
            name = over.get("path") or _cstr(header[0:100])
            if "path" not in over and header[257:262] == b"ustar" and header[345]:
                name = _cstr(header[345:500]) + "/" + name
            link = over.get("linkpath") or _cstr(header[157:257])
            size = int(over.get("size", size))
            self._member(src, write, b"".join(ext) + header, name.removeprefix("./"), kind, size, link)
            ext, over = [], {}

    def _member(self, src, write, head: bytes, name: str, kind: str, size: int, link: str) -> None:
        padded = _padded(size)
        regular = kind in (b"0", b"\0", b"7")
        blob = name.startswith("blobs/sha256/")
        if kind == b"2" and name.endswith("/layer.tar"):
            self.links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
        if not regular or not (blob or name.endswith("/layer.tar")):
            if name == "manifest.json":
                data = self._read(src, padded)
                self.docker_manifest = loads(data[:size])
                write(head)
                write(data)
            else:
                write(head)
                self._copy(src, padded, write)
            return
        if blob and "sha256:" + name.rsplit("/", 1)[1] in self.omit:
            self._copy(src, padded, None)   # the name is the digest: no need to look inside
            self.layers[name] = ("sha256:" + name.rsplit("/", 1)[1], size)
            self._leave_out(name, head, padded)
            return
        h = hashlib.sha256()
        hint = "sha256:" + name.rsplit("/", 1)[1] if blob else self.known.get(name, "")
        if hint in self.omit:  # known from an earlier save: no need to spool it, only to check it
            self._copy(src, padded, None, h, size)
            self.layers[name] = ("sha256:" + h.hexdigest(), size)
            if self.layers[name][0] != hint:
                raise StaleNames(f"the layer cache's name map said {name} holds {hint}, but it holds "
                                 f"{self.layers[name][0]}; the map is now cleared: save again")
            self._leave_out(name, head, padded)
            return
        if not self.omit or hint:
            write(head)
            send = self.frames.begin(padded, hint) if self.frames else True
            self._copy(src, padded, write if send else None, h, size)
            self.layers[name] = ("sha256:" + h.hexdigest(), size)
            if self.frames:
                self.frames.end(self.layers[name][0])
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY, dir=self.spool_dir) as spool:
            self._copy(src, padded, spool.write, h, size)
            digest = "sha256:" + h.hexdigest()
            self.layers[name] = (digest, size)
            if digest in self.omit:
                self._leave_out(name, head, padded)
                return
            write(head)
            if self.frames and not self.frames.begin(padded, digest):
                self.frames.end(digest)
                return
            spool.seek(0)
            while chunk := spool.read(CHUNK):
                write(chunk)
            if self.frames:
                self.frames.end(digest)

    def _leave_out(self, name: str, head: bytes, padded: int) -> None:
        self.omitted.add(name)
        self.bytes_left_out += len(head) + padded

    @property
    def bytes_out(self) -> int:
        """The tar as written (what docker load will read): what was read, less the members left out."""
        return self.bytes_read - self.bytes_left_out

    def diff_id(self, name: str) -> str:
        seen = set()
        while name in self.links and name not in seen:
            seen.add(name)
            name = self.links[name]
        if name not in self.layers:
            raise DockyardError(f"the `docker save` archive names {name} but does not hold it "
                                "(the engine left it out: moby#49473). Nothing was written.")
        return self.layers[name][0]

    def check(self, images: list[dict]) -> None:
        """Every image's layer files hash to its diff ids, in order: the archive is what it claims.

        Also sets each image's "tags" to those the archive carries (`docker save` by id carries none).
        """
        for img in images:
            hexid = img["id"].split(":", 1)[1]
            entry = next((e for e in self.docker_manifest if hexid in e.get("Config", "")), None)
            if entry is None:
                raise DockyardError(f"the `docker save` archive lacks the config of {img['ref']}. "
                                    "Nothing was written.")
            got = [self.diff_id(p) for p in entry.get("Layers", [])]
            if got != img["diff_ids"]:
                raise DockyardError(f"the `docker save` archive does not match {img['ref']}: its layer "
                                    "files do not hash to the image's diff ids. Nothing was written.")
            img["tags"] = entry.get("RepoTags") or []


NAMING = ("manifest.json", "index.json", "repositories")  # where docker load reads the names it gives images
HEADER_ONLY = (b"1", b"2", b"5")  # links and folders: no content in Go's reader, whatever their size field says
MEMBER_KINDS = (b"0", *HEADER_ONLY)


class TarGate:
    """A `docker save` tar on its way into `docker load`, read member by member as docker's reader (Go's
    archive/tar) reads it: the bytes pass through to `write`, except the end-of-archive marker and what follows.

    Those are held back (`tail`) until the caller has checked the whole stream (its sha256, the names it gives
    images): `docker load` cannot finish a tar it has not seen the end of, so a stream that fails a check is cut
    there and nothing is loaded. The files docker load takes image names from are kept (`naming`). Anything
    docker save does not write, and where two readers could disagree about where a member ends or what it is
    called (devices, sparse files, global or repeated PAX headers, bad checksums, a path through a link), is
    refused.
    """

    def __init__(self, write: Callable[[bytes], object], limit: int, tail_cap: int = 1 << 20):
        self.write = write
        self.limit = limit          # the most bytes the stream may hold (what the free-space check counted)
        self.tail_cap = tail_cap
        self.bytes = 0
        self.naming: list[tuple[str, bytes]] = []   # (name, content) of each naming file, in tar order
        self.links: set[str] = set()
        self.tail = b""

    def _read(self, src, n: int) -> bytes:
        data = src.read(n)
        if len(data) < n:
            raise Truncated("the tar ends in the middle of a file")
        self.bytes += n
        if self.bytes > self.limit:
            raise TooLong(self.limit)
        return data

    def run(self, src) -> None:
        pax: dict[str, str] | None = None
        long: dict[str, str] = {}
        while True:
            header = self._read(src, BLOCK)
            if not any(header):
                self.tail = header + src.read(self.tail_cap + 1)
                if len(self.tail) > self.tail_cap:
                    raise DockyardError("the tar holds more than 1 MiB after its end")
                self.bytes += len(self.tail) - BLOCK
                if self.bytes > self.limit:
                    raise TooLong(self.limit)
                return
            _checksum(header)
            kind, size = header[156:157], _number(header[124:136])
            if kind in (b"x", b"L", b"K"):
                if kind == b"x" and pax is not None:
                    raise DockyardError("the tar gives one member two PAX headers")
                if size > EXTENDED_CAP:  # read whole into memory: held to what docker's reader takes, before it
                    raise DockyardError(f"the tar holds an extended header of {size} bytes, more than docker's reader "
                                        f"takes ({EXTENDED_CAP >> 20} MiB), which docker save never writes")
                raw = self._read(src, _padded(size))
                data = raw[:size]
                self.write(header)
                self.write(raw)
                if kind == b"x":
                    pax = _pax(data)
                    if any(k.startswith("GNU.sparse") for k in pax):
                        raise DockyardError("the tar holds a sparse file, which docker save never writes")
                else:
                    long["path" if kind == b"L" else "linkpath"] = _cstr(data)
                continue
            if kind not in MEMBER_KINDS:
                raise DockyardError(f"the tar holds a member of type {kind!r}, which docker save never writes")
            pax = pax or {}
            name = long.get("path") or pax.get("path") or _go_name(header)
            link = long.get("linkpath") or pax.get("linkpath") or _cstr(header[157:257])
            size = 0 if kind in HEADER_ONLY else int(pax.get("size", size))
            self._member(src, header, name, kind, size, link)
            pax, long = None, {}

    def _member(self, src, header: bytes, name: str, kind: bytes, size: int, link: str) -> None:
        path = posixpath.normpath("/" + name).lstrip("/")
        if any(path.startswith(p + "/") for p in self.links):
            raise DockyardError(f"the tar writes {cut(name)} through a link it made")
        if kind == b"2":
            self.links.add(path)
        naming = path in NAMING
        if naming and kind != b"0":
            raise DockyardError(f"the tar's {cut(path)} is a link or a folder, not a file")
        self.write(header)
        n, kept, left = _padded(size), bytearray(), size
        layer = LayerHeaders(path) if kind == b"0" and (path.endswith("/layer.tar") or path.startswith(BLOBS)) else None
        first = True
        while n:
            chunk = self._read(src, min(n, CHUNK))
            n -= len(chunk)
            if first and (packed := compressed(chunk[:size])):
                raise DockyardError(f"the tar's {cut(path)} is {packed}-compressed: docker load would inflate it past "
                                    "every size the manifest declares, and docker save never writes one")
            first = False
            if layer and left > 0:
                layer.feed(chunk if left >= len(chunk) else chunk[:left])
                left -= len(chunk)
            if naming and len(kept) < size:
                kept += chunk
                if len(kept) > NAMING_CAP:
                    raise DockyardError(f"the tar's {cut(path)} is larger than any docker save writes")
            self.write(chunk)
        if naming:
            self.naming.append((path, bytes(kept[:size])))


NAMING_CAP = 16 << 20
BLOBS = "blobs/sha256/"
EXTENDED_CAP = 1 << 20  # the most Go's reader takes in a PAX or GNU long-name header (it refuses more)
INNER_HEADER_ONLY = (b"1", b"2", b"3", b"4", b"5", b"6")  # Go's isHeaderOnlyType: no content, whatever the size says


class LayerHeaders:
    """A layer file's own tar, its headers read as its bytes pass (docker load extracts it with Go's reader).

    A tar's files hold no more bytes than the tar itself, so the space a load takes is bounded by the archive's
    declared size, except for a sparse file: its holes take no bytes in the tar and Go's reader writes them out
    as zeros, in full (a 649-byte archive wrote 1 GiB). Any sparse file (old GNU `S` headers, or GNU.sparse PAX
    records) is refused. A file whose first block is no tar header (a blob that is a config, not a layer) is no
    layer docker extracts: the watch stops there, and at the tar's end. Past a first good header it fails closed:
    a header or PAX record this reader cannot read, where Go's reader might (`size=`, `size=+3`: a record it skips,
    after which a sparse file went unseen), is refused, as is anything docker save never writes there.
    """

    def __init__(self, path: str):
        self.path = path
        self.skip = 0              # content (and padding) to pass over
        self.want = BLOCK          # the bytes of the next unit: a header, or an extended header's records
        self.buf = bytearray()
        self.extended = b""        # the kind of extended header whose records are being read, if any
        self.pad = 0
        self.size_next: int | None = None  # a PAX header's size for the member that follows it
        self.sparse: str | None = None     # a PAX header said the member that follows it is sparse (its name)
        self.pax = False                   # a PAX header was read for the member that follows it
        self.started = False               # a header has read as a tar's: from here, what cannot be read is refused
        self.off = False

    def feed(self, data: bytes) -> None:
        view, i = memoryview(data), 0
        while i < len(data) and not self.off:
            if self.skip:
                step = min(self.skip, len(data) - i)
                i, self.skip = i + step, self.skip - step
                continue
            take = min(self.want - len(self.buf), len(data) - i)
            self.buf += view[i:i + take]
            i += take
            if len(self.buf) == self.want:
                unit, self.buf = bytes(self.buf), bytearray()
                self._records(unit) if self.extended else self._header(unit)

    def _header(self, header: bytes) -> None:
        if not any(header):  # the tar's end: Go's reader extracts nothing after it
            self.off = True
            return
        try:
            _checksum(header)
            kind, size = header[156:157], _number(header[124:136])
        except DockyardError as e:
            if self.started:
                raise self._refused(f"a header docker's reader could read otherwise ({e})") from None
            self.off = True  # no tar: nothing docker would extract
            return
        self.started = True
        if kind == b"S" or self.sparse is not None:
            self._sparse(self.sparse or _cstr(header[0:100]))
        if kind in (b"x", b"g", b"L", b"K"):
            if size > EXTENDED_CAP:
                raise self._refused(f"an extended header of {size} bytes, more than docker's reader takes")
            if kind == b"x" and self.pax:
                raise self._refused("two PAX headers for one file")
            if kind in (b"x", b"g"):
                self.extended, self.want, self.pad = kind, size, _padded(size) - size
                if not size:
                    self._records(b"")
            else:
                self.skip = _padded(size)
            return
        if kind not in INNER_HEADER_ONLY:
            self.skip = _padded(size if self.size_next is None else self.size_next)
        self.size_next, self.pax = None, False

    def _records(self, data: bytes) -> None:
        try:
            records = _pax(data)
        except DockyardError as e:
            raise self._refused(f"a PAX header docker's reader could read otherwise ({e})") from None
        if any(k.startswith("GNU.sparse") for k in records):  # refused at the header it is for, which names it
            self.sparse = records.get("GNU.sparse.name") or records.get("path") or ""
        if self.extended == b"x":
            self.pax = True
            if "size" in records:
                self.size_next = int(records["size"])
        self.extended, self.want, self.skip = b"", BLOCK, self.pad

    def _refused(self, what: str) -> DockyardError:
        return DockyardError(f"the tar's {cut(self.path)} holds {what}, which docker save never writes")

    def _sparse(self, name: str) -> None:
        raise DockyardError(f"the tar's {cut(self.path)} holds a sparse file ({cut(name)!r}): docker load would write "
                            "its holes out in full, past every size the manifest declares")
# What docker load decompresses by itself wherever a layer begins so (moby's archive.DetectCompression): a layer
# file docker save writes is a plain tar (its sha256 is the layer's diff id), never one of these
MAGIC = ((b"\x1f\x8b\x08", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))


def compressed(start: bytes) -> str:
    """The compression a file's first bytes say, as docker's reader detects it ("" for none)."""
    for magic, name in MAGIC:
        if start.startswith(magic):
            return name
    if len(start) >= 4 and int.from_bytes(start[:4], "little") & 0xFFFFFFF0 == 0x184D2A50:
        return "zstd"  # a skippable frame, which docker takes for zstd
    return ""


class Truncated(DockyardError):
    pass


class TooLong(DockyardError):
    def __init__(self, limit: int):
        super().__init__(f"more than {limit} bytes of tar")
        self.limit = limit


def _go_name(header: bytes) -> str:
    """A member's name from its header alone, as Go's reader joins it: a prefix only in USTAR and PAX headers
    (GNU headers keep times there), 131 bytes of it in star headers."""
    name = _cstr(header[0:100])
    if header[257:263] == b"ustar\0":
        prefix = header[345:476] if header[508:512] == b"tar\0" else header[345:500]
        if _cstr(prefix):
            name = _cstr(prefix) + "/" + name
    return name


def _checksum(header: bytes) -> None:
    """Go's reader refuses a header whose checksum (unsigned or signed sum) is wrong: so does this one."""
    field = header[148:156]
    want = _number(field)
    blank = header[:148] + b" " * 8 + header[156:]
    unsigned = sum(blank)
    if want != unsigned and want != unsigned - 256 * (len(blank) - len(blank.translate(None, HIGH))):
        raise DockyardError("a tar header's checksum is wrong: the stream is damaged")


HIGH = bytes(range(128, 256))


def _padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def _cstr(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "replace")


def _number(field: bytes) -> int:
    """A size as Go's archive/tar (docker's reader) reads it; anything it would not read is refused, so that
    this reader and docker's never disagree about where a member ends."""
    if field[0] & 0x80:  # base-256, how GNU tar writes sizes of 8 GiB and more
        if field[0] == 0xFF:
            raise DockyardError("a tar header holds a negative size")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.strip(b" \0")
    if text and not re.fullmatch(rb"[0-7]+", text):
        raise DockyardError(f"a tar header holds a size that is not a number ({text[:20]!r})")
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    """PAX records (`<length> <key>=<value>\\n`); a malformed one is refused, as docker's reader refuses it."""
    out, i = {}, 0
    while i < len(data):
        space = data.find(b" ", i)
        length = data[i:space]
        if space < 0 or not re.fullmatch(rb"[0-9]{1,12}", length) or not space - i + 2 < int(length) <= len(data) - i:
            raise DockyardError("a tar PAX header is malformed")
        record = data[space + 1: i + int(length)]
        key, eq, value = record[:-1].partition(b"=")
        if record[-1:] != b"\n" or not eq:
            raise DockyardError("a tar PAX header is malformed")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        i += int(length)
    if "size" in out and not re.fullmatch(r"[0-9]{1,19}", out["size"]):
        raise DockyardError(f"a tar PAX header holds a size that is not a number ({out['size'][:20]!r})")
    return out
