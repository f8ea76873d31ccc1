"""Locks, wheelhouses and image builds: each a plan (argv + env) built by a pure function, then run.

Flow: `lock` resolves a variant's pins into images/locks/<variant>.txt (hashes for linux x86_64);
`wheelhouse` downloads exactly those files to images/wheelhouse/<variant>/; `build` runs one
`docker build` of images/Dockerfile that installs only from that folder (no index), so the same build
works on an air-gapped host that received the wheelhouse.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from dockyard import engine
from dockyard.common import runfolder
from dockyard.common.errors import DockyardError, open_plain, short
from dockyard.common.locks import held_alone
from dockyard.common.run_settings import SAMPLES
from dockyard.common.tree import code_hash
from dockyard.common.units import duration
from dockyard.images import variants
from dockyard.images.variants import Variant
from dockyard.settings import ROOT, Settings

# manylinux tags pip must accept when downloading for the image instead of for this host: the lock is
# resolved for glibc 2.28 (older than every base image), so every tag up to manylinux_2_28.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 16, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def build(settings: Settings, name: str = "auto", *, no_cache: bool = False, devel: bool = False,
          dry: bool = False) -> str:
    began = time.monotonic()
    variant, why = variants.resolve(settings, name)
    if devel:
        variant = variant.on_devel_base()
        why += f", FROM its devel base {variant.base}"
    variants.say(why)
    check_lock(variant)  # the image's labels are the variant's pins: the lock it installs must hold them
    created = build_time()
    wheels = wheelhouse_dir(settings, variant)
    context = staged_context_dir(wheels, variant.name)
    plan = build_steps(settings, variant, no_cache=no_cache, revision=git_revision(), created=created, context=context,
                       code=code_hash())
    # what the wheelhouse download would find (a wheelhouse_dir under a file printed commands that could not run)
    runfolder.check_makeable(wheels, "set wheelhouse_dir (INVOKE_DOCKYARD_WHEELHOUSE_DIR) to a folder you can write")
    need_wheels = not wheelhouse_complete(settings, variant)
    if dry:
        if need_wheels:
            print(wheelhouse_steps(settings, variant).show())
        print(f"# in {context}: this checkout's build files, {wheels}/ and {variant.lock_file.name} as wheels/")
        print(plan.show())
        return variants.tag(settings, variant)
    too_old = engine_cannot_build(engine.engine_info(settings))
    if too_old:
        raise DockyardError(f"{too_old}: upgrade the engine to 20.10 or newer, or build on a host that has one and "
                            f"load the image here (`invoke save --variant={variant.name}` there, `sh load.sh` here)")
    if not variant.base and not engine.image_inspect(settings, base_image(settings, variant)):
        raise DockyardError(f"base image {base_image(settings, variant)} is missing: run `invoke setup` "
                            "(makes it with debootstrap) or set base_image_cpu in invoke.yaml")
    if need_wheels:
        download_wheelhouse(settings, variant)
    ref = variants.tag(settings, variant)
    before = engine.image_inspect(settings, ref)
    tracker = _StepTracker()
    with _only_build_of(context):
        shutil.rmtree(context, ignore_errors=True)
        copy_context(context, variant, wheels=wheels)
        try:
            with tracker.heartbeat():
                for argv, env in plan.steps:
                    engine.run(argv, env=env, on_line=tracker, what=f"building {ref}")
        except DockyardError as e:
            raise DockyardError(f"{tracker.failure()}\n{e}") from None
        finally:
            shutil.rmtree(context, ignore_errors=True)
    info = engine.image_inspect(settings, ref)
    took = duration(time.monotonic() - began)  # the whole command's, wheelhouse download included
    if before and before.get("Id") == info["Id"]:  # "built" read as if it had been made again, minutes of it
        print(f"{ref} is up to date: every step came from the build cache, the image is the one built before "
              f"({info['Size'] / 1e9:.2f} GB, id {info['Id'][7:19]}); checked in {took}")
    else:
        print(f"built {ref} in {took} ({info['Size'] / 1e9:.2f} GB, id {info['Id'][7:19]})")
    return ref


# images/Dockerfile's cache and bind mounts (RUN --mount) are stable in the engine's built-in Dockerfile frontend from
# Docker 20.10 on; 19.03's took them only after a `# syntax=` line, which pulls a frontend image (offline: fails)
BUILDS_FROM = (20, 10)


def engine_cannot_build(info: dict) -> str:
    """Why the engine `docker info` describes cannot build images/Dockerfile, or "" where it can (or cannot tell)."""
    version = info.get("ServerVersion")
    nums = [int(x) for x in re.findall(r"\d+", version)[:2]] if isinstance(version, str) else []
    # Docker's versions are YY.MM from 17.03 on: a smaller major is another engine behind the same API (Podman 4
    # and 5 build RUN --mount), not an old Docker
    if len(nums) == 2 and (17, 0) <= tuple(nums) < BUILDS_FROM:
        return (f"Docker {version} cannot build the images: its BuildKit reads RUN --mount (images/Dockerfile) only "
                "from 20.10 on, and fails with 'Unknown flag: mount'")
    return ""


def lock(settings: Settings, name: str = "all", dry: bool = False) -> None:
    if not (settings.index_url or settings.extra_index_url) and (pips := _pip_indexes()):
        # uv reads no pip configuration: the lock would resolve elsewhere than pip's wheelhouse downloads from
        print(f"warning: pip's configuration names {' and '.join(pips)}, which `invoke lock` does not use: it resolves "
              "with uv, which reads no pip configuration, against PyPI. To resolve against your index, set index_url "
              "(and extra_index_url) in invoke.yaml", file=sys.stderr)
    for variant in _selected(settings, name):
        requirements_in = variant.lock_file.with_suffix(".in")
        plan = lock_steps(settings, variant, requirements_in)
        if dry:
            print(plan.show())
            continue
        requirements_in.write_text("# Generated by `invoke lock` from images/variants.yaml; edit the pins there.\n"
                                   + variant.requirements_in)
        for argv, env in plan.steps:
            engine.run(argv, env=env, cwd=ROOT, what=f"locking {variant.name}")
        check_lock(variant)
        print(f"wrote {variant.lock_file.relative_to(ROOT)} ({len(lock_pins(variant))} packages, "
              f"sha256 {variants.lock_hash(variant)[:12]})")


def wheelhouse(settings: Settings, name: str = "auto", dry: bool = False) -> None:
    """`invoke wheelhouse` (and `invoke setup`'s): each variant's wheelhouse downloaded, unless it already matches its
    lock with every file at its size; `pip download` asked the index again for every file of a complete one."""
    for variant in _selected(settings, name):
        if wheelhouse_complete(settings, variant):
            print(f"wheelhouse {_shown(wheelhouse_dir(settings, variant))} matches {variant.lock_file.name}, every file "
                  "at its size: nothing to download")
            continue
        download_wheelhouse(settings, variant, dry)


def download_wheelhouse(settings: Settings, variant: Variant, dry: bool = False) -> None:
    plan = wheelhouse_steps(settings, variant)
    d = wheelhouse_dir(settings, variant)
    if holds_the_lock(d, variant):  # carried in without the stamps: pip, which asks the index first, failed offline
        print(f"wheelhouse {_shown(d)} holds every file of {variant.lock_file.name} (sha256 checked): nothing to "
              "download" + ("" if dry else ", stamped as downloaded"))
        if not dry:
            stamp_wheelhouse(d, variant)
        return
    if dry:
        print(plan.show())
        return
    variants.lock_hash(variant)  # a clear error when the lock is missing
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # pip's own traceback ("NotADirectoryError: '/dev/null/cpu'") said it otherwise
        raise DockyardError(f"cannot make the wheelhouse folder {d} ({e.strerror}): set wheelhouse_dir "
                            "(INVOKE_DOCKYARD_WHEELHOUSE_DIR) to a folder you can write") from None
    for argv, env in plan.steps:
        try:
            engine.run(argv, env=env, what=f"downloading the wheelhouse of {variant.name}")
        except DockyardError as e:
            raise FetchFailed(f"{e}\nwhere no package index answers: copy into {_shown(d)}/ the wheelhouse `invoke "
                                f"wheelhouse --variant={variant.name}` made on a host where one does (the files are "
                                "checked against the lock's sha256), or set index_url or find_links in invoke.yaml "
                                "to an index or folder that holds them") from None
    stamp_wheelhouse(d, variant)
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"wheelhouse {_shown(d)}: {len(list(d.iterdir())) - 1} files, {size / 2**20:.0f} MiB")


def _shown(d: Path) -> Path:
    return d.relative_to(ROOT) if d.is_relative_to(ROOT) else d


class FetchFailed(DockyardError):
    """A download from a mirror or an index failed (no network, none answering): `invoke setup` says what then."""


@dataclass
class BuildSteps:
    """Commands to run in order, with the environment each needs; printed as-is by --dry."""

    steps: list[tuple[list[str], dict[str, str]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def show(self) -> str:
        lines = [f"# {n}" for n in self.notes]
        lines += [engine.shown(argv, env) for argv, env in self.steps]
        return "\n".join(lines)


def build_steps(settings: Settings, variant: Variant, *, no_cache: bool = False, revision: str = "unknown",
               created: str = "", context: Path = ROOT, ref: str = "", code: str = "") -> BuildSteps:
    """The one `docker build` that makes the image of `variant` (tagged `ref`, default its versioned tag) from
    `context`, a folder copy_context made; `code` is the hash of the dockyard/ it holds (default: read there)."""
    args = {
        "BASE_IMAGE": base_image(settings, variant),
        "OS_PACKAGES": " ".join(variant.os_packages),
        "PYTHON": f"python{variant.python}",
        "DOCKYARD_DS_OPS": " ".join(variant.ds_ops),
        "DS_ACCELERATOR": "cuda" if variant.is_cuda else "cpu",
        "TORCH_CUDA_ARCH_LIST": variant.torch_cuda_arch_list,
        "BNB_CUDA": variant.cuda.replace(".", ""),
        "EXPECT_TORCH": variant.pins["torch"],
        "EXPECT_TRITON": variant.pins["triton"],
        "EXPECT_DEEPSPEED": variant.pins["deepspeed"],
        "EXPECT_CUDA": variant.cuda,
        "EXPECT_PINS": json.dumps({k: v for k, v in sorted(variant.pins.items()) if v}, separators=(",", ":")),
        # nvcc from the lock's wheels (cu132); a registry base brings its own, along with a second copy of the
        # CUDA libraries torch's wheels hold (the check then only warns); cu128 on the Debian base has none.
        "CUDA_TOOLKIT": "wheels" if variant.toolkit == "wheels" else "none",
        "CHECK_NVCC": "--nvcc" if variant.toolkit else "",
        "ALLOW_DUPLICATE_CUDA_LIBS": "--allow-duplicate-cuda-libs" if variant.toolkit == "base" else "",
        "EXPECT_CUDA_ARCHS": variants.cuda_archs(variant),
        "DOCKYARD_VARIANT": variant.name,
    }
    labels = variants.labels(variant, revision=revision, created=created, source=repository_url(),
                             code=code or code_hash(context / "dockyard"), base=base_image(settings, variant))
    argv = engine.docker(settings, "build", "--progress=plain", "-f", str(context / "images" / "Dockerfile"),
                         "-t", ref or variants.tag(settings, variant))
    for k, v in args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(str(context))
    return BuildSteps([(argv, engine.build_env())])


def lock_steps(settings: Settings, variant: Variant, requirements_in: Path, output: Path | None = None) -> BuildSteps:
    """`uv pip compile` of the variant's pins for linux x86_64 at the variant's Python, with hashes.

    Paths inside the project are given relative (run from the root) so the lock's comments are stable."""
    rel = lambda p: str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)  # noqa: E731
    argv = [sys.executable, "-m", "uv", "pip", "compile", rel(requirements_in),
            "--python-platform", "x86_64-manylinux_2_28", "--python-version", variant.python,
            "--generate-hashes", "--no-header", "--quiet", "-o", rel(output or variant.lock_file)]
    if "+cpu" in variant.pins["torch"] and not (settings.index_url or settings.find_links):
        # The CPU build of torch is not on PyPI: pip's own find-links (where configured) or PyTorch's CPU index.
        argv += ["--find-links", _pip_find_links() or "https://download.pytorch.org/whl/cpu"]
    env = {"SSL_CERT_FILE": settings.pip_ca_bundle} if settings.pip_ca_bundle else {}
    return BuildSteps([(argv, env | _index_env(settings, "UV_"))])


def wheelhouse_steps(settings: Settings, variant: Variant) -> BuildSteps:
    """pip download of every file in the lock, for the image's platform and Python, hash-checked."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "-r", str(variant.lock_file), "-d", str(wheelhouse_dir(settings, variant)),
            "--python-version", variant.python, "--implementation", "cp",
            *[a for p in PLATFORMS for a in ("--platform", p)]]
    env = {"PIP_CERT": settings.pip_ca_bundle} if settings.pip_ca_bundle else {}
    return BuildSteps([(argv, env | _index_env(settings, "PIP_"))])


def _index_env(settings: Settings, prefix: str) -> dict[str, str]:
    """The index settings as pip's (PIP_) or uv's (UV_) variables, which mean what --index-url ... mean: an index URL
    can hold a token, and a command line is readable by every user of the host (ps); the echo hides it (engine.shown)."""
    given = {"INDEX_URL": settings.index_url, "EXTRA_INDEX_URL": settings.extra_index_url,
             "FIND_LINKS": settings.find_links}
    for key, value in given.items():
        # pypi.corp/simple, the scheme left out: pip and uv took it for a folder here and said "torch was not found in
        # the package registry", naming neither the setting nor the URL (said here without the value: it may hold a
        # token)
        # (a relative folder: lock runs uv in the project root, wheelhouse pip where invoke was started)
        if any("://" not in word and not Path(word).exists() and not (ROOT / word).exists() for word in value.split()):
            setting = key.lower()
            raise DockyardError(f"the {setting} setting (INVOKE_DOCKYARD_{key}) is neither a URL nor a folder on this "
                                f"host: give the index's URL with its scheme (https://pypi.example.com/simple), or a "
                                "folder that exists")
    return {prefix + k: v for k, v in given.items() if v}


def _selected(settings: Settings, name: str) -> list[Variant]:
    """`invoke lock`'s variants: `all`, or one (its error's list of valid names says `all` too)."""
    known = variants.all_variants(settings)
    if name == "all":
        return list(known.values())
    if name != "auto" and name not in known:
        raise DockyardError(f"unknown variant {short(name)}; valid: all, auto, {', '.join(known)}")
    return [variants.resolve(settings, name)[0]]


def _pip_config() -> dict[str, str]:
    """pip's own settings (find-links, index-url, ...), from one `pip config list`: its environment variables (listed
    as `:env:`) over its files' [download] section (what the wheelhouse's `pip download` reads) over [global]."""
    out = engine.run([sys.executable, "-m", "pip", "config", "list"], capture=True, check=False, quiet=True).stdout
    by_key: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^([:\w]+)\.([\w-]+)='([^']*)'$", out, re.M):
        by_key.setdefault(m.group(2), {})[m.group(1)] = m.group(3)
    return {key: next((v[s] for s in (":env:", "download", "global") if v.get(s)), "") for key, v in by_key.items()}


def _pip_find_links() -> str:
    return _pip_config().get("find-links", "")


def _pip_indexes() -> list[str]:
    """The index settings of pip's configuration, named as pip names them (their URLs may hold a token)."""
    pip = _pip_config()
    return [key for key in ("index-url", "extra-index-url") if pip.get(key)]


def lock_pins(variant: Variant) -> dict[str, str]:
    """name → version of every package in the variant's lock file."""
    try:
        return variants.parse_lock_pins(variant.lock_file.read_text())
    except FileNotFoundError:
        raise DockyardError(f"no lock file for {variant.name} ({variant.lock_file.relative_to(ROOT)}): run `invoke "
                            f"lock --variant={variant.name}` first") from None


def check_lock(variant: Variant) -> None:
    """The lock must hold exactly the pinned versions (triton included: the one torch pins), and the CUDA
    runtime torch pulls must be the CUDA the variant is named and labelled for."""
    pins = lock_pins(variant)
    wrong = [f"{k} {pins.get(k, 'missing')} (pinned {v})" for k, v in variant.pins.items()
             if v and pins.get(k) != v]
    if variant.is_cuda:
        runtime = pins.get("nvidia-cuda-runtime") or pins.get("nvidia-cuda-runtime-cu12") or "missing"
        if ".".join(runtime.split(".")[:2]) != variant.cuda:
            wrong.append(f"the CUDA runtime torch pulls is {runtime} (the variant says cuda {variant.cuda})")
    if wrong:
        raise DockyardError(f"lock for {variant.name} disagrees with images/variants.yaml: {', '.join(wrong)}. "
                            "Fix the pins (triton must be the version torch requires) and run `invoke lock`.")


def wheelhouse_dir(settings: Settings, variant: Variant) -> Path:
    return settings.path(settings.wheelhouse_dir) / variant.name


WHEELHOUSE_STAMP = ".lock-sha256"  # the lock it was downloaded for (one line: what earlier versions read too)
WHEELHOUSE_FILES = ".files"  # `size name` of every file downloaded


def stamp_wheelhouse(d: Path, variant: Variant) -> None:
    files = sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
    (d / WHEELHOUSE_FILES).write_text("".join(f"{f.stat().st_size} {f.name}\n" for f in files), errors="replace")
    (d / WHEELHOUSE_STAMP).write_text(variants.lock_hash(variant) + "\n")


def holds_the_lock(d: Path, variant: Variant) -> bool:
    """Whether folder `d` holds, for every package of the variant's lock, a file of a sha256 the lock allows: a
    wheelhouse copied in from another host without its stamps (or its files alone) is complete as it is."""
    try:
        text = variant.lock_file.read_text()
        wanted, pins = variants.parse_lock_hashes(text), variants.parse_lock_pins(text)
        files = [f for f in d.iterdir() if not f.name.startswith(".")] if d.is_dir() else []
    except OSError:
        return False
    if not wanted or len(files) < len(wanted) or not all(wanted.values()):
        return False
    have: dict[str, Path] = {}
    for f in files:
        try:
            with open_plain(f, "wheel") as fh:  # a pipe or a device named like a wheel is no wheel
                have[hashlib.file_digest(fh, "sha256").hexdigest()] = f
        except (OSError, DockyardError):  # a folder, a file gone or unreadable: not one of the lock's
            continue
    if not all(allowed & have.keys() for allowed in wanted.values()):
        return False
    for name, allowed in wanted.items():
        check_named(have[min(allowed & have.keys())], name, pins.get(name, ""))
    return True


def check_named(f: Path, name: str, version: str) -> None:
    """A file of the lock's sha256 for `name`==`version` must be named so, or pip's --no-index finds no file for it and
    the build fails minutes in: a wheel saved by a browser from an index writes its version's + as %2B
    (torch-2.10.0%2Bcu128-...whl)."""
    if f.name.endswith(".whl"):  # name-version-[build-]python-abi-platform.whl, the name's - written _
        dist, _, rest = f.name.partition("-")
        said = rest.split("-")[0]
    else:  # a source archive: name-version.tar.gz, the name's - kept
        dist, _, said = re.sub(r"\.(tar\.gz|zip)$", "", f.name).rpartition("-")
    if variants.canonical_name(dist) == name and said.lower() == version.lower():
        return
    fixed = urllib.parse.unquote(f.name)
    rename = f"rename it to {fixed}" if fixed != f.name else f"name it as pip downloads it ({name}-{version}-...)"
    raise DockyardError(f"wheelhouse {_shown(f.parent)}: {f.name} holds {name}=={version} of the lock (its sha256), "
                        f"but its name says otherwise, and pip finds a package's files by name: {rename}")


def wheelhouse_complete(settings: Settings, variant: Variant) -> bool:
    """Downloaded for this lock, and every file still there at its size: a wheelhouse copied half to a node, or with a
    wheel deleted, failed the build minutes later inside pip. (One stamped by an earlier version lists no files.)"""
    d = wheelhouse_dir(settings, variant)
    try:
        if (d / WHEELHOUSE_STAMP).read_text().strip() != variants.lock_hash(variant):
            return False
        files = (d / WHEELHOUSE_FILES).read_text().splitlines() if (d / WHEELHOUSE_FILES).is_file() else []
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    changed = []
    for line in files:
        size, _, name = line.partition(" ")
        try:
            same = "/" not in name and (d / name).stat().st_size == int(size)
        except (OSError, ValueError):
            same = False
        if not same:
            changed.append(name)
    if changed:
        print(f"wheelhouse {d}: {len(changed)} of {len(files)} files missing or changed since they were downloaded "
              f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}): fetching them again")
    return not changed


def _git(*args: str, root: Path = ROOT) -> str | None:
    """A git command's output in the checkout, or None where git or the repository is missing."""
    try:
        proc = engine.run(["git", "-C", str(root), *args], capture=True, check=False, quiet=True)
    except DockyardError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_time() -> str:
    """The image's `created` label: SOURCE_DATE_EPOCH where set (reproducible builds' convention), else the time
    of the checkout's last commit, else now. A clock reading made every rebuild a new image, even one whose every
    layer came from the cache: a new id each time, and the old image left behind untagged."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip() or _git("log", "-1", "--format=%ct")
    try:
        when = dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch else None
    except (ValueError, OverflowError, OSError):
        raise DockyardError(f"SOURCE_DATE_EPOCH={epoch!r}: give the build's time as seconds since 1970 "
                            "(e.g. `git log -1 --format=%ct`), or unset it") from None
    return (when or dt.datetime.now(dt.timezone.utc)).replace(microsecond=0).isoformat()


def git_revision() -> str:
    rev = _git("rev-parse", "HEAD")
    if rev is None:
        return "unknown"
    return rev + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def repository_url(root: Path = ROOT) -> str:
    """Where the source lives for whoever gets the image: the `origin` remote without credentials, or "" (a local
    checkout path would mean nothing on another host and tells about this one)."""
    url = _git("remote", "get-url", "origin", root=root)
    if not url:
        return ""
    if "://" not in url:
        return "" if url.startswith(("/", ".", "file:")) or ":" not in url else url
    scheme, rest = url.split("://", 1)
    host_path = rest.split("@", 1)[-1] if "@" in rest.split("/", 1)[0] else rest  # drop user:token@
    return "" if scheme == "file" else f"{scheme}://{host_path}"


def warn_if_stale(image: dict, ref: str) -> None:
    """One line when the image was built from other code than this checkout's (recipes need no build: they
    are mounted from the checkout)."""
    labels = (image.get("Config") or {}).get("Labels") or {}
    built = labels.get(variants.CODE_LABEL, "")
    if built != code_hash():
        # which commit each is, where both are known: "older" or "other" is then the user's to tell
        rev, here = str(labels.get("org.opencontainers.image.revision", "")), git_revision()
        when = str(labels.get("org.opencontainers.image.created", ""))
        rev = rev if re.fullmatch(r"[0-9a-f]{7,64}(-dirty)?", rev) else ""  # a label is anyone's text: no escapes
        when = when if re.fullmatch(r"[0-9T:+.Z-]{10,32}", when) else ""
        revisions = (f" (image built from {rev[:12]}{'-dirty' if rev.endswith('-dirty') else ''}"
                     f"{f' of {when}' if when else ''}; this checkout is {here[:12]}"
                     f"{'-dirty' if here.endswith('-dirty') else ''})") if rev and here != "unknown" else ""
        print(f"warning: {ref} holds older (or other) code than this checkout's dockyard/{revisions}: `invoke build` "
              "to run your changes" if built else f"warning: {ref} predates code labels: it may run older code "
              "than this checkout's; `invoke build` to be sure", file=sys.stderr)


def base_image(settings: Settings, variant: Variant) -> str:
    return variant.base or settings.base_image_cpu


class _StepTracker:
    """Remembers the last BuildKit step line (`#12 [stage 2/4] RUN ...`) to name it when the build fails, and the
    reason BuildKit gives for a failed step: it ends an ERROR line that first repeats the whole command
    (`#10 ERROR: executor failed running [/bin/sh -c ...]: <reason>`), out of sight in a terminal."""

    STEP = re.compile(r"^(?P<n>#\d+) \[(?P<step>[^\]]+)\] (?P<what>.+)$")
    ERROR = re.compile(r"^(?P<n>#\d+) ERROR: (?P<error>.+)$")
    COMMAND = re.compile(r'^(?:executor failed running \[.*\]|process ".*" did not complete successfully): ', re.S)
    # a step's own output (`#12 4.31 ERROR: Could not find a version ...`): the first error line its tools printed,
    # pip's (ERROR:), apt's (E:) or a compiler's (file.cpp:3:10: fatal error: ...), is why it failed; BuildKit's
    # ERROR line says only "exit code: 1"
    OUTPUT = re.compile(r"^(?P<n>#\d+) \d+\.\d+ (?P<text>.+)$")
    TOOL_ERROR = re.compile(r"^(?:ERROR: (?!pip's dependency resolver)|E: )|(?:^|: )(?:fatal )?error: ")

    def __init__(self):
        self.last = ""
        self.reason = ""
        self._tool_errors: dict[str, str] = {}  # BuildKit's step number (#12) -> its first error line
        self._steps: dict[str, str] = {}  # and its name: stages build side by side, their lines interleaved
        self._began: dict[str, float] = {}  # and when it began: BuildKit prints a step's line again as it resumes
        self.failed = ""
        self._heard = self._step_began = time.monotonic()
        self._beaten = False  # whether the heartbeat spoke in this silence: its first word comes sooner

    def __call__(self, line: str) -> None:
        self._heard, self._beaten = time.monotonic(), False
        if m := self.STEP.match(line):
            step = f"[{m.group('step')}] {m.group('what')[:120]}"
            self._steps[m.group("n")] = step
            self.last, self._step_began = step, self._began.setdefault(m.group("n"), self._heard)
        elif m := self.ERROR.match(line):
            self.reason = self.COMMAND.sub("", m.group("error").strip())[:300]
            self.failed = self._steps.get(m.group("n"), "")
            if said := self._tool_errors.get(m.group("n")):
                self.reason += f"; it printed: {said}"
        elif (m := self.OUTPUT.match(line)) and m.group("n") not in self._tool_errors:
            text = m.group("text").strip()
            if self.TOOL_ERROR.search(text):
                self._tool_errors[m.group("n")] = text[:240]

    @contextlib.contextmanager
    def heartbeat(self, every: float = 60.0, first: float | None = None):
        """A step can print nothing for many minutes (pip compiling DeepSpeed's ops: 10-15 min per CUDA variant on 2
        cores): say that the build is alive, and where, after `first` seconds of silence (half of `every`: a user
        wonders sooner than once a minute), then every `every` seconds while the silence lasts."""
        stop = threading.Event()
        first = every / 2 if first is None else first

        def beat() -> None:
            while not stop.wait(first / 4):
                now = time.monotonic()
                if now - self._heard >= (every if self._beaten else first):
                    self._heard, self._beaten = now, True
                    hint = " (DeepSpeed's ops compile: 10-20 minutes cold)" if "deepspeed-build" in self.last else ""
                    print(f"build: still at {self.last or 'the start'}, {duration(now - self._step_began)} in this "
                          f"step{hint}", flush=True)

        thread = threading.Thread(target=beat, name="dockyard-build-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def failure(self) -> str:
        """`build failed at step ...: reason`, for the error's first line."""
        return f"build failed at step {self.failed or self.last or '(before the first step)'}" + (
            f": {self.reason}" if self.reason else "")


def staged_context_dir(wheels: Path, variant: str) -> Path:
    """Where `invoke build` stages its context: beside the wheelhouse (hard links need the same file system), at a
    path that stays the same from build to build (BuildKit then sends only what changed)."""
    return wheels.parent / f".context-{variant}"


def build_lock(context: Path) -> Path:
    """The lock file a build holds while it reads its staged `context`."""
    return context.parent / f"{context.name}.lock"


@contextlib.contextmanager
def _only_build_of(context: Path):
    """One build at a time per staged context: a second would remove the files the first is sending."""
    context.parent.mkdir(parents=True, exist_ok=True)
    with held_alone(build_lock(context), f"another build reads {context} (a build of the same "
                    "variant is under way): wait for it to finish, then build again"):
        yield


def _sample(path: Path) -> Path:
    """A sample the image carries (the data a run falls back on): a plain file of the checkout. One deleted was a
    FileNotFoundError traceback, one replaced by a link was followed (to /dev/zero: read without end)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = 0
    if not stat.S_ISREG(mode):
        what = "missing" if not mode else "a link" if stat.S_ISLNK(mode) else "not a plain file"
        raise DockyardError(f"{path} is {what}: every image carries it as the sample data a run falls back on; "
                            f"restore the checkout's own (`git -C {ROOT} checkout -- data/{path.name}`), then build again")
    return path


def copy_context(dst: Path, variant: Variant, wheels: Path | None = None) -> Path:
    """What the build reads: the checkout's build files copied; the variant's wheelhouse (`wheels`, default the
    checkout's) hard-linked and its lock copied into wheels/, which the Dockerfile bind-mounts by that fixed name
    (the build cache then holds one copy of the wheels, the context's, not a second in a build stage: 3-4 GB per
    CUDA variant). Also for rebuilds that edit files safely. Of data/, the samples only: a user's dataset kept there
    (`--data=data/mine.jsonl` is mounted) went into every image and every archive saved from it, a link there to
    /dev/zero into the context without end."""
    for name in ("dockyard", "recipes"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "data").mkdir()
    for sample in SAMPLES.values():
        shutil.copy2(_sample(ROOT / "data" / sample), dst / "data" / sample)
    (dst / "images").mkdir()
    for f in (ROOT / "images").iterdir():  # the Dockerfile and the scripts its steps bind-mount
        if f.is_file():
            shutil.copy2(f, dst / "images" / f.name)
    shutil.copytree(wheels or ROOT / "images" / "wheelhouse" / variant.name, dst / "wheels", copy_function=_linked,
                    ignore=_no_wheels)
    shutil.copy2(variant.lock_file, dst / "wheels" / "lock.txt")
    shutil.copy2(ROOT / ".dockerignore", dst / ".dockerignore")
    return dst


def _no_wheels(folder: str, names: list[str]) -> set[str]:
    """What of a wheelhouse folder is left out of the context: a link to nothing (a wheel its store has dropped since,
    beside the lock's), where linking the file it names failed the build; a link to what is no file (/dev/zero, a
    pipe, nor a pipe itself), which the copy below read without end, filling the disk; a link to a folder (/), which
    copytree walked whole. None is a wheel pip could take (--find-links reads the folder's own files)."""
    left = set()
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path) and (os.path.islink(path) or not os.path.isdir(path)):  # isfile: a plain file,
            left.add(name)                                                                   # through a link
    return left


def _linked(src: str, dst: str) -> None:
    """A wheel hard-linked into the context by the file it names: a wheelhouse carried in as links (`cp -s`, links
    into a shared store) passed the lock's check through them (holds_the_lock), and os.link linked the links
    themselves, which lead nowhere inside the build (pip failed there, minutes in). Copied where no hard link can be
    made: another file system, another user's file. Links to anything but a file are left out (_no_wheels)."""
    real = os.path.realpath(src)
    try:
        os.link(real, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM):
            raise
        shutil.copy2(real, dst)
