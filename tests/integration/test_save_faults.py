"""`invoke save` where the disk says no (issue 11): a read-only output folder, a disk that fills up mid-save, and
`ship` whose remote end stops reading. Each gets a short error naming the folder or node, a non-zero exit, and
nothing half-written: no published archive, no `.partial` file in the folder or the layer cache.

The filesystems are real: small tmpfs mounts under the test's folder, unmounted at the end. The image saved is
the registry-free base image (one ~200 MB layer), so a save takes seconds.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.settings import ROOT
from tests.support.cli import invoke

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
        argv = [sys.executable, "-m", "invoke", "save", f"--image={settings.base_image_cpu}", f"--out={out}"]
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
        "  *) printf 'docker=/usr/bin/docker\\nzstd=/usr/bin/zstd\\nfree_kb=1000000\\n' ;;\nesac\n")
    fake_ssh.chmod(0o755)
    cache = tmp_path / "cache"
    r = invoke("ship", f"--image={settings.base_image_cpu}", "--to=node9",
               env={"INVOKE_DOCKYARD_SSH": str(fake_ssh), "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "node9 stopped reading the stream" in r.stderr and "closed by remote host" in r.stderr
    assert partial_files(cache) == []
