"""The image's user `dockyard` (UID 1000) also on bases that already have a UID 1000 (Ubuntu 24.04's `ubuntu`):
the Dockerfile's user step, run in a container of the cpu base image with and without such a user."""

from __future__ import annotations

import re
import subprocess

import pytest

from dockyard import ROOT

BASE = "dockyard-base:bookworm"


def user_step() -> str:
    text = (ROOT / "images" / "Dockerfile").read_text().replace("\\\n", " ")
    return re.search(r"&& (\{ u=\$\(getent passwd 1000.*?; \})", text).group(1)


def in_base(script: str) -> str:
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode:
        pytest.skip(f"{BASE} not built")
    proc = subprocess.run(["docker", "run", "--rm", BASE, "sh", "-ec", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("existing", ["", "useradd --create-home --uid 1000 ubuntu; "])
def test_user_1000_is_dockyard_whether_or_not_the_base_has_one(existing):
    out = in_base(f"{existing}{user_step()}; id dockyard; test -d /home/dockyard && echo home")
    assert "uid=1000(dockyard) gid=1000(dockyard)" in out and "home" in out
