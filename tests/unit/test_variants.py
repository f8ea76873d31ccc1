"""Variants: tags, labels, and which variant `auto` picks for recorded NVML readings (no GPU here)."""

import pytest

from dockyard.common.errors import DockyardError
from dockyard.gpus import Gpu, Host
from dockyard.images import build, variants
from tests.support.nvml import REQUIRE_CUDA_128

H100 = Gpu(0, "NVIDIA H100 80GB HBM3", 80 * 2**30)


def test_tag_says_version_and_variant(settings):
    cpu = variants.resolve(settings, "cpu")[0]
    assert variants.tag(settings, cpu) == "dockyard:0.1.0-cpu"


def test_labels_carry_what_is_inside(settings):
    for v in variants.all_variants(settings).values():
        labels = variants.labels(v, revision="abc123", created="2026-01-01T00:00:00+00:00",
                                 source="https://example.org/dockyard.git")
        for key in ("dockyard.variant", "dockyard.cuda", "dockyard.python", "dockyard.torch", "dockyard.triton",
                    "dockyard.deepspeed", "dockyard.bitsandbytes", "dockyard.lock",
                    "org.opencontainers.image.version", "org.opencontainers.image.revision",
                    "org.opencontainers.image.created", "org.opencontainers.image.source",
                    "org.opencontainers.image.title"):
            assert key in labels, (v.name, key)
        assert labels["dockyard.lock"] == variants.lock_hash(v) and len(labels["dockyard.lock"]) == 64
        assert labels["dockyard.cuda"] == ("" if v.name == "cpu" else v.cuda)
        assert labels["dockyard.ds_ops"].split(",") == [variants.OP_NAMES[op] for op in v.ds_ops]
        assert labels["dockyard.cuda_archs"] == ("" if v.name == "cpu" else v.torch_archs)
        assert labels["org.opencontainers.image.source"] == "https://example.org/dockyard.git"
        no_remote = variants.labels(v, revision="abc123", created="2026-01-01T00:00:00+00:00")
        assert "org.opencontainers.image.source" not in no_remote, "no repository: no source label at all"


def test_docs_name_every_label_and_when_the_image_has_no_source(settings):
    """interface.md lists org.opencontainers.image.source among the labels, and an image built from a checkout
    without a URL remote has none (a local path would mean nothing on another host): docs/images.md says which
    labels there are, where each comes from, and when .source is left out."""
    import re

    from dockyard import ROOT

    text = (ROOT / "docs" / "images.md").read_text()
    section = text[text.index("## Labels"):]
    names = re.findall(r"`(dockyard\.[a-z_]+|org\.opencontainers\.image\.[a-z]+|\.[a-z]+)`", section)
    named = {"org.opencontainers.image" + n if n.startswith(".") else n for n in names}  # `.version`: the OCI one
    every = variants.labels(variants.resolve(settings, "cpu")[0], revision="abc123", created="2026-01-01T00:00:00+00:00",
                            source="https://example.org/dockyard.git", code="0" * 64, base="dockyard-base:bookworm")
    assert set(every) <= named, sorted(set(every) - named)
    assert "carries no `org.opencontainers.image.source` label at all" in section


def test_at_least_two_cuda_variants_and_cpu(settings):
    vs = variants.all_variants(settings)
    cuda = sorted((v for v in vs.values() if v.is_cuda), key=lambda v: variants.cuda_version(v.cuda))
    assert "cpu" in vs and len(cuda) >= 2
    assert variants.cuda_version(cuda[0].cuda)[0] == 12 and variants.cuda_version(cuda[-1].cuda) >= (13, 2)
    for v in cuda:
        assert v.base == "", f"{v.name} builds from the registry-free base, every byte from its lock"
        assert {"CPU_ADAM", "AIO"} <= set(v.ds_ops) and v.torch_archs
        # DeepSpeed's CUDA ops only where the lock brings nvcc (PyPI's CUDA 12 wheels have none)
        assert ("FUSED_ADAM" in v.ds_ops) == (v.toolkit == "wheels"), v.name
    assert cuda[-1].toolkit == "wheels" and cuda[0].toolkit == "", "cu132 has nvcc from its lock, cu128 none"


# "12.10" and "9.2" sort the other way as strings: CUDA versions must compare as numbers.
@pytest.mark.parametrize("cuda, expected", [("13.2", "cu132"), ("13.0", "cu132"), ("12.10", "cu128"),
                                            ("12.8", "cu128"), ("12.2", "cu128")])
def test_auto_picks_newest_variant_the_driver_supports(settings, cuda, expected):
    host = Host(driver="580.00", cuda=cuda, gpus=[H100, H100])
    v, why = variants.resolve(settings, "auto", host)
    assert v.name == expected and "2 GPU(s)" in why


def test_a_driver_older_than_every_variant_is_refused_even_where_strings_sort_it_newer(settings):
    with pytest.raises(DockyardError, match=r"supports CUDA 9\.2, older than every CUDA variant"):
        variants.resolve(settings, "auto", Host(driver="396.26", cuda="9.2", gpus=[H100]))


def test_auto_prefers_cuda_12_10_to_12_9(settings):
    base = variants.all_variants(settings)["cu128"]
    choice = {"cu129": base.model_copy(update={"name": "cu129", "cuda": "12.9"}),
              "cu1210": base.model_copy(update={"name": "cu1210", "cuda": "12.10"})}
    picked, _ = variants.pick_auto(choice, Host(driver="999.0", cuda="12.10", gpus=[H100]))
    assert picked.name == "cu1210"
    assert variants.cuda_version("12.10") > variants.cuda_version("12.9") > variants.cuda_version("9.2")


def test_auto_without_gpus_is_cpu_and_says_why(settings):
    v, why = variants.resolve(settings, "auto", Host(error="NVML unavailable: no NVIDIA driver"))
    assert v.name == "cpu" and "no NVIDIA driver" in why


def test_driver_too_old_for_every_variant_is_a_clear_error(settings):
    with pytest.raises(DockyardError, match=r"driver 470\.1 supports CUDA 11\.4.*cu128"):
        variants.resolve(settings, "auto", Host(driver="470.1", cuda="11.4", gpus=[H100]))


def test_unknown_variant_lists_valid_names(settings):
    with pytest.raises(DockyardError, match=r"unknown variant 'cu99'.*auto, .*cpu"):
        variants.resolve(settings, "cu99")


def test_committed_locks_agree_with_pins(settings):
    """A pin edited in variants.yaml without `invoke lock` would build something else than the label says."""
    for v in variants.all_variants(settings).values():
        build.check_lock(v)
        text = v.lock_file.read_text()
        assert "--hash=sha256:" in text and text.count("==") >= 40


# driver → the CUDA it reports; minor-version compatibility runs any 12.x image on a CUDA 12 driver (T4 hosts on
# 535 included) and 13.x only from driver 580
DRIVERS = {"535.183.01": "12.2", "550.54.15": "12.4", "570.133.20": "12.8", "580.65.06": "13.0"}


@pytest.mark.parametrize("driver, runs", [("535.183.01", {"cu128"}), ("550.54.15", {"cu128"}),
                                          ("570.133.20", {"cu128"}), ("580.65.06", {"cu128", "cu132"})])
def test_driver_by_variant_table(settings, driver, runs):
    vs = variants.all_variants(settings)
    host = Host(driver=driver, cuda=DRIVERS[driver], gpus=[H100])
    # where NVML cannot read the driver's CUDA version, the driver version says the same
    for host in (Host(driver=driver, cuda=DRIVERS[driver], gpus=[H100]), Host(driver=driver, gpus=[H100])):
        assert {n for n, v in vs.items() if v.is_cuda and variants.driver_runs(v.cuda, host)} == runs
        picked, why = variants.pick_auto(vs, host)
        assert picked.name == max(runs, key=lambda n: variants.cuda_version(vs[n].cuda))
    assert why.endswith(f"driver {driver}, whose CUDA version NVML could not read (picked by the driver version)")


def test_auto_refuses_in_one_line_where_nvml_read_neither_the_cuda_nor_the_driver_version(settings):
    """NVML's CUDA version left as "" used to be int("") in driver_runs: a ValueError traceback in doctor, plan, run."""
    vs = variants.all_variants(settings)
    with pytest.raises(DockyardError, match=r"auto cannot pick a variant: the driver \(NVML could not read its "
                                            r"version\), whose CUDA version NVML could not read.*--variant=cu128"):
        variants.pick_auto(vs, Host(gpus=[H100]))
    too_old = Host(driver="470.256.02", gpus=[H100])  # older than every variant needs, by the version alone
    with pytest.raises(DockyardError, match=r"driver 470\.256\.02, whose CUDA version NVML could not read, older "
                                            "than every CUDA variant"):
        variants.pick_auto(vs, too_old)


# Compute capabilities of real GPUs: V100 7.0, T4 7.5, A100 8.0, L40S 8.9, H100 9.0, B200 10.0, Thor 11.0, RTX 5090 12.0,
# DGX Spark 12.1, P100 6.0.
@pytest.mark.parametrize("archs, capability, runs", [
    ("7.5;8.0;8.6;9.0;10.0;12.0", "7.0", False),   # no Volta code
    ("7.0;7.5;8.0;8.6;9.0;10.0;12.0", "7.0", True),
    ("7.5;8.0;8.6;9.0;10.0;12.0", "8.9", True),    # sm_86 machine code runs on 8.9 (same major, lower minor)
    ("7.5;8.0;8.6;9.0;10.0;12.0", "12.1", True),
    ("7.5;8.0;8.6;9.0;10.0;12.0", "6.0", False),   # Pascal: older than everything
    ("7.5;8.0;8.6;9.0;10.0;12.0", "11.0", False),  # a major with no code and no PTX below it to JIT
    ("7.5;8.0;9.0+PTX", "11.0", True),             # PTX at or below it is JIT-compiled
    ("8.0;9.0", "7.5", False),                     # machine code never runs on an older GPU
])
def test_a_gpu_runs_a_build_that_has_code_for_its_architecture(archs, capability, runs):
    assert variants.arch_runs(archs, capability) is runs


V100 = Gpu(1, "Tesla V100-SXM2-32GB", 32 * 2**30, capability="7.0")
P100 = Gpu(2, "Tesla P100-PCIE-16GB", 16 * 2**30, capability="6.0")


def test_auto_skips_a_variant_without_code_for_the_gpus(settings):
    """A V100 on a CUDA 13 driver: cu132's torch has no sm_70, so auto picks cu128, which has."""
    host = Host(driver="580.65.06", cuda="13.0", gpus=[V100])
    v, _ = variants.resolve(settings, "auto", host)
    assert v.name == "cu128"
    with pytest.raises(DockyardError, match=r"no variant this driver runs has GPU code for GPU 2 \(Tesla P100"):
        variants.resolve(settings, "auto", Host(driver="580.65.06", cuda="13.0", gpus=[P100]))


def test_run_refuses_an_image_without_code_for_a_gpu(settings):
    from dockyard.launch.command import check_gpu_host

    cu132 = variants.resolve(settings, "cu132")[0]
    with pytest.raises(DockyardError, match=r"cu132's torch has no code for GPU 1 \(Tesla V100-SXM2-32GB, 7\.0\)"):
        check_gpu_host(settings, cu132, Host(driver="580.65.06", cuda="13.0", gpus=[V100]), {}, False)
    check_gpu_host(settings, variants.resolve(settings, "cu128")[0], Host(driver="580.65.06", cuda="13.0", gpus=[V100]),
                   {}, False)


def test_the_devel_option_builds_the_same_lock_from_a_registry_base_with_nvcc(settings):
    cu128 = variants.resolve(settings, "cu128")[0]
    devel = cu128.on_devel_base()
    assert devel.base.startswith("nvidia/cuda:12.8") and "devel" in devel.base and devel.toolkit == "base"
    assert devel.lock_file == cu128.lock_file and devel.pins == cu128.pins and devel.python == cu128.python
    assert "FUSED_ADAM" in devel.ds_ops and f"python{devel.python}" in devel.os_packages
    with pytest.raises(DockyardError, match=r"variant cu132 has no devel base"):
        variants.resolve(settings, "cu132")[0].on_devel_base()


def test_a_variants_file_with_unreadable_torch_archs_is_refused_in_one_line(tmp_path):
    import yaml

    from dockyard.settings import ROOT

    raw = yaml.safe_load((ROOT / "images" / "variants.yaml").read_text())
    raw["variants"]["cu128"]["torch_archs"] = "7.0;eight"
    bad = tmp_path / "variants.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(DockyardError, match=r"invalid variants file .*: torch_archs '7\.0;eight': takes compute "
                       "capabilities") as e:
        variants._load(bad)
    assert "\n" not in str(e.value)


def test_an_unreadable_gpu_capability_is_given_the_benefit_of_the_doubt():
    assert variants.arch_runs("7.5;8.0", "") and variants.arch_runs("7.5;8.0", "n/a")


@pytest.mark.parametrize("content,says", [
    (None, r"cannot read the variants file .* \(Is a directory\)"),
    (b"variants: [x\n", r"is not valid YAML: expected ',' or '\]', but got '<stream end>' at line 2, column 1"),
    (b"variants:\n  cpu: !!float x\n", r"is not valid YAML: could not convert string to float"),
    (b"\xff\xfevariants: {}\n", r"is not UTF-8 text \(invalid start byte at byte 0\)"),
    (b"- variants\n", r"expected a `variants:` mapping"),
    (b"variants:\n  cpu: 5\n", r"invalid variants file .*: .*must be a mapping"),
])
def test_a_broken_variants_file_is_one_error_naming_the_file(tmp_path, content, says):
    path = tmp_path / "variants.yaml"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(DockyardError, match=says) as e:
        variants._load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_every_task_refuses_a_variants_file_that_is_a_folder_in_one_line(tmp_path):
    from tests.support.cli import invoke_here, short_error

    short_error(invoke_here("doctor", env={"INVOKE_DOCKYARD_VARIANTS_FILE": str(tmp_path)}), str(tmp_path))



@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["missing", "a folder"])
def test_a_variants_file_not_read_names_the_variable_it_may_have_been_set_by(tmp_path, make):
    """INVOKE_DOCKYARD_VARIANTS_FILE naming a file gone or a folder was answered "set `variants_file` in invoke.yaml",
    which holds the right one: the user looked there for what the variable set."""
    path = tmp_path / "variants.yaml"
    make(path)
    with pytest.raises(DockyardError, match=r"set `variants_file` in invoke.yaml \(or INVOKE_DOCKYARD_VARIANTS_FILE\)"):
        variants._load(path)


def test_a_variants_file_setting_a_key_twice_or_pinning_no_torch_is_refused(tmp_path):
    """A second `os_packages:` under a variant silently replaced the first; `torch: ""` built an image labelled with
    no torch."""
    from dockyard.settings import ROOT

    text = (ROOT / "images" / "variants.yaml").read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(text.replace("    os_packages: [python3, python3-venv, python3-dev]\n",
                                  "    os_packages: [python3, python3-venv, python3-dev]\n    os_packages: [curl]\n", 1))
    with pytest.raises(DockyardError, match=r"'os_packages' is set twice .* at line \d+"):
        variants._load(twice)
    no_torch = tmp_path / "no-torch.yaml"
    no_torch.write_text(text.replace('torch: "2.13.0+cpu"', 'torch: ""', 1))
    with pytest.raises(DockyardError, match=r"variant cpu in .* pins no torch version"):
        variants._load(no_torch)


@pytest.mark.parametrize("edit,says", [
    # a name is a lock file's and a tag's part: `invoke lock --variant=../../x` wrote outside images/locks
    (lambda raw: raw["variants"].update({"../../../tmp/pwn": raw["variants"]["cpu"]}), r"name '[./]*tmp/pwn': takes a word"),
    (lambda raw: raw["variants"]["cu132"].update(cuda="13.x"), r"cuda '13\.x': takes a CUDA version"),  # doctor's ValueError
    (lambda raw: raw["variants"]["cpu"].update(python="3.11; id"), r"python '3\.11; id': takes a Python 3 version"),
    (lambda raw: raw["variants"]["cpu"]["pins"].update(peft="0.21.2\n--index-url http://127.0.0.1:9/simple"),
     r"pins\.peft '0\.21\.2\\n--index-url .*': takes one exact version \(2\.1\.0, 2\.13\.0\+cpu\)"),
    (lambda raw: raw["variants"]["cpu"]["pins"].update(peft=">=0.1"), r"pins\.peft '>=0\.1': takes one exact version"),
    (lambda raw: raw["variants"]["cpu"]["pins"].update({"bad name": "1.0"}),
     r"pins: 'bad name' is not a package name: name each pin as pip does"),
    (lambda raw: raw["variants"]["cpu"].update(ds_ops=["BOGUS_OP"]), r"unknown DeepSpeed op\(s\) BOGUS_OP"),
    (lambda raw: raw["variants"]["cu132"].update(base="nvidia/cuda:13.2 devel"), r"base '.*devel': an image name"),
    (lambda raw: raw["variants"]["cu128"]["devel"].update(base=""), r"devel.base '': an image name: "),
    (lambda raw: raw["variants"].pop("cpu"), r"defines no `cpu` variant"),  # a KeyError traceback in auto's choice
    (lambda raw: raw["variants"].update(x=None), r"variant 'x' must be a mapping of its fields \(it is NoneType\)"),
    # the third red-team pass: apt options through os_packages, a late-failing arch list, odd names, no torch
    (lambda raw: raw["variants"]["cpu"].update(os_packages=["python3", "-oAPT::Update::Pre-Invoke::=id", "*"]),
     r"variant 'cpu': os_packages\.1 '.*': takes a Debian package's name"),
    (lambda raw: raw["variants"]["cu132"].update(torch_cuda_arch_list="sm_90; banana"),
     r"variant 'cu132': torch_cuda_arch_list '.*': takes compute capabilities"),
    (lambda raw: raw["variants"].update(auto=raw["variants"]["cpu"]), r"variant 'auto': `auto` is --variant's word"),
    (lambda raw: raw["variants"]["cpu"].update(name="cpu"), r"variant 'cpu': its name is the key above"),
    (lambda raw: raw["variants"]["cu132"].update(cuda=13.2), r"variant 'cu132': cuda 13\.2: takes text"),
])
def test_a_variants_file_of_hostile_or_odd_values_is_refused_in_one_line(tmp_path, edit, says):
    import yaml

    from dockyard.settings import ROOT

    raw = yaml.safe_load((ROOT / "images" / "variants.yaml").read_text())
    edit(raw)
    bad = tmp_path / "variants.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(DockyardError, match=r"invalid variants file .*" + says) as e:
        variants._load(bad)
    assert "\n" not in str(e.value)
    assert "{'" not in str(e.value), "a mapping's problem names its entry, not 60 characters of the whole"


def test_build_then_run_on_one_command_line_says_how_the_variant_was_chosen_once():
    """`invoke build run` chooses the variant in each task: the same `auto → ...` line twice read as two choices."""
    from tests.support.cli import invoke

    r = invoke("build", "--dry", "run", "--recipe=ddp", "--dry")
    assert r.returncode == 0, r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("auto → ")]
    assert len(said) == 1 and said[0].startswith("auto → cpu"), said


# nvidia/cuda:12.8.1's NVIDIA_REQUIRE_CUDA, shortened: CUDA 12.8, or one of the driver branches it names on the brands
# it names (GeForce and TITAN are not among them)
REQUIRE_128 = ("cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=tesla,driver>=470,driver<471 "
               "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=550,driver<551")


@pytest.mark.parametrize(("driver", "cuda", "refused"), [
    ("530.30.02", "12.1", "cuda>=12.8"),   # no branch of it: the toolkit refuses, whatever the GPU
    ("535.183.01", "12.2", ""),            # its 535 branch, on a GPU whose brand NVML did not say: may
    ("570.133.20", "12.8", ""),            # cuda>=12.8 holds
    ("545.23.08", "", ""),                 # CUDA version unread: cannot tell, not refused
])
def test_the_toolkits_require_cuda_is_read_as_it_reads_it(driver, cuda, refused):
    """Alternatives apart by spaces, conditions apart by commas that must all hold: a refusal is predicted only where
    every alternative fails on what NVML says, never on a brand it was not asked."""
    assert variants.require_refuses(REQUIRE_128, Host(driver=driver, cuda=cuda)) == refused
    assert variants.require_refuses("", Host(driver=driver, cuda=cuda)) == ""  # the Debian-based builds set none


def test_a_require_cuda_of_a_number_past_nine_digits_is_read_as_one_that_may_hold():
    """An image's NVIDIA_REQUIRE_CUDA of a 5000-digit version (a crafted image, loaded or pulled) ended `invoke run`,
    shell and doctor in a traceback (int()'s limit of 4300 digits); one of other digits (\\d matched Arabic-Indic
    ones) was compared as a version, where run.sh read neither. Both are conditions read as may-hold, as any other
    the host cannot read."""
    host = Host(driver="535.183.01", cuda="12.2")
    assert variants.require_refuses("cuda>=1" + "0" * 5000, host) == ""
    assert variants.require_refuses("cuda>=\u0661\u0663.\u0660", host) == ""
    assert variants.require_refuses("cuda>=999999999", host) == "cuda>=999999999"  # 9 digits: read


@pytest.mark.parametrize(("brands", "refused"), [
    (["tesla"], ""),                        # a V100: its brand is named
    (["nvidia"], ""),                       # a T4, an H100 (NVML_BRAND_NVIDIA): the toolkit calls it Unknown
    (["nvidiartx"], ""),                    # an RTX A6000: brand=nvidiartx, and Unknown to the toolkit
    (["geforce"], "cuda>=12.8"),            # a GeForce on 535: docker's "unsatisfied condition: cuda>=12.8"
    (["titan"], "cuda>=12.8"),
    (["tesla", "geforce"], "cuda>=12.8"),   # the toolkit holds every GPU the container is given to it
    ([""], ""),                             # a brand NVML did not say (a recording made before it was read): may
])
def test_a_brand_condition_is_held_against_each_gpus_brand_as_the_toolkit_names_it(brands, refused):
    """A brand= was taken as may-hold, the GPU's brand never read: a GeForce on a 535 driver passed invoke run's
    check and docker's NVIDIA toolkit then refused the devel image at start. NVML's brand now decides it, as
    libnvidia-container does: its own name for the six brands it names, "unknown" for the rest (NVIDIA, NVIDIA RTX)."""
    host = Host("535.183.01", "12.2", [Gpu(i, "GPU", 1 << 30, brand=b) for i, b in enumerate(brands)])
    assert variants.require_refuses(REQUIRE_CUDA_128, host) == refused
    assert [g.brand for g in variants.refused_for_brand(REQUIRE_CUDA_128, host)] == [b for b in brands if b in (
        "geforce", "titan")]
    assert variants.require_refuses("cuda>=12.8 brand!=GeForce,driver>=535", host) == (  # != and case as the toolkit
        "cuda>=12.8" if "geforce" in brands else "")
    old = Host("530.30.02", "12.1", host.gpus)  # no 530 branch on any brand: refused, and not for the brand
    assert variants.require_refuses(REQUIRE_CUDA_128, old) == "cuda>=12.8" and not variants.refused_for_brand(
        REQUIRE_CUDA_128, old)
