"""The CUDA images, built for real on this GPU-less host (the `cuda_image` fixture: cu132, the newest; `cuda12_image`:
cu128, for CUDA 12 drivers, built without nvcc): their Python stacks train on CPU; the newest moves to the second
node as a full archive, and a recipe-only rebuild of it changes only its top layer (what a thin archive carries).
cu128 moves by the same code (nothing in save, ship or load.sh depends on the variant), so its own move to a second
node (5-6 minutes of CI for an 8.4 GB image) is not repeated here; its prebuilt DeepSpeed ops are loaded without a
GPU by its build's own check (images/check_image.py).

The GPU path itself (NCCL, fused_adam on a device, bitsandbytes' CUDA kernels) runs only in tests/gpu, on a
host with GPUs: here `invoke run --cpu` trains in the CUDA image with gloo and DS_ACCELERATOR=cpu, which
checks the image's own transformers, PEFT, DeepSpeed and bitsandbytes, not the GPU kernels.
Multi-GB image: one full save and one full load per session, everything else reuses them.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from dockyard import engine
from dockyard.images import build, variants
from tests.support.archive_sets import save_image
from tests.support.buildcache import drop_context_copies
from tests.support.cli import invoke

pytestmark = pytest.mark.engine
TRAIN = ["--max_steps", "4", "--per_device_train_batch_size", "4", "--max_seq_length", "32",
         "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--save_steps", "1000", "--logging_steps", "1"]


IMAGES = {"cuda_image": variants.newest_cuda, "cuda12_image": variants.oldest_cuda}


@pytest.fixture
def image(request, settings):
    """The image (its session fixture's ref) and its variant, resolved in the test's set-up: the build, 15 minutes
    on a fresh machine, is not the test's own time (pytest-timeout counts the body only)."""
    return request.getfixturevalue(request.param), IMAGES[request.param](settings)


@pytest.mark.parametrize("image, recipe, in_effect", [
    ("cuda_image", "ddp", {"engine": "ddp", "zero_stage": None}),
    ("cuda_image", "zero2", {"engine": "deepspeed", "zero_stage": 2}),
    ("cuda_image", "qlora", {"engine": "ddp"}),
    ("cuda12_image", "ddp", {"engine": "ddp", "zero_stage": None}),
    # ZeRO-3 rather than an offload recipe: under --cpu a CUDA image compiles DeepSpeed's CPU ops anew in each run
    # (its prebuilt ones are the GPU accelerator's), and cpu_adam took 85 s of CI's 2 cores here, checking only that
    # compiler; on GPUs the image's prebuilt cpu_adam runs, loaded by its build's check (images/check_image.py)
    ("cuda12_image", "zero3", {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": None}),
    ("cuda12_image", "qlora", {"engine": "ddp"}),
], indirect=["image"])
def test_cuda_image_stack_trains_on_cpu_with_two_processes(tmp_path, image, recipe, in_effect):
    ref, v = image
    r = invoke("run", f"--recipe={recipe}", f"--variant={v.name}", "--cpu", f"--run-id={recipe}", "--", *TRAIN,
               env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # --cpu asks for no GPU: torch's warning of a toolkit without one, on every rank, alarmed CPU users
    assert "No CUDA runtime is found" not in r.stdout + r.stderr, r.stderr[-4000:]
    m = json.loads((tmp_path / recipe / "manifest.json").read_text())
    assert m["status"] == "completed" and m["variant"] == v.name and m["world_size"] == 2
    assert m["image"]["ref"] == ref
    for key, value in in_effect.items():
        assert m["strategy"]["in_effect"][key] == value, (key, m["strategy"]["in_effect"])
    if recipe == "qlora":
        assert m["strategy"]["peft"] == "qlora"
    assert m["metrics"]["steps"] == 4 and m["metrics"]["loss_last"] < m["metrics"]["loss_first"]


@pytest.mark.timeout(3000)  # an image of ~7 GB saved, then loaded on node 2: ~5 min on a fresh machine
@pytest.mark.after_every_build  # node 2 shares this disk: not beside cu128's build (~4 GB of context, ~8 GB of layers)
def test_cuda_image_loads_on_node2_and_a_recipe_change_rebuilds_only_its_top_layer(settings, cuda_image, node,
                                                                                   tmp_path):
    """Full archive → load.sh on node 2. A recipe-only rebuild takes every layer but the top one from the cache, so
    its thin archive for a node holding this image carries that one layer. The thin save and load themselves run on
    the cpu image in test_transport.py: the same code and the same Dockerfile tail, where a thin save of this image
    spent ~2.5 minutes of CI in `docker save` exporting all of its 7 GB to keep one layer."""
    v = variants.newest_cuda(settings)
    # The recipe-only rebuild first: BuildKit's copy of its context (the wheels, ~3.3 GB) is dropped before node 2
    # loads the full image, so the two never take disk at once (node 2 shares this disk).
    ctx = build.copy_context(tmp_path / "ctx", v)
    with open(ctx / "recipes" / "zero2" / "recipe.yaml", "a") as f:
        f.write("# a recipe-only change\n")
    v2 = "dockyard-test/cuda-thin:v2"
    (argv, benv), = build.build_steps(settings, v, context=ctx, ref=v2, revision="test").steps
    try:
        engine.run(argv, env=benv, quiet=True, capture=True)
        drop_context_copies(settings)
        shutil.rmtree(ctx)
        layers = {ref: engine.image_inspect(settings, ref)["RootFS"]["Layers"] for ref in (cuda_image, v2)}
        assert layers[v2][:-1] == layers[cuda_image][:-1] and layers[v2][-1] != layers[cuda_image][-1], layers
        tail = subprocess.run(engine.docker(settings, "run", "--rm", "--network", "none", v2, "tail", "-1",
                                            "/opt/dockyard/recipes/zero2/recipe.yaml"), capture_output=True, text=True)
        assert tail.stdout.strip() == "# a recipe-only change", tail.stderr
    finally:
        subprocess.run(engine.docker(settings, "rmi", "-f", v2), capture_output=True)

    # Written into the node's own folder: node 2 shares this file system (copying is test_transport's job).
    # No layer cache (another ~3.3 GB).
    full, full_m = save_image(node.base / "full", cuda_image, env={"INVOKE_DOCKYARD_LAYER_CACHE_GB": "0"})
    r = node.ssh(f"sh {full.parent}/load.sh {full.name}", timeout=3600)
    assert node.image_id(cuda_image) == engine.image_inspect(settings, cuda_image)["Id"], r.stdout + r.stderr
    assert full_m["tar_bytes"] > 5 << 30, full_m  # the whole image, its CUDA libraries and DeepSpeed's ops
