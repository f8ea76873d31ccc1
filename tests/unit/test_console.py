"""Sizes in words, free-space checks and the quoted end of a command's output."""

from __future__ import annotations

import io

import pytest

from dockyard import console
from dockyard.common.errors import DockyardError


def test_sizes_read_like_df_h():
    assert [console.human(n) for n in (0, 999, 1000, 1_234_567, 5e9, 2.5e12)] == [
        "0 B", "999 B", "1.0 kB", "1.2 MB", "5.0 GB", "2.5 TB"]


def test_a_full_disk_is_refused_before_writing(tmp_path):
    with pytest.raises(DockyardError, match="not enough space in .*needs about"):
        console.check_free(tmp_path / "new", 1 << 62, "the archive", "Free some space.")
    assert not (tmp_path / "new").exists()
    console.check_free(tmp_path / "new" / "deeper", 1, "the archive", "")


def test_output_tails_keep_the_last_lines_indented():
    lines = [f"line {i}" for i in range(30)]
    assert console.tail(lines).splitlines() == [f"  | line {i}" for i in range(10, 30)]
    # rsync's progress, rewritten in place: the last state alone, as the terminal showed it
    assert console.tail(["\r 32,768 0% 1.2MB/s\r 102,137,856 2% 98MB/s\r", "rsync error: code 255"]) == \
        "  |  102,137,856 2% 98MB/s\n  | rsync error: code 255"
    f = io.BytesIO("\n".join(lines).encode() + b"\n\n")
    assert console.last_lines(f) == lines[10:]
