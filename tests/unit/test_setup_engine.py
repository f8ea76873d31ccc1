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
