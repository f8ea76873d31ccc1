"""A refused load puts the engine's tags back where they were (issue 27), for `invoke load` and load.sh.

Without an engine: `invoke load`'s roll_back runs against a stub engine (tests/support/fake_engine.py) that keeps
tags and images and records the docker argv it is given; load.sh runs in real sh with a `docker` script first on
PATH. The question is the host side's (which docker commands undo the load, which file reaches docker load), so
these run on hosts without Docker; tests/integration/test_transport_loaders.py loads into a real engine.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from dockyard.common.errors import DockyardError
from dockyard.transport import load as load_mod
from dockyard.transport.layout import write_loader
from tests.support.archive_sets import make_set, reseal
from tests.support.fake_engine import FakeEngine
from tests.support.save_tars import fake_save

A, B, C, K = ("sha256:" + c * 64 for c in "abcd")


def test_a_refused_load_puts_moved_tags_back_and_removes_new_ones(settings, monkeypatch):
    """Before: t:1 names image A, keep:1 names K. The load moves t:1 to B and brings new:1 (image C); then it is
    refused. roll_back tags A as t:1 again (`docker tag A t:1`), untags new:1 without pruning, leaves keep:1 alone
    and removes B and C, which nothing names any more: the engine is as it was."""
    fake = FakeEngine(tags={"t:1": A, "keep:1": K})
    s = fake.install(monkeypatch, settings)
    before = load_mod.tag_snapshot(s)
    fake.images |= {B, C}  # what the refused load did
    fake.tags |= {"t:1": B, "new:1": C}

    said = load_mod.roll_back(s, before, {"t:1", "new:1", "keep:1"})

    assert fake.tags == {"t:1": A, "keep:1": K} and fake.images == {A, K}
    assert fake.docker_calls("tag") == [["tag", A, "t:1"]]
    assert fake.docker_calls("rmi", "--no-prune") == [["rmi", "--no-prune", "new:1"]]
    assert sorted(c for c in fake.docker_calls("rmi") if c[1] != "--no-prune") == [["rmi", B], ["rmi", C]]
    assert not any("keep:1" in c for c in fake.calls if "inspect" not in c)
    assert said == ("\nthe tags the load moved are back where they were: new:1, t:1; the images it brought are "
                    "removed")


def test_a_load_that_moved_nothing_says_nothing(settings, monkeypatch):
    fake = FakeEngine(tags={"t:1": A})
    s = fake.install(monkeypatch, settings)
    assert load_mod.roll_back(s, load_mod.tag_snapshot(s), {"t:1", "never:1"}) == ""
    assert fake.tags == {"t:1": A} and fake.docker_calls("tag") == fake.docker_calls("rmi") == []


@pytest.mark.parametrize("said, tags, images", [("Loaded image: victim:1", {"victim:1": B}, {B}),
                                                ("Loaded image ID: " + C, {}, {C})])
def test_a_load_that_brings_an_image_its_manifest_does_not_name_is_refused_and_undone(tmp_path, settings,
                                                                                      monkeypatch, said, tags, images):
    """docker load reports a name or id the manifest lacks (a tar docker read otherwise than the gate did): the load
    is refused, as load.sh refuses it; victim:1 names the image it named before and what the load brought is
    removed."""
    fake = FakeEngine(tags={"victim:1": K})
    s = fake.install(monkeypatch, settings.model_copy(update={"allowed_signers": ""}))
    paths = make_set(tmp_path)  # its manifest: t:1 = A

    def docker_load(*_):
        fake.images |= {A, *images}
        fake.tags |= {"t:1": A, **tags}
        return ["Loaded image: t:1", said]

    monkeypatch.setattr(load_mod, "load_verified", docker_load)
    with pytest.raises(DockyardError, match=f"holds an image {said.split(': ')[1]}, which its manifest does not name"):
        load_mod.load(s, str(paths.archive))
    assert fake.tags == {"victim:1": K} and fake.images == {K}


def test_a_docker_load_that_exits_0_without_the_image_is_a_failed_load(tmp_path, settings, monkeypatch):
    """pitfalls.md: with the containerd image store, docker load can print "Error unpacking image" and exit 0
    without the image in the engine. The load is checked against the manifest: refused, with docker's own words; a
    tag the archive names that another image holds is said as such."""
    fake = FakeEngine(tags={"other:1": K})
    s = fake.install(monkeypatch, settings.model_copy(update={"allowed_signers": ""}))
    paths = make_set(tmp_path)  # its manifest: t:1 = A

    def docker_load(*_):
        return ["Error unpacking image: failed to extract layer: no space left on device"]  # and nothing loaded

    monkeypatch.setattr(load_mod, "load_verified", docker_load)
    with pytest.raises(DockyardError, match=r"exited 0, but t:1 is missing(.|\n)*Error unpacking image") as e:
        load_mod.load(s, str(paths.archive))
    assert f"loading {paths.archive.name} failed" in str(e.value)
    assert fake.tags == {"other:1": K} and fake.images == {K}
    fake.tags["t:1"] = K  # an image of that name, not the archive's
    with pytest.raises(DockyardError, match=rf"exited 0, but t:1 is {K}, the archive holds {A}"):
        load_mod.load(s, str(paths.archive))


@pytest.mark.parametrize("signal_name, status", [("", 130), ("SIGTERM", 143)])
def test_a_load_interrupted_after_docker_load_says_so_and_is_undone(tmp_path, settings, monkeypatch, signal_name,
                                                                     status):
    """Ctrl-C (or SIGTERM) in `invoke load` after docker load had moved a tag: Invoke ended with status 1 and not a
    word, and the tag stayed moved. Now it is one line with 128 + the signal, and the engine is as it was."""
    fake = FakeEngine(tags={"t:1": K})
    s = fake.install(monkeypatch, settings.model_copy(update={"allowed_signers": ""}))
    paths = make_set(tmp_path)  # its manifest: t:1 = A

    def docker_load(*_):
        fake.images |= {A}
        fake.tags |= {"t:1": A}
        raise KeyboardInterrupt(signal_name)  # as the SIGTERM handler raises it

    monkeypatch.setattr(load_mod, "load_verified", docker_load)
    with pytest.raises(DockyardError, match=rf"loading {paths.archive.name}: interrupted \({signal_name or 'SIGINT'}\); "
                                            "nothing was loaded") as e:
        load_mod.load(s, str(paths.archive))
    assert e.value.exit_code == status
    assert fake.tags == {"t:1": K} and fake.images == {K}


# --- load.sh loads its private copy -----------------------------------------------------------------

DOCKER = """#!/bin/sh
# A stand-in docker client. `docker info` for the engine's root folder, the first thing load.sh asks the engine once
# the archive's copy is verified, is when another writer replaces the archive in the shared folder; `docker load`
# keeps what it reads; the image is in the engine once loaded.
case "$1" in
info) case "$*" in *DockerRootDir*) cp "$CHANGED" "$SHARED" ;; esac ;;
load) cat >"$RECEIVED"; echo "Loaded image: t:1" ;;
image) [ "$2" = inspect ] && [ -e "$RECEIVED" ] && echo "$IMAGE_ID" ;;
esac
exit 0
"""


@pytest.mark.parametrize("method", ["none", "zst"])
def test_load_sh_loads_the_copy_it_verified_not_the_shared_file(tmp_path, method):
    raw, _, _, _ = fake_save()
    other = bytes(b ^ 0x55 for b in raw)
    pack = (lambda b: b) if method == "none" else \
        (lambda b: subprocess.run(["zstd", "-q", "-c"], input=b, capture_output=True, check=True).stdout)
    shared = tmp_path / "shared"
    shared.mkdir()
    paths = make_set(shared, pack(raw), name="t_1.tar" if method == "none" else "t_1.tar.zst")
    reseal(paths, {"tar_bytes": len(raw)})
    changed = tmp_path / "changed"
    changed.write_bytes(pack(other))
    bin_dir, private = tmp_path / "bin", tmp_path / "private"
    bin_dir.mkdir()
    private.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    received = tmp_path / "received"
    image_id = "sha256:" + "a" * 64  # make_set's manifest: t:1=sha256:aaa…
    r = subprocess.run(["sh", write_loader(shared), paths.archive.name], capture_output=True, text=True,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(private), "CHANGED": str(changed),
                            "SHARED": str(paths.archive), "RECEIVED": str(received), "IMAGE_ID": image_id})
    assert paths.archive.read_bytes() == changed.read_bytes(), "the shared archive was not replaced"
    assert r.returncode == 0, r.stderr
    assert received.read_bytes() == raw, "docker load read the shared archive, not the verified copy"
    assert f"loaded t:1 {image_id}" in r.stdout
    assert re.fullmatch(rf"{re.escape(paths.archive.name)}: verified and loaded in [0-9]+ s", r.stdout.splitlines()[-1])
    assert list(private.iterdir()) == []  # the private copy is removed


def _load_of_a(tmp_path, settings, monkeypatch, tags: dict[str, str]) -> tuple[FakeEngine, str]:
    """`invoke load` of an archive whose t:1 is A, on an engine holding `tags`: the fake engine, and what was said."""
    fake = FakeEngine(tags=tags)
    s = fake.install(monkeypatch, settings.model_copy(update={"allowed_signers": ""}))
    paths = make_set(tmp_path)  # its manifest: t:1 = A

    def docker_load(*_):
        fake.images |= {A}
        fake.tags |= {"t:1": A}
        return ["Loaded image: t:1"]

    monkeypatch.setattr(load_mod, "load_verified", docker_load)
    load_mod.load(s, str(paths.archive))
    return fake, paths.archive.name


def test_a_load_that_moves_a_tag_off_another_image_says_so(tmp_path, settings, monkeypatch, capsys):
    """t:1 named image K here; the archive's t:1 is A. docker load moved the tag and K became <none>, and `invoke
    load` said only `loaded t:1 A` (docker's "renaming the old one" line is not shown)."""
    fake, _ = _load_of_a(tmp_path, settings, monkeypatch, {"t:1": K, "keep:1": C})
    said = capsys.readouterr().out
    assert f"loaded t:1 {A}\nreplaced tag t:1 (the image it named before, {K[7:19]}, is now untagged)\n" in said
    assert "keep:1" not in said and fake.tags == {"t:1": A, "keep:1": C}
    assert load_mod.replaced_tags({"t:1": K, "old:1": K}, [("t:1", A)]) == [
        f"replaced tag t:1 (the image it named before, {K[7:19]}, still tagged old:1)"]


def test_a_load_ends_with_what_was_done_and_how_long_it_took(tmp_path, settings, monkeypatch, capsys):
    """On a terminal the bar of the archive's read goes when it ends (transient): what stayed was 'loaded t:1 A',
    with no word of the archive verified nor of the minutes a CUDA image's load takes."""

    _, archive = _load_of_a(tmp_path, settings, monkeypatch, {})
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"loaded t:1 {A}"
    assert re.fullmatch(rf"{re.escape(archive)}: verified and loaded in [0-9]+ s", said[-1]), said
