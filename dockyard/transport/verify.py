"""Checking an archive before anything is loaded (sha256s, manifest, signature), and loading it.

A damaged, truncated or tampered archive is refused before the engine is touched; after loading, every
image is looked up in the engine (`docker load` can exit 0 without loading everything).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dockyard import console, engine
from dockyard.errors import DockyardError, problems
from dockyard.settings import Settings
from dockyard.transport import inventory
from dockyard.transport.layout import ArchivePaths, decompressor_argv, read_sums

SIGN_NAMESPACE = "dockyard-archive"
TAR_SLACK = 1 << 20  # past the manifest's tar_bytes (load.sh allows as much): the end of a tar is padded


def load(settings: Settings, file: str) -> list[tuple[str, str]]:
    """Verify, then load an archive; returns (ref, id) of every image it holds, checked in the engine."""
    paths = ArchivePaths(Path(os.path.expanduser(file)).resolve())
    manifest = verify(settings, paths)
    info = engine.engine_info(settings)
    store = inventory.engine_store(info)
    requires = (manifest.get("thin") or {}).get("requires") or []
    if requires:
        if store == "containerd":
            raise DockyardError("this engine uses the containerd image store, which cannot load a thin "
                                "archive: load the full archive (invoke save without --thin-for)")
        missing = set(requires) - set(inventory.layer_inventory(settings)["chain_ids"])
        if missing:
            raise DockyardError(f"this thin archive needs {len(missing)} of {len(requires)} base layers this "
                                "engine does not hold: load the full archive instead (invoke save without "
                                "--thin-for). Nothing was loaded.")
    root = Path(info.get("DockerRootDir", ""))
    if root.is_absolute() and root.exists():
        # docker load unpacks the whole tar under <root>/tmp, then into the layer store.
        console.check_free(root, 2 * manifest["tar_bytes"], "docker load",
                           "Free space on the engine's disk (docker image prune) and load again.")
    dec = decompressor_argv(paths.method)
    if dec and not engine.which(dec[0]):
        raise DockyardError(f"{dec[0]} is not installed: install it (apt-get install {dec[0]}) to load "
                            f"{paths.archive.name}")
    load_argv = engine.docker(settings, "load")
    output = load_capped(paths, dec, load_argv, manifest["tar_bytes"] + TAR_SLACK)
    loaded, problems = [], []
    for ref, img in inventory.names(manifest["images"]):
        meta = engine.image_inspect(settings, ref)
        wrong = inventory.loaded_as_saved(meta, img, store)
        if wrong:
            problems.append(f"{ref} {wrong}")
        else:
            loaded.append((ref, meta["Id"]))
    if problems:
        raise DockyardError(f"loading {paths.archive.name} failed: `{engine.quote(load_argv)}` exited 0, but "
                            + "; ".join(problems) + "\n" + console.tail(output))
    for ref, image_id in loaded:
        print(f"loaded {ref} {image_id}")
    return loaded


def load_capped(paths: ArchivePaths, dec: list[str] | None, load_argv: list[str], limit: int) -> list[str]:
    """The archive, decompressed, into `docker load`, counted on the way: at most `limit` bytes reach it. An
    archive that decompresses to more than its manifest declared (what the free-space check counted) is stopped
    there, and docker load is killed before it sees the end of its input, so it loads nothing. load.sh does the
    same. Returns docker load's last output lines."""
    name, unpack_argv = paths.archive.name, [*(dec or ["cat"]), str(paths.archive)]
    engine.echo_pipeline(unpack_argv, load_argv)
    with (engine.Pipeline(load_argv, stdin=engine.PIPE, stdout=engine.TAIL, quiet=True,
                          what=f"loading {name}") as docker_load,
          engine.Pipeline(unpack_argv, stdout=engine.PIPE, quiet=True, what=f"decompressing {name}") as unpack):
        copied = 0
        while chunk := unpack.stdout.read(engine.CHUNK):
            copied += len(chunk)
            if copied > limit:  # leaving the block kills docker load before its input ends
                raise DockyardError(f"{name} decompresses to more than its manifest declares ({limit - TAR_SLACK} "
                                    "bytes of tar): stopped there, refused, nothing was loaded")
            try:
                docker_load.stdin.write(chunk)
            except BrokenPipeError:  # docker load stopped reading: its exit code and output say why
                docker_load.wait()
                unpack.kill()
                return docker_load.output()
        unpack.wait()  # a damaged stream fails here, before docker load sees the end of a truncated tar
        docker_load.wait()
        return docker_load.output()


def verify(settings: Settings, paths: ArchivePaths) -> dict:
    """Checks signature (when configured), manifest and archive sha256s; returns the manifest.

    Touches no engine: a damaged archive is refused before anything is loaded.
    """
    for p in (paths.archive, paths.sha256, paths.manifest):
        if not p.exists():
            raise DockyardError(f"{p} is missing: an archive travels with its .sha256 and .manifest.json "
                                "(copy all three, or use `invoke ship`)")
    if settings.allowed_signers:
        principal = verify_signature(settings.path(settings.allowed_signers), paths)
        print(f"signature good: signed by {principal}", file=sys.stderr)
    sums = read_sums(paths.sha256)
    raw = paths.manifest.read_bytes()
    if sums.get(paths.manifest.name) != hashlib.sha256(raw).hexdigest():
        raise DockyardError(f"{paths.manifest.name} does not match {paths.sha256.name}: the manifest was "
                            "changed or damaged. Refused, nothing was loaded.")
    manifest = read_manifest(raw, paths.manifest.name)
    expected = sums.get(paths.archive.name)
    if expected is None or manifest.get("archive_sha256") != expected:
        raise DockyardError(f"{paths.sha256.name} and {paths.manifest.name} disagree about "
                            f"{paths.archive.name}: refused, nothing was loaded")
    size, want = paths.archive.stat().st_size, manifest.get("archive_bytes")
    if size != want:
        raise DockyardError(f"{paths.archive.name} is {size} bytes, the manifest says {want}: the copy is "
                            f"{'truncated' if size < want else 'damaged'}. Copy it again (`invoke ship` "
                            "resumes); nothing was loaded.")
    if sha256_file(paths.archive, f"verify {paths.archive.name}") != expected:
        raise DockyardError(f"{paths.archive.name} does not match its sha256: the archive is damaged or was "
                            "changed. Copy it again; nothing was loaded.")
    return manifest


class _Image(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    tags: list[str]
    diff_ids: list[str]

    @field_validator("tags")
    @classmethod
    def _references(cls, tags: list[str]) -> list[str]:
        for t in tags:
            engine.reference(t, "tag")  # a tag such as '-q' would reach docker as an option
        return tags


class _Manifest(BaseModel):
    """The fields the loaders rely on; the rest of what `invoke save` writes is carried along unchecked."""
    model_config = ConfigDict(extra="allow")

    archive_sha256: str
    archive_bytes: int = Field(ge=0)
    tar_bytes: int = Field(ge=0)
    images: list[_Image] = Field(min_length=1)
    thin: dict | None = None


def read_manifest(raw: bytes, name: str) -> dict:
    """The manifest as `invoke save` writes it, or a refusal that says what is wrong (never a traceback)."""
    try:
        return _Manifest.model_validate_json(raw).model_dump()
    except (ValidationError, DockyardError) as e:
        raise DockyardError(f"{name} is not a manifest `invoke save` writes ({problems(e, 'manifest')}): "
                            "refused, nothing was loaded") from None


def sha256_file(path: Path, label: str) -> str:
    h = hashlib.sha256()
    with console.progress() as bar, open(path, "rb") as f:
        task = bar.add_task(label, total=path.stat().st_size)
        while chunk := f.read(engine.CHUNK):
            h.update(chunk)
            bar.advance(task, len(chunk))
    return h.hexdigest()


# --- signatures ----------------------------------------------------------------------------------

def sign_file(path: Path, key: Path) -> None:
    """`ssh-keygen -Y sign`: writes <path>.sig. Signing the manifest covers the archive's sha256 in it."""
    engine.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(key), "-n", SIGN_NAMESPACE, str(path)],
               what="signing the manifest")


def verify_signature(allowed: Path, paths: ArchivePaths) -> str:
    """The principal that signed the manifest; refuses unsigned or wrongly signed archives."""
    if not allowed.exists():
        raise DockyardError(f"allowed_signers is set to {allowed}, which does not exist: fix the setting")
    if not paths.signature.exists():
        raise DockyardError(f"{paths.archive.name} is not signed ({paths.signature.name} is missing) and "
                            f"allowed_signers is set ({allowed}): refused, nothing was loaded")
    found = engine.run(["ssh-keygen", "-Y", "find-principals", "-s", str(paths.signature), "-f", str(allowed)],
                       capture=True, check=False, quiet=True)
    principal = found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else ""
    if not principal:
        raise DockyardError(f"{paths.archive.name} was signed by a key that is not in {allowed}: "
                            "refused, nothing was loaded")
    ok = engine.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", SIGN_NAMESPACE,
                     "-s", str(paths.signature)], input=paths.manifest.read_bytes(), capture=True,
                    check=False, quiet=True)
    if ok.returncode != 0:
        raise DockyardError(f"the signature of {paths.manifest.name} does not verify (the manifest was "
                            "changed after signing): refused, nothing was loaded")
    return principal
