"""An archive set's names and compression choices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dockyard.common.errors import DockyardError
from dockyard.transport import layout


def test_an_archive_set_is_named_after_its_images_and_a_foreign_file_is_refused():
    assert layout.archive_name(["dockyard:0.1.0-cpu"], "zstd", False) == "dockyard_0.1.0-cpu.tar.zst"
    # a ref of a registry path: named so that no other ref's archive has its name (a_1+reg_b_2-thin said reg_b:2 too)
    assert re.fullmatch(r"a_1\+reg_b_2@[0-9a-f]{12}-thin\.tar\.gz", layout.archive_name(["a:1", "reg/b:2"], "gzip", True))
    p = layout.ArchivePaths(Path("/d/x_1-thin.tar.zst"))
    assert (p.base, p.method, p.sha256.name, p.manifest.name, p.signature.name, p.loader.name) == (
        "x_1-thin", "zstd", "x_1-thin.sha256", "x_1-thin.manifest.json", "x_1-thin.manifest.json.sig", "load.sh")
    with pytest.raises(DockyardError, match="not an image archive"):
        _ = layout.ArchivePaths(Path("/d/x.zip")).base


def test_compression_choices():
    assert layout.check_method("zstd", 0) == 2 and layout.check_method("gzip", 9) == 9
    with pytest.raises(DockyardError, match="choose zstd, gzip or none"):
        layout.check_method("xz", 0)
    with pytest.raises(DockyardError, match="1..9"):
        layout.check_method("gzip", 12)
    assert layout.compressor_argv("zstd", 3) == ["zstd", "-T0", "-3", "-q", "-c"]
    assert "--ultra" in layout.compressor_argv("zstd", 22)
    assert layout.compressor_argv("none", 0) is None
    assert layout.decompressor_argv("none") is None


def test_read_sums_reads_sha256sum_files(tmp_path):
    sums = tmp_path / "x.sha256"
    sums.write_text(f"{'a' * 64}  x.tar.zst\n{'b' * 64}  *x.manifest.json\n\n")
    assert layout.read_sums(sums) == {"x.tar.zst": "a" * 64, "x.manifest.json": "b" * 64}
