"""Checking an archive set (sha256s, manifest, signature), and loading exactly the bytes checked.

The .sha256, manifest and signature are each read once and checked against each other before the engine is
touched. The archive is read once, hashed on its way into `docker load`, which gets the end of the tar only when
the hash and the tar's image names are right: a damaged, swapped or tampered archive loads nothing. After
loading, every image is looked up in the engine (`docker load` can exit 0 without loading everything); a load
refused then puts the tags it moved back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dockyard import console, engine, gpus
from dockyard.common import locks, runfolder
from dockyard.common.errors import DockyardError, loads, open_plain, problems, read_bounded
from dockyard.common.units import duration
from dockyard.launch import runscript
from dockyard.settings import Settings
from dockyard.transport import inventory
from dockyard.transport.layout import ArchivePaths, decompressor_argv, read_sums
from dockyard.transport.tarstream import TarGate, TooLong, Truncated

SIGN_NAMESPACE = "dockyard-archive"
TAR_SLACK = 1 << 20  # past the manifest's tar_bytes (load.sh allows as much): the end of a tar is padded


def load(settings: Settings, file: str, any_driver: bool = False) -> list[tuple[str, str]]:
    """Verify, then load an archive; returns (ref, id) of every image it holds, checked in the engine.

    The archive is opened once: the bytes hashed are the bytes loaded. A refused load leaves the engine's tags
    where they were. A CUDA image this host's driver or GPUs cannot run is refused before it is read, as load.sh
    refuses it (unless `any_driver`: for invoke run --cpu, or to pass it on)."""
    started = time.monotonic()
    paths = ArchivePaths(runfolder.followed(file, "--file"))
    manifest = check_set(settings, paths)
    info = engine.engine_info(settings)
    store = inventory.engine_store(info)
    said_killed_loads(settings, store)
    if already := already_loaded(settings, manifest, store):  # loaded before: nothing to hash, unpack or load
        print(f"{paths.archive.name}: every image it holds is already loaded here, as saved (same id; the archive "
              "itself was not read): nothing to do")
        for ref, image_id in already:
            print(f"already here: {ref} {image_id}")  # not "loaded": nothing was
        return already
    if not any_driver:
        check_host_runs(settings, paths, manifest)
    requires = (manifest.get("thin") or {}).get("requires") or []
    if requires:
        if store == "containerd":
            raise DockyardError("this engine uses the containerd image store, which cannot load a thin "
                                "archive: load the full archive (invoke save without --thin-for)")
        missing = set(requires) - set(inventory.layer_inventory(settings)["chain_ids"])
        if missing:
            raise DockyardError(f"this thin archive needs {len(missing)} of {len(requires)} base layers this "
                                "engine does not hold: load the full archive instead (invoke save without "
                                "--thin-for). Nothing was loaded.")
    root = Path(info.get("DockerRootDir", ""))
    if root.is_absolute() and root.exists():
        # docker load unpacks the whole tar under <root>/tmp, then into the layer store.
        console.check_free(root, 2 * manifest["tar_bytes"], "docker load",
                           "Free space on the engine's disk (docker image prune) and load again.")
    dec = decompressor_argv(paths.method)
    if dec and not engine.which(dec[0]):
        raise DockyardError(f"{dec[0]} is not installed: install it (apt-get install {dec[0]}) to load "
                            f"{paths.archive.name}")
    load_argv = engine.docker(settings, "load")
    before = tag_snapshot(settings)
    touched = {ref for ref, _ in inventory.names(manifest["images"])}
    journal = keep_journal(paths, manifest, before, touched)
    try:
        try:
            with engine.sigterm_as_interrupt():
                output = load_verified(paths, manifest, dec, load_argv, touched)
                touched |= said_loaded(output)
                loaded = check_loaded(settings, paths, manifest, store, load_argv, output)
        except DockyardError as e:
            undone = roll_back(settings, before, touched)
            raise DockyardError(f"{e}{undone}", exit_code=e.exit_code) from None  # (an interrupted command's 130)
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: ended Invoke with status 1 and not a word, the tags not undone
            undone = roll_back(settings, before, touched)
            raise DockyardError(f"loading {paths.archive.name}: interrupted ({str(e) or 'SIGINT'}); nothing was "
                                f"loaded{undone}", exit_code=engine.interrupt_status(e)) from None
        for ref, image_id in loaded:
            print(f"loaded {ref} {image_id}")
        for line in replaced_tags(before, loaded):
            print(line)
        # the last line, where a terminal's bar of the read is gone when it ends (not "loaded ...": ship reads those)
        print(f"{paths.archive.name}: verified and loaded in {duration(time.monotonic() - started)}")
    finally:
        journal.unlink(missing_ok=True)
    return loaded


def check_host_runs(settings: Settings, paths: ArchivePaths, manifest: dict) -> None:
    """This host's driver and GPUs (NVML, or DOCKYARD_NVML_REPLAY) against the set's CUDA image, by the rule invoke
    ship holds a node's to (runscript.unfit_on): a CUDA 12 host given the cu132 set loaded gigabytes that invoke run
    then refused. A host without a readable driver loads as before (invoke run says what is wrong)."""
    unfit = runscript.unfit_on(settings, manifest["images"], gpus.read_host())
    if unfit is None:
        return
    if unfit.usable:  # a V100 beside an H100: invoke run trains on the H100, given it alone
        print(f"note: {unfit.ref}: {unfit.why}, which invoke run refuses to train on: give it the others, as in "
              f"invoke run --gpus={','.join(map(str, unfit.usable))}{unfit.or_instead()}", file=sys.stderr)
        return
    fix = unfit.fix("load")
    raise DockyardError(f"{unfit.ref} cannot train here: {unfit.why}, so invoke run would refuse it: nothing was "
                        f"loaded from {paths.archive.name}. {fix[0].upper()}{fix[1:]}; invoke load --any-driver loads it "
                        "anyway (for invoke run --cpu)")


JOURNAL = "load-tags.json"  # in the user's private folder, under locks.partial()'s name while a load runs


def keep_journal(paths: ArchivePaths, manifest: dict, before: dict[str, str], touched: set[str]) -> Path:
    """What the next load needs to say what this one did, should it be killed outright (SIGKILL, the OOM killer, a
    CI job's end) once docker load has moved tags: the tags as they were, the names it touches, the images it
    carries. Removed when this load ends, whichever way."""
    journal = locks.partial(locks.private_folder() / JOURNAL)
    record = {"archive": paths.archive.name, "images": manifest["images"], "touched": sorted(touched),
              "before": {ref: image_id for ref, image_id in before.items() if ref}}
    try:
        with open(journal, "x") as f:
            f.write(json.dumps(record))
    except OSError as e:  # a full disk: refused before anything moved, not a traceback
        journal.unlink(missing_ok=True)
        raise DockyardError(f"cannot write {journal} ({e.strerror or e}), which keeps the engine's tags as they were "
                            "until the load ends: free space there (or set TMPDIR), then load again") from None
    return journal


def said_killed_loads(settings: Settings, store: str) -> None:
    """What a load killed outright after docker load had moved tags left unsaid (keep_journal), or a `sh load.sh`
    (its private folder, killed_load_sh_folders): where it had loaded its archive whole, the tags it took from other
    images (an image of the user's left untagged); where it was killed before its check refused what docker load
    brought, each tag left on another image than the archive's, and how to put it back. Said once: the journal goes,
    and the folder, as the next load.sh removes it."""
    for journal in locks.left_behind(locks.private_folder(), {JOURNAL}):
        try:
            record = loads(read_bounded(journal, 16 << 20, "a load's journal"))
            name, before, touched = str(record["archive"]), dict(record["before"]), list(record["touched"])
            images = [i for i in record["images"] if isinstance(i, dict)]
        except (ValueError, KeyError, TypeError, DockyardError):  # not one keep_journal wrote: nothing to say
            journal.unlink(missing_ok=True)
            continue
        say_killed(settings, store, name, before, touched, images, locks.LEFT_PARTIAL.fullmatch(journal.name)[1])
        journal.unlink(missing_ok=True)
    for folder, pid in killed_load_sh_folders():
        try:
            record = load_sh_record(folder)
        except (OSError, DockyardError):  # killed before docker load (no `before`): nothing moved
            record = None
        if record:
            say_killed(settings, store, *record, pid)
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            print(f"removed {folder}, the private copy of a load.sh killed before it could remove it",
                  file=sys.stderr)


def say_killed(settings: Settings, store: str, name: str, before: dict[str, str], touched: list[str],
               images: list[dict], pid: str) -> None:
    """What the load of `name` (process `pid`), killed outright with the tags as they were `before` it, did to the
    names it `touched`: the tags it replaced where its `images` are in the engine as saved, else where each is left."""
    loaded, wrong = in_engine(settings, {"images": images}, store)
    if not wrong:
        for line in replaced_tags(before, loaded):
            print(f"{line}: by a load of {name} killed outright (process {pid}) before it could say so")
    for ref in touched if wrong else []:
        meta = engine.image_inspect(settings, ref)
        now, was = (meta or {}).get("Id"), before.get(engine.familiar(ref))
        if now and now != was and ref != now:
            put_back = f"docker tag {was.removeprefix('sha256:')[:12]} {ref}" if was else f"docker rmi {ref}"
            print(f"warning: {ref} names {now.removeprefix('sha256:')[:12]}, not the image {name} holds: a load "
                  f"of it killed outright (process {pid}) before its check left it so; it named "
                  f"{was.removeprefix('sha256:')[:12] if was else 'nothing'} before. Put it back: {put_back}",
                  file=sys.stderr)


# load.sh's private folder (mktemp -d "$TMPDIR/dockyard-load.$$.HOST_TAG.XXXXXX", its host's locks.host_tag; none
# before the tag), which it keeps in the form said_moved (in load.sh) reads: `manifest.json`, the set's, checked;
# `before`, written just before docker load, as tag_snapshot lists the tags; `load.out`, what docker load said
LOAD_SH_FOLDER = re.compile(r"dockyard-load\.([0-9]+)\.(?:([0-9a-f]{8})\.)?[^.]+")


def killed_load_sh_folders() -> list[tuple[Path, str]]:
    """(folder, pid) of this user's load.sh folders whose load.sh is gone (killed outright: no trap ran), as the next
    load.sh finds them in its temporary folder (load_sh_tmpdir): a folder, not a link, this user's, made on this host
    (a TMPDIR nodes share holds other nodes' folders, whose load.sh may run: locks.left_behind)."""
    found = []
    with contextlib.suppress(OSError):
        for p in load_sh_tmpdir().iterdir():
            m = LOAD_SH_FOLDER.fullmatch(p.name)
            if not m or m[2] not in (None, locks.host_tag()):
                continue
            with contextlib.suppress(OSError):  # this user's folder first: anyone may make such a name in /tmp
                st = p.lstat()
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and locks.gone(int(m[1])):
                    found.append((p, m[1]))
    return found


def load_sh_tmpdir() -> Path:
    """Where load.sh makes its private folder: `${TMPDIR:-/tmp}`. Not Python's tempfile.gettempdir(), which takes TEMP
    or TMP where TMPDIR is unset (or empty): a killed load.sh's folder in /tmp went unseen, and stayed."""
    return Path(os.environ.get("TMPDIR") or "/tmp")


def load_sh_record(folder: Path) -> tuple[str, dict[str, str], list[str], list[dict]]:
    """The archive's name, the tags as they were, the names the load touched and the images it carries, from the
    folder of a killed load.sh (as said_moved reads them); refused where docker load had not started (no `before`)."""
    manifest = read_manifest(read_bounded(folder / "manifest.json", 16 << 20, "archive manifest"), "its manifest")
    before = tags_listed(read_bounded(folder / "before", 64 << 20, "list of tags").decode(errors="replace"))
    said = []
    with contextlib.suppress(OSError, DockyardError):
        said = read_bounded(folder / "load.out", 16 << 20, "docker load output").decode(errors="replace").splitlines()
    touched = {ref for ref, _ in inventory.names(manifest["images"])}
    for ref in said_loaded(said):  # the names docker load gave, the manifest's or not (the check never ran)
        with contextlib.suppress(DockyardError):
            touched.add(engine.reference(ref))
    name = str(manifest.get("archive", ""))  # JSON's escapes can give it what load.sh's check of the bytes passed
    return (name if name.isascii() and name.isprintable() else "an archive"), before, sorted(touched), manifest["images"]


def replaced_tags(before: dict[str, str], loaded: list[tuple[str, str]]) -> list[str]:
    """What the load took from other images: a tag that named another image before (docker load moves it without
    a word once quiet), and whether that image is left with no name (`<none>` in `docker image ls`)."""
    moved = {engine.familiar(ref) for ref, _ in loaded}
    said = []
    for ref, image_id in loaded:
        was = before.get(engine.familiar(ref))
        if not was or was == image_id:
            continue
        kept = sorted(r for r, i in before.items() if r and i == was and r not in moved)
        now = f"still tagged {', '.join(kept)}" if kept else "is now untagged"
        said.append(f"replaced tag {ref} (the image it named before, {was.removeprefix('sha256:')[:12]}, {now})")
    return said


def already_loaded(settings: Settings, manifest: dict, store: str) -> list[tuple[str, str]]:
    """(ref, id) of every image of the manifest where each is in the engine as saved, by its id (the digest of its
    config, layers included); [] where any is not. Only the classic store names an image so: containerd's id is a
    manifest it writes on import, and the same layers under another config (a changed ENV or label) are not it."""
    if store != "classic":
        return []
    loaded, wrong = in_engine(settings, manifest, store)
    return [] if wrong else loaded


def in_engine(settings: Settings, manifest: dict, store: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(ref, id) of each image of the manifest that is in the engine as saved, and what is wrong with each other."""
    loaded, wrong = [], []
    for ref, img in inventory.names(manifest["images"]):
        meta = engine.image_inspect(settings, ref)
        if why := inventory.loaded_as_saved(meta, img, store):
            wrong.append(f"{ref} {why}")
        else:
            loaded.append((ref, meta["Id"]))
    return loaded, wrong


def said_loaded(output: list[str]) -> set[str]:
    """The names and ids docker load says it loaded ("Loaded image: t:1", "Loaded image ID: sha256:...")."""
    return {line.split(": ", 1)[1] for line in output if line.startswith(("Loaded image: ", "Loaded image ID: "))}


def check_loaded(settings: Settings, paths: ArchivePaths, manifest: dict, store: str, load_argv: list[str],
                 output: list[str]) -> list[tuple[str, str]]:
    """Every image of the manifest in the engine, as saved (docker load can exit 0 without loading everything),
    and nothing else: a name or id docker load reports that the manifest lacks (a tar docker read differently
    from the gate) is refused, as load.sh refuses it, and the load is rolled back."""
    ours = {engine.familiar(ref) for ref, _ in inventory.names(manifest["images"])} | {i["id"] for i in manifest["images"]}
    for ref in sorted(said_loaded(output)):
        if engine.familiar(ref) not in ours:
            raise DockyardError(f"the tar of {paths.archive.name} holds an image {ref}, which its manifest does not "
                                "name: refused")
    loaded, wrong = in_engine(settings, manifest, store)
    if wrong:
        raise DockyardError(f"loading {paths.archive.name} failed: `{engine.quote(load_argv)}` exited 0, but "
                            + "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
                            + "\n" + console.tail(output))
    return loaded


def load_verified(paths: ArchivePaths, manifest: dict, dec: list[str] | None, load_argv: list[str],
                  names: set[str]) -> list[str]:
    """The archive, read once: hashed, decompressed and read as a tar (tarstream.TarGate) on its way into
    `docker load`. docker load gets the end of the tar only once the whole archive hashed to the manifest's
    sha256 and the tar names no image but the manifest's; otherwise it is killed before its input ends and loads
    nothing. At most the manifest's tar_bytes (what the free-space check counted) reach it. The names the tar
    gives images are added to `names`. Returns docker load's last output lines."""
    name = paths.archive.name
    engine.echo_pipeline([*(dec or ["cat"]), str(paths.archive)], load_argv)
    with (console.progress() as bar, open_plain(paths.archive, "archive") as f,
          engine.Pipeline(load_argv, stdin=engine.PIPE, stdout=engine.TAIL, quiet=True,
                          what=f"loading {name}") as docker_load):
        task = bar.add_task(f"load {name}", total=manifest["archive_bytes"])
        archive = Hashed(f, on_read=lambda n: bar.advance(task, n))
        gate = TarGate(docker_load.stdin.write, manifest["tar_bytes"] + TAR_SLACK)
        damaged = DockyardError(f"{name} does not match its sha256: the archive is damaged or was changed (it is "
                                "read once, as it is loaded). Copy it again; nothing was loaded.")
        with read_errors_said(name):
            try:
                if dec:
                    unpacked(archive, dec, gate, name)
                else:
                    gate.run(archive)
                archive.drain()
            except (DockyardError, BrokenPipeError) as e:
                archive.drain()  # a damaged archive is said to be damaged, whatever its damage did downstream
                if not archive.matches(manifest):
                    raise damaged from None
                if isinstance(e, TooLong):
                    raise DockyardError(f"{name} decompresses to more than its manifest declares ({manifest['tar_bytes']} "
                                        "bytes of tar): stopped there, refused, nothing was loaded") from None
                if isinstance(e, BrokenPipeError):  # docker load stopped reading: its exit code and output say why
                    docker_load.wait()
                    raise DockyardError(f"docker load stopped reading {name} before its end, before it was verified: "
                                        "refused\n" + console.tail(docker_load.output())) from None
                raise DockyardError(f"{name}: {e}: refused, nothing was loaded") from None
            if not archive.matches(manifest):
                raise damaged
        names |= tar_names(gate.naming, manifest, name)
        try:
            docker_load.stdin.write(gate.tail)
        except BrokenPipeError:
            pass
        docker_load.wait()
        return docker_load.output(whole=True)  # with many images, what docker load names is more than a tail


@contextlib.contextmanager
def read_errors_said(name: str) -> Iterator[None]:
    """The archive that could not be read to its end (EIO: a failing disk, a lost NFS server), said as that, naming it:
    it was a bare `error: Input/output error`, or a wait for ever where the decompressor's input never ended."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise DockyardError(f"reading {name} failed ({e.strerror or e}) before its end, before it was verified: "
                            "nothing was loaded. Check the disk it is on, or copy it again") from None


def unpacked(archive: Hashed, dec: list[str], gate: TarGate, name: str) -> None:
    """archive → the decompressor (fed by a thread) → gate."""
    failed: list[BaseException] = []
    with engine.Pipeline(dec, stdin=engine.PIPE, stdout=engine.PIPE, quiet=True,
                         what=f"decompressing {name}") as unpack:
        def feed() -> None:
            try:
                while chunk := archive.read(engine.CHUNK):
                    unpack.stdin.write(chunk)
                unpack.stdin.close()
            except BrokenPipeError:  # the decompressor stopped (damage) or was stopped (a refusal)
                pass
            except BaseException as e:  # the archive could not be read to its end (EIO: a failing disk)
                failed.append(e)
                unpack.kill()  # its input never ends: stopped, or the gate waits for its output for ever

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            gate.run(unpack.stdout)
            if unpack.stdout.read(1):
                raise DockyardError("the tar holds more than 1 MiB after its end")
        except Truncated:  # the decompressor stopped: when it failed (a damaged stream), its message says why
            feeder.join()
            if failed:  # it was stopped because the archive could not be read: that is why
                raise failed[0] from None
            unpack.wait()
            raise
        except BaseException:
            unpack.kill()
            feeder.join()
            raise
        feeder.join()
        if failed:
            raise failed[0]
        # a damaged stream fails here, before docker load sees the end of its tar
        unpack.wait()


class Hashed:
    """A file read through its sha256; on_read(n) is told of every n bytes read (a progress bar)."""

    def __init__(self, f, on_read: Callable[[int], object] = lambda n: None):
        self.f, self.hash, self.bytes, self.on_read = f, hashlib.sha256(), 0, on_read

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.hash.update(data)
        self.bytes += len(data)
        self.on_read(len(data))
        return data

    def drain(self) -> None:
        while self.read(engine.CHUNK):
            pass

    def matches(self, manifest: dict) -> bool:
        return self.bytes == manifest["archive_bytes"] and self.hash.hexdigest() == manifest["archive_sha256"]


def tar_names(naming: list[tuple[str, bytes]], manifest: dict, name: str) -> set[str]:
    """The names the tar gives its images (docker's manifest.json, repositories, an OCI index.json), refused
    unless every one is a name the manifest gives that image and the tar holds no image the manifest lacks."""
    ours = {engine.familiar(ref): img for ref, img in inventory.names(manifest["images"])}
    ids = {img["id"] for img in manifest["images"]}
    found: set[str] = set()

    def refuse(why: str) -> DockyardError:
        return DockyardError(f"{name}: the tar {why}; its manifest does not name that: refused, nothing was "
                             "loaded")

    def check(ref: object, where: str, image_id: str = "") -> None:
        if not isinstance(ref, str) or engine.familiar(ref) not in ours:
            raise refuse(f"names an image {ref!r} in {where}")
        if image_id and image_id in ids and ours[engine.familiar(ref)]["id"] != image_id:
            raise refuse(f"gives {ref} to another of its images in {where}")
        found.add(ref)

    if "manifest.json" not in {path for path, _ in naming}:
        raise DockyardError(f"{name}: the tar has no manifest.json, so it is not a `docker save` archive: "
                            "refused, nothing was loaded")
    for path, raw in naming:
        try:
            data = loads(raw)
        except ValueError:
            raise DockyardError(f"{name}: the tar's {path} is not JSON: refused, nothing was loaded") from None
        if path == "manifest.json":
            if not isinstance(data, list) or not all(isinstance(e, dict) and set(e) <= DOCKER_KEYS for e in data):
                raise DockyardError(f"{name}: the tar's manifest.json is not what docker save writes: refused, "
                                    "nothing was loaded")
            for entry in data:
                config = entry.get("Config")
                image_id = "sha256:" + config.removeprefix("blobs/sha256/").removesuffix(".json") \
                    if isinstance(config, str) else ""
                tags = entry.get("RepoTags") or []
                if not isinstance(tags, list):
                    raise refuse("holds a RepoTags that is not a list")
                for ref in tags:
                    check(ref, path, image_id)
            if len(data) > len(ids):  # untagged extras (the containerd store's ids are not config digests)
                raise refuse(f"holds {len(data)} images where its manifest has {len(ids)}")
        elif path == "repositories":
            if not isinstance(data, dict) or not all(isinstance(t, dict) for t in data.values()):
                raise refuse("holds a repositories file that is not docker's")
            for repo, tags in data.items():
                for tag in tags:
                    check(f"{repo}:{tag}", path)
        else:  # index.json: the OCI layout, read by the containerd image store
            entries = data.get("manifests") if isinstance(data, dict) else None
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise refuse("holds an index.json that is not an OCI index")
            for entry in entries:
                notes = entry.get("annotations") or {}
                if not isinstance(notes, dict):
                    raise refuse("holds index.json annotations that are not an object")
                # containerd names an image by the first; by the second where the first is absent
                image_name, ref_name = notes.get(IMAGE_NAME), notes.get(REF_NAME)
                if image_name is not None:
                    check(image_name, path)
                if ref_name is not None and not (image_name is not None and _bare_tag(ref_name)):
                    check(ref_name, path)  # beside a name, docker save writes the bare tag: it names nothing
    return found


DOCKER_KEYS = {"Config", "RepoTags", "Layers", "LayerSources"}  # docker reads its keys case-insensitively: no others
IMAGE_NAME, REF_NAME = "io.containerd.image.name", "org.opencontainers.image.ref.name"


def _bare_tag(ref: object) -> bool:
    """A tag alone ("2"), as the OCI ref.name annotation holds it beside containerd's full name."""
    return isinstance(ref, str) and not any(c in ref for c in "/:@")


# --- undoing a refused load ------------------------------------------------------------------------

def tag_snapshot(settings: Settings) -> dict[str, str]:
    """Every tag the engine holds → the image id it names, and "" → the ids of all its images (one per line)."""
    return tags_listed(engine.run(engine.docker(settings, "image", "ls", "-a", "--no-trunc", "--format",
                                                "{{.ID}} {{.Repository}}:{{.Tag}}"), capture=True, quiet=True).stdout)


def tags_listed(out: str) -> dict[str, str]:
    """tag_snapshot of what `docker image ls` listed (load.sh keeps the same list, its `before`)."""
    tags, ids = {}, []
    for line in out.splitlines():
        image_id, _, ref = line.partition(" ")
        ids.append(image_id)
        if "<none>" not in ref:
            tags[ref] = image_id
    return {**tags, "": "\n".join(ids)}


def roll_back(settings: Settings, before: dict[str, str], names: set[str]) -> str:
    """Puts every tag in `names` back on the image it named before the load (or removes it where it named none),
    then removes the images the load brought that nothing names any more. Returns what it says about that."""
    known = set(before[""].split())
    unnamed = known - {image_id for ref, image_id in before.items() if ref}
    moved, new = [], set()
    for ref in sorted(names):
        try:
            meta = engine.image_inspect(settings, ref)
        except DockyardError:  # a name docker would not take: it cannot have been loaded either
            continue
        now, was = (meta or {}).get("Id"), before.get(engine.familiar(ref))
        if now == was or (not was and now in unnamed):  # untagging an image that had no name would remove it
            continue
        if now and now not in known:
            new.add(now)
        if ref == now:  # an image docker load gave no name: removed below with the others it brought
            continue
        argv = engine.docker(settings, "tag", was, ref) if was else engine.docker(settings, "rmi", "--no-prune", ref)
        if engine.run(argv, capture=True, check=False, quiet=True).returncode == 0:
            moved.append(ref)
    for image_id in sorted(new):  # only what nothing names (docker rmi without -f keeps anything still used)
        engine.run(engine.docker(settings, "rmi", image_id), capture=True, check=False, quiet=True)
    if not moved:
        return ""
    return ("\nthe tags the load moved are back where they were: " + ", ".join(moved)
            + "; the images it brought are removed")


def check_set(settings: Settings, paths: ArchivePaths, nothing: str = "nothing was loaded") -> dict:
    """The signature (when configured), the .sha256 and the manifest, each read once, checked against each
    other; returns the manifest. The archive itself is not read: its bytes are checked as they are used. A refusal
    ends with `nothing` (what was not done: `invoke ship` checks the set before copying anything)."""
    paths.check_whole("an archive travels with its .sha256 and .manifest.json (copy all three, or use `invoke ship`)")
    raw = paths.manifest_bytes()
    if settings.allowed_signers:
        principal = verify_signature(settings.path(settings.allowed_signers), paths, raw, nothing)
        print(f"signature good: signed by {principal}", file=sys.stderr)
    sums = read_sums(paths.sha256)
    if any(len(d) != 64 or set(d) - set("0123456789abcdef") for d in sums.values()):
        raise DockyardError(f"{paths.sha256.name} is damaged: not sha256sum's lines (64 hex digits, two spaces, a "
                            f"file name). Refused, {nothing}: copy the set again, or `invoke ship` it")
    if sums and paths.manifest.name not in sums and paths.archive.name not in sums:  # not a word about this set
        listed = ", ".join(sorted(sums)[:4])[:300]
        raise DockyardError(f"{paths.sha256.name} lists {listed}, not {paths.archive.name} and "
                            f"{paths.manifest.name}: the files were renamed (or the .sha256 is another archive's). "
                            f"Give the three files back the names it lists, or copy the set again; {nothing}.")
    if sums.get(paths.manifest.name) != hashlib.sha256(raw).hexdigest():
        raise DockyardError(f"{paths.manifest.name} does not match {paths.sha256.name}: the manifest was "
                            f"changed or damaged. Refused, {nothing}.")
    manifest = read_manifest(raw, paths.manifest.name, nothing)
    expected = sums.get(paths.archive.name)
    if expected is None or manifest.get("archive_sha256") != expected:
        raise DockyardError(f"{paths.sha256.name} and {paths.manifest.name} disagree about "
                            f"{paths.archive.name}: refused, {nothing}")
    size, want = paths.archive.stat().st_size, manifest["archive_bytes"]
    if size != want:
        raise DockyardError(f"{paths.archive.name} is {size} bytes, the manifest says {want}: the copy is "
                            f"{'truncated' if size < want else 'damaged'}. Copy it again (`invoke ship` "
                            f"resumes); {nothing}.")
    return manifest


def verify(settings: Settings, paths: ArchivePaths) -> dict:
    """Checks signature (when configured), manifest and archive sha256s; returns the manifest.

    Touches no engine: a damaged archive is refused before anything is loaded.
    """
    manifest = check_set(settings, paths)
    if sha256_file(paths.archive, f"verify {paths.archive.name}") != manifest["archive_sha256"]:
        raise DockyardError(f"{paths.archive.name} does not match its sha256: the archive is damaged or was "
                            "changed. Copy it again; nothing was loaded.")
    return manifest


# A save names a few images, each by a few tags; every name is looked up in the engine (docker image inspect, twice
# for a load), so a manifest naming thousands asked the engine about each, for hours (300 tags: 40 s). load.sh has
# the same limits (MAX_NAMES, MAX_CHAINS).
MAX_IMAGES, MAX_TAGS, MAX_NAMES = 64, 64, 128
MAX_CHAINS = MAX_IMAGES * 128  # a thin archive's base layers: docker stacks at most 127 layers in an image


class _Image(BaseModel):
    model_config = ConfigDict(extra="allow")

    ref: str  # the name the image was saved by (run.sh trains in it)
    id: str
    tags: list[str] = Field(max_length=MAX_TAGS)
    diff_ids: list[str]
    labels: dict[str, str] = {}  # the image's labels, as `docker image inspect` gives them ({} for none)

    @field_validator("ref")
    @classmethod
    def _reference(cls, ref: str) -> str:
        return engine.reference(ref, "ref")

    @field_validator("tags")
    @classmethod
    def _references(cls, tags: list[str]) -> list[str]:
        for t in tags:
            engine.reference(t, "tag")  # a tag such as '-q' would reach docker as an option
        return tags


class _Thin(BaseModel):
    """A thin archive's record: the layer chain ids the loading engine must hold (the rest is carried along)."""
    model_config = ConfigDict(extra="allow")

    requires: list[inventory.Digest] = Field([], max_length=MAX_CHAINS)


class _Manifest(BaseModel):
    """The fields the loaders rely on; the rest of what `invoke save` writes is carried along unchecked."""
    model_config = ConfigDict(extra="allow")

    archive_sha256: str
    # whole numbers as JSON numbers, of at most 18 digits: what load.sh reads from the same manifest
    archive_bytes: int = Field(ge=0, lt=10**18, strict=True)
    tar_bytes: int = Field(ge=0, lt=10**18, strict=True)
    images: list[_Image] = Field(min_length=1, max_length=MAX_IMAGES)
    thin: _Thin | None = None

    @model_validator(mode="after")
    def _few_names(self) -> _Manifest:
        named = sum(len(i.tags) or 1 for i in self.images)  # inventory.names: its tags, or the id of an untagged one
        if named > MAX_NAMES:
            raise ValueError(f"its images have {named} names (tags, or the id of an untagged image), more than any "
                             f"save gives them ({MAX_NAMES} at most), each to be looked up in the engine")
        return self


def archived_tags(settings: Settings, archive: str) -> list[str] | None:
    """The image tags an archive set holds, from its manifest, checked as `invoke load` checks it first; None where
    `archive` names no file (the caller says so in its own words)."""
    path = Path(os.path.expanduser(archive))
    if not archive or not path.is_file():
        return None
    manifest = check_set(settings, ArchivePaths(path))
    return [tag for image in manifest["images"] for tag in image["tags"]]


def read_manifest(raw: bytes, name: str, nothing: str = "nothing was loaded") -> dict:
    """The manifest as `invoke save` writes it, or a refusal that says what is wrong (never a traceback)."""
    try:
        return _Manifest.model_validate_json(raw).model_dump()
    except (ValidationError, DockyardError) as e:
        raise DockyardError(f"{name} is not a manifest `invoke save` writes ({problems(e, 'manifest')}): "
                            f"refused, {nothing}") from None


def sha256_file(path: Path, label: str) -> str:
    h = hashlib.sha256()
    with console.progress() as bar, open_plain(path, "archive") as f:
        task = bar.add_task(label, total=path.stat().st_size)
        while chunk := f.read(engine.CHUNK):
            h.update(chunk)
            bar.advance(task, len(chunk))
    return h.hexdigest()


# --- signatures ----------------------------------------------------------------------------------

def sign_file(path: Path, key: Path) -> None:
    """`ssh-keygen -Y sign`: writes <path>.sig. Signing the manifest covers the archive's sha256 in it."""
    engine.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(key), "-n", SIGN_NAMESPACE, str(path)],
               what="signing the manifest")


def verify_signature(allowed: Path, paths: ArchivePaths, manifest: bytes,
                     nothing: str = "nothing was loaded") -> str:
    """The principal that signed `manifest` (the bytes read from paths.manifest: the ones then used); refuses
    unsigned or wrongly signed archives."""
    if not allowed.exists():
        raise DockyardError(f"allowed_signers is set to {allowed}, which does not exist: fix the setting")
    signature = read_signature(paths, allowed, nothing)
    with tempfile.TemporaryDirectory(prefix="dockyard-sig-") as private:
        # ssh-keygen reads a private copy of the bytes read here: never the shared file, which could since have
        # become a pipe (a wait for ever) or a link to /dev/zero
        sig = Path(private) / paths.signature.name
        sig.write_bytes(signature)
        found = engine.run(["ssh-keygen", "-Y", "find-principals", "-s", str(sig), "-f", str(allowed)],
                           capture=True, check=False, quiet=True)
        principal = found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else ""
        if not principal:
            raise DockyardError(f"{paths.archive.name} was signed by a key that is not in {allowed}: "
                                f"refused, {nothing}")
        ok = engine.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", SIGN_NAMESPACE,
                         "-s", str(sig)], input=manifest, capture=True, check=False, quiet=True)
    if ok.returncode != 0:
        raise DockyardError(f"the signature of {paths.manifest.name} does not verify (the manifest was "
                            f"changed after signing): refused, {nothing}")
    return principal


def read_signature(paths: ArchivePaths, allowed: Path, nothing: str) -> bytes:
    """The .manifest.json.sig, read as untrusted input: a plain file of at most layout.SIGNATURE_LIMIT bytes."""
    unsigned = (f"{paths.archive.name} is not signed ({paths.signature.name} is missing) and allowed_signers is "
                f"set ({allowed}): refused, {nothing}")
    try:
        return paths.signature_bytes()
    except FileNotFoundError:  # none, or a link to nothing
        raise DockyardError(unsigned) from None
    except DockyardError as e:  # a pipe, a device, more than any signature holds
        raise DockyardError(f"{e}: refused, {nothing}") from None
    except OSError as e:  # a folder, no permission
        raise DockyardError(f"cannot read the signature {paths.signature}: {e.strerror or e}: refused, "
                            f"{nothing}") from None
