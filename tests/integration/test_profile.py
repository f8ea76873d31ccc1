"""`-- --profile_steps A-B`: a real run of the ddp recipe (2 processes, the tiny model on CPU) profiles those steps
with torch.profiler: each rank's trace, rank 0's summary, the manifest's account, and the steady state without
them. On a GPU (tests/gpu/test_recipes_gpu.py) the trace also holds the kernels and the summary says how busy the
GPU was."""

from __future__ import annotations

import gzip
import json

from dockyard.launch import summary as launch_summary
from tests.support.training import manifest, train

STEPS = ["--max_steps", "12", "--per_device_train_batch_size", "4", "--max_seq_length", "64", "--logging_steps", "2",
         "--save_strategy", "no"]


def test_the_profiled_steps_leave_a_trace_per_rank_and_a_summary_and_stay_out_of_tokens_per_second(tmp_path, capsys):
    run = tmp_path / "run"
    train("ddp", run, *STEPS, "--profile_steps", "7-8")
    m = manifest(run)
    assert m["status"] == "completed"
    assert m["profile"]["steps"] == [7, 8] and m["profile"]["gpu_busy"] is None  # CPU: no kernels
    for rank in (0, 1):  # each rank's own trace: the operators of its forward and backward passes
        trace = json.loads(gzip.decompress((run / "profile" / f"trace-rank{rank}.json.gz").read_bytes()))
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"aten::mm", "aten::_fused_adamw_"} <= names, sorted(n for n in names if n)[:40]
    summary = (run / "profile" / "summary.txt").read_text()
    assert summary.startswith("Steps 7-8 under torch.profiler on rank 0 of 2") and "aten::mm" in summary
    logged = {x["step"]: x for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert [s for s, x in logged.items() if x.get("profiled")] == [8]
    steady = m["metrics"]["steady_state"]
    assert steady["profiled_steps_left_out"] == [7, 8]
    assert steady["tokens"] == sum(x["tokens"] for s, x in logged.items() if s in (6, 10, 12))  # 6, 9-12
    # what `invoke run` prints of it, from the manifest
    launch_summary.summarise(run)
    said = capsys.readouterr().out
    assert "tokens/s (steady state, the profiled steps 7-8 left out)" in said, said
    assert f"profile of steps 7-8: CPU operators only in {run / 'profile' / 'summary.txt'}" in said, said
