"""The `docker save` tar reader without an engine: every layer hashed, omitted layers dropped."""

from __future__ import annotations

import io
import tarfile

import pytest

from dockyard.common.errors import DockyardError
from dockyard.transport.tarstream import TarPump
from tests.support.save_tars import fake_oci_save, fake_save


@pytest.mark.parametrize("fmt,long_dir", [(tarfile.USTAR_FORMAT, False), (tarfile.PAX_FORMAT, True),
                                          (tarfile.GNU_FORMAT, True)])
def test_tar_pump_records_layers_and_drops_omitted_ones(fmt, long_dir):
    raw, image, big_id, small_id = fake_save(fmt, long_dir)
    out = io.BytesIO()
    pump = TarPump(omit={big_id})
    pump.run(io.BufferedReader(io.BytesIO(raw)), out.write)
    pump.check([image])  # every layer hashed, the symlink followed
    assert image["tags"] == ["t:2"]
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    assert not any(n.endswith("/layer.tar") and n.startswith(("1", "d")) for n in names)
    assert "2" * 64 + "/layer.tar" in names and "manifest.json" in names
    assert len(out.getvalue()) < len(raw) - 300_000
    # What the manifest declares as the tar (the loaders' gate, their free-space check) is the tar written,
    # not the one docker save gave: a thin archive's load needs room for its own layers only.
    assert pump.bytes_out + (len(raw) - pump.bytes_read) == len(out.getvalue())
    assert {d for d, _ in pump.layers.values()} == {big_id, small_id}

    full = io.BytesIO()
    TarPump().run(io.BufferedReader(io.BytesIO(raw)), full.write)
    assert full.getvalue() == raw  # without --thin-for, the tar passes byte for byte


def test_tar_pump_refuses_a_cut_stream_and_a_wrong_layer():
    raw, image, _, _ = fake_save()
    with pytest.raises(DockyardError, match="ended in the middle"):
        TarPump().run(io.BufferedReader(io.BytesIO(raw[:5000])), lambda b: None)
    pump = TarPump()
    pump.run(io.BufferedReader(io.BytesIO(raw)), lambda b: None)
    with pytest.raises(DockyardError, match="does not match"):
        pump.check([{**image, "diff_ids": image["diff_ids"][1::-1] + image["diff_ids"][2:]}])


def test_tar_pump_reads_the_oci_layout_of_newer_engines():
    """Docker 25+ saves layers as blobs/sha256/<diff id>: the name alone says what to leave out."""
    raw, image, big_id, small_id = fake_oci_save()
    out = io.BytesIO()
    pump = TarPump(omit={big_id})
    pump.run(io.BufferedReader(io.BytesIO(raw)), out.write)
    pump.check([image])
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    assert f"blobs/sha256/{big_id[7:]}" not in names and f"blobs/sha256/{small_id[7:]}" in names
    assert pump.bytes_out + (len(raw) - pump.bytes_read) == len(out.getvalue())
    assert image["tags"] == ["t:3"]


def test_a_save_that_left_a_layer_blob_out_is_refused_naming_it():
    """pitfalls.md (moby#49473): with the containerd image store, `docker save` can write an archive whose manifest
    names a layer blob it does not hold, and exit 0; the archive loaded nowhere. The pump refuses it before anything
    is written, naming the blob."""
    raw, image, big_id, _ = fake_oci_save()
    blob = f"blobs/sha256/{big_id[7:]}"
    kept = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as whole, tarfile.open(fileobj=kept, mode="w") as out:
        for member in whole.getmembers():
            if member.name != blob:
                out.addfile(member, whole.extractfile(member) if member.isfile() else None)
    pump = TarPump()
    pump.run(io.BufferedReader(io.BytesIO(kept.getvalue())), lambda b: None)
    with pytest.raises(DockyardError, match=f"names {blob} but does not hold it .the engine left it out: moby#49473"):
        pump.check([image])
