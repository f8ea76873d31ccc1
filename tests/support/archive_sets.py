"""Hand-made archive sets (archive, manifest, .sha256), as `invoke save` writes them or as someone crafting one
would, for tests without an engine."""

from __future__ import annotations

import hashlib
import json
import subprocess

from dockyard.transport.layout import FORMAT, ArchivePaths


def make_set(folder, payload=b"not really a tar, but hashed like one" * 1000, name="t_1.tar.zst", tag="t:1"):
    paths = ArchivePaths(folder / name)
    paths.archive.write_bytes(payload)
    manifest = {"format": FORMAT, "archive": paths.archive.name, "tar_bytes": 10_000,
                "archive_sha256": hashlib.sha256(payload).hexdigest(), "archive_bytes": len(payload),
                "images": [{"ref": tag, "tags": [tag], "id": "sha256:" + "a" * 64, "diff_ids": []}], "thin": None,
                "load_sh": {"check_images": f"{tag}=sha256:" + "a" * 64, "require_chains": "", "need_kb": "20"}}
    paths.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    paths.sha256.write_text(f"{manifest['archive_sha256']}  {paths.archive.name}\n"
                            f"{hashlib.sha256(paths.manifest.read_bytes()).hexdigest()}  {paths.manifest.name}\n")
    return paths


def engine_answering_info(folder) -> dict[str, str]:
    """The environment that runs load.sh with a stand-in docker in folder/bin whose engine answers `docker info`
    and holds no image (both asked before the archive is copied: an archive already loaded is not copied again),
    and nothing else: any other docker command leaves folder/docker-used."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = info ] && exit 0\n[ "$1 $2" = "image inspect" ] && exit 1\n'
                                    f'echo "$*" >>"{folder}/docker-used"\nexit 1\n')
    (bin_dir / "docker").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def keypair(folder, name):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", folder / name], check=True)
    return folder / name


def reseal(paths, manifest_changes=None, sums=None):
    """Rewrite the manifest and the .sha256 consistently: what someone crafting a set would do."""
    if manifest_changes:
        m = json.loads(paths.manifest.read_text())
        m.update(manifest_changes)
        paths.manifest.write_text(json.dumps(m, indent=2) + "\n")
    lines = sums if sums is not None else [paths.archive, paths.manifest]
    paths.sha256.write_text("".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in lines))


def save_image(out, ref: str, *flags: str, env: dict | None = None):
    """`invoke save --image=REF --out=OUT [flags]` for real: the archive's path and its manifest."""
    from tests.support.cli import invoke

    r = invoke("save", f"--image={ref}", f"--out={out}", *flags, env=env, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    archive, = out.glob("*.tar.zst")
    return archive, json.loads(next(out.glob("*.manifest.json")).read_text())
