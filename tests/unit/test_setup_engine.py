"""`invoke setup`'s engine step where an engine does not answer: what it installs and starts, planned (--dry) with a
stand-in engine that never answers and a stand-in root on Debian."""

from __future__ import annotations

import pytest

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.images import setup


@pytest.fixture
def no_engine(monkeypatch, settings):
    def silent(_settings):
        raise DockyardError("cannot reach the Docker engine")

    monkeypatch.setattr(engine, "engine_info", silent)
    monkeypatch.setattr(setup.os, "geteuid", lambda: 0)
    monkeypatch.setattr(setup, "_is_debian", lambda: True)
    return settings


def test_an_engine_asked_for_elsewhere_is_not_installed_here(no_engine, monkeypatch, capsys):
    """DOCKER_HOST naming another engine: setup planned apt-get install docker.io and a second dockerd here, which
    would then not answer either (the client still asks the other one)."""
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    with pytest.raises(DockyardError, match=r"DOCKER_HOST=tcp://127.0.0.1:9: setup installs and starts an engine only "
                                            "on this host"):
        setup.ensure_engine(no_engine, dry=True)
    said = capsys.readouterr()
    assert "apt-get" not in said.out + said.err


def test_an_installed_engine_that_is_stopped_is_started_not_installed_again(no_engine, monkeypatch, capsys):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(engine, "which", lambda name: "/usr/sbin/dockerd" if name == "dockerd" else None)
    setup.ensure_engine(no_engine, dry=True)
    said = capsys.readouterr()
    assert "apt-get" not in said.out + said.err and "then start dockerd" in said.out
    monkeypatch.setattr(engine, "which", lambda name: None)
    setup.ensure_engine(no_engine, dry=True)
    assert "+ apt-get install -y -qq docker.io" in capsys.readouterr().err


def test_a_dry_setup_plans_no_debootstrap_of_a_base_image_that_is_there(settings, monkeypatch, capsys):
    """`invoke setup --dry` printed the debootstrap of dockyard-base:bookworm on a host that had it, which the real
    setup then skipped. The engine's answer is a stand-in here: first it holds the image, then it cannot be asked."""
    monkeypatch.setattr(engine, "image_inspect", lambda _s, ref: {"Id": "sha256:" + "1" * 64, "RepoTags": [ref]})
    setup.ensure_cpu_base(settings, "http://deb.debian.org/debian", dry=True)
    said = capsys.readouterr().out
    assert f"base image: {settings.base_image_cpu} present" in said and "debootstrap" not in said

    def unreachable(_s, _ref):
        raise DockyardError("cannot reach the Docker engine")

    monkeypatch.setattr(engine, "image_inspect", unreachable)
    setup.ensure_cpu_base(settings, "http://deb.debian.org/debian", dry=True)
    assert "debootstrap --variant=minbase bookworm" in capsys.readouterr().err
    with pytest.raises(DockyardError, match="cannot reach the Docker engine"):
        setup.ensure_cpu_base(settings, "http://deb.debian.org/debian", dry=False)


def test_a_debootstrap_that_made_no_system_leaves_no_base_image(monkeypatch, settings, tmp_path):
    """A debootstrap that exits 0 and makes nothing (a wrapper, a stand-in put on PATH): setup piped the missing
    folder's tar into `docker import` all the same, and an empty image took the base's name; every build after
    started FROM it and failed far from the cause. It now stops before importing, naming the debootstrap it ran.
    (debootstrap and the engine are stand-ins here; tests/integration/test_setup_base.py imports for real.)"""
    ran, piped = [], []
    monkeypatch.setattr(engine, "image_inspect", lambda _s, _ref: None)
    monkeypatch.setattr(engine, "run", lambda argv, **kw: ran.append(list(argv)))
    monkeypatch.setattr(engine, "Pipeline", lambda *argvs, **kw: piped.append(argvs))
    monkeypatch.setattr(setup.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(setup.os, "geteuid", lambda: 0)
    with pytest.raises(DockyardError, match=r"debootstrap finished but left no system in .*rootfs \(no /bin/sh\): "
                                            r"check that `/usr/sbin/debootstrap` is Debian's"):
        setup.ensure_cpu_base(settings, "http://deb.debian.org/debian")
    assert [argv[0] for argv in ran] == ["debootstrap"] and piped == []


def test_an_empty_base_image_an_earlier_setup_left_is_made_again(monkeypatch, settings, capsys):
    """A 0-byte dockyard-base image (what an earlier version's failed import named) was 'present' to setup, and every
    build started FROM it. setup now makes it again. (The engine is a stand-in.)"""
    monkeypatch.setattr(engine, "image_inspect", lambda _s, _ref: {"Id": "sha256:" + "e" * 64, "Size": 0})
    setup.ensure_cpu_base(settings, "http://deb.debian.org/debian", dry=True)
    said = capsys.readouterr()
    assert f"base image: {settings.base_image_cpu} is empty" in said.err and "present" not in said.out
    assert "debootstrap --variant=minbase bookworm" in said.err


@pytest.fixture
def no_base(monkeypatch, settings):
    """An engine that answers and holds no base image; debootstrap, were it run, is recorded, not run."""
    ran = []
    monkeypatch.setattr(engine, "image_inspect", lambda _s, _ref: None)
    monkeypatch.setattr(engine, "run", lambda argv, **kw: ran.append(argv[0]))
    monkeypatch.setattr(engine, "Pipeline", lambda *argvs, **kw: ran.append(argvs[0][0]))  # never the real import
    return settings, ran


def test_a_missing_debootstrap_is_said_with_what_installs_it_for_root_and_for_a_user(no_base, monkeypatch):
    """Where an engine answers, setup installs nothing, so its base image needs debootstrap installed first (the
    README says so). Root was told 'debootstrap is missing: `apt-get install debootstrap`, or run setup as root
    (`sudo ... -m invoke setup`)': root already, no sudo on many root hosts, and setup run again would not install
    it. Each is now told the install and the setup after it, root without sudo."""
    settings, ran = no_base
    monkeypatch.setattr(setup.shutil, "which", lambda name: None)
    monkeypatch.setattr(setup.os, "geteuid", lambda: 0)
    with pytest.raises(DockyardError) as root:
        setup.ensure_cpu_base(settings, "http://deb.debian.org/debian")
    assert "`apt-get install debootstrap`, then `invoke setup` again" in str(root.value)
    assert "sudo" not in str(root.value) and "as root" not in str(root.value)
    monkeypatch.setattr(setup.os, "geteuid", lambda: 1000)
    with pytest.raises(DockyardError) as user:
        setup.ensure_cpu_base(settings, "http://deb.debian.org/debian")
    assert f"`sudo apt-get install debootstrap`, then `{engine.SUDO_SETUP}`" in str(user.value)
    assert ran == []


def test_a_user_is_told_debootstrap_needs_root_before_it_runs_not_that_the_mirror_failed(no_base, monkeypatch):
    """A user in the docker group (not root) with debootstrap installed: setup ran it, it said 'E: debootstrap can
    only run as root', and setup's error went on 'where http://deb.debian.org/debian does not answer, give a Debian
    mirror that does': a mirror that answered, and no word of root. It now stops before, naming the setup as root."""
    settings, ran = no_base
    monkeypatch.setattr(setup.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(setup.os, "geteuid", lambda: 1000)
    with pytest.raises(DockyardError) as user:
        setup.ensure_cpu_base(settings, "http://deb.debian.org/debian")
    assert str(user.value) == ("making the cpu base image runs debootstrap, which only root may run: "
                               f"`{engine.SUDO_SETUP}` (a venv's invoke is not on root's PATH)")
    assert "mirror" not in str(user.value) and ran == []
