"""`invoke setup`'s base image, imported into the real engine: only a whole import takes the base's name."""

from __future__ import annotations

import os
import subprocess

import pytest

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.images import setup


def _images(settings) -> set[str]:
    out = subprocess.run(engine.docker(settings, "images", "-aq", "--no-trunc"), capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_a_tar_that_fails_leaves_no_image_under_the_base_s_name(settings, engine_ready, tmp_path):
    """A setup whose rootfs could not be read whole (here: it is not there) piped tar's nothing into `docker import`,
    which named an empty image dockyard-base:bookworm; every build after started FROM it. Now the import is named
    only once tar and docker import both succeeded, and what a failed one made is removed."""
    name = f"dockyard-test-base:import-{os.getpid()}"
    before = _images(settings)
    tar = ["tar", "-C", str(tmp_path / "rootfs"), "-c", "."]
    with pytest.raises(DockyardError, match=r"importing dockyard-test-base:.* failed \(exit 2\): tar -C ") as e:
        setup.import_base(settings, tar, engine.docker(settings, "import", "-"), name)
    assert "rootfs: Cannot open" in str(e.value)
    assert engine.image_inspect(settings, name) is None, "the base's name was given to a failed import"
    assert _images(settings) == before, "a failed import left an image behind"

    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    (tmp_path / "rootfs" / "bin" / "sh").write_text("#!/bin/true\n")
    try:
        setup.import_base(settings, tar, engine.docker(settings, "import", "-"), name)
        assert engine.image_inspect(settings, name)["Size"] > 0
    finally:
        subprocess.run(engine.docker(settings, "rmi", name), capture_output=True)
