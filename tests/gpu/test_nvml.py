"""The real NVML on a GPU host: what doctor reports and what the monitor samples. Skipped without a GPU, as torch sees
them: NVML is what is tested here, so a GPU host whose NVML cannot be read fails, saying why."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch

from dockyard import ROOT, gpus
from dockyard.common import runfolder
from dockyard.launch import monitor
from dockyard.machine import doctor

HOST = gpus.read_host()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none visible)")]


def test_nvml_host_links_and_samples():
    assert HOST.gpus, f"torch sees {torch.cuda.device_count()} GPU(s), NVML none: {HOST.error}"
    with gpus.nvml() as nvml:
        host, links, readings = nvml.host(), nvml.links(), nvml.sample()
    assert host.count >= 1 and host.driver and host.cuda
    assert len(links) == host.count * (host.count - 1) // 2
    assert [r.device for r in readings] == list(range(host.count))
    assert all(0 <= r.util <= 100 and 0 < r.mem <= r.mem_total == g.memory_bytes
               for r, g in zip(readings, host.gpus, strict=True))
    assert doctor.check_gpus(host).status == doctor.PASS
    # the brand NVIDIA_REQUIRE_CUDA's brand= is held against, as NVML says it and as run.sh reads it from nvidia-smi -q
    # (its "Product Brand", lowercase, blanks out): the two must agree, or run.sh and invoke run decide apart
    assert all(g.brand in gpus.NVML_BRANDS.values() for g in host.gpus), [g.brand for g in host.gpus]
    said = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60).stdout
    smi = [ln.split(":", 1)[1].strip().lower().replace(" ", "") for ln in said.splitlines()
           if ln.strip().startswith("Product Brand")]
    assert smi == [g.brand for g in host.gpus], (smi, host.gpus)


def test_monitor_samples_the_gpus(tmp_path):
    deadline = time.monotonic() + 60
    with monitor.watch(tmp_path, interval=0.05) as mon:
        while len(mon.samples) < 5:
            assert time.monotonic() < deadline, f"{len(mon.samples)} samples in 60 s"
            time.sleep(0.05)
    rows = [json.loads(ln) for ln in (tmp_path / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    assert rows[0]["kind"] == "gpu" and len(rows[0]["devices"]) == HOST.count
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_that_does_not_fit_this_gpu_is_refused_on_the_host(tmp_path):
    """`invoke run --dry` reads the GPUs the run takes through the real NVML and refuses, before anything starts, a
    full fine-tune whose model states alone outgrow them (Llama 3.1 8B's config with 320 layers: about 70B
    parameters, 16 bytes each per GPU under DDP), naming this GPU."""
    from tests.support.cli import invoke_here

    cfg = json.loads((ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b" / "config.json").read_text())
    folder = tmp_path / "llama-70b-ish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 320}))
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "hf")}
    r = invoke_here("run", "--dry", "--native", "--recipe=ddp", f"--model={folder}", env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    smallest = min(HOST.gpus, key=lambda g: g.memory_bytes)
    assert "ddp: the model alone does not fit" in r.stderr and smallest.name in r.stderr, r.stderr
