"""`invoke setup` on a host no mirror or index answers (an air-gapped lab server, a CUDA 12 driver): run as a user
types it, in a network namespace of its own with no interface up, so nothing it tries can leave this host. Its real
debootstrap and pip fail there; what it says must lead to an image that trains."""

from __future__ import annotations

import os
import subprocess

import pytest

from dockyard.settings import ROOT
from tests.support.cli import INVOKE, docker

T4_535 = ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "t4x2_535.json"  # auto → cu128


def _offline_setup(tmp_path, **settings_env) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKYARD_NVML_REPLAY": str(T4_535), "INVOKE_DOCKYARD_WHEELHOUSE_DIR": str(tmp_path / "wh"),
           "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", **settings_env}
    return subprocess.run(["unshare", "--net", "--", *INVOKE, "setup"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def loaded(settings, engine_ready):
    """An image of the test's own name standing for a dockyard image loaded from an archive (`sh load.sh`)."""
    name = f"dockyard-offline-test-{os.getpid()}"
    docker(settings, "tag", settings.base_image_cpu, f"{name}:0.1.0-cu128")
    yield name
    docker(settings, "rmi", f"{name}:0.1.0-cu128", check=False)


def test_setup_where_no_mirror_answers_says_how_to_get_an_image(settings, engine_ready, tmp_path, loaded):
    """debootstrap's "Failed getting release file" was all it said: nothing on another mirror, nor that an offline
    host gets its image carried in, nor that one loaded already trains."""
    missing = {"INVOKE_DOCKYARD_BASE_IMAGE_CPU": f"dockyard-base:offline-test-{os.getpid()}"}
    r = _offline_setup(tmp_path, INVOKE_DOCKYARD_IMAGE_NAME=f"{loaded}-absent", **missing)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "auto → cu128: 2 GPU(s), driver 535.183.01 supports CUDA 12.2" in r.stdout
    said = r.stderr.strip().splitlines()[-1]
    assert said == ("where http://deb.debian.org/debian does not answer, give a Debian mirror that does (--mirror=URL, "
                    "over http: `invoke build` runs apt-get in the image from it too); or build "
                    f"{loaded}-absent:0.1.0-cu128 on a host that reaches them and carry it here (README, \"Air-gapped, "
                    "step by step\": `invoke build --variant=cu128 && invoke save --variant=cu128` there, `sh load.sh` "
                    "here)"), r.stderr
    r = _offline_setup(tmp_path, INVOKE_DOCKYARD_IMAGE_NAME=loaded, **missing)
    ready_to_train(r, loaded, "`invoke run`", "")


def ready_to_train(r: subprocess.CompletedProcess, loaded: str, run: str, flagged: str) -> None:
    """An image loaded here trains whatever setup could not fetch: setup said so and failed (exit 1), and a script's
    `invoke setup && invoke run` stopped there. It warns of what building needs, and ends ready, exit 0."""
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\nwarning: " in f"\n{r.stderr}" and r.stderr.strip().endswith(
        f"; {loaded}:0.1.0-cu128 is here already: {run} trains in it{flagged}, the base image and the wheelhouse are "
        "needed only to build it again"), r.stderr
    assert r.stdout.strip().splitlines()[-1] == (f"ready to train: {run} trains in {loaded}:0.1.0-cu128 (building it "
                                                 "needs what the warning above says)"), r.stdout


def test_setup_where_no_index_answers_says_how_to_bring_the_wheelhouse(settings, engine_ready, tmp_path, loaded):
    """The base image is here; pip's download of the wheelhouse fails offline."""
    r = _offline_setup(tmp_path, INVOKE_DOCKYARD_IMAGE_NAME=loaded)
    ready_to_train(r, loaded, "`invoke run`", "")
    assert f"base image: {settings.base_image_cpu} present" in r.stdout
    said = r.stderr.strip().splitlines()[-1]
    assert said.startswith(f"where no package index answers: copy into {tmp_path}/wh/cu128/ the wheelhouse `invoke "
                           "wheelhouse --variant=cu128` made on a host where one does (the files are checked against "
                           "the lock's sha256), or set index_url or find_links in invoke.yaml to an index or folder "
                           "that holds them; "), r.stderr


def test_setup_with_a_devel_image_loaded_says_the_flag_it_trains_with(settings, engine_ready, tmp_path):
    """A --devel cu128 image (FROM nvidia/cuda, whose NVIDIA_REQUIRE_CUDA is cuda>=12.8) loaded on a CUDA 12.2 driver:
    setup said plain `invoke run` trains in it, which docker refuses to start there; it names --disable-require."""
    name = f"dockyard-offline-devel-test-{os.getpid()}"
    box = docker(settings, "create", settings.base_image_cpu, "true").stdout.strip()
    try:
        docker(settings, "commit", "--change", "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.8", box, f"{name}:0.1.0-cu128")
        r = _offline_setup(tmp_path, INVOKE_DOCKYARD_IMAGE_NAME=name)
        ready_to_train(r, name, "`invoke run --disable-require`",
                       " (its NVIDIA_REQUIRE_CUDA, from a --devel build's base, leaves this driver out)")
    finally:
        docker(settings, "rm", box, check=False)
        docker(settings, "rmi", f"{name}:0.1.0-cu128", check=False)
