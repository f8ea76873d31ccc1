"""A one-node torchrun start on a node whose DNS server does not answer (an air-gapped node's resolv.conf), with and
without a hosts entry for ::ffff:127.0.0.1, side by side in one run.

    sudo python -m benchmarks.loopback_dns [--nproc 2] [--rounds 3]

torch's TCP store meets its own processes at ::ffff:127.0.0.1 and looks that address up by name; with no hosts entry
the lookup goes to the DNS server. A one-node run's container carries the entry (dockyard/launch/node.py,
LOOPBACK_V4MAPPED); this measures what it spares. The node is a network namespace of this machine
(tests/support/node2.py's silent_host: its only other address, in 198.18.0.0/15, is routed and never answers),
with its own resolv.conf naming that address and its own /etc/hosts (a mount namespace), so nothing is asked of
any real server. Each start is `torchrun --standalone` of processes that join a gloo group and pass one barrier;
the settings alternate, `--rounds` times. Writes benchmarks/results/loopback_dns.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report
from benchmarks.recipes import positive
from dockyard.launch.node import LOOPBACK_V4MAPPED
from tests.support import node2  # the namespace that never answers is shared infrastructure of tests and benchmarks

JOIN = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""
BOUND = 300  # seconds a start may take before it counts as failed


def start_seconds(prefix: list[str], folder: Path, hosts: str, nproc: int) -> float | None:
    """Seconds from launch to the end of a `torchrun --standalone` of `nproc` processes in the namespace, with
    `hosts` as its /etc/hosts; None where it failed or passed BOUND."""
    import subprocess

    (folder / "hosts").write_text(hosts)
    inner = (f"mount --bind {folder / 'resolv.conf'} /etc/resolv.conf && mount --bind {folder / 'hosts'} /etc/hosts "
             f'&& exec "$0" -m torch.distributed.run --standalone --nproc-per-node={nproc} {folder / "join.py"}')
    t = time.monotonic()
    try:
        p = subprocess.run([*prefix, "unshare", "-m", "sh", "-c", inner, sys.executable], capture_output=True,
                           text=True, timeout=BOUND)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - t if p.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=positive, default=2, help="processes per start (default 2)")
    ap.add_argument("--rounds", type=positive, default=3, help="starts per setting (default 3)")
    opts = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("error: this makes a network and a mount namespace: run it as root")
    own = Path("/etc/hosts").read_text()
    plain = "".join(line + "\n" for line in own.splitlines() if "::ffff:127.0.0.1" not in line)
    name, address = LOOPBACK_V4MAPPED
    settings = {"no entry for ::ffff:127.0.0.1 (a host's /etc/hosts)": plain,
                f"`{address} {name}` (a one-node run's container)": plain + f"{address} {name}\n"}
    times: dict[str, list[float | None]] = {s: [] for s in settings}
    with node2.silent_host() as (prefix, silent), tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "resolv.conf").write_text(f"nameserver {silent}\n")
        (folder / "join.py").write_text(JOIN)
        for _ in range(opts.rounds):
            for setting, hosts in settings.items():
                times[setting].append(start_seconds(prefix, folder, hosts, opts.nproc))
    medians = {s: statistics.median(t for t in ts if t is not None) if any(t is not None for t in ts) else None
               for s, ts in times.items()}
    with_entry = list(medians.values())[-1]
    lines = report.header("A one-node torchrun start whose DNS server does not answer",
                          f"torchrun --standalone, {opts.nproc} processes joining a gloo group and one barrier",
                          f"median of {opts.rounds} starts per setting, alternating; a failed start or one past "
                          f"{BOUND} s is counted as failed")
    lines += ["| /etc/hosts | start (s, median) | failed | time vs the entry |", "|---|---|---|---|"]
    for setting, ts in times.items():
        m = medians[setting]
        ratio = f"{m / with_entry:.1f}x" if m is not None and with_entry else "-"
        lines.append(f"| {setting} | {'-' if m is None else f'{m:.1f}'} | {sum(t is None for t in ts)} of {len(ts)} "
                     f"| {ratio} |")
    report.write("loopback_dns", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
