"""Archives without an engine: the tar reader, thin plans, names, verification, signatures, load.sh."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from dockyard import archive
from dockyard.errors import DockyardError
from dockyard.settings import Settings

# Diff ids of a real image (dockyard-base + one RUN layer) and the chain id the engine itself reported
# for the second layer in its inventory: chain_ids must compute the engine's keys exactly.
BASE = "sha256:9ba81386ba29b10deff81f99005998bad89564bddb1a8515f74cad7c1a539a87"
RUN = "sha256:e2915dd2eb8c6176022685ceaef9a59dbd79c08cdf3a4f3c9a62356b1daf64a8"
ENGINE_CHAIN = "sha256:b26ca394c2214c2ed2d5b85999ec4a68ec5fd082060f7e468ef77f1a1d218b8d"


def test_chain_ids_match_the_engine():
    assert archive.chain_ids([BASE, RUN]) == [BASE, ENGINE_CHAIN]
    assert archive.chain_ids([]) == []


def _img(ref, diffs, image_id="sha256:" + "0" * 64):
    return {"ref": ref, "id": image_id, "diff_ids": diffs, "chain_ids": archive.chain_ids(diffs), "bytes": 0}


def test_thin_plan_leaves_out_only_layers_the_target_holds_everywhere():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    v1, v2 = _img("x:1", [a, b]), _img("x:2", [a, b, c])
    omit, requires = archive.thin_plan([v2], {"chain_ids": v1["chain_ids"]})
    assert omit == {a, b} and requires == sorted(v1["chain_ids"])
    # b also sits on top of another base the target lacks: its file must travel.
    other = _img("y:1", [c, b])
    omit, requires = archive.thin_plan([v2, other], {"chain_ids": v1["chain_ids"]})
    assert omit == {a} and requires == [a]
    assert archive.thin_plan([v2], {"chain_ids": []}) == (set(), [])


def _member(tf, name, data=b"", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _layer(content: bytes) -> tuple[bytes, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        _member(t, "file", content)
    data = buf.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def fake_save(fmt=tarfile.USTAR_FORMAT, long_dir=False):
    """A `docker save` tar in the classic engine's layout: <legacy id>/layer.tar (one of them a symlink)."""
    big, big_id = _layer(b"x" * 300_000)
    small, small_id = _layer(b"recipe v2\n")
    config = json.dumps({"rootfs": {"diff_ids": [big_id, small_id, big_id]}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    d1 = ("d" * 120 if long_dir else "1" * 64)
    manifest = [{"Config": image_id[7:] + ".json", "RepoTags": ["t:2"],
                 "Layers": [f"{d1}/layer.tar", f"{'2' * 64}/layer.tar", f"{'3' * 64}/layer.tar"]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        _member(t, d1 + "/json", b"{}")
        _member(t, d1 + "/layer.tar", big)
        _member(t, "2" * 64 + "/layer.tar", small)
        _member(t, "3" * 64 + "/layer.tar", kind=tarfile.SYMTYPE, link=f"../{d1}/layer.tar")
        _member(t, image_id[7:] + ".json", config)
        _member(t, "manifest.json", json.dumps(manifest).encode())
    image = {"ref": "t:2", "id": image_id, "diff_ids": [big_id, small_id, big_id]}
    return buf.getvalue(), image, big_id, small_id


@pytest.mark.parametrize("fmt,long_dir", [(tarfile.USTAR_FORMAT, False), (tarfile.PAX_FORMAT, True),
                                          (tarfile.GNU_FORMAT, True)])
def test_tar_pump_records_layers_and_drops_omitted_ones(fmt, long_dir):
    raw, image, big_id, small_id = fake_save(fmt, long_dir)
    out = io.BytesIO()
    pump = archive.TarPump(omit={big_id})
    pump.run(io.BufferedReader(io.BytesIO(raw)), out.write)
    pump.check([image])  # every layer hashed, the symlink followed
    assert image["tags"] == ["t:2"]
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    assert not any(n.endswith("/layer.tar") and n.startswith(("1", "d")) for n in names)
    assert "2" * 64 + "/layer.tar" in names and "manifest.json" in names
    assert len(out.getvalue()) < len(raw) - 300_000
    assert {d for d, _ in pump.layers.values()} == {big_id, small_id}

    full = io.BytesIO()
    archive.TarPump().run(io.BufferedReader(io.BytesIO(raw)), full.write)
    assert full.getvalue() == raw  # without --thin-for, the tar passes byte for byte


def test_tar_pump_refuses_a_cut_stream_and_a_wrong_layer():
    raw, image, _, _ = fake_save()
    with pytest.raises(DockyardError, match="ended in the middle"):
        archive.TarPump().run(io.BufferedReader(io.BytesIO(raw[:5000])), lambda b: None)
    pump = archive.TarPump()
    pump.run(io.BufferedReader(io.BytesIO(raw)), lambda b: None)
    with pytest.raises(DockyardError, match="does not match"):
        pump.check([{**image, "diff_ids": image["diff_ids"][1::-1] + image["diff_ids"][2:]}])


def test_names_and_paths():
    assert archive.archive_name(["dockyard:0.1.0-cpu"], "zstd", False) == "dockyard_0.1.0-cpu.tar.zst"
    assert archive.archive_name(["a:1", "reg/b:2"], "gzip", True) == "a_1+reg_b_2-thin.tar.gz"
    p = archive.ArchivePaths(archive.Path("/d/x_1-thin.tar.zst"))
    assert (p.base, p.method, p.sha256.name, p.manifest.name, p.signature.name, p.loader.name) == (
        "x_1-thin", "zstd", "x_1-thin.sha256", "x_1-thin.manifest.json", "x_1-thin.manifest.json.sig", "load.sh")
    with pytest.raises(DockyardError, match="not an image archive"):
        archive.ArchivePaths(archive.Path("/d/x.zip")).base


def test_compression_choices():
    assert archive.check_method("zstd", 0) == 2 and archive.check_method("gzip", 9) == 9
    with pytest.raises(DockyardError, match="choose zstd, gzip or none"):
        archive.check_method("xz", 0)
    with pytest.raises(DockyardError, match="1..9"):
        archive.check_method("gzip", 12)
    assert archive.compressor_argv("zstd", 3) == ["zstd", "-T0", "-3", "-q", "-c"]
    assert "--ultra" in archive.compressor_argv("zstd", 22)
    assert archive.compressor_argv("none", 0) is None


def test_engine_store_detects_containerd():
    assert archive.engine_store({"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}) == "containerd"
    assert archive.engine_store({"DriverStatus": [["Backing Filesystem", "extfs"]]}) == "classic"


# --- verification: a hand-made archive set -----------------------------------------------------------

def make_set(folder, payload=b"not really a tar, but hashed like one" * 1000, name="t_1.tar.zst"):
    paths = archive.ArchivePaths(folder / name)
    paths.archive.write_bytes(payload)
    manifest = {"format": archive.FORMAT, "archive": paths.archive.name, "tar_bytes": 10_000,
                "archive_sha256": hashlib.sha256(payload).hexdigest(), "archive_bytes": len(payload),
                "images": [{"ref": "t:1", "tags": ["t:1"], "id": "sha256:" + "a" * 64}], "thin": None,
                "load_sh": {"check_images": "t:1=sha256:" + "a" * 64, "require_chains": "", "need_kb": "20"}}
    paths.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    paths.sha256.write_text(f"{manifest['archive_sha256']}  {paths.archive.name}\n"
                            f"{hashlib.sha256(paths.manifest.read_bytes()).hexdigest()}  {paths.manifest.name}\n")
    return paths


def test_verify_accepts_a_good_set_and_sha256sum_agrees(tmp_path):
    paths = make_set(tmp_path)
    assert archive.verify(Settings(), paths)["archive"] == "t_1.tar.zst"
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
        archive.verify(Settings(), paths)


def _keypair(folder, name):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", folder / name], check=True)
    return folder / name


def test_signatures(tmp_path):
    paths = make_set(tmp_path)
    good, other = _keypair(tmp_path, "release"), _keypair(tmp_path, "intruder")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'release@site namespaces="{archive.SIGN_NAMESPACE}" '
                       + " ".join(good.with_suffix(".pub").read_text().split()[:2]) + "\n")
    settings = Settings(allowed_signers=str(allowed))

    with pytest.raises(DockyardError, match="not signed"):
        archive.verify(settings, paths)
    archive.sign_file(paths.manifest, good)
    assert archive.verify_signature(allowed, paths) == "release@site"
    archive.verify(settings, paths)

    # A manifest re-written after signing (with its sha256 line updated to match) is refused.
    text = paths.manifest.read_text().replace("t:1", "evil:1")
    paths.manifest.write_text(text)
    sums = paths.sha256.read_text().splitlines()
    sums[1] = f"{hashlib.sha256(text.encode()).hexdigest()}  {paths.manifest.name}"
    paths.sha256.write_text("\n".join(sums) + "\n")
    with pytest.raises(DockyardError, match="does not verify"):
        archive.verify(settings, paths)

    paths = make_set(tmp_path)
    paths.signature.unlink()
    archive.sign_file(paths.manifest, other)
    with pytest.raises(DockyardError, match="not in"):
        archive.verify(settings, paths)


def test_load_sh_finds_its_archive_and_refuses_damage_before_docker(tmp_path):
    loader = archive.write_loader(tmp_path)
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


def test_save_refuses_a_full_disk_before_writing(tmp_path):
    with pytest.raises(DockyardError, match="not enough space"):
        archive.check_free(tmp_path / "new", 1 << 62, "the archive", "Free some space.")
    assert not (tmp_path / "new").exists()


def test_thin_for_a_containerd_node_falls_back_to_a_full_archive(tmp_path, monkeypatch, capsys):
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"format": archive.INVENTORY_FORMAT, "engine": {"store": "containerd"},
                               "chain_ids": [BASE]}))
    monkeypatch.setattr(archive.engine, "engine_info", lambda settings: {"DriverStatus": []})
    assert archive.plan_thin(Settings(), [_img("x:1", [BASE, RUN])], str(inv)) == (set(), None)
    err = capsys.readouterr().err
    assert "the target" in err and "containerd image store" in err and "writing a full archive" in err
    inv.write_text(json.dumps({"format": archive.INVENTORY_FORMAT, "engine": {"store": "classic"},
                               "chain_ids": [BASE]}))
    omit, thin = archive.plan_thin(Settings(), [_img("x:1", [BASE, RUN])], str(inv))
    assert omit == {BASE} and thin["requires"] == [BASE] and thin["for"] == str(inv)


def test_thin_for_a_missing_or_foreign_inventory_is_refused(tmp_path):
    with pytest.raises(DockyardError, match="invoke inventory"):
        archive.read_inventory(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(DockyardError, match="not a dockyard inventory"):
        archive.read_inventory(tmp_path / "x.json")


def test_tar_pump_reads_the_oci_layout_of_newer_engines():
    """Docker 25+ saves layers as blobs/sha256/<diff id>: the name alone says what to leave out."""
    big, big_id = _layer(b"y" * 200_000)
    small, small_id = _layer(b"recipe\n")
    config = json.dumps({"rootfs": {"diff_ids": [big_id, small_id]}}).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"blobs/sha256/{image_id[7:]}", "RepoTags": ["t:3"],
                 "Layers": [f"blobs/sha256/{big_id[7:]}", f"blobs/sha256/{small_id[7:]}"]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for digest, data in ((big_id, big), (small_id, small), (image_id, config)):
            _member(t, f"blobs/sha256/{digest[7:]}", data)
        _member(t, "index.json", b"{}")
        _member(t, "manifest.json", json.dumps(manifest).encode())
    out = io.BytesIO()
    pump = archive.TarPump(omit={big_id})
    pump.run(io.BufferedReader(io.BytesIO(buf.getvalue())), out.write)
    image = {"ref": "t:3", "id": image_id, "diff_ids": [big_id, small_id]}
    pump.check([image])
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    assert f"blobs/sha256/{big_id[7:]}" not in names and f"blobs/sha256/{small_id[7:]}" in names
    assert image["tags"] == ["t:3"]


def test_loaded_images_are_checked_by_id_or_on_containerd_by_layers():
    img = {"id": "sha256:" + "c" * 64, "diff_ids": [BASE, RUN]}
    classic = {"Id": img["id"], "RootFS": {"Layers": [BASE, RUN]}}
    assert archive.loaded_as_saved(classic, img, "classic") == ""
    assert "the archive holds" in archive.loaded_as_saved({**classic, "Id": "sha256:" + "d" * 64}, img, "classic")
    assert archive.loaded_as_saved(None, img, "classic") == "is missing"
    # containerd names the image by the manifest it wrote on import: the layers must match instead.
    imported = {"Id": "sha256:" + "e" * 64, "RootFS": {"Layers": [BASE, RUN]}}
    assert archive.loaded_as_saved(imported, img, "containerd") == ""
    assert archive.loaded_as_saved({**imported, "RootFS": {"Layers": [BASE]}}, img, "containerd")
