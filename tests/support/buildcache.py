"""The engine's build cache, kept to what the suite needs."""

from __future__ import annotations

import subprocess

from dockyard import engine


def drop_context_copies(settings) -> None:
    """BuildKit keeps a copy of each build's context (its wheels: 3-4 GB per CUDA variant) to send only what
    changed next time; the suite has no use for them, and a CI machine may have only ~50 GB free."""
    subprocess.run(engine.docker(settings, "builder", "prune", "-f", "--filter", "type=source.local"),
                   capture_output=True, check=True)
