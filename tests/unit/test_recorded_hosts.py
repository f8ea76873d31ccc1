"""doctor's GPU checks, plan and `run --dry` against recorded hosts (tests/fixtures/nvml/hosts, replayed through
DOCKYARD_NVML_REPLAY: no GPU here), and the GPU choice by --gpus / CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard import gpus
from dockyard.common.errors import DockyardError
from dockyard.images import variants
from dockyard.launch import run as launch_run
from dockyard.machine import doctor
from dockyard.machine import planner as plan_mod
from tests.support.fake_engine import FakeEngine

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hosts"


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def use(name):
        monkeypatch.setenv(gpus.REPLAY_ENV, str(HOSTS / f"{name}.json"))
        return gpus.facts()
    return use


def dry_run(settings, capsys, **kw):
    launch_run.run(settings, launch_run.RunRequest(**{"recipe": "ddp", "dry": True, **kw}))
    out = capsys.readouterr()
    return out.out + out.err  # the command is echoed on stderr


# host → (variant auto picks, processes, docker --gpus value)
CASES = {"t4x2_535": ("cu128", 2), "h100x8_580": ("cu132", 8), "a100_mig_570": ("cu128", 1),
         "l40sx2_550": ("cu128", 2)}


def test_the_memlock_note_is_for_gpu_runs_only(settings, capsys, replay, monkeypatch):
    """A CPU run on an engine with a hard memlock limit (Debian's dockerd: 8 MiB) said "note: dockerd's hard memlock
    limit is 8388608 bytes ... for NCCL/RDMA set LimitMEMLOCK=infinity" on every run, where doctor passes the same
    limit ("only GPU runs need memlock unlimited"); GPU runs still say it, and every run still asks for the limit."""
    monkeypatch.setenv("DOCKYARD_MEMLOCK", "8388608")
    cpu = dry_run(settings, capsys, variant="cpu")
    assert "--ulimit memlock=8388608" in cpu and "LimitMEMLOCK" not in cpu
    replay("h100x1_580")
    cuda = dry_run(settings, capsys)
    assert "--ulimit memlock=8388608" in cuda and "LimitMEMLOCK=infinity" in cuda
    assert "LimitMEMLOCK" not in dry_run(settings, capsys, cpu=True)


@pytest.mark.parametrize("name", CASES)
def test_run_dry_on_recorded_host(settings, capsys, replay, name):
    replay(name)
    out = dry_run(settings, capsys)
    variant, nproc = CASES[name]
    assert f"auto → {variant}" in out or f"→ {variant}" in out
    assert f"--nproc-per-node={nproc}" in out and "--gpus all" in out
    # doctor's MIG warning, said again where a run starts (it trained on and sized its batch for the whole GPU)
    assert ("warning: MIG mode on GPU 0: " in out and "(`sudo nvidia-smi -i 0 -mig 0`)" in out) == (name == "a100_mig_570")


def test_a_variant_without_code_for_the_gpus_is_refused_for_that_not_for_the_driver(settings, capsys, replay):
    """Two V100s on driver 535 given --variant=cu132 were told "needs CUDA 13.2 but driver 535.183.01 supports CUDA
    12.2: use --variant=cu128 ... or upgrade the driver to 580 or newer": a driver upgrade after which the run was
    refused again, cu132's torch having no code for a V100 (7.0) on any driver."""
    replay("v100x2_535")
    with pytest.raises(DockyardError) as refused:
        dry_run(settings, capsys, variant="cu132")
    assert "has no code for GPU 0 (Tesla V100-SXM2-16GB, 7.0)" in str(refused.value)
    assert "upgrade the driver" not in str(refused.value) and "--variant=auto" in str(refused.value)
    replay("t4x2_535")  # a T4 it has code for: the driver is what stops it
    with pytest.raises(DockyardError, match="upgrade the driver to 580 or newer"):
        dry_run(settings, capsys, variant="cu132")


def test_a_native_run_on_a_gpu_host_asks_the_trainer_for_the_gpus(settings, capsys, replay):
    """`invoke run --native` on a GPU host whose Python has a CPU build of torch trained on CPU and said completed,
    under "auto → cu132" (no image is used). It now tells the trainer to use the GPUs (DS_ACCELERATOR=cuda, which it
    refuses where torch finds none: test_train_guards), and says what it does."""
    replay("h100x1_580")
    out = dry_run(settings, capsys, native=True)
    assert "--native: this host's Python trains, on 1 GPU(s)" in out and "DS_ACCELERATOR=cuda " in out
    assert "auto →" not in out
    out = dry_run(settings, capsys, native=True, cpu=True)
    assert "--native: this host's Python trains, on CPU" in out and "DS_ACCELERATOR=cpu " in out


def test_a_native_run_on_a_driver_no_image_runs_trains_on_its_gpus_with_the_hosts_torch(settings, capsys, replay):
    """Two A100s on driver 470 (CUDA 11.4): no image variant runs there, and `invoke run --native` was refused with the
    images' "older than every CUDA variant ... Upgrade the driver", though a native run trains with this host's torch
    (a build for CUDA 11 runs on that driver) and uses no image. It trains on both GPUs; a run in an image is still
    refused, and --cpu still trains on CPU."""
    replay("a100x2_470")
    out = dry_run(settings, capsys, native=True)
    assert "--native: this host's Python trains, on 2 GPU(s)" in out and "DS_ACCELERATOR=cuda " in out, out
    assert "--nproc-per-node=2" in out and "older than every" not in out, out
    assert "DS_ACCELERATOR=cpu " in dry_run(settings, capsys, native=True, cpu=True)
    with pytest.raises(DockyardError, match="older than every CUDA variant.*or train on CPU with --cpu"):
        dry_run(settings, capsys)


def test_run_dry_splits_the_global_batch_over_the_hosts_gpus(settings, capsys, replay):
    """Eight H100s, eight processes: a global batch of 12 cannot be split, refused before a command is printed (it
    passed, and the trainer refused it in the container)."""
    replay("h100x8_580")
    with pytest.raises(DockyardError, match="global_batch 12 cannot be split evenly over 8 processes"):
        dry_run(settings, capsys, overrides=("--global_batch", "12"))
    assert "docker run" not in capsys.readouterr().err
    assert "--nproc-per-node=8" in dry_run(settings, capsys, overrides=("--global_batch", "16"))
    assert "--nproc-per-node=2" in dry_run(settings, capsys, gpus="0,1", overrides=("--global_batch", "12"))


@pytest.mark.parametrize("name", CASES)
def test_doctor_gpu_checks_on_recorded_host(replay, name):
    host, links = replay(name)
    gpu = doctor.check_gpus(host)
    topo = doctor.check_topology(host, links)
    if name == "a100_mig_570":  # its advice is one `invoke run` can follow (a MIG uuid is no GPU it selects)
        assert gpu.status == doctor.WARN and "MIG" in gpu.detail and "-mig 0" in gpu.fix and "MIG-" not in gpu.fix
    else:
        assert gpu.status == doctor.PASS and "compute" in gpu.detail
    if name == "l40sx2_550":
        assert topo.status == doctor.WARN and "peer-to-peer" in topo.fix
    if name == "h100x8_580":
        assert topo.status == doctor.PASS


@pytest.mark.parametrize("name, way_out", [
    ("rtx3090x2_535", "GeForce cards have none over PCIe"),
    ("l40sx2_550", "PCIe has none between CPU sockets"),
])
def test_gpus_without_p2p_where_no_setting_gives_it_are_not_sent_to_the_bios(replay, name, way_out):
    """Two RTX 3090s (NVIDIA's driver gives GeForce cards no PCIe P2P) and two L40S on two CPU sockets were told "on
    bare metal check IOMMU/ACS settings, in a VM ask for P2P passthrough": a day in the BIOS that cannot give it."""
    topo = doctor.check_topology(*replay(name))
    assert topo.status == doctor.WARN and "host memory" in topo.fix and way_out in topo.fix
    assert "IOMMU" not in topo.fix and "nothing to set" in topo.fix


def test_a_cuda_visible_devices_left_in_the_shell_is_said_where_it_hides_gpus(settings, capsys, replay, monkeypatch):
    """`export CUDA_VISIBLE_DEVICES=0` left from an earlier test: on two RTX 3090s invoke run trained ddp on one, saying
    only "auto → cu128: 1 GPU(s)", and doctor said "2 × NVIDIA GeForce RTX 3090" and passed ("DDP uses only one of my
    two GPUs"). Both now say which GPUs it leaves; --gpus (a choice made for this run) is not remarked on."""
    host, _ = replay("rtx3090x2_535")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    out = dry_run(settings, capsys)
    assert "CUDA_VISIBLE_DEVICES=0 leaves GPU 0 of the 2: the run takes no other" in out and "--nproc-per-node=1" in out
    seen = doctor.check_visible(host)
    assert seen.status == doctor.WARN and "CUDA_VISIBLE_DEVICES=0 leaves GPU 0 of the 2" in seen.detail
    assert "CUDA_VISIBLE_DEVICES" not in dry_run(settings, capsys, gpus="0,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert "leaves" not in dry_run(settings, capsys) and doctor.check_visible(host) is None


@pytest.mark.parametrize("visible", ["0,,1", "0, ,1", "0,-1,1", "0,NoDevFiles,1", "0,x,1"])
def test_cuda_visible_devices_is_read_as_cuda_reads_it_up_to_an_entry_naming_no_device(settings, capsys, replay,
                                                                                       monkeypatch, visible):
    """`CUDA_VISIBLE_DEVICES=0,,1` (a variable glued from two) was "GPU 0, 1" to invoke run, plan and doctor, and the
    run trained on both, where CUDA stops at the empty entry: every CUDA program of that shell sees GPU 0 alone. What
    CUDA sees is what dockyard takes, and it says where CUDA stopped."""
    host, _ = replay("rtx3090x2_535")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    out = dry_run(settings, capsys)
    assert "--nproc-per-node=1" in out and "device=0" in out and "device=0,1" not in out, out
    stop = "its empty entry" if visible.split(",")[1].strip() == "" else f"its entry {visible.split(',')[1]!r}"
    said = f"CUDA_VISIBLE_DEVICES={visible} leaves GPU 0 of the 2 (CUDA reads no further than {stop})"
    assert f"{said}: the run takes no other" in out
    seen = doctor.check_visible(host)
    assert seen.status == doctor.WARN and said in seen.detail
    assert plan_mod.plan_model("1.5B")["gpus"] == 1


@pytest.mark.parametrize("visible", ["", " ", ",0", "0,1,"])
def test_cuda_visible_devices_set_but_empty_hides_every_gpu_and_a_trailing_comma_drops_none(settings, capsys, replay,
                                                                                            monkeypatch, visible):
    """`export CUDA_VISIBLE_DEVICES=` (how many hide GPUs from CUDA) trained on every GPU, as if it were unset; CUDA
    sees none, and the run trains on CPU as with -1. A trailing comma leaves the GPUs before it, with no remark."""
    replay("rtx3090x2_535")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    out = dry_run(settings, capsys)
    if visible.startswith("0"):
        assert "--nproc-per-node=2" in out and "CUDA_VISIBLE_DEVICES=" not in out, out
        return
    assert "auto → cpu: CUDA_VISIBLE_DEVICES=" in out and "hides every GPU" in out, out
    with pytest.raises(DockyardError, match="hides every GPU: say what to plan for"):
        plan_mod.plan_model("1.5B")


@pytest.mark.parametrize("typed, odd", [("０,１", "'０' (U+FF10)"), ("0,１", "'１' (U+FF11)"), ("1٣", "'٣' (U+0663)")])
@pytest.mark.parametrize("by", ["CUDA_VISIBLE_DEVICES", "--gpus"])
def test_gpus_named_in_digits_other_than_ascii_are_refused_saying_which_character(settings, capsys, replay,
                                                                                   monkeypatch, typed, odd, by):
    """Fullwidth (an IME's `０,１`) or other Unicode digits are digits to Python's isdigit(), not to CUDA or run.sh
    (which refuses them): `invoke run` said "GPU '０' (from CUDA_VISIBLE_DEVICES=０,１) is not on this host: it has 0,
    1", a GPU that looks like one it has. It names the character that is no ASCII one, and how to write the list."""
    host, _ = replay("rtx3090x2_535")
    if by == "--gpus":
        kw = {"gpus": typed}
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", typed)
        kw = {}
    said = f"{by}={typed} holds {odd}, which is no ASCII character: name a GPU by its index in the digits 0-9"
    with pytest.raises(DockyardError) as refused:
        dry_run(settings, capsys, **kw)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value), refused.value
    if by == "CUDA_VISIBLE_DEVICES":
        seen = doctor.check_visible(host)
        assert seen.status == doctor.FAIL and said in seen.detail, seen


def test_more_processes_than_the_gpus_chosen_is_refused_naming_the_choice(settings, capsys, replay):
    """`--gpus=0 --nproc=2` on two RTX 3090s said "this host has 1 GPU(s)", as if GPU 1 were not seen."""
    replay("rtx3090x2_535")
    with pytest.raises(DockyardError, match=r"--nproc=2 but 1 GPU\(s\) are chosen \(0, by --gpus or "
                                            r"CUDA_VISIBLE_DEVICES\): one process per GPU"):
        dry_run(settings, capsys, gpus="0", nproc=2)
    with pytest.raises(DockyardError, match=r"--nproc=3 but this host has 2 GPU\(s\)"):
        dry_run(settings, capsys, nproc=3)


def test_plan_counts_the_recorded_gpus(replay, monkeypatch):
    """The GPUs CUDA_VISIBLE_DEVICES leaves, as `invoke run` starts a process on each (the plan counted all 8)."""
    replay("h100x8_580")
    assert plan_mod.plan_model("1.5B")["gpus"] == 8
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert plan_mod.plan_model("1.5B")["gpus"] == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9")
    with pytest.raises(DockyardError, match=r"GPU '9' \(from CUDA_VISIBLE_DEVICES=9\) is not on this host"):
        plan_mod.plan_model("1.5B")


def test_gpus_all_means_every_gpu_as_docker_reads_it(replay, monkeypatch):
    """`--gpus=all` (docker's word) was "GPU 'all' (from --gpus or CUDA_VISIBLE_DEVICES=all) is not on this host"."""
    host, _ = replay("h100x8_580")
    assert [g.index for g in gpus.select(host, "all").gpus] == list(range(8))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpus.select(host, "ALL").gpus == host.gpus  # the flag wins over the environment, as any --gpus does
    with pytest.raises(DockyardError, match=r"GPU '8' \(from --gpus=1,8\) is not on this host"):
        gpus.select(host, "1,8")


def test_plan_on_a_mig_host_asks_for_the_slices_memory(replay):
    """NVML reports the whole A100's 40 GiB; a process in MIG mode gets one slice's: the plan said "fits" for memory
    the run would not have."""
    replay("a100_mig_570")
    with pytest.raises(DockyardError, match=r"MIG mode: a process gets one slice's memory.*--gpu-mem=GiB"):
        plan_mod.plan_model("1B")
    assert plan_mod.plan_model("1B", gpu_mem_gib=20)["gpu_mem_bytes"] == 20 * 2**30


def test_gpus_flag_picks_devices_for_nproc_and_docker(settings, capsys, replay):
    replay("h100x8_580")
    out = dry_run(settings, capsys, gpus="0,2")
    assert "--nproc-per-node=2" in out and "'\"device=0,2\"'" in out
    # natively too: `--native --gpus=2,3` trained on GPUs 0 and 1 (nothing told CUDA), in nvidia-smi's order
    out = dry_run(settings, capsys, gpus="2,3", native=True)
    assert "--nproc-per-node=2" in out and "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,3 " in out


def test_a_dry_run_on_gpus_says_what_the_auto_settings_become(settings, capsys, replay):
    """On a GPU host `run --dry` said the variant and the disk, not the micro-batch, checkpointing, Liger or compile
    the run would take, which the host works out anyway (the fit check) and `invoke plan` shows for the same model.
    Checked against the plan's own resolution, not figures typed here."""
    from dockyard import ROOT
    from dockyard.common import autos, memory
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    replay("h100x1_580")
    llama8b = ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"
    shape = memory.shape_from_folder(llama8b)
    out = dry_run(settings, capsys, model=str(llama8b), overrides=("--max_seq_length", "2048"), recipe="lora")
    lora = load_recipe("lora")
    run_settings, training = resolve_settings(lora, {"max_seq_length": 2048})
    expected = autos.resolve(lora, run_settings, training, world_size=1, gpus_per_node=1,
                             device=autos.device_from_host(gpus.read_host()), shape=shape, kind="llama",
                             liger=("llama",)).said()
    assert "micro-batch" in expected and f"autos, by the plan's estimate for this GPU: {expected} (" in out
    assert "autos," not in dry_run(settings, capsys, cpu=True)


def test_an_image_the_driver_cannot_run_is_refused_before_the_runs_other_lines(settings, capsys, replay):
    """cu132 on a driver of CUDA 12.2: the disk and memlock lines came first, then the refusal."""
    replay("t4x2_535")
    with pytest.raises(DockyardError, match="image cu132 needs CUDA 13.2 but driver 535"):
        dry_run(settings, capsys, variant="cu132")
    assert "disk:" not in capsys.readouterr().err


@pytest.mark.parametrize(("host", "driver"), [("l40sx2_550", "550.54.15 supports CUDA 12.4"),
                                              ("a100_mig_570", "570.133.20 supports CUDA 12.8")])
def test_cu132_on_a_cuda_12_driver_names_the_variant_that_runs_there(settings, capsys, replay, host, driver):
    """A CUDA 12 server (driver 550, 570) told --variant=cu132: the refusal named no variant ("--variant=auto") and
    offered --disable-require, which cannot help an image without CUDA's forward-compatibility libraries (none of
    the Debian-based builds has them: torch inside finds no usable GPU). It names cu128 and the driver cu132 needs,
    as run.sh does on a node, and says what --disable-require needs."""
    replay(host)
    with pytest.raises(DockyardError) as refused:
        dry_run(settings, capsys, variant="cu132")
    said = str(refused.value)
    assert f"image cu132 needs CUDA 13.2 but driver {driver}: use --variant=cu128 (CUDA 12.8, which this driver " \
           "runs; --variant=auto picks it) or upgrade the driver to 580 or newer." in said
    assert "--disable-require starts it anyway, which helps only an image holding CUDA's forward-compatibility " \
           "libraries" in said and "the Debian-based builds hold none" in said


def test_a_cuda_12_driver_below_nvidias_least_for_cuda_12_is_refused_as_the_docs_say(settings, capsys, monkeypatch,
                                                                                    tmp_path):
    """Driver 525.60.11 reports CUDA 12.0 and is below 525.60.13, the least NVIDIA's release notes give CUDA 12.x builds
    (README, docs/images.md): cu128 passed on the CUDA major alone, run --dry and doctor too."""
    import json

    recording = json.loads((HOSTS / "t4x2_535.json").read_text())
    recording["host"] |= {"driver": "525.60.11", "cuda": "12.0"}
    (tmp_path / "t4x2_525.json").write_text(json.dumps(recording))
    monkeypatch.setenv(gpus.REPLAY_ENV, str(tmp_path / "t4x2_525.json"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DockyardError) as refused:
        dry_run(settings, capsys, variant="cu128")
    assert str(refused.value).startswith("image cu128 needs CUDA 12.8 but driver 525.60.11 (CUDA 12.0) is older than "
                                         "525.60.13, the first that runs CUDA 12 builds: upgrade the driver to "
                                         "525.60.13 or newer."), refused.value
    with pytest.raises(DockyardError, match=r"older than every CUDA variant: .*cu128 \(CUDA 12\.8\) \(its CUDA needs "
                                            r"driver 525\.60\.13 or newer\)\. Upgrade the driver"):
        dry_run(settings, capsys)
    checks = {c.name: c for c in doctor.check_variants(variants.all_variants(settings), gpus.read_host(), {})}
    assert checks["variant cu128"].status == doctor.WARN and "is older than 525.60.13" in checks["variant cu128"].detail
    recording["host"]["driver"] = "525.60.13"  # the least itself runs it
    (tmp_path / "t4x2_525.json").write_text(json.dumps(recording))
    assert "auto → cu128" in dry_run(settings, capsys)


def test_fewer_processes_than_gpus_are_given_their_gpus_alone(settings, capsys, replay):
    """`--nproc=4` on eight GPUs gave the container all eight, four idle all run, said only by the monitor's verdict
    at the end: the processes' GPUs alone are given (and watched), and the run says which."""
    replay("h100x8_580")
    out = dry_run(settings, capsys, nproc=4)
    assert "--nproc=4: trains on GPU 0, 1, 2, 3 of the 8 (--gpus=LIST picks which)" in out
    assert "--nproc-per-node=4" in out and "'\"device=0,1,2,3\"'" in out
    out = dry_run(settings, capsys, nproc=2, native=True)
    assert "on 2 GPU(s)" in out and "CUDA_VISIBLE_DEVICES=0,1 " in out
    assert "trains on GPU" not in dry_run(settings, capsys, nproc=8)


def test_a_gpus_flag_that_reads_as_a_count_says_it_is_an_index(settings, capsys, replay):
    """`invoke plan --gpus=2` is a count, and `invoke run --gpus=2` GPU 2 alone, as docker and CUDA_VISIBLE_DEVICES
    read it: on eight GPUs the run trained on one without a word, and on two it said only that GPU 2 is not there."""
    replay("h100x8_580")
    out = dry_run(settings, capsys, gpus="2")
    assert "--gpus=2 is GPU 2 alone" in out and "2 GPUs: --gpus=0,1" in out
    assert "--nproc-per-node=1" in out and "'\"device=2\"'" in out  # still as docker reads it
    assert "GPU 2 alone" not in dry_run(settings, capsys, gpus="0,2")
    replay("t4x2_535")
    with pytest.raises(DockyardError, match=r"not on this host: it has 0, 1; --gpus takes GPUs by index, not a "
                                            r"count: --gpus=0,1 for 2 of them"):
        dry_run(settings, capsys, gpus="2")


@pytest.mark.parametrize("spec, says", [("²", "which is no ASCII character"),
                                         ("0" * 5000 + "1", "is not on this host: it has 0, 1")])
def test_a_gpu_index_python_reads_as_digits_but_int_does_not_is_refused_in_one_line(spec, says, replay, monkeypatch):
    """`--gpus=²` (a digit to str.isdigit, not to int) and CUDA_VISIBLE_DEVICES of 5,000 digits (past int()'s limit)
    were ValueError tracebacks."""
    host, _ = replay("t4x2_535")
    with pytest.raises(DockyardError, match=says):
        gpus.select(host, spec)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with pytest.raises(DockyardError, match=says):
        gpus.select(host)


def test_gpus_flag_naming_a_gpu_twice_or_given_with_cpu_is_refused(settings, capsys, replay, monkeypatch):
    """--gpus=0,0 (a typo for 0,1?) trained on one GPU without a word; --gpus with --cpu trained on CPU. A repeat in
    CUDA_VISIBLE_DEVICES is one GPU, as CUDA sees it."""
    replay("h100x8_580")
    with pytest.raises(DockyardError, match=r"--gpus=0,0: GPU 0 is named twice; one process per GPU"):
        dry_run(settings, capsys, gpus="0,0")
    with pytest.raises(DockyardError, match="--gpus=1 picks GPUs to train on, and --cpu trains on none"):
        dry_run(settings, capsys, gpus="1", cpu=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,3")
    assert "--nproc-per-node=1" in dry_run(settings, capsys) and "device=3" in dry_run(settings, capsys)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "--nproc-per-node=2" in dry_run(settings, capsys, cpu=True)


def test_cuda_visible_devices_is_honoured(settings, capsys, replay, monkeypatch):
    replay("h100x8_580")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    out = dry_run(settings, capsys)
    assert "--nproc-per-node=1" in out and "device=5" in out


def test_a_gpu_not_on_the_host_is_a_short_error(settings, capsys, replay):
    replay("t4x2_535")
    with pytest.raises(DockyardError, match="'3'.*not on this host"):
        dry_run(settings, capsys, gpus="0,3")


@pytest.mark.parametrize("text, says", [("[1, 2]", "expected a JSON object"), ('{"host": []}', "not a recorded host"),
                                        ('{"host": {"gpus": [{"x": 1}]}}', "not a recorded host"),
                                        ("not json", "is not valid JSON"),
                                        # a key misspelt, or none: it was read as a host with no GPU ("NVML sees no GPU")
                                        ('{"hots": {"gpus": []}}', r"hots: is not a key here: remove it"),
                                        ("{}", r"host: missing: add it"),
                                        ('{"host": {"cuda": 12.2}}', r"\(host\.cuda 12\.2: takes text\)"),
                                        ('{"host": {"gpus": [{"index": 0, "name": "T4", "memory_bytes": "lots"}]}}',
                                         r"\(host\.gpus\.0\.memory_bytes 'lots': takes a whole number\)"),
                                        ('{"host": {"gpus": [{"index": 0, "name": "T4", "memory_bytes": 1, '
                                         '"capability": 7.5}]}}', r"host\.gpus\.0\.capability 7\.5: takes "),
                                        ('{"links": [{"a": 0, "b": 1, "path": "x", "p2p": "yes"}]}', r"links\.0\.p2p"),
                                        ('{"samples": [{"devices": [{"device": 0, "util": "x", "mem": 0}]}]}',
                                         r"samples\.0\.devices\.0\.util"),
                                        # values no host has: planned "fits: no" and a run --dry for them
                                        ('{"host": {"gpus": [{"index": 0, "name": "T4", "memory_bytes": -5}]}}',
                                         r"host\.gpus\.0\.memory_bytes -5: takes 0 or more"),
                                        ('{"host": {"gpus": [{"index": -3, "name": "T4", "memory_bytes": 1}]}}',
                                         r"host\.gpus\.0\.index -3: takes 0 or more"),
                                        ('{"host": {"gpus": [{"index": 0, "name": "T4", "memory_bytes": 1}, {"index": '
                                         '0, "name": "T4", "memory_bytes": 1}]}}', r"each GPU's index once in gpus"),
                                        ('{"samples": [{"devices": [{"device": 0, "util": -1.0, "mem": 0}]}]}',
                                         r"samples\.0\.devices\.0\.util -1\.0: takes "),
                                        ('{"host": {"gpus": [' + ", ".join(
                                            f'{{"index": {i}, "name": "T4", "memory_bytes": -1}}' for i in range(900))
                                         + "]}}", r"memory_bytes -1: takes 0 or more; and \d+ more\)$")])
def test_a_replay_file_of_another_shape_is_a_short_error(tmp_path, monkeypatch, text, says):
    bad = tmp_path / "host.json"
    bad.write_text(text)
    monkeypatch.setenv(gpus.REPLAY_ENV, str(bad))
    with pytest.raises(DockyardError, match=says) as e:
        gpus.facts()
    assert str(bad) in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 1000


def test_a_folder_given_as_the_replay_file_is_named_as_the_folder(tmp_path, monkeypatch):
    """It was "Is a directory: 3", the descriptor's number (fdopen refused before the folder check ran)."""
    monkeypatch.setenv(gpus.REPLAY_ENV, str(tmp_path))
    with pytest.raises(DockyardError, match=rf"Is a directory: '{tmp_path}'"):
        gpus.facts()


def test_recording_into_a_folder_that_does_not_exist_is_a_short_error(tmp_path):
    with pytest.raises(DockyardError, match="cannot write it"):
        gpus.record(tmp_path / "no-such-folder" / "host.json")


def _recipe_with_optimizer(tmp_path: Path, optimizer: dict | None, offload: bool) -> Path:
    """A copy of the zero2 recipe (zero2-offload's, `offload`) whose ds_config names `optimizer` (DeepSpeed picks its
    op from it)."""
    import json
    import shutil

    from dockyard import ROOT

    folder = tmp_path / "my-zero2"
    shutil.copytree(ROOT / "recipes" / ("zero2-offload" if offload else "zero2"), folder)
    cfg = json.loads((folder / "ds_config.json").read_text())
    cfg.pop("optimizer", None)
    if optimizer:
        cfg["optimizer"] = optimizer
    if optimizer and optimizer["type"] not in ("Adam", "AdamW"):  # Lamb: ZeRO trains it only where allowed
        cfg["zero_allow_untested_optimizer"] = True
    (folder / "ds_config.json").write_text(json.dumps(cfg))
    return folder


ADAMW = {"type": "AdamW", "params": {"lr": "auto"}}


@pytest.mark.parametrize("optimizer, offload, refused", [
    (ADAMW, False, True),                                   # FusedAdam on the GPU: cu128 has no nvcc to build it
    ({"type": "Lamb", "params": {"lr": "auto"}}, False, True),
    (ADAMW, True, False),                                   # offloaded: DeepSpeedCPUAdam, prebuilt
    ({"type": "AdamW", "params": {"torch_adam": True}}, False, False),
    (None, False, False),                                   # the Trainer's torch AdamW
])
def test_a_deepspeed_op_the_image_cannot_load_is_refused_before_the_run(settings, capsys, replay, tmp_path,
                                                                        optimizer, offload, refused):
    """On a T4 host (auto → cu128, no nvcc in the image), `run --dry` refuses a ds_config whose optimizer needs a
    CUDA op cu128 does not hold, and says the ways out; what it can load goes through to the printed command."""
    replay("t4x2_535")
    folder = _recipe_with_optimizer(tmp_path, optimizer, offload)
    request = launch_run.RunRequest(recipe=str(folder), dry=True)
    if refused:
        with pytest.raises(DockyardError, match=r"CUDA op fused_(adam|lamb), which dockyard:\S+-cu128 does not "
                                                r"hold and cannot compile.*--devel"):
            launch_run.run(settings, request)
    else:
        launch_run.run(settings, request)
        assert "docker run" in capsys.readouterr().err


def test_an_image_built_on_its_devel_base_may_compile_the_op(settings):
    """A --devel build has nvcc (its dockyard.nvcc label): DeepSpeed may JIT what it lacks, nothing is refused."""
    from dockyard.images import variants

    cu128 = variants.resolve(settings, "cu128")[0]
    assert variants.cuda_ops_the_image_can_load(cu128, None) == {"cpu_adam", "async_io"}
    assert variants.cuda_ops_the_image_can_load(cu128, {"dockyard.ds_ops": "cpu_adam,fused_adam,async_io",
                                                        "dockyard.nvcc": "base"}) is None
    assert variants.cuda_ops_the_image_can_load(variants.resolve(settings, "cu132")[0], None) is None


# (recorded host, model, seq, --batch): 0 is auto, what a run with no tuning flags does
PLANNED = [("t4x2_535", "1B", 512, 0), ("t4x2_535", "1B", 2048, 0), ("l40sx2_550", "1.5B", 4096, 0),
           ("h100x1_580", "4.2B", 512, 0), ("h100x1_580", "4.2B", 2048, 0), ("h100x1_580", "944M", 16384, 0),
           ("h100x8_580", "8B", 2048, 0), ("h100x8_580", "13B", 1024, 0), ("h100x1_580", "1B", 2048, 4),
           ("t4x2_535", "1B", 512, 2)]


@pytest.mark.parametrize("name, model, seq, batch", PLANNED)
def test_every_row_the_plan_says_fits_is_the_run_the_trainer_takes(replay, name, model, seq, batch):
    """`invoke plan` sized each recipe at micro-batch --batch (1) × accumulation 8 / --batch, the trainer took the
    largest micro-batch of the 8 examples per process that fits, and without accumulation the gradients are freed:
    on 2 × 24 GiB the plan said ddp of 1B at 512 tokens fits nowhere, the trainer ran it at micro-batch 8; on the H100
    it said full fine-tuning of 4.2B fits nowhere, the trainer took ddp. And `--batch=N` meant N × 8 / N where
    `-- --per_device_train_batch_size N` runs N examples, no accumulation. Now every row the plan says fits is the run
    the trainer takes with the same inputs (its micro-batch, accumulation and checkpointing), and every row it says
    does not, the trainer refuses (or, given the micro-batch, runs as asked, with checkpointing)."""
    from dockyard.common import autos
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    host, _ = replay(name)
    device = autos.device_from_host(host)
    result = plan_mod.plan_model(model, seq_len=seq, batch=batch, cpu_mem_gib=4096)
    shape = plan_mod.shape_for(model)
    given = {"max_seq_length": seq, **({"per_device_train_batch_size": batch} if batch else {})}

    def resolve(name: str, **more) -> autos.Resolved:
        recipe = load_recipe(name)
        settings, overrides = resolve_settings(recipe, {**given, **more})
        return autos.resolve(recipe, settings, overrides, world_size=host.count, gpus_per_node=host.count,
                             device=device, shape=shape, kind="llama", liger=autos.LIGER_TYPES)

    fitting = 0
    for row in result["recipes"]:
        try:
            r = resolve(row["recipe"])
        except DockyardError as e:
            assert not (row["fits"] or row["fits_checkpointed"]), (row["recipe"], str(e))
            continue
        took = {k: r.overrides[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                            "gradient_checkpointing", "torch_compile", "use_liger_kernel")}
        if row["fits"] or row["fits_checkpointed"]:
            fitting += 1
            assert took == {"per_device_train_batch_size": row["micro_batch"], "gradient_checkpointing": not row["fits"],
                            "gradient_accumulation_steps": row["gradient_accumulation_steps"],
                            "torch_compile": row["torch_compile"], "use_liger_kernel": row["use_liger_kernel"]}, \
                row["recipe"]
        else:
            assert batch and took["per_device_train_batch_size"] == batch, (row["recipe"], took)  # run as asked
    assert fitting, "some recipe fits in every case"
    rec = result["recommendation"]
    row = next(r for r in result["recipes"] if r["recipe"] == rec["recipe"])
    assert (rec["micro_batch"], rec["gradient_accumulation_steps"]) == (row["micro_batch"],
                                                                        row["gradient_accumulation_steps"])


def test_the_plan_recommends_what_the_trainer_runs_where_only_one_micro_batch_fits():
    """The reviewer's case: ddp of 1B on 2 × 24 GiB at 512 tokens. Micro-batch 1 × 8 holds the gradients (22.7 GiB with
    checkpointing: "ddp needs 21.9 GiB per GPU even with gradient checkpointing", zero2 recommended); all 8 at once
    with checkpointing is 21.5 GiB of 21.6, which the trainer runs."""
    result = plan_mod.plan_model("1B", gpus=2, gpu_mem_gib=24, seq_len=512, cpu_mem_gib=256)
    ddp = next(r for r in result["recipes"] if r["recipe"] == "ddp")
    assert (ddp["micro_batch"], ddp["gradient_accumulation_steps"]) == (8, 1)
    assert not ddp["fits"] and ddp["fits_checkpointed"]
    rec = result["recommendation"]
    assert (rec["recipe"], rec["gradient_checkpointing"], rec["micro_batch"]) == ("ddp", True, 8)
    assert "at micro-batch 8 with gradient checkpointing" in rec["why"]
    asked = plan_mod.plan_model("1B", gpus=2, gpu_mem_gib=24, seq_len=512, cpu_mem_gib=256, batch=2)
    assert {(r["micro_batch"], r["gradient_accumulation_steps"]) for r in asked["recipes"]} == {(2, 1)}


def test_a_recording_of_a_gpu_whose_memory_nvml_could_not_read_replays(tmp_path, monkeypatch, settings, capsys):
    """`doctor --record` writes memory_bytes 0 where NVML cannot read a GPU's memory: its own file must replay, and
    `invoke run` does not size the run against those 0 bytes (it refused every run: "the model alone does not fit
    ... of 0.0 GiB"): the trainer reads the memory from torch."""
    f = tmp_path / "host.json"
    f.write_text('{"host": {"driver": "580.159.04", "cuda": "13.0", "gpus": [{"index": 0, "name": "H100", '
                 '"memory_bytes": 0}]}}')
    monkeypatch.setenv(gpus.REPLAY_ENV, str(f))
    host, _ = gpus.facts()
    assert host.count == 1 and host.gpus[0].memory_bytes == 0
    assert "docker run" in dry_run(settings, capsys)


@pytest.mark.parametrize(("host", "refused"), [("rtx3090x2_535", True), ("v100x2_535", False), ("t4x2_535", False),
                                               ("t4x2_535_unbranded", False)])
def test_a_devel_image_on_a_geforce_with_a_driver_its_requirement_names_for_other_brands_is_refused(
        settings, capsys, monkeypatch, tmp_path, host, refused):
    """nvidia/cuda:12.8's NVIDIA_REQUIRE_CUDA (a --devel cu128 build's) admits driver 535 on Tesla, NVIDIA and other
    data-center brands, not on GeForce or TITAN. The brand was never read, so run --dry passed on a GeForce host and
    docker's NVIDIA toolkit refused the container at start ("unsatisfied condition: cuda>=12.8"). NVML's brand (the
    recording's: no GPU here) now decides it: the GeForce host is refused, naming its GPUs' brand and the ways out;
    a Tesla host and a T4 (brand NVIDIA, the toolkit's Unknown) pass, and so does a recording without brands."""
    from tests.support.fake_engine import FakeEngine
    from tests.support.nvml import REQUIRE_CUDA_128

    cu128 = variants.all_variants(settings)["cu128"]
    tag = variants.tag(settings, cu128)
    settings = FakeEngine({tag: f"sha256:{'d' * 64}"}, configs={f"sha256:{'d' * 64}": {
        "Env": ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={REQUIRE_CUDA_128}"],
        "Labels": {"dockyard.variant": "cu128", "dockyard.cuda": "12.8", "dockyard.base": cu128.devel.base}}}
    ).install(monkeypatch, settings)
    recording = (HOSTS / f"{host.removesuffix('_unbranded')}.json").read_text()
    if host.endswith("_unbranded"):  # as recordings made before the brand was read say it: not at all
        recording = recording.replace(',\n    "brand": "nvidia"', "")
        assert '"brand"' not in recording
    (tmp_path / "host.json").write_text(recording)
    monkeypatch.setenv(gpus.REPLAY_ENV, str(tmp_path / "host.json"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if not refused:
        assert "--gpus all" in dry_run(settings, capsys, variant="cu128")
        return
    with pytest.raises(DockyardError) as said:
        dry_run(settings, capsys, variant="cu128")
    assert str(said.value) == (
        f"image {tag} sets NVIDIA_REQUIRE_CUDA cuda>=12.8 (from its base image), and driver 535.183.01 supports CUDA "
        "12.2; it admits this driver on other brands of GPU only, not on GPU 0 (NVIDIA GeForce RTX 3090, "
        "brand=geforce), GPU 1 (NVIDIA GeForce RTX 3090, brand=geforce): the NVIDIA toolkit would refuse to start it. "
        "--disable-require starts it (a CUDA 12 driver runs any CUDA 12 build: docs/images.md), or use the plain image "
        "(`invoke build --variant=cu128`, without --devel)")
    assert "+ " not in capsys.readouterr().err  # refused before any command is printed
    assert "--gpus all" in dry_run(settings, capsys, variant="cu128", disable_require=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # one GPU given: that one is named
    with pytest.raises(DockyardError, match=r"not on GPU 1 \(NVIDIA GeForce RTX 3090, brand=geforce\): the NVIDIA"):
        dry_run(settings, capsys, variant="cu128")
    checks = {c.name: c for c in doctor.check_variants(variants.all_variants(settings), gpus.read_host(),
                                                        {}, images={"cu128": {"Config": {"Env": [
                                                            f"NVIDIA_REQUIRE_CUDA={REQUIRE_CUDA_128}"]}}})}
    assert checks["variant cu128"].status == doctor.WARN and "brand=geforce" in checks["variant cu128"].detail


def test_a_dry_run_before_the_build_says_how_to_build_the_image(settings, capsys, replay, monkeypatch):
    """A newcomer's `invoke run --dry` (or `invoke shell --dry`) before `invoke build` read 'note: dockyard:0.1.0-cpu is
    not built (or no engine answers): the run sets DOCKYARD_IMAGE_ID to its id': which of the two, and what to do,
    unsaid, and the shell's command holds no such variable. The note now says the image is not built yet and the
    build that makes it; the run's says its id is left empty, the shell's names nothing it does not print."""
    replay("t4x2_535")  # auto picks a CUDA image: the build named is that variant's
    s = FakeEngine().install(monkeypatch, settings)
    tag = variants.tag(s, variants.all_variants(s)["cu128"])
    say = f"note: {tag} is not built yet: `invoke build --variant=cu128` builds it (without --dry this stops here)"

    run = [ln for ln in dry_run(s, capsys).splitlines() if tag in ln and ln.startswith("note:")]
    assert run == [f"{say}; DOCKYARD_IMAGE_ID below is left empty until then"]
    launch_run.shell(s, dry=True)
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if tag in ln and ln.startswith("note:")] == [say]
    assert "DOCKYARD_IMAGE_ID" not in err


def test_on_a_cuda_11_driver_cpu_trains_on_cpu_and_the_refusal_says_so(settings, capsys, replay):
    """Two A100s on driver 470 (CUDA 11.4, tests/fixtures/nvml/hosts/a100x2_470.json): no variant's CUDA runs there.
    `invoke run --cpu` (and `invoke shell --cpu`), asked to leave the GPUs alone, were refused all the same with
    auto's "older than every CUDA variant ... Upgrade the driver", and the refusal of a plain run named no way to
    train until the driver is upgraded, where run.sh on such a node says "(or --cpu to train on CPU)". --cpu now takes
    the cpu image, saying why; the refusal names the driver to upgrade to and --cpu."""
    replay("a100x2_470")
    with pytest.raises(DockyardError) as refused:
        dry_run(settings, capsys)
    said = str(refused.value)
    assert "driver 470.256.02 supports CUDA 11.4" in said and "525.60.13 or newer" in said
    assert said.endswith("; or train on CPU with --cpu") and len(said.splitlines()) == 1, said
    out = dry_run(settings, capsys, cpu=True)
    assert "auto → cpu: --cpu, and driver 470.256.02 supports CUDA 11.4" in out, out
    assert f" {variants.tag(settings, variants.all_variants(settings)['cpu'])} torchrun" in out
    assert "--gpus" not in out and "--nproc-per-node=2" in out
    launch_run.shell(settings, dry=True, cpu=True)
    err = capsys.readouterr().err
    assert f" {variants.tag(settings, variants.all_variants(settings)['cpu'])} bash" in err and "--gpus" not in err
    with pytest.raises(DockyardError, match=r"; or work on CPU with --cpu$"):
        launch_run.shell(settings, dry=True)


def test_doctor_on_a_cuda_11_driver_names_the_way_to_train_that_invoke_run_names(settings, replay):
    """doctor's "auto variant" on driver 470 (CUDA 11.4) said to upgrade the driver or add a variant, where invoke run
    on the same host ends "; or train on CPU with --cpu": doctor names the same way out, as its command."""
    host, _ = replay("a100x2_470")
    auto = {c.name: c for c in doctor.check_variants(variants.all_variants(settings), host, {})}["auto variant"]
    with pytest.raises(DockyardError) as refused:
        launch_run.run(settings, launch_run.RunRequest(recipe="ddp", dry=True))
    assert auto.status == doctor.FAIL and "525.60.13 or newer" in auto.fix
    assert auto.fix.endswith("; or train on CPU with `invoke run --cpu`") and len(auto.fix.splitlines()) == 1
    assert auto.fix.removesuffix("`invoke run --cpu`") == str(refused.value).removesuffix("--cpu")


def test_a_plan_on_a_host_whose_driver_runs_no_image_says_so_beside_its_command(settings, capsys, replay):
    """`invoke plan` on two A100s on driver 470 (CUDA 11.4) ended "run it: invoke run --recipe=ddp ...", which invoke
    run there refuses ("older than every CUDA variant"): the plan's command is now followed by why it cannot run on
    this host yet and the driver that runs it. A host whose driver runs an image, or a plan for GPUs given by --gpus
    and --gpu-mem (another server's), gets no such line."""
    replay("a100x2_470")

    def every():
        return variants.all_variants(settings)

    planned = plan_mod.plan_model("1B", cpu_mem_gib=512, variants=every)
    assert planned["recommendation"]["recipe"] and "525.60.13 or newer" in planned["recommendation"]["refused_here"]
    plan_mod.print_plan(planned)
    said = " ".join(capsys.readouterr().out.split())
    assert "run it: invoke run --recipe=" in said
    assert ("not on this host as it is: driver 470.256.02 supports CUDA 11.4, older than every CUDA variant" in
            said.split("run it: ")[1]), said
    elsewhere = plan_mod.plan_model("1B", gpus=2, gpu_mem_gib=40, cpu_mem_gib=512, variants=every)
    assert elsewhere["recommendation"]["refused_here"] == ""
    replay("t4x2_535")
    assert plan_mod.plan_model("1B", cpu_mem_gib=512, variants=every)["recommendation"]["refused_here"] == ""


def test_a_plan_needs_no_variants_file(settings, replay, tmp_path):
    """A project of the user's own without images/ (a recipe folder and invoke.yaml): `invoke plan` stopped at "variants
    file ... not found" once it read the variants to say whether this host runs an image. A plan needs no image: it
    plans, and says nothing of images it cannot read."""
    replay("a100x2_470")
    missing = settings.model_copy(update={"variants_file": str(tmp_path / "none.yaml")})
    planned = plan_mod.plan_model("1B", cpu_mem_gib=512, variants=lambda: variants.all_variants(missing))
    assert planned["recommendation"]["recipe"] and planned["recommendation"]["refused_here"] == ""


@pytest.mark.parametrize("gpus,visible", [("0," + "a" * 5000, None), ("0,0" + "1" * 5000, None), (" ," * 2500, None),
                                          ("", "0,GPU-" + "a" * 5000), ("", "0,9" + "9" * 5000),
                                          ("", "1,,0" + ",1" * 2500)])
def test_a_gpu_list_of_thousands_of_characters_is_said_in_a_line_not_twice_whole(settings, capsys, replay, monkeypatch,
                                                                                 gpus, visible):
    """--gpus or CUDA_VISIBLE_DEVICES of 5,000 characters (a variable glued from a file, a loop's output) was said
    whole, and twice: 'GPU '<the entry>' (from --gpus=<the list>) is not on this host', 10,000 characters of error;
    a list CUDA reads no further than an empty entry of was said whole in the run's note of the GPUs it leaves. Each
    is one line of a few hundred characters, still naming the flag or variable and what to do."""
    replay("t4x2_535")
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    try:
        said = [line for line in dry_run(settings, capsys, gpus=gpus).splitlines() if "CUDA_VISIBLE_DEVICES=" in line]
    except DockyardError as e:
        said = [str(e)]
        assert "--gpus=" in said[0] if gpus else "CUDA_VISIBLE_DEVICES=" in said[0], said[0]
        assert "it has 0, 1" in said[0] or "names no GPU" in said[0], said[0]
    assert said and all(len(line) < 400 for line in said), [len(line) for line in said]


@pytest.mark.parametrize("host", ["v100x2_535", "t4x2_535"])
def test_doctor_names_the_variant_that_trains_here_in_place_of_one_that_cannot(settings, replay, host):
    """`invoke doctor` on V100s said of cu132 (no code for their 7.0) "use another variant", and on a CUDA 12 driver
    "auto picks another variant", where it could name the one that runs there: it names it now, the one auto picks
    (cu128), which the same checks pass."""
    replay(host)
    every = variants.all_variants(settings)
    checks = {c.name: c for c in doctor.check_variants(every, gpus.read_host(), {})}
    meant = variants.pick_auto(every, gpus.read_host())[0].name
    assert meant != "cu132" and checks[f"variant {meant}"].status == doctor.PASS
    assert checks["variant cu132"].status == doctor.WARN
    assert f"use {meant} (invoke run --variant={meant}, or leave --variant out" in checks["variant cu132"].fix, \
        checks["variant cu132"]
