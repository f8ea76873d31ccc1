"""`invoke run` on a run folder other runs can write (issue 27), as a user types it: links planted before a resume
or during a run are never followed, two runs given one --run-id at once do not share or delete a folder, and a run
that fails before its log exists is told from its own manifest. `--native` (torchrun on this host, 2 CPU
processes): the host side is the same code as with a container."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.support.cli import INVOKE, invoke
from tests.support.processes import said_by
from tests.support.training import ROOT, env

SHORT = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--max_seq_length", "32", "--logging_steps", "1",
         "--save_steps", "2"]


def _run(tmp_path, run_id, *extra, resume=False, steps=2):
    return [*INVOKE, "run", "--native", "--variant=cpu", "--recipe=ddp", f"--run-id={run_id}",
            *(["--resume"] if resume else []), "--", "--max_steps", str(steps), *SHORT[2:], *extra]


def _env(tmp_path):
    return {**env(), "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}


def _own(home, name):
    f = home / name
    f.write_text(f"# {name}: the user's own\n")
    return f


def test_links_planted_during_a_run_and_before_its_resume_are_never_followed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    bashrc, keys = _own(home, ".bashrc"), _own(home, "authorized_keys")
    run = tmp_path / "runs" / "r1"
    proc = subprocess.Popen(_run(tmp_path, "r1"), cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "train.log").exists():  # what a container of another run does while this one trains
        assert proc.poll() is None and time.monotonic() < deadline, said_by(proc)
        time.sleep(0.05)
    (run / "monitor.json").symlink_to(bashrc)
    (run / "loss.png").symlink_to(keys)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert bashrc.read_text() == "# .bashrc: the user's own\n" and keys.read_text() == "# authorized_keys: the user's own\n"
    assert json.loads((run / "monitor.json").read_text())["plots"][-1] == "loss.png"
    assert not (run / "monitor.json").is_symlink() and (run / "loss.png").read_bytes()[:4] == b"\x89PNG"

    (run / "monitor.json").unlink()
    (run / "monitor.json").symlink_to(bashrc)
    r = invoke("run", "--native", "--variant=cpu", "--recipe=ddp", "--run-id=r1", "--resume", "--",
               "--max_steps", "3", env=_env(tmp_path), timeout=600)
    assert r.returncode != 0 and "monitor.json is a symbolic link (to" in r.stderr and "Traceback" not in r.stderr
    assert bashrc.read_text() == "# .bashrc: the user's own\n"
    assert json.loads((run / "manifest.json").read_text())["metrics"]["steps"] == 2, "nothing ran"


def test_two_runs_given_one_id_at_once_one_trains_and_the_other_deletes_nothing(tmp_path):
    procs = [subprocess.Popen(_run(tmp_path, "same"), cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=900) for p in procs]
    done = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    assert sorted(code != 0 for code, _, _ in done) == [False, True], [err[-2000:] for _, _, err in done]
    (_, _, lost), = [d for d in done if d[0] != 0]
    assert "already holds a run" in lost and "Traceback" not in lost
    m = json.loads((tmp_path / "runs" / "same" / "manifest.json").read_text())
    assert m["status"] == "completed" and m["metrics"]["steps"] == 2
    assert (tmp_path / "runs" / "same" / "model").is_dir() and (tmp_path / "runs" / "same" / "monitor.json").is_file()


def test_a_resume_of_a_run_still_training_is_refused_before_it_starts(tmp_path):
    """`invoke run --resume` of a run that still trains (another terminal, --native: no container name to clash):
    it read the checkpoints being written and rotated, told the user to remove a good one as damaged, left its
    ranks' .failed-rank files in the folder and ended with the other run's summary. Now it is refused on the host."""
    run = tmp_path / "runs" / "busy"
    proc = subprocess.Popen(_run(tmp_path, "busy", steps=20000), cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((run / "checkpoints").glob("checkpoint-*/complete.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
        r = invoke(*_run(tmp_path, "busy", resume=True, steps=20000)[len(INVOKE):], env=_env(tmp_path), timeout=600)
        assert proc.poll() is None, "the first run ended before the resume was tried"
        left = list(run.glob(".failed-rank*"))  # before the Ctrl-C below, after which the run's own rank 1 writes one
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: torchrun's workers stop with it
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"error: --resume: run busy is being trained by another process now (it holds {run}/.resume.lock): "
                    "wait for it to end, or stop it, then resume"), last
    assert not left and "torchrun" not in r.stdout + r.stderr


def test_a_run_that_fails_before_its_log_exists_is_told_from_its_manifest_and_kept(tmp_path):
    # a value only the trainer can judge (TrainingArguments' own check): the host's --dry checks pass it, the
    # trainer refuses it before its log exists
    # (an enum's unknown name is the host's to refuse now, and so are a `debug` word and load_best_model_at_end's
    # strategies: TrainingArguments alone knows whether accelerate's state was configured before it)
    r = invoke("run", "--native", "--variant=cpu", "--recipe=ddp", "--run-id=early", "--", "--accelerator_config",
               "{use_configured_state: true}", env=_env(tmp_path), timeout=600)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and last.startswith("error: run early failed: invalid training setting: Passing "
                                                 "`'use_configured_state':True` to the AcceleratorConfig requires a "
                                                 "pre-configured `AcceleratorState`"), last
    assert not (tmp_path / "runs" / "early" / "train.log").exists()
    assert "did not start" not in r.stderr and "AttributeError" not in r.stderr
    # torchrun says its part in one line too (it printed forty lines of traceback and a table under the reason)
    said = r.stdout + r.stderr
    assert "Traceback" not in said and "torchrun: dockyard.train failed: rank " in said
    m = json.loads((tmp_path / "runs" / "early" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["strategy"]["in_effect"] is None
    assert re.search(r"^run early: failed after \d+ s · recipe ddp", r.stdout, re.M)  # how long the trainer ran


def test_the_trainer_refuses_a_run_folder_holding_a_link_and_writes_nothing_through_it(tmp_path):
    """The image side (here one plain process): before it writes anything, the trainer checks the whole folder."""
    home = tmp_path / "home"
    home.mkdir()
    token = _own(home, "token")
    run = tmp_path / "runs" / "r1"
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-2" / "optimizer.pt").symlink_to(token)
    (run / "manifest.json").symlink_to(token)
    script = "import sys; from dockyard.train.__main__ import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", script, "--recipe", "ddp", "--run-dir", str(run), "--resume"],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "is a symbolic link (to" in r.stderr and "Traceback" not in r.stderr
    assert token.read_text() == "# token: the user's own\n" and (run / "manifest.json").is_symlink()
