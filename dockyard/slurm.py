"""`invoke slurm`: an sbatch script that runs `invoke run` once per node; Slurm allocates, torchrun's c10d
rendezvous does the rest (dockyard schedules nothing itself).

The script needs on every node this checkout and its Python (a shared filesystem, so the runs folder is shared
too), and a Docker engine. Node 0 is the first host of the allocation (`scontrol show hostnames`), each node's
rank is SLURM_NODEID. With --archive, each node first loads the image from that archive where it lacks it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from dockyard import variants
from dockyard.errors import DockyardError
from dockyard.recipes import load_recipe
from dockyard.settings import ROOT, Settings


def script(settings: Settings, *, recipe: str, nodes: int, gpus_per_node: int, overrides: list[str],
           variant: str = "auto", archive: str = "", master_port: int = 29500) -> str:
    """The sbatch script's text (pure)."""
    load_recipe(recipe)
    if nodes < 1:
        raise DockyardError(f"--nodes must be at least 1 (got {nodes})")
    if gpus_per_node < 0:
        raise DockyardError(f"--gpus-per-node must be 0 (CPU nodes) or more (got {gpus_per_node})")
    # auto: the nodes' GPUs, not this (login) host's, decide: the newest CUDA variant, or cpu without GPUs
    if variant == "auto":
        chosen = variants.newest_cuda(settings) if gpus_per_node else variants.resolve(settings, "cpu")[0]
    else:
        chosen = variants.resolve(settings, variant)[0]
    image = variants.tag(settings, chosen)
    invoke = shlex.join([sys.executable, "-m", "invoke"])
    runs = settings.path(settings.runs_dir)
    run = ["run", f"--recipe={recipe}", f"--variant={chosen.name}"]
    if gpus_per_node:
        run.append(f"--nproc={gpus_per_node}")
    if nodes > 1:
        run += ['--nodes="$SLURM_NNODES"', '--node-rank="$SLURM_NODEID"', '--master-addr="$MASTER_ADDR"',
                '--master-port="$MASTER_PORT"']
    run += ['--run-id="$RUN_ID"', '"$@"']
    if overrides:
        run += ["--", *(shlex.quote(o) for o in overrides)]
    lines = [
        "#!/bin/bash",
        f"# Written by `invoke slurm --recipe={recipe} --nodes={nodes} --gpus-per-node={gpus_per_node}`.",
        "#   sbatch THIS_FILE              # arguments after the file go to `invoke run`, e.g. --resume",
        "# One task per node, each running `invoke run`; node 0 (the first host) hosts torchrun's rendezvous.",
        f"#SBATCH --job-name=dockyard-{Path(recipe).name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
        "#SBATCH --exclusive",
        f"#SBATCH --output={runs}/slurm-%j.out",
        "set -euo pipefail",
        f"cd {shlex.quote(str(ROOT))}",
        "# Node 0's address as Slurm itself reaches it (NodeAddr; the node name where none is set): a node name",
        "# need not resolve on the other nodes, and inside a container a hostname can resolve to loopback.",
        'MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(scontrol show node \"$MASTER_NODE\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        'MASTER_ADDR=${MASTER_ADDR:-$MASTER_NODE}',
        f"export MASTER_ADDR MASTER_PORT=${{MASTER_PORT:-{master_port}}}",
        f'export RUN_ID=${{DOCKYARD_RUN_ID:-{Path(recipe).name}-slurm-$SLURM_JOB_ID}}',
    ]
    if archive:
        load = (f"docker image inspect {shlex.quote(image)} >/dev/null 2>&1 || "
                f"exec {invoke} load --file={shlex.quote(str(Path(archive).resolve()))}")
        lines += ["# The image on every node, from the archive where a node lacks it (`invoke save` wrote it).",
                  f"srun --ntasks-per-node=1 bash -c {shlex.quote(load)}"]
    # Single quotes: SLURM_NODEID is expanded on each node by its own bash, not here.
    lines += ["srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "
              + shlex.quote(f"exec {invoke} {' '.join(run)}") + ' bash "$@"']
    return "\n".join(lines) + "\n"


def write(settings: Settings, *, out: str = "", **kw) -> Path:
    """Write the script (default: <runs>/slurm/<recipe>-<nodes>n.sbatch), print it, and say how to submit it."""
    text = script(settings, **kw)
    path = Path(out) if out else settings.path(settings.runs_dir) / "slurm" / f"{Path(kw['recipe']).name}-{kw['nodes']}n.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    settings.path(settings.runs_dir).mkdir(parents=True, exist_ok=True)  # Slurm writes the job's output there
    path.write_text(text)
    path.chmod(0o755)
    print(text, end="")
    print(f"# written to {path}: submit it with `sbatch {path}`", file=sys.stderr)
    return path
