"""`invoke commit` decisions without an engine: secrets in a diff, the diff summary, drift from the lock."""

from __future__ import annotations

import datetime

from dockyard import commit

DIFF = """C /root
A /root/.cache
A /root/.cache/huggingface
A /root/.cache/huggingface/token
A /root/.ssh
A /root/.ssh/id_ed25519
A /root/.ssh/id_ed25519.pub
A /root/.ssh/known_hosts
A /work/.env
A /work/.env.example
D /root/.netrc
C /opt/venv/lib/python3.11/site-packages/peft-0.22.0.dist-info
A /opt/venv/lib/python3.11/site-packages/requests-2.32.3.dist-info
A /opt/venv/lib/python3.11/site-packages/requests-2.32.3.dist-info/METADATA
D /opt/venv/lib/python3.11/site-packages/accelerate-1.15.0.dist-info
A /opt/venv/lib/python3.11/site-packages/torch-2.13.0+cpu.dist-info
"""

LOCK = """accelerate==1.15.0 \\
    --hash=sha256:aa
peft==0.21.2 \\
    --hash=sha256:bb
torch==2.13.0+cpu \\
    --hash=sha256:cc
typing_extensions==4.12.2 ; python_version < "3.13" \\
"""


def test_secrets_in_the_diff_are_named():
    found = commit.find_secrets(commit.parse_diff(DIFF))
    assert found == [("/root/.cache/huggingface/token", "Hugging Face token"),
                     ("/root/.ssh/id_ed25519", "ssh private key"),
                     ("/work/.env", "env file")]


def test_drift_lists_packages_changed_by_hand_against_the_lock():
    pins = commit.lock_pins(LOCK)
    assert pins == {"accelerate": "1.15.0", "peft": "0.21.2", "torch": "2.13.0+cpu", "typing-extensions": "4.12.2"}
    assert commit.drift(commit.parse_diff(DIFF), pins) == [
        "peft==0.22.0 (lock: 0.21.2)", "requests==2.32.3 (lock: absent)", "-accelerate (lock: 1.15.0)"]


def test_diff_summary_counts_and_places():
    s = commit.diff_summary(commit.parse_diff(DIFF))
    assert s.startswith("12 added, 2 changed, 2 deleted; most under /root/.ssh (4)")


def test_default_tag_says_where_it_came_from():
    now = datetime.datetime(2026, 11, 22, 4, 5, 6)
    assert commit.default_tag("dockyard:0.1.0-cpu", "dockyard", now) == "dockyard:0.1.0-cpu-commit-20261122-040506"
    assert commit.default_tag("reg:5000/team/img", "dockyard", now) == "reg:5000/team/img:commit-20261122-040506"
    assert commit.default_tag("sha256:" + "a" * 64, "dockyard", now) == "dockyard:commit-20261122-040506"
