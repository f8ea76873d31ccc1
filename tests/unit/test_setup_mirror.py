"""`invoke setup --mirror`: the Debian mirror debootstrap makes the base image from, checked before anything runs."""

from __future__ import annotations

from tests.support.cli import invoke_here, short_error


def test_a_mirror_with_a_password_is_refused_before_it_lands_in_every_image(tmp_path):
    """debootstrap writes the mirror into the base image's /etc/apt/sources.list: a mirror with a user and token was
    carried by every dockyard image (and printed by setup --dry). It is refused, the token never printed."""
    r = invoke_here("setup", "--dry", "--mirror=https://alice:s3cr3t-tok@apt.corp.example/debian")
    short_error(r, "holds a user or password: debootstrap writes the mirror into the base image's /etc/apt/sources.list")
    assert "s3cr3t-tok" not in r.stdout + r.stderr and "https://***@apt.corp.example/debian" in r.stderr
    short_error(invoke_here("setup", "--dry", "--mirror=not a url"), "give a Debian mirror's URL")
    for mirror in ("http://deb.debian.org/debian", "file:///srv/debian"):  # a base image not made yet: debootstrap
        ok = invoke_here("setup", "--dry", f"--mirror={mirror}",
                         env={"INVOKE_DOCKYARD_BASE_IMAGE_CPU": "dockyard-base:not-made-in-tests"})
        assert ok.returncode == 0 and mirror in ok.stderr, ok.stderr  # debootstrap's command, as --dry echoes it
    # debootstrap writes it into sources.list as it is: a line break would be a line of its own
    short_error(invoke_here("setup", "--dry", "--mirror=http://x/debian\nevil"), "a URL holds no blank or control")
    # urllib's own ValueError was a traceback; a port past 65535 passed --dry, to fail inside debootstrap after the
    # engine was installed
    for mirror in ("http://[fd00::1/debian", "http://deb.debian.org:99999/debian", "http://deb.debian.org:x/debian"):
        short_error(invoke_here("setup", "--dry", f"--mirror={mirror}"), "give a Debian mirror's URL")
