"""The monitor around a real `invoke run` on this host (two real torchrun ranks on CPU): the run folder gets
the samples of both ranks, the verdict, and real plots."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.cli import INVOKE

ROOT = Path(__file__).resolve().parents[2]


def test_run_is_monitored(tmp_path):
    run_id = f"monitored-{os.getpid()}"
    proc = subprocess.run([*INVOKE, "run", "--native", "--recipe=zero2", f"--run-id={run_id}",
                           "--", "--max_steps", "8"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = tmp_path / run_id
    rows = [json.loads(ln) for ln in (run_dir / "monitor.jsonl").read_text().splitlines()]
    assert rows and all(r["kind"] == "cpu" for r in rows)
    assert {d["device"] for r in rows for d in r["devices"]} == {0, 1}  # both ranks, not torchrun itself
    verdict = json.loads((run_dir / "monitor.json").read_text())
    assert verdict["devices"] == 2 and verdict["plots"] == ["cpu.png", "loss.png"]
    assert "monitor: " in proc.stderr and verdict["message"].split(" (")[0] in proc.stderr.replace("\n", " ")
    for png in ("cpu.png", "loss.png"):
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
