"""`invoke commit`: a container to an image, without the secrets `docker commit` would capture.

The new image's labels say where it came from (source image, container, time, a summary of
`docker diff`) and how its Python packages drifted from the lock file the source image was built
from. Drift is read from the diff itself: every `*.dist-info` folder added, changed or deleted under
site-packages after the build is a package installed, upgraded or removed by hand. That works on a
stopped container too, and runs nothing inside it.
"""

from __future__ import annotations

import collections
import datetime
import fnmatch
import hashlib
import json
import re
import shlex

from dockyard import console, engine
from dockyard.common.errors import DockyardError, short
from dockyard.images.variants import all_variants, canonical_name, of_tag, parse_lock_pins
from dockyard.settings import IMAGE_NAME, ROOT, Settings

# (pattern on the path, what it is): files that hold credentials in the usual places.
SECRETS = [
    ("*/.cache/huggingface/token", "Hugging Face token"),
    ("*/.cache/huggingface/stored_tokens", "Hugging Face tokens"),
    ("*/.huggingface/token", "Hugging Face token"),
    ("*/.netrc", "netrc credentials"),
    ("*/.ssh/id_*", "ssh private key"),
    ("*/.git-credentials", "git credentials"),
    ("*/.aws/credentials", "AWS credentials"),
    ("*/.config/gcloud/*credentials*", "Google Cloud credentials"),
    ("*/.azure/*token*", "Azure tokens"),
    ("*/.docker/config.json", "registry credentials"),
    ("*/.kube/config", "Kubernetes credentials"),
    ("*/.pypirc", "package index credentials"),
    ("*/.env", "env file"),
    ("*/.env.*", "env file"),
    ("*.env", "env file"),
]
NOT_SECRET = (".pub", ".example", ".sample", ".template")
# (pattern on content, what it is): tokens wherever they were left, in a changed file or the environment.
TOKENS = [
    (re.compile(rb"\bhf_[A-Za-z0-9]{30,}"), "Hugging Face token"),
    (re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "AWS access key id"),
    (re.compile(rb"(?i)aws_secret_access_key\s*[=:]\s*\S{40}"), "AWS secret access key"),
    (re.compile(rb"\bgh[pousr]_[A-Za-z0-9]{36,}|\bgithub_pat_[A-Za-z0-9_]{40,}"), "GitHub token"),
    (re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"), "private key"),
    (re.compile(rb"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "Slack token"),
    (re.compile(rb"\bglpat-[A-Za-z0-9_-]{20,}"), "GitLab token"),
    (re.compile(rb"\bsk-ant-[A-Za-z0-9_-]{20,}"), "Anthropic API key"),
    (re.compile(rb"\bsk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}|[A-Za-z0-9]{40,})"), "OpenAI API key"),
    (re.compile(rb"PuTTY-User-Key-File-\d"), "PuTTY private key"),
    # scheme://user:password@host (a database URL, an index URL with its credentials); not ${VAR} placeholders
    (re.compile(rb"\b[a-z][a-z0-9+.-]{1,20}://[^\s:/@'\"$]+:[^\s/@'\"${}]{3,}@[A-Za-z0-9.-]"), "password in a URL"),
    # NAME=value on one line where the name says a secret (HF_TOKEN=..., api_key: ...), the value 16 characters or
    # more with a digit in them, no placeholder ($VAR, <...>, {...}): MAX_TOKENS = 2048, TOKENIZER_PATH=...,
    # tokenizer.pad_token = tokenizer.eos_token and api_key: ENV_VAR_OPENAI_APIKEY are not
    (re.compile(rb"(?i)\b[a-z0-9_]*(?:token|secret|password|passwd|api_?key|access_?key)['\"]?[ \t]*[=:][ \t]*['\"]?"
                rb"(?=[A-Za-z_+/.=-]*[0-9])[A-Za-z0-9_+/.=-]{16,}"), "secret assigned by its name"),
]
# a variable whose name says it holds a secret: *TOKEN*, *_KEY, *_AUTH ...; NOT_SECRET_NAMES: what images and shells
# set that only sounds like one (GPG_KEY: a public key's fingerprint, in the python images; the ssh agent's socket)
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL|(?:^|_)AUTH$|(?:^|_)KEY$",
                         re.I)
NOT_SECRET_NAMES = {"GPG_KEY", "SORT_KEY", "PUBLIC_KEY", "CACHE_KEY", "PRIMARY_KEY", "PARTITION_KEY"}
# What one commit reads back: text files are where tokens are left, read whole up to SCAN_BYTES (a log's last
# line too; a longer one, a dataset, in its first SCAN_BYTES, said after the commit); a file with a NUL byte in its
# first block is binary (weights, libraries, archives) and not read. Each file is one `docker cp` (some 20 a
# second); past SCAN_FILES the commit is refused, not made with files unread.
SCAN_BYTES, SCAN_FILES, BLOCK = 64 << 20, 2000, 1 << 16
# Not read for tokens: what pip installed from wheels, and the caches tools fill from downloads (wheels, model and
# dataset blobs, compiled kernels, package lists). Nothing a user writes lands there, and one `pip install` or
# model download puts thousands of files in them. The token files that do live under ~/.cache (huggingface/token)
# are found by their path (SECRETS), which is checked for every file.
NOT_SCANNED = ("/site-packages/", "/dist-packages/", "/__pycache__/",
               "/.cache/pip/", "/.cache/uv/", "/.cache/huggingface/hub/", "/.cache/huggingface/xet/",
               "/.cache/huggingface/datasets/",
               "/.cache/torch/", "/.triton/cache/")  # anywhere in a path
NOT_SCANNED_ROOTS = ("/var/cache/", "/var/lib/apt/lists/", "/proc/", "/sys/", "/dev/")  # from / only: ~/dev/ is read
DIST_INFO = re.compile(r"/site-packages/([^/]+?)-([^/-]+)\.(?:dist|egg)-info$")


def commit(settings: Settings, container: str, tag: str = "", allow_secrets: bool = False) -> str:
    """Commit a container to an image; returns the tag."""
    if not container:
        raise DockyardError("--container is required: the name or id of a container (see `docker ps -a`)")
    engine.reference(container, "container")
    if tag:
        check_tag(tag)
        check_not_a_build(settings, tag)
    got = engine.run(engine.docker(settings, "container", "inspect", container), capture=True, check=False,
                     quiet=True)
    if got.returncode != 0:
        engine.check_not_missing(got)
        if engine.image_inspect(settings, container):  # --container=dockyard:0.1.0-cpu: the image it was started from
            raise DockyardError(f"{container} is an image, not a container: give the container to commit, one started "
                                "from it (`docker ps -a` lists them; `invoke shell --keep` keeps the one you leave)")
        raise DockyardError(f"no container {container}: see `docker ps -a`")
    found = engine.docker_json(settings, got.stdout, "container inspect", list)
    meta = found[0] if found and isinstance(found[0], dict) else None
    if meta is None or not isinstance(meta.get("Config"), dict) or "Image" not in meta:
        raise DockyardError(f"`{engine.shown(engine.docker(settings, 'container', 'inspect', container))}` did not "
                            "answer as a Docker client does: the docker setting (INVOKE_DOCKYARD_DOCKER) must name the "
                            "docker program")
    diff = own_changes(parse_diff(engine.run(engine.docker(settings, "diff", container), capture=True,
                                             quiet=True).stdout), mount_points(meta))
    secrets = find_secrets(diff) + env_secrets(meta["Config"].get("Env") or [])
    found, unread, partly = content_secrets(settings, container, diff, {path for path, _ in secrets})
    secrets += found
    if (secrets or unread) and not allow_secrets:
        raise DockyardError(refusal(container, secrets, unread, running=bool((meta.get("State") or {}).get("Running"))))
    source = meta["Config"].get("Image") or meta["Image"]
    src_meta = engine.image_inspect(settings, meta["Image"]) or {}
    pins, note = source_lock((src_meta.get("Config") or {}).get("Labels") or {})
    drifted = drift(diff, pins)
    now = datetime.datetime.now(datetime.timezone.utc)
    tag = tag or default_tag(source, settings.image_name, now)
    labels = {
        "dockyard.commit.source": f"{source} ({meta['Image']})",
        "dockyard.commit.container": f"{meta['Name'].lstrip('/')} ({meta['Id'][:12]})",
        "dockyard.commit.created": now.isoformat(timespec="seconds"),
        "dockyard.commit.diff": diff_summary(diff),
        "dockyard.drift": note + ("; ".join(drifted) if drifted else "none"),
    }
    if secrets:
        labels["dockyard.commit.secrets"] = ", ".join(path for path, _ in secrets)
    engine.run(commit_argv(settings, container, tag, labels), capture=True, what="docker commit")
    print(f"committed {container} → {tag}")
    print(f"  {labels['dockyard.commit.diff']}")
    print(f"  drift from the lock: {labels['dockyard.drift']}")
    if secrets:
        print(f"  WARNING: holds {len(secrets)} secret file(s) (--allow-secrets): do not push or ship it")
    if unread:
        print(f"  WARNING: {len(unread)} changed files were not read for tokens (--allow-secrets), most under "
              f"{most_under(unread)}")
    if partly:
        print(f"  note: {len(partly)} text file(s) longer than {console.human(SCAN_BYTES)} were read for tokens in "
              f"that much of their start only, most under {most_under(partly)}")
    if not secrets:  # the step after it: what a commit is for, carrying the image to another node
        print(f"next: invoke save --image={shlex.quote(tag)} writes it as an archive to carry to another node")
    return tag


def check_tag(tag: str) -> None:
    """A tag `docker commit` takes, checked before the diff is read (minutes, for a container of thousands of changed
    files): an upper-case name, a tag past 128 characters or a digest were refused by docker only then, as "invalid
    reference format" under its whole command line."""
    if len(tag) > 255 or not IMAGE_NAME.fullmatch(engine.reference(tag, "--tag")) or "@" in tag:
        raise DockyardError(f"--tag {short(tag)} is not a tag docker takes: [registry[:port]/]name[:tag] with the name "
                            "in lowercase letters, digits and . _ - /, the tag in letters, digits and . _ - (up to 128, "
                            "not starting with . or -), no @digest; e.g. team/dockyard:v1")


def check_not_a_build(settings: Settings, tag: str) -> None:
    """A commit never takes a built image's own tag (<image_name>:<version>-<variant>): it would keep the build's
    labels (its lock, its code), and run, save and ship would take a container changed by hand for that build."""
    if variant := of_tag(settings, tag):
        raise DockyardError(f"--tag={tag} is the tag `invoke build --variant={variant.name}` gives its image: a "
                            "container committed under it would pass for that reproducible build. Give another "
                            "tag, or leave --tag out for a dated one")
    # nor a base a build starts FROM: `invoke build` took the container changed by hand into every image built on it
    built_on = [name for name, v in all_variants(settings).items()
                if engine.familiar(tag) in {engine.familiar(b) for b in (v.base or settings.base_image_cpu,
                                                                         v.devel.base if v.devel else "") if b}]
    if built_on:
        raise DockyardError(f"--tag={tag} is the base image `invoke build` builds {', '.join(built_on)} from: a "
                            "container committed under it would be built into each of them. Give another tag, or "
                            "leave --tag out for a dated one")


def refusal(container: str, secrets: list[tuple[str, str]], unread: list[str], running: bool = True) -> str:
    """Why a commit is refused: the secrets found, and the changed files that were not read; how to remove them
    from the container as it is (`docker exec` needs it running: a stopped one is started first)."""
    start = "" if running else f"docker start {container}, then "
    said = []
    if secrets:
        listed = "\n".join(f"  {path}  ({what})" for path, what in secrets)
        said.append(f"container {container} holds what looks like secrets; `docker commit` would put them in the "
                    f"image:\n{listed}\nRemove them ({start}docker exec {container} rm ...; a variable: start the "
                    "container without it) or, if they must be there, pass --allow-secrets.")
    if unread:
        said.append(f"container {container} changed more files than are read for tokens: {len(unread)} past the "
                    f"first {SCAN_FILES} were not read, most under {most_under(unread)}. Remove what need not be in "
                    f"the image ({start}docker exec {container} rm -r ...), or, having checked them yourself, pass "
                    "--allow-secrets.")
    return "\n".join(said)


def parse_diff(text: str) -> list[tuple[str, str]]:
    """`docker diff` lines ("A /path", "C /path", "D /path") as (kind, path)."""
    return [(line[0], line[2:]) for line in text.splitlines() if len(line) > 2 and line[1] == " "]


def mount_points(meta: dict) -> list[str]:
    """Where the engine mounted something into the container (`docker container inspect`'s Mounts; with --init its
    docker-init, at /sbin, /usr/sbin on a merged /usr)."""
    points = [m["Destination"] for m in meta.get("Mounts") or [] if isinstance(m, dict) and m.get("Destination")]
    if (meta.get("HostConfig") or {}).get("Init"):
        points += ["/sbin/docker-init", "/usr/sbin/docker-init"]
    return points


def own_changes(diff: list[tuple[str, str]], mounts: list[str]) -> list[tuple[str, str]]:
    """The diff without the mounts: `docker diff` lists each mount point and the folders made to hold it as changes,
    while what is mounted stays out of the image (the commit keeps an empty mount point). Neither is the container's
    own change, nor a file to read for secrets (a mounted ~/.netrc is the host's)."""
    def mounted(path: str) -> bool:
        return any(path == m or path.startswith(m.rstrip("/") + "/") or m.startswith(path.rstrip("/") + "/")
                   for m in mounts)
    return [(kind, path) for kind, path in diff if not mounted(path)]


def find_secrets(diff: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(path, what) for every added or changed file that looks like a credential."""
    found = []
    for kind, path in diff:
        if kind == "D" or path.endswith(NOT_SECRET):
            continue
        what = next((w for pattern, w in SECRETS if fnmatch.fnmatch(path, pattern)), None)
        if what:
            found.append((path, what))
    return found


def env_secrets(env: list[str]) -> list[tuple[str, str]]:
    """(`env NAME`, what) for every variable whose value is a token, or whose name says it holds one."""
    found = []
    for item in env:
        name, _, value = item.partition("=")
        named = value and SECRET_NAME.search(name) and name.upper() not in NOT_SECRET_NAMES
        what = token_in(value.encode()) or ("secret by its name" if named else None)
        if what:
            found.append((f"env {name}", what))
    return found


def token_in(data: bytes) -> str | None:
    """Which token pattern `data` holds, if any (never the token itself)."""
    return next((what for pattern, what in TOKENS if pattern.search(data)), None)


def content_secrets(settings: Settings, container: str, diff: list[tuple[str, str]],
                    known: set[str]) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(path, what) for added or changed small files whose content holds a token, read with `docker cp`
    (works on a stopped container and runs nothing inside it), the files past SCAN_FILES left unread, and the text
    files past SCAN_BYTES read in their first SCAN_BYTES only.
    Folders are left out (their files are in the diff too)."""
    parents = {p.rsplit("/", 1)[0] for _, p in diff}
    files = [p for kind, p in diff if kind != "D" and p not in known and p not in parents
             and not any(x in p + "/" for x in NOT_SCANNED) and not (p + "/").startswith(NOT_SCANNED_ROOTS)]
    found: list[tuple[str, str]] = []
    if not files:  # nothing left to read (a token file found by its path alone): no "0 of 0" line
        return found, [], []
    with console.progress(things=True) as bar:
        task = bar.add_task(f"reading {container}'s changed files for tokens", total=min(len(files), SCAN_FILES))
        too_long = []
        for path in files[:SCAN_FILES]:
            what = file_token(settings, container, path)
            if what == TOO_LONG:
                too_long.append(path)
            elif what:
                found.append((path, f"content: {what}"))
            bar.advance(task)
    return found, files[SCAN_FILES:], too_long


TOO_LONG = "text past SCAN_BYTES"
OVERLAP = 512  # bytes of one block kept before the next: a token cut by the block boundary is still found


def file_token(settings: Settings, container: str, path: str) -> str | None:
    """Which token pattern a text file of the container holds (None also for a binary file or no file), or
    TOO_LONG for a text file longer than SCAN_BYTES."""
    import tarfile

    with engine.Pipeline(engine.docker(settings, "cp", f"{container}:{path}", "-"), stdout=engine.PIPE,
                         quiet=True) as copy:
        try:
            with tarfile.open(fileobj=copy.stdout, mode="r|") as tar:
                member = tar.next()
                if member is None or not member.isfile():
                    return None
                return text_token(tar.extractfile(member), member.size, gz=not path.startswith(PACKAGED_DOCS))
        except tarfile.TarError:
            return None
        finally:
            copy.kill()


def text_token(stream, size: int, gz: bool = True) -> str | None:
    """token_in over a file read block by block: None for a binary one (a NUL in its first block), TOO_LONG for a
    text file past SCAN_BYTES. A gzip file (a rotated log, a .tar.gz of a home folder) is read decompressed, up to
    SCAN_BYTES of it, NULs and all (a tar's headers hold them; its files' text is what is read)."""
    first = stream.read(BLOCK)
    if first[:2] == GZIP_MAGIC and gz:
        return gzip_token(first, stream)
    tail, read = b"", 0
    for block in _blocks(first, stream):
        if read == 0 and b"\0" in block:
            return None
        read += len(block)
        if what := token_in(tail + block):
            return what
        if read >= SCAN_BYTES and size > read:
            return TOO_LONG
        tail = block[-OVERLAP:]
    return None


GZIP_MAGIC = b"\x1f\x8b"
# gzip files not read decompressed: the man pages and changelogs `apt-get install` leaves, hundreds per package set,
# whose examples (`password: ...`) a user never wrote
PACKAGED_DOCS = "/usr/share/"


def _blocks(first: bytes, stream):
    """`first`, then the rest of `stream` block by block."""
    block = first
    while block:
        yield block
        block = stream.read(BLOCK)


def gzip_token(first: bytes, stream) -> str | None:
    """token_in over a gzip stream decompressed block by block, at most SCAN_BYTES of it (a bomb costs no more);
    None for one that is not gzip after all, or cut short after its tokens-free part."""
    import zlib

    inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip's header; concatenated members are read one by one
    tail, read = b"", 0
    for block in _blocks(first, stream):
        data = block
        while data and read < SCAN_BYTES:
            try:
                out = inflate.decompress(data, BLOCK)
            except zlib.error:
                return None
            data = inflate.unconsumed_tail or (inflate.unused_data if inflate.eof else b"")
            if inflate.eof and data:  # another gzip member follows
                inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)
            read += len(out)
            if what := token_in(tail + out):
                return what
            tail = (tail + out)[-OVERLAP:]
            if not out and not inflate.unconsumed_tail:
                break
        if read >= SCAN_BYTES:
            return TOO_LONG
    return None


def diff_summary(diff: list[tuple[str, str]], top: int = 5) -> str:
    """"12 added, 3 changed, 1 deleted; most under /root/.cache (9), /opt/venv (4)"."""
    counts = collections.Counter(kind for kind, _ in diff)
    where = most_under([path for kind, path in diff if kind != "C"], top)
    head = f"{counts['A']} added, {counts['C']} changed, {counts['D']} deleted"
    return head + (f"; most under {where}" if where else "")


def most_under(paths: list[str], top: int = 5) -> str:
    """"/root/.cache (9), /opt/venv (4)": the folders two levels down that hold most of `paths`. A file nearer the
    top (/tmp/notes.txt) counts in its own folder (/tmp): "most under /tmp/notes.txt" named a file as a folder."""
    folders = {path.rsplit("/", 1)[0] for path in paths}  # a path that holds another is a folder

    def place(path: str) -> str:
        top_two = "/".join(path.split("/")[:3])
        return (top_two if top_two != path or path in folders else path.rsplit("/", 1)[0]) or "/"

    where = collections.Counter(place(path) for path in paths)
    return ", ".join(f"{d} ({n})" for d, n in where.most_common(top))


def drift(diff: list[tuple[str, str]], pins: dict[str, str]) -> list[str]:
    """Packages changed by hand after the build that differ from the lock, e.g. "peft==0.22.0 (lock: 0.21.2)"."""
    present, removed = {}, {}
    for kind, path in diff:
        m = DIST_INFO.search(path)
        if m:
            (removed if kind == "D" else present)[canonical_name(m.group(1))] = m.group(2)
    out = [f"{name}=={ver} (lock: {pins.get(name, 'absent')})"
           for name, ver in sorted(present.items()) if pins.get(name) != ver]
    out += [f"-{name} (lock: {pins.get(name, 'absent')})" for name in sorted(removed) if name not in present]
    return out


def source_lock(labels: dict[str, str]) -> tuple[dict[str, str], str]:
    """The pins of the lock the source image was built from, and a note when they cannot be trusted."""
    variant, want = labels.get("dockyard.variant", ""), labels.get("dockyard.lock", "")
    path = ROOT / "images" / "locks" / f"{variant}.txt"
    if not variant or not want:
        return {}, "source image has no dockyard.lock label; "
    if not path.exists():
        return {}, f"lock file {path.name} not found; "
    text = path.read_bytes()
    if hashlib.sha256(text).hexdigest() != want:
        return parse_lock_pins(text.decode()), f"{path.name} changed since the image was built; "
    return parse_lock_pins(text.decode()), ""


def default_tag(source: str, image_name: str, now: datetime.datetime) -> str:
    """`<source tag>-commit-<time>`; `<image_name>:commit-<time>` for an untagged source. A digest (name@sha256:...)
    is dropped: a tag cannot hold one."""
    stamp = now.strftime("%Y%m%d-%H%M%S")
    if source.startswith("sha256:"):
        return f"{image_name}:commit-{stamp}"
    source = source.split("@", 1)[0]
    if ":" not in source.rsplit("/", 1)[-1]:
        return f"{source}:commit-{stamp}"
    # a commit of a commit's container takes the new time in place of the old (each appended its own, and the fifth
    # one's tag, past docker's 128 characters, was refused once its files were read); a long tag cut to leave room
    name, old = source.rsplit(":", 1)
    old = COMMIT_STAMP.sub("", old)
    return f"{name}:{old[:TAG_CHARS - len(stamp) - 8]}-commit-{stamp}" if old else f"{name}:commit-{stamp}"


COMMIT_STAMP = re.compile(r"(?:^|-)commit-[0-9]{8}-[0-9]{6}$")  # the time default_tag appends
TAG_CHARS = 128  # docker's longest tag


def commit_argv(settings: Settings, container: str, tag: str, labels: dict[str, str]) -> list[str]:
    change = "LABEL " + " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in labels.items())
    return engine.docker(settings, "commit", "--change", change, container, tag)
