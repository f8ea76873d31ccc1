"""`sudo .venv/bin/invoke setup`, then `invoke build` as the user (the README's quick start): the wheelhouse setup
downloads as root must be the user's afterwards."""

from __future__ import annotations

import os

import pytest

from dockyard.images import setup


@pytest.mark.skipif(os.geteuid() != 0, reason="setup hands files back only as root (sudo)")
def test_a_wheelhouse_downloaded_through_sudo_goes_back_to_the_user(tmp_path):
    """The build stages its context and takes its lock beside the wheelhouse, and refused a root-owned one:
    "images/wheelhouse/cpu is not writable by you (uid 1000); set wheelhouse_dir ... to a folder you can write",
    which meant downloading it again elsewhere."""
    checkout = tmp_path / "dockyard"
    wheels = checkout / "images" / "wheelhouse" / "cpu"
    wheels.mkdir(parents=True)
    (wheels / "torch.whl").write_bytes(b"x")
    (wheels / ".lock-sha256").write_text("abc\n")
    outside = tmp_path / "srv" / "wheels" / "cpu"  # a wheelhouse_dir outside the checkout: a site's own, left alone
    outside.mkdir(parents=True)

    setup.give_to_sudo_user(wheels, checkout, environ={})  # not through sudo: nothing changes
    assert wheels.stat().st_uid == 0

    sudo = {"SUDO_UID": "65534", "SUDO_GID": "65533"}
    setup.give_to_sudo_user(wheels, checkout, environ=sudo)
    for path in (wheels.parent, wheels, wheels / "torch.whl", wheels / ".lock-sha256"):
        assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65533), path
    assert (checkout / "images").stat().st_uid == 0  # the checkout's own folders were not setup's

    setup.give_to_sudo_user(outside, checkout, environ=sudo)
    assert outside.stat().st_uid == 0 and outside.parent.stat().st_uid == 0
