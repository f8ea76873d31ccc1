"""What a `docker run`'s streamed output says of the paths it mounts: this host's, not the container's."""

from __future__ import annotations

from dockyard import engine


def test_the_paths_a_container_mounts_are_shown_as_this_hosts():
    """The trainer said "the weights of that step are in /workspace/runs/exp1/checkpoints/checkpoint-60": a path
    the user does not have."""
    argv = ["docker", "run", "-v", "/home/me/runs:/workspace/runs", "-v", "/data/chat.jsonl:/workspace/inputs/data:ro",
            "-v", "/home/me/dockyard/recipes:/opt/dockyard/recipes:ro", "image", "torchrun"]
    shown = engine.container_paths_shown(argv)
    assert shown("error: already at max_steps 60 (checkpoint-60): the weights are in "
                 "/workspace/runs/exp1/checkpoints/checkpoint-60\n") == (
        "error: already at max_steps 60 (checkpoint-60): the weights are in "
        "/home/me/runs/exp1/checkpoints/checkpoint-60\n")
    assert shown("read /workspace/inputs/data: 60 examples; recipe /opt/dockyard/recipes/zero2.") == \
        "read /data/chat.jsonl: 60 examples; recipe /home/me/dockyard/recipes/zero2."
    # only whole paths: another folder that starts the same, and what the image holds unmounted, stay as they are
    assert shown("/workspace/runs2/x and /workspace/other") == "/workspace/runs2/x and /workspace/other"
    assert engine.container_paths_shown(["docker", "run", "image"])("/workspace/runs/x") == "/workspace/runs/x"
