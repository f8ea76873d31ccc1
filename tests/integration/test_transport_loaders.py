"""The two loaders (`invoke load`, `sh load.sh`) against archives changed under them, with the real engine (issue 27).

An archive swapped between its check and its load (shared scratch, NFS) must not be loaded; a tar that holds an
image its manifest does not name, under a tag this engine already has, must be refused; a refused load must leave
every tag where it was. The images are made with `docker import` from a one-file tar: a few kB each, so every test
takes seconds. Every image made here carries the module's prefix and is removed at the end.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from dockyard import ROOT, engine
from dockyard.transport.layout import ArchivePaths
from dockyard.transport.load import load_sh_tmpdir
from tests.support.cli import INVOKE, invoke

pytestmark = pytest.mark.engine
P = f"dockyard-loaders-test-{os.getpid()}"
APP, VICTIM, EVIL = f"{P}-app:1", f"{P}-victim:1", f"{P}-evil:1"
LOADERS = ["invoke load", "sh load.sh"]


def docker(settings, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(engine.docker(settings, *args), capture_output=True, check=check, **kw)


def image_id(settings, ref: str) -> str | None:
    meta = engine.image_inspect(settings, ref)
    return meta["Id"] if meta else None


def imported(settings, ref: str, content: bytes) -> str:
    """An image of one file, made with `docker import`; returns its id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("content")
        info.size = len(content)
        t.addfile(info, io.BytesIO(content))
    docker(settings, "import", "-", ref, input=buf.getvalue())
    return image_id(settings, ref)


def saved_tar(settings, *refs: str, rename: dict[str, str] | None = None, config_as: dict[str, str] | None = None):
    """`docker save` of refs, with tags renamed in manifest.json and repositories (`rename`: old → new) and
    config files renamed (`config_as`: image id → the id whose name it takes), as someone crafting a tar would."""
    raw = docker(settings, "save", *refs).stdout
    rename, config_as = rename or {}, config_as or {}
    src, out = tarfile.open(fileobj=io.BytesIO(raw)), io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name in ("manifest.json", "repositories"):
                text = data.decode()
                for old, new in rename.items():
                    text = text.replace(f'"{old}"', f'"{new}"')  # manifest.json: "repo:tag"
                    repo, tag = old.rsplit(":", 1)
                    new_repo, new_tag = new.rsplit(":", 1)
                    text = text.replace(f'"{repo}":{{"{tag}"', f'"{new_repo}":{{"{new_tag}"')  # repositories
                for old, new in config_as.items():
                    text = text.replace(old.removeprefix("sha256:"), new.removeprefix("sha256:"))
                data = text.encode()
            for old, new in config_as.items():
                if m.name == old.removeprefix("sha256:") + ".json":
                    m.name = new.removeprefix("sha256:") + ".json"
            if data is not None:
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def zstd(raw: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


def save(ref: str, out: Path) -> ArchivePaths:
    r = invoke("save", f"--image={ref}", f"--out={out}")
    assert r.returncode == 0, r.stderr
    return ArchivePaths(next(out.glob("*.tar.zst")))


def reseal(paths: ArchivePaths, archive: bytes, tar_bytes: int) -> None:
    """Put another archive into a set and make the manifest and .sha256 agree with it (an unsigned set)."""
    paths.archive.write_bytes(archive)
    m = json.loads(paths.manifest.read_text())
    m.update(archive_sha256=hashlib.sha256(archive).hexdigest(), archive_bytes=len(archive), tar_bytes=tar_bytes)
    paths.manifest.write_text(json.dumps(m, indent=2) + "\n")
    paths.sha256.write_text(f"{m['archive_sha256']}  {paths.archive.name}\n"
                            f"{hashlib.sha256(paths.manifest.read_bytes()).hexdigest()}  {paths.manifest.name}\n")


def run_loader(loader: str, paths: ArchivePaths, env: dict | None = None) -> subprocess.CompletedProcess:
    if loader == "invoke load":
        return invoke("load", f"--file={paths.archive}", env=env)
    return subprocess.run(["sh", str(paths.loader), str(paths.archive)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def images(settings, engine_ready):
    """app (the image archives carry), victim (a tag this engine already has), evil (what an attacker adds):
    victim stays; app and evil are saved, then removed, so that a load has to bring them."""
    made = {"victim": imported(settings, VICTIM, b"the engine's own image\n")}
    made["app"] = imported(settings, APP, b"the image the archive carries\n")
    made["evil"] = imported(settings, EVIL, b"what an attacker slips in\n")
    yield made
    for ref in (APP, VICTIM, EVIL):
        docker(settings, "rmi", ref, check=False)
    for i in made.values():
        docker(settings, "rmi", i, check=False)


def forget(settings, *refs: str) -> None:
    for ref in refs:
        docker(settings, "rmi", ref)


def swapping_zstd(folder: Path, target: Path, replacement: Path, how: str) -> dict:
    """A `zstd` first on PATH that, the first time it decompresses, swaps `target` for `replacement` (renamed over
    it, or written into it), then runs the real zstd: the file changes between the loader's check and its load."""
    folder.mkdir()
    real = engine.which("zstd")
    swap = f'mv "{replacement}" "{target}"' if how == "rename" else f'cat "{replacement}" > "{target}"'
    (folder / "zstd").write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -d"*) [ -e "{folder}/swapped" ] || {{ {swap}; : > "{folder}/swapped"; }} ;; esac\n'
        f'exec "{real}" "$@"\n')
    (folder / "zstd").chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.parametrize("how", ["rename", "overwrite"])
@pytest.mark.parametrize("loader", LOADERS)
def test_an_archive_swapped_after_its_check_is_never_what_gets_loaded(settings, images, tmp_path, loader, how):
    """The swapped-in archive holds the right image (so a check after loading passes) and a foreign one under a
    tag this engine has. Either the verified bytes load (exit 0) or the load is refused; the foreign image never
    reaches the engine and the victim's tag stays on its image."""
    paths = save(APP, tmp_path / "set")
    evil = tmp_path / "evil.tar.zst"
    evil.write_bytes(zstd(saved_tar(settings, APP, EVIL, rename={EVIL: VICTIM})))
    forget(settings, APP, EVIL)
    r = run_loader(loader, paths, swapping_zstd(tmp_path / "bin", paths.archive, evil, how))
    assert (tmp_path / "bin" / "swapped").exists(), "the hook never ran: " + r.stderr
    assert image_id(settings, VICTIM) == images["victim"], r.stdout + r.stderr
    assert image_id(settings, images["evil"]) is None
    assert "Traceback" not in r.stderr
    if r.returncode == 0:
        assert image_id(settings, APP) == images["app"] and f"loaded {APP} {images['app']}" in r.stdout
    else:
        assert "nothing was loaded" in r.stderr and image_id(settings, APP) is None
    if how == "rename" or loader == "sh load.sh":  # the file the loader opened, or its private copy: the verified bytes
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("loader", LOADERS)
def test_a_tar_holding_a_second_image_under_an_existing_tag_is_refused_and_the_tag_stays(settings, images,
                                                                                          tmp_path, loader):
    paths = save(APP, tmp_path / "set")
    raw = saved_tar(settings, APP, EVIL, rename={EVIL: VICTIM})
    reseal(paths, zstd(raw), len(raw))
    forget(settings, APP, EVIL)
    r = run_loader(loader, paths)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert VICTIM in r.stderr and "manifest does not name" in r.stderr
    assert image_id(settings, VICTIM) == images["victim"]
    assert image_id(settings, images["evil"]) is None and image_id(settings, APP) is None


@pytest.mark.parametrize("loader", LOADERS)
def test_a_refused_load_puts_back_the_tags_it_moved(settings, images, tmp_path, loader):
    """A tar whose manifest.json names the archive's image but whose config is another's: its names pass every
    check before loading, docker loads the other image under the archive's tag, the check after loading refuses
    it. The tag goes back to the image it named before, and the foreign image leaves the engine."""
    paths = save(APP, tmp_path / "set")
    raw = saved_tar(settings, EVIL, rename={EVIL: APP}, config_as={images["evil"]: images["app"]})
    reseal(paths, zstd(raw), len(raw))
    forget(settings, APP, EVIL)
    docker(settings, "tag", images["victim"], APP)  # the archive's tag already names an image here
    r = run_loader(loader, paths)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"{APP} is " in r.stderr and "back where they were" in r.stderr
    assert image_id(settings, APP) == images["victim"]
    assert image_id(settings, images["evil"]) is None


@pytest.mark.parametrize("loader", LOADERS)
def test_an_archive_that_fails_to_decompress_after_its_whole_tar_loads_nothing(settings, images, tmp_path, loader):
    """The archive's own frames, then a cut frame of zeros: its tar, end marker and all, decompresses before the
    stream fails. The engine must not get that tar while the loader refuses the archive (it did, in the race
    between killing `docker load` and the daemon finishing its import, when load.sh fed the stream as it came)."""
    paths = save(APP, tmp_path / "set")
    tar_bytes = json.loads(paths.manifest.read_text())["tar_bytes"]
    zeros = 256 << 20
    reseal(paths, paths.archive.read_bytes() + zstd(bytes(zeros))[:-8], tar_bytes + zeros)
    forget(settings, APP)
    r = run_loader(loader, paths)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "nothing was loaded" in r.stderr, r.stderr  # invoke load: the tail after the tar's end; load.sh: the frame
    assert image_id(settings, APP) is None and image_id(settings, images["app"]) is None


@pytest.mark.parametrize("loader", LOADERS)
def test_a_refused_load_takes_back_the_name_it_gave_an_image_already_here(settings, images, tmp_path, loader):
    """As above, docker loads another image under the archive's tag and the check after loading refuses it; that
    image was already here under its own name. The archive's tag, which named nothing before, names nothing after,
    and the image keeps its own name."""
    paths = save(APP, tmp_path / "set")
    raw = saved_tar(settings, EVIL, rename={EVIL: APP}, config_as={images["evil"]: images["app"]})
    reseal(paths, zstd(raw), len(raw))
    forget(settings, APP)
    r = run_loader(loader, paths)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert image_id(settings, APP) is None, r.stderr
    assert image_id(settings, EVIL) == images["evil"]


def docker_holding_after_load(settings, folder: Path) -> Path:
    """A docker client that, once `docker load` has run, holds the next `image inspect` (the load's own check of what
    it loaded) until it is killed, and marks `held`: the moment between docker load moving tags and the check."""
    folder.mkdir()
    real = engine.docker_binary(settings.docker)
    (folder / "docker").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = load ]; then "{real}" "$@"; rc=$?; : > "{folder}/loaded"; exit $rc; fi\n'
        f'if [ -e "{folder}/loaded" ] && [ "$1 $2" = "image inspect" ]; then : > "{folder}/held"; sleep 600; fi\n'
        f'exec "{real}" "$@"\n')
    (folder / "docker").chmod(0o755)
    return folder / "docker"


def killed_after_docker_load(settings, images, tmp_path, archive: str, loader: str) -> tuple[ArchivePaths, int, str]:
    """An archive set of APP (`archive` "refused": another image under its tag, which only the load's own check can
    tell) whose tag names the user's own image here alone, loaded by `loader` ("invoke load" or "sh load.sh") and
    killed outright (SIGKILL to its process group) once docker load has moved the tag, before that check. Returns the
    set, the pid killed and the image docker load left under the tag."""
    import signal
    import time

    paths = save(APP, tmp_path / "set")
    if archive == "refused":  # docker loads another image under the archive's tag: only the check can tell
        raw = saved_tar(settings, EVIL, rename={EVIL: APP}, config_as={images["evil"]: images["app"]})
        reseal(paths, zstd(raw), len(raw))
        forget(settings, EVIL)
    forget(settings, APP)
    docker(settings, "tag", images["victim"], APP)  # the archive's tag names the user's own image here, alone
    docker(settings, "rmi", VICTIM)
    client = docker_holding_after_load(settings, tmp_path / "bin")
    argv, env, wait = {
        "invoke load": ([*INVOKE, "load", f"--file={paths.archive}"], {"INVOKE_DOCKYARD_DOCKER": str(client)}, 60),
        "sh load.sh": (["sh", str(paths.loader), str(paths.archive)],
                       {"PATH": f"{client.parent}:{os.environ['PATH']}"}, 120)}[loader]
    killed = subprocess.Popen(argv, cwd=ROOT, start_new_session=True, env={**os.environ, **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + wait
    while not (client.parent / "held").exists():
        assert killed.poll() is None and time.monotonic() < deadline, "the load ended before its check"
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    brought = images["app" if archive == "whole" else "evil"]
    assert image_id(settings, APP) == brought  # as docker load left it
    return paths, killed.pid, brought


def said_what_moved(settings, images, r: subprocess.CompletedProcess, paths: ArchivePaths, archive: str, killed: int,
                    brought: str, said_by: str) -> None:
    """Checks what the load after the one killed outright (killed_after_docker_load) says, as `said_by` ("invoke load",
    or "sh load.sh", whose lines start with `load.sh:`) says it: the tag it replaced, or where the tag is left and how
    to put it back (then done here, as the user would)."""
    at = "load.sh: " if said_by == "sh load.sh" else ""
    victim = images["victim"].removeprefix("sha256:")[:12]
    if archive == "whole":
        assert r.returncode == 0, r.stderr
        assert (f"{at}replaced tag {APP} (the image it named before, {victim}, is now untagged): by a load of "
                f"{paths.archive.name} killed outright (process {killed}) before it could say so") in r.stdout
        assert "nothing to do" in r.stdout
    else:
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert (f"{at}warning: {APP} names {brought.removeprefix('sha256:')[:12]}, not the image {paths.archive.name} "
                f"holds: a load of it killed outright (process {killed}) before its check left it so; it named "
                f"{victim} before. Put it back: docker tag {victim} {APP}") in r.stderr
        docker(settings, "tag", victim, APP)
        assert image_id(settings, APP) == images["victim"]


@pytest.mark.parametrize("archive", ["whole", "refused"])
@pytest.mark.parametrize("loader", LOADERS)
def test_a_load_killed_outright_after_docker_load_moved_tags_is_said_by_the_next_load(settings, images, tmp_path,
                                                                                         loader, archive):
    """`kill -9` of `invoke load` (the OOM killer, a CI job's end) once docker load has moved the archive's tag from
    the user's image, before the load's own check: nothing ran to say it or to put it back. A whole archive had left
    the user's image untagged without the line a load says of it, and the next load said "nothing to do"; one the
    check would have refused left the tag on the image docker load brought, and the next load of it left it there.
    The next load says either, once: the tag it replaced, or where the tag was and how to put it back. The same for
    `sh load.sh` (a node with only sh and Docker), whose private folder, which the next load.sh removes, holds the tags
    as they were: the next load.sh says it, as `invoke load` does."""
    paths, killed, brought = killed_after_docker_load(settings, images, tmp_path, archive, loader)

    said_what_moved(settings, images, run_loader(loader, paths), paths, archive, killed, brought, loader)
    again = run_loader(loader, paths)
    assert "killed outright" not in again.stdout + again.stderr  # said once


@pytest.mark.parametrize("archive", ["whole", "refused"])
def test_a_load_sh_killed_outright_after_docker_load_moved_tags_is_said_by_the_next_invoke_load(settings, images,
                                                                                                 tmp_path, archive):
    """`kill -9` of `sh load.sh` once docker load has moved the archive's tag from the user's image, then `invoke load`
    (the node has the checkout too): `invoke load` read only its own journal and said nothing of the moved tag, and
    the private folder, the archive's size, stayed. It now reads the killed load.sh's folder (the plain files load.sh
    keeps for the next load.sh), says what moved as for its own, removes the folder, and the next load.sh says it no
    more."""
    paths, killed, brought = killed_after_docker_load(settings, images, tmp_path, archive, "sh load.sh")
    left = list(load_sh_tmpdir().glob(f"dockyard-load.{killed}.*"))
    assert len(left) == 1, "the killed load.sh left its folder"

    r = run_loader("invoke load", paths)
    said_what_moved(settings, images, r, paths, archive, killed, brought, "invoke load")
    assert f"removed {left[0]}, the private copy of a load.sh killed before it could remove it" in r.stderr
    assert not left[0].exists()
    again = run_loader("sh load.sh", paths)
    assert "killed outright" not in again.stdout + again.stderr  # said once
