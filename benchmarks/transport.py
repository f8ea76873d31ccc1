"""Moving an image to another node: the usual manual way against dockyard's, side by side in one run.

    python -m benchmarks.transport [--image=dockyard:0.1.0-cpu]

Starts a second node on this machine (tests/support/node2.py: its own dockerd in a network
namespace, reached over ssh on a veth pair), then measures, on the same image:
  (0) `docker save > /dev/null`: the engine's own limit;
  (a) the baseline: `docker save | gzip` + scp + `docker load -i` there;
  (b) `invoke save` (zstd) + `invoke ship --load`;
  (c) the same as a thin archive after a recipe-only change (a new top layer);
  (d) `invoke ship --image` (stream mode: save, compress, copy and load overlap).
Prints seconds and bytes per stage and the ratios; writes benchmarks/results/transport.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report
from dockyard import engine
from dockyard.images import variants
from dockyard.settings import load as load_settings
from dockyard.transport import layout, ship
from dockyard.transport import save as save_mod
from tests.support import node2  # the second node is shared infrastructure of tests and benchmarks

REPEAT = 2


def timed(fn):
    t = time.monotonic()
    out = fn()
    return time.monotonic() - t, out


def sh(argv, env=None):
    return engine.run(argv, env=env, capture=True, quiet=True)


def save_into(docker: list[str], image: str, dest: Path | str, *filters: list[str]) -> None:
    """`docker save IMAGE [| filter ...] > dest` through the project's runner (engine.Pipeline)."""
    with open(dest, "wb") as f, engine.Pipeline([*docker, "save", image], *filters, stdout=f, quiet=True) as p:
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="")
    args = ap.parse_args()
    settings = load_settings({})
    image = args.image or variants.tag(settings, variants.resolve(settings, "cpu")[0])
    if engine.image_inspect(settings, image) is None:
        sys.exit(f"no image {image}: build it first (invoke build --variant=cpu)")
    docker = engine.docker(settings)
    rows: list[tuple[str, float, int]] = []
    work = Path(tempfile.mkdtemp(prefix="dy-bench-"))
    recipe_tag = f"dockyard-bench-recipe:{os.getpid()}"
    node = node2.start()
    try:
        s = settings.model_copy(update={"ssh": node.ssh_command, "layer_cache": work / "layer-cache"})
        ssh = ["ssh", "-F", node.ssh_config, node.alias]

        out = work / "dist"
        raw = work / "raw.tar.zst"
        level = layout.DEFAULT_LEVEL["zstd"]
        # The next version of the image: a recipe-only change, one new top layer.
        ctx = work / "ctx"
        ctx.mkdir()
        (ctx / "recipe.yaml").write_text(f"# a recipe-only change, {time.time()}\nlearning_rate: 2.0e-5\n")
        (ctx / "Dockerfile").write_text(f"FROM {image}\nCOPY recipe.yaml /opt/dockyard/recipe-bench.yaml\n")
        sh([*docker, "build", "-q", "-t", recipe_tag, ctx], env=engine.build_env())
        # Other work shares the cores: the engine's limit and the saves compared with it are each taken
        # as the best of REPEAT runs, interleaved (the first, untimed, warms the page cache). A cold save
        # starts from an empty layer cache; the save of the next version then finds the layers it shares.
        save_into(docker, image, os.devnull)
        limit, limit_next, save_b, save_next = [], [], [], []
        for _ in range(REPEAT):
            shutil.rmtree(s.layer_cache, ignore_errors=True)
            limit.append(timed(lambda: save_into(docker, image, os.devnull))[0])
            t, m = timed(lambda: save_mod.save(s, image=image, out=str(out)))
            save_b.append(t)
            limit_next.append(timed(lambda: save_into(docker, recipe_tag, os.devnull))[0])
            t, m_next = timed(lambda: save_mod.save(s, image=recipe_tag, out=str(work / "next")))
            save_next.append(t)
        shutil.rmtree(work / "next")
        t_raw, _ = timed(lambda: save_into(docker, image, raw, ["zstd", "-T0", f"-{level}", "-q"]))
        tar = int(sh([*docker, "image", "inspect", "--format", "{{.Size}}", image]).stdout)
        rows += [("(0) docker save > /dev/null", min(limit), tar),
                 (f"(0) docker save | zstd -T0 -{level} > file (no checks)", t_raw, raw.stat().st_size)]
        raw.unlink()

        gz = work / "baseline.tar.gz"
        t1, _ = timed(lambda: save_into(docker, image, gz, ["gzip", "-6"]))
        t2, _ = timed(lambda: sh(["scp", "-q", "-F", node.ssh_config, gz, f"{node.alias}:{node.base}/"]))
        t3, _ = timed(lambda: sh([*ssh, f"docker load -i {node.base}/{gz.name}"]))
        rows += [("(a) docker save | gzip -6", t1, gz.stat().st_size), ("(a) scp", t2, gz.stat().st_size),
                 ("(a) docker load -i (node 2)", t3, 0)]
        node.wipe()

        path = out / m["archive"]
        t2, _ = timed(lambda: ship.ship_file(s, str(path), f"{node.alias}:{node.base}/dist", load=True))
        rows += [(f"(b) invoke save (zstd -{level}), empty layer cache", min(save_b), m["archive_bytes"]),
                 ("(b) invoke ship --load (copy, verify, load)", t2, m["archive_bytes"]),
                 ("(b') invoke save of the next version (recipe-only change), full, layers cached",
                  min(save_next), m_next["archive_bytes"])]

        t1, mt = timed(lambda: save_mod.save(s, image=recipe_tag, out=str(out), thin_for=f"ssh://{node.alias}"))
        t2, _ = timed(lambda: ship.ship_file(s, str(out / mt["archive"]), f"{node.alias}:{node.base}/dist", load=True))
        rows += [("(c) invoke save --thin-for=ssh://node2", t1, mt["archive_bytes"]),
                 ("(c) invoke ship --load", t2, mt["archive_bytes"])]
        node.wipe()

        t, _ = timed(lambda: ship.ship_image(s, image, node.alias))
        rows.append(("(d) invoke ship --image (stream, loads)", t, 0))
    finally:
        node2.stop(node)
        engine.run([*docker, "image", "rm", "-f", recipe_tag], capture=True, check=False, quiet=True)
        shutil.rmtree(work, ignore_errors=True)

    write_report(rows, image, min(save_b) / min(limit), min(save_next) / min(limit_next), m_next["archive_bytes"])


def write_report(rows: list[tuple[str, float, int]], image: str, save_ratio: float, next_ratio: float,
           next_bytes: int) -> None:
    by = lambda prefix: [(t, b) for name, t, b in rows if name.startswith(prefix)]  # noqa: E731
    total = {k: sum(t for t, _ in by(k)) for k in ("(a)", "(b)", "(c)")}
    size = {k: max(b for _, b in by(k)) for k in ("(a)", "(b)", "(c)")}
    ratios = [
        ("end to end, (a) ÷ (b): dockyard's speed-up", total["(a)"] / total["(b)"], "≥ 2"),
        ("bytes shipped, (b) ÷ (a)", size["(b)"] / size["(a)"], "≤ 1"),
        (f"save, (b) ÷ engine limit (0), best of {REPEAT} each, interleaved", save_ratio, "≤ 1.3"),
        ("save of the next version (full archive, layers cached) ÷ its engine limit", next_ratio, "≤ 1.3"),
        ("bytes shipped, thin (c) ÷ full (b)", size["(c)"] / size["(b)"], "< 0.01"),
        ("end to end, (a) ÷ stream (d)", total["(a)"] / by("(d)")[0][0], ""),
    ]
    lines = [*report.header(f"Transport benchmark: {image}",
                            "node 2 = a network namespace on the same machine (veth, real ssh)", "One run."),
             "| stage | seconds | bytes |", "|---|---:|---:|"]
    lines += [f"| {name} | {t:.1f} | {b:,} |" if b else f"| {name} | {t:.1f} | |" for name, t, b in rows]
    lines += ["", f"Totals: (a) {total['(a)']:.1f} s, (b) {total['(b)']:.1f} s, (c) {total['(c)']:.1f} s.", "",
              "| ratio | measured | target |", "|---|---:|---:|"]
    lines += [f"| {name} | {v:.3f} | {target} |" for name, v, target in ratios]
    lines += ["", f"The next version's full archive: {next_bytes:,} bytes (the same layers, frames copied)."]
    report.write("transport", lines)


if __name__ == "__main__":
    main()
