"""The NVML calls themselves, against a FAKE pynvml (no GPU here: tests/support/nvml.py). Plus record → replay
through DOCKYARD_NVML_REPLAY."""

from __future__ import annotations

import ctypes
import json

import pytest

from dockyard import gpus
from dockyard.common.errors import DockyardError
from tests.support.nvml import NVMLError, fake_pynvml


def test_p2p_is_asked_with_an_int_index_so_two_gpus_do_not_crash():
    links = gpus.Nvml(fake_pynvml(), [0, 1]).links()
    assert links == [gpus.Link(0, 1, "NVLink", True, True)]


def test_a_binding_error_in_one_field_leaves_the_other_facts():
    nv = fake_pynvml()
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (_ for _ in ()).throw(ctypes.ArgumentError("bad"))
    host = gpus.Nvml(nv, [0, 1]).host()
    assert host.count == 2 and host.cuda == "12.2" and host.gpus[0].capability == ""


def test_host_has_capability_and_mig_and_mig_sampling_goes_on():
    src = gpus.Nvml(fake_pynvml(n=1, mig=True), [0])
    g = src.host().gpus[0]
    assert (g.capability, g.mig) == ("7.5", True)
    r = src.sample()[0]
    assert r.util is None and r.mem == 2**30  # utilisation not supported on MIG (unknown, not 0 %); memory still read


@pytest.mark.parametrize(("brand", "said"), [(5, "geforce"), (2, "tesla"), (14, "nvidia"), (13, "nvidiartx"),
                                             (19, "unknown")])  # a brand newer than dockyard: the toolkit's Unknown
def test_each_gpus_brand_is_read_in_the_words_of_nvidia_require_cuda(brand, said):
    """NVML's nvmlDeviceGetBrand (FAKE pynvml, no GPU here), named as brand= conditions name it; an NVML that cannot
    say it leaves "" (may hold any brand=) and the other facts."""
    assert [g.brand for g in gpus.Nvml(fake_pynvml(brand=brand), [0, 1]).host().gpus] == [said, said]
    nv = fake_pynvml()
    nv.nvmlDeviceGetBrand = lambda h: (_ for _ in ()).throw(NVMLError("Not Supported"))
    g = gpus.Nvml(nv, [0]).host().gpus[0]
    assert g.brand == "" and g.capability == "7.5"


def test_a_recorded_mig_host_replays_its_utilisation_as_unknown_and_older_recordings_still_read():
    path = gpus.Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts" / "a100_mig_570.json"
    assert gpus.Recorded.from_file(path).sample()[0].util is None
    data = json.loads(path.read_text())
    data["samples"][0]["devices"][0]["util"] = 0.0  # as the monitor recorded a MIG device before
    assert gpus.Recorded(gpus.Recording.model_validate_json(json.dumps(data))).sample()[0].util == 0.0


@pytest.mark.parametrize("name", ["t4x2_535", "h100x8_580", "a100_mig_570", "l40sx2_550", "rtx3090x2_535",
                                  "v100x2_535"])
def test_replay_file_replaces_nvml_for_read_host_and_facts(monkeypatch, name):
    path = gpus.Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts" / f"{name}.json"
    monkeypatch.setenv(gpus.REPLAY_ENV, str(path))
    data = json.loads(path.read_text())
    host, links = gpus.facts()
    assert gpus.read_host() == host and host.count == len(data["host"]["gpus"]) and len(links) == len(data["links"])
    assert host.gpus[0].capability == data["host"]["gpus"][0]["capability"]


def test_record_writes_what_replay_reads(monkeypatch, tmp_path):
    from contextlib import contextmanager

    @contextmanager
    def fake_nvml():
        yield gpus.Nvml(fake_pynvml(), [0, 1])

    monkeypatch.setattr(gpus, "nvml", fake_nvml)
    out = tmp_path / "host.json"
    gpus.record(out)
    monkeypatch.setenv(gpus.REPLAY_ENV, str(out))
    host, links = gpus.facts()
    assert host.driver == "535.183.01" and [g.capability for g in host.gpus] == ["7.5", "7.5"] and links[0].p2p
    assert [g.brand for g in host.gpus] == ["nvidia", "nvidia"]


def test_unreadable_replay_file_is_a_short_error(monkeypatch, tmp_path):
    monkeypatch.setenv(gpus.REPLAY_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(DockyardError, match="DOCKYARD_NVML_REPLAY"):
        gpus.read_host()


def test_a_driver_whose_cuda_version_nvml_cannot_read_is_reported_and_auto_goes_by_the_driver(monkeypatch, tmp_path):
    """nvmlSystemGetCudaDriverVersion failing left cuda "", and doctor, plan and `run --dry` ended in int("")."""
    from contextlib import contextmanager

    from dockyard.images import variants
    from dockyard.machine import doctor
    from dockyard.settings import Settings

    nv = fake_pynvml()
    nv.nvmlSystemGetCudaDriverVersion = lambda: (_ for _ in ()).throw(NVMLError("Unknown Error"))

    @contextmanager
    def fake_nvml():
        yield gpus.Nvml(nv, [0, 1])

    monkeypatch.setattr(gpus, "nvml", fake_nvml)
    gpus.record(tmp_path / "host.json")  # what a user with such a host sends: replayed as it would be read
    monkeypatch.setenv(gpus.REPLAY_ENV, str(tmp_path / "host.json"))
    host = gpus.read_host()
    assert host.cuda == "" and host.driver == "535.183.01"
    said = doctor.check_gpus(host)
    assert said.status == doctor.WARN and "driver 535.183.01, whose CUDA version NVML could not read" in said.detail
    checks = {c.name: c for c in doctor.check_variants(variants.all_variants(Settings()), host, {})}
    assert checks["auto variant"].status == doctor.PASS and "auto → cu128" in checks["auto variant"].detail
    assert checks["variant cu132"].status == doctor.WARN  # 13.x needs driver 580: told by the version alone
    picked, why = variants.resolve(Settings(), "auto")
    assert picked.name == "cu128" and "picked by the driver version" in why


def test_a_driver_that_is_there_and_fails_is_said_and_never_taken_for_a_cpu_host(settings, monkeypatch):
    """NVML's every failure read as 'NVML unavailable (...): no NVIDIA driver on this host': on a GPU host after a driver
    upgrade without a reboot ("Driver/library version mismatch", nvidia-smi's own error), `invoke run` printed
    'auto → cpu: ...' and went for the cpu image, and doctor passed the host ('the cpu variant will be used'). A missing
    library (a CPU host) is said as before, in plainer words; any other failure is the driver's: doctor fails it, and
    auto refuses to pick, naming the error and the ways out."""
    import pynvml

    from dockyard.images import variants
    from dockyard.machine import doctor

    monkeypatch.delenv(gpus.REPLAY_ENV, raising=False)

    def fails(code):
        def init():
            raise pynvml.NVMLError(code)
        monkeypatch.setattr(pynvml, "nvmlInit", init)
        return gpus.read_host()

    cpu_host = fails(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert not cpu_host.driver_fault and cpu_host.error.startswith("no NVIDIA driver on this host (NVML: ")
    assert doctor.check_gpus(cpu_host).status == doctor.PASS
    assert variants.resolve(settings, "auto", cpu_host)[0].name == "cpu"
    unloaded = fails(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)  # a CPU VM of an image that ships the driver trains on CPU
    assert not unloaded.driver_fault and variants.resolve(settings, "auto", unloaded)[0].name == "cpu"
    assert "no NVIDIA driver loaded on this host" in unloaded.error and "nvidia-smi" in unloaded.error

    broken = fails(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert broken.driver_fault and "no NVIDIA driver" not in broken.error
    assert broken.error == "the NVIDIA driver does not answer (NVML: RM has detected an NVML/RM version mismatch.)"
    check = doctor.check_gpus(broken)
    assert check.status == doctor.FAIL and "reboot" in check.fix and "--variant=cpu" in check.fix
    with pytest.raises(DockyardError, match=r"^auto cannot pick a variant: the NVIDIA driver does not answer \(NVML: "
                                            r"RM has detected an NVML/RM version mismatch\.\); `nvidia-smi` says the same"):
        variants.resolve(settings, "auto", broken)
    assert variants.resolve(settings, "cpu", broken)[0].name == "cpu", "--variant=cpu trains on CPU anyway"
