"""A training run stopped from outside, as users stop one: Ctrl-C in the terminal, or the launcher killed with its
process group (a CI job's end, `kill -9` of a session, the OOM killer). `invoke run --native`: real torchrun, two CPU
processes of the real trainer; the container path runs the same torchrun and trainer. (Ctrl-C in the first seconds
was checked by hand: Python's own start-up answers a SIGINT there, before any of the project's code.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.support.cli import INVOKE
from tests.support.training import ROOT, env

LONG = ["--max_steps", "2000", "--per_device_train_batch_size", "2", "--max_seq_length", "32", "--logging_steps", "1",
        "--save_steps", "2"]


def _start(tmp_path, run_id: str, **popen) -> subprocess.Popen:
    """The run in a session of its own, as a terminal starts it (SIGINT at its default)."""
    return subprocess.Popen([*INVOKE, "run", "--native", "--variant=cpu", "--recipe=ddp", f"--run-id={run_id}", "--",
                             *LONG], cwd=ROOT, env={**env(), "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")},
                            start_new_session=True, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen)


def _until_a_checkpoint(p: subprocess.Popen, run) -> None:
    deadline = time.monotonic() + 300
    while not list((run / "checkpoints").glob("checkpoint-*/complete.json")):
        assert p.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.1)


def _past_a_checkpoint(p: subprocess.Popen, run) -> None:
    """A checkpoint is complete and a later step is logged: its save is in the run's time spent saving (the marker is
    written before the trainer's timing callback counts the save, so a Ctrl-C right at the marker can land between)."""
    _until_a_checkpoint(p, run)
    saved = min(int(c.parent.name.rsplit("-", 1)[1]) for c in (run / "checkpoints").glob("checkpoint-*/complete.json"))
    deadline = time.monotonic() + 300
    while not any(json.loads(line).get("step", 0) > saved  # whole lines only: the last may be half written
                  for line in (run / "metrics.jsonl").read_text().split("\n")[:-1]):
        assert p.poll() is None and time.monotonic() < deadline, "the run logged no step after its first checkpoint"
        time.sleep(0.1)


def _interrupt(p: subprocess.Popen, until) -> tuple[str, str]:
    """Ctrl-C to the run's process group once `until()` returns; what the run printed after."""
    try:
        until()
        os.killpg(p.pid, signal.SIGINT)
        return p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _workers(run) -> list[str]:
    ps = subprocess.run(["pgrep", "-f", "--", f"--run-dir {run}( |$)"], capture_output=True, text=True)
    assert ps.returncode in (0, 1), ps.stderr  # 1: none
    return ps.stdout.split()


def test_ctrl_c_is_a_line_from_each_part_and_the_manifest_says_it_was_interrupted(tmp_path):
    """Ctrl-C printed 110 lines: a KeyboardInterrupt traceback from each rank and torchrun's SignalException, and the
    manifest's error was "KeyboardInterrupt", its times to the first step and saving null."""
    run = tmp_path / "runs" / "c1"
    p = _start(tmp_path, "c1", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = _interrupt(p, lambda: _past_a_checkpoint(p, run))
    said = out + err
    assert p.returncode == 130, said[-3000:]
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said[-3000:]
    assert "torchrun: stopped by SIGINT; the workers were stopped with it" in said
    assert err.strip().splitlines()[-1].startswith("error: interrupted: run c1 stopped. Continue it from its last "
                                                   "complete checkpoint"), err[-2000:]
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("interrupted (SIGINT): the run stopped"), m.get("error")
    assert m["metrics"]["steps"] >= 2 and m["metrics"]["seconds_to_first_step"] > 0
    assert m["metrics"]["seconds_saving"] > 0, "a checkpoint was saved before the interrupt"


def test_a_launcher_killed_with_its_process_group_takes_its_workers_with_it(tmp_path):
    """torchrun starts its workers in sessions of their own: `kill -9` of invoke run's process group left both
    training to the end in the background. They stop with their launcher and say why in the manifest, also when a
    checkpoint's progress bar first wrote to the pipe invoke read, dead with it (BrokenPipeError, then the SIGTERM:
    one run in three to five had no manifest). Each wait is for a state (a checkpoint, the processes gone), with bounds
    far above what a loaded CI host takes; invoke's own output goes nowhere, so no pipe of the test fills."""
    run = tmp_path / "runs" / "k1"
    p = _start(tmp_path, "k1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _until_a_checkpoint(p, run)  # saves every 2 steps: the kill lands near a save, as in the runs that failed
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        deadline = time.monotonic() + 120  # the SIGTERM, then the manifest: under a second when the host is idle
        while _workers(run) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _workers(run)
    finally:
        for pid in _workers(run):
            os.kill(int(pid), signal.SIGKILL)
    assert not left, "the trainer's processes outlived their launcher"
    steps = (run / "metrics.jsonl").read_text().count("\n")
    time.sleep(2)
    assert (run / "metrics.jsonl").read_text().count("\n") == steps, "something still trains into the folder"
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "failed" and "torchrun, which started this process, was killed" in m["error"], m.get("error")
