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
from dockyard.train import nodes

STOPPED = "stopped by SIGTERM: another rank failed (its error is above) or the run was cancelled"


def play(monkeypatch, tmp_path, rank: int, error: str, attempt: str = "abc", verdict: str | None = None) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", attempt)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    heartbeat = None
    if verdict:
        heartbeat = nodes.Heartbeat(lambda message: None)  # not started: its verdict is played
        heartbeat.verdict = verdict
    run = trainer.Run(argparse.Namespace(run_dir=tmp_path), 0.0, is_main=rank == 0, run_dir_ok=True, world_size=2,
                      heartbeat=heartbeat)
    trainer._finish(run, error)


def written_error(tmp_path) -> str:
    return json.loads((tmp_path / runfolder.MANIFEST).read_text())["error"]


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


def test_a_rank_stopped_by_torchrun_leaves_no_note_and_the_writer_keeps_its_own_error(monkeypatch, tmp_path):
    play(monkeypatch, tmp_path, 1, STOPPED)
    play(monkeypatch, tmp_path, 1, STOPPED, verdict="node 1 stopped answering")  # its message says so first
    assert not list(tmp_path.glob(f"{runfolder.RANK_FAILED}*"))
    play(monkeypatch, tmp_path, 0, "cannot load the model")
    assert written_error(tmp_path) == "cannot load the model"
