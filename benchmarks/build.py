"""Build benchmark: cold build vs rebuild after a recipe-only or code-only change, and image size against a
naive single-stage Dockerfile doing the same installs. All measured in one run, side by side.

    python benchmarks/build.py [--variant=cpu] [--skip-cold]

Targets (issue 2): a recipe- or code-only rebuild under 10 s and under 1 MB of new layers.
Writes benchmarks/results/build.md. Builds into its own tags (dockyard-bench/*) from a copy of the context.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard import build, engine, variants  # noqa: E402
from dockyard import settings as settings_mod
from dockyard.settings import ROOT  # noqa: E402

NAIVE = """FROM {base}
RUN apt-get update && apt-get install -y {os_packages} g++ make libaio-dev ca-certificates
RUN python{python} -m venv /opt/venv
COPY . /opt/dockyard
RUN awk '/^[^ #]/ {{ skip = ($0 ~ /^deepspeed==/) }} !skip' /opt/dockyard/images/locks/{variant}.txt > /tmp/stack.txt \\
    && /opt/venv/bin/pip install --no-index --find-links /opt/dockyard/images/wheelhouse/{variant} -r /tmp/stack.txt
RUN awk '/^[^ #]/ {{ keep = ($0 ~ /^deepspeed==/) }} keep' /opt/dockyard/images/locks/{variant}.txt > /tmp/ds.txt \\
    && DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_BUILD_AIO=1 DS_ACCELERATOR=cpu /opt/venv/bin/pip install \\
       --no-index --find-links /opt/dockyard/images/wheelhouse/{variant} --no-build-isolation -r /tmp/ds.txt
"""

def timed_build(settings, v, ctx: Path, ref: str, no_cache: bool = False) -> tuple[float, list[str]]:
    (argv, env), = build.build_plan(settings, v, context=ctx, ref=ref, no_cache=no_cache, revision="bench").steps
    t = time.perf_counter()
    engine.run(argv, env=env, capture=True, quiet=True)
    return time.perf_counter() - t, engine.image_inspect(settings, ref)["RootFS"]["Layers"]


def new_layer_bytes(settings, ref: str, old: list[str], new: list[str]) -> int:
    """Bytes of the layers of `new` that `old` does not share, from `docker history` (top first)."""
    changed = len([l for i, l in enumerate(new) if i >= len(old) or old[i] != l])
    out = subprocess.run(engine.docker(settings, "history", "--no-trunc", "--format", "{{.Size}}", "--human=false", ref),
                         capture_output=True, text=True, check=True).stdout.split()
    sizes = [int(s) for s in out if int(s) > 0]
    return sum(sizes[:changed])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="cpu")
    p.add_argument("--skip-cold", action="store_true", help="reuse the build cache for the first build")
    a = p.parse_args()
    s = settings_mod.load({"docker": os.environ.get("INVOKE_DOCKYARD_DOCKER", "")})
    v = variants.resolve(s, a.variant)[0]
    ref = f"dockyard-bench/{v.name}:layers"
    rows = []
    with tempfile.TemporaryDirectory(prefix="dockyard-bench-") as tmp:
        ctx = build.copy_context(Path(tmp) / "ctx", v.name)
        cold, base = timed_build(s, v, ctx, ref, no_cache=not a.skip_cold)
        rows.append(("cold build" + (" (cache kept)" if a.skip_cold else " (--no-cache)"), cold, None))
        with open(ctx / "recipes" / "zero2" / "recipe.yaml", "a") as f:
            f.write("# bench: recipe-only change\n")
        t, layers = timed_build(s, v, ctx, ref)
        rows.append(("rebuild after a recipe-only change", t, new_layer_bytes(s, ref, base, layers)))
        with open(ctx / "dockyard" / "__init__.py", "a") as f:
            f.write("# bench: code-only change\n")
        t2, layers2 = timed_build(s, v, ctx, ref)
        rows.append(("rebuild after a code-only change", t2, new_layer_bytes(s, ref, layers, layers2)))
        size = engine.image_inspect(s, ref)["Size"]

        naive_ref = f"dockyard-bench/{v.name}:naive"
        (ctx / "Dockerfile.naive").write_text(NAIVE.format(base=build.base_image(s, v), variant=v.name, python=v.python,
                                                           os_packages=" ".join(v.os_packages)))
        (ctx / ".dockerignore").unlink()
        t = time.perf_counter()
        engine.run(engine.docker(s, "build", "-q", "--no-cache", "-f", str(ctx / "Dockerfile.naive"), "-t", naive_ref, str(ctx)),
                   env=engine.build_env(), capture=True, quiet=True)
        naive_time = time.perf_counter() - t
        naive_size = engine.image_inspect(s, naive_ref)["Size"]
    for r in (ref, naive_ref):
        subprocess.run(engine.docker(s, "rmi", "-f", r), capture_output=True)

    lines = [f"# Build benchmark ({v.name}, {os.cpu_count()} cores, {dt.date.today()})", "",
             "| step | seconds | new layer bytes | vs cold build |", "|---|---|---|---|"]
    for name, secs, nbytes in rows:
        lines.append(f"| {name} | {secs:.1f} | {'' if nbytes is None else f'{nbytes:,}'} | {secs / cold:.3f} |")
    lines += ["", "| image | size (bytes) | build seconds | size vs dockyard |", "|---|---|---|---|",
              f"| dockyard multi-stage | {size:,} | {cold:.1f} | 1.00 |",
              f"| naive single stage, same installs | {naive_size:,} | {naive_time:.1f} | {naive_size / size:.2f} |",
              "", "Targets: recipe- or code-only rebuild < 10 s and < 1 MB of new layers.",
              f"Recipe-only: {'PASS' if rows[1][1] < 10 and rows[1][2] < 1e6 else 'FAIL'}; "
              f"code-only: {'PASS' if rows[2][1] < 10 and rows[2][2] < 1e6 else 'FAIL'}."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / "build.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
