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
    assert shown("/opt/workspace/runs/x") == "/opt/workspace/runs/x", "a path that only ends the same"
    assert engine.container_paths_shown(["docker", "run", "image"])("/workspace/runs/x") == "/workspace/runs/x"


CHILD = """
import sys
from dockyard import engine
try:
    engine.run(["sh", "-c", "trap 'sleep 0.3; echo child-said-bye; exit 0' INT; echo ready; "
                            "while :; do sleep 0.05; done"], quiet=True)
except engine.Interrupted as e:
    print(f"stopped={e.stopped} exit={e.exit_code}", flush=True)
"""


def test_ctrl_c_shows_the_commands_last_words_and_says_whether_it_stopped(tmp_path):
    """Ctrl-C reaches the whole process group, as a terminal sends it: what the command says while it stops is
    shown (it was left unread), and whether it had stopped is known, not assumed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from dockyard import ROOT

    # as a terminal starts it: with SIGINT not ignored (a CI job started in the background ignores it, and so would
    # every process it starts)
    p = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert out.split() == ["child-said-bye", "stopped=True", "exit=130"], out
