"""doctor's checks on facts: recorded NVML readings (this CI has no GPU), `docker info` shapes, a real
ds_report, the probe container's output. The real engine is exercised in tests/integration/test_doctor.py."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dockyard.common.errors import DockyardError
from dockyard.gpus import Gpu, Host, Recorded, Recording
from dockyard.images import variants
from dockyard.machine import container, doctor
from dockyard.settings import Settings
from tests.support.fake_engine import FakeEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def all_variants():
    return variants.all_variants(Settings())


def _host(name: str) -> tuple[Host, list]:
    src = Recorded.from_file(FIXTURES / "nvml" / name)
    return src.host(), src.links()


def _with_ops(variant, *ops):
    """The variant with these DS_BUILD ops, whatever images/variants.yaml says today."""
    return variant.model_copy(update={"ds_ops": list(ops)})


def _by_name(checks):
    return {c.name: c for c in checks}


def test_old_driver_with_a_new_cuda_image(all_variants):
    host, _ = _host("old_driver.json")  # driver 550, CUDA 12.4
    checks = _by_name(doctor.check_variants(all_variants, host, {"cu132": "13.2", "cu128": None}))
    assert checks["variant cu132"].status == doctor.WARN
    assert "image's label" in checks["variant cu132"].detail and "driver to 580 or newer" in checks["variant cu132"].fix
    assert checks["variant cu128"].status == doctor.PASS, "CUDA 12.8 runs on a 12.4 driver (minor-version compat)"
    assert checks["auto variant"].status == doctor.PASS and "auto → cu128" in checks["auto variant"].detail


def test_an_image_built_otherwise_than_variants_yaml_is_told_to_build_again_not_to_use_itself(all_variants):
    """An H100 host whose cu132 image was built for other GPUs (its archs label without 9.0) than variants.yaml now
    says: doctor warned "auto skips cu132 on this host; use cu132 (... auto picks it)", as auto reads variants.yaml.
    It now says to build that image again."""
    host, _ = _host("hosts/h100x1_580.json")
    checks = _by_name(doctor.check_variants(all_variants, host, {"cu132": "13.2", "cu128": None},
                                            image_archs={"cu132": "8.0;8.6"}))
    fix = checks["variant cu132"].fix
    assert checks["variant cu132"].status == doctor.WARN and "use cu132" not in fix, fix
    assert "build it again (invoke build --variant=cu132)" in fix, fix


def test_each_variant_line_is_a_sentence_naming_the_variant_and_what_it_needs(all_variants):
    """On a 550 driver the line for cu132 read "CUDA 13.2 (image label) is newer than driver 550.54.15 supports CUDA
    12.4", and its fix "upgrade the driver (driver ≥ 580)". Each line now says what the variant needs and what the
    driver does, however the driver was read."""
    host, _ = _host("hosts/l40sx2_550.json")
    checks = _by_name(doctor.check_variants(all_variants, host, {"cu132": "13.2", "cu128": None}))
    assert checks["variant cu132"].detail == ("cu132 needs CUDA 13.2 (its image's label) but driver 550.54.15 supports "
                                              "CUDA 12.4")
    assert checks["variant cu132"].fix.startswith("upgrade the driver to 580 or newer to use cu132; use cu128 (")
    assert checks["variant cu128"].detail == ("cu128 needs CUDA 12.8 (variants.yaml, as its image is not here): "
                                              "driver 550.54.15 runs it, as a CUDA 12.4 driver runs any CUDA 12 build")
    no_cuda = dataclasses.replace(host, cuda="")  # NVML read the driver's version alone
    checks = _by_name(doctor.check_variants(all_variants, no_cuda, {"cu132": "13.2"}))
    assert checks["variant cu132"].detail == ("cu132 needs CUDA 13.2 (its image's label) but driver 550.54.15 is older "
                                              "than 580 (NVML could not read its CUDA version)")
    unread = dataclasses.replace(host, cuda="", driver="")
    checks = _by_name(doctor.check_variants(all_variants, unread, {"cu132": "13.2"}))
    assert checks["variant cu132"].detail == ("cannot tell whether cu132 (CUDA 13.2, its image's label) runs on the "
                                              "driver (NVML could not read its version), whose CUDA version NVML could "
                                              "not read")


def test_driver_older_than_every_variant_fails(all_variants):
    host, _ = _host("old_driver.json")
    older = dataclasses.replace(host, driver="470.256.02", cuda="11.4")
    checks = _by_name(doctor.check_variants(all_variants, older, {}))
    assert checks["auto variant"].status == doctor.FAIL and "Upgrade the driver" in checks["auto variant"].fix
    assert {checks["variant cu128"].status, checks["variant cu132"].status} == {doctor.WARN}


def test_host_without_gpus_passes_with_the_cpu_notice(all_variants):
    host = Host(error="NVML unavailable: no NVIDIA driver on this host")
    checks = [doctor.check_gpus(host), doctor.check_runtime(host, {}, []), *doctor.check_variants(all_variants, host, {})]
    assert all(c.status == doctor.PASS for c in checks)
    assert "cpu variant will be used" in checks[0].detail
    assert "auto → cpu" in checks[-1].detail


def test_gpus_without_nvidia_runtime_fail_with_the_fix(monkeypatch):
    host, _ = _host("two_gpus_one_idle.json")
    monkeypatch.setattr(doctor.engine, "which", lambda name: None)  # no toolkit hook, whatever this host has
    c = doctor.check_runtime(host, {"Runtimes": {"runc": {"path": "runc"}}}, [])
    assert c.status == doctor.FAIL and "nvidia-ctk runtime configure" in c.fix
    hook = "/usr/bin/nvidia-container-runtime-hook"
    monkeypatch.setattr(doctor.engine, "which", lambda name: hook if name == "nvidia-container-runtime-hook" else None)
    assert doctor.check_runtime(host, {"Runtimes": {"runc": {"path": "runc"}}}, []).status == doctor.PASS
    assert doctor.check_runtime(host, {"Runtimes": {"nvidia": {}}}, []).status == doctor.PASS
    assert doctor.check_runtime(host, {}, ["/etc/cdi/nvidia.yaml"]).status == doctor.PASS
    assert "2 × NVIDIA A100-SXM4-80GB (80.0 GiB each), driver 570.124.06" in doctor.check_gpus(host).detail


def test_doctor_says_each_gpus_brand_which_a_devel_images_requirement_is_held_against():
    """A --devel image is refused on a GeForce with a 535 driver for its brand (variants.require_refuses): doctor's GPU
    line said the model and its compute capability, not the brand the refusal names."""
    host = Host("535.183.01", "12.2", [Gpu(0, "NVIDIA GeForce RTX 3090", 24 << 30, capability="8.6", brand="geforce")])
    assert "1 × NVIDIA GeForce RTX 3090 (compute 8.6, brand geforce) (24.0 GiB each)" in doctor.check_gpus(host).detail
    unread = Host("535.183.01", "12.2", [Gpu(0, "Tesla T4", 15 << 30, capability="7.5")])  # a recording without it
    assert "1 × Tesla T4 (compute 7.5) (15.0 GiB each)" in doctor.check_gpus(unread).detail


def test_doctor_names_nvlink_pairs_and_warns_of_gpus_across_sockets_without_p2p():
    nvlink = doctor.check_topology(*_host("two_gpus_one_idle.json"))
    assert nvlink.status == doctor.PASS and nvlink.detail == "NVLink: 0-1"
    no_p2p = doctor.check_topology(*_host("old_driver.json"))
    assert no_p2p.status == doctor.WARN and "across CPU sockets, no P2P: 0-1" in no_p2p.detail
    assert doctor.check_topology(Host(), []) is None


def test_engine_check_names_the_image_store():
    containerd = {"ServerVersion": "29.0.1", "Driver": "overlayfs",
                  "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}
    c = doctor.check_engine(containerd)
    assert c.status == doctor.PASS and "containerd image store" in c.detail
    assert doctor.check_engine({"ServerVersion": "18.09.1"}).status == doctor.FAIL


def test_ds_report_from_an_image_without_built_ops(all_variants):
    """A real ds_report (JIT only: nothing prebuilt, no libaio): the cpu variant's ops are missing."""
    report = (FIXTURES / "ds_report_cpu_jit.txt").read_text()
    ops = container.parse_ds_report(report)
    assert ops["cpu_adam"] == (False, True) and ops["async_io"] == (False, False)
    c = container.check_ds_report(report, _with_ops(all_variants["cpu"], "CPU_ADAM", "SHM_COMM"), "dockyard:0.1.0-cpu")
    assert c.status == doctor.FAIL and "NOT built: cpu_adam, deepspeed_shm_comm" in c.detail
    assert "--no-cache" in c.fix


def test_ds_report_with_built_ops_and_libaio(all_variants):
    report = (FIXTURES / "ds_report_cpu_jit.txt").read_text()
    for op in ("cpu_adam", "deepspeed_shm_comm", "fused_adam"):
        report = re.sub(rf"^({op} \.+ )\x1b\[93m\[NO\]", "\\1\x1b[92m[YES]", report, flags=re.M)
    cpu = _with_ops(all_variants["cpu"], "CPU_ADAM", "SHM_COMM")
    c = container.check_ds_report(report, cpu, "img")
    assert c.status == doctor.PASS and "no libaio" in c.detail
    aio = _with_ops(all_variants["cu128"], "CPU_ADAM", "FUSED_ADAM", "AIO")  # without libaio, no async_io
    c = container.check_ds_report(report, aio, "img")
    assert c.status == doctor.FAIL and "NOT built: async_io" in c.detail
    with_libaio = re.sub(r"^(async_io \.+ )\x1b\[93m\[NO\]\x1b\[0m \.+ \x1b\[93m\[NO\]",
                         "\\1\x1b[92m[YES]\x1b[0m ....... \x1b[92m[OKAY]", report, flags=re.M)
    c = container.check_ds_report(with_libaio, aio, "img")
    assert c.status == doctor.PASS and "libaio found" in c.detail
    assert container.check_ds_report("", aio, "img").status == doctor.WARN


def test_probe_output_and_its_checks():
    out = ("tmpfs 24680448 0 24680448 0% /dev/shm\noverlay 263174212 27000000 80000000 26% /\n"
           "memlock=unlimited\nstack=65536\n---\nop report...\n")
    facts = container.parse_probe(out)
    assert facts["shm_bytes"] == 24680448 * 1024 and facts["disk_free_bytes"] == 80000000 * 1024
    assert facts["ds_report"] == "op report...\n"
    assert container.check_shm(facts["shm_bytes"]).status == doctor.PASS
    assert container.check_shm(64 * 2**20).status == doctor.FAIL
    assert container.check_ulimits("unlimited", "65536", gpu=True).status == doctor.PASS
    assert container.check_ulimits("8192", "8192", gpu=True).status == doctor.WARN
    # where the limits come from: dockerd's own, which invoke run asks for (it said "raise the engine's limits
    # (dockerd --default-ulimit)", which changes nothing a run asks), as invoke run's note says it
    fix = container.check_ulimits("8192", "65536", gpu=True).fix
    assert "LimitMEMLOCK=infinity" in fix and "systemctl edit docker" in fix and "default-ulimit" not in fix
    assert container.check_ulimits("8192", "8192", gpu=False).status == doctor.PASS
    # both limits in one unit, said: "memlock 8192, stack 65536 KiB" read as 8192 bytes of memlock
    # and the number compose/train.yml needs where the engine grants no unlimited memlock (its -1 failed to start)
    assert container.check_ulimits("8192", "65536", gpu=True).detail == \
        "memlock 8 MiB, stack 64 MiB (to run with compose: DOCKYARD_MEMLOCK=8388608 docker compose ...)"
    assert container.check_ulimits("unlimited", "", gpu=True).detail == "memlock unlimited, stack ?"
    assert container.check_disk(5 * 2**30, "/var/lib/docker", "dockyard:0.1.0-cpu", None).status == doctor.FAIL
    assert container.check_disk(30 * 2**30, "/var/lib/docker", "dockyard:0.1.0-cpu", None).status == doctor.WARN
    assert container.check_disk(300 * 2**30, "/var/lib/docker", "dockyard:0.1.0-cpu", None).status == doctor.PASS


def test_the_disk_hint_names_the_image_auto_picks_here_and_its_size(monkeypatch):
    """On a CUDA 12 driver (L40S, 550) with 30 GiB free, the hint said "a CUDA image takes ~7 GB (cu132, measured)",
    and auto picks cu128 there, 8.4 GB. It now names the image auto picks on the host and its size, as the engine
    holds it."""
    settings = Settings()
    sizes = {variants.tag(settings, variants.all_variants(settings)[n]): b
             for n, b in (("cpu", 2_069_880_886), ("cu128", 8_430_000_000), ("cu132", 6_920_000_000))}
    monkeypatch.setattr(doctor.engine, "engine_info", lambda s: {"ServerVersion": "27.5.1",
                                                                "DockerRootDir": "/var/lib/docker"})
    monkeypatch.setattr(doctor.engine, "image_inspect", lambda s, ref: {"Size": sizes[ref]} if ref in sizes else None)
    monkeypatch.setattr(doctor.engine, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", ""))
    facts = {"shm_bytes": 16 * 2**30, "memlock": "unlimited", "stack": "65536", "disk_free_bytes": 30 * 2**30,
             "ds_report": ""}
    monkeypatch.setattr(container, "probe_container", lambda s, image: (facts, None))

    checks = _by_name(doctor.diagnose(settings, Recorded.from_file(FIXTURES / "nvml" / "hosts" / "l40sx2_550.json")))

    assert checks["disk"].status == doctor.WARN
    assert checks["disk"].fix == (f"{variants.tag(settings, variants.all_variants(settings)['cu128'])} (what auto "
                                  "picks here) takes 8.4 GB, and `docker load` unpacks a copy of an image first: "
                                  "keep 50 GiB free")
    del sizes[variants.tag(settings, variants.all_variants(settings)["cu128"])]  # probed in cu132's, cu128 not here
    checks = _by_name(doctor.diagnose(settings, Recorded.from_file(FIXTURES / "nvml" / "hosts" / "l40sx2_550.json")))
    assert "-cu128 (what auto picks here) is not here yet, " in checks["disk"].fix


def test_a_fresh_host_is_told_of_a_small_engine_disk_before_any_image_is_here(monkeypatch, tmp_path):
    """The README: "Keep at least 50 GiB free for the engine (`invoke doctor` warns below that)". On a fresh host,
    before `invoke setup` (no image, not even the base, to probe the disk in), doctor said nothing of the disk: a
    host of 20 GiB free learnt it when the build failed. The engine's data root is read on this host where the engine
    runs here; an engine elsewhere (its `docker info` names another host) gets no disk line rather than this host's."""
    settings = Settings()
    root = tmp_path / "docker"
    root.mkdir()
    here = {"ServerVersion": "27.5.1", "DockerRootDir": str(root), "Name": socket.gethostname()}
    monkeypatch.setattr(doctor.engine, "image_inspect", lambda s, ref: None)  # nothing built, nothing loaded
    monkeypatch.setattr(container.shutil, "disk_usage",
                        lambda path: SimpleNamespace(free=20 * 2**30) if Path(path) == root else shutil.disk_usage(path))
    no_gpu = Recorded(Recording(host=Host(error="NVML unavailable: no NVIDIA driver on this host")))

    monkeypatch.setattr(doctor.engine, "engine_info", lambda s: here)
    checks = _by_name(doctor.diagnose(settings, no_gpu))
    assert checks["run container"].status == doctor.WARN  # no image: what it says is unchanged
    assert checks["disk"].status == doctor.WARN
    assert checks["disk"].detail == f"20 GiB free under the engine's data root {root}"
    assert "keep 50 GiB free" in checks["disk"].fix

    monkeypatch.setattr(doctor.engine, "engine_info", lambda s: {**here, "Name": "docker-desktop"})
    assert "disk" not in _by_name(doctor.diagnose(settings, no_gpu))


def test_probe_runs_with_the_launchers_flags():
    argv = container.probe_argv(Settings(), "img", "dockyard-doctor-1")
    assert "--ipc=host" in argv and argv[argv.index("img") + 1:][:2] == ["sh", "-c"]
    assert "--ulimit" not in container.without_ulimits(argv) and "--ipc=host" in container.without_ulimits(argv)


def test_the_probe_container_finds_the_hf_cache_made_by_the_user_not_by_docker_as_root(settings, tmp_path, monkeypatch):
    """A missing folder given to `docker run -v` is made by the engine, as root: the user's own runs could then not
    write their Hugging Face cache. The probe mounts it as a run does, so doctor makes it first, as `invoke run` does."""
    hf = tmp_path / "hf"
    seen = []
    fake = FakeEngine(container=lambda argv: seen.append(hf.is_dir() and hf.stat().st_uid == os.geteuid()) or 1)
    s = fake.install(monkeypatch, settings).model_copy(update={"hf_cache": str(hf)})
    with pytest.raises(DockyardError, match="probe container failed"):
        container.probe_container(s, "img")
    assert seen == [True]


def test_gpus_in_a_container():
    host, _ = _host("two_gpus_one_idle.json")
    ok = doctor.check_gpu_container(host, 0, "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-a)\n"
                                             "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-b)\n")
    assert ok.status == doctor.PASS
    err = ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].')
    bad = doctor.check_gpu_container(host, 125, err)
    assert bad.status == doctor.FAIL and "nvidia-ctk runtime configure" in bad.fix and "0 of 2" in bad.detail
    # the docker CLI's own log line after the engine's error (seen once in seven): the engine's error is said
    noisy = doctor.check_gpu_container(host, 125, err + '\ntime="2026-12-05T12:00:00Z" level=error msg="error waiting '
                                                        'for container: context canceled"\n')
    assert noisy.detail == bad.detail and "context canceled" not in noisy.detail
    rlimit = doctor.check_gpu_container(host, 125, "error setting rlimit type 8: operation not permitted")
    assert rlimit.status == doctor.FAIL and "LimitMEMLOCK" in rlimit.fix
    # an nvidia/cuda base's NVIDIA_REQUIRE_CUDA refusing the driver: the toolkit works, reinstalling it fixes nothing
    require = doctor.check_gpu_container(host, 125, (
        "docker: Error response from daemon: failed to create task for container: ... nvidia-container-cli: "
        "requirement error: unsatisfied condition: cuda>=12.8, please update your driver to a newer version"))
    assert require.status == doctor.FAIL and "--disable-require" in require.fix and "nvidia-ctk" not in require.fix
    argv = container.probe_argv(Settings(), "img", "n", ["nvidia-smi", "-L"], gpus=True)
    assert argv[-3:] == ["img", "nvidia-smi", "-L"] and "--gpus" in argv


def test_doctor_says_whose_files_a_rootless_or_remapping_engine_makes():
    rootless = doctor.check_engine({"ServerVersion": "27.3.1", "SecurityOptions": ["name=seccomp", "name=rootless"]})
    remapped = doctor.check_engine({"ServerVersion": "27.3.1", "SecurityOptions": ["name=seccomp", "name=userns"]})
    plain = doctor.check_engine({"ServerVersion": "27.3.1", "SecurityOptions": ["name=seccomp"]})
    assert "rootless: containers run as their root, which is you" in rootless.detail
    assert "userns-remap: dockyard's containers leave the remapping" in remapped.detail
    assert "rootless" not in plain.detail and "userns" not in plain.detail


def test_an_image_label_not_as_the_build_writes_it_is_not_read():
    """An image loaded from someone's archive with `dockyard.cuda=13.x` (or archs `sm_90;zz`, or 5000 digits): doctor
    ended in a ValueError traceback; such a label is left unread and the variant's own value is used."""
    from dockyard.images import variants

    assert variants.image_label({"dockyard.cuda": "13.2"}, "dockyard.cuda") == "13.2"
    for odd in ("13.x", "9" * 5000 + ".0", "", 13.2):
        assert variants.image_label({"dockyard.cuda": odd}, "dockyard.cuda") is None
    archs = "7.5;8.0;12.0+PTX"
    assert variants.image_label({variants.ARCHS_LABEL: archs}, variants.ARCHS_LABEL) == archs
    assert variants.image_label({variants.ARCHS_LABEL: "sm_90;zz"}, variants.ARCHS_LABEL) is None


def test_doctor_json_with_a_recording_prints_json_alone(tmp_path):
    """`invoke doctor --json --record=F` printed "recorded this host's NVML readings in F" before the JSON on stdout:
    json.load of the output failed. The readings are the H100 host's, replayed (no GPU here)."""
    import json

    from tests.support.cli import invoke_here

    replay = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts" / "h100x1_580.json"
    r = invoke_here("doctor", "--json", f"--record={tmp_path / 'rec.json'}",
                    env={"DOCKYARD_NVML_REPLAY": str(replay)})
    json.loads(r.stdout)
    assert "recorded this host's NVML readings in" in r.stderr and (tmp_path / "rec.json").is_file()


def test_doctor_port_without_a_peer_says_nothing_checks_it(tmp_path):
    """`invoke doctor --port=2222` without --peer checked no port and said nothing: the user could think it had."""
    import json

    from tests.support.cli import invoke_here

    replay = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts" / "h100x1_580.json"
    r = invoke_here("doctor", "--json", "--port=2222", env={"DOCKYARD_NVML_REPLAY": str(replay)})
    assert "warning: --port=2222 is node 0's rendezvous port, checked with --peer=NODE0" in r.stderr, r.stderr
    assert not [c for c in json.loads(r.stdout)["checks"] if c["name"].startswith("peer")]


def test_an_image_the_driver_cannot_run_is_not_offered_as_the_way_out(settings, engine_ready):
    """A CUDA 12 node (T4s, driver 535) sent the cu132 archive instead of cu128's: doctor said "or run with
    --variant=cu132", which `invoke run` then refuses (CUDA 13.2 needs a driver from 580 on). The image here is an
    image of the test's own name standing for that archive; the engine and the probe container are real."""
    import json

    from tests.support.cli import docker, invoke

    name = f"dockyard-doctor-test-{os.getpid()}"
    docker(settings, "tag", settings.base_image_cpu, f"{name}:0.1.0-cu132")
    try:
        r = invoke("doctor", "--json", env={"DOCKYARD_NVML_REPLAY": str(FIXTURES / "nvml" / "hosts" / "t4x2_535.json"),
                                            "INVOKE_DOCKYARD_IMAGE_NAME": name}, timeout=300)
    finally:
        docker(settings, "rmi", f"{name}:0.1.0-cu132", check=False)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["auto variant"]["detail"] == "auto → cu128: 2 GPU(s), driver 535.183.01 supports CUDA 12.2"
    assert checks["auto image"]["status"] == doctor.WARN
    assert checks["auto image"]["fix"] == ("invoke build (builds cu128), or load its archive (sh load.sh): cu132, the "
                                           "image here, does not run on this host (variant cu132 above says why)")
    assert checks["variant cu132"]["fix"].startswith("upgrade the driver to 580 or newer to use cu132")


def test_the_table_reads_in_80_columns(monkeypatch, capsys):
    """`COLUMNS=80 invoke doctor` (a laptop's terminal, an ssh window) drew four columns, the fix's empty wherever a
    check passed: what was found and its fix each got 22 columns, the ulimits row ran 16 lines tall and its
    DOCKYARD_MEMLOCK=8388608 was broken across two. Each check's name and verdict now keep a line; what was found
    and the fix share the rest, every word of them whole."""
    from dockyard.machine.check import FAIL, Check

    checks = [container.check_ulimits("8192", "65536", gpu=True),
              doctor.check_buildkit(Settings(), {"ServerVersion": "19.03.8"}),
              Check("gpus in a container", FAIL, '0 of 2 GPU(s) visible: docker: Error response from daemon: could '
                    'not select device driver "" with capabilities: [[gpu]].', "install and configure the NVIDIA "
                    "Container Toolkit: `sudo nvidia-ctk runtime configure --runtime=docker`, restart the engine")]
    monkeypatch.setenv("COLUMNS", "80")
    doctor.print_table(checks)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(ln) for ln in lines) <= 80, "\n".join(lines)
    cells = [ln.split("│") for ln in lines if ln.startswith("│")]
    assert {c[1].strip() for c in cells} - {""} == {c.name for c in checks}, "a name wrapped"
    said = " ".join(c[3].strip() for c in cells).split()
    for c in checks:
        for word in f"{c.detail} {c.fix}".split():
            assert word in said, f"{word!r} broken across lines:\n" + "\n".join(lines)
    ulimits = next(i for i, c in enumerate(cells) if c[1].strip() == "ulimits")
    assert next(i for i, c in enumerate(cells) if c[1].strip() == "buildkit") - ulimits <= 10, "\n".join(lines)
