"""Save decisions without an engine: what --thin-for records, and refusing before writing."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from dockyard.common.errors import DockyardError
from dockyard.settings import Settings
from dockyard.transport import inventory
from dockyard.transport import load as load_mod
from dockyard.transport import save as save_mod
from dockyard.transport.layout import ArchivePaths
from tests.support.archive_sets import keypair
from tests.support.save_tars import fake_save, saving_docker

BASE, RUN = "sha256:" + "a" * 64, "sha256:" + "b" * 64
IMAGE = {"ref": "x:1", "id": "sha256:" + "0" * 64, "tags": [], "diff_ids": [BASE, RUN],
         "chain_ids": inventory.chain_ids([BASE, RUN]), "bytes": 0}


def test_thin_for_a_containerd_node_writes_a_full_archive(tmp_path, monkeypatch, capsys):
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"format": inventory.INVENTORY_FORMAT, "host": "n7",
                               "engine": {"store": "containerd"}, "chain_ids": [BASE]}))
    monkeypatch.setattr(inventory.engine, "engine_info", lambda settings: {"DriverStatus": []})
    assert save_mod.thin_record(Settings(), [IMAGE], str(inv)) is None
    err = capsys.readouterr().err
    assert "the target" in err and "containerd image store" in err and "writing a full archive" in err
    inv.write_text(json.dumps({"format": inventory.INVENTORY_FORMAT, "host": "n7",
                               "engine": {"store": "classic"}, "chain_ids": [BASE]}))
    thin = save_mod.thin_record(Settings(), [IMAGE], str(inv))
    assert thin == {"for": str(inv), "target_host": "n7", "omitted": [BASE], "requires": [BASE], "held": None}


def test_save_refuses_bad_choices_before_asking_the_engine(monkeypatch):
    monkeypatch.setattr(inventory.engine, "image_inspect", lambda settings, ref: pytest.fail("asked the engine"))
    with pytest.raises(DockyardError, match="choose zstd, gzip or none"):
        save_mod.save(Settings(), image="x:1", compress="xz")
    with pytest.raises(DockyardError, match="does not fit --compress=zstd"):
        save_mod.save(Settings(), image="x:1", level=40)


def test_save_by_variant_names_that_variants_image_without_a_gpu(monkeypatch, settings):
    """`invoke save --variant=cu132` on a GPU-less build host: the CUDA image, not the cpu one auto would pick."""
    asked = []
    monkeypatch.setattr(inventory, "inspect_images", lambda s, refs: asked.extend(refs) or pytest.fail("stop"))
    with pytest.raises(pytest.fail.Exception):
        save_mod.save(settings, variant="cu132")
    assert asked == [f"{settings.image_name}:0.1.0-cu132"]
    with pytest.raises(DockyardError, match="unknown variant 'cu999'"):
        save_mod.save(settings, variant="cu999")
    with pytest.raises(DockyardError, match="--image or --variant, not both"):
        save_mod.save(settings, image="x:1", variant="cpu")


def test_the_load_command_save_prints_can_be_pasted_into_a_shell():
    hint = save_mod.load_hint(Path("/data/a b/t_2.tar.zst"))
    command, beside = hint.removeprefix("load it: ").split("  (or, without the project: ")
    assert shlex.split(command) == ["invoke", "load", "--file=/data/a b/t_2.tar.zst"]
    assert shlex.split(beside.removesuffix(")")) == ["sh", "load.sh", "t_2.tar.zst"]


def test_a_save_ends_with_the_commands_that_take_the_set_to_a_node(tmp_path, monkeypatch, capsys):
    """A save on a build host ended "load it: invoke load ...", though the image is already there: the step after
    it, the ship (or carrying the folder), went unsaid; and a full save's wait note spoke of "those a thin archive
    leaves out". Now it prints a pasteable `invoke ship` of the archive it wrote, and names a thin archive only for
    a thin save."""
    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "save-docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    # as large as an image whose save makes the engine wait (the note is printed from 1 GiB)
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": 2 << 30, "chain_ids": []}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    monkeypatch.setattr(save_mod.console, "check_free", lambda *a, **k: 1 << 40)  # 2 GiB declared, a few kB written
    save_mod.save(Settings(docker=str(docker), layer_cache_gb=0), image="t:2", out=str(tmp_path / "dist a"),
                  compress="none")
    out, err = capsys.readouterr()
    ship_line = next((line for line in out.splitlines() if line.startswith("ship it: ")), None)
    assert ship_line is not None, out
    command = ship_line.removeprefix("ship it: ").split("  (or carry ")[0]
    archive = next((tmp_path / "dist a").glob("*.tar"))
    assert shlex.split(command) == ["invoke", "ship", f"--file={archive}", "--to=NODE:/dir"]
    assert "docker save reads every layer" in err and "thin" not in err, err


def test_the_files_a_save_says_to_carry_are_those_it_wrote_and_carried_alone_they_verify_on_the_node(
        tmp_path, monkeypatch, capsys):
    """A signed save ended "(or carry DIST/ there: the archive, its .sha256 and .manifest.json, load.sh, run.sh)":
    the .manifest.json.sig went unsaid, and a node given those files and allowed signers refused the set ("not
    signed", met walking save -> carry -> load.sh); a save of an image other than dockyard's named a run.sh it
    never wrote. The line names the files the save left in the folder, and those alone verify where signatures
    are required."""
    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "save-docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": len(raw), "chain_ids": []}  # not a dockyard image
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    key = keypair(tmp_path, "release")
    dist, node = tmp_path / "dist", tmp_path / "node"
    save_mod.save(Settings(docker=str(docker), layer_cache_gb=0), image="t:2", out=str(dist), compress="none",
                  sign=str(key))
    ship_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ship it: "))
    named = [shlex.split(name)[0] for name in
             ship_line.split("  (or carry ", 1)[1].split(" there: ", 1)[1].removesuffix(")").split(", ")]
    assert sorted(named) == sorted(f.name for f in dist.iterdir()), ship_line
    node.mkdir()
    for name in named:
        (node / name).write_bytes((dist / name).read_bytes())
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'release@site namespaces="{load_mod.SIGN_NAMESPACE}" '
                       + " ".join(key.with_suffix(".pub").read_text().split()[:2]) + "\n")
    archive = next(node.glob("*.tar"))
    load_mod.verify(Settings(allowed_signers=str(allowed)), ArchivePaths(archive))


def test_a_thin_save_says_the_size_docker_save_streamed_beside_the_rate_it_streamed_at(tmp_path, monkeypatch,
                                                                                            capsys):
    """A thin save ended "wrote ...: 4.7 kB from 48.1 kB of tar in 20.3 s (the tar read at 103.9 MB/s)": 48 kB in
    20 s is not 104 MB/s, since the rate was of the 2.1 GB docker save streamed. The line names that size too."""
    raw, image, big_id, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "save-docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": len(raw), "chain_ids": inventory.chain_ids(
        image["diff_ids"])}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    monkeypatch.setattr(save_mod, "thin_record", lambda settings, images, thin_for: {
        "for": thin_for, "target_host": "n7", "omitted": [big_id], "requires": inventory.chain_ids([big_id])})
    manifest = save_mod.save(Settings(docker=str(docker), layer_cache_gb=0), image="t:2",
                             out=str(tmp_path / "dist"), compress="none", thin_for="inv.json")
    wrote = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote "))
    assert manifest["tar_bytes"] < len(raw) // 2, manifest["tar_bytes"]  # the big layer left out
    assert f"from {save_mod.console.human(manifest['tar_bytes'])} of tar" in wrote, wrote
    streamed = re.search(r"docker save's ([\d.]+) kB of tar read at ", wrote)
    assert streamed and float(streamed[1]) * 1000 > 0.9 * len(raw), wrote  # its end-of-archive padding aside


@pytest.mark.parametrize("has_the_image", [True, False, None])
def test_a_thin_save_for_a_node_holding_every_layer_says_whether_the_node_already_has_the_image(
        tmp_path, monkeypatch, capsys, has_the_image):
    """`invoke save --thin-for=...` for a node holding every layer wrote a 4 kB archive and said to ship and load it,
    as for any other. Such an archive carries the image's config and tag alone: loaded where the node holds the
    layers but not the image (a rebuild that changed a label), `docker load` makes the image; where the node has the
    image itself, it changes nothing. The save now says which: the name it adds, or that the node already has the
    image, with nothing to ship and how to train there; an inventory naming no images (load.sh's: None here) cannot
    tell, and says so."""
    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "save-docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    chains = inventory.chain_ids(image["diff_ids"])
    found = {**image, "tags": ["t:2"], "labels": {"dockyard.variant": "cpu"}, "bytes": len(raw), "chain_ids": chains}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    monkeypatch.setattr(inventory.engine, "engine_info", lambda settings: {})  # a classic store here
    other = {"id": "sha256:" + "9" * 64, "tags": ["t:1"], "diff_ids": image["diff_ids"], "chain_ids": chains}
    held = {"id": image["id"], "tags": ["t:2"], "diff_ids": image["diff_ids"], "chain_ids": chains}
    inv = tmp_path / "node7.json"
    inv.write_text(json.dumps({"format": inventory.INVENTORY_FORMAT, "host": "node7", "engine": {"store": "classic"},
                               "images": {True: [other, held], False: [other], None: []}[has_the_image],
                               "chain_ids": chains}))
    manifest = save_mod.save(Settings(docker=str(docker), layer_cache_gb=0), image="t:2", out=str(tmp_path / "dist"),
                             compress="none", thin_for=str(inv))
    out = capsys.readouterr().out
    assert not any(layer["included"] for layer in manifest["layers"])
    assert (tmp_path / "dist" / "t_2-thin.tar").is_file()  # written all the same: a save, ship and load still work
    if has_the_image:
        assert f"{inv} already has t:2 (the same image id) and every layer: nothing to ship or load there" in out, out
        assert "train there: invoke run --variant=cpu" in out and "ship it:" not in out, out
    else:
        assert f"{inv} holds every layer already: this archive" in out, out
        assert "carries the config and name of t:2 alone, which loading it there adds" in out and "ship it:" in out, out
        assert ("where the node lacks it (its inventory, load.sh's, names no images)" in out) == (has_the_image is None)


def test_a_link_another_user_planted_in_the_temporary_folder_is_never_written_through(tmp_path, monkeypatch):
    """The save's lock used a name in /tmp everyone could compute (dockyard-save-<sha of the archive path>.lock) and
    opened it with "w": a link planted there by another user emptied whatever it pointed at (the saving user's
    ~/.ssh/authorized_keys). Now the lock lives in the user's own 0700 folder and is opened without following a link
    or truncating; a folder in its place that is not the user's own is refused."""
    import hashlib
    import os
    import tempfile

    from dockyard.common import locks
    from dockyard.transport.layout import ArchivePaths

    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA user@host\n")
    paths = ArchivePaths(tmp_path / "dist" / "x_1.tar.zst")
    key = hashlib.sha256(str(paths.archive).encode()).hexdigest()[:16]
    (shared / f"dockyard-save-{key}.lock").symlink_to(victim)  # the name in /tmp the lock had
    with save_mod.exclusive(paths):
        pass
    assert victim.read_text() == "ssh-ed25519 AAAA user@host\n"
    private = shared / f"dockyard-{os.geteuid()}"
    assert private.is_dir() and private.stat().st_mode & 0o777 == 0o700
    # a link planted inside that folder (by the user's own processes) is not followed either
    key = hashlib.sha256(str(paths.archive.parent / paths.base).encode()).hexdigest()[:16]
    (private / f"save-{key}.lock").unlink(missing_ok=True)  # gone as the save ended
    (private / f"save-{key}.lock").symlink_to(victim)
    with pytest.raises(DockyardError, match="cannot open the lock file .* remove it if it is a link"):
        with save_mod.exclusive(paths):
            pass
    assert victim.read_text() == "ssh-ed25519 AAAA user@host\n"
    # the private folder made by someone else first (a link to theirs, or open to others): refused, naming it
    for lock in private.iterdir():
        lock.unlink()
    private.rmdir()
    private.symlink_to(tmp_path)
    with pytest.raises(DockyardError, match=f"{private} is a symbolic link, not a private folder of yours"):
        locks.private_folder()
    private.unlink()
    private.mkdir(mode=0o777)
    private.chmod(0o777)
    with pytest.raises(DockyardError, match="writable by others"):
        with save_mod.exclusive(paths):
            pass


def test_a_save_removes_its_lock_file_and_one_that_opened_it_as_it_went_does_not_run_beside_the_next(tmp_path,
                                                                                                     monkeypatch):
    """Every archive path ever saved left its empty lock file in the private folder for good
    (`$TMPDIR/dockyard-<uid>/save-<hash>.lock`). It goes as the save ends. Removing it must not let two saves run at
    once: a save that opened the file just before the one holding it removed it and ended gets the lock of a file no
    name leads to, while the next save makes a new one under the name and locks that; it opens the name again, and is
    refused while that save runs."""
    import fcntl
    import tempfile

    from dockyard.common import locks

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    paths = ArchivePaths(tmp_path / "dist" / "x_1.tar.zst")
    with save_mod.exclusive(paths):
        assert [p.name for p in locks.private_folder().iterdir()][0].startswith("save-")
    assert list(locks.private_folder().iterdir()) == [], "the lock file outlived the save"

    first, then = save_mod.exclusive(paths), save_mod.exclusive(paths)
    first.__enter__()
    flock, raced = fcntl.flock, []

    def late(fd, op):  # the second save, between its open and its lock: the first ends, a third starts
        if not raced:
            raced.append(fd)
            first.__exit__(None, None, None)
            then.__enter__()
        return flock(fd, op)

    monkeypatch.setattr(locks.fcntl, "flock", late)
    try:
        with pytest.raises(DockyardError, match="another save of x_1.tar.zst into .* is under way"):
            with save_mod.exclusive(paths):
                pass
    finally:
        then.__exit__(None, None, None)
    assert raced and list(locks.private_folder().iterdir()) == []


def test_a_save_into_a_shared_folder_writes_through_no_link_planted_there(tmp_path, monkeypatch, settings):
    """`invoke save --out=` a folder others may write (a team's scratch): every file was first written under
    `<name>.<pid>.partial`, opened to write and then chmod 755 (load.sh, run.sh) through whatever was there. A link
    planted under those names for the pids to come made the save overwrite the file it pointed at with load.sh and
    make it 0755 (a private key, world-readable). Now the names cannot be guessed and are made new (O_EXCL)."""
    import os

    from dockyard.transport.layout import ArchivePaths

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    key = tmp_path / "id_ed25519"
    key.write_text("PRIVATE KEY\n")
    key.chmod(0o600)
    paths = ArchivePaths(shared / "dockyard_0.1.0-cpu.tar.zst")
    for name in ("load.sh", "run.sh", paths.archive.name, paths.manifest.name, paths.sha256.name):
        for pid in range(os.getpid() - 50, os.getpid() + 50):  # the pids another user can see coming
            (shared / f"{name}.{pid}.partial").symlink_to(key)

    def streamed(settings, images, sink, **kw):
        sink(b"archive bytes")
        return save_mod.Streamed(pump=None, out_bytes=13, out_sha256="0" * 64, seconds=0.1)

    monkeypatch.setattr(save_mod, "stream_save", streamed)
    monkeypatch.setattr(save_mod, "_manifest", lambda *a: {"archive": paths.archive.name})
    images = [{"ref": "dockyard:0.1.0-cpu", "labels": {"dockyard.variant": "cpu"}}]
    save_mod.write_set(settings, paths, images, "zstd", 3, None, None, None)
    assert key.read_text() == "PRIVATE KEY\n" and key.stat().st_mode & 0o777 == 0o600
    assert paths.archive.read_bytes() == b"archive bytes" and (shared / "run.sh").read_text().startswith("#!/bin/sh")
    assert os.access(shared / "load.sh", os.X_OK) and not (shared / "load.sh").is_symlink()
    assert not [p for p in shared.iterdir() if p.name.endswith(".partial") and not p.is_symlink()]


def test_a_layer_cache_that_is_a_file_is_named_as_the_layer_cache_not_the_output_folder(tmp_path):
    """`INVOKE_DOCKYARD_LAYER_CACHE=/etc/passwd invoke save` said "failed in images/dist: Not a directory"."""
    import errno

    from dockyard.transport.frames import LayerCache
    from dockyard.transport.layout import ArchivePaths

    blocker = tmp_path / "passwd"
    blocker.write_text("a file\n")
    cache = LayerCache(blocker, "zstd", 2, 1 << 30)
    with pytest.raises(OSError) as failed:
        cache.dir.mkdir(parents=True)
    assert failed.value.errno == errno.ENOTDIR
    said = str(save_mod.write_failed(failed.value, ArchivePaths(tmp_path / "dist" / "x.tar.zst"), cache))
    assert said == (f"saving x.tar.zst failed: {cache.dir} (the layer cache: the layer_cache setting): Not a "
                    "directory; nothing was published.")


def test_a_save_in_another_compression_removes_the_archive_its_companions_no_longer_describe(tmp_path, monkeypatch,
                                                                                            capsys):
    """README step 3 suggests saving again with --compress=gzip for a node without zstd: the second save rewrote
    x.sha256 and x.manifest.json, and the .tar.zst beside them stayed, refused by `invoke load` and load.sh as if
    tampered. Now the save removes it and says so; the set left loads with either loader's checks."""
    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "docker"  # `docker save` prints the tar; nothing else is asked of it
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": len(raw), "chain_ids": []}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    s = Settings(docker=str(docker), layer_cache_gb=0)
    out = tmp_path / "dist"

    save_mod.save(s, image="t:2", out=str(out))
    capsys.readouterr()
    save_mod.save(s, image="t:2", out=str(out), compress="gzip")

    said = capsys.readouterr().out
    assert ("removed t_2.tar.zst (an earlier save): t_2.sha256 and t_2.manifest.json now describe t_2.tar.gz, so "
            "no loader would take it") in said
    assert sorted(p.name for p in out.iterdir()) == ["load.sh", "t_2.manifest.json", "t_2.sha256", "t_2.tar.gz"]
    assert load_mod.verify(s, ArchivePaths(out / "t_2.tar.gz"))["compression"]["method"] == "gzip"


def test_a_save_refused_says_what_to_type_instead(tmp_path, monkeypatch, settings):
    """`save --variant=cu132` unbuilt said `build it (invoke build)`, which builds auto's variant; `--out=` a file
    said "File exists"; `--thin-for=` a host name said "no inventory 127.0.0.1"."""
    monkeypatch.setattr(inventory.engine, "image_inspect", lambda settings, ref: None)
    with pytest.raises(DockyardError, match=r"no image .*-cu132 in the engine: build it \(`invoke build "
                                            r"--variant=cu132`\)"):
        save_mod.save(settings, variant="cu132")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DockyardError) as e:
        save_mod.save(settings, image="x:1", out=str(tmp_path / "a-file"))
    assert str(e.value) == f"--out={tmp_path / 'a-file'} names a file; give a folder (the archive set is several files)"
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [IMAGE])
    with pytest.raises(DockyardError, match=r"^no inventory 127\.0\.0\.1 \(for a node over ssh: "
                                            r"--thin-for=ssh://127\.0\.0\.1\): make one"):
        save_mod.save(settings, image="x:1", out=str(tmp_path / "dist"), thin_for="127.0.0.1")
    with pytest.raises(DockyardError, match=r"^no inventory node7\.json: make one"):
        save_mod.save(settings, image="x:1", out=str(tmp_path / "dist"), thin_for="node7.json")


def _saving_t2(tmp_path, monkeypatch, **layers):
    """An image t:2 a stand-in `docker save` streams (fake_save's tar), and the settings that save it with a layer
    cache in tmp_path: (the tar, the settings)."""
    raw, image, _, _ = fake_save(**layers)
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": len(raw), "chain_ids": []}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    return raw, Settings(docker=str(docker), layer_cache=str(tmp_path / "cache"))


def test_a_layer_cache_without_room_beside_the_archive_keeps_nothing_instead_of_failing_the_save(tmp_path, monkeypatch,
                                                                                                capsys):
    """The free-space check counted the archive alone, and the layer cache (on the same disk, ~/.cache) keeps a second
    copy of every large layer: `invoke save --variant=cu128` (a 4.1 GB archive and 4.1 GB of frames) on a disk of
    6 GB passed the check and failed minutes in, "no space left in images/dist". Where the disk has room for the
    archive but not for both, the save keeps no frames this time, says so, and writes the archive."""
    import shutil
    from collections import namedtuple

    raw, s = _saving_t2(tmp_path, monkeypatch, big_bytes=2 << 20)  # a layer large enough for a frame of its own
    archive_need = int(len(raw) * save_mod.COMPRESSED_SHARE["zstd"]) + save_mod.MARGIN
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, archive_need + (1 << 20)))

    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"))

    said = capsys.readouterr().out
    assert "layer cache: keeping no new layers this save, as " in said and "beside the archive's" in said
    assert not list((tmp_path / "cache").rglob("*.frame")) and "kept" not in said
    assert load_mod.verify(s, ArchivePaths(tmp_path / "dist" / "t_2.tar.zst"))["archive"] == "t_2.tar.zst"

    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, 1 << 40))  # room: kept, as ever
    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"))
    assert len(list((tmp_path / "cache").rglob("*.frame"))) == 1 and "layer cache: kept" in capsys.readouterr().out


def test_a_disk_that_may_hold_the_archive_is_tried_not_refused(tmp_path, monkeypatch, capsys):
    """The free-space check took every archive to be 60 % of its tar, where the images compress to 30-40 % (the cpu
    image: 625 MB of 2.07 GB), and refused a save that had room: 1 GB free for the cpu image was "needs about
    1.3 GB". Now a save that may fit is tried, said first (a disk that fills stops it and removes what it wrote);
    one that cannot fit even at the best compression is refused before anything is written."""
    import shutil
    from collections import namedtuple

    raw, s = _saving_t2(tmp_path, monkeypatch)
    usage = namedtuple("usage", "total used free")

    room = int(len(raw) * 0.4) + save_mod.MARGIN  # room for an archive of 40 % of the tar, as the CUDA images make
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, room))
    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"))
    said = capsys.readouterr().err
    assert "warning: " in said and "may take up to" in said and "the save stops and removes what it wrote" in said
    assert load_mod.verify(s, ArchivePaths(tmp_path / "dist" / "t_2.tar.zst"))["archive"] == "t_2.tar.zst"

    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, save_mod.MARGIN // 2))  # none at all
    with pytest.raises(DockyardError, match="not enough space in .*other: .* free, the archive needs about"):
        save_mod.save(s, image="t:2", out=str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()


def test_the_save_bar_ends_at_the_tar_docker_save_streamed_never_past_its_total(tmp_path, monkeypatch, capsys):
    """The bar's total was the images' size (their layers), and docker save streams more (the tar's headers, each
    layer's headers for its files, config and manifest files): saving cu128 the bar ended at `8.5/8.4 GB`. The
    total now follows the tar past the images' size, and the bar ends at 100 % of what was read."""
    from rich.progress import Progress

    from dockyard import console

    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    layers = 300_000 + len("recipe v2\n")  # what the engine reports as the image's size: the files in its layers
    found = {**image, "tags": ["t:2"], "labels": {}, "bytes": layers, "chain_ids": []}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    bars = []
    monkeypatch.setattr(console, "progress", lambda things=False: bars.append(Progress(disable=True)) or bars[-1])
    s = Settings(docker=str(docker), layer_cache_gb=0)

    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"), compress="none")

    (task,) = bars[0].tasks  # the tar read, up to its end-of-archive marker
    assert task.completed == task.total > layers and task.finished
    read = console.human(task.completed)

    monkeypatch.setattr(console, "progress", lambda things=False: console.Lines(things))  # a log: the same count
    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"), compress="none")
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"save t_2.tar: {read} of {read} (100%) in ")


WRITER_ON = """
import socket, sys
from pathlib import Path
socket.gethostname = lambda: sys.argv[1]  # the node whose save this process stands for
from dockyard.common import locks
from dockyard.transport.frames import LayerCache
out, cache = Path(sys.argv[2]), LayerCache(Path(sys.argv[3]), "zstd", 3, 1 << 30)
for p in (locks.partial(out / "x_1.tar.zst"), cache.partial("ab" * 32)):
    p.write_bytes(b"half a layer")
"""


def test_a_save_leaves_the_partial_files_another_node_writes_in_a_shared_folder(tmp_path, capsys):
    """A save's output folder and layer cache on shared storage (NFS: a home's ~/.cache, a team's --out): a second
    node's save took the partial archive and frame a first node's save was writing for those of a save killed outright
    (their pid runs on no process here) and removed them under it, and that save failed. Now a partial file names its
    host: another node's is left to it, this host's of a writer that is gone is removed."""
    import socket
    import subprocess
    import sys

    from dockyard.common import locks
    from dockyard.transport.frames import LayerCache

    out, cache = tmp_path / "dist", LayerCache(tmp_path / "cache", "zstd", 3, 1 << 30)
    out.mkdir()
    for host in ("node-b", socket.gethostname()):  # another node's writer, then one of this host's; each ends (pid gone)
        subprocess.run([sys.executable, "-c", WRITER_ON, host, str(out), str(tmp_path / "cache")], check=True,
                       cwd=Path(save_mod.__file__).parents[2])
    written = sorted(p.name for p in [*out.iterdir(), *cache.dir.iterdir()])
    assert len(written) == 4, written
    save_mod.remove_left_behind(ArchivePaths(out / "x_1.tar.zst"), cache)
    assert "removed 2 partial file(s) of 24 B" in capsys.readouterr().out
    kept = sorted(p.name for p in [*out.iterdir(), *cache.dir.iterdir()])
    assert len(kept) == 2 and all(f".{locks.host_tag()}-" not in name for name in kept), kept


def test_a_load_sh_or_run_sh_of_the_users_own_in_the_out_folder_is_refused_before_the_save(tmp_path, monkeypatch):
    """`invoke save --out=.` in a project of one's own replaced its run.sh (and a load.sh) with dockyard's, made
    executable, without a word, after minutes of saving. Now a file there that no save wrote is refused before the
    engine is asked to save; an earlier save's own are replaced, as ever, and run.sh is left alone by an image that
    writes none."""
    docker, image = saving_docker(tmp_path)
    ours = {**image, "labels": {"dockyard.variant": "cpu"}}
    found = [ours]
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: found)
    s = Settings(docker=str(docker), layer_cache_gb=0)
    project = tmp_path / "project"
    project.mkdir()
    for name in ("run.sh", "load.sh"):
        (project / name).write_text("#!/bin/sh\necho my own\n")
        with pytest.raises(DockyardError, match=rf"^--out={project} holds {name}, which `invoke save` did not write "
                                                r"\(it writes load.sh and run.sh beside the archive, replacing its "
                                                r"own\): give another --out, or move that file away$"):
            save_mod.save(s, image="t:2", out=str(project), compress="none")
        assert [p.name for p in project.iterdir()] == [name], "nothing written beside it"
        assert (project / name).read_text() == "#!/bin/sh\necho my own\n"
        (project / name).unlink()
    save_mod.save(s, image="t:2", out=str(project), compress="none")
    assert {"load.sh", "run.sh"} <= {p.name for p in project.iterdir()}
    save_mod.save(s, image="t:2", out=str(project), compress="gzip")  # an earlier save's companions are replaced
    (project / "run.sh").write_text("#!/bin/sh\necho my own\n")
    found = [{**ours, "labels": {}}]  # no dockyard image: no run.sh written, the user's stays
    save_mod.save(s, image="t:2", out=str(project), compress="none")
    assert (project / "run.sh").read_text() == "#!/bin/sh\necho my own\n"


@pytest.mark.parametrize("kind", ["link", "empty", "fifo"])
def test_a_link_an_empty_file_or_a_fifo_named_run_sh_in_the_out_folder_is_refused_not_replaced(tmp_path, monkeypatch,
                                                                                               kind):
    """A save writes its load.sh and run.sh as plain files holding their templates' second line; anything else under
    those names is the user's. A project's run.sh that links to its real script (run.sh -> scripts/train.sh), an empty
    one (`touch run.sh`, to be filled later) or a fifo was replaced by dockyard's, executable, without a word, after the
    save: what ./run.sh started had changed. Now each is refused before the engine is asked, and left as it was."""
    docker, image = saving_docker(tmp_path)
    monkeypatch.setattr(inventory, "inspect_images",
                        lambda settings, refs: [{**image, "labels": {"dockyard.variant": "cpu"}}])
    s = Settings(docker=str(docker), layer_cache_gb=0)
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "scripts" / "train.sh").write_text("#!/bin/sh\necho my own\n")
    for name in ("run.sh", "load.sh"):
        there = project / name
        if kind == "link":
            there.symlink_to("scripts/train.sh")
        elif kind == "empty":
            there.touch()
        else:
            os.mkfifo(there)
        with pytest.raises(DockyardError, match=rf"^--out={project} holds {name}, which `invoke save` did not write"):
            save_mod.save(s, image="t:2", out=str(project), compress="none")
        assert sorted(p.name for p in project.iterdir()) == sorted([name, "scripts"]), "nothing written beside it"
        assert there.is_symlink() if kind == "link" else there.stat().st_size == 0
        assert (project / "scripts" / "train.sh").read_text() == "#!/bin/sh\necho my own\n"
        there.unlink()


def test_images_whose_refs_differ_only_in_their_separators_are_saved_side_by_side(tmp_path, monkeypatch):
    """Every `/`, `:` and `@` of a ref was an `_` of the archive's name: `invoke save --image=team/img:1` and then
    `--image=team_img:1` into one folder both wrote team_img_1.tar.zst, and the second replaced the first's archive
    (and its manifest and checksums) without a word. Now each image has an archive of its own, each verifying and
    naming its image; a ref of the plain name:tag form keeps the name it had (t_2.tar.zst, which load.sh and the docs
    show)."""
    raw, image, _, _ = fake_save()
    (tmp_path / "save.tar").write_bytes(raw)
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {tmp_path / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [
        {**image, "ref": ref, "tags": [ref], "labels": {}, "bytes": len(raw), "chain_ids": []} for ref in refs])
    s = Settings(docker=str(docker), layer_cache_gb=0)
    out = tmp_path / "dist"
    refs = ["team/img:1", "team_img:1", "team:img_1", "team/img/1", "t:2-thin", "t/2", "t:2"]
    for ref in refs:
        save_mod.save(s, image=ref, out=str(out))
    archives = sorted(out.glob("*.tar.zst"))
    assert len(archives) == len(refs), [p.name for p in archives]
    assert {load_mod.verify(s, ArchivePaths(p))["images"][0]["ref"] for p in archives} == set(refs)
    assert (out / "t_2.tar.zst").is_file(), "a plain ref's archive keeps its name"
    save_mod.save(s, image="team/img:1", out=str(out))  # the same image again: its own archive, replaced
    assert len(list(out.glob("*.tar.zst"))) == len(refs)


def test_an_archive_set_is_never_written_where_a_runs_container_can_rewrite_its_load_sh(tmp_path, monkeypatch):
    """load.sh and run.sh are what the user runs on the node the archive goes to (`sh load.sh`, `sh run.sh`), and the
    runs folder (and the caches) every run's container can write: saved there (--out=runs/dist, or a dist_dir inside
    the runs folder), code in any later run's container could rewrite them before they ran. Such an --out or
    dist_dir is refused before the engine is asked to save, nothing written; a folder beside the runs folder saves."""
    docker, image = saving_docker(tmp_path)
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [{**image, "labels": {"dockyard.variant":
                                                                                                    "cpu"}}])
    runs, hf = tmp_path / "runs", tmp_path / "hf"
    s = Settings(docker=str(docker), layer_cache_gb=0, runs_dir=runs, hf_cache=hf)
    runs.mkdir()
    (tmp_path / "to-runs").symlink_to(runs)
    for out in (runs / "dist", tmp_path / "to-runs" / "dist", hf / "x", runs / ".." / "runs"):
        with pytest.raises(DockyardError, match=r"^--out .* is inside .*which every run's container can write: a run "
                                                r"could change what is written there before you load the archive "
                                                r"with its load.sh .*give --out=DIR outside it$"):
            save_mod.save(s, image="t:2", out=str(out), compress="none")
    with pytest.raises(DockyardError, match=r"^the dist_dir setting's folder .* is inside .* \(the runs_dir setting\)"
                                            r".*INVOKE_DOCKYARD_DIST_DIR"):
        save_mod.save(s.model_copy(update={"dist_dir": runs / "dist"}), image="t:2", compress="none")
    assert list(runs.iterdir()) == [] and not hf.exists()
    save_mod.save(s, image="t:2", out=str(tmp_path / "dist"), compress="none")
    assert {"load.sh", "run.sh"} <= {p.name for p in (tmp_path / "dist").iterdir()}
