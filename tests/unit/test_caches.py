"""The host caches a run's container writes (dockyard/launch/caches.py): the compile cache keeps torch.compile's and
Triton's kernels from one run to the next, and is refused where anyone but the user could write what the runs
execute; both caches are made by the user before `docker run` would make a missing one as root. The engine is a
stand-in (tests/support/fake_engine.py): the question is the host's argv and folders. tests/integration/
test_compile_cache.py trains twice in the real cpu image and reads the second run's compile time."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import pytest

from dockyard.common.errors import DockyardError
from dockyard.gpus import Host
from dockyard.launch import caches, monitor
from dockyard.launch import command as launch_command
from dockyard.launch import run as launch_run
from tests.support.fake_engine import FakeEngine

INSIDE = "/workspace/.cache/compile"


def command(settings, tmp_path) -> list[str]:
    v = launch_run.variants.resolve(settings, "cpu")[0]
    return launch_command.run_command(settings, recipe="ddp", variant=v, host=Host(), engine_info={},
                                      topo=launch_command.Topology(nproc=2), run_dir=tmp_path / "runs" / "r1", overrides=[],
                                      memlock="memlock=-1").argv


def test_a_run_mounts_the_compile_cache_and_points_inductor_and_triton_into_it(settings, tmp_path):
    s = settings.model_copy(update={"compile_cache": str(tmp_path / "cc")})
    argv = command(s, tmp_path)
    assert argv[argv.index(f"{tmp_path}/cc:{INSIDE}") - 1] == "-v"
    assert f"TORCHINDUCTOR_CACHE_DIR={INSIDE}/inductor" in argv
    assert f"TRITON_CACHE_DIR={INSIDE}/triton" in argv

    none = command(settings.model_copy(update={"compile_cache": ""}), tmp_path)  # "" = no cache
    # DOCKYARD_HOST_PATHS (every mount's host path, for the trainer's messages) names the cache too: apart
    paths = [json.loads(a.split("=", 1)[1]) for a in (argv, none) for a in a if a.startswith("DOCKYARD_HOST_PATHS=")]
    assert paths[0] == {**paths[1], INSIDE: str(tmp_path / "cc")}
    argv, none = ([a for a in x if not a.startswith("DOCKYARD_HOST_PATHS=")] for x in (argv, none))
    assert not [a for a in none if INSIDE in a]
    left = [a for i, a in enumerate(argv) if INSIDE not in a and not (i + 1 < len(argv) and INSIDE in argv[i + 1])]
    assert none == left, "the compile cache's mount and two variables are all it adds"

    with pytest.raises(DockyardError, match="the compile_cache setting .* a path with ':'"):
        command(settings.model_copy(update={"compile_cache": str(tmp_path / "a:b")}), tmp_path)


def test_prepare_makes_both_caches_as_the_user_and_the_compile_cache_for_them_alone(settings, tmp_path):
    s = settings.model_copy(update={"hf_cache": tmp_path / "hf", "compile_cache": str(tmp_path / "deep" / "cc")})
    caches.prepare(s, compile_cache=True)
    assert (tmp_path / "hf").is_dir()
    cc = tmp_path / "deep" / "cc"
    assert cc.stat().st_mode & 0o777 == 0o700 and cc.stat().st_uid == os.geteuid()
    caches.prepare(s, compile_cache=True)  # again: nothing to do

    bigger_disk = tmp_path / "big"
    bigger_disk.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(bigger_disk)  # the user moved the cache: where the link leads is checked
    caches.prepare(s.model_copy(update={"compile_cache": str(tmp_path / "link")}), compile_cache=True)


@pytest.mark.parametrize("make, said", [
    (lambda p: (p.mkdir(), p.chmod(0o775)), "can be written by others (mode drwxrwxr-x): runs execute the code "
                                            "compiled into it; `chmod go-w"),
    (lambda p: (p.mkdir(), p.chmod(0o757)), "can be written by others (mode drwxr-xrwx)"),
    (lambda p: (p.mkdir(), p.chmod(0o1777)), "is a folder every user shares (mode drwxrwxrwt): runs execute the "
                                             "code compiled into it; set the compile_cache"),  # /tmp: no chmod advice
    (lambda p: p.write_text(""), "is not a folder"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), "No such file or directory"),
])
def test_a_compile_cache_others_could_write_is_refused(settings, tmp_path, make, said):
    folder = tmp_path / "cc"
    make(folder)
    with pytest.raises(DockyardError) as e:
        caches.prepare(settings.model_copy(update={"hf_cache": tmp_path / "hf", "compile_cache": str(folder)}),
                       compile_cache=True)
    assert said in str(e.value)
    assert 'or to "" for none' in str(e.value)


def test_a_compile_cache_of_another_user_is_refused(settings, tmp_path, monkeypatch):
    folder = tmp_path / "cc"
    folder.mkdir(mode=0o700)
    me = os.geteuid()
    if me == 0:
        os.chown(folder, 65534, 65534)  # nobody's
    else:  # an unprivileged user cannot give a folder away: the folder stays theirs and they become someone else
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    with pytest.raises(DockyardError, match=r"belongs to uid \d+, not to you .*runs execute the code compiled into it"):
        caches.prepare(settings.model_copy(update={"hf_cache": tmp_path / "hf", "compile_cache": str(folder)}),
                       compile_cache=True)


def test_invoke_run_refuses_a_bad_compile_cache_before_it_makes_the_run_folder(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "watch", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setenv("DOCKYARD_MEMLOCK", str(1 << 30))
    ran: list[list[str]] = []
    fake = FakeEngine(container=lambda argv: ran.append(argv) or 125)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    s = fake.install(monkeypatch, settings).model_copy(update={
        "runs_dir": tmp_path / "runs", "hf_cache": tmp_path / "hf", "compile_cache": str(shared)})
    fake.images.add("sha256:" + "c" * 64)
    fake.tags[launch_run.variants.tag(s, launch_run.variants.resolve(s, "cpu")[0])] = "sha256:" + "c" * 64
    request = launch_run.RunRequest(recipe="ddp", variant="cpu", run_id="r1")
    with pytest.raises(DockyardError, match="can be written by others"):
        launch_run.run(s, request)
    assert not ran and not Path(tmp_path / "runs" / "r1").exists()
    with pytest.raises(DockyardError, match="can be written by others"):  # --dry makes the same checks
        launch_run.run(s, dataclasses.replace(request, dry=True))

    shared.chmod(0o700)  # fixed: the run starts (and the stand-in container refuses it, which is not this question)
    with pytest.raises(DockyardError, match="did not start"):
        launch_run.run(s, request)
    assert len(ran) == 1 and f"{shared}:{INSIDE}" in ran[0]


def test_a_shared_compile_cache_that_holds_the_checkout_is_refused_for_holding_it(settings, tmp_path, monkeypatch):
    """A checkout cloned into /tmp, and INVOKE_DOCKYARD_COMPILE_CACHE=/tmp: the refusal named /tmp a folder every
    user shares, which sends the user to chmod; the reason that matters is that every run's container would be
    given the checkout to write. (ROOT is moved into a shared folder made here: the test's checkout stays put.)"""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(caches, "ROOT", shared / "dockyard")
    s = settings.model_copy(update={"hf_cache": tmp_path / "hf", "compile_cache": str(shared)})
    for check in (lambda: caches.check_compile_cache(s), lambda: caches.prepare(s, compile_cache=True)):
        with pytest.raises(DockyardError, match=r"the compile_cache setting .* holds the project's checkout"):
            check()


def test_a_cache_in_a_system_folder_is_refused_before_any_folder_is_made(settings, tmp_path):
    """prepare() made the HF cache's folders first and refused them after: as root (the CI, many servers),
    INVOKE_DOCKYARD_HF_CACHE=/usr/local/lib/x left a new folder in the system's tree behind the refusal."""
    inside = Path("/usr/local/lib") / f"dockyard-test-{os.getpid()}" / "hf"
    for s, which in ((settings.model_copy(update={"hf_cache": inside}), "hf_cache"),
                     (settings.model_copy(update={"hf_cache": tmp_path / "hf", "compile_cache": str(inside)}),
                      "compile_cache")):
        with pytest.raises(DockyardError, match=f"the {which} setting .* is inside a system folder"):
            caches.prepare(s, compile_cache=True)
        assert not inside.parent.exists() and not (tmp_path / "hf").exists()
