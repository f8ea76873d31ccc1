"""Framed compression and the layer cache, on a synthetic `docker save` tar with the real zstd and gzip."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess

import pytest

from dockyard.common.errors import DockyardError
from dockyard.transport import frames
from dockyard.transport.layout import check_method, compressor_argv, decompressor_argv
from dockyard.transport.save import pump_framed
from dockyard.transport.tarstream import TarPump
from tests.support.save_tars import fake_save


@pytest.fixture(autouse=True)
def small_layers_get_frames(monkeypatch):
    monkeypatch.setattr(frames, "MIN_LAYER", 100_000)  # the fake image's big layer is 300 kB


def framed(raw: bytes, cache: frames.LayerCache | None, method: str = "zstd", omit=()) -> tuple[bytes, TarPump]:
    out = io.BytesIO()
    pump = TarPump(omit)
    pump_framed(pump, io.BufferedReader(io.BytesIO(raw)), compressor_argv(method, check_method(method, 0)),
                out.write, cache)
    return out.getvalue(), pump


def unpack(data: bytes, method: str = "zstd") -> bytes:
    return subprocess.run(decompressor_argv(method), input=data, capture_output=True, check=True).stdout


@pytest.mark.parametrize("method", ["zstd", "gzip"])
def test_frames_decompress_to_the_tar_and_the_second_save_copies_the_layer(tmp_path, method):
    raw, image, big_id, _ = fake_save()
    cache = frames.LayerCache(tmp_path, method, check_method(method, 0), 1 << 30)
    first, pump = framed(raw, cache, method)
    pump.check([image])
    assert unpack(first, method) == raw
    assert (cache.hits, cache.misses) == (0, 1)
    # what `invoke save` says it kept on disk (it grew ~/.cache/dockyard/layers unsaid): the frame's own size
    assert cache.bytes_kept == sum(f.stat().st_size for f in cache.dir.glob("*.frame")) > 0
    small = frames.LayerCache(tmp_path / "small", method, check_method(method, 0), 1)  # a cache of 1 byte
    framed(raw, small, method)
    small.prune()
    assert small.bytes_kept == 0, "what the cache's limit removed is not said to be kept"

    again = frames.LayerCache(tmp_path, method, check_method(method, 0), 1 << 30)
    second, pump = framed(raw, again, method)
    pump.check([image])  # the layer was still read and hashed
    assert (again.hits, again.misses) == (1, 0)
    assert unpack(second, method) == raw


def test_a_damaged_frame_is_not_used(tmp_path):
    raw, _, big_id, _ = fake_save()
    cache = frames.LayerCache(tmp_path, "zstd", 2, 1 << 30)
    framed(raw, cache)
    frame = cache.dir / f"{big_id.split(':')[1]}.frame"
    data = bytearray(frame.read_bytes())
    data[len(data) // 2] ^= 0xFF
    frame.write_bytes(bytes(data))

    again = frames.LayerCache(tmp_path, "zstd", 2, 1 << 30)
    out, _ = framed(raw, again)
    assert (again.hits, again.misses) == (0, 1)  # compressed afresh, and the entry rewritten
    assert unpack(out) == raw
    assert frames.LayerCache(tmp_path, "zstd", 2, 1 << 30).find(big_id) is not None


def test_a_wrong_name_map_stops_the_save_and_is_forgotten(tmp_path):
    raw, _, big_id, small_id = fake_save()
    cache = frames.LayerCache(tmp_path, "zstd", 2, 1 << 30)
    framed(raw, cache)
    names = cache.known()
    (name,) = [n for n, d in names.items() if d == big_id]
    # The big layer's file name now points at another cached layer: the layer read must not match it.
    other = "sha256:" + "e" * 64
    (cache.dir / f"{'e' * 64}.frame").write_bytes(b"x")
    (cache.dir / f"{'e' * 64}.sum").write_text(f"{hashlib.sha256(b'x').hexdigest()} 1\n")
    (cache.dir / frames.NAMES).write_text(json.dumps({name: other}))
    with pytest.raises(DockyardError, match="save again"):
        framed(raw, frames.LayerCache(tmp_path, "zstd", 2, 1 << 30))
    assert frames.LayerCache(tmp_path, "zstd", 2, 1 << 30).known() == {}
    out, _ = framed(raw, frames.LayerCache(tmp_path, "zstd", 2, 1 << 30))
    assert unpack(out) == raw

    # A thin save trusts the map to leave a layer out unspooled; a wrong entry must not drop the wrong layer.
    (cache.dir / frames.NAMES).write_text(json.dumps({name: small_id}))
    with pytest.raises(DockyardError, match="save again"):
        framed(raw, frames.LayerCache(tmp_path, "zstd", 2, 1 << 30), omit={small_id})
    assert frames.LayerCache(tmp_path, "zstd", 2, 1 << 30).known() == {}


def test_thin_archives_use_frames_too(tmp_path):
    raw, image, big_id, small_id = fake_save()
    cache = frames.LayerCache(tmp_path, "zstd", 2, 1 << 30)
    framed(raw, cache)
    plain = io.BytesIO()
    TarPump(omit={small_id}).run(io.BufferedReader(io.BytesIO(raw)), plain.write)
    out, pump = framed(raw, cache, omit={small_id})
    assert unpack(out) == plain.getvalue()  # the same thin tar, big layer from the cache
    assert cache.hits == 1
    pump.check([image])
    assert pump.omitted == {"2" * 64 + "/layer.tar"}  # left out on the name map's word, and checked


def test_prune_keeps_the_most_recently_used(tmp_path):
    cache = frames.LayerCache(tmp_path, "zstd", 2, 2500)
    for i, hexid in enumerate("abc"):
        p = cache.partial(hexid)
        p.write_bytes(b"z" * 1000)
        cache.keep(p, "sha256:" + hexid * 64, "0" * 64, 1000)
        os.utime(cache.dir / f"{hexid * 64}.frame", (1000 + i, 1000 + i))
    cache.prune()
    assert sorted(p.name[0] for p in cache.dir.glob("*.frame")) == ["b", "c"]
    assert not (cache.dir / f"{'a' * 64}.sum").exists()


def test_a_failing_compressor_is_quoted_with_its_exit_code_and_output(tmp_path):
    raw, _, _, _ = fake_save()
    broken = ["sh", "-c", "cat > /dev/null; echo 'zstd: out of memory' >&2; exit 4"]
    with pytest.raises(DockyardError) as e:
        pump_framed(TarPump(), io.BufferedReader(io.BytesIO(raw)), broken, io.BytesIO().write,
                    frames.LayerCache(tmp_path, "zstd", 2, 1 << 30))
    assert "failed (exit 4): sh -c " in str(e.value) and "  | zstd: out of memory" in str(e.value)
    assert not list(tmp_path.rglob("*.partial"))  # no half-written frame left in the cache
