"""Archives where the disk, the link or the archive itself says no (issue 11).

`invoke save` into a read-only folder or onto a disk that fills up mid-save, `ship` whose remote end stops
reading: a short error naming the folder or node, a non-zero exit, and nothing half-written (no published
archive, no `.partial` file in the folder or the layer cache). An archive that decompresses to more than its
manifest declares: `invoke load` and load.sh both stop there and load nothing. A node that never answers: ship
and save --thin-for give up in bounded time, naming it.

The filesystems are real: small tmpfs mounts under the test's folder, unmounted at the end. The images are the
registry-free base image (one ~200 MB layer) and one small layer on it, so each test takes seconds.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from dockyard import engine
from dockyard.settings import ROOT
from dockyard.transport.layout import write_loader
from tests.support import node2
from tests.support.archive_sets import make_set, reseal
from tests.support.cli import INVOKE, invoke

pytestmark = pytest.mark.engine


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, *options: str):
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", folder], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", folder], check=True)


def partial_files(*folders: Path) -> list[str]:
    return [p for f in folders for p in glob.glob(f"{f}/**/*partial*", recursive=True)
            + glob.glob(f"{f}/**/.*partial*", recursive=True)]


def fill(folder: Path) -> None:
    """Take every free byte of the filesystem of `folder`, as another program writing there would."""
    with open(folder / "filler", "wb") as f:
        block = b"\0" * (1 << 20)
        while True:
            try:
                f.write(block)
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return


def test_a_save_into_a_read_only_folder_says_so_and_writes_nothing(settings, engine_ready, tmp_path):
    cache = tmp_path / "cache"
    with tmpfs(tmp_path / "ro", "2g", "ro") as out:
        r = invoke("save", f"--image={settings.base_image_cpu}", f"--out={out}",
                   env={"INVOKE_DOCKYARD_LAYER_CACHE": str(cache)})
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{out} is not writable (Read-only file system)" in r.stderr and "nothing was published" in r.stderr
        assert os.listdir(out) == []
    assert partial_files(cache) == []


def test_a_disk_that_fills_up_mid_save_leaves_nothing_half_written(settings, engine_ready, tmp_path):
    """The free-space check passes; another program then takes the rest of the disk while the archive is written."""
    cache = tmp_path / "cache"
    with tmpfs(tmp_path / "small", "300m") as out:
        argv = [*INVOKE, "save", f"--image={settings.base_image_cpu}", f"--out={out}"]
        save = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not glob.glob(f"{out}/*.partial") and time.monotonic() < deadline and save.poll() is None:
            time.sleep(0.02)
        assert save.poll() is None, "the save ended before the disk filled: " + save.communicate()[1][-2000:]
        fill(out)
        _, err = save.communicate(timeout=300)
        assert save.returncode == 1 and "Traceback" not in err, err
        assert f"no space left in {out}" in err and "nothing was published" in err
        assert os.listdir(out) == ["filler"]
    assert partial_files(cache) == []
    assert all(p.suffix in (".frame", ".sum", ".json") for p in cache.rglob("*") if p.is_file())


def test_a_ship_whose_remote_end_stops_reading_says_which_node(settings, engine_ready, tmp_path):
    """The stream to a node whose connection drops after 64 kB (ssh exits 255): the node is named, no traceback,
    and the layer cache keeps no partial frame."""
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(
        "#!/bin/sh\n# [options] host command: answers like a node with docker and zstd, drops the load's stream\n"
        'for last; do :; done\ncase "$last" in\n'
        "  *'docker load'*) head -c 65536 >/dev/null; echo 'Connection to node9 closed by remote host.' >&2; exit 255 ;;\n"
        "  *'docker info'*) printf '{\"Driver\": \"overlay2\"}\\nnull\\n' ;;  # holds no image yet\n"
        "  *) printf 'docker=/usr/bin/docker\\nzstd=/usr/bin/zstd\\nfree_kb=1000000\\n' ;;\nesac\n")
    fake_ssh.chmod(0o755)
    cache = tmp_path / "cache"
    r = invoke("ship", f"--image={settings.base_image_cpu}", "--to=node9",
               env={"INVOKE_DOCKYARD_SSH": str(fake_ssh), "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "node9 stopped reading the stream" in r.stderr and "closed by remote host" in r.stderr
    assert partial_files(cache) == []


def test_an_archive_that_decompresses_to_more_than_declared_loads_nothing(settings, engine_ready, tmp_path):
    """A manifest that under-declares its tar (rewritten, with a .sha256 to match: only a signature would
    tell): `invoke load` and load.sh stop at what it declares, docker load is stopped before its input ends."""
    ref = f"dockyard-h3-bomb-{os.getpid()}:v1"
    (tmp_path / "blob").write_bytes(os.urandom(3_000_000))
    (tmp_path / "Dockerfile").write_text(f"FROM {settings.base_image_cpu}\nCOPY blob /blob\n")
    docker = [engine.docker_binary(settings.docker)]
    subprocess.run([*docker, "build", "-q", "-t", ref, str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, **engine.build_env()})
    try:
        dist = tmp_path / "dist"
        r = invoke("save", f"--image={ref}", f"--out={dist}", env={"INVOKE_DOCKYARD_LAYER_CACHE": str(tmp_path / "c")})
        assert r.returncode == 0, r.stderr
        subprocess.run([*docker, "image", "rm", ref], check=True, capture_output=True)
        archive = next(dist.glob("*.tar.zst"))
        mpath, spath = archive.with_name(archive.name[:-8] + ".manifest.json"), archive.with_name(archive.name[:-8] + ".sha256")
        good = mpath.read_text(), spath.read_text()
        manifest = json.loads(good[0])
        manifest["tar_bytes"] = 4096
        mpath.write_text(json.dumps(manifest, indent=2) + "\n")
        spath.write_text(spath.read_text().splitlines()[0] + f"\n{hashlib.sha256(mpath.read_bytes()).hexdigest()}"
                         f"  {mpath.name}\n")

        r = invoke("load", f"--file={archive}")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "decompresses to more than its manifest declares (4096 bytes of tar)" in r.stderr
        assert engine.image_inspect(settings, ref) is None
        r = subprocess.run(["sh", dist / "load.sh", archive.name], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "decompresses to more than its manifest declares (4096 bytes" in r.stderr, r.stderr
        assert engine.image_inspect(settings, ref) is None

        mpath.write_text(good[0])  # the set as saved loads through the same capped path, both ways
        spath.write_text(good[1])
        r = invoke("load", f"--file={archive}")
        assert r.returncode == 0 and f"loaded {ref}" in r.stdout, r.stderr
        subprocess.run([*docker, "image", "rm", ref], check=True, capture_output=True)
        r = subprocess.run(["sh", dist / "load.sh", archive.name], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"loaded {ref}" in r.stdout, r.stderr
    finally:
        subprocess.run([*docker, "image", "rm", "-f", ref], capture_output=True)


def bomb_tar(ref: str, inflated: int) -> tuple[bytes, str]:
    """A docker-save tar (classic layout) whose one layer file is gzip: `inflated` zeros in a few kB. docker load
    inflates such a layer by itself (moby's DecompressStream), so its tar is tiny and what it unpacks is not."""
    layer = tarfile.TarInfo("zeros.bin")
    layer.size = inflated
    plain = layer.tobuf(format=tarfile.USTAR_FORMAT) + bytes(inflated + (-inflated) % 512 + 1024)
    diff_id = "sha256:" + hashlib.sha256(plain).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    image_id = hashlib.sha256(config).hexdigest()
    files = {"l1/layer.tar": gzip.compress(plain), f"{image_id}.json": config,
             "manifest.json": json.dumps([{"Config": f"{image_id}.json", "RepoTags": [ref],
                                           "Layers": ["l1/layer.tar"]}]).encode()}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue(), "sha256:" + image_id


def both_loaders_refuse(settings, tmp_path: Path, raw: bytes, ref: str, image_id: str, load_says: str,
                        sh_says: str) -> None:
    """The tar `raw`, as a set of a few kB: `invoke load`, then load.sh, refuse it with their words, and load
    nothing."""
    assert len(raw) < 100_000
    paths = make_set(tmp_path, zstd_of(raw), name="bomb_1.tar.zst", tag=ref)
    reseal(paths, {"tar_bytes": len(raw), "images": [{"ref": ref, "tags": [ref], "id": image_id, "diff_ids": []}],
                   "load_sh": {"check_images": f"{ref}={image_id}", "require_chains": "", "need_kb": "200000"}})
    write_loader(tmp_path)
    try:
        r = invoke("load", f"--file={paths.archive}")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert load_says in r.stderr and "nothing was loaded" in r.stderr, r.stderr
        assert engine.image_inspect(settings, ref) is None
        r = subprocess.run(["sh", tmp_path / "load.sh", paths.archive.name], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 1 and sh_says in r.stderr and "nothing was loaded" in r.stderr, r.stderr
        assert engine.image_inspect(settings, ref) is None
    finally:
        subprocess.run([engine.docker_binary(settings.docker), "image", "rm", "-f", ref], capture_output=True)


def test_an_archive_whose_layer_is_compressed_inside_its_tar_loads_nothing(settings, engine_ready, tmp_path):
    """The red-team's bomb: the tar within its declared size, but one layer file gzip-compressed (64 MiB of zeros
    in 65 kB; the same at 1000:1 fills a node's disk from a few MB). Both loaders refuse it before docker load
    sees its end, naming the file; nothing is loaded."""
    ref = f"dockyard-h3-gzip-bomb-{os.getpid()}:v1"
    raw, image_id = bomb_tar(ref, 64 << 20)
    both_loaders_refuse(settings, tmp_path, raw, ref, image_id, "the tar's l1/layer.tar is gzip-compressed",
                        "the tar's l1/layer.tar is compressed")


def sparse_bomb_tar(folder: Path, ref: str, inflated: int, where: str) -> tuple[bytes, str]:
    """A docker-save tar (classic layout) of a few kB holding a sparse file of `inflated` bytes, one byte of data
    at its end: inside the layer's own tar (`where` "layer"), or beside the layer in the tar itself ("tar")."""
    files = folder / "files"
    files.mkdir()
    with open(files / "zeros.bin", "wb") as f:
        f.truncate(inflated - 1)
        f.seek(inflated - 1)
        f.write(b"x")
    sparse = ["--sparse", "--format=posix", "--sparse-version=1.0"]
    (files / "l1").mkdir()
    (files / "hello.txt").write_text("hello\n")
    inside = ["zeros.bin"] if where == "layer" else ["hello.txt"]
    subprocess.run(["tar", *sparse, "-C", str(files), "-cf", str(files / "l1" / "layer.tar"), *inside], check=True)
    plain = (files / "l1" / "layer.tar").read_bytes()
    diff_id = "sha256:" + hashlib.sha256(plain).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    image_id = hashlib.sha256(config).hexdigest()
    (files / f"{image_id}.json").write_bytes(config)
    (files / "manifest.json").write_text(json.dumps([{"Config": f"{image_id}.json", "RepoTags": [ref],
                                                      "Layers": ["l1/layer.tar"]}]))
    outer = ["l1/layer.tar", f"{image_id}.json", "manifest.json"] + (["zeros.bin"] if where == "tar" else [])
    subprocess.run(["tar", *sparse, "-C", str(files), "-cf", str(folder / "saved.tar"), *outer], check=True)
    return (folder / "saved.tar").read_bytes(), "sha256:" + image_id


@pytest.mark.parametrize("where", ["layer", "tar"])
def test_an_archive_holding_a_sparse_file_loads_nothing(settings, engine_ready, tmp_path, where):
    """The red team's second bomb: 64 MiB of holes in a few kB, within every size the manifest declares. docker
    load writes a sparse file's holes out in full (a 649-byte archive wrote 1 GiB of the engine's disk), in a
    layer or, while it unpacks the tar, in its own scratch folder. Both loaders refuse it; nothing is loaded."""
    ref = f"dockyard-sparse-bomb-{where}-{os.getpid()}:v1"
    raw, image_id = sparse_bomb_tar(tmp_path, ref, 64 << 20, where)
    if where == "layer":
        both_loaders_refuse(settings, tmp_path, raw, ref, image_id,
                            "the tar's l1/layer.tar holds a sparse file ('zeros.bin')",
                            "the tar's l1/layer.tar holds a sparse file")
    else:
        both_loaders_refuse(settings, tmp_path, raw, ref, image_id, "the tar holds a sparse file",
                            "the tar of bomb_1.tar.zst holds a sparse file")


def zstd_of(raw: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


def test_a_node_that_never_answers_fails_in_bounded_time_naming_it(settings, engine_ready, tmp_path):
    """Without a connect timeout, ssh waits until TCP gives up (about two minutes); with it, 15 s. `invoke ship` and
    `invoke save --thin-for` meet the silent node at once: the 15 s each sits out is a wait, not work."""
    image = f"--image={settings.base_image_cpu}"
    with node2.silent_host() as (inside, addr):
        args = {"ship": ["ship", image, f"--to={addr}"],
                "save": ["save", image, f"--thin-for=ssh://{addr}", f"--out={tmp_path}"]}
        started = time.monotonic()
        procs = {task: subprocess.Popen([*inside, *INVOKE, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True) for task, argv in args.items()}
        said, took = {}, {}
        try:
            for task, p in procs.items():
                said[task] = p.communicate(timeout=max(1, 90 - (time.monotonic() - started)))[1]
                took[task] = time.monotonic() - started
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
    for task, p in procs.items():
        err = said[task]
        assert p.returncode == 1 and "Traceback" not in err, (task, err)
        assert f"ssh to {addr} failed (ssh: connect to host {addr} port 22: Connection timed out)" in err, (task, err)
        # 15 s of ssh's ConnectTimeout, and invoke's own start, slow on a loaded CI host; without the timeout,
        # TCP's own retries: about two minutes (the bound of 90 s fails that first)
        assert "ConnectTimeout" in err and took[task] < 75, (task, took[task])
    assert os.listdir(tmp_path) == []


def descendants(pid: int) -> list[int]:
    kids = [int(k) for k in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return kids + [d for k in kids for d in descendants(k)]


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # it ended meanwhile
        return ""


def test_a_compressor_killed_mid_save_is_named_and_nothing_is_published(settings, engine_ready, tmp_path):
    """The compressor of a layer dies (the kernel's OOM killer, an operator): the save says which command died
    and how, rather than `Broken pipe`, and publishes nothing."""
    out, cache = tmp_path / "dist", tmp_path / "cache"
    argv = [*INVOKE, "save", f"--image={settings.base_image_cpu}", f"--out={out}",
            "--compress=gzip", "--level=9"]
    save = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, gzip = time.monotonic() + 60, []
    while not gzip and time.monotonic() < deadline and save.poll() is None:
        gzip = [p for p in descendants(save.pid) if command_name(p) in ("gzip", "pigz")
                and partial_files(cache)]  # a layer's own compressor is running
        time.sleep(0.02)
    assert gzip and save.poll() is None, "no layer compressor to stop: " + save.communicate()[1][-2000:]
    os.kill(gzip[-1], 9)
    _, err = save.communicate(timeout=120)
    assert save.returncode == 1 and "Traceback" not in err, err
    assert "compressing a layer failed (exit -9)" in err and "Broken pipe" not in err
    assert os.listdir(out) == []
    assert partial_files(out, cache) == []


def test_the_partial_files_of_a_save_killed_outright_are_removed_by_the_next_save(settings, engine_ready, tmp_path):
    """`kill -9` (the OOM killer, a closed CI job) of a save mid-layer: its partial archive in --out and its partial
    frame in the layer cache, the size of the compressed image, stayed there for good, and the next save said
    nothing of them. The next save removes them and says so; a partial file whose process still runs is kept."""
    out, cache = tmp_path / "dist", tmp_path / "cache"
    env = {**os.environ, "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)}
    argv = [*INVOKE, "save", f"--image={settings.base_image_cpu}", f"--out={out}"]
    save = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not (partial_files(cache) and any(os.path.getsize(p) for p in partial_files(out))):  # mid-layer
        assert save.poll() is None and time.monotonic() < deadline, "the save ended before a layer was half written"
        time.sleep(0.02)
    os.killpg(save.pid, 9)
    save.wait()
    left = partial_files(out, cache)
    assert len(left) == 2, left
    live = out / f"{Path(left[0]).name.split('.partial')[0].rsplit('.', 2)[0]}.{os.getpid()}.0123456789ab.partial"
    live.write_bytes(b"x")  # as another save of this user's, still running, might hold it (ours runs: it is kept)
    r = invoke("save", f"--image={settings.base_image_cpu}", f"--out={out}", env=env)
    assert r.returncode == 0, r.stderr
    assert partial_files(out, cache) == [str(live)]
    assert "removed 2 partial file(s) of " in r.stdout and "left by a save killed before it could remove them" in r.stdout
