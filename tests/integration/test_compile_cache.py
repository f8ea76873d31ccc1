"""torch.compile's kernels outlive the container: `invoke run` mounts the user's compile cache (the compile_cache
setting), so the second compiled run of a model loads what the first compiled, in the real cpu image. What it saves
in time is measured side by side in benchmarks/compile.py (its warm column); here, what the run itself reports:
every graph the second run needed came from the cache, and it trained to the same losses."""

from __future__ import annotations

import os

from tests.support.cli import invoke
from tests.support.training import manifest

COMPILED = ["--torch_compile", "true", "--max_steps", "1", "--save_strategy", "no", "--logging_steps", "1"]


def test_a_second_compiled_run_loads_the_kernels_the_first_compiled(cpu_image, tmp_path):
    cache = tmp_path / "compile"
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_COMPILE_CACHE": str(cache)}
    runs, said = {}, {}
    for run_id in ("cold", "warm"):
        r = invoke("run", "--variant=cpu", "--recipe=ddp", "--nproc=1", f"--run-id={run_id}", "--", *COMPILED, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        runs[run_id], said[run_id] = manifest(tmp_path / "runs" / run_id), r.stdout
        if run_id == "cold":
            made = {p: p.stat().st_mtime_ns for p in (cache / "inductor").rglob("*") if p.is_file()}
    cold, warm = runs["cold"]["metrics"]["compile_cache"], runs["warm"]["metrics"]["compile_cache"]
    assert cold["misses"] > 0, cold  # (a graph compiled twice in one run is a hit the second time)
    assert warm == {"hits": cold["hits"] + cold["misses"], "misses": 0, "bypassed": cold["bypassed"]}, (cold, warm)
    assert f"({warm['hits']} of {warm['hits'] + warm['bypassed']} graphs from the compile cache)" in said["warm"]
    assert cache.stat().st_mode & 0o777 == 0o700, "made by invoke run, for this user alone"
    assert made and all(p.stat().st_uid == os.getuid() for p in made), "written on the host, as the user"
    assert all(p.stat().st_mtime_ns == t for p, t in made.items()), "the warm run read the kernels, rewrote none"
    for key in ("loss_first", "loss_last"):
        assert runs["warm"]["metrics"][key] == runs["cold"]["metrics"][key], "the cached kernels compute the same"
