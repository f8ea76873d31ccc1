"""Ship plans without a node: destinations, ssh/rsync argv, the probe script (run by a real sh here)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from dockyard import ship
from dockyard.errors import DockyardError
from dockyard.settings import Settings


def test_parse_destinations():
    assert ship.parse_to("gpu@node7:/srv/images/", 2222, "~/.ssh/k") == ship.Remote("gpu@node7", "/srv/images", 2222, "~/.ssh/k")
    assert ship.parse_to("node7:dist").dir == "dist"
    assert ship.parse_to("node7", need_dir=False).host == "node7"
    with pytest.raises(DockyardError, match=r"\[user@\]host:/dir"):
        ship.parse_to("node7")
    assert ship.parse_ssh_url("ssh://me@node7:2200") == ship.Remote("me@node7", port=2200)
    assert ship.parse_ssh_url("ssh://node7").port == 0
    with pytest.raises(DockyardError, match="ssh://"):
        ship.parse_ssh_url("node7:/x")


def test_ssh_honours_the_users_ssh_and_its_options():
    s = Settings(ssh="ssh -F /etc/cluster.conf")
    r = ship.Remote("node7", "/d", 2222, "/k")
    argv = ship.ssh_argv(s, r, "echo 'hi' && true")
    assert argv[:7] == ["ssh", "-F", "/etc/cluster.conf", "-p", "2222", "-i", "/k"]
    assert argv[7] == "node7" and argv[8] == "sh -c " + shlex.quote("echo 'hi' && true")
    # The remote command runs in POSIX sh whatever the login shell is: check the quoting round-trips.
    assert subprocess.run(["sh", "-c", argv[8]], capture_output=True, text=True).stdout == "hi\n"


def test_rsync_resumes_and_checks_the_whole_file():
    argv = ship.rsync_argv(Settings(), ship.Remote("n", "/d", 2222), ship.Path("/a/x.tar.zst"), "x.tar.zst.partial")
    assert {"--partial", "--append-verify"} <= set(argv)
    assert argv[argv.index("-e") + 1] == "ssh -p 2222"
    assert argv[-2:] == ["/a/x.tar.zst", "n:/d/x.tar.zst.partial"]


def test_append_fallback_appends_to_the_partial_file():
    argv = ship.append_argv(Settings(), ship.Remote("n", "~/in box"), "x.tar.zst.partial")
    assert argv[-1] == "sh -c " + shlex.quote("cat >> \"$HOME\"/'in box/x.tar.zst.partial'")


def test_probe_script_reports_tools_space_and_partial_copies(tmp_path):
    (tmp_path / "x.tar.zst.partial").write_bytes(b"a" * 1234)
    out = subprocess.run(["sh", "-c", ship.probe_script(str(tmp_path), "x.tar.zst")],
                         capture_output=True, text=True, check=True).stdout
    have = ship.parse_probe(out)
    assert have["partial"] == "1234" and "final" not in have
    assert int(have["free_kb"]) > 0 and have["sha256sum"].endswith("sha256sum")
    # A folder that does not exist yet: free space of the nearest parent, nothing created.
    have = ship.parse_probe(subprocess.run(["sh", "-c", ship.probe_script(str(tmp_path / "new" / "deeper"), "x")],
                                           capture_output=True, text=True, check=True).stdout)
    assert int(have["free_kb"]) > 0 and not (tmp_path / "new").exists()
