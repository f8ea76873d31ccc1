"""Ship's copy commands without a node: rsync resumes, the ssh fallback appends."""

from __future__ import annotations

import shlex
from pathlib import Path

from dockyard.settings import Settings
from dockyard.transport import ship
from dockyard.transport.remote import Remote


def test_rsync_resumes_and_checks_the_whole_file():
    argv = ship.rsync_argv(Settings(), Remote("n", "/d", 2222), Path("/a/x.tar.zst"), "x.tar.zst.partial")
    assert {"--partial", "--append-verify"} <= set(argv)
    assert argv[argv.index("-e") + 1].startswith("ssh -p 2222 -o ConnectTimeout=")  # the copy is bounded too
    assert argv[-2:] == ["/a/x.tar.zst", "n:/d/x.tar.zst.partial"]


def test_append_fallback_appends_to_the_partial_file():
    argv = ship.append_argv(Settings(), Remote("n", "~/in box"), "x.tar.zst.partial")
    assert argv[-1] == "sh -c " + shlex.quote("cat >> \"$HOME\"/'in box/x.tar.zst.partial'")
