"""Build-time checks: run inside the image by the Dockerfile; any failure fails the build.

Catches what otherwise surfaces only at training time: a later install that swapped the pinned torch or
triton, a DeepSpeed op that was asked for but silently skipped (DeepSpeed >= 0.15.1 does that), a library
that does not import against this torch. Saves `ds_report` for `invoke doctor`.
"""

import argparse
import importlib
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

OP_NAMES = {"CPU_ADAM": "cpu_adam", "FUSED_ADAM": "fused_adam", "AIO": "async_io",
            "SHM_COMM": "deepspeed_shm_comm", "CPU_LION": "cpu_lion", "CPU_ADAGRAD": "cpu_adagrad"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", default="")
    p.add_argument("--triton", default="")
    p.add_argument("--deepspeed", default="")
    p.add_argument("--ops", default="")
    p.add_argument("--report", required=True)
    a = p.parse_args()
    problems = []

    for dist, want in (("torch", a.torch), ("triton", a.triton), ("deepspeed", a.deepspeed)):
        if not want:
            continue
        try:
            have = version(dist)
        except PackageNotFoundError:
            have = "not installed"
        if have != want:
            problems.append(f"{dist} is {have}, the variant pins {want}")

    for mod in ("transformers", "peft", "accelerate", "bitsandbytes", "pynvml"):
        try:
            importlib.import_module(mod)
        except Exception as e:  # any import-time failure is a broken image
            problems.append(f"import {mod} failed: {type(e).__name__}: {e}")

    from deepspeed.git_version_info import installed_ops

    for op in a.ops.split():
        name = OP_NAMES.get(op, op.lower())
        if not installed_ops.get(name):
            problems.append(f"DeepSpeed op {name} (DS_BUILD_{op}=1) was not built")

    report = subprocess.run(["ds_report"], capture_output=True, text=True)
    with open(a.report, "w") as f:
        f.write(report.stdout + report.stderr)

    if problems:
        print("image check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    built = sorted(k for k, v in installed_ops.items() if v)
    print(f"image check passed: torch {version('torch')}, deepspeed {version('deepspeed')}, ops built: {', '.join(built)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
