"""`invoke setup`: make a fresh host ready, idempotently — engine, cpu base image, wheelhouse."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.gpus import Host, read_host
from dockyard.images import build, variants
from dockyard.settings import ROOT, Settings

APT_PACKAGES = ["docker.io", "debootstrap", "zstd", "pigz", "openssh-client", "rsync"]


def setup(settings: Settings, mirror: str, dry: bool = False) -> None:
    check_mirror(mirror)
    ensure_engine(settings, dry)
    host = read_host()
    variant, why = variants.resolve(settings, "auto", host)
    variants.say(why)
    image = variants.tag(settings, variant)
    ready = f"ready: `invoke build run --recipe=zero2` builds {image} and trains in it"
    try:
        if not variant.base:  # every variant but one naming a registry base builds FROM the debootstrap image
            ensure_cpu_base(settings, mirror, dry)
        build.wheelhouse(settings, variant.name, dry=dry)  # nothing to download where it matches the lock
    except build.FetchFailed as e:
        run, flagged = trains_here(settings, variant, host)
        if not run:
            raise DockyardError(f"{e}; or build {image} on a host that reaches them and carry it here (README, "
                                f"\"Air-gapped, step by step\": `invoke build --variant={variant.name} && invoke save "
                                f"--variant={variant.name}` there, `sh load.sh` here)") from None
        # ready for what such a host is for, training in an image carried in (an air-gapped one): exit 0, so that
        # `invoke setup && invoke run` trains; what building needs is said, not failed on
        print(f"warning: {e}; {image} is here already: {run} trains in it{flagged}, the base image and the wheelhouse "
              "are needed only to build it again", file=sys.stderr)
        ready = f"ready to train: {run} trains in {image} (building it needs what the warning above says)"
    if not dry:
        give_to_sudo_user(build.wheelhouse_dir(settings, variant))
    if dry:
        print("dry run: nothing was installed, made or downloaded")
    else:
        print(ready)


def _is_debian() -> bool:
    return Path("/etc/debian_version").exists()


def ensure_engine(settings: Settings, dry: bool = False) -> None:
    try:
        info = engine.engine_info(settings)
        print(f"engine: Docker {info.get('ServerVersion')} answers ({info.get('Driver')})")
        return
    except DockyardError as e:
        if os.geteuid() != 0 or not _is_debian():
            raise
        host = os.environ.get("DOCKER_HOST", "")
        if host not in ("", "unix:///var/run/docker.sock", "unix:///run/docker.sock"):
            # another engine is asked for: a second one installed and started here would not be the one asked
            raise DockyardError(f"{e} (DOCKER_HOST={host}: setup installs and starts an engine only on this host; "
                                "start that engine, or unset DOCKER_HOST to use this host's)") from None
    steps = [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *APT_PACKAGES]]
    if engine.which("dockerd"):  # installed, not running: started, not installed again
        steps = []
    if dry:
        for s in steps:
            engine.echo(s)
        print("then start dockerd (systemctl, or setsid dockerd where no init system runs)")
        return
    for s in steps:
        engine.run(s, env={"DEBIAN_FRONTEND": "noninteractive"}, what="installing the Docker engine")
    engine.docker_binary.cache_clear()
    if Path("/run/systemd/system").exists():
        engine.run(["systemctl", "enable", "--now", "docker"], what="starting docker")
    else:
        engine.start_detached(["dockerd"], Path("/var/log/dockerd.log"))
    for _ in range(60):
        try:
            engine.engine_info(settings)
            print("engine: started")
            return
        except DockyardError:
            time.sleep(1)
    raise DockyardError("dockerd did not answer within 60 s: see /var/log/dockerd.log")


def debootstrap_steps(target: Path, mirror: str, suite: str = "bookworm") -> list[str]:
    return ["debootstrap", "--variant=minbase", suite, str(target), mirror]


def ensure_cpu_base(settings: Settings, mirror: str, dry: bool = False) -> None:
    name = settings.base_image_cpu
    try:
        present = engine.image_inspect(settings, name)
    except DockyardError:  # no engine to ask yet (a dry run before it is installed)
        if not dry:
            raise
        present = None
    if present and present.get("Size") == 0 and name.startswith("dockyard-base:"):  # an import of nothing (an
        # earlier setup's failed tar named it): every build would start FROM it; made again
        print(f"base image: {name} is empty (an earlier setup's import that failed): made again", file=sys.stderr)
        present = None
    if present:  # --dry too: it printed the debootstrap of a base image that was there
        print(f"base image: {name} present")
        return
    if not name.startswith("dockyard-base:"):
        argv = engine.docker(settings, "pull", name)
        engine.echo(argv) if dry else engine.run(argv, what=f"pulling {name}")
        return
    if not dry:
        check_debootstrap()
    with tempfile.TemporaryDirectory(prefix="dockyard-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        argv = debootstrap_steps(rootfs, mirror)
        tar, importer = ["tar", "-C", str(rootfs), "-c", "."], engine.docker(settings, "import", "-")
        if dry:
            engine.echo(argv)
            engine.echo_pipeline(tar, importer)
            engine.echo(engine.docker(settings, "tag", "IMPORTED_ID", name))
            return
        try:
            engine.run(argv, what="debootstrap of the cpu base image")
        except DockyardError as e:
            raise build.FetchFailed(f"{e}\nwhere {mirror} does not answer, give a Debian mirror that does (--mirror=URL, "
                                "over http: `invoke build` runs apt-get in the image from it too)") from None
        if not (rootfs / "bin" / "sh").exists():  # a debootstrap that said it succeeded and made no system
            raise DockyardError(f"debootstrap finished but left no system in {rootfs} (no /bin/sh): check that "
                                f"`{shutil.which('debootstrap')}` is Debian's debootstrap, then `invoke setup` again")
        import_base(settings, tar, importer, name)
    print(f"base image: {name} made with debootstrap from {mirror}")


def import_base(settings: Settings, tar: list[str], importer: list[str], name: str) -> None:
    """tar | docker import, then the name given to what was imported: only a whole import is tagged. A tar that
    failed part way would otherwise leave an empty or cut image under the base's name, which every build then
    starts FROM (one failed setup broke the builds after it); what a failed import made is removed."""
    with engine.Pipeline(tar, importer, stdout=engine.TAIL, what=f"importing {name}") as pipeline:
        pipeline.wait(check=False)
        imported = next((w for line in pipeline.output(whole=True) for w in line.split()
                         if re.fullmatch(r"sha256:[0-9a-f]{64}", w)), "")
        if any(pipeline.returncodes) or not imported:
            if imported:
                engine.run(engine.docker(settings, "rmi", imported), check=False, quiet=True, capture=True)
            pipeline.check()
            raise DockyardError(f"importing {name}: docker import printed no image id; run `invoke setup` again")
    engine.run(engine.docker(settings, "tag", imported, name), what=f"naming {name}")


def check_debootstrap() -> None:
    """debootstrap is here, and may run: it makes a root file system, so only root may (as another user it says
    "E: debootstrap can only run as root", which setup's fetch error then took for a mirror that does not answer).
    setup installs it only with the engine it installs: where an engine answers, the user installs it."""
    root = os.geteuid() == 0
    again = "then `invoke setup` again" if root else f"then `{engine.SUDO_SETUP}` (a venv's invoke is not on root's PATH)"
    if not shutil.which("debootstrap"):
        raise DockyardError(f"debootstrap is missing (setup installs it only where it installs the engine): "
                            f"`{'' if root else 'sudo '}apt-get install debootstrap`, {again}")
    if not root:
        raise DockyardError(f"making the cpu base image runs debootstrap, which only root may run: {again.removeprefix('then ')}")


def check_mirror(mirror: str) -> None:
    """--mirror as debootstrap takes it: an http(s) or file URL with no user or password, which debootstrap would write into
    the base image's /etc/apt/sources.list, so that every image built on it carried them."""
    try:
        parts = urllib.parse.urlsplit(mirror)
        parts.port  # noqa: B018 - read for its check: a port past 65535 or not a number is a ValueError
        url = (parts.scheme in ("http", "https") and parts.hostname) or (parts.scheme == "file" and parts.path)
    except ValueError:  # an IPv6 host without its closing bracket, a port out of range
        url = False
    if not url:
        raise DockyardError(f"--mirror={engine.shown([mirror])}: give a Debian mirror's URL, e.g. "
                            "http://deb.debian.org/debian (or file:///srv/debian for one on this host)")
    if re.search(r"[\s\x00-\x1f\x7f]", mirror):  # debootstrap writes it into sources.list: a line of its own
        raise DockyardError(f"--mirror={engine.shown([mirror])}: a URL holds no blank or control character")
    if parts.username or parts.password:
        raise DockyardError(f"--mirror={engine.shown([mirror])} holds a user or password: debootstrap writes the mirror "
                            "into the base image's /etc/apt/sources.list, and every dockyard image would carry it; give "
                            "a mirror that needs none (a local apt-cacher-ng, a proxy through http_proxy)")


def give_to_sudo_user(wheels: Path, checkout: Path = ROOT, environ=os.environ) -> None:
    """`sudo invoke setup` downloads the wheelhouse as root, and `invoke build` as the user (the README's next step)
    stages its context and takes its lock beside it: what root owns of the wheelhouse in the checkout goes back to the
    user sudo ran for. A wheelhouse_dir outside the checkout is the site's own, left as it is."""
    uid, gid = environ.get("SUDO_UID", ""), environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not (uid.isdigit() and gid.isdigit()) or uid == "0":
        return
    # the folders as they are: a wheelhouse_dir outside the checkout that links into it is still the site's own folder
    home, wheels = wheels.parent.resolve(), wheels.resolve()
    if not (home.is_relative_to(checkout.resolve()) and wheels.is_relative_to(checkout.resolve())):
        return
    owner = int(uid), int(gid)
    _give(str(home), None, owner)
    with contextlib.suppress(FileNotFoundError):  # the wheelhouse removed meanwhile: nothing of it to give
        for _, dirs, files, dfd in os.fwalk(wheels):  # by folder descriptor: no link followed, not even one swapped in
            for name in [".", *dirs, *files]:
                _give(name, dfd, owner)


def _give(name: str, dir_fd: int | None, owner: tuple[int, int]) -> None:
    """`name` (never a link's target) made the user's where root owns it; a file removed meanwhile is left alone. A
    file of several names is left too: one root downloaded has one, and a hard link the user made in the wheelhouse
    (where fs.protected_hardlinks is 0) to a file of root's (/etc/shadow) gave the user that file. Its names are
    counted before it is opened, by the name: the user's link, removed once it was opened (inotify says when), left
    the open file one name, and the count read then passed /etc/shadow."""
    try:  # checked and given through one descriptor: a name swapped between the two gives nothing
        named = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:  # removed meanwhile, or a link (O_NOFOLLOW: ELOOP), which is the user's own
        return
    try:
        st = os.fstat(fd)
        # the file named had one name, and it is the file opened: a file of root's elsewhere has a name there too
        alone = named.st_nlink == 1 and (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)
        if st.st_uid == 0 and (stat.S_ISDIR(st.st_mode) or (alone and st.st_nlink == 1)):
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def trains_here(settings: Settings, variant: variants.Variant, host: Host) -> tuple[str, str]:
    """The command that trains in the variant's image where it is here (loaded from an archive, built before), and why
    it takes a flag; ("", "") where it is not. --disable-require where the image's NVIDIA_REQUIRE_CUDA (a --devel
    build's nvidia/cuda base) leaves this driver out: plain `invoke run` refuses it."""
    try:
        here = engine.image_inspect(settings, variants.tag(settings, variant))
    except DockyardError:
        here = None
    if not here:
        return "", ""
    if variants.require_unmet(variant, here, host)[0]:
        return "`invoke run --disable-require`", " (its NVIDIA_REQUIRE_CUDA, from a --devel build's base, leaves this driver out)"
    return "`invoke run`", ""
