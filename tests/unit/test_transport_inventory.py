"""Inventories and omissions without an engine: chain ids, image stores, what a thin archive leaves out."""

from __future__ import annotations

import json
import socket

import pytest

from dockyard.common.errors import DockyardError
from dockyard.settings import Settings
from dockyard.transport import inventory
from dockyard.transport.inventory import Omission
from tests.support.fake_engine import FakeEngine

# Diff ids of a real image (dockyard-base + one RUN layer) and the chain id the engine itself reported
# for the second layer in its inventory: chain_ids must compute the engine's keys exactly.
BASE = "sha256:9ba81386ba29b10deff81f99005998bad89564bddb1a8515f74cad7c1a539a87"
RUN = "sha256:e2915dd2eb8c6176022685ceaef9a59dbd79c08cdf3a4f3c9a62356b1daf64a8"
ENGINE_CHAIN = "sha256:b26ca394c2214c2ed2d5b85999ec4a68ec5fd082060f7e468ef77f1a1d218b8d"


def img(ref, diffs, image_id="sha256:" + "0" * 64, tags=()):
    return {"ref": ref, "id": image_id, "tags": list(tags), "diff_ids": diffs,
            "chain_ids": inventory.chain_ids(diffs), "bytes": 0}


def test_chain_ids_match_the_engine():
    assert inventory.chain_ids([BASE, RUN]) == [BASE, ENGINE_CHAIN]
    assert inventory.chain_ids([]) == []


def test_omission_leaves_out_only_layers_the_target_holds_everywhere():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    v1, v2 = img("x:1", [a, b]), img("x:2", [a, b, c])
    assert inventory.omission([v2], {"chain_ids": v1["chain_ids"]}) == Omission(frozenset({a, b}),
                                                                                sorted(v1["chain_ids"]))
    # b also sits on top of another base the target lacks: its file must travel.
    other = img("y:1", [c, b])
    assert inventory.omission([v2, other], {"chain_ids": v1["chain_ids"]}) == Omission(frozenset({a}), [a])
    assert inventory.omission([v2], {"chain_ids": []}) == Omission(frozenset(), [])


def test_a_containerd_store_on_either_side_means_no_omission(monkeypatch, capsys):
    images = [img("x:1", [BASE, RUN])]
    target = {"engine": {"store": "classic"}, "chain_ids": [BASE]}
    monkeypatch.setattr(inventory.engine, "engine_info", lambda settings: {"DriverStatus": []})
    assert inventory.omission_for(Settings(), images, target, "n.json") == Omission(frozenset({BASE}), [BASE])
    assert inventory.omission_for(Settings(), images, {**target, "engine": {"store": "containerd"}}, "n.json") is None
    assert "the target (n.json) uses the containerd image store" in capsys.readouterr().err
    monkeypatch.setattr(inventory.engine, "engine_info", lambda settings: {
        "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]})
    assert inventory.omission_for(Settings(), images, target, "n.json") is None
    assert "this host uses the containerd image store" in capsys.readouterr().err


def test_engine_store_detects_containerd():
    assert inventory.engine_store({"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}) == "containerd"
    assert inventory.engine_store({"DriverStatus": [["Backing Filesystem", "extfs"]]}) == "classic"
    assert inventory.engine_store({}) == "classic"


def test_inventory_from_docker_info_and_inspect():
    info = {"ServerVersion": "20.10.24", "DockerRootDir": "/var/lib/docker", "DriverStatus": []}
    inv = inventory.inventory_from(info, [{"Id": "sha256:" + "1" * 64, "RepoTags": ["a:1"],
                                           "RootFS": {"Layers": [BASE, RUN]}},
                                          {"Id": "sha256:" + "2" * 64, "RootFS": {"Layers": [BASE]}}], "n7")
    assert inv["format"] == inventory.INVENTORY_FORMAT and inv["host"] == "n7"
    assert inv["engine"] == {"version": "20.10.24", "store": "classic", "root": "/var/lib/docker"}
    assert inv["chain_ids"] == sorted({BASE, ENGINE_CHAIN})
    assert inv["images"][1]["tags"] == []


def test_a_missing_or_foreign_inventory_is_refused(tmp_path):
    with pytest.raises(DockyardError, match="invoke inventory"):
        inventory.read_inventory(tmp_path / "nope.json")
    good = {"format": inventory.INVENTORY_FORMAT, "engine": {"store": "classic"}, "chain_ids": [BASE]}
    for foreign, says in (({}, "format"), ([1], "inventory"), ({**good, "chain_ids": "sha256:x"}, "chain_ids"),
                          ({**good, "chain_ids": [1]}, "chain_ids.0"), ({**good, "chain_ids": ["-x"]}, "chain_ids.0"),
                          ({k: v for k, v in good.items() if k != "engine"}, "engine: missing: add it"),
                          ({**good, "engine": {"store": "zfs"}}, "engine.store")):
        (tmp_path / "x.json").write_text(json.dumps(foreign))
        with pytest.raises(DockyardError, match="not a dockyard inventory") as e:
            inventory.read_inventory(tmp_path / "x.json")
        assert says in str(e.value) and str(tmp_path / "x.json") in str(e.value)
    (tmp_path / "y.json").write_text("{")
    with pytest.raises(DockyardError, match="Invalid JSON"):
        inventory.read_inventory(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({**good, "images": [], "created": "today"}))
    got = inventory.read_inventory(tmp_path / "z.json")
    assert got["chain_ids"] == [BASE] and got["engine"]["store"] == "classic" and got["created"] == "today"


def test_a_folder_given_as_an_inventory_is_one_error_line(tmp_path):
    """`invoke save --thin-for=DIR` names a folder: said so, not an IsADirectoryError."""
    with pytest.raises(DockyardError, match=f"cannot read the inventory {tmp_path}: Is a directory. Name the "
                                            r"inventory file itself \(--thin-for=FILE\)"):
        inventory.read_inventory(tmp_path)


def test_invoke_inventory_writes_into_a_folder_it_is_given_and_says_what_it_cannot_write(tmp_path, monkeypatch):
    settings = FakeEngine().install(monkeypatch, Settings())
    written = inventory.write_inventory(settings, str(tmp_path))
    assert written == tmp_path / f"inventory-{socket.gethostname()}.json"
    assert json.loads(written.read_text())["format"] == inventory.INVENTORY_FORMAT
    assert inventory.write_inventory(settings, str(tmp_path / "new") + "/").parent == tmp_path / "new"
    assert inventory.write_inventory(settings, str(tmp_path / "node.json")) == tmp_path / "node.json"
    for where in ("/proc/x", "/proc/x/node.json"):
        with pytest.raises(DockyardError, match=f"cannot write the inventory to {where}: .* Pass --out=FILE"):
            inventory.write_inventory(settings, where)


def test_invoke_inventory_says_where_the_file_goes_next(tmp_path, monkeypatch, capsys):
    """`invoke inventory` (run on the node) ended "wrote FILE: 17 images, ...": that the file is for `invoke save
    --thin-for` on the host that saves archives went unsaid. Now it says the next step, pasteable there."""
    import shlex

    settings = FakeEngine().install(monkeypatch, Settings())
    written = inventory.write_inventory(settings, str(tmp_path))
    line = next((x for x in capsys.readouterr().out.splitlines() if x.startswith("next: ")), "")
    assert shlex.split(line.partition(", then there: ")[2]) == ["invoke", "save", f"--thin-for={written.name}"], line


def test_the_inventory_and_a_gpu_record_replace_a_link_planted_under_their_name(tmp_path, monkeypatch):
    """`inventory --out` (a predictable inventory-<host>.json in a dist folder others may share) and `doctor
    --record` wrote through a link planted under that name, into the file it pointed at."""
    from dockyard import gpus

    settings = FakeEngine().install(monkeypatch, Settings())
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own\n")
    planted = [tmp_path / f"inventory-{socket.gethostname()}.json", tmp_path / "host.json"]
    for link in planted:
        link.symlink_to(victim)
    inventory.write_inventory(settings, str(tmp_path))
    gpus.record(planted[1])
    assert victim.read_text() == "the user's own\n"
    assert not any(p.is_symlink() for p in planted)
    assert json.loads(planted[0].read_text())["format"] == inventory.INVENTORY_FORMAT
    assert json.loads(planted[1].read_text())["kind"] == "gpu"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bashrc", *(p.name for p in planted)]), \
        "no partial file left"


def test_images_are_named_by_their_tags_or_their_id():
    tagged, untagged = img("a", [BASE], tags=["a:1", "a:latest"]), img("b", [BASE], image_id="sha256:" + "b" * 64)
    assert [n for n, _ in inventory.names([tagged, untagged])] == ["a:1", "a:latest", "sha256:" + "b" * 64]


def test_loaded_images_are_checked_by_id_or_on_containerd_by_layers():
    image = {"id": "sha256:" + "c" * 64, "diff_ids": [BASE, RUN]}
    classic = {"Id": image["id"], "RootFS": {"Layers": [BASE, RUN]}}
    assert inventory.loaded_as_saved(classic, image, "classic") == ""
    assert "the archive holds" in inventory.loaded_as_saved({**classic, "Id": "sha256:" + "d" * 64}, image, "classic")
    assert inventory.loaded_as_saved(None, image, "classic") == "is missing"
    # containerd names the image by the manifest it wrote on import: the layers must match instead.
    imported = {"Id": "sha256:" + "e" * 64, "RootFS": {"Layers": [BASE, RUN]}}
    assert inventory.loaded_as_saved(imported, image, "containerd") == ""
    assert inventory.loaded_as_saved({**imported, "RootFS": {"Layers": [BASE]}}, image, "containerd")


def test_the_inventory_and_a_gpu_record_named_over_a_file_of_the_users_leave_it(tmp_path, monkeypatch):
    """`doctor --record=~/.bashrc` (or `inventory --out=notes.txt`) replaced the file whole, without a word. One of
    theirs is replaced, as a second recording of the same host is."""
    from dockyard import gpus

    settings = FakeEngine().install(monkeypatch, Settings())
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own\n")
    with pytest.raises(DockyardError, match=f"--out={notes} holds a file that is not an inventory: give another name"):
        inventory.write_inventory(settings, str(notes))
    with pytest.raises(DockyardError, match=f"--record={notes} holds a file that is not a recording"):
        gpus.record(notes)
    assert notes.read_text() == "the user's own\n"
    inventory.write_inventory(settings, str(tmp_path / "inv.json"))
    inventory.write_inventory(settings, str(tmp_path / "inv.json"))  # its own, written again
    gpus.record(tmp_path / "host.json")
    gpus.record(tmp_path / "host.json")
    assert json.loads((tmp_path / "host.json").read_text())["kind"] == "gpu"
