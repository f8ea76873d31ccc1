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


@pytest.mark.skipif(os.geteuid() != 0, reason="setup hands files back only as root (sudo)")
def test_a_wheelhouse_dir_outside_the_checkout_that_links_into_it_is_left_as_it_is(tmp_path):
    """wheelhouse_dir: /srv/wh, whose cpu/ links to the checkout's wheelhouse: the wheelhouse resolved into the
    checkout, and /srv/wh itself, root's and outside it, was given to the user."""
    checkout = tmp_path / "dockyard"
    wheels = checkout / "images" / "wheelhouse" / "cpu"
    wheels.mkdir(parents=True)
    site = tmp_path / "srv" / "wh"
    site.mkdir(parents=True)
    (site / "cpu").symlink_to(wheels)
    setup.give_to_sudo_user(site / "cpu", checkout, environ={"SUDO_UID": "65534", "SUDO_GID": "65533"})
    assert site.stat().st_uid == 0 and os.lstat(site / "cpu").st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="setup hands files back only as root (sudo)")
def test_giving_the_wheelhouse_back_follows_no_folder_swapped_for_a_link_and_minds_no_file_gone(tmp_path, monkeypatch):
    """Once its folder is the user's, a folder in it can be swapped for a link while setup goes on: a root file outside,
    of the name setup listed, was given to the user; a wheel removed meanwhile made a finished setup fail
    ("error: .../b.whl: No such file or directory")."""
    checkout = tmp_path / "dockyard"
    wheels = checkout / "images" / "wheelhouse" / "cpu"
    (wheels / "sub").mkdir(parents=True)
    (wheels / "sub" / "x.whl").write_bytes(b"x")
    (wheels / "b.whl").write_bytes(b"x")
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "x.whl").write_text("root's own\n")
    calls = []

    def meanwhile(chown):
        def chown_then_swap(*args, **kwargs):
            chown(*args, **kwargs)
            calls.append(args)
            if len(calls) == 2:  # the wheelhouse folder itself, given after its parent
                (wheels / "sub").rename(tmp_path / "sub.old")
                (wheels / "sub").symlink_to(outside)
                (wheels / "b.whl").unlink()
        return chown_then_swap

    monkeypatch.setattr(os, "chown", meanwhile(os.chown))
    monkeypatch.setattr(os, "lchown", meanwhile(os.lchown))
    setup.give_to_sudo_user(wheels, checkout, environ={"SUDO_UID": "65534", "SUDO_GID": "65533"})
    assert (outside / "x.whl").stat().st_uid == 0 and outside.stat().st_uid == 0
    assert wheels.stat().st_uid == 65534


def _wheelhouse_linking_a_file_of_root_s(tmp_path):
    """A checkout whose wheelhouse holds a wheel root downloaded (torch.whl) and the user's hard link (peft.whl) to a
    file of root's (a stand-in /etc/shadow): the checkout, the wheelhouse and that file."""
    checkout = tmp_path / "dockyard"
    wheels = checkout / "images" / "wheelhouse" / "cpu"
    wheels.mkdir(parents=True)
    (wheels / "torch.whl").write_bytes(b"x")
    shadow = tmp_path / "etc" / "shadow"
    shadow.parent.mkdir()
    shadow.write_text("root:$6$secret:19000:0:99999:7:::\n")
    shadow.chmod(0o640)
    os.link(shadow, wheels / "peft.whl")
    return checkout, wheels, shadow


@pytest.mark.skipif(os.geteuid() != 0, reason="setup hands files back only as root (sudo)")
def test_a_hard_link_in_the_wheelhouse_to_a_file_of_root_s_stays_root_s(tmp_path):
    """The user owns the checkout, so the wheelhouse folder sudo's setup downloads into may be theirs; where
    fs.protected_hardlinks is 0 they can hard-link a file of root's there (/etc/shadow, made here by root in their
    stead), and the hand-back made that file the user's. A file of several names stays as it is; the wheels root
    downloaded (one name each) go to the user."""
    checkout, wheels, shadow = _wheelhouse_linking_a_file_of_root_s(tmp_path)
    setup.give_to_sudo_user(wheels, checkout, environ={"SUDO_UID": "65534", "SUDO_GID": "65533"})
    assert (shadow.stat().st_uid, shadow.stat().st_gid) == (0, 0)
    assert (wheels / "torch.whl").stat().st_uid == 65534 and wheels.stat().st_uid == 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="setup hands files back only as root (sudo)")
def test_a_hard_link_removed_once_setup_opened_it_leaves_root_s_file_root_s(tmp_path, monkeypatch):
    """The user's hard link to a file of root's (fs.protected_hardlinks 0) has two names when setup opens it, and
    one when the user removes theirs right after (inotify tells them of the open): the file's count of names, read
    then, said 1, and /etc/shadow (made here by root in its stead) became the user's. Setup opening the link is
    followed here by the user's removal, as a user who wins that race does."""
    checkout, wheels, shadow = _wheelhouse_linking_a_file_of_root_s(tmp_path)
    real_open = os.open

    def open_then_lose_the_race(name, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(name, flags, mode, dir_fd=dir_fd)
        if name == "peft.whl":
            os.unlink(name, dir_fd=dir_fd)  # the user's, in their own folder
        return fd

    monkeypatch.setattr(os, "open", open_then_lose_the_race)
    setup.give_to_sudo_user(wheels, checkout, environ={"SUDO_UID": "65534", "SUDO_GID": "65533"})
    monkeypatch.undo()
    assert (shadow.stat().st_uid, shadow.stat().st_gid) == (0, 0)
    assert (wheels / "torch.whl").stat().st_uid == 65534
