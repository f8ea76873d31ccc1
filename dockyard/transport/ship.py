"""`invoke ship`: an archive (file mode) or an image (stream mode) to another node over ssh.

`ship_file`: copies an archive resumably (rsync --partial --append-verify where the node has rsync;
otherwise ssh appending to a `.partial` file from where it stopped), checks the sha256 there, and
only then renames it; with `load`, runs load.sh there (this checkout's, never the one found beside the archive).
`ship_image`: no file on either side, `docker save | zstd | ssh node 'zstd -dc | docker load'`, checked after
loading.
"""

from __future__ import annotations

import functools
import re
import shlex
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from dockyard import console, engine
from dockyard.common import runfolder
from dockyard.common.errors import DockyardError, MiB, loads, open_plain, problems, read_bounded
from dockyard.common.units import duration
from dockyard.launch import runscript
from dockyard.settings import Settings
from dockyard.transport import inventory
from dockyard.transport import save as save_mod
from dockyard.transport.layout import LOADER_TEMPLATE, ArchivePaths, check_method, decompressor_argv
from dockyard.transport.load import check_set, sha256_file
from dockyard.transport.remote import (
    Remote,
    check_identity,
    held_open,
    node_host,
    node_state,
    parse_to,
    remote_inventory,
    rpath,
    run_there,
    sha256_there,
    ssh_argv,
    ssh_base,
)


def ship_file(settings: Settings, file: str, to: str, port: int = 0, identity: str = "", load: bool = False,
              transport: str = "") -> list[tuple[str, str]]:
    """Copy an archive and its companions to the node, verify it there, optionally load it there.

    `transport` forces "rsync" or "ssh" (tests); by default rsync where the node has it.
    Returns the (ref, id) pairs load.sh reported when loading, else [].
    """
    started = time.monotonic()
    paths = ArchivePaths(runfolder.followed(file, "--file"))
    paths.check_whole("ship an archive written by `invoke save` (it writes the .sha256 and .manifest.json beside it)")
    r = parse_to(to, port, identity)
    check_identity(identity)
    # what `invoke load` checks before reading the archive: the signature where allowed_signers is set, the .sha256
    # against the manifest, the size; the archive's bytes are checked on the node, against this manifest's sha256
    manifest = check_set(settings, paths, nothing="nothing was copied")
    name, expected = paths.archive.name, manifest["archive_sha256"]
    companions = companion_files(settings, paths, manifest)
    have = node_state(settings, r, name)
    needs = {"sha256sum": "to check the copy"}
    if load:
        needs["docker"] = "to load it"
        if paths.method != "none":
            needs[paths.method] = "to unpack it"
    for tool, why in needs.items():
        if not have.get(tool):
            raise DockyardError(f"{r.host} has no {tool} ({why}): install it there"
                                + (", or save with --compress=gzip" if tool == "zstd" else ""))
    check_thin_fits(settings, r, manifest)
    check_node_runs(settings, r, manifest, have, load)

    if int(have.get("final", -1)) == manifest["archive_bytes"] and sha256_there(settings, r, name, have) == expected:
        print(f"{r.where(name)} is already there and verified")
    else:
        copy(settings, r, paths, have, transport, sum(map(len, companions.values())))
        got = sha256_there(settings, r, name + ".partial", have)
        if got != expected:
            run_there(settings, r, f"rm -f {rpath(r.dir, name + '.partial')}", "removing a bad copy")
            if sha256_file(paths.archive, f"checking {name} here") != expected:  # no copy of it would ever match
                raise DockyardError(f"{paths.archive} does not match its {paths.sha256.name}: the archive here is "
                                    "damaged or was changed, so no copy of it can verify. Save it again (invoke "
                                    f"save), then ship; the copy on {r.host} was removed.")
            raise DockyardError(f"the copy on {r.host} does not match the archive's sha256 ({got[:12]} != "
                                f"{expected[:12]}): removed it; run `invoke ship` again")
        run_there(settings, r, f"mv -f {rpath(r.dir, name + '.partial')} {rpath(r.dir, name)}", "renaming the copy")
    for companion, content in companions.items():
        _put_small(settings, r, companion, content)
    # The archive's sha256 was checked above; this checks that the manifest arrived intact.
    run_there(settings, r, f"cd {rpath(r.dir)} && grep -F {shlex.quote('  ' + paths.manifest.name)} "
                           f"{shlex.quote(paths.sha256.name)} | sha256sum -c -", "verifying the manifest")
    print(f"shipped {name} to {r.where()} in {duration(time.monotonic() - started)}: sha256 verified there")
    train = f"cd {rpath(r.dir)} && {runscript.train_hint()}" if "run.sh" in companions else ""
    if not load:  # what the node's user types next, pasteable there
        print(f"next, on {r.host}: cd {rpath(r.dir)} && sh load.sh {shlex.quote(name)}  (or ship again with --load "
              "to load it from here)")
        if train:
            print(f"then train there: {train}")
        return []
    print(f"loading {name} on {r.host}: load.sh there checks it again and docker load unpacks "
          f"{console.human(manifest['tar_bytes'])}, unless its images are loaded there already (a minute for each "
          "few GB) ...", flush=True)
    load_there = f"cd {rpath(r.dir)} && sh load.sh {shlex.quote(name)}"
    try:
        out = run_there(settings, r, f"cd {rpath(r.dir)} || exit 1\n" + held_open(f"sh load.sh {shlex.quote(name)}"),
                        f"loading {name}", held=True)
    except KeyboardInterrupt as e:  # the ssh goes with this end, and load.sh there with it
        raise DockyardError(f"interrupted: the load on {r.host} was stopped (load.sh there stops docker load and "
                            f"removes its private copy); {name} stays there, verified: ship again with --load, or "
                            f"there: {load_there}", exit_code=engine.interrupt_status(e)) from None
    # "loaded REF ID", or "already here: REF ID" for an image load.sh found there as saved and did not load
    said = [line.split() for line in out.stdout.splitlines() if line.startswith(("loaded ", "already here: "))]
    for words in said:
        print(f"{'loaded' if words[0] == 'loaded' else 'already'} on {r.host}: {words[-2]} {words[-1]}")
    if train:
        print(f"train there: {train}")
    return [(words[-2], words[-1]) for words in said]


def ship_image(settings: Settings, image: str, to: str, port: int = 0, identity: str = "",
               thin: bool = False) -> list[tuple[str, str]]:
    """docker save | zstd | ssh node 'zstd -dc | docker load', then check every image id there."""
    r = Remote(parse_to(to, need_dir=False).host, ".", port, identity)
    check_identity(identity)
    refs = [x.strip() for x in image.split(",") if x.strip()]
    images = inventory.inspect_images(settings, refs)
    have = node_state(settings, r, "")
    if not have.get("docker"):
        raise DockyardError(f"{r.host} has no docker to load into")
    check_node_runs(settings, r, {"images": images}, have, load=True)
    wanted = inventory.names(images)
    found, bad, store = images_there(settings, r, wanted)
    if not bad and store == "classic":  # there as saved, by id (load.already_loaded): a stream would send nothing new
        for ref, meta in found:
            print(f"{ref} is already on {r.host}, as saved ({meta['Id']}): nothing to send")
        return [(ref, meta["Id"]) for ref, meta in found]
    method = "zstd" if have.get("zstd") and engine.which("zstd") else "gzip"
    level = check_method(method, 0)
    omit: frozenset[str] = frozenset()
    if thin:
        omitted = inventory.omission_for(settings, images, remote_inventory(settings, r), r.url)
        if omitted is not None:
            omit = omitted.diff_ids
            print(f"thin: leaving out {len(omit)} layers {r.host} already holds", file=sys.stderr)
    load_argv = ssh_argv(settings, r, f"{' '.join(decompressor_argv(method))} | docker load")
    engine.echo(load_argv)
    with engine.Pipeline(load_argv, stdin=engine.PIPE, stdout=engine.TAIL, quiet=True,
                         what=f"docker load on {r.host}") as remote_load:
        try:
            got = save_mod.stream_save(settings, images, remote_load.stdin.write, method=method, level=level,
                                      omit=omit, label=f"stream to {r.host}",
                                      cache=save_mod.layer_cache(settings, method, level))
        except BrokenPipeError:  # the node stopped reading: its exit code and output say why
            code = remote_load.wait(check=False)[0]
            raise DockyardError(f"{r.host} stopped reading the stream (ssh exit {code}): nothing was loaded there. "
                                f"Check the connection and the node's disk and docker, then ship again.\n"
                                + console.tail(remote_load.output())) from None
        remote_load.wait()
    found, bad, _ = images_there(settings, r, wanted, nothing="what was loaded there cannot be checked")
    if bad:
        raise DockyardError(f"docker load on {r.host} did not load what was sent: {'; '.join(bad)}")
    print(f"streamed {console.human(got.out_bytes)} ({method}) to {r.host} in {got.seconds:.1f} s")
    for ref, meta in found:
        print(f"loaded on {r.host}: {ref} {meta['Id']}")
    return [(ref, meta["Id"]) for ref, meta in found]


def images_there(settings: Settings, r: Remote, wanted: list[tuple[str, dict]],
                 nothing: str = "nothing was sent") -> tuple[list[tuple[str, dict]], list[str], str]:
    """(ref, `docker image inspect`) of each wanted image on the node, why each that is not there as saved is not
    (all of them where the node does not answer for each), and the node's image store.

    The node is another machine, its answers untrusted: an answer that is not what docker prints (an object without
    an Id, layers that are not digests) is refused, naming the node. It is not taken for "not there": these answers
    are all a ship has to check the load by, so a stream to such a node could never be verified, and its images
    would be sent again and again for nothing."""
    # one line per image: docker prints an empty line (and exits 1) for an image it does not hold
    script = "; ".join(["docker info --format '{{json .}}'"] + [
        f"j=$(docker image inspect --format '{{{{json .}}}}' {shlex.quote(ref)} 2>/dev/null); "
        '[ -n "$j" ] && printf \'%s\\n\' "$j" || echo null'
        for ref, _ in wanted])
    lines = run_there(settings, r, script, "checking the images").stdout.splitlines() or [""]
    info = _json_object(lines[0]) or {}
    try:
        store = inventory.engine_store(inventory.info_answer(info))
    except ValidationError as e:
        raise DockyardError(f"{r.host} answered `docker info` with what docker does not print ({problems(e)}): "
                            f"refused, {nothing}. Check the docker client on the node.") from None
    found = [(ref, _inspected(r, ref, line, nothing)) for (ref, _), line in zip(wanted, lines[1:], strict=False)]
    bad = [f"{ref} {wrong}" for (ref, img), (_, meta) in zip(wanted, found, strict=False)
           if (wrong := inventory.loaded_as_saved(meta, img, store))]
    return found, (bad if len(found) == len(wanted) else bad + ["no answer"]), store


def _json_object(line: str) -> dict | None:
    """A line the node answered, as the JSON object it should be (None: anything else, "null" included)."""
    try:
        value = loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _inspected(r: Remote, ref: str, line: str, nothing: str) -> dict | None:
    """The node's `docker image inspect` of `ref`: None where it holds no such image ("null"), a refusal where the
    answer is not what docker prints."""
    if line.strip() in ("null", ""):
        return None
    try:
        return inventory.inspect_answer(line)
    except ValidationError as e:
        raise DockyardError(f"{r.host} answered `docker image inspect {ref}` with what docker does not print "
                            f"({problems(e, 'answer')}): refused, {nothing}. Check the docker client on the "
                            "node.") from None


def check_node_runs(settings: Settings, r: Remote, manifest: dict, have: dict[str, str], load: bool) -> None:
    """The node's NVIDIA driver and GPUs (its nvidia-smi, asked with its tools) against the set's CUDA image, before the
    copy: load.sh there refuses an image they cannot run, once gigabytes have been carried. With --load (and a stream,
    which always loads) that is refused here, naming the variant that runs there; without, said as a warning (the set
    may be passed on, or trained in on CPU with run.sh --cpu). A node without a working nvidia-smi is not asked
    (load.sh there says the same)."""
    unfit = runscript.unfit_on(settings, manifest["images"], node_host(have))
    if unfit is None:
        return
    if unfit.usable:  # as load.sh there: run.sh trains on the GPUs that have its code, given them alone
        print(unfit.node_note(r.host), file=sys.stderr)
        return
    fix = unfit.fix("ship")
    said = unfit.refused_on(r.host)
    if load:
        raise DockyardError(f"{said}: nothing was copied. {fix[0].upper()}{fix[1:]}")
    print(f"warning: {said} ({fix}); copying it all the same, without --load", file=sys.stderr)


def check_thin_fits(settings: Settings, r: Remote, manifest: dict) -> None:
    """Refuse before copying when the node lacks a layer the thin archive relies on."""
    requires = (manifest.get("thin") or {}).get("requires") or []
    if not requires:
        return
    inv = remote_inventory(settings, r)
    if inv["engine"]["store"] == "containerd":
        raise DockyardError(f"{r.host} uses the containerd image store, which cannot load a thin archive: "
                            "ship the full archive (invoke save without --thin-for)")
    missing = set(requires) - set(inv["chain_ids"])
    if missing:
        raise DockyardError(f"{r.host} lacks {len(missing)} of the {len(requires)} base layers this thin "
                            f"archive relies on: it would not load there. Ship the full archive, or a thin "
                            f"one made for this node (invoke save --thin-for={r.url}). Nothing was copied.")


# --- copying -------------------------------------------------------------------------------------

def copy(settings: Settings, r: Remote, paths: ArchivePaths, have: dict[str, str], transport: str,
         companions: int) -> None:
    """The archive to <name>.partial on the node, continuing a cut copy; refuses when space is short."""
    name, size = paths.archive.name, paths.archive.stat().st_size
    offset = int(have.get("partial", 0))
    if offset > size:
        offset = 0
    need = size - offset + companions
    free = int(have.get("free_kb") or 0) * 1024
    if free < need:
        raise DockyardError(f"not enough space in {r.where()}: {console.human(free)} free, the copy needs "
                            f"{console.human(need)}. Free space there or ship to another folder. "
                            "Nothing was copied.")
    # a new copy's file is made new (set -C: never through a link someone planted under its name since)
    partial = rpath(r.dir, name + ".partial")
    mkdir = f"mkdir -p {rpath(r.dir)}" + ("" if offset else f" && rm -f {partial} && (set -C; : > {partial})")
    run_there(settings, r, mkdir, f"preparing the folder {r.dir}")
    if offset:
        print(f"resuming the copy at {console.human(offset)} of {console.human(size)}", file=sys.stderr)
    use = transport or ("rsync" if have.get("rsync") and engine.which("rsync") else "ssh")
    try:
        if use == "rsync":
            _rsync_copy(settings, r, paths.archive, name + ".partial", offset)
        else:
            _append_copy(settings, r, paths.archive, name + ".partial", offset)
    except (engine.Interrupted, KeyboardInterrupt):  # Ctrl-C: what was copied stays there, for the next ship
        raise DockyardError(f"interrupted: the copy of {name} to {r.host} stopped; what arrived is kept: run the same "
                            "`invoke ship` again to continue where it stopped", exit_code=engine.INTERRUPTED) from None


# --info=progress2: "  135,266,304  21%  128.97MB/s  0:00:03"; a number, where the node's own lines come with them
# (a login script's ",  95% of your quota" on stderr was int(''), a traceback), of at most 20 digits and 6 commas (a
# line of 5,000 digits was Python's ValueError converting it)
RSYNC_FRAME = re.compile(r"(\d[\d,]{0,25})\s+\d+%\s")


def _rsync_copy(settings: Settings, r: Remote, local: Path, remote_name: str, offset: int) -> None:
    """rsync's own progress frames, redrawn with \r, drive the copy's bar (in a log, a line now and then)."""
    with console.progress() as bar:
        size = local.stat().st_size
        task = bar.add_task(f"copy {local.name}", total=size, completed=offset)

        def frame(text: str) -> bool:
            if m := RSYNC_FRAME.match(text):
                # the bytes of the file as rsync counts them: a resumed copy's appended ones after what was there
                bar.update(task, completed=min(size, max(offset, int(m.group(1).replace(",", "")))))
                return True
            return False

        engine.run(rsync_argv(settings, r, local, remote_name), what=_copying(r), progress=frame)


def _copying(r: Remote) -> str:
    return f"copying to {r.host} (run the same `invoke ship` again to continue where it stopped)"


def rsync_argv(settings: Settings, r: Remote, local: Path, remote_name: str) -> list[str]:
    """rsync keeps a cut copy (--partial) and continues it, checking the whole file (--append-verify)."""
    return ["rsync", *whole_words(), "--partial", "--append-verify", "--info=progress2", "-e",
            engine.quote(ssh_base(settings, r)), str(local), f"{r.host}:{r.dir}/{remote_name}"]


@functools.cache
def whole_words() -> list[str]:
    """The flag that makes this rsync hand the node's folder to the node's shell as one word: rsync >= 3.2.4
    escapes it unless RSYNC_OLD_ARGS is set (--no-old-args overrides that); an older one (Ubuntu 20.04, RHEL 8)
    split it on blanks and let the shell read `$(...)`, unless told to send it inside its protocol (-s)."""
    out = engine.run(["rsync", "--version"], capture=True, check=False, quiet=True).stdout
    m = re.search(r"version\s+(\d+)\.(\d+)\.(\d+)", out)
    return ["--no-old-args"] if m is None or tuple(map(int, m.groups())) >= (3, 2, 4) else ["--protect-args"]


def append_argv(settings: Settings, r: Remote, remote_name: str) -> list[str]:
    """Without rsync: the missing tail goes over ssh and is appended (the sha256 check comes after)."""
    return ssh_argv(settings, r, f"cat >> {rpath(r.dir, remote_name)}")


def _append_copy(settings: Settings, r: Remote, local: Path, remote_name: str, offset: int) -> None:
    with (console.progress() as bar, open_plain(local, "archive") as f,  # a pipe swapped in since: refused
          engine.Pipeline(append_argv(settings, r, remote_name), stdin=engine.PIPE, what=_copying(r)) as append):
        task = bar.add_task(f"copy {local.name}", total=local.stat().st_size, completed=offset)
        f.seek(offset)
        try:
            while chunk := f.read(engine.CHUNK):
                append.stdin.write(chunk)
                bar.advance(task, len(chunk))
        except BrokenPipeError:  # ssh stopped: its exit code and output say why
            pass
        append.wait()


def companion_files(settings: Settings, paths: ArchivePaths, manifest: dict) -> dict[str, bytes]:
    """What travels beside the archive, by name. The manifest, its signature and the .sha256 as they are (the node
    checks them); load.sh and run.sh as this checkout writes them, never the files found beside the archive: no
    sha256 or signature covers those, and `--load` runs load.sh on the node (anyone who could write the archive's
    folder could have put their own there)."""
    files = {}
    for p, read in ((paths.manifest, paths.manifest_bytes), (paths.signature, paths.signature_bytes),
                    (paths.sha256, paths.sums_bytes)):
        try:  # as untrusted input, as check_set read them: a link to /dev/zero was a MemoryError, a pipe a hang
            files[p.name] = read()
        except FileNotFoundError:  # no signature (where allowed_signers is set, check_set refused that)
            continue
        except DockyardError as e:
            raise DockyardError(f"{e}: refused, nothing was copied") from None
        except OSError as e:  # a folder, no permission
            raise DockyardError(f"cannot read {p}: {e.strerror or e}: refused, nothing was copied") from None
    files["load.sh"] = LOADER_TEMPLATE.read_bytes()
    chosen = runscript.dockyard_variant(manifest["images"])
    if chosen:
        try:
            files["run.sh"] = runscript.render(settings, *chosen).encode()
        except DockyardError as e:  # a variant this checkout does not define: the node can still load the image
            print(f"warning: run.sh not shipped: {e}", file=sys.stderr)
    for companion in ("load.sh", "run.sh"):
        beside = paths.archive.with_name(companion)
        if companion in files and beside.is_file() and _bytes_or_none(beside) != files[companion]:
            print(f"warning: {beside} is not the {companion} this checkout writes (changed, or written by another "
                  f"version): {companion} is not covered by the archive's sha256 or signature, so the node gets "
                  "this checkout's", file=sys.stderr)
    return files


def _bytes_or_none(path: Path) -> bytes | None:
    """A file beside the archive that only a warning compares (load.sh, run.sh), read bounded: None where it is
    no plain file of at most 1 MiB (none of ours is)."""
    try:
        return read_bounded(path, MiB, path.name)
    except (DockyardError, OSError):
        return None


def _put_small(settings: Settings, r: Remote, name: str, content: bytes) -> None:
    """A companion file: written whole to a new .partial (set -C: not through a link planted there), then renamed."""
    final, tmp = rpath(r.dir, name), rpath(r.dir, name + ".partial")
    run_there(settings, r, f"rm -f {tmp} && (set -C; cat > {tmp}) && mv -f {tmp} {final}", f"copying {name}",
              input=content)
