"""The real NVML on a GPU host: what doctor reports and what the monitor samples. Skipped without a GPU."""

from __future__ import annotations

import json
import time

import pytest

from dockyard import gpus
from dockyard.common import runfolder
from dockyard.launch import monitor
from dockyard.machine import doctor

HOST = gpus.read_host()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOST.gpus, reason=f"needs an NVIDIA GPU: {HOST.error}")]


def test_nvml_host_links_and_samples():
    with gpus.nvml() as nvml:
        host, links, readings = nvml.host(), nvml.links(), nvml.sample()
    assert host.count >= 1 and host.driver and host.cuda
    assert len(links) == host.count * (host.count - 1) // 2
    assert [r.device for r in readings] == list(range(host.count))
    assert all(0 <= r.util <= 100 and 0 < r.mem <= r.mem_total == g.memory_bytes
               for r, g in zip(readings, host.gpus, strict=True))
    assert doctor.check_gpus(host).status == doctor.PASS


def test_monitor_samples_the_gpus(tmp_path):
    with monitor.watch(tmp_path, interval=0.05) as mon:
        while len(mon.samples) < 5:
            time.sleep(0.05)
    rows = [json.loads(ln) for ln in (tmp_path / runfolder.MONITOR_SAMPLES).read_text().splitlines()]
    assert rows[0]["kind"] == "gpu" and len(rows[0]["devices"]) == HOST.count
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"
