"""Moving images between nodes, for real: the local engine, a second node (its own dockerd in a network
namespace, reached over real ssh; see tests/support/node2.py), `invoke save/ship/load/commit/inventory` as users run them.

Small test images (dockyard-base + a 3 MB layer + a recipe file) keep most tests quick; one end-to-end
pass uses the project's cpu image.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard import engine
from dockyard.settings import ROOT
from tests.support.cli import INVOKE, docker, invoke

pytestmark = pytest.mark.engine
IMAGE = f"dockyard-xfer-test-{os.getpid()}"


@pytest.fixture(scope="module")
def images(settings, engine_ready, tmp_path_factory):
    """v1 and v2 of a small image; v2 differs only in its top layer (a recipe-only change).

    The 3 MB layer is the same file COPYed into both, so both hold the same layer whatever the engine's
    build cache holds (a RUN that writes random bytes gives each build its own layer wherever the cache
    has several results for that step, e.g. after builds running side by side).
    """
    ctx = tmp_path_factory.mktemp("xfer-ctx")
    lock = hashlib.sha256((ROOT / "images" / "locks" / "cpu.txt").read_bytes()).hexdigest()
    (ctx / "blob").write_bytes(os.urandom(3_000_000))
    (ctx / "Dockerfile").write_text(
        f"FROM {settings.base_image_cpu}\nLABEL dockyard.variant=cpu dockyard.lock={lock}\n"
        "COPY blob /blob\nCOPY recipe.txt /recipe.txt\n")
    refs = {}
    try:
        for v in ("v1", "v2"):
            (ctx / "recipe.txt").write_text(f"{v}\n")
            refs[v] = f"{IMAGE}:{v}"
            r = subprocess.run(engine.docker(settings, "build", "-q", "-t", refs[v], str(ctx)), capture_output=True,
                               text=True, env={**os.environ, **engine.build_env()})
            assert r.returncode == 0, r.stderr
        refs.update({f"{v}_id": engine.image_inspect(settings, refs[v])["Id"] for v in ("v1", "v2")})
        yield refs
    finally:
        tags = docker(settings, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", IMAGE).stdout.split()
        if tags:
            docker(settings, "image", "rm", "-f", *tags, check=False)


@pytest.fixture(scope="module")
def ssh_env(node):
    return {"INVOKE_DOCKYARD_SSH": node.ssh_command}


@pytest.fixture(scope="module")
def full(images, tmp_path_factory):
    """`invoke save` of v1: the archive's path and manifest."""
    dist = tmp_path_factory.mktemp("xfer-dist")
    r = invoke("save", f"--image={images['v1']}", f"--out={dist}")
    assert r.returncode == 0, r.stderr
    path = dist / f"{IMAGE}_v1.tar.zst"
    return path, json.loads(path.with_name(f"{IMAGE}_v1.manifest.json").read_text())


@pytest.fixture(scope="module")
def shipped(node, full, ssh_env):
    """`invoke ship --load` of the full archive to an empty node 2: the remote folder and the result."""
    node.wipe()
    rdir = node.base / "inbox"
    r = invoke("ship", f"--file={full[0]}", f"--to={node.alias}:{rdir}", "--load", env=ssh_env)
    return rdir, r


def _ensure_v1(node, images, shipped):
    if node.image_id(images["v1"]) != images["v1_id"]:
        node.ssh(f"sh {shipped[0]}/load.sh {IMAGE}_v1.tar.zst")


def test_save_writes_a_verified_archive_set(full, images, settings):
    path, manifest = full
    folder = path.parent
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [path.name, f"{IMAGE}_v1.sha256", f"{IMAGE}_v1.manifest.json", "load.sh", "run.sh"])
    assert subprocess.run(["sha256sum", "-c", f"{IMAGE}_v1.sha256"], cwd=folder, capture_output=True).returncode == 0
    assert subprocess.run(["zstd", "-tq", path]).returncode == 0
    meta = engine.image_inspect(settings, images["v1"])
    assert manifest["images"][0]["id"] == meta["Id"] and manifest["images"][0]["tags"] == [images["v1"]]
    assert [layer["diff_id"] for layer in manifest["layers"]] == meta["RootFS"]["Layers"]
    assert all(layer["bytes"] > 0 and layer["included"] for layer in manifest["layers"])
    assert manifest["images"][0]["labels"]["dockyard.variant"] == "cpu"
    assert manifest["archive_bytes"] == path.stat().st_size < manifest["tar_bytes"]


def test_full_archive_ships_loads_and_runs_on_node2(node, images, shipped):
    rdir, r = shipped
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"loaded on {node.alias}: {images['v1']} {images['v1_id']}" in r.stdout
    assert sorted(os.listdir(rdir)) == sorted([f"{IMAGE}_v1.tar.zst", f"{IMAGE}_v1.sha256",
                                               f"{IMAGE}_v1.manifest.json", "load.sh", "run.sh"])
    assert node.image_id(images["v1"]) == images["v1_id"]
    run = node.ssh(f"docker run --rm --network none {images['v1']} cat /recipe.txt")
    assert run.stdout == "v1\n"


def test_plain_docker_load_and_load_sh_work_on_node2(node, images, shipped):
    rdir = shipped[0]
    node.wipe()
    node.ssh(f"zstd -dc {rdir}/{IMAGE}_v1.tar.zst | docker load")
    assert node.image_id(images["v1"]) == images["v1_id"]
    node.wipe()
    r = node.ssh(f"sh {rdir}/load.sh")  # the only archive it knows: no argument needed
    assert f"loaded {images['v1']} {images['v1_id']}" in r.stdout
    assert node.image_id(images["v1"]) == images["v1_id"]



def test_a_gzip_set_loads_on_a_node_by_load_sh_and_by_plain_docker_load(node, images, tmp_path):
    """--compress=gzip is for a node without zstd: its set loads there by load.sh and by gzip -dc | docker load."""
    r = invoke("save", f"--image={images['v1']}", f"--out={tmp_path}", "--compress=gzip", "--level=1")
    assert r.returncode == 0, r.stderr
    path = tmp_path / f"{IMAGE}_v1.tar.gz"
    node.wipe()
    node.ssh(f"gzip -dc {path} | docker load")
    assert node.image_id(images["v1"]) == images["v1_id"]
    node.wipe()
    r = node.ssh(f"sh {tmp_path}/load.sh {path.name}")
    assert f"loaded {images['v1']} {images['v1_id']}" in r.stdout
    assert node.image_id(images["v1"]) == images["v1_id"]

def test_thin_archive_after_a_recipe_change(node, images, full, shipped, ssh_env, tmp_path):
    _ensure_v1(node, images, shipped)
    dist = full[0].parent
    r = invoke("save", f"--image={images['v2']}", f"--out={dist}", f"--thin-for=ssh://{node.alias}", env=ssh_env)
    assert r.returncode == 0, r.stderr
    thin = dist / f"{IMAGE}_v2-thin.tar.zst"
    m = json.loads(thin.with_name(f"{IMAGE}_v2-thin.manifest.json").read_text())
    assert m["archive_bytes"] < 0.01 * full[1]["archive_bytes"]
    assert [layer["included"] for layer in m["layers"]] == [False, False, True]
    assert m["thin"]["requires"] == sorted(full[1]["images"][0]["chain_ids"][:2])

    # The same omission from an inventory file written on the node by load.sh alone (no project there).
    inv = tmp_path / "node2.json"
    inv.write_text(node.ssh(f"sh {shipped[0]}/load.sh --inventory").stdout)
    r = invoke("save", f"--image={images['v2']}", f"--out={tmp_path}", f"--thin-for={inv}")
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / f"{IMAGE}_v2-thin.manifest.json").read_text())
    assert again["thin"]["omitted"] == m["thin"]["omitted"]

    # Shipped and loaded with plain `zstd -dc | docker load` on the node that holds the base layers.
    rdir = node.base / "thin"
    r = invoke("ship", f"--file={thin}", f"--to={node.alias}:{rdir}", env=ssh_env)
    assert r.returncode == 0, r.stderr
    node.ssh(f"zstd -dc {rdir}/{thin.name} | docker load")
    assert node.image_id(images["v2"]) == images["v2_id"]
    assert node.ssh(f"docker run --rm --network none {images['v2']} cat /recipe.txt").stdout == "v2\n"

    # An empty node: refused before anything is copied, and load.sh refuses it there too.
    node.wipe()
    r = invoke("ship", f"--file={thin}", f"--to={node.alias}:{node.base}/empty", "--load", env=ssh_env)
    assert r.returncode != 0 and "lacks 2 of the 2 base layers" in r.stderr
    assert not (node.base / "empty").exists()
    r = node.ssh(f"sh {rdir}/load.sh {thin.name}", check=False)
    assert r.returncode == 1 and "needs 2 base layers this node does not hold" in r.stderr
    assert node.docker("image", "ls", "-aq").stdout.strip() == ""


def test_the_next_version_copies_the_compressed_layers_of_the_last_save(node, images, full, tmp_path):
    """v2 shares all but its top layer with v1, saved before (the `full` fixture): the layer cache hands
    over those layers' frames instead of compressing them again; the archive loads like any other."""
    r = invoke("save", f"--image={images['v2']}", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert "layer cache: 2 of 2 large layers copied" in r.stdout
    assert "layer cache: kept" not in r.stdout, "no new large layer: nothing more kept"
    path = tmp_path / f"{IMAGE}_v2.tar.zst"
    node.wipe()
    node.ssh(f"zstd -dc {path} | docker load")
    assert node.image_id(images["v2"]) == images["v2_id"]
    assert node.ssh(f"docker run --rm --network none {images['v2']} cat /recipe.txt").stdout == "v2\n"


def test_several_images_share_their_layers_in_one_archive(node, images, full, tmp_path):
    node.wipe()
    r = invoke("save", f"--image={images['v1']},{images['v2']}", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr
    path = tmp_path / f"{IMAGE}_v1+{IMAGE}_v2.tar.zst"
    m = json.loads(path.with_name(f"{IMAGE}_v1+{IMAGE}_v2.manifest.json").read_text())
    assert [i["id"] for i in m["images"]] == [images["v1_id"], images["v2_id"]]
    assert len(m["layers"]) == 4  # base and blob once, two recipe layers
    assert m["archive_bytes"] < 1.01 * full[1]["archive_bytes"]
    r = invoke("load", f"--file={path}", env={"DOCKER_HOST": f"unix://{node.sock}"})
    assert r.returncode == 0, r.stderr
    assert node.image_id(images["v1"]) == images["v1_id"] and node.image_id(images["v2"]) == images["v2_id"]


def _copy_set(full, folder: Path) -> Path:
    folder.mkdir()
    for f in full[0].parent.glob(f"{IMAGE}_v1.*"):
        shutil.copy(f, folder / f.name)
    shutil.copy(full[0].with_name("load.sh"), folder / "load.sh")
    return folder / full[0].name


@pytest.mark.parametrize("damage,message,sh_message", [
    ("truncated", "the copy is truncated", "the copy is truncated"),
    ("bitflip", "does not match its sha256", "sha256 mismatch"),
    ("manifest", "the manifest was changed", "sha256 mismatch"),
])
def test_damaged_archives_are_refused_and_nothing_is_loaded(node, full, tmp_path, damage, message, sh_message):
    node.wipe()
    path = _copy_set(full, tmp_path / "set")
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x10
        path.write_bytes(data)
    else:
        mpath = path.with_name(f"{IMAGE}_v1.manifest.json")
        mpath.write_text(mpath.read_text().replace(f'"{IMAGE}:v1"', f'"{IMAGE}:evil"'))
    r = invoke("load", f"--file={path}", env={"DOCKER_HOST": f"unix://{node.sock}"})
    assert r.returncode != 0 and message in r.stderr and "nothing was loaded" in r.stderr.lower()
    r = node.ssh(f"sh {path.parent}/load.sh {path.name}", check=False)
    assert r.returncode == 1 and sh_message in r.stderr
    assert node.docker("image", "ls", "-aq").stdout.strip() == ""


def test_signed_archive_loads_and_a_re_signed_tamper_is_refused(node, images, tmp_path):
    node.wipe()
    key = tmp_path / "release"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text("release@site " + " ".join(key.with_suffix(".pub").read_text().split()[:2]) + "\n")
    r = invoke("save", f"--image={images['v2']}", f"--out={tmp_path / 'dist'}", f"--sign={key}")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "dist" / f"{IMAGE}_v2.tar.zst"
    env = {"DOCKER_HOST": f"unix://{node.sock}", "INVOKE_DOCKYARD_ALLOWED_SIGNERS": str(allowed)}

    # Tamper with the manifest and fix up the .sha256 to match: only the signature can tell.
    mpath, spath = path.with_name(f"{IMAGE}_v2.manifest.json"), path.with_name(f"{IMAGE}_v2.sha256")
    good = mpath.read_text(), spath.read_text()
    mpath.write_text(good[0].replace(f'"{IMAGE}:v2"', f'"{IMAGE}:evil"'))
    spath.write_text(good[1].splitlines()[0] + "\n" + hashlib.sha256(mpath.read_bytes()).hexdigest()
                     + f"  {mpath.name}\n")
    r = invoke("load", f"--file={path}", env=env)
    assert r.returncode != 0 and "signature" in r.stderr and "does not verify" in r.stderr
    r = node.ssh(f"ALLOWED_SIGNERS={allowed} sh {path.parent}/load.sh", check=False)
    assert r.returncode == 1 and "does not verify" in r.stderr
    assert node.docker("image", "ls", "-aq").stdout.strip() == ""

    mpath.write_text(good[0])
    spath.write_text(good[1])
    r = invoke("load", f"--file={path}", env=env)
    assert r.returncode == 0, r.stderr
    assert "signed by release@site" in r.stderr and f"loaded {images['v2']} {images['v2_id']}" in r.stdout
    assert node.image_id(images["v2"]) == images["v2_id"]


def _partial_bytes(folder: Path) -> int:
    return sum(os.path.getsize(f) for f in glob.glob(f"{folder}/*partial*") + glob.glob(f"{folder}/.*partial*"))


@pytest.mark.parametrize("transport", ["rsync", "ssh"])
def test_a_ship_killed_mid_copy_resumes_and_verifies(node, full, transport):
    path, manifest = full
    rdir = node.base / f"resume-{transport}"
    code = ("import sys; from dockyard.transport import ship; from dockyard.settings import load; "
            f"ship.ship_file(load({{'ssh': {node.ssh_command!r}}}), {str(path)!r}, {f'{node.alias}:{rdir}'!r}, "
            f"transport={transport!r})")
    argv = [sys.executable, "-c", code]
    node.limit_rate(40)  # 5 MB/s: the copy would take about 18 s
    try:
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 60
        while _partial_bytes(rdir) < 10_000_000 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)  # the copy and its ssh/rsync, mid-copy
        p.wait()
    finally:
        node.unlimit_rate()
    deadline = time.monotonic() + 120  # the node's rsync keeps the cut copy once it sees the link drop (seconds
    while not (rdir / f"{path.name}.partial").exists() and time.monotonic() < deadline:  # on a loaded CI host)
        time.sleep(0.2)
    assert (rdir / f"{path.name}.partial").exists(), f"the node kept no cut copy 120 s after the kill: {list(rdir.iterdir())}"
    cut = (rdir / f"{path.name}.partial").stat().st_size
    assert 10_000_000 <= cut < manifest["archive_bytes"]

    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resuming the copy at" in r.stderr and "sha256 verified there" in r.stdout
    assert hashlib.sha256((rdir / path.name).read_bytes()).hexdigest() == manifest["archive_sha256"]
    assert not (rdir / f"{path.name}.partial").exists()


def test_a_target_folder_without_space_is_refused_before_writing(node, images, full, ssh_env):
    small = node.base / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], check=True)
    try:
        r = invoke("ship", f"--file={full[0]}", f"--to={node.alias}:{small}/dist", env=ssh_env)
        assert r.returncode != 0 and f"not enough space in {node.alias}:{small}/dist" in r.stderr
        r = invoke("save", f"--image={images['v1']}", f"--out={small}/dist")
        assert r.returncode != 0 and f"not enough space in {small}/dist" in r.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", small], check=True)


def test_commit_refuses_a_planted_token_and_records_drift(settings, images):
    name, tag = f"{IMAGE}-commit", f"{IMAGE}:committed"
    docker(settings, "run", "-d", "--name", name, "--network", "none", images["v1"], "sleep", "600")
    try:
        docker(settings, "exec", name, "sh", "-c",
                "mkdir -p /root/.cache/huggingface /opt/venv/lib/python3.11/site-packages/peft-0.99.0.dist-info"
                " && echo hf_secret > /root/.cache/huggingface/token")
        r = invoke("commit", f"--container={name}", f"--tag={tag}")
        assert r.returncode != 0
        assert "/root/.cache/huggingface/token  (Hugging Face token)" in r.stderr and "--allow-secrets" in r.stderr
        assert engine.image_inspect(settings, tag) is None

        docker(settings, "exec", name, "rm", "/root/.cache/huggingface/token")
        r = invoke("commit", f"--container={name}", f"--tag={tag}")
        assert r.returncode == 0, r.stderr
        labels = engine.image_inspect(settings, tag)["Config"]["Labels"]
        assert labels["dockyard.drift"] == "peft==0.99.0 (lock: 0.21.2)"
        assert labels["dockyard.commit.source"].startswith(images["v1"])
        assert labels["dockyard.commit.container"].startswith(name)
        assert "added" in labels["dockyard.commit.diff"] and "/opt/venv" in labels["dockyard.commit.diff"]
    finally:
        docker(settings, "rm", "-f", name, check=False)


def test_stream_mode_loads_on_node2_and_thin_sends_only_the_new_layer(node, images, ssh_env):
    node.wipe()
    r = invoke("ship", f"--image={images['v1']}", f"--to={node.alias}", env=ssh_env)
    assert r.returncode == 0, r.stderr
    assert f"loaded on {node.alias}: {images['v1']} {images['v1_id']}" in r.stdout
    r = invoke("ship", f"--image={images['v2']}", f"--to={node.alias}", "--thin", env=ssh_env)
    assert r.returncode == 0, r.stderr
    assert "leaving out 2 layers" in r.stderr and " kB (zstd)" in r.stdout
    assert node.ssh(f"docker run --rm --network none {images['v2']} cat /recipe.txt").stdout == "v2\n"
    # again: the node holds it as saved, so nothing is streamed (a save of every layer to send none took minutes)
    r = invoke("ship", f"--image={images['v2']}", f"--to={node.alias}", "--thin", env=ssh_env)
    assert r.returncode == 0, r.stderr
    assert f"{images['v2']} is already on {node.alias}, as saved ({images['v2_id']}): nothing to send" in r.stdout
    assert "streamed" not in r.stdout


def test_stream_thin_with_an_identity_uses_that_key_for_every_connection(node, images, ssh_env, tmp_path):
    """`ship --image --thin --identity=KEY` to a node where ONLY that key is authorised, with an ssh config
    that names no key: the node's state, its inventory (what thin leaves out) and the load all need KEY."""
    node.wipe()
    r = invoke("ship", f"--image={images['v1']}", f"--to={node.alias}", env=ssh_env)  # the base layers
    assert r.returncode == 0, r.stderr
    key = tmp_path / "only_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "only-key", "-f", key], check=True)
    env = {"INVOKE_DOCKYARD_SSH": f"ssh -F {node.write_ssh_config(tmp_path / 'ssh_config', None)}"}
    with node.only_key(key.with_suffix(".pub")):
        assert node.ssh("true", check=False).returncode != 0  # the usual key no longer gets in
        r = invoke("ship", f"--image={images['v2']}", f"--to={node.alias}", "--thin", env=env)
        assert r.returncode != 0 and node.image_id(images["v2"]) is None  # nor does no key
        r = invoke("ship", f"--image={images['v2']}", f"--to={node.alias}", "--thin", f"--identity={key}", env=env)
    assert r.returncode == 0, r.stderr
    assert "leaving out 2 layers" in r.stderr and " kB (zstd)" in r.stdout
    assert f"loaded on {node.alias}: {images['v2']} {images['v2_id']}" in r.stdout
    assert node.image_id(images["v2"]) == images["v2_id"]


def test_inventory_lists_this_nodes_layers(images, tmp_path):
    out = tmp_path / "inv.json"
    r = invoke("inventory", f"--out={out}")
    assert r.returncode == 0, r.stderr
    inv = json.loads(out.read_text())
    assert inv["engine"]["store"] == "classic"
    v1 = next(i for i in inv["images"] if i["id"] == images["v1_id"])
    assert set(v1["chain_ids"]) <= set(inv["chain_ids"]) and len(v1["chain_ids"]) == 3


def test_cpu_image_end_to_end(node, cpu_image, ssh_env, tmp_path):
    """build → save → ship → load on node 2 → run there with no network."""
    node.wipe()
    try:
        r = invoke("save", f"--image={cpu_image}", f"--out={tmp_path}")
        assert r.returncode == 0, r.stderr
        # not a terminal here (a log, CI): progress in lines, the last at 100 % (a bar printed nothing until the end)
        done = r"^save .*: [0-9.]+ [kMG]B of [0-9.]+ [kMG]B \(100%\) in [0-9.]+ (s|min|h), [0-9.]+ [kMG]B/s$"
        assert re.search(done, r.stderr, re.M), r.stderr
        path = next(tmp_path.glob("*.tar.zst"))
        r = invoke("ship", f"--file={path}", f"--to={node.alias}:{node.base}/cpu", "--load", env=ssh_env)
        assert r.returncode == 0, r.stderr  # (rsync, where the node has it, shows its own progress)
        run = node.ssh(f"docker run --rm --network none {cpu_image} python -c "
                       "'import torch, transformers, deepspeed; print(torch.__version__)'")
        assert run.stdout.startswith("2.13.0")
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # 600 MB: do not leave it in pytest's tmp folders
        shutil.rmtree(node.base / "cpu", ignore_errors=True)


def test_commit_refuses_tokens_in_the_environment_and_in_changed_files_without_showing_them(settings, images):
    name, tag = f"{IMAGE}-commit-env", f"{IMAGE}:committed-env"
    hf, aws = "hf_" + "Q7w8E9r0" * 5, "AKIA" + "ZYXWVUTSRQPONMLK"
    docker(settings, "run", "-d", "--name", name, "--network", "none", "-e", f"HF_TOKEN={hf}", images["v1"],
            "sleep", "600")
    try:
        docker(settings, "exec", name, "sh", "-c", f"mkdir -p /opt/work && echo 'key {aws}' > /opt/work/notes.txt")
        r = invoke("commit", f"--container={name}", f"--tag={tag}")
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert "env HF_TOKEN  (Hugging Face token)" in r.stderr
        assert "/opt/work/notes.txt  (content: AWS access key id)" in r.stderr
        assert hf not in r.stdout + r.stderr and aws not in r.stdout + r.stderr
        assert engine.image_inspect(settings, tag) is None
    finally:
        docker(settings, "rm", "-f", name, check=False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_save_is_refused_and_a_stopped_save_publishes_nothing_and_leaves_no_partial_files(images, tmp_path,
                                                                                                   sig):
    out, cache = tmp_path / "dist", tmp_path / "layer-cache"
    env = {**os.environ, "INVOKE_DOCKYARD_LAYER_CACHE": str(cache)}
    argv = [*INVOKE, "save", f"--image={images['v1']}", f"--out={out}", "--compress=gzip",
            "--level=9"]
    # As from a terminal: Ctrl-C not ignored, even where the tests run in a background job (whose children
    # inherit SIGINT ignored, and Python then keeps it ignored).
    first = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not glob.glob(f"{out}/*.partial") and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    # Held still (SIGSTOP to its whole group: save, docker save, gzip) while the second save tries, so that it is
    # still mid-way when the signal arrives however fast this machine is; the signal is delivered on SIGCONT.
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        assert first.poll() is None, "the save ended before it could be stopped: " + first.communicate()[1][-2000:]
        second = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        first.send_signal(sig)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode != 0 and "another save of" in second.stderr and "Traceback" not in second.stderr
    _, err = first.communicate(timeout=120)
    # Its exit status is 128 + the signal, as a shell shows it, never death by SIGINT: a signal landing in code
    # exec() runs (a lazy import building a dataclass) once made Python end that way (dockyard.cli.forget_caught_
    # interrupt), about 1 run in 8 with the CPU busy.
    assert first.returncode == 128 + sig, (first.returncode, err[-3000:])
    assert f"interrupted ({sig.name}); the partial files were removed" in err and "Traceback" not in err, err[-3000:]
    leftovers = glob.glob(f"{out}/*partial*") + glob.glob(f"{cache}/**/*partial*", recursive=True) \
        + glob.glob(f"{cache}/**/.*partial*", recursive=True)
    assert leftovers == []
    assert not glob.glob(f"{out}/*.sha256") and not glob.glob(f"{out}/*.tar.gz")
