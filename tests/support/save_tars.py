"""Synthetic `docker save` tars, in the layouts real engines write, for tests without an engine."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path


def member(tf: tarfile.TarFile, name: str, data: bytes = b"", kind=tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def layer(content: bytes) -> tuple[bytes, str]:
    """A layer tar holding one file, and its diff id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        member(t, "file", content)
    data = buf.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def fake_save(fmt=tarfile.USTAR_FORMAT, long_dir=False, big_bytes=300_000) -> tuple[bytes, dict, str, str]:
    """A `docker save` tar in the classic engine's layout: <legacy id>/layer.tar (one of them a symlink).

    Returns the tar, the image as the manifest records it, and the diff ids of its big (300 kB unless
    big_bytes says otherwise) and small layers.
    """
    big, big_id = layer(b"x" * big_bytes)
    small, small_id = layer(b"recipe v2\n")
    config = json.dumps({"rootfs": {"diff_ids": [big_id, small_id, big_id]}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    d1 = ("d" * 120 if long_dir else "1" * 64)
    manifest = [{"Config": image_id[7:] + ".json", "RepoTags": ["t:2"],
                 "Layers": [f"{d1}/layer.tar", f"{'2' * 64}/layer.tar", f"{'3' * 64}/layer.tar"]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        member(t, d1 + "/json", b"{}")
        member(t, d1 + "/layer.tar", big)
        member(t, "2" * 64 + "/layer.tar", small)
        member(t, "3" * 64 + "/layer.tar", kind=tarfile.SYMTYPE, link=f"../{d1}/layer.tar")
        member(t, image_id[7:] + ".json", config)
        member(t, "manifest.json", json.dumps(manifest).encode())
    image = {"ref": "t:2", "id": image_id, "diff_ids": [big_id, small_id, big_id]}
    return buf.getvalue(), image, big_id, small_id


def fake_oci_save() -> tuple[bytes, dict, str, str]:
    """A `docker save` tar in the OCI layout of Docker 25+: blobs/sha256/<digest>."""
    big, big_id = layer(b"y" * 200_000)
    small, small_id = layer(b"recipe\n")
    config = json.dumps({"rootfs": {"diff_ids": [big_id, small_id]}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"blobs/sha256/{image_id[7:]}", "RepoTags": ["t:3"],
                 "Layers": [f"blobs/sha256/{big_id[7:]}", f"blobs/sha256/{small_id[7:]}"]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for digest, data in ((big_id, big), (small_id, small), (image_id, config)):
            member(t, f"blobs/sha256/{digest[7:]}", data)
        member(t, "index.json", b"{}")
        member(t, "manifest.json", json.dumps(manifest).encode())
    image = {"ref": "t:3", "id": image_id, "diff_ids": [big_id, small_id]}
    return buf.getvalue(), image, big_id, small_id


def saving_docker(folder: Path) -> tuple[Path, dict]:
    """A `docker` in `folder` whose `docker save` prints fake_save()'s tar (nothing else is asked of it), and that
    image as inventory.inspect_images finds it (tagged t:2)."""
    raw, image, _, _ = fake_save()
    (folder / "save.tar").write_bytes(raw)
    docker = folder / "save-docker"
    docker.write_text(f'#!/bin/sh\n[ "$1" = save ] && exec cat {folder / "save.tar"}\nexit 1\n')
    docker.chmod(0o755)
    return docker, {**image, "tags": ["t:2"], "labels": {}, "bytes": len(raw), "chain_ids": []}
