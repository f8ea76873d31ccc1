"""Moving images to other nodes over OpenSSH.

`ship_file`: copies an archive resumably (rsync --partial --append-verify where the node has rsync;
otherwise ssh appending to a `.partial` file from where it stopped), checks the sha256 there, and
only then renames it; with `load`, runs the archive's load.sh there. `ship_image`: no file on
either side, `docker save | zstd | ssh node 'zstd -dc | docker load'`, checked after loading.

Everything goes through the user's own `ssh` (the `ssh` setting), so ~/.ssh/config, keys, agents and
ProxyJump all apply. Nothing but sh, coreutils and docker is needed on the node.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dockyard import archive, engine
from dockyard.errors import DockyardError

SEP = "@@dockyard@@"


@dataclass(frozen=True)
class Remote:
    host: str           # [user@]host, or an alias from the ssh config
    dir: str = ""
    port: int = 0
    identity: str = ""

    def where(self, name: str = "") -> str:
        return f"{self.host}:{self.dir}" + (f"/{name}" if name else "")


def parse_to(to: str, port: int = 0, identity: str = "", need_dir: bool = True) -> Remote:
    """--to=[user@]host:/dir (the folder may be relative to the remote home, or start with ~/)."""
    host, colon, folder = to.partition(":")
    if not host or (need_dir and not (colon and folder)):
        raise DockyardError(f"--to={to!r}: expected [user@]host:/dir" if need_dir else
                            f"--to={to!r}: expected [user@]host")
    return Remote(host, folder.rstrip("/") or ("/" if folder else ""), port, identity)


def parse_ssh_url(url: str) -> Remote:
    """ssh://[user@]host[:port] (what --thin-for takes)."""
    m = re.fullmatch(r"ssh://([^/:]+)(?::(\d+))?/?", url)
    if not m:
        raise DockyardError(f"{url!r}: expected ssh://[user@]host[:port]")
    return Remote(m.group(1), port=int(m.group(2) or 0))


def ssh_base(settings, r: Remote) -> list[str]:
    """ssh and its options, without the destination (what rsync -e takes)."""
    argv = shlex.split(settings.ssh)
    if r.port:
        argv += ["-p", str(r.port)]
    if r.identity:
        argv += ["-i", str(Path(r.identity).expanduser())]
    return argv


def ssh_argv(settings, r: Remote, script: str) -> list[str]:
    """Run a POSIX sh script on the node, whatever the remote user's login shell is."""
    return [*ssh_base(settings, r), r.host, "sh -c " + shlex.quote(script)]


def rpath(folder: str, name: str = "") -> str:
    """A remote path as a shell word; a leading ~/ stays the remote home."""
    path = f"{folder}/{name}" if name else folder
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def remote(settings, r: Remote, script: str, what: str, check: bool = True) -> subprocess.CompletedProcess:
    return engine.run(ssh_argv(settings, r, script), capture=True, check=check, quiet=True, what=what)


# --- what the node has ---------------------------------------------------------------------------

def probe_script(folder: str, name: str) -> str:
    d = rpath(folder)
    return (
        "for t in rsync zstd gzip sha256sum openssl docker; do printf '%s=%s\\n' $t \"$(command -v $t)\"; done\n"
        f"p={d}; while [ ! -d \"$p\" ]; do p=$(dirname \"$p\"); done\n"
        "printf 'free_kb=%s\\n' \"$(df -Pk \"$p\" | awk 'NR == 2 { print $4 }')\"\n"
        f"f={rpath(folder, name + '.partial')}; [ -f \"$f\" ] && printf 'partial=%s\\n' \"$(wc -c < \"$f\")\"\n"
        f"f={rpath(folder, name)}; [ -f \"$f\" ] && printf 'final=%s\\n' \"$(wc -c < \"$f\")\"\n"
        "true\n")


def parse_probe(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def probe(settings, r: Remote, name: str) -> dict[str, str]:
    return parse_probe(remote(settings, r, probe_script(r.dir, name), f"probing {r.host}").stdout)


INVENTORY_SCRIPT = (
    "docker info --format '{{json .}}' && echo " + SEP + " && "
    "ids=$(docker image ls -aq --no-trunc | sort -u) && "
    "if [ -n \"$ids\" ]; then docker image inspect $ids; else echo '[]'; fi")


def remote_inventory(settings, r: Remote) -> dict:
    """The node's layer inventory, read over ssh with its own docker (no project needed there)."""
    p = remote(settings, r, INVENTORY_SCRIPT, f"reading the image inventory of {r.host}", check=False)
    info, sep, images = p.stdout.partition(SEP + "\n")
    if p.returncode != 0 or not sep:
        raise DockyardError(f"cannot read the images of {r.host} over ssh (is docker there, and may this "
                            f"user use it?): {(p.stderr.strip().splitlines() or ['no answer'])[-1]}")
    return archive.inventory_from(json.loads(info), json.loads(images), r.host)


def check_thin_fits(settings, r: Remote, manifest: dict) -> None:
    """Refuse before copying when the node lacks a layer the thin archive relies on."""
    requires = (manifest.get("thin") or {}).get("requires") or []
    if not requires:
        return
    inv = remote_inventory(settings, r)
    if inv["engine"]["store"] == "containerd":
        raise DockyardError(f"{r.host} uses the containerd image store, which cannot load a thin archive: "
                            "ship the full archive (invoke save without --thin-for)")
    missing = set(requires) - set(inv["chain_ids"])
    if missing:
        raise DockyardError(f"{r.host} lacks {len(missing)} of the {len(requires)} base layers this thin "
                            f"archive relies on: it would not load there. Ship the full archive, or a thin "
                            f"one made for this node (invoke save --thin-for=ssh://{r.host}). Nothing was copied.")


# --- copy plans ----------------------------------------------------------------------------------

def rsync_argv(settings, r: Remote, local: Path, remote_name: str) -> list[str]:
    """rsync keeps a cut copy (--partial) and continues it, checking the whole file (--append-verify)."""
    return ["rsync", "--partial", "--append-verify", "--info=progress2", "-e", engine.quote(ssh_base(settings, r)),
            str(local), f"{r.host}:{r.dir}/{remote_name}"]


def append_argv(settings, r: Remote, remote_name: str) -> list[str]:
    """Without rsync: the missing tail goes over ssh and is appended (the sha256 check comes after)."""
    return ssh_argv(settings, r, f"cat >> {rpath(r.dir, remote_name)}")


def _append_copy(settings, r: Remote, local: Path, remote_name: str, offset: int) -> None:
    argv = append_argv(settings, r, remote_name)
    engine.echo(argv)
    with archive.progress() as bar, open(local, "rb") as f, tempfile.TemporaryFile() as err:
        task = bar.add_task(f"copy {local.name}", total=local.stat().st_size, completed=offset)
        f.seek(offset)
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err)
        try:
            while chunk := f.read(archive.CHUNK):
                p.stdin.write(chunk)
                bar.advance(task, len(chunk))
            p.stdin.close()
        except BrokenPipeError:
            pass
        except BaseException:
            p.kill()
            raise
        if p.wait() != 0:
            raise DockyardError(f"the copy to {r.host} stopped (exit {p.returncode}): run the same `invoke ship` "
                                "again to continue where it stopped\n" + archive.fail_tail(err))


def _put_small(settings, r: Remote, local: Path) -> None:
    """A companion file: written whole to .partial, then renamed."""
    final, tmp = rpath(r.dir, local.name), rpath(r.dir, local.name + ".partial")
    engine.run(ssh_argv(settings, r, f"cat > {tmp} && mv -f {tmp} {final}"), input=local.read_bytes(),
               quiet=True, what=f"copying {local.name} to {r.host}")


def _remote_sha256(settings, r: Remote, name: str, have: dict[str, str]) -> str:
    """sha256 of a file on the node; OpenSSL where it is there (about 4x faster than coreutils)."""
    tool = "openssl dgst -sha256 -r" if have.get("openssl") else "sha256sum"
    out = remote(settings, r, f"{tool} < {rpath(r.dir, name)}", f"checking the sha256 on {r.host}").stdout
    return out.split()[0] if out.split() else ""


# --- ship a file ---------------------------------------------------------------------------------

def ship_file(settings, file: str, to: str, port: int = 0, identity: str = "", load: bool = False,
              transport: str = "") -> list[tuple[str, str]]:
    """Copy an archive and its companions to the node, verify it there, optionally load it there.

    `transport` forces "rsync" or "ssh" (tests); by default rsync where the node has it.
    Returns the (ref, id) pairs load.sh reported when loading, else [].
    """
    paths = archive.ArchivePaths(Path(file).expanduser().resolve())
    for p in (paths.archive, paths.sha256, paths.manifest, paths.loader):
        if not p.exists():
            raise DockyardError(f"{p} is missing: ship an archive written by `invoke save` (it writes the "
                                ".sha256, .manifest.json and load.sh beside it)")
    r = parse_to(to, port, identity)
    name, size = paths.archive.name, paths.archive.stat().st_size
    manifest = json.loads(paths.manifest.read_text())
    expected = archive.read_sums(paths.sha256).get(name, "")
    have = probe(settings, r, name)
    needs = {"sha256sum": "to check the copy"}
    if load:
        needs["docker"] = "to load it"
        if paths.method != "none":
            needs[paths.method] = "to unpack it"
    for tool, why in needs.items():
        if not have.get(tool):
            raise DockyardError(f"{r.host} has no {tool} ({why}): install it there"
                                + (", or save with --compress=gzip" if tool == "zstd" else ""))
    check_thin_fits(settings, r, manifest)

    done = int(have.get("final", -1)) == size and _remote_sha256(settings, r, name, have) == expected
    if done:
        print(f"{r.where(name)} is already there and verified")
    else:
        offset = int(have.get("partial", 0))
        if offset > size:
            offset = 0
        companions = sum(p.stat().st_size for p in (paths.sha256, paths.manifest, paths.loader))
        need = size - offset + companions
        free = int(have.get("free_kb") or 0) * 1024
        if free < need:
            raise DockyardError(f"not enough space in {r.where()}: {archive.human(free)} free, the copy needs "
                                f"{archive.human(need)}. Free space there or ship to another folder. "
                                "Nothing was copied.")
        mkdir = f"mkdir -p {rpath(r.dir)}" + ("" if offset else f" && rm -f {rpath(r.dir, name + '.partial')}")
        remote(settings, r, mkdir, f"preparing {r.where()}")
        if offset:
            print(f"resuming the copy at {archive.human(offset)} of {archive.human(size)}", file=sys.stderr)
        use = transport or ("rsync" if have.get("rsync") and engine.which("rsync") else "ssh")
        if use == "rsync":
            engine.run(rsync_argv(settings, r, paths.archive, name + ".partial"),
                       what=f"copying to {r.host} (run it again to continue where it stopped)")
        else:
            _append_copy(settings, r, paths.archive, name + ".partial", offset)
        got = _remote_sha256(settings, r, name + ".partial", have)
        if got != expected:
            remote(settings, r, f"rm -f {rpath(r.dir, name + '.partial')}", "removing a bad copy")
            raise DockyardError(f"the copy on {r.host} does not match the archive's sha256 ({got[:12]} != "
                                f"{expected[:12]}): removed it; run `invoke ship` again")
        remote(settings, r, f"mv -f {rpath(r.dir, name + '.partial')} {rpath(r.dir, name)}", "renaming the copy")
    for p in (paths.manifest, paths.signature, paths.sha256, paths.loader):
        if p.exists():
            _put_small(settings, r, p)
    # The archive's sha256 was checked above; this checks that the manifest arrived intact.
    remote(settings, r, f"cd {rpath(r.dir)} && grep -F {shlex.quote('  ' + paths.manifest.name)} "
                        f"{shlex.quote(paths.sha256.name)} | sha256sum -c -", f"verifying the manifest on {r.host}")
    print(f"shipped {name} to {r.where()}: sha256 verified there")
    if not load:
        return []
    out = remote(settings, r, f"cd {rpath(r.dir)} && sh load.sh {shlex.quote(name)}", f"loading {name} on {r.host}")
    loaded = [tuple(line.split()[1:3]) for line in out.stdout.splitlines() if line.startswith("loaded ")]
    for ref, image_id in loaded:
        print(f"loaded on {r.host}: {ref} {image_id}")
    return loaded


# --- stream an image -----------------------------------------------------------------------------

def ship_image(settings, image: str, to: str, port: int = 0, identity: str = "",
               thin: bool = False) -> list[tuple[str, str]]:
    """docker save | zstd | ssh node 'zstd -dc | docker load', then check every image id there."""
    r = Remote(parse_to(to.split(":", 1)[0], need_dir=False).host, ".", port, identity)
    refs = [x.strip() for x in image.split(",") if x.strip()]
    images = archive.inspect_images(settings, refs)
    have = probe(settings, r, "")
    if not have.get("docker"):
        raise DockyardError(f"{r.host} has no docker to load into")
    method = "zstd" if have.get("zstd") and engine.which("zstd") else "gzip"
    omit: set[str] = set()
    if thin:
        omit, plan = archive.plan_thin(settings, images, f"ssh://{r.host}" + (f":{r.port}" if r.port else ""))
        if plan is not None:
            left = len(plan["omitted"])
            print(f"thin: leaving out {left} layers {r.host} already holds", file=sys.stderr)
    unpack = " ".join(archive.decompressor_argv(method))
    load_argv = ssh_argv(settings, r, f"{unpack} | docker load")
    engine.echo(load_argv)
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(load_argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        try:
            got = archive.stream_save(settings, images, p.stdin.write, method=method,
                                      level=archive.check_method(method, 0), omit=omit,
                                      label=f"stream to {r.host}",
                                      cache=archive.layer_cache(settings, method, archive.check_method(method, 0)))
            p.stdin.close()
        except (BrokenPipeError, DockyardError) as e:
            if p.poll() is None:
                p.kill()
            p.wait()
            raise DockyardError(f"streaming to {r.host} failed: {e}\n" + archive.fail_tail(out)) from None
        if p.wait() != 0:
            raise DockyardError(f"docker load on {r.host} failed (exit {p.returncode})\n" + archive.fail_tail(out))
    wanted = [(ref, img) for img in images for ref in img["tags"] or [img["id"]]]
    script = "; ".join(["docker info --format '{{json .}}'"] + [
        f"docker image inspect --format '{{{{json .}}}}' {shlex.quote(ref)} 2>/dev/null || echo null"
        for ref, _ in wanted])
    lines = remote(settings, r, script, f"checking the images on {r.host}").stdout.splitlines()
    store = archive.engine_store(json.loads(lines[0]))
    found = [(ref, json.loads(line)) for (ref, _), line in zip(wanted, lines[1:])]
    bad = [f"{ref} {archive.loaded_as_saved(meta, img, store)}" for (ref, img), (_, meta) in zip(wanted, found)
           if archive.loaded_as_saved(meta, img, store)]
    if bad or len(found) < len(wanted):
        raise DockyardError(f"docker load on {r.host} did not load what was sent: {'; '.join(bad) or 'no answer'}")
    print(f"streamed {archive.human(got.out_bytes)} ({method}) to {r.host} in {got.seconds:.1f} s")
    refs_ids = [(ref, meta["Id"]) for ref, meta in found]
    for ref, image_id in refs_ids:
        print(f"loaded on {r.host}: {ref} {image_id}")
    return refs_ids
