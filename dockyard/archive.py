"""Image archives: save, load, verify, thin archives, inventories, signatures, and load.sh.

An archive is a plain `docker save` tar, compressed, with three files beside it: `<name>.sha256`
(sha256sum -c format, covering the archive AND the manifest), `<name>.manifest.json` (what is inside),
and `load.sh` (the same verify-then-load for nodes without the project).

`docker save` output passes through a small tar reader on its way to the compressor. It records every
layer file's size and sha256, so each archive is checked against the images' diff ids before it is
kept (the engine can leave blobs out silently, moby#49473), and it drops the layer files a thin
archive leaves out. Classic engines name layer files by a legacy id that says nothing about the
layer, so for thin archives each layer is spooled while it is hashed, then kept or dropped.
Compressed archives are a sequence of frames, one per large layer, reused from a cache by the next save
that holds the same layer (dockyard/frames.py).
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import posixpath
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from dockyard import engine
from dockyard.frames import FramedSink, LayerCache, StaleNames
from dockyard.errors import DockyardError

FORMAT = "dockyard-archive/1"
INVENTORY_FORMAT = "dockyard-inventory/1"
SIGN_NAMESPACE = "dockyard-archive"
SUFFIXES = {"zstd": ".tar.zst", "gzip": ".tar.gz", "none": ".tar"}
# zstd 2: on 2 cores smaller than `gzip -6` and close to the speed of `docker save` itself
# (benchmarks/results/transport.md); 3 is about 7 % smaller and 15 % slower.
DEFAULT_LEVEL = {"zstd": 2, "gzip": 6, "none": 0}
LEVELS = {"zstd": range(1, 23), "gzip": range(1, 10), "none": range(0, 1)}
# Compressed size as a share of the tar, for the free-space check: zstd/gzip reach 35-40 % on
# images of wheels and shared libraries; 60 % leaves room for images that compress badly.
COMPRESSED_SHARE = {"zstd": 0.6, "gzip": 0.6, "none": 1.0}
MARGIN = 64 << 20
CHUNK = 1 << 20
BLOCK = 512
SPOOL_IN_MEMORY = 256 << 20
LOADER_TEMPLATE = Path(__file__).parent / "templates" / "load.sh"


# --- names and small helpers --------------------------------------------------------------------

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
        raise DockyardError(f"{self.archive} is not an image archive: expected a name ending in "
                            + ", ".join(SUFFIXES.values()))

    @property
    def method(self) -> str:
        return next(m for m, s in SUFFIXES.items() if self.archive.name.endswith(s))

    def _beside(self, suffix: str) -> Path:
        return self.archive.with_name(self.base + suffix)

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


def archive_name(refs: list[str], method: str, thin: bool) -> str:
    """A file name that says what is inside: `dockyard_0.1.0-cpu.tar.zst`, `..-thin.tar.zst`."""
    stem = "+".join(r.replace("/", "_").replace(":", "_").replace("@", "_") for r in refs)
    if len(stem) > 120:
        stem = stem[:100] + "+" + hashlib.sha256(stem.encode()).hexdigest()[:12]
    return stem + ("-thin" if thin else "") + SUFFIXES[method]


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The engine's layer keys: chain(0) = diff(0); chain(i) = sha256(chain(i-1) + " " + diff(i))."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def human(n: float) -> str:
    """Bytes in decimal units, as `df -H` and transfer tools show them."""
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"


def check_free(folder: Path, need: int, what: str, hint: str) -> None:
    """Refuse before writing when `folder` (or its nearest existing parent) lacks `need` bytes."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise DockyardError(f"not enough space in {folder}: {human(free)} free, {what} needs about "
                            f"{human(need)}. {hint}")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def progress():
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                               TransferSpeedColumn)

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeElapsedColumn(), console=console, transient=True,
                    disable=not console.is_terminal)


def echo_pipeline(*argvs: list[str]) -> None:
    print("+ " + " | ".join(engine.quote(a) for a in argvs), file=sys.stderr, flush=True)


def sha256_file(path: Path, label: str = "") -> str:
    h = hashlib.sha256()
    with progress() as bar, open(path, "rb") as f:
        task = bar.add_task(label or f"sha256 {path.name}", total=path.stat().st_size)
        while chunk := f.read(CHUNK):
            h.update(chunk)
            bar.advance(task, len(chunk))
    return h.hexdigest()


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


# --- images and inventories ----------------------------------------------------------------------

def default_image(settings) -> str:
    """The image of the `auto` variant, saying how it was chosen."""
    from dockyard import variants

    variant, why = variants.resolve(settings, "auto")
    print(why, file=sys.stderr)
    return variants.tag(settings, variant)


def inspect_images(settings, refs: list[str]) -> list[dict]:
    """What the manifest records of each image; refuses names the engine does not hold."""
    out = []
    for ref in refs:
        meta = engine.image_inspect(settings, ref)
        if meta is None:
            raise DockyardError(f"no image {ref} in the engine: build it (`invoke build`) or name "
                                "another with --image (see `docker image ls`)")
        diff_ids = meta["RootFS"].get("Layers") or []
        out.append({"ref": ref, "id": meta["Id"], "tags": meta.get("RepoTags") or [],
                    "bytes": meta.get("Size", 0), "labels": (meta.get("Config") or {}).get("Labels") or {},
                    "diff_ids": diff_ids, "chain_ids": chain_ids(diff_ids)})
    return out


def engine_store(info: dict) -> str:
    """"containerd" for the containerd image store (default on new Docker 29 installs), else "classic"."""
    for pair in info.get("DriverStatus") or []:
        if len(pair) == 2 and pair[0] == "driver-type" and "containerd.snapshotter" in pair[1]:
            return "containerd"
    return "classic"


def inventory_from(info: dict, inspected: list[dict], host: str) -> dict:
    """A node's inventory from `docker info` and `docker image inspect` of all its images."""
    images, held = [], set()
    for meta in inspected:
        diff_ids = (meta.get("RootFS") or {}).get("Layers") or []
        chains = chain_ids(diff_ids)
        held.update(chains)
        images.append({"id": meta["Id"], "tags": meta.get("RepoTags") or [], "diff_ids": diff_ids,
                       "chain_ids": chains})
    return {"format": INVENTORY_FORMAT, "host": host, "created": _now(),
            "engine": {"version": info.get("ServerVersion", ""), "store": engine_store(info),
                       "root": info.get("DockerRootDir", "")},
            "images": images, "chain_ids": sorted(held)}


def layer_inventory(settings) -> dict:
    """This node's inventory: every image, its diff ids and chain ids."""
    info = engine.engine_info(settings)
    ids = engine.run(engine.docker(settings, "image", "ls", "-aq", "--no-trunc"),
                     capture=True, quiet=True).stdout.split()
    ids = sorted(set(ids))
    inspected = json.loads(engine.run(engine.docker(settings, "image", "inspect", *ids), capture=True,
                                      quiet=True).stdout) if ids else []
    return inventory_from(info, inspected, socket.gethostname())


def write_inventory(settings, out: str = "") -> Path:
    inv = layer_inventory(settings)
    path = Path(out) if out else settings.path(settings.dist_dir) / f"inventory-{inv['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(inv, indent=2) + "\n")
    print(f"wrote {path}: {len(inv['images'])} images, {len(inv['chain_ids'])} layers, "
          f"{inv['engine']['store']} image store")
    return path


def read_inventory(path: Path) -> dict:
    try:
        inv = json.loads(path.read_text())
    except FileNotFoundError:
        raise DockyardError(f"no inventory {path}: make one on the target with `invoke inventory "
                            "--out=FILE` (or `sh load.sh --inventory > FILE`) and copy it here") from None
    except json.JSONDecodeError as e:
        raise DockyardError(f"{path} is not an inventory (invalid JSON: {e})") from None
    if inv.get("format") != INVENTORY_FORMAT or "chain_ids" not in inv:
        raise DockyardError(f"{path} is not a dockyard inventory (format {INVENTORY_FORMAT})")
    return inv


def thin_plan(images: list[dict], target: dict) -> tuple[set[str], list[str]]:
    """Which layer files to leave out (diff ids) and which chain ids the target must hold for that.

    A layer file is left out only when every place it appears in is already held by the target:
    `docker load` opens a layer file only for a chain id the engine lacks.
    """
    held = set(target["chain_ids"])
    needed: set[str] = set()
    covered: list[tuple[str, str]] = []
    for img in images:
        for diff, chain in zip(img["diff_ids"], img["chain_ids"]):
            (covered.append((diff, chain)) if chain in held else needed.add(diff))
    omit = {d for d, _ in covered} - needed
    return omit, sorted({c for d, c in covered if d in omit})


# --- the tar stream ------------------------------------------------------------------------------

def _padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def _cstr(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "replace")


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # base-256, how GNU tar writes sizes of 8 GiB and more
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = _cstr(field).strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    out, i = {}, 0
    while i < len(data):
        space = data.index(b" ", i)
        length = int(data[i:space])
        key, _, value = data[space + 1: i + length - 1].partition(b"=")
        out[key.decode()] = value.decode("utf-8", "replace")
        i += length
    return out


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
                self.docker_manifest = json.loads(data[:size])
                write(head)
                write(data)
            else:
                write(head)
                self._copy(src, padded, write)
            return
        if blob and "sha256:" + name.rsplit("/", 1)[1] in self.omit:
            self._copy(src, padded, None)   # the name is the digest: no need to look inside
            self.layers[name] = ("sha256:" + name.rsplit("/", 1)[1], size)
            self.omitted.add(name)
            return
        h = hashlib.sha256()
        hint = "sha256:" + name.rsplit("/", 1)[1] if blob else self.known.get(name, "")
        if hint in self.omit:  # known from an earlier save: no need to spool it, only to check it
            self._copy(src, padded, None, h, size)
            self.layers[name] = ("sha256:" + h.hexdigest(), size)
            if self.layers[name][0] != hint:
                raise StaleNames(f"the layer cache's name map said {name} holds {hint}, but it holds "
                                 f"{self.layers[name][0]}; the map is now cleared: save again")
            self.omitted.add(name)
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
                self.omitted.add(name)
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


# --- save ----------------------------------------------------------------------------------------

@dataclass
class Streamed:
    pump: TarPump
    out_bytes: int
    out_sha256: str
    seconds: float


def widen(*pipes) -> None:
    """Pipes of 1 MiB instead of 64 KiB: fewer wake-ups between the stages of a pipeline."""
    for pipe in pipes:
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, CHUNK)
        except (OSError, AttributeError):  # above /proc/sys/fs/pipe-max-size, or not a pipe
            pass


def fail_tail(f) -> str:
    f.seek(0)
    lines = f.read().decode(errors="replace").strip().splitlines()[-10:]
    return "\n".join(f"  | {l}" for l in lines)


def layer_cache(settings, method: str, level: int) -> LayerCache | None:
    """The cache of compressed layer frames (dockyard/frames.py), or None when it is off."""
    if method == "none" or settings.layer_cache_gb <= 0:
        return None
    return LayerCache(settings.path(settings.layer_cache), method, level, int(settings.layer_cache_gb * (1 << 30)))


def pump_framed(pump: TarPump, src, compressor: list[str], emit: Callable[[bytes], None],
                cache: LayerCache | None) -> None:
    """The tar from src through the pump into frames (dockyard/frames.py), the frames into emit."""
    framed = pump.frames = FramedSink(compressor, emit, cache, widen)
    pump.known = cache.known() if cache else {}
    try:
        pump.run(src, framed.write)
        framed.close()
    except BaseException as e:
        framed.abort()
        if isinstance(e, StaleNames):
            cache.forget()
        raise
    if cache is not None:
        cache.learn({n: d for n, (d, _) in pump.layers.items() if n.endswith("/layer.tar")})


def stream_save(settings, images: list[dict], sink: Callable[[bytes], object], *, method: str, level: int,
                omit: Iterable[str] = (), spool_dir: Path | None = None, label: str = "save",
                cache: LayerCache | None = None) -> Streamed:
    """docker save → tar reader (hash, thin) → compressor, one frame per large layer, or the frame the
    cache holds for it → sink, hashing what reaches the sink."""
    save_argv = engine.docker(settings, "save", *[i["ref"] for i in images])
    comp_argv = compressor_argv(method, level)
    echo_pipeline(save_argv, *([comp_argv] if comp_argv else []))
    out_hash, out_bytes = hashlib.sha256(), 0

    def emit(chunk: bytes) -> None:
        nonlocal out_bytes
        out_hash.update(chunk)
        out_bytes += len(chunk)
        sink(chunk)

    started = time.monotonic()
    with progress() as bar, tempfile.TemporaryFile() as save_err:
        task = bar.add_task(label, total=sum(i["bytes"] for i in images) or None)
        pump = TarPump(omit, spool_dir, on_read=lambda n: bar.advance(task, n))
        save = subprocess.Popen(save_argv, stdout=subprocess.PIPE, stderr=save_err)
        widen(save.stdout)
        try:
            if comp_argv is None:
                pump.run(save.stdout, emit)
            else:
                pump_framed(pump, save.stdout, comp_argv, emit, cache)
        except BaseException:
            if save.poll() is None:
                save.kill()
            raise
        finally:
            save.stdout.close()
            rc_save = save.wait()
        if rc_save != 0:
            raise DockyardError(f"docker save failed (exit {rc_save}): {engine.quote(save_argv)}\n"
                                + fail_tail(save_err))
    pump.check(images)
    if cache is not None:
        cache.prune()
    return Streamed(pump, out_bytes, out_hash.hexdigest(), time.monotonic() - started)


def _thin_target(settings, thin_for: str) -> dict:
    if thin_for.startswith("ssh://"):
        from dockyard import ship

        return ship.remote_inventory(settings, ship.parse_ssh_url(thin_for))
    return read_inventory(Path(thin_for))


def plan_thin(settings, images: list[dict], thin_for: str) -> tuple[set[str], dict | None]:
    """(layer files to leave out, the manifest's `thin` record) for --thin-for, saying what it does."""
    if not thin_for:
        return set(), None
    target = _thin_target(settings, thin_for)
    here = engine_store(engine.engine_info(settings))
    store = target["engine"]["store"]
    if "containerd" in (here, store):
        where = "this host" if here == "containerd" else f"the target ({thin_for})"
        print(f"{where} uses the containerd image store, where `docker load` needs every layer in the "
              "archive: writing a full archive", file=sys.stderr)
        return set(), None
    omit, requires = thin_plan(images, target)
    return omit, {"for": thin_for, "target_host": target.get("host", ""), "omitted": sorted(omit),
                  "requires": requires}


def save(settings, image: str = "", out: str = "", compress: str = "zstd", level: int = 0,
         thin_for: str = "", sign: str = "") -> dict:
    """Write an archive and its companions; returns the manifest."""
    level = check_method(compress, level)
    refs = [r.strip() for r in image.split(",") if r.strip()] or [default_image(settings)]
    images = inspect_images(settings, refs)
    tool = (compressor_argv(compress, level) or [""])[0]
    if tool and not engine.which(tool):
        raise DockyardError(f"{tool} is not installed: install it (apt-get install {compress}) or pass "
                            "--compress=gzip / none")
    key = Path(sign).expanduser() if sign else None
    if key and not key.exists():
        raise DockyardError(f"--sign={sign}: no such key file (an ssh private key, or a public key "
                            "whose private half is in your ssh-agent)")
    omit, thin = plan_thin(settings, images, thin_for)
    out_dir = Path(out).expanduser().resolve() if out else settings.path(settings.dist_dir)
    paths = ArchivePaths(out_dir / archive_name(refs, compress, thin is not None))
    # Thin archives need about as much: they spool each layer while hashing it.
    tar_estimate = sum(i["bytes"] for i in images)
    check_free(out_dir, int(tar_estimate * COMPRESSED_SHARE[compress]) + MARGIN, "the archive",
               "Free some space or pass --out=DIR on a larger disk.")
    out_dir.mkdir(parents=True, exist_ok=True)
    partials = [p.with_name(p.name + ".partial") for p in (paths.archive, paths.manifest, paths.sha256)]
    signature = partials[1].with_name(partials[1].name + ".sig")  # where ssh-keygen puts it
    try:
        with open(partials[0], "wb") as f:
            cache = layer_cache(settings, compress, level)
            got = stream_save(settings, images, f.write, method=compress, level=level, omit=omit,
                              spool_dir=out_dir, label=f"save {paths.archive.name}", cache=cache)
        manifest = _manifest(paths, images, got, compress, level, thin)
        partials[1].write_text(json.dumps(manifest, indent=2) + "\n")
        if sign:
            sign_file(partials[1], key)
        partials[2].write_text(f"{got.out_sha256}  {paths.archive.name}\n"
                               f"{hashlib.sha256(partials[1].read_bytes()).hexdigest()}  {paths.manifest.name}\n")
        # The .sha256 comes last: a set with one is complete.
        os.replace(partials[0], paths.archive)
        os.replace(partials[1], paths.manifest)
        if sign:
            os.replace(signature, paths.signature)
        else:
            paths.signature.unlink(missing_ok=True)
        os.replace(partials[2], paths.sha256)
    finally:
        for p in (*partials, signature):
            p.unlink(missing_ok=True)
    write_loader(out_dir)
    tar = manifest["tar_bytes"]
    if cache is not None and cache.hits:
        print(f"layer cache: {cache.hits} of {cache.hits + cache.misses} large layers copied from earlier saves "
              f"({human(cache.bytes_copied)}, {cache.dir})")
    print(f"wrote {paths.archive}: {human(got.out_bytes)} from {human(tar)} of tar in {got.seconds:.1f} s "
          f"({human(got.pump.bytes_read / max(got.seconds, 1e-9))}/s)")
    if thin is not None:
        left = sum(l["bytes"] for l in manifest["layers"] if not l["included"])
        print(f"thin for {thin_for}: left out {len(thin['omitted'])} layers ({human(left)}) the target "
              f"holds; it must still hold them when loading ({len(thin['requires'])} chain ids in the manifest)")
    print(f"load it: invoke load --file={paths.archive}  (or, without the project: sh load.sh "
          f"{paths.archive.name})")
    return manifest


def _manifest(paths: ArchivePaths, images: list[dict], got: Streamed, method: str, level: int,
              thin: dict | None) -> dict:
    layers, seen = [], set()
    included = {got.pump.layers[n][0] for n in got.pump.layers if n not in got.pump.omitted}
    sizes = {d: b for d, b in got.pump.layers.values()}
    for img in images:
        for d in img["diff_ids"]:
            if d not in seen:
                seen.add(d)
                layers.append({"diff_id": d, "bytes": sizes.get(d, 0), "included": d in included})
    return {
        "format": FORMAT,
        "archive": paths.archive.name,
        "archive_sha256": got.out_sha256,
        "archive_bytes": got.out_bytes,
        "tar_bytes": got.pump.bytes_read,
        "compression": {"method": method, "level": level},
        "created": _now(),
        "images": [{k: i[k] for k in ("ref", "tags", "id", "labels", "diff_ids", "chain_ids")} for i in images],
        "layers": layers,
        "thin": thin,
        # What load.sh reads with sed: flat strings, one per line (the .sha256 pins this layout).
        "load_sh": {
            "check_images": " ".join(f"{ref}={i['id']}" for i in images for ref in i["tags"] or [i["id"]]),
            "check_layers": " ".join(f"{ref}={','.join(i['diff_ids'])}" for i in images for ref in i["tags"] or [i["id"]]),
            "require_chains": " ".join((thin or {}).get("requires") or []),
            "need_kb": str(2 * got.pump.bytes_read // 1024),  # docker load unpacks, then applies
        },
    }


# --- signatures ----------------------------------------------------------------------------------

def sign_file(path: Path, key: Path) -> None:
    """`ssh-keygen -Y sign`: writes <path>.sig. Signing the manifest covers the archive's sha256 in it."""
    engine.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(key), "-n", SIGN_NAMESPACE, str(path)],
               what="signing the manifest")


def verify_signature(allowed: Path, paths: ArchivePaths) -> str:
    """The principal that signed the manifest; refuses unsigned or wrongly signed archives."""
    if not allowed.exists():
        raise DockyardError(f"allowed_signers is set to {allowed}, which does not exist: fix the setting")
    if not paths.signature.exists():
        raise DockyardError(f"{paths.archive.name} is not signed ({paths.signature.name} is missing) and "
                            f"allowed_signers is set ({allowed}): refused, nothing was loaded")
    found = engine.run(["ssh-keygen", "-Y", "find-principals", "-s", str(paths.signature), "-f", str(allowed)],
                       capture=True, check=False, quiet=True)
    principal = found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else ""
    if not principal:
        raise DockyardError(f"{paths.archive.name} was signed by a key that is not in {allowed}: "
                            "refused, nothing was loaded")
    ok = engine.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", SIGN_NAMESPACE,
                     "-s", str(paths.signature)], input=paths.manifest.read_bytes(), capture=True,
                    check=False, quiet=True)
    if ok.returncode != 0:
        raise DockyardError(f"the signature of {paths.manifest.name} does not verify (the manifest was "
                            "changed after signing): refused, nothing was loaded")
    return principal


# --- verify and load -----------------------------------------------------------------------------

def read_sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name:
            sums[name.lstrip("*")] = digest
    return sums


def verify(settings, paths: ArchivePaths) -> dict:
    """Checks signature (when configured), manifest and archive sha256s; returns the manifest.

    Touches no engine: a damaged archive is refused before anything is loaded.
    """
    for p in (paths.archive, paths.sha256, paths.manifest):
        if not p.exists():
            raise DockyardError(f"{p} is missing: an archive travels with its .sha256 and .manifest.json "
                                "(copy all three, or use `invoke ship`)")
    if settings.allowed_signers:
        principal = verify_signature(settings.path(settings.allowed_signers), paths)
        print(f"signature good: signed by {principal}", file=sys.stderr)
    sums = read_sums(paths.sha256)
    raw = paths.manifest.read_bytes()
    if sums.get(paths.manifest.name) != hashlib.sha256(raw).hexdigest():
        raise DockyardError(f"{paths.manifest.name} does not match {paths.sha256.name}: the manifest was "
                            "changed or damaged. Refused, nothing was loaded.")
    manifest = json.loads(raw)
    expected = sums.get(paths.archive.name)
    if expected is None or manifest.get("archive_sha256") != expected:
        raise DockyardError(f"{paths.sha256.name} and {paths.manifest.name} disagree about "
                            f"{paths.archive.name}: refused, nothing was loaded")
    size, want = paths.archive.stat().st_size, manifest.get("archive_bytes")
    if size != want:
        raise DockyardError(f"{paths.archive.name} is {size} bytes, the manifest says {want}: the copy is "
                            f"{'truncated' if size < want else 'damaged'}. Copy it again (`invoke ship` "
                            "resumes); nothing was loaded.")
    if sha256_file(paths.archive, f"verify {paths.archive.name}") != expected:
        raise DockyardError(f"{paths.archive.name} does not match its sha256: the archive is damaged or was "
                            "changed. Copy it again; nothing was loaded.")
    return manifest


def loaded_as_saved(meta: dict | None, img: dict, store: str) -> str:
    """"" when the engine holds the image the archive carries, else what is wrong with it.

    The classic store names an image by its config digest, which the archive knows. The containerd
    store names it by a manifest it writes while importing, so there the layers are compared.
    """
    if meta is None:
        return "is missing"
    if store == "containerd":
        return "" if meta["RootFS"].get("Layers") == img["diff_ids"] else "has other layers than the archive's"
    return "" if meta["Id"] == img["id"] else f"is {meta['Id']}, the archive holds {img['id']}"


def load(settings, file: str) -> list[tuple[str, str]]:
    """Verify, then load an archive; returns (ref, id) of every image it holds, checked in the engine."""
    paths = ArchivePaths(Path(file).expanduser().resolve())
    manifest = verify(settings, paths)
    info = engine.engine_info(settings)
    requires = (manifest.get("thin") or {}).get("requires") or []
    if requires:
        if engine_store(info) == "containerd":
            raise DockyardError("this engine uses the containerd image store, which cannot load a thin "
                                "archive: load the full archive (invoke save without --thin-for)")
        missing = set(requires) - set(layer_inventory(settings)["chain_ids"])
        if missing:
            raise DockyardError(f"this thin archive needs {len(missing)} of {len(requires)} base layers this "
                                "engine does not hold: load the full archive instead (invoke save without "
                                "--thin-for). Nothing was loaded.")
    root = Path(info.get("DockerRootDir", ""))
    if root.is_absolute() and root.exists():
        # docker load unpacks the whole tar under <root>/tmp, then into the layer store.
        check_free(root, 2 * manifest["tar_bytes"], "docker load",
                   "Free space on the engine's disk (docker image prune) and load again.")
    dec = decompressor_argv(paths.method)
    if dec and not engine.which(dec[0]):
        raise DockyardError(f"{dec[0]} is not installed: install it (apt-get install {dec[0]}) to load {paths.archive.name}")
    load_argv = engine.docker(settings, "load", *([] if dec else ["-i", str(paths.archive)]))
    if dec:
        echo_pipeline([*dec, str(paths.archive)], load_argv)
        with subprocess.Popen([*dec, str(paths.archive)], stdout=subprocess.PIPE) as unpack:
            done = subprocess.run(load_argv, stdin=unpack.stdout, capture_output=True, text=True)
    else:
        engine.echo(load_argv)
        done = subprocess.run(load_argv, capture_output=True, text=True)
    output = (done.stdout + done.stderr).strip()
    problems = [] if done.returncode == 0 else [f"docker load exited {done.returncode}"]
    loaded, store = [], engine_store(info)
    for img in manifest["images"]:
        for ref in img["tags"] or [img["id"]]:
            meta = engine.image_inspect(settings, ref)
            wrong = loaded_as_saved(meta, img, store)
            if wrong:
                problems.append(f"{ref} {wrong}")
            else:
                loaded.append((ref, meta["Id"]))
    if problems:
        raise DockyardError(f"loading {paths.archive.name} failed: " + "; ".join(problems) + "\n"
                            + "\n".join(f"  | {l}" for l in output.splitlines()[-10:]))
    for ref, image_id in loaded:
        print(f"loaded {ref} {image_id}")
    return loaded


# --- load.sh -------------------------------------------------------------------------------------

def write_loader(folder: Path) -> Path:
    """Puts load.sh beside the archives. It is the same for every archive: it reads the manifest."""
    loader, partial = folder / "load.sh", folder / "load.sh.partial"
    shutil.copyfile(LOADER_TEMPLATE, partial)
    partial.chmod(0o755)
    os.replace(partial, loader)
    return loader
