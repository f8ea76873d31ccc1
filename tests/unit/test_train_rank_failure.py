"""When a process that writes no manifest fails (rank 1 refusing a setting, say), torchrun stops the manifest's writer
with SIGTERM: the manifest must carry rank 1's error, not "stopped by SIGTERM". Which rank fails first is a race
on a busy machine (CI saw rank 1 win it); here each side is played in turn in this process, with torchrun's
environment set by hand."""

from __future__ import annotations

import argparse
import json

import pytest

from dockyard.common import runfolder
from dockyard.train import __main__ as trainer
from dockyard.train import ending, nodes
from dockyard.train.record import Run

STOPPED = "stopped by SIGTERM: a process failed, on this node or another, or the run was cancelled"


@pytest.fixture(autouse=True)
def fresh_signal_state(monkeypatch):
    """The trainer's once-per-process events (a SIGTERM came; the manifest is written) as a new process has them:
    a test that ran main() or _stopped before must not change what another sees."""
    import threading

    from dockyard.train import ending

    monkeypatch.setattr(ending, "_signalled", threading.Event())
    monkeypatch.setattr(ending, "_recorded", threading.Event())


def play(monkeypatch, tmp_path, rank: int, error: str, attempt: str = "abc", verdict: str | None = None) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", attempt)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    heartbeat = None
    if verdict:
        heartbeat = nodes.Heartbeat(lambda message: None)  # not started: its verdict is played
        heartbeat.verdict = verdict
    run = Run(argparse.Namespace(run_dir=tmp_path), 0.0, is_main=rank == 0, run_dir_ok=True, world_size=2,
              heartbeat=heartbeat)
    ending._finish(run, error)


def written_error(tmp_path) -> str:
    return json.loads((tmp_path / runfolder.MANIFEST).read_text())["error"]


def main_of(run_dir) -> int:
    """trainer.main as a process runs it (it sets its own SIGTERM and SIGINT handlers); this process's are put back."""
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        return trainer.main(["--recipe", "ddp", "--run-dir", str(run_dir)])
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def test_the_manifest_carries_the_error_of_the_rank_that_failed_first(monkeypatch, tmp_path):
    play(monkeypatch, tmp_path, 1, "invalid training setting: nonsense")
    assert not (tmp_path / runfolder.MANIFEST).exists()  # rank 1 writes no manifest, only its note
    play(monkeypatch, tmp_path, 0, STOPPED)
    assert written_error(tmp_path) == "invalid training setting: nonsense (rank 1; torchrun then stopped the others)"


@pytest.mark.parametrize("planted", ["earlier attempt", "not json", "link"])
def test_a_note_of_another_attempt_or_a_planted_one_is_not_taken(monkeypatch, tmp_path, planted):
    note = tmp_path / f"{runfolder.RANK_FAILED}1"
    if planted == "earlier attempt":
        play(monkeypatch, tmp_path, 1, "an old failure", attempt="before")
    elif planted == "not json":
        note.write_text("{")
    else:
        (tmp_path / "elsewhere.json").write_text(json.dumps({"attempt": "abc/0", "rank": 1, "error": "planted"}))
        note.symlink_to(tmp_path / "elsewhere.json")
    play(monkeypatch, tmp_path, 0, STOPPED)
    assert written_error(tmp_path) == STOPPED


@pytest.mark.parametrize("peak", [10**30, 2**63, "9" * 20])
def test_a_planted_peak_in_a_note_is_not_taken_for_the_runs(monkeypatch, tmp_path, peak):
    """A failed rank's note carries its peak memory for the manifest (test_run_failed_peak, for real); the note is
    anyone's to write: a figure no process reaches (10**30 bytes made the host refuse the whole manifest) is passed
    over, and the writer's own stands."""
    play(monkeypatch, tmp_path, 1, "invalid training setting: nonsense")
    note = tmp_path / f"{runfolder.RANK_FAILED}1"
    note.write_text(json.dumps({**json.loads(note.read_text()), "peak_memory_bytes": peak}))
    play(monkeypatch, tmp_path, 0, STOPPED)
    metrics = json.loads((tmp_path / runfolder.MANIFEST).read_text())["metrics"]
    assert 0 < metrics["peak_memory_bytes"] < 2**63 and metrics["peak_memory_rank"] == 0
    assert written_error(tmp_path).startswith("invalid training setting: nonsense (rank 1;")  # the error still taken


def test_a_rank_stopped_by_torchrun_leaves_no_note_and_the_writer_keeps_its_own_error(monkeypatch, tmp_path):
    play(monkeypatch, tmp_path, 1, STOPPED)
    play(monkeypatch, tmp_path, 1, STOPPED, verdict="node 1 stopped answering")  # its message says so first
    assert not list(tmp_path.glob(f"{runfolder.RANK_FAILED}*"))
    play(monkeypatch, tmp_path, 0, "cannot load the model")
    assert written_error(tmp_path) == "cannot load the model"


def test_a_connection_broken_by_a_rank_that_failed_first_is_explained_by_its_error(monkeypatch, tmp_path):
    """Rank 1 fails; rank 0, blocked in an all-reduce with it, sees the connection close before torchrun's SIGTERM
    reaches it (the other order of the race above)."""
    play(monkeypatch, tmp_path, 1, "lost node 1 (198.19.0.10, host vm): it stopped answering")
    play(monkeypatch, tmp_path, 0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:29500.")
    assert written_error(tmp_path).startswith("lost node 1 (198.19.0.10, host vm): it stopped answering (rank 1;")


def test_torchruns_sigterm_while_the_manifest_is_written_does_not_stop_the_writing(monkeypatch, tmp_path):
    """CI saw it: node 0's first process waited (a beat) for its heartbeat to explain a broken connection, torchrun's
    SIGTERM arrived meanwhile (its other process had failed), and the process left with no manifest written. The
    heartbeat here is real but not started: its wait is the longest, and the SIGTERM is sent to this process."""
    import os
    import signal
    import threading

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    heartbeat = nodes.Heartbeat(lambda message: None, bound=10.0)  # waits up to one beat + 2 s for a verdict: 3 s
    run = Run(argparse.Namespace(run_dir=tmp_path), 0.0, is_main=True, run_dir_ok=True, world_size=2,
              heartbeat=heartbeat)
    before = signal.signal(signal.SIGTERM, ending._stopped)
    sent = threading.Event()
    torchrun = threading.Timer(0.5, lambda: (os.kill(os.getpid(), signal.SIGTERM), sent.set()))
    try:
        torchrun.start()
        ending.finish(run, "torch.distributed.DistNetworkError: Broken pipe")
    finally:
        torchrun.cancel()  # late past the finish: not to pytest, once the handler is gone
        torchrun.join()
        signal.signal(signal.SIGTERM, before)
    assert sent.is_set(), "the SIGTERM came while the manifest was written"
    assert written_error(tmp_path) == "torch.distributed.DistNetworkError: Broken pipe"


@pytest.mark.parametrize("local_rank, torchrun, says", [("1", True, False), ("0", True, False), ("0", False, True)])
def test_a_process_stopped_by_torchrun_leaves_saying_why_to_torchrun(monkeypatch, tmp_path, capsys, local_rank,
                                                                     torchrun, says):
    """Rank 0 refused `--learning_rate -1` and torchrun stopped rank 1 before rank 1 had refused it too: rank 1 then
    printed "error: stopped by SIGTERM" under the refusal (a CI run on a loaded host). And a node's first process said
    "error: stopped by SIGTERM: another rank failed (its error is above)" on a node that outlived another node's
    failure, with nothing above: none of torchrun's workers can tell why it was stopped, and torchrun, which stopped
    them, says it (dockyard.train.torchrun). A process started without torchrun was cancelled: it says so."""
    from dockyard.common.errors import DockyardError

    def stopped(overrides, run):
        raise DockyardError(STOPPED, exit_code=143)

    monkeypatch.setattr(trainer, "train", stopped)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("RANK", local_rank)
    if torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    code = trainer.main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 143 and ("error: stopped by SIGTERM" in err) is says, err
    assert "is above" not in err


def test_a_launchers_sigterm_while_a_broken_pipe_is_handled_still_leaves_the_manifest(monkeypatch, tmp_path, capsys):
    """A launcher killed with its process group took the reader of its pipe with it: a progress bar of the checkpoint
    save wrote to that pipe (BrokenPipeError), and while main's handler waited to see whether the launcher was gone,
    the dying launcher's SIGTERM came; _stopped raised out of that wait, and no manifest was written (one run in three
    to five). Played here in order, without a timer: the SIGTERM is sent from inside the wait."""
    import os
    import signal
    import threading

    run_dir = tmp_path / "r"

    def save_into_a_dead_pipe(overrides, run):
        run_dir.mkdir()
        run.run_dir_ok = True
        raise BrokenPipeError(32, "Broken pipe")

    waits = []

    def launcher_gone() -> bool:
        waits.append("main's, after the BrokenPipeError" if not waits else "_stopped's")
        if len(waits) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the dying launcher's PDEATHSIG: _stopped runs here
        return True

    monkeypatch.setattr(trainer, "train", save_into_a_dead_pipe)
    monkeypatch.setattr(ending, "launcher_gone", launcher_gone)
    monkeypatch.setattr(ending, "_signalled", threading.Event())
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    code = main_of(run_dir)
    assert waits == ["main's, after the BrokenPipeError", "_stopped's"], "the SIGTERM came during main's wait"
    assert code == 143
    written = json.loads((run_dir / runfolder.MANIFEST).read_text())
    assert written["status"] == "failed" and written["error"] == f"stopped by SIGTERM: {ending.LAUNCHER_GONE}"


def test_a_sigterm_after_a_completed_runs_record_is_written_ends_the_process_without_a_traceback(monkeypatch,
                                                                                                 tmp_path):
    """Rank 0 had written "completed" and waited in the last barrier when another node died and torchrun sent SIGTERM:
    _stopped's error escaped main, a traceback and exit 1. Played in order: the SIGTERM comes from inside the step
    after the record (say_done), sent to this process."""
    import os
    import signal

    run_dir = tmp_path / "r"

    def trained(overrides, run):
        run_dir.mkdir()
        run.run_dir_ok, run.status = True, "completed"

    def say_done(run):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer, "train", trained)
    monkeypatch.setattr(ending, "say_done", say_done)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as ended:
        main_of(run_dir)
    assert ended.value.code == 143
    assert json.loads((run_dir / runfolder.MANIFEST).read_text())["status"] == "completed"


@pytest.mark.parametrize("signum, code, recorded", [("SIGINT", 130, "interrupted (SIGINT): the run stopped"),
                                                    ("SIGTERM", 143, STOPPED),
                                                    (None, None, "RuntimeError: [../gloo/transport/tcp/pair.cc:537]")])
def test_a_peer_that_hung_up_just_before_this_process_was_stopped_too_is_a_stop_not_a_traceback(
        monkeypatch, tmp_path, capsys, signum, code, recorded):
    """torchrun passes Ctrl-C's SIGINT on to its workers one at a time: rank 1 stopped first, and rank 0, waiting in a
    barrier, got gloo's "Connection reset by peer" a moment before its own SIGINT. It printed that RuntimeError's
    traceback, and the manifest called the run a network error (a CI run of test_run_stopped). The signal that follows
    is sent here to this process, 0.2 s after the error; without one, the connection's error is the run's (raised
    again, its traceback the one to read)."""
    import os
    import signal
    import threading

    def barrier_reset(overrides, run):
        run.run_dir_ok = True
        run.opts.run_dir.mkdir()
        if signum:
            threading.Timer(0.2, lambda: os.kill(os.getpid(), getattr(signal, signum))).start()
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:18067: Connection reset by peer")

    monkeypatch.setattr(trainer, "train", barrier_reset)
    monkeypatch.setattr(ending, "PEER_GONE_S", 5.0 if signum else 0.3)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    run_dir = tmp_path / "r"
    if signum:
        assert main_of(run_dir) == code
        err = capsys.readouterr().err
        assert err.startswith(f"error: {recorded}") and "Connection reset" not in err, err
    else:
        with pytest.raises(RuntimeError, match="Connection reset by peer"):
            main_of(run_dir)
    assert written_error(run_dir).startswith(recorded)


def test_torchruns_sigterm_eaten_by_a_librarys_except_exception_still_stops_the_run(monkeypatch, tmp_path, capsys):
    """The SIGTERM raised an Exception where it landed: in the first seconds of a run, an import-time check of an
    optional package (`except Exception: return False`) ate it, the run trained on to "completed" (exit 0), and every
    later SIGTERM was ignored, the stop being spent. The SIGTERM is real, sent to this process inside such a check."""
    import os
    import signal
    import time

    run_dir = tmp_path / "r"

    def an_optional_package_is_checked(overrides, run):
        run_dir.mkdir()
        run.run_dir_ok = True
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)
        except Exception:  # noqa: BLE001 - what the library does
            pass
        run.status = "completed"

    monkeypatch.setattr(trainer, "train", an_optional_package_is_checked)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    code = main_of(run_dir)
    assert code == 143
    assert written_error(run_dir) == STOPPED
    assert capsys.readouterr().err.startswith(f"error: {STOPPED}")



def test_a_collective_cut_off_by_a_lost_node_is_one_line_naming_it_not_a_traceback(monkeypatch, tmp_path, capsys):
    """Node 1 killed mid-run (two network namespaces, ddp): node 0 said "error: lost node 1 (198.19.70.2, host vm): it
    stopped answering" and then printed rank 0's 40-line traceback of gloo's "Read error [198.19.70.2]:11485:
    Connection reset by peer", an error of no known kind to ending.failed, though it had just been named. No signal
    follows here (torchrun's comes only once this process has exited): the error is the run's, said once."""
    nodes_seen = [{"node_rank": 0, "addr": "198.18.0.1", "host": "gpu-a"},
                  {"node_rank": 1, "addr": "198.18.0.2", "host": "gpu-b"}]

    def cut_off(overrides, run):
        run.run_dir_ok = True
        run.opts.run_dir.mkdir()
        run.record.nodes_seen = nodes_seen
        raise RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                           "[198.18.0.2]:11485: Connection reset by peer. This is typically caused by a remote worker "
                           "hanging or bugs in the application.")

    monkeypatch.setattr(trainer, "train", cut_off)
    monkeypatch.setattr(ending, "PEER_GONE_S", 0.3)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("DOCKYARD_NODE_RANK", "0")):
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "r"
    assert main_of(run_dir) == 1
    assert capsys.readouterr().err == "error: lost node 1 (198.18.0.2, host gpu-b): it stopped answering\n"
    assert written_error(run_dir).startswith("lost node 1 (198.18.0.2, host gpu-b): it stopped answering: "
                                             "RuntimeError: ")
