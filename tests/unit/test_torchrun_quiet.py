"""dockyard.train.torchrun: torchrun, real, whose failed worker is one line, not torchrun's own traceback."""

from __future__ import annotations

import subprocess
import sys

from dockyard import ROOT


def test_a_failed_worker_is_one_line_with_torchruns_exit_status_not_a_traceback(tmp_path):
    """A trainer refusing a setting says why in one line and exits 1; torchrun then printed forty lines of its own
    traceback (ChildFailedError) and a table under that line, in front of every user of invoke run and run.sh."""
    (tmp_path / "worker.py").write_text("import sys\nprint('error: the reason, in one line', file=sys.stderr)\n"
                                        "raise SystemExit(3)\n")
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--standalone",
                            "worker.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    quiet = subprocess.run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                            "worker.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert plain.returncode == quiet.returncode == 1
    assert "Traceback" in plain.stderr and "ChildFailedError" in plain.stderr  # what users saw
    assert "Traceback" not in quiet.stderr and "error: the reason, in one line" in quiet.stderr
    assert quiet.stderr.rstrip().splitlines()[-1] == ("torchrun: worker.py failed: rank 0 (local rank 0) first, exit 3; "
                                                      "its reason is above (and in the run's train.log)")


def test_a_run_that_succeeds_exits_0(tmp_path):
    (tmp_path / "worker.py").write_text("print('trained')\n")
    ok = subprocess.run([sys.executable, "-m", "dockyard.train.torchrun", "--nproc-per-node=1", "--standalone",
                         "worker.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0 and "trained" in ok.stdout
