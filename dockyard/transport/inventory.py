"""What an engine holds, and what a thin archive may leave out for it.

A node's inventory lists its images with their diff ids and chain ids (the keys the engine stores
layers under) and its image store. A thin archive leaves out the layer files a target already holds
(an `Omission`); `docker load` opens a layer file only for a chain id the engine lacks, and only the
classic store loads such an archive.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from dockyard import engine, gpus
from dockyard.common import locks, runfolder
from dockyard.common.errors import DockyardError, problems, read_bounded
from dockyard.gpus import MAX_GPUS, DriverVersion, Version, Words
from dockyard.images import variants
from dockyard.settings import Settings

INVENTORY_FORMAT = "dockyard-inventory/1"


def layer_inventory(settings: Settings) -> dict:
    """This node's inventory: every image, its diff ids and chain ids."""
    info = engine.engine_info(settings)
    ids = engine.run(engine.docker(settings, "image", "ls", "-aq", "--no-trunc"),
                     capture=True, quiet=True).stdout.split()
    ids = sorted(set(ids))
    inspected = json.loads(engine.run(engine.docker(settings, "image", "inspect", *ids), capture=True,
                                      quiet=True).stdout) if ids else []
    inv = inventory_from(info, inspected, socket.gethostname())
    host = gpus.read_host()
    if not host.error:  # the driver, as load.sh --inventory records nvidia-smi's: what a thin save checks it by
        inv["driver"] = driver_record(host)
    return inv


def driver_record(host: gpus.Host) -> dict:
    """An inventory's `driver` block: the host's driver and GPUs, what driver_host reads back."""
    return {"version": host.driver, "cuda": host.cuda,
            "gpus": [{"name": g.name, "capability": g.capability} for g in host.gpus]}


def inventory_from(info: dict, inspected: list[dict], host: str) -> dict:
    """A node's inventory from `docker info` and `docker image inspect` of all its images."""
    images, held = [], set()
    for meta in inspected:
        diff_ids = (meta.get("RootFS") or {}).get("Layers") or []
        chains = chain_ids(diff_ids)
        held.update(chains)
        images.append({"id": meta["Id"], "tags": meta.get("RepoTags") or [], "diff_ids": diff_ids,
                       "chain_ids": chains})
    return {"format": INVENTORY_FORMAT, "host": host, "created": now(),
            "engine": {"version": info.get("ServerVersion", ""), "store": engine_store(info),
                       "root": info.get("DockerRootDir", "")},
            "images": images, "chain_ids": sorted(held)}


def engine_store(info: dict) -> str:
    """The image store of an engine, from `docker info`: "containerd" for the containerd image store
    (default on new Docker 29 installs), else "classic" (overlay2 and the other graph drivers)."""
    for pair in info.get("DriverStatus") or []:
        if len(pair) == 2 and pair[0] == "driver-type" and "containerd.snapshotter" in pair[1]:
            return "containerd"
    return "classic"


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The engine's layer keys: chain(0) = diff(0); chain(i) = sha256(chain(i-1) + " " + diff(i))."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_inventory(settings: Settings, out: str = "") -> Path:
    """This node's inventory, written to `out` (a file, or a folder to hold inventory-<host>.json)."""
    path = Path(os.path.expanduser(out)) if out else settings.path(settings.dist_dir)
    folder = not out or locks.names_a_folder(os.path.expanduser(out))
    if out:  # the links on the way followed, as save's --out: a loop of them was mkdir's bare "File exists"
        path = runfolder.followed(path, "--out") if folder else runfolder.followed(path.parent, "--out") / path.name
    if not folder:
        locks.check_named_output(path, "--out")  # before the engine is asked
        locks.check_ours(path, "--out", b'"format"', "an inventory")
    inv = layer_inventory(settings)
    if folder:
        path = path / f"inventory-{inv['host']}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        locks.replace_file(path, json.dumps(inv, indent=2) + "\n")  # never through a link planted under its name
    except OSError as e:
        raise DockyardError(f"cannot write the inventory to {path}: {e.strerror or e}. Pass --out=FILE (or a "
                            "folder) where you can write.") from None
    print(f"wrote {path}: {len(inv['images'])} images, {len(inv['chain_ids'])} layers, "
          f"{inv['engine']['store']} image store")
    # the file is only useful where archives are saved: the step after it, pasteable there once the file is copied
    print(f"next: copy it to the host that saves archives, then there: invoke save --thin-for={shlex.quote(path.name)}")
    return path


def read_inventory(path: Path, or_else: str = "") -> dict:
    """An inventory file, as untrusted input: the shape `invoke inventory` and `load.sh --inventory` write.
    `or_else`: what else the user may have meant, said where there is no such file."""
    try:
        raw = read_bounded(path, INVENTORY_CAP, "inventory (`invoke inventory`)")
    except FileNotFoundError:
        raise DockyardError(f"no inventory {path}{or_else}: make one on the target with `invoke inventory "
                            "--out=FILE` (or `sh load.sh --inventory > FILE`) and copy it here") from None
    except OSError as e:  # a folder, no permission
        raise DockyardError(f"cannot read the inventory {path}: {e.strerror or e}. Name the inventory file "
                            "itself (--thin-for=FILE).") from None
    return check_inventory(lambda: _Inventory.model_validate_json(raw).model_dump(),
                           f"{path} is not a dockyard inventory ({INVENTORY_FORMAT})")


# --- the shape of inventories, checked wherever one comes from (a file, a node over ssh) -------------

INVENTORY_CAP = 64 << 20  # `docker image inspect` of a few thousand images; more is not an inventory
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Engine(BaseModel):
    model_config = ConfigDict(extra="allow")

    store: Literal["classic", "containerd"]


class _Gpu(BaseModel):
    name: Words
    capability: Version


class _Driver(BaseModel):
    """The node's NVIDIA driver and GPUs as its nvidia-smi (load.sh --inventory) or NVML (invoke inventory) said them."""
    version: DriverVersion
    cuda: Version = ""
    gpus: Annotated[list[_Gpu], Field(max_length=MAX_GPUS)] = []


class _Inventory(BaseModel):
    """What omission_for and driver_host read; the rest (images, created, ...) is carried along. An inventory made
    before `driver` was recorded, or on a node without nvidia-smi, has none."""
    model_config = ConfigDict(extra="allow")

    format: Literal["dockyard-inventory/1"]
    host: str = ""
    engine: _Engine
    chain_ids: list[Digest]
    driver: _Driver | None = None


def driver_host(inv: dict) -> gpus.Host | None:
    """The inventory's driver and GPUs as the Host the variants' rules read (runscript.unfit_on); None where it
    records none."""
    driver = inv.get("driver")
    if not driver:
        return None
    return gpus.Host(driver=driver["version"], cuda=driver["cuda"],
                     gpus=[gpus.Gpu(i, g["name"], 0, capability=g["capability"]) for i, g in enumerate(driver["gpus"])])


class _Info(BaseModel):
    """The fields of `docker info` an inventory records."""
    model_config = ConfigDict(extra="allow")

    ServerVersion: str = ""
    DockerRootDir: str = ""
    DriverStatus: list[list[str]] | None = None


class _Layers(BaseModel):
    model_config = ConfigDict(extra="allow")

    Layers: list[Digest] | None = None


class _Inspected(BaseModel):
    """One image of `docker image inspect`, the fields an inventory records."""
    model_config = ConfigDict(extra="allow")

    Id: str
    RepoTags: list[str] | None = None
    RootFS: _Layers = _Layers()


_INSPECTED = TypeAdapter(list[_Inspected])


class _Answer(_Inspected):
    """One image of `docker image inspect`, as a ship checks a load by it: an Id that is an image id (it is said
    back to the user)."""

    Id: Annotated[str, StringConstraints(pattern=r"^(sha256:)?[0-9a-f]{64}$")]


def info_answer(info: dict) -> dict:
    """What another machine's `docker info --format '{{json .}}'` printed, checked (a ValidationError where it is
    not what docker prints)."""
    return _Info.model_validate(info).model_dump()


def inspect_answer(line: str | bytes) -> dict:
    """One image of another machine's `docker image inspect --format '{{json .}}'`, checked as loaded_as_saved
    reads it (a ValidationError where it is not what docker prints: no Id, layers that are not digests)."""
    return _Answer.model_validate_json(line).model_dump()


def check_inventory(parse: Callable[[], dict], refusal: str) -> dict:
    """What parse() returns, checked: an inventory, or `refusal` (which names the file or node) and what is wrong."""
    try:
        return _Inventory.model_validate(parse()).model_dump()
    except ValidationError as e:
        raise DockyardError(f"{refusal}: {problems(e, 'inventory')}") from None


def inventory_from_json(info: bytes, inspected: bytes, host: str) -> dict:
    """A node's inventory from what its `docker info --format '{{json .}}'` and `docker image inspect` printed,
    read as untrusted input (a node is another machine): a refusal naming the node when it is not that."""
    def parse() -> dict:
        meta = _Info.model_validate_json(info).model_dump()
        images = [i.model_dump() for i in _INSPECTED.validate_json(inspected)]
        return inventory_from(meta, images, host)

    return check_inventory(parse, f"the image inventory {host} sent over ssh is not what docker prints; refused")


# --- images, as archives record them --------------------------------------------------------------

def inspect_images(settings: Settings, refs: list[str]) -> list[dict]:
    """What the manifest records of each image; refuses names the engine does not hold."""
    out = []
    for ref in refs:
        meta = engine.image_inspect(settings, ref)
        if meta is None:
            variant = variants.of_tag(settings, ref)
            build = f"invoke build --variant={variant.name}" if variant else "invoke build"
            raise DockyardError(f"no image {ref} in the engine: build it (`{build}`) or name "
                                "another with --image (see `docker image ls`)")
        diff_ids = meta["RootFS"].get("Layers") or []
        out.append({"ref": ref, "id": meta["Id"], "tags": meta.get("RepoTags") or [],
                    "bytes": meta.get("Size", 0), "labels": (meta.get("Config") or {}).get("Labels") or {},
                    "diff_ids": diff_ids, "chain_ids": chain_ids(diff_ids)})
    return out


def names(images: list[dict]) -> list[tuple[str, dict]]:
    """(name, image) for every name an archive gives its images: their tags, or the id of an untagged one."""
    return [(ref, img) for img in images for ref in img["tags"] or [img["id"]]]


def held_as_saved(images: list[dict], target: dict) -> list[str] | None:
    """The names `images` are saved under (names(): their tags, or the id of an untagged one) that `target` (an
    inventory) already gives the same image id: what loading them there would change nothing of; None where it lists
    no images (load.sh --inventory records the layers alone). Its images are carried along unchecked (_Inventory): an
    entry that is not what an inventory writes holds nothing."""
    if not target.get("images") or not isinstance(target["images"], list):
        return None
    there: dict[str, str] = {}
    for img in target["images"]:
        if isinstance(img, dict) and isinstance(img.get("id"), str):
            tags = img.get("tags") if isinstance(img.get("tags"), list) else []
            there.update({name: img["id"] for name in [img["id"], *tags] if isinstance(name, str)})
    return [name for name, img in names(images) if there.get(name) == img["id"]]


def loaded_as_saved(meta: dict | None, img: dict, store: str) -> str:
    """"" when the engine holds the image the archive carries, else what is wrong with it.

    The classic store names an image by its config digest, which the archive knows. The containerd
    store names it by a manifest it writes while importing, so there the layers are compared.
    """
    if meta is None:
        return "is missing"
    if store == "containerd":
        return "" if meta["RootFS"].get("Layers") == img["diff_ids"] else "has other layers than the archive's"
    return "" if meta["Id"] == img["id"] else f"is {meta['Id']}, the archive holds {img['id']}"


# --- thin archives ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Omission:
    """What a thin archive leaves out for one target: the layer files (diff ids), and the chain ids the
    target must hold for the archive to load there."""

    diff_ids: frozenset[str]
    requires: list[str]


def omission(images: list[dict], target: dict) -> Omission:
    """The layer files `target` (an inventory) makes unnecessary for `images`.

    A layer file is left out only when every place it appears in is already held by the target:
    `docker load` opens a layer file only for a chain id the engine lacks.
    """
    held = set(target["chain_ids"])
    needed: set[str] = set()
    covered: list[tuple[str, str]] = []
    for img in images:
        for diff, chain in zip(img["diff_ids"], img["chain_ids"], strict=True):
            if chain in held:
                covered.append((diff, chain))
            else:
                needed.add(diff)
    omit = frozenset(d for d, _ in covered) - needed
    return Omission(omit, sorted({c for d, c in covered if d in omit}))


def omission_for(settings: Settings, images: list[dict], target: dict, target_name: str) -> Omission | None:
    """The omission for `target`, or None (saying why) where an image store needs every layer."""
    here = engine_store(engine.engine_info(settings))
    if "containerd" in (here, target["engine"]["store"]):
        where = "this host" if here == "containerd" else f"the target ({target_name})"
        print(f"{where} uses the containerd image store, where `docker load` needs every layer in the "
              "archive: writing a full archive", file=sys.stderr)
        return None
    return omission(images, target)
