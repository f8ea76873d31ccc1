"""The NVML interface: reading the real host never raises; recorded readings replay through the same shapes."""

from __future__ import annotations

from pathlib import Path

from dockyard import gpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


def test_reading_the_host_never_raises_and_says_why_when_there_is_no_gpu():
    host = gpus.read_host()
    assert host.gpus or "NVML" in host.error or "nvidia-ml-py" in host.error
    if host.gpus:
        assert host.driver and host.cuda.count(".") == 1


def test_recorded_replays_host_links_and_samples_then_stops():
    src = gpus.Recorded.from_file(FIXTURES / "two_gpus_one_idle.json")
    host = src.host()
    assert host.count == 2 and host.cuda == "12.8" and host.gpus[1].name == "NVIDIA A100-SXM4-80GB"
    assert src.links() == [gpus.Link(0, 1, "NVLink", True, True)]
    first = src.sample()
    assert [r.device for r in first] == [0, 1] and all(isinstance(r, gpus.Reading) for r in first)
    replayed = [first] + [src.sample() for _ in range(89)]
    assert all(replayed) and src.sample() == []  # 90 recorded samples, then the recording is over
    r = replayed[-1][0]
    assert gpus.Sample.model_validate({"devices": [gpus.reading_to_dict(r)]}).devices == [r]  # what the monitor writes


def test_cuda_version_from_nvml_integer():
    assert gpus.cuda_from_int(12080) == "12.8"
    assert gpus.cuda_from_int(13000) == "13.0"
    assert gpus.cuda_from_int(12040) == "12.4"
