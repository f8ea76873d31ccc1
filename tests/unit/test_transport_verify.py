"""Verification without an engine, on hand-made archive sets: sha256s, manifest, signatures, load.sh."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from dockyard.errors import DockyardError
from dockyard.settings import Settings
from dockyard.transport import verify
from dockyard.transport.layout import FORMAT, ArchivePaths, write_loader


def make_set(folder, payload=b"not really a tar, but hashed like one" * 1000, name="t_1.tar.zst"):
    paths = ArchivePaths(folder / name)
    paths.archive.write_bytes(payload)
    manifest = {"format": FORMAT, "archive": paths.archive.name, "tar_bytes": 10_000,
                "archive_sha256": hashlib.sha256(payload).hexdigest(), "archive_bytes": len(payload),
                "images": [{"ref": "t:1", "tags": ["t:1"], "id": "sha256:" + "a" * 64, "diff_ids": []}], "thin": None,
                "load_sh": {"check_images": "t:1=sha256:" + "a" * 64, "require_chains": "", "need_kb": "20"}}
    paths.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    paths.sha256.write_text(f"{manifest['archive_sha256']}  {paths.archive.name}\n"
                            f"{hashlib.sha256(paths.manifest.read_bytes()).hexdigest()}  {paths.manifest.name}\n")
    return paths


def test_verify_accepts_a_good_set_and_sha256sum_agrees(tmp_path):
    paths = make_set(tmp_path)
    assert verify.verify(Settings(), paths)["archive"] == "t_1.tar.zst"
    assert subprocess.run(["sha256sum", "-c", paths.sha256.name], cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("damage,message", [
    ("truncate", "truncated"),
    ("bitflip", "does not match its sha256"),
    ("manifest", "manifest was changed"),
    ("missing", "is missing"),
])
def test_verify_refuses_damage(tmp_path, damage, message):
    paths = make_set(tmp_path)
    data = bytearray(paths.archive.read_bytes())
    if damage == "truncate":
        paths.archive.write_bytes(data[: len(data) // 2])
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x01
        paths.archive.write_bytes(data)
    elif damage == "manifest":
        paths.manifest.write_text(paths.manifest.read_text().replace("a" * 64, "b" * 64))
    else:
        paths.sha256.unlink()
    with pytest.raises(DockyardError, match=message):
        verify.verify(Settings(), paths)


def _keypair(folder, name):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", folder / name], check=True)
    return folder / name


def test_signatures(tmp_path):
    paths = make_set(tmp_path)
    good, other = _keypair(tmp_path, "release"), _keypair(tmp_path, "intruder")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'release@site namespaces="{verify.SIGN_NAMESPACE}" '
                       + " ".join(good.with_suffix(".pub").read_text().split()[:2]) + "\n")
    settings = Settings(allowed_signers=str(allowed))

    with pytest.raises(DockyardError, match="not signed"):
        verify.verify(settings, paths)
    verify.sign_file(paths.manifest, good)
    assert verify.verify_signature(allowed, paths) == "release@site"
    verify.verify(settings, paths)

    # A manifest re-written after signing (with its sha256 line updated to match) is refused.
    text = paths.manifest.read_text().replace("t:1", "evil:1")
    paths.manifest.write_text(text)
    sums = paths.sha256.read_text().splitlines()
    sums[1] = f"{hashlib.sha256(text.encode()).hexdigest()}  {paths.manifest.name}"
    paths.sha256.write_text("\n".join(sums) + "\n")
    with pytest.raises(DockyardError, match="does not verify"):
        verify.verify(settings, paths)

    paths = make_set(tmp_path)
    paths.signature.unlink()
    verify.sign_file(paths.manifest, other)
    with pytest.raises(DockyardError, match="not in"):
        verify.verify(settings, paths)


def test_load_sh_finds_its_archive_and_refuses_damage_before_docker(tmp_path):
    loader = write_loader(tmp_path)
    assert subprocess.run(["sh", "-n", loader]).returncode == 0
    paths = make_set(tmp_path)
    data = bytearray(paths.archive.read_bytes())
    data[100] ^= 1
    paths.archive.write_bytes(data)
    r = subprocess.run(["sh", loader], capture_output=True, text=True)  # the only archive: no name needed
    assert r.returncode == 1 and "t_1.tar.zst is damaged" in r.stderr and "nothing was loaded" in r.stderr
    make_set(tmp_path, name="t_2.tar.zst")
    r = subprocess.run(["sh", loader], capture_output=True, text=True)
    assert r.returncode == 1 and "name the archive to load" in r.stderr
    r = subprocess.run(["sh", loader, "t_3.tar.zst"], capture_output=True, text=True)
    assert r.returncode == 1 and "t_3.tar.zst is missing here" in r.stderr
