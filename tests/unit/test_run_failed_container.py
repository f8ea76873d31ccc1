"""What `invoke run` keeps and says after its container exits non-zero (issue 27), with a stand-in engine.

The engine is a stub (tests/support/fake_engine.py): this file runs on hosts and CI jobs without Docker, and the
question is the host's alone (which files in the run folder mean the trainer started). The container is played
by a function that writes what the trainer writes, through the folder the real `docker run` argv mounts, with
the trainer's own manifest code. tests/integration/test_run_folder.py has the real version (a real trainer
refusing a setting before its log exists).
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path, PurePosixPath

import pytest

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import load_recipe
from dockyard.launch import monitor
from dockyard.launch import run as launch_run
from tests.support.fake_engine import FakeEngine

ERROR = "invalid training setting: nonsense is not a valid SchedulerType"
WATCH = monitor.watch  # the real one, which the fixture below leaves out


def host_folder(argv: list[str], inside: str):
    """The host folder the `docker run` argv mounts at the container path `inside` (its parent's mount)."""
    mounts = dict(reversed(argv[i + 1].split(":")[:2]) for i, a in enumerate(argv) if a == "-v")
    path = PurePosixPath(inside)
    for parent in [path, *path.parents]:
        if str(parent) in mounts:
            return Path(mounts[str(parent)]) / path.relative_to(parent)
    raise AssertionError(f"{inside} is not mounted by {argv}")


def trainer_that_fails_before_its_log(argv: list[str]) -> int:
    """The container: the trainer refuses a setting before train.log exists, writes its failed manifest (as
    dockyard.train.ending._finish does) into the run folder it was given, and exits 1."""
    from dockyard.train import manifest

    run_dir = host_folder(argv, argv[argv.index("--run-dir") + 1])
    record = manifest.build(run_dir, load_recipe("ddp"), "failed", 2, None, {}, {"error": ERROR})
    manifest.write(run_dir, record, runfolder.manifest_file(0))
    return 1


def refused_by_docker(argv: list[str]) -> int:
    """The container never starts (docker itself refused the run): nothing is written."""
    return 125


@pytest.fixture
def run_cpu(settings, monkeypatch, tmp_path):
    """launch.run.run of the ddp recipe on the cpu variant, the engine a FakeEngine holding the cpu image. The
    resource monitor is left out: it samples this host's processes and draws plots, which is not this question."""
    monkeypatch.setattr(monitor, "watch", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setenv("DOCKYARD_MEMLOCK", str(1 << 30))  # not this host's dockerd limits

    def go(container, run_id="early", **request_fields):
        fake = FakeEngine(container=container)
        s = fake.install(monkeypatch, settings).model_copy(update={"runs_dir": tmp_path / "runs"})
        fake.images.add("sha256:" + "c" * 64)
        fake.tags[launch_run.variants.tag(s, launch_run.variants.resolve(s, "cpu")[0])] = "sha256:" + "c" * 64
        request = launch_run.RunRequest(recipe="ddp", variant="cpu", run_id=run_id, **request_fields)
        return fake, tmp_path / "runs" / run_id, lambda: launch_run.run(s, request)
    return go


def test_a_run_that_failed_before_its_log_is_kept_and_told_from_its_manifest(run_cpu, capsys):
    fake, run_dir, go = run_cpu(trainer_that_fails_before_its_log)
    with pytest.raises(DockyardError) as e:
        go()
    assert str(e.value) == f"run early failed: {ERROR}"
    assert "did not start" not in str(e.value)
    assert (run_dir / "manifest.json").is_file() and not (run_dir / "train.log").exists()
    assert runfolder.read_manifest(run_dir).error == ERROR
    assert re.search(r"^run early: failed after \d+ s · recipe ddp", capsys.readouterr().out, re.M)  # how long the trainer ran
    assert len(fake.docker_calls("run")) == 1


def test_a_run_docker_refused_keeps_nothing_so_the_same_id_can_run_again(run_cpu):
    fake, run_dir, go = run_cpu(refused_by_docker)
    with pytest.raises(DockyardError, match=r"the run did not start \(exit 125.*nothing was kept"):
        go()
    assert not run_dir.exists()
    fake, run_dir, go = run_cpu(trainer_that_fails_before_its_log)  # the same --run-id is free again
    with pytest.raises(DockyardError, match=re.escape(f"run early failed: {ERROR}")):
        go()


def refused_for_the_images_require(argv: list[str]) -> tuple[int, str]:
    """docker's words when the NVIDIA toolkit refuses the driver for an nvidia/cuda base's NVIDIA_REQUIRE_CUDA."""
    return 125, ("docker: Error response from daemon: failed to create task for container: OCI runtime create failed: "
                 "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please update your "
                 "driver to a newer version, or use an earlier cuda container: unknown.")


def test_a_run_the_toolkit_refused_for_the_images_require_says_the_way_out(run_cpu):
    """A --devel image (FROM nvidia/cuda) on a driver of an older CUDA 12 minor: dockyard's own check passes it (minor
    compatibility), the toolkit's NVIDIA_REQUIRE_CUDA refuses it; the run said only "for the reason above"."""
    fake, run_dir, go = run_cpu(refused_for_the_images_require)
    with pytest.raises(DockyardError, match=r"did not start \(exit 125, the image's NVIDIA_REQUIRE_CUDA \(set by an "
                                            r"nvidia/cuda base.*--disable-require` starts it.*nothing was kept"):
        go()
    assert not run_dir.exists()


def trainer_that_refuses_to_continue(argv: list[str]) -> int:
    """The container: the trainer refuses the resume before training (max_steps reached, a damaged checkpoint) and
    leaves the run's manifest as it was."""
    return 1


def completed_run(run_cpu, container):
    """A completed run of ddp (its manifest alone) to resume, with `container` playing the resume."""
    from dockyard.train import manifest

    fake, run_dir, go = run_cpu(container, resume=True)
    run_dir.mkdir(parents=True)
    record = manifest.build(run_dir, load_recipe("ddp"), "completed", 1, None, {}, {})
    manifest.write(run_dir, {**record, "variant": "cpu"})  # trained in the image, as it resumes
    return fake, run_dir, go


def test_a_resume_the_trainer_refused_is_an_error_not_the_old_run_s_completed(run_cpu, capsys):
    """The run's manifest still said completed, so `invoke run --resume` printed `completed` and exited 0 after the
    trainer's `error: already at max_steps 7`."""

    fake, run_dir, go = completed_run(run_cpu, trainer_that_refuses_to_continue)
    before = (run_dir / "manifest.json").read_bytes()
    with pytest.raises(DockyardError, match=r"--resume of run early was refused \(exit 1; the trainer's reason is "
                                            r"above\): the run is as it was"):
        go()
    assert (run_dir / "manifest.json").read_bytes() == before
    assert "completed" not in capsys.readouterr().out


def test_a_resume_of_a_run_whose_container_is_there_says_so_not_the_trainers_reason(run_cpu):
    """The same resume twice: docker refused the second for its container name, and the message blamed "the
    trainer's reason above", which was docker's name conflict."""

    def name_taken(argv: list[str]) -> tuple[int, str]:
        return 125, ('docker: Error response from daemon: Conflict. The container name "/dockyard-early" is already in '
                     'use by container "0123abcd". You have to remove (or rename) that container to be able to reuse '
                     'that name.')

    fake, run_dir, go = completed_run(run_cpu, name_taken)
    with pytest.raises(DockyardError, match=r"--resume of run early: its container dockyard-early is there already "
                                            r"\(the run is being trained now, or its container was left\): wait for "
                                            r"it to end, or stop it \(docker stop dockyard-early\), then resume"):
        go()


def test_a_resume_that_trained_then_died_says_so_not_refused(run_cpu):
    """A resume killed hours into training (the OOM killer) leaves the manifest as it was, like a refusal: the
    message said "refused ... the run is as it was" over new checkpoints."""

    def trains_then_dies(argv: list[str]) -> int:
        run_dir = host_folder(argv, argv[argv.index("--run-dir") + 1])
        (run_dir / "checkpoints" / "checkpoint-1000").mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1000}\n')
        return 137

    fake, run_dir, go = completed_run(run_cpu, trains_then_dies)
    with pytest.raises(DockyardError, match=r"--resume of run early trained on and then failed \(exit 137; see .*"
                                            r"train.log\); its newest checkpoint is checkpoint-1000: its manifest "
                                            r"was not rewritten"):
        go()


def test_a_refused_resume_leaves_the_run_s_samples_plots_and_verdict_as_they_were(run_cpu, monkeypatch):
    """The monitor watched the refused attempt like a run: it appended its seconds of samples to monitor.jsonl and
    replaced the run's gpu.png and verdict with a picture of a GPU idle for two seconds. The resource monitor here
    replays an NVML recording (no GPU on this host) through the real watch."""
    from dockyard.gpus import Recorded

    recording = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "balanced.json"
    def replayed(run_dir, **kw):
        return WATCH(run_dir, interval=0.001, source=Recorded.from_file(recording), node_rank=kw.get("node_rank", 0))

    def refuses_after_a_moment(argv: list[str]) -> int:
        time.sleep(0.2)  # long enough for the monitor to sample
        return 1

    fake, run_dir, go = completed_run(run_cpu, refuses_after_a_moment)
    monkeypatch.setattr(monitor, "watch", replayed)
    kept = {runfolder.MONITOR_SAMPLES: b'{"t": 0.0, "kind": "gpu", "devices": []}\n', "gpu.png": b"the run's plot",
            runfolder.MONITOR_VERDICT: b'{"message": "the run\'s verdict"}\n'}
    for name, data in kept.items():
        (run_dir / name).write_bytes(data)
    with pytest.raises(DockyardError, match=r"--resume of run early was refused"):
        go()
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept


def test_a_run_refused_before_its_log_gets_no_monitor_verdict(run_cpu, monkeypatch, capsys):
    """A setting the trainer refused at start (--report_to wandb in an image without it): under its one-line reason
    the monitor said "balanced: rank 0 62%, rank 1 58%" of the 20 s spent starting. The resource monitor replays an
    NVML recording (no GPU on this host) through the real watch."""
    from dockyard.gpus import Recorded

    recording = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "balanced.json"
    monkeypatch.setattr(monitor, "watch", lambda run_dir, **kw: WATCH(run_dir, interval=0.001,
                                                                      source=Recorded.from_file(recording)))

    def refuses_after_a_moment(argv: list[str]) -> int:
        time.sleep(0.2)  # long enough for the monitor to sample
        return 1

    fake, run_dir, go = run_cpu(refuses_after_a_moment)
    with pytest.raises(DockyardError, match=r"^the run did not start \(exit 1, for the reason above\); nothing was "
                                            r"kept"):
        go()
    assert "monitor:" not in capsys.readouterr().err and not run_dir.exists()


def refused_for_locked_memory(argv: list[str]) -> tuple[int, str]:
    """docker's words where the engine may not raise the containers' locked memory to what the run asks for."""
    return 125, ("docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
                 "failed: unable to start container process: error during container init: error setting rlimits for "
                 "ready process: error setting rlimit type 8: operation not permitted: unknown.")


@pytest.mark.parametrize("nodes", [{}, {"nodes": 2, "node_rank": 1, "master_addr": "192.0.2.1"}])
def test_a_run_the_engine_refused_its_locked_memory_says_the_way_out(run_cpu, monkeypatch, nodes):
    """An engine whose memlock limit this host cannot read (reached through DOCKER_HOST, or a dockerd without the
    right to raise it): docker refused `--ulimit memlock=-1` with "error setting rlimit type 8", and the run (node 1
    of two, walking docs/multinode.md) said only "did not start ... for the reason above"; the way out, DOCKYARD_MEMLOCK,
    was in a table of the docs."""
    monkeypatch.delenv("DOCKYARD_MEMLOCK")
    monkeypatch.setattr(launch_run.engine, "daemon_memlock_hard_limit", lambda info: None)  # none this host can read
    fake, run_dir, go = run_cpu(refused_for_locked_memory, **nodes)
    with pytest.raises(DockyardError) as e:
        go()
    assert "did not start" in str(e.value) and "nothing" in str(e.value) and "kept" in str(e.value)
    assert ("the engine cannot give the containers the locked memory asked for (--ulimit memlock=-1): set "
            "DOCKYARD_MEMLOCK to its hard limit in bytes (`invoke doctor` prints it on its ulimits line), or let "
            "dockerd raise it (systemd: LimitMEMLOCK=infinity)") in str(e.value), str(e.value)


def trainer_that_completes(argv: list[str]) -> int:
    """The container: a run that trains and ends, its completed manifest in the run folder it was given."""
    from dockyard.train import manifest

    run_dir = host_folder(argv, argv[argv.index("--run-dir") + 1])
    manifest.write(run_dir, manifest.build(run_dir, load_recipe("ddp"), "completed", 1, None, {}, {}),
                   runfolder.manifest_file(0))
    return 0


def test_dry_shows_the_id_and_folder_the_run_would_take_where_the_default_id_is_taken(run_cpu, monkeypatch, capsys):
    """`invoke run --dry` in a second whose default id another run holds showed that id (ddp-<second>), where the real
    run takes ddp-<second>-2: --dry shows the container and run folder the run would get, and makes none of them."""
    second = launch_run.dt.datetime(2026, 12, 7, 18, 30, 5)
    monkeypatch.setattr(launch_run.dt, "datetime", type("Frozen", (launch_run.dt.datetime,),
                                                        {"now": classmethod(lambda cls, tz=None: second)}))
    fake, runs, go = run_cpu(trainer_that_completes, run_id="")
    go()  # the run that holds the default id
    capsys.readouterr()
    fake, _, go = run_cpu(trainer_that_completes, run_id="", dry=True)
    before = sorted(p.name for p in runs.iterdir())
    go()
    printed = capsys.readouterr().err  # the command, echoed
    assert "--name dockyard-ddp-20261207-183005-2 " in printed, printed
    assert printed.rstrip().endswith("--run-dir /workspace/runs/ddp-20261207-183005-2"), printed  # the trainer's folder
    assert sorted(p.name for p in runs.iterdir()) == before  # nothing claimed
    assert not fake.docker_calls("run")

    fake, _, go = run_cpu(trainer_that_completes, run_id="")  # the real run takes what --dry showed
    go()
    assert fake.docker_calls("run")[0][fake.docker_calls("run")[0].index("--name") + 1] == "dockyard-ddp-20261207-183005-2"


def test_runs_started_in_the_same_second_without_a_run_id_each_get_a_folder_of_their_own(run_cpu, monkeypatch, capsys):
    """Two `invoke run --recipe=ddp` started in the same second got the same default id (ddp-<that second>): the second
    was refused ("already holds a run ...: pick another --run-id"), whether it began after the first had claimed the
    folder or while both were being checked. The first keeps the id's usual form; the second gets ddp-<second>-2, its
    folder claimed with one mkdir, and its container and mounts name that folder."""
    second = launch_run.dt.datetime(2026, 12, 7, 18, 30, 5)
    monkeypatch.setattr(launch_run.dt, "datetime", type("Frozen", (launch_run.dt.datetime,),
                                                        {"now": classmethod(lambda cls, tz=None: second)}))
    for _ in range(2):  # one after the other, in the same second
        fake, runs, go = run_cpu(trainer_that_completes, run_id="")  # (no id: the runs folder)
        go()
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == ["ddp-20261207-183005", "ddp-20261207-183005-2"]

    # at the same moment: another run claims the next free id (-3) while this one is being checked
    prepare = launch_run.prepare

    def another_run_claims_it_meanwhile(settings, r):
        command, devices = prepare(settings, r)
        if not r.run_id:
            command.run_dir.with_name(f"{command.run_dir.name}-3").mkdir()
        return command, devices

    monkeypatch.setattr(launch_run, "prepare", another_run_claims_it_meanwhile)
    fake, _, go = run_cpu(trainer_that_completes, run_id="")
    go()
    mine = runs / "ddp-20261207-183005-4"
    assert runfolder.read_manifest(mine).status == "completed"
    assert not any((runs / "ddp-20261207-183005-3").iterdir())  # the other run's, left as it was
    argv = fake.docker_calls("run")[0]
    assert argv[argv.index("--name") + 1] == "dockyard-ddp-20261207-183005-4", argv
    said = capsys.readouterr()
    assert "run ddp-20261207-183005-4: completed" in said.out
    assert said.err.count("disk: the run writes about") == 3, said.err  # planned again for its id: said once a run
