"""`invoke save`: images to an archive set (layout.py), checked layer by layer on the way.

docker save → the tar reader (tarstream.py: hashes every layer, leaves out what a thin archive omits)
→ a compressor, one frame per large layer, or the frame the layer cache holds for it (frames.py)
→ the archive, hashed as it is written. The manifest records what is inside; `--thin-for` leaves out
the layers a target already holds (inventory.py), `--sign` signs the manifest (verify.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dockyard import console, engine
from dockyard.common import locks, runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.locks import held_alone, partial, private_folder
from dockyard.launch import caches, runscript
from dockyard.settings import Settings
from dockyard.transport import inventory, remote
from dockyard.transport.frames import FramedSink, LayerCache, StaleNames
from dockyard.transport.layout import (
    FORMAT,
    LOADER_MARK,
    SUFFIXES,
    ArchivePaths,
    archive_name,
    check_method,
    compressor_argv,
    write_loader,
)
from dockyard.transport.load import sign_file
from dockyard.transport.tarstream import TarPump

# Compressed size as a share of the tar, for the free-space check: zstd/gzip reach 30-40 % on
# images of wheels and shared libraries (the cpu image: 625 MB of 2.07 GB); 60 % leaves room for images that compress
# badly. Below LEAST_SHARE's the save cannot fit and is refused; between the two it is tried, said first: a disk that
# fills stops it and removes what it wrote (write_failed), where a refusal turned away a save that had room.
COMPRESSED_SHARE = {"zstd": 0.6, "gzip": 0.6, "none": 1.0}
LEAST_SHARE = {"zstd": 0.25, "gzip": 0.3, "none": 1.0}
MARGIN = 64 << 20


def save(settings: Settings, image: str = "", out: str = "", compress: str = "zstd", level: int = 0,
         thin_for: str = "", sign: str = "", variant: str = "") -> dict:
    """Write an archive and its companions; returns the manifest."""
    if image and variant:
        raise DockyardError("give --image or --variant, not both")
    level = check_method(compress, level)
    key = Path(os.path.expanduser(sign)) if sign else None
    if key:
        check_key_file(key, sign)
    if thin_for.startswith("ssh://"):
        remote.parse_ssh_url(thin_for)  # a malformed destination is said before the engine is asked anything
    out_dir = runfolder.users_folder(out, caches.container_writable(settings)) if out else settings.path(settings.dist_dir)
    # load.sh and run.sh, which the user runs on the node the archive goes to: never where a run's container can write
    caches.check_out_of_reach(settings, out_dir, "--out" if out else "the dist_dir setting's folder",
                              "give --out=DIR outside it" if out else "set the dist_dir setting to a folder outside "
                              "it (INVOKE_DOCKYARD_DIST_DIR=~/dist), or give --out=DIR",
                              use="you load the archive with its load.sh or train with its run.sh")
    if out_dir.exists() and not out_dir.is_dir():  # mkdir's own words were "File exists"
        named = f"--out={out}" if out else f"{out_dir} (the dist_dir setting)"
        raise DockyardError(f"{named} names a file; give a folder (the archive set is several files)")
    refs = [r.strip() for r in image.split(",") if r.strip()] or [default_image(settings, variant)]
    images = inventory.inspect_images(settings, refs)
    check_companions(out_dir, images, f"--out={out}" if out else f"{out_dir} (the dist_dir setting)")
    tool = (compressor_argv(compress, level) or [""])[0]
    if tool and not engine.which(tool):
        raise DockyardError(f"{tool} is not installed: install it (apt-get install {compress}) or pass "
                            "--compress=gzip / none")
    thin = thin_record(settings, images, thin_for) if thin_for else None
    paths = ArchivePaths(out_dir / archive_name(refs, compress, thin is not None))
    # Thin archives need about as much: they spool each layer while hashing it.
    tar_estimate = sum(i["bytes"] for i in images)
    compressed = int(tar_estimate * COMPRESSED_SHARE[compress])  # the archive's size, and the cache's copies'
    archive_need = compressed + MARGIN
    cache = layer_cache(settings, compress, level)
    remove_left_behind(paths, cache)  # before the free-space check, which they took from
    least = int(tar_estimate * LEAST_SHARE[compress]) + MARGIN
    free = console.check_free(out_dir, least, "the archive", "Free some space or pass --out=DIR on a larger disk.")
    if free < archive_need:
        print(f"warning: {console.human(free)} free in {out_dir}, and the archive may take up to "
              f"{console.human(archive_need)} ({console.human(tar_estimate)} of images, which {compress} makes "
              f"{LEAST_SHARE[compress]:.0%}-{COMPRESSED_SHARE[compress]:.0%} of): saving; where the disk fills, the "
              "save stops and removes what it wrote", file=sys.stderr)
    if cache is not None:
        cache.keeping = room_to_keep(cache, out_dir, archive_need, compressed)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(paths), interrupts_as_errors(f"saving {paths.archive.name}"):
            manifest, got = write_set(settings, paths, images, compress, level, thin, key, cache)
            stale = paths.other_compressions()
            for old in stale:  # its .sha256 and manifest were just replaced: it could only be refused as tampered
                old.unlink()
    except OSError as e:  # read-only folder, disk full: the partial files are already gone
        raise write_failed(e, paths, cache) from None
    runner = runscript.dockyard_variant(images)
    human = console.human
    if cache is not None and cache.hits:
        print(f"layer cache: {cache.hits} of {cache.hits + cache.misses} large layers copied from earlier saves "
              f"({human(cache.bytes_copied)}, {cache.dir})")
    if cache is not None and cache.bytes_kept:  # disk taken that the user did not name: said, with its setting
        print(f"layer cache: kept {human(cache.bytes_kept)} of compressed layers in {cache.dir} for the next save "
              "(up to the layer_cache_gb setting, 0 keeps none)")
    rate = human(got.pump.bytes_read / max(got.seconds, 1e-9))
    # a thin archive's tar is a few kB of what docker save streamed: the rate is of the stream, said with its size
    read = (f"the tar read at {rate}/s" if got.pump.bytes_read == manifest["tar_bytes"] else
            f"docker save's {human(got.pump.bytes_read)} of tar read at {rate}/s, the layers left out included")
    print(f"wrote {paths.archive}: {human(got.out_bytes)} from {human(manifest['tar_bytes'])} of tar in "
          f"{got.seconds:.1f} s ({read})")
    for old in stale:
        print(f"removed {old.name} (an earlier save): {paths.sha256.name} and {paths.manifest.name} now describe "
              f"{paths.archive.name}, so no loader would take it")
    if thin is not None:
        left = sum(layer["bytes"] for layer in manifest["layers"] if not layer["included"])
        print(f"thin for {thin_for}: left out {len(thin['omitted'])} layers ({human(left)}) the target "
              f"holds; it must still hold them when loading ({len(thin['requires'])} chain ids in the manifest)")
        if not any(layer["included"] for layer in manifest["layers"]) and already_there(thin_for, thin, images,
                                                                                         paths, runner):
            return manifest
    print(ship_hint(paths))
    print(load_hint(paths.archive))
    needs = runscript.node_needs(settings, images)
    if needs:
        print(needs)
    if runner:
        print(f"train there without the project: {runscript.train_hint()}")
    return manifest


def already_there(thin_for: str, thin: dict, images: list[dict], paths: ArchivePaths,
                  runner: tuple[str, str] | None) -> bool:
    """A thin archive for a target that holds every layer carries the images' configs and tags alone (a few kB), which
    `docker load` there turns into the images where it lacks them (a rebuild that changed a label or the name alone).
    Said as such; where the target already has every image as saved, said instead that it has, and how to train there,
    for there is nothing to ship (True: the ship and load hints are not said)."""
    size = console.human(paths.archive.stat().st_size)
    lacking = [name for name, _ in inventory.names(images) if name not in (thin["held"] or [])]
    if lacking:
        unknown = " where the node lacks it (its inventory, load.sh's, names no images)" if thin["held"] is None else ""
        print(f"{thin_for} holds every layer already: this archive ({size}) carries the config and name of "
              f"{', '.join(lacking)} alone, which loading it there adds{unknown}")
        return False
    print(f"{thin_for} already has {', '.join(thin['held'])} (the same image id) and every layer: nothing to ship "
          f"or load there (the archive, {size}, was written all the same; loading it changes nothing)")
    if runner:
        print(f"train there: invoke run --variant={runner[1]} (or, without the project, with this set's run.sh: "
              f"{runscript.train_hint()})")
    return True


def check_companions(out_dir: Path, images: list[dict], named: str) -> None:
    """load.sh (and run.sh, for a dockyard image) are written whole into the archive's folder, over an earlier save's:
    one there that no save wrote (a project's own run.sh, --out=.; a link to its script, an empty one) is refused
    before the save, not replaced after it."""
    marks = {"load.sh": LOADER_MARK, **({"run.sh": runscript.MARK} if runscript.dockyard_variant(images) else {})}
    for name, mark in marks.items():
        path = out_dir / name
        if locks.not_written_by(path, mark):
            raise DockyardError(f"{named} holds {name}, which `invoke save` did not write (it writes load.sh and run.sh "
                                "beside the archive, replacing its own): give another --out, or move that file away")


KEY_STARTS = (b"-----BEGIN ", b"ssh-", b"ecdsa-", b"sk-")  # a private key (PEM/OpenSSH), or a public key's line


def check_key_file(key: Path, given: str) -> None:
    """--sign names an ssh key file: refused before the save (minutes, for a large image) rather than after it."""
    kind = ("a private key, or a public key whose private half is in your ssh-agent; e.g. --sign=~/.ssh/id_ed25519")
    if not key.exists():
        raise DockyardError(f"--sign={given}: no such key file ({kind})")
    if not key.is_file():
        raise DockyardError(f"--sign={given}: a folder, not a key file ({kind})")
    try:
        with open(key, "rb") as f:
            head = f.read(64).lstrip()
    except OSError as e:
        raise DockyardError(f"--sign={given}: cannot read it ({e.strerror or e})") from None
    if not head.startswith(KEY_STARTS):
        raise DockyardError(f"--sign={given}: not an ssh key file ({kind})")


def ship_hint(paths: ArchivePaths) -> str:
    """How the set reaches a node, quoted for a shell: the step after a save on a build host (the image is here).
    The files to carry are those in the folder: the signature where the save signed (a node given allowed signers
    refuses the set without it), run.sh where there is one (a save of a dockyard image writes it)."""
    archive, folder = paths.archive, paths.archive.parent
    files = (archive, paths.sha256, paths.manifest, paths.signature, folder / "load.sh", folder / "run.sh")
    return (f"ship it: invoke ship --file={shlex.quote(str(archive))} --to=NODE:/dir  (or carry "
            f"{shlex.quote(str(folder))}/ there: {', '.join(shlex.quote(f.name) for f in files if f.exists())})")


def load_hint(archive: Path) -> str:
    """The commands that load the archive, quoted for a shell to paste into."""
    return (f"load it: invoke load --file={shlex.quote(str(archive))}  (or, without the project: sh load.sh "
            f"{shlex.quote(archive.name)})")


@contextlib.contextmanager
def exclusive(paths: ArchivePaths):
    """One save of an archive at a time, in any compression (they share the .sha256 and manifest): a second one
    (another shell, the same folder) is refused at once rather than publishing over the first's files. The lock
    lives outside the folder, which holds the set alone, in this user's private folder (a name in /tmp itself could
    be a link another user planted), and goes as the save ends."""
    key = hashlib.sha256(str(paths.archive.parent / paths.base).encode()).hexdigest()[:16]  # any compression
    with held_alone(private_folder() / f"save-{key}.lock",
                    f"another save of {paths.archive.name} into {paths.archive.parent} is under way: wait for it, "
                    "or save into another --out=DIR", remove=True):
        yield


def remove_left_behind(paths: ArchivePaths, cache: LayerCache | None) -> None:
    """The partial files a save killed outright (SIGKILL, the OOM killer, a power cut) left in the folder and the layer
    cache, the size of a compressed image and never removed: removed now, and said. In the folder, those of this set
    alone, under its lock (another save of it is refused there); in the cache, those of any save whose process is
    gone."""
    names = {paths.base + suffix for suffix in (*SUFFIXES.values(), ".manifest.json", ".sha256")}
    with exclusive(paths):
        found = locks.left_behind(paths.archive.parent, names) + (locks.left_behind(cache.dir) if cache else [])
    freed = 0
    for p in found:
        with contextlib.suppress(OSError):
            size = p.stat().st_size
            p.unlink()
            freed += size
    if found:
        where = " and ".join(dict.fromkeys(str(p.parent) for p in found))
        print(f"removed {len(found)} partial file(s) of {console.human(freed)} in {where}, left by a save killed "
              "before it could remove them")


@contextlib.contextmanager
def interrupts_as_errors(what: str):
    """SIGTERM and Ctrl-C end the save through the normal clean-up (partial files in the output folder and the
    layer cache removed), then say what was interrupted."""
    try:
        with engine.sigterm_as_interrupt():
            yield
    except KeyboardInterrupt as e:
        name = str(e) or "SIGINT"
        raise DockyardError(f"{what}: interrupted ({name}); the partial files were removed, nothing was "
                            "published", exit_code=engine.interrupt_status(e)) from None


def write_failed(e: OSError, paths: ArchivePaths, cache: LayerCache | None) -> DockyardError:
    """What a failed write of the set says: which folder would not take it, and what to do."""
    out_dir = paths.archive.parent
    where = Path(e.filename) if e.filename else out_dir
    where = where if where.is_dir() else where.parent
    head = f"saving {paths.archive.name} failed"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return DockyardError(f"{head}: {where} is not writable ({e.strerror}); nothing was published. Pick a "
                             "writable --out=DIR (or make that folder writable), then save again.")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        if not e.filename:  # a write into an open file names none: the fuller of the two folders it writes into
            folders = [out_dir, *([cache.dir] if cache is not None and cache.dir.exists() else [])]
            where = min(folders, key=lambda d: shutil.disk_usage(d).free)
        return DockyardError(f"{head}: no space left in {where} ({e.strerror}); nothing was published. Free "
                             "space there or save to a larger disk (--out=DIR), then save again.")
    named = Path(e.filename) if e.filename else out_dir
    which = (" (the layer cache: the layer_cache setting)" if cache is not None and named.is_relative_to(cache.dir)
             else "")
    return DockyardError(f"{head}: {named}{which}: {e.strerror or e}; nothing was published.")


def default_image(settings: Settings, variant_name: str = "auto") -> str:
    """The image of a variant (`auto`: the one this host would run), saying how it was chosen. A named variant
    needs no GPU: a GPU-less build host saves the CUDA image it built."""
    from dockyard.images import variants

    variant, why = variants.resolve(settings, variant_name or "auto")
    variants.say(why, err=True)
    return variants.tag(settings, variant)


def thin_record(settings: Settings, images: list[dict], thin_for: str) -> dict | None:
    """The manifest's `thin` record for --thin-for (an inventory file or ssh://node), or None where an
    image store needs a full archive."""
    target = remote.target_inventory(settings, thin_for)
    check_target_runs(settings, images, target, thin_for)
    omitted = inventory.omission_for(settings, images, target, thin_for)
    if omitted is None:
        return None
    return {"for": thin_for, "target_host": target.get("host", ""), "omitted": sorted(omitted.diff_ids),
            "requires": omitted.requires, "held": inventory.held_as_saved(images, target)}


def check_target_runs(settings: Settings, images: list[dict], target: dict, thin_for: str) -> None:
    """The target's driver and GPUs, where its inventory records them (load.sh --inventory, invoke inventory, or its
    nvidia-smi read over ssh as invoke ship reads it), against the set's CUDA image, by the rule load.sh there holds
    it to (runscript.unfit_on), before the save: said as invoke ship says it of a copy it does not load (a warning:
    the set may still be loaded for run.sh --cpu), or the note of the GPUs it trains on. An inventory without them (an
    older one, a node without nvidia-smi) is not asked."""
    unfit = runscript.unfit_on(settings, images, inventory.driver_host(target))
    if unfit is None:
        return
    node = target.get("host") or thin_for
    if unfit.usable:
        print(unfit.node_note(node), file=sys.stderr)
        return
    fix = (f"save the {unfit.instead} archive for it instead: invoke save --variant={unfit.instead} "
           f"--thin-for={shlex.quote(thin_for)}" if unfit.instead else unfit.fix("save"))
    print(f"warning: {unfit.refused_on(node)} ({fix}); saving it all the same (LOAD_SH_ANY_DRIVER=1 sh load.sh loads "
          "it there, for run.sh --cpu)", file=sys.stderr)


def write_set(settings: Settings, paths: ArchivePaths, images: list[dict], method: str, level: int,
              thin: dict | None, key: Path | None, cache: LayerCache | None) -> tuple[dict, Streamed]:
    """The archive, its manifest (signed with `key`) and its .sha256: written as .partial files, renamed
    when complete, the .sha256 last (a set with one is complete)."""
    partials = [partial(p) for p in (paths.archive, paths.manifest, paths.sha256)]
    signature = partials[1].with_name(partials[1].name + ".sig")  # where ssh-keygen puts it
    try:
        with open(partials[0], "xb") as f:
            got = stream_save(settings, images, f.write, method=method, level=level,
                              omit=(thin or {}).get("omitted", ()), spool_dir=paths.archive.parent,
                              label=f"save {paths.archive.name}", cache=cache)
        manifest = _manifest(paths, images, got, method, level, thin, runscript.driver_fields(settings, images))
        with open(partials[1], "x") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
        if key:
            sign_file(partials[1], key)
        with open(partials[2], "x") as f:
            f.write(f"{got.out_sha256}  {paths.archive.name}\n"
                    f"{hashlib.sha256(partials[1].read_bytes()).hexdigest()}  {paths.manifest.name}\n")
        write_loader(paths.archive.parent)  # before publishing: a disk that fills up here publishes nothing
        runscript.write(settings, paths.archive.parent, images)
        os.replace(partials[0], paths.archive)
        os.replace(partials[1], paths.manifest)
        if key:
            os.replace(signature, paths.signature)
        else:
            paths.signature.unlink(missing_ok=True)
        os.replace(partials[2], paths.sha256)
    finally:
        for p in (*partials, signature):
            p.unlink(missing_ok=True)
    return manifest, got


# --- the stream ----------------------------------------------------------------------------------

@dataclass
class Streamed:
    pump: TarPump
    out_bytes: int
    out_sha256: str
    seconds: float


def stream_save(settings: Settings, images: list[dict], sink: Callable[[bytes], object], *, method: str,
                level: int, omit: Iterable[str] = (), spool_dir: Path | None = None, label: str = "save",
                cache: LayerCache | None = None) -> Streamed:
    """docker save → tar reader (hash, thin) → compressor, one frame per large layer, or the frame the
    cache holds for it → sink, hashing what reaches the sink."""
    save_argv = engine.docker(settings, "save", *[i["ref"] for i in images])
    comp_argv = compressor_argv(method, level)
    engine.echo_pipeline(save_argv, *([comp_argv] if comp_argv else []))
    total = sum(i["bytes"] for i in images)
    if total > 1 << 30:  # the engine writes nothing until it has gathered the layers: a wait at 0 % is expected
        print(f"docker save reads every layer of {console.human(total)}"
              + (", also those this thin archive leaves out" if omit else "")
              + "; the engine gathers them first, so the count may stay near 0 for a minute or two",
              file=sys.stderr, flush=True)
    out_hash, out_bytes = hashlib.sha256(), 0

    def emit(chunk: bytes) -> None:
        nonlocal out_bytes
        out_hash.update(chunk)
        out_bytes += len(chunk)
        sink(chunk)

    started = time.monotonic()
    with (console.progress() as bar,
          engine.Pipeline(save_argv, stdout=engine.PIPE, quiet=True, what="docker save") as docker_save):
        task = bar.add_task(label, total=total or None)
        shown = total

        def read(n: int) -> None:
            # The tar is larger than the layers it holds (its headers, each layer's headers for its files, config
            # and manifest files): past the images' size the total grows, by 1 % at a time, as rich starts its
            # speed estimate again on each new total.
            nonlocal shown
            if pump.bytes_read > shown:
                shown = pump.bytes_read + max(total // 100, 1)
                bar.update(task, total=shown)
            bar.advance(task, n)

        pump = TarPump(omit, spool_dir, on_read=read)
        if comp_argv is None:
            pump.run(docker_save.stdout, emit)
        else:
            pump_framed(pump, docker_save.stdout, comp_argv, emit, cache)
        docker_save.wait()
        bar.update(task, total=pump.bytes_read)  # ends at 100 %: the tar docker save streamed
    pump.check(images)
    if cache is not None:
        cache.prune()
    return Streamed(pump, out_bytes, out_hash.hexdigest(), time.monotonic() - started)


def layer_cache(settings: Settings, method: str, level: int) -> LayerCache | None:
    """The cache of compressed layer frames (frames.py), or None when it is off."""
    if method == "none" or settings.layer_cache_gb <= 0:
        return None
    return LayerCache(settings.path(settings.layer_cache), method, level, int(settings.layer_cache_gb * (1 << 30)))


def room_to_keep(cache: LayerCache, out_dir: Path, archive_need: int, frames_need: int) -> bool:
    """Whether the disk holding the layer cache has room for this save's frames (a second copy of its large layers,
    about the archive's size) beside the archive where both are on one disk. The cache only saves time: without room
    it keeps nothing this time (its frames are still used), rather than filling the disk under the archive and
    failing the save minutes in, as the free-space check had passed."""
    where = console.existing(cache.dir)
    need = frames_need + (archive_need if where.stat().st_dev == console.existing(out_dir).stat().st_dev else 0)
    free = shutil.disk_usage(where).free
    if free >= need:
        return True
    print(f"layer cache: keeping no new layers this save, as {console.human(free)} is free for it in {where} and "
          f"it would take about {console.human(frames_need)}"
          + (f" beside the archive's {console.human(archive_need)}" if need > frames_need else "")
          + " (free space there, or point the layer_cache setting at a larger disk)")
    return False


def pump_framed(pump: TarPump, src, compressor: list[str], emit: Callable[[bytes], None],
                cache: LayerCache | None) -> None:
    """The tar from src through the pump into frames (frames.py), the frames into emit."""
    framed = pump.frames = FramedSink(compressor, emit, cache)
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


def _manifest(paths: ArchivePaths, images: list[dict], got: Streamed, method: str, level: int,
              thin: dict | None, driver: dict[str, str]) -> dict:
    layers, seen = [], set()
    included = {got.pump.layers[n][0] for n in got.pump.layers if n not in got.pump.omitted}
    sizes = {d: b for d, b in got.pump.layers.values()}
    for img in images:
        for d in img["diff_ids"]:
            if d not in seen:
                seen.add(d)
                layers.append({"diff_id": d, "bytes": sizes.get(d, 0), "included": d in included})
    named = inventory.names(images)
    return {
        "format": FORMAT,
        "archive": paths.archive.name,
        "archive_sha256": got.out_sha256,
        "archive_bytes": got.out_bytes,
        "tar_bytes": got.pump.bytes_out,  # a thin archive's tar: without the layers the peer holds
        "compression": {"method": method, "level": level},
        "created": inventory.now(),
        "images": [{k: i[k] for k in ("ref", "tags", "id", "labels", "diff_ids", "chain_ids")} for i in images],
        "layers": layers,
        "thin": thin,
        # What load.sh reads with sed: flat strings, one per line (the .sha256 pins this layout).
        "load_sh": {
            "check_images": " ".join(f"{ref}={i['id']}" for ref, i in named),
            "check_layers": " ".join(f"{ref}={','.join(i['diff_ids'])}" for ref, i in named),
            "require_chains": " ".join((thin or {}).get("requires") or []),
            "need_kb": str(2 * got.pump.bytes_out // 1024),  # docker load unpacks, then applies
            **driver,  # the node's driver is held against the image's CUDA before the copy
        },
    }
