"""cu128 (CUDA 12 drivers, built on this GPU-less host without nvcc: the `cuda12_image` fixture) moves to the
air-gapped second node like cu132. A module of its own, so its node 2 holds only this image: a multi-GB archive, its
private copy and the load need ~20 GB on node 2's disk, which the newest image's tests (test_cuda_image.py) fill too.
"""

from __future__ import annotations

import shutil

import pytest

from dockyard import engine
from tests.support.archive_sets import save_image

pytestmark = pytest.mark.engine


def test_cuda12_image_loads_on_node2_and_its_ops_load_there(settings, cuda12_image, node, tmp_path):
    """A full archive, verified and loaded by load.sh on the node, same image id; there its prebuilt DeepSpeed ops
    (cpu_adam, async_io: built with g++) load without a GPU."""
    # no layer cache: it would hold another ~3.5 GB of compressed layers
    full, _ = save_image(node.base / "cu128", cuda12_image, env={"INVOKE_DOCKYARD_LAYER_CACHE_GB": "0"})
    r = node.ssh(f"sh {full.parent}/load.sh {full.name}", timeout=3600)
    assert node.image_id(cuda12_image) == engine.image_inspect(settings, cuda12_image)["Id"], r.stdout + r.stderr
    shutil.rmtree(full.parent, ignore_errors=True)
    load = ("from deepspeed.accelerator import get_accelerator as a; "
            "[a().create_op_builder(b).load() for b in ('CPUAdamBuilder', 'AsyncIOBuilder')]; print('ops load')")
    ops = node.ssh(f"docker run --rm --network none {cuda12_image} python -c \"{load}\"", timeout=600)
    assert ops.stdout.strip().endswith("ops load"), ops.stdout + ops.stderr
