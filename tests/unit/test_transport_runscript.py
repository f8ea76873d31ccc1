"""run.sh, rendered from `invoke run`'s plan: valid POSIX sh, the same docker flags and torchrun line, and hostile
file names and overrides reaching docker as single words, never run. A stand-in `docker` on PATH records the argv
(the real script on a real node: tests/integration/test_userwork.py)."""

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from dockyard import ROOT
from dockyard.common import envvars
from dockyard.common.recipes import closest_recipe, folder_names
from dockyard.gpus import Gpu, Host
from dockyard.images import variants
from dockyard.launch import command as launch_command
from dockyard.launch import run as launch_run
from dockyard.launch import runscript
from tests.support.archive_sets import make_set, reseal

FAKE_DOCKER = """#!/bin/sh
case "$1" in
info) [ -z "${FAKE_INFO_ERROR-}" ] || { echo "$FAKE_INFO_ERROR" >&2; exit 1; }
      case "$*" in *Runtimes*) [ -z "$FAKE_GPUS" ] || echo '{"nvidia":{},"runc":{}}' ;;
                   *SecurityOptions*) echo "${FAKE_SECURITY-[\"name=seccomp,profile=default\"]}" ;; esac ;;
image) if [ "$2" = ls ]; then  # the images FAKE_LOADED names, of the variant a label filter asks for
           for r in ${FAKE_LOADED-}; do case "$* " in *"dockyard.variant=${r##*-} "*) echo "$r" ;; esac; done; exit 0
       fi
       for ref do :; done  # the image asked about: loaded when FAKE_LOADED names it (unset: every image)
       case " ${FAKE_LOADED-$ref} " in *" $ref "*) ;; *) echo "Error: No such image: $ref" >&2; exit 1 ;; esac
       case "$*" in
       *".Id}} {{index"*) echo "$FAKE_SET_ID ${ref##*-}" ;;
       *dockyard.variant*) echo "${ref##*-}" ;;
       *dockyard.cuda_archs*) for pair in $FAKE_ARCH_LABELS; do [ "${pair%%=*}" != "${ref##*-}" ] || echo "${pair#*=}"; done ;;
       *dockyard.cuda*) for pair in $FAKE_CUDA_LABELS; do [ "${pair%%=*}" != "${ref##*-}" ] || echo "${pair#*=}"; done ;;
       *Config.Env*) echo PATH=/usr/bin; [ -z "${FAKE_REQUIRE-}" ] || echo "NVIDIA_REQUIRE_CUDA=$FAKE_REQUIRE" ;;
       *) echo sha256:feed ;;
       esac ;;
run) case "$*" in  # run.sh's probe: the engine's memlock limit, then the recipe folders FAKE_RECIPES names, then
     # whether the --recipe it is given (its last word) is one of the folders inside the image FAKE_IMAGE_FOLDERS names
     *"ulimit -H -l"*) echo 8192; printf '%s\\n' "${FAKE_RECIPES-}" | while IFS= read -r r; do
         [ -z "$r" ] || echo "/opt/dockyard/recipes/$r"; done
         for last do :; done; case " ${FAKE_IMAGE_FOLDERS-} " in *" $last "*) echo in-image ;; esac ;;
     *) printf '%s\\0' "$@" >"$ARGV_OUT" ;; esac ;;
esac
"""
# nvidia-smi as a node's driver shows it: its header (driver, CUDA version), its list (-L) of FAKE_GPU_COUNT GPUs,
# its compute capabilities (--query-gpu: each GPU FAKE_CAP, 9.0 unless set, named FAKE_GPU_NAME),
# its query (-q, of all GPUs or -i one) whose Product Brand lines say FAKE_BRANDS (one per GPU, as -q writes them:
# "GeForce", "NVIDIA_RTX" for "NVIDIA RTX"; none where unset); with FAKE_SMI_ERROR, a driver that is installed but fails.
FAKE_SMI = """#!/bin/sh
[ -z "${FAKE_SMI_ERROR-}" ] || { printf '%s\\n' "$FAKE_SMI_ERROR"; exit 18; }
case "${1-}" in
-L) i=0
    while [ "$i" -lt "$FAKE_GPU_COUNT" ]; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i$i$i$i-uuid)"; i=$((i + 1)); done ;;
-q) echo "==============NVSMI LOG=============="; echo "Attached GPUs                             : $FAKE_GPU_COUNT"
    i=0
    for brand in ${FAKE_BRANDS-}; do
        if [ "${2-}" != -i ] || [ "$3" = "$i" ]; then
            echo "GPU 00000000:0$i:00.0"; echo "    Product Name                          : a GPU"
            echo "    Product Brand                         : $brand" | tr _ ' '
        fi
        i=$((i + 1))
    done ;;
--query-gpu=*) i=0
    while [ "$i" -lt "$FAKE_GPU_COUNT" ]; do
        echo "$i, ${FAKE_GPU_NAME-NVIDIA H100 80GB HBM3}, ${FAKE_CAP-9.0}"; i=$((i + 1))
    done ;;
'') echo "| NVIDIA-SMI $FAKE_DRIVER    Driver Version: $FAKE_DRIVER    CUDA Version: $FAKE_CUDA     |" ;;
esac
"""
HOSTILE = "it's a \"test\" $(touch pwned) `touch pwned2` ; rm -rf x"


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    """/usr/bin and /bin without NVIDIA's programs: a node without a driver, also on a host that has one."""
    folder = tmp_path_factory.mktemp("tools")
    for d in (Path("/usr/bin"), Path("/bin")):
        for f in d.iterdir():
            if not f.name.startswith("nvidia") and not (folder / f.name).exists():
                (folder / f.name).symlink_to(f)
    return folder


@pytest.fixture
def node(tmp_path, settings, tools):
    """A folder with run.sh for an image and a stand-in docker (an image's variant is its tag's end); returns a
    function that runs run.sh there, on a node with `gpus` GPUs (0: no NVIDIA driver, unless FAKE_SMI_ERROR says
    how its nvidia-smi fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)

    def run(*args: str, variant: str = "cpu", gpus: int = 0, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        (tmp_path / "run.sh").write_text(runscript.render(settings, "dockyard:0.1.0-" + variant, variant))
        smi = bin_dir / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if gpus or "FAKE_SMI_ERROR" in env:
            smi.write_text(FAKE_SMI)
            smi.chmod(0o755)
        out = tmp_path / "argv"
        out.unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}:{tools}", "ARGV_OUT": str(out), "HOME": str(tmp_path), "FAKE_GPUS": "1" if gpus else "",
               "FAKE_GPU_COUNT": str(gpus), "FAKE_DRIVER": "580.65.06", "FAKE_CUDA": "13.0",
               "FAKE_SET_ID": f"sha256:{'a' * 64}",  # what archive_set_of's manifests say the images are
               "FAKE_CUDA_LABELS": " ".join(f"{v.name}={v.cuda}" for v in variants.all_variants(settings).values()),
               "FAKE_ARCH_LABELS": " ".join(f"{v.name}={variants.cuda_archs(v)}"
                                            for v in variants.all_variants(settings).values() if v.is_cuda),
               **env}
        proc = subprocess.run(["sh", "run.sh", *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        return proc, out.read_bytes().decode().split("\0")[:-1] if out.exists() else []

    return run


def test_run_sh_is_valid_posix_sh(settings, tmp_path):
    for variant in ("cpu", "cu132"):
        script = tmp_path / f"run-{variant}.sh"
        script.write_text(runscript.render(settings, f"dockyard:0.1.0-{variant}", variant))
        assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
        if Path("/bin/dash").exists():
            assert subprocess.run(["dash", "-n", str(script)]).returncode == 0
        # load.sh's functions it is written with, each once and as load.sh has it
        loader = (ROOT / "dockyard" / "transport" / "load.sh").read_text()
        for name in runscript.LOADER_FUNCTIONS:
            assert script.read_text().count(f"\n{name}() {{") == 1 and f"\n{name}() {{" in loader, name


def test_run_sh_gives_docker_the_flags_and_torchrun_line_invoke_run_gives(node, settings, tmp_path):
    _, argv = node("--recipe=ddp", "--run-id=r1", "--", "--max_steps", "2")
    v = variants.resolve(settings, "cpu")[0]
    plan = launch_command.run_command(settings, recipe="ddp", variant=v, host=Host(), engine_info={},
                                      topo=launch_command.Topology(nproc=2), run_dir=tmp_path / "runs" / "r1",
                                      overrides=["--max_steps", "2"], image_id="sha256:feed", memlock="memlock=8388608",
                                      checkout_recipes=False, summarised=False)  # run.sh prints no summary: the trainer does
    want = plan.argv[1:]  # the docker binary aside (a setting)
    # and DOCKYARD_HOST_PATHS, every mount's host path for the trainer's lines, train.log and manifest, which each
    # names as its own host has them (test_run_sh_tells_the_trainer_the_host_path_of_every_mount,
    # test_inputs.py::test_the_trainer_is_told_the_host_path_of_every_folder_the_run_mounts)
    for words in (argv, want):
        at = words.index(next(a for a in words if a.startswith(f"{envvars.HOST_PATHS}=")))
        del words[at - 1:at + 1]
    hf, compiled = ":/workspace/.cache/huggingface", ":/workspace/.cache/compile"
    assert f"{tmp_path}/.cache/huggingface{hf}" in argv, "the node's own cache ($HF_HOME or ~/.cache/huggingface)"
    assert f"{tmp_path}/.cache/dockyard/compile{compiled}" in argv, "the node's own compile cache"
    assert f"{settings.path(settings.compile_cache)}{compiled}" in want
    assert [a for a in argv if not a.endswith((hf, compiled))] == [a for a in want if not a.endswith((hf, compiled))]


def test_run_sh_tells_the_trainer_the_host_path_of_every_mount(node, tmp_path):
    """The trainer's lines in a run.sh run named the container's paths ("the model is in /workspace/runs/r1/model",
    "data /workspace/inputs/data/x.jsonl"), where invoke run shows its streamed lines with this host's: run.sh names
    the host path of each mount in DOCKYARD_HOST_PATHS, whose paths the trainer says (errors.on_host)."""
    data = tmp_path / "my data" / "x.jsonl"
    data.parent.mkdir()
    data.write_text('{"text": "a"}\n')
    proc, argv = node("--run-id=m1", f"--data={data}", f"--recipe={ROOT / 'recipes' / 'lora'}")
    said = json.loads(next(a for a in argv if a.startswith(f"{envvars.HOST_PATHS}=")).partition("=")[2])
    mounts = dict(reversed(value.split(":")[:2]) for flag, value in itertools.pairwise(argv) if flag == "-v")
    assert said == mounts, proc.stderr
    assert said["/workspace/runs"] == str(tmp_path / "runs") and str(data) in said.values()


def test_run_sh_keeps_compiled_kernels_in_a_folder_of_the_users_that_nobody_else_can_write(node, tmp_path):
    proc, argv = node("--recipe=ddp", "--run-id=c1")
    folder = tmp_path / ".cache" / "dockyard" / "compile"
    assert argv, proc.stderr  # docker ran (the fake writes no manifest: run.sh then says so)
    assert f"{folder}:/workspace/.cache/compile" in argv
    assert "TORCHINDUCTOR_CACHE_DIR=/workspace/.cache/compile/inductor" in argv
    assert "TRITON_CACHE_DIR=/workspace/.cache/compile/triton" in argv
    assert "DOCKYARD_OPS_CACHE=/workspace/.cache/compile/extensions" in argv  # DeepSpeed's ops built on first use
    assert folder.stat().st_mode & 0o777 == 0o700, "made for this user alone"

    mine = tmp_path / "kernels"
    mine.mkdir(mode=0o755)
    linked = tmp_path / "kernels-link"
    linked.symlink_to(mine)  # a cache moved to a bigger disk: the folder it leads to is mounted
    proc, argv = node("--recipe=ddp", "--run-id=c2", DOCKYARD_COMPILE_CACHE=str(linked))
    assert argv, proc.stderr
    assert f"{mine}:/workspace/.cache/compile" in argv

    mine.chmod(0o775)  # a group could plant code the runs would execute
    proc, argv = node("--recipe=ddp", "--run-id=c3", DOCKYARD_COMPILE_CACHE=str(mine))
    assert proc.returncode == 1 and not argv
    assert f"the compile cache {mine} can be written by others" in proc.stderr
    assert f"chmod go-w {mine}" in proc.stderr
    assert not (tmp_path / "runs" / "c3").exists(), "refused before the run folder was made"

    mine.chmod(0o1777)  # a folder like /tmp: chmod'ing it is no fix
    proc, argv = node("--recipe=ddp", "--run-id=c3", DOCKYARD_COMPILE_CACHE=str(mine))
    assert proc.returncode == 1 and not argv and "chmod" not in proc.stderr
    assert f"the compile cache {mine} is a folder every user shares" in proc.stderr

    a_file = tmp_path / "kernels.txt"
    a_file.write_text("")
    proc, argv = node("--recipe=ddp", "--run-id=c4", DOCKYARD_COMPILE_CACHE=str(a_file))
    assert proc.returncode == 1 and not argv and "is not a folder" in proc.stderr


def test_hostile_names_and_overrides_reach_docker_as_single_words_and_never_run(node, tmp_path):
    data = tmp_path / HOSTILE
    data.mkdir()
    (data / "x.jsonl").write_text("{}\n")
    recipe = tmp_path / "my recipe's"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text("# sh run.sh\nwhen: x\nstrategy: ddp\n")
    proc, argv = node(f"--data={data}/x.jsonl", f"--recipe={recipe}", "--run-id=r2", "--", "--run_name", HOSTILE)
    assert argv, proc.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert f"{data}/x.jsonl:/workspace/inputs/data/x.jsonl:ro" in argv
    assert f"{recipe}:/workspace/recipes/my recipe's:ro" in argv
    assert argv[argv.index("--recipe") + 1] == "/workspace/recipes/my recipe's"
    assert argv[-4:] == ["--run_name", HOSTILE, "--data", "/workspace/inputs/data/x.jsonl"]
    assert "memlock=8388608" in argv, "the engine's own limit, as invoke run asks"
    assert "--gpus" not in argv


def test_a_cuda_image_without_gpus_trains_on_cpu_and_bad_input_is_refused(node):
    proc, argv = node("--run-id=r3", variant="cu132")
    assert "DS_ACCELERATOR=cpu" in argv and "--gpus" not in argv and "--nproc-per-node=2" in argv
    assert "training on CPU" in proc.stderr
    proc, argv = node("--data=/nonexistent/x.jsonl")
    assert proc.returncode == 1 and "no such file or folder on this node" in proc.stderr and not argv
    proc, argv = node("--run-id=../x")
    assert proc.returncode == 1 and "--run-id" in proc.stderr and not argv


def test_a_data_or_model_path_with_a_slip_in_its_name_is_answered_on_the_node_with_the_one_beside_it(node, tmp_path):
    """`sh run.sh --data=chat.jsnl` beside chat.jsonl was "no such file or folder on this node" alone: the entry
    beside it closest by name is named, as invoke run names it, and that one is mounted."""
    (tmp_path / "chat.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    for typed, meant in (("--data=chat.jsnl", "./chat.jsonl"), (f"--model={tmp_path}/models/tiyn",
                                                                f"{tmp_path}/models/tiny")):
        proc, argv = node(typed)
        assert proc.returncode == 1 and not argv, proc.stderr
        assert proc.stderr.endswith(f"{typed}: no such file or folder on this node (did you mean {meant}?)\n"), \
            proc.stderr
    proc, argv = node("--data=./chat.jsonl", "--run-id=m1")
    assert f"{tmp_path}/chat.jsonl:/workspace/inputs/data/chat.jsonl:ro" in argv, proc.stderr
    proc, argv = node("--data=zzz.jsonl")
    assert not argv and proc.stderr.endswith("--data=zzz.jsonl: no such file or folder on this node\n"), proc.stderr


def test_data_and_model_the_trainer_would_refuse_are_refused_before_docker_naming_this_nodes_path(node, tmp_path):
    """`sh run.sh --data=load.sh` started the container, which refused /workspace/inputs/data/load.sh (a path the
    user does not have) and left a failed run folder; a folder without config.json as --model likewise."""
    (tmp_path / "load.sh.bak").write_text("")
    (tmp_path / "notes").write_text("")
    (tmp_path / "m").mkdir()
    for folder, files in (("lora", ["adapter_config.json"]), ("both", ["adapter_config.json", "config.json"])):
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text("{}")
    os.mkfifo(tmp_path / "pipe.jsonl")
    for args, says in ((["--data=load.sh.bak"], "--data=load.sh.bak: unknown data file type .bak; use .jsonl .json "
                                                ".parquet .csv .txt"),
                       (["--data=notes"], "--data=notes: unknown data file type (none)"),
                       (["--data=pipe.jsonl"], "--data=pipe.jsonl: neither a file nor a folder"),
                       (["--model=m"], "--model=m: not a model folder (no config.json in it)"),
                       (["--model=lora"], "--model=lora: a LoRA adapter (adapter_config.json), not a model"),
                       (["--model=both"], "--model=both: holds a LoRA adapter (adapter_config.json) beside the model")):
        proc, argv = node("--run-id=in1", *args)
        assert proc.returncode == 1 and says in proc.stderr and not argv, proc.stderr
        assert not (tmp_path / "runs" / "in1").exists()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "d").mkdir()
    proc, argv = node("--run-id=in2", "--model=m", "--data=d")
    assert argv, proc.stderr


@pytest.mark.parametrize("nproc", ["0", "00", "4097", "99999999999999999999999", "two", "1.5", "-1"])
def test_a_process_count_out_of_invoke_runs_range_is_refused_before_docker(node, nproc):
    proc, argv = node("--run-id=r6", f"--nproc={nproc}")
    assert proc.returncode == 1 and not argv
    assert f"--nproc={nproc}: give a whole number of processes from 1 to 4096" in proc.stderr


def test_a_process_count_in_range_reaches_torchrun(node):
    for nproc in ("1", "4096"):
        proc, argv = node(f"--run-id=r7-{nproc}", f"--nproc={nproc}")
        assert f"--nproc-per-node={nproc}" in argv, proc.stderr


def test_a_cuda_image_on_a_gpu_node_gets_every_gpu_one_process_each(node):
    proc, argv = node("--run-id=r4", variant="cu132", gpus=4)
    assert argv[argv.index("--gpus") + 1] == "all" and "--nproc-per-node=4" in argv, proc.stderr
    assert "DS_ACCELERATOR=cpu" not in argv
    _, argv = node("--run-id=r5", variant="cpu", gpus=4)
    assert "--gpus" not in argv, "the cpu image has no use for GPUs"


def test_an_engine_docker_cannot_reach_is_said_in_docker_s_own_words_with_the_fix(node):
    denied = ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
              "dial unix /var/run/docker.sock: connect: permission denied")
    proc, argv = node("--run-id=r8", FAKE_INFO_ERROR=denied)
    assert proc.returncode == 1 and not argv
    assert proc.stderr.startswith(f"run.sh: docker cannot reach an engine: {denied} (add your user to the docker group")
    assert "sudo usermod -aG docker" in proc.stderr and len(proc.stderr.splitlines()) == 1


def archive_set_of(folder: Path, ref: str) -> str:
    """The set `invoke save` writes for the image `ref` (its manifest names it as load.sh reads it): its archive."""
    paths = make_set(folder, name=ref.replace(":", "_") + ".tar.zst")
    labels = {"dockyard.variant": ref.rsplit("-", 1)[1]} if ref.startswith("dockyard:") else {}
    reseal(paths, {"images": [{"ref": ref, "tags": [ref], "id": f"sha256:{'a' * 64}", "labels": labels, "diff_ids": []}],
                   "load_sh": {"check_images": f"{ref}=sha256:{'a' * 64}", "require_chains": "", "need_kb": "20"}})
    return paths.archive.name


def test_run_sh_trains_in_the_image_of_the_set_loaded_beside_it_not_the_last_one_saved(node, tmp_path):
    """`invoke save --variant=cu128` then `--variant=cu132` into one folder leave one run.sh, written for cu132; the
    node loaded the cu128 archive: that is the image run.sh trains in, with no --image."""
    cu128 = archive_set_of(tmp_path, "dockyard:0.1.0-cu128")
    archive_set_of(tmp_path, "dockyard:0.1.0-cu132")
    proc, argv = node("--run-id=s1", variant="cu132", FAKE_LOADED="dockyard:0.1.0-cu128")
    assert "dockyard:0.1.0-cu128" in argv and "dockyard:0.1.0-cu132" not in argv, proc.stderr
    proc, argv = node("--run-id=s2", variant="cu132", FAKE_LOADED="")
    assert proc.returncode == 1 and not argv
    assert "no image of the archives here" in proc.stderr and "sh load.sh NAME" in proc.stderr
    both = "dockyard:0.1.0-cu128 dockyard:0.1.0-cu132"
    # both loaded: the one this node's driver runs (the 535 driver runs cu128 only, as run.sh's refusal advised), else
    # the one run.sh was written for
    proc, argv = node("--run-id=s3", variant="cu132", gpus=2, FAKE_LOADED=both, FAKE_DRIVER="535.183.01",
                      FAKE_CUDA="12.2")
    assert "dockyard:0.1.0-cu128" in argv and "--gpus" in argv, proc.stderr
    proc, argv = node("--run-id=s3b", variant="cu132", FAKE_LOADED=both)
    assert "dockyard:0.1.0-cu132" in argv, proc.stderr
    # several, none of them the one run.sh was written for: the user picks
    archive_set_of(tmp_path, "dockyard:0.2.0-cu128")
    proc, argv = node("--run-id=s3c", variant="cu132", FAKE_LOADED="dockyard:0.1.0-cu128 dockyard:0.2.0-cu128")
    assert proc.returncode == 1 and not argv and "--image=REF" in proc.stderr
    assert "dockyard:0.1.0-cu128, dockyard:0.2.0-cu128" in proc.stderr
    (tmp_path / "dockyard_0.2.0-cu128.manifest.json").unlink()
    proc, argv = node("--run-id=s4", "--image=dockyard:0.1.0-cu132", variant="cu132",
                      FAKE_LOADED="dockyard:0.1.0-cu128 dockyard:0.1.0-cu132")
    assert "dockyard:0.1.0-cu132" in argv, proc.stderr
    (tmp_path / "dockyard_0.1.0-cu132.manifest.json").unlink()
    proc, argv = node("--run-id=s5", variant="cu132", FAKE_LOADED="")
    assert proc.returncode == 1 and f"the image of {cu128} is not loaded here: load it first, sh load.sh {cu128}" \
        in proc.stderr


def test_run_sh_takes_no_other_build_under_the_sets_tag_and_no_set_of_other_images(node, tmp_path):
    """A tag the set names, but held by another build (a rebuild kept the version tag; the new set was copied, not
    loaded): load the set. A set of images that are not dockyard's beside run.sh: it is not run.sh's business."""
    archive_set_of(tmp_path, "dockyard:0.1.0-cu128")
    proc, argv = node("--run-id=o1", variant="cu128", FAKE_LOADED="dockyard:0.1.0-cu128", FAKE_SET_ID="sha256:feed")
    assert proc.returncode == 1 and not argv and "another build" in proc.stderr and "sh load.sh" in proc.stderr
    (tmp_path / "dockyard_0.1.0-cu128.manifest.json").unlink()
    archive_set_of(tmp_path, "vllm:0.9")
    proc, argv = node("--run-id=o2", variant="cu132", FAKE_LOADED="vllm:0.9 dockyard:0.1.0-cu132")
    assert "dockyard:0.1.0-cu132" in argv, proc.stderr


def test_run_sh_finds_the_sets_beside_it_from_another_folder(node, tmp_path, tools):
    """`sh dist/run.sh` from above: the manifests beside run.sh, not in the current folder."""
    archive_set_of(tmp_path, "dockyard:0.1.0-cu128")
    (tmp_path / "elsewhere").mkdir()
    node("--run-id=s6", variant="cu132", FAKE_LOADED="dockyard:0.1.0-cu128")  # writes run.sh
    bin_dir = tmp_path / "bin"
    proc = subprocess.run(["sh", "../run.sh", "--dry", "--run-id=s7"], cwd=tmp_path / "elsewhere",
                          capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:{tools}", "HOME": str(tmp_path),
                               "FAKE_LOADED": "dockyard:0.1.0-cu128", "FAKE_GPUS": "", "FAKE_SET_ID": f"sha256:{'a' * 64}"})
    assert proc.returncode == 0 and "'dockyard:0.1.0-cu128'" in proc.stdout, proc.stderr


def test_run_sh_says_no_name_of_a_manifest_beside_it_that_holds_an_escape_sequence(node, tmp_path):
    """run.sh names the archives beside it when none of their images is loaded: a manifest there named with an escape
    sequence, or naming such an archive, reached the terminal as it was and drove it. It is skipped, and that is
    said."""
    escapes = "\x1b]0;owned\x07\x1b[2J"
    archive = archive_set_of(tmp_path, "dockyard:0.1.0-cu128")
    crafted = (tmp_path / "dockyard_0.1.0-cu128.manifest.json").read_text()
    (tmp_path / f"{escapes}.manifest.json").write_text(crafted)
    (tmp_path / "other.manifest.json").write_text(crafted.replace(archive, f"{escapes}.tar.zst"))
    proc, argv = node("--run-id=e1", variant="cu128", FAKE_LOADED="")
    assert proc.returncode == 1 and not argv and "\x1b" not in proc.stderr and "\x07" not in proc.stderr, \
        repr(proc.stderr)
    assert proc.stderr.splitlines() == [
        "run.sh: skipped 2 archive manifest(s) beside run.sh whose name, or the archive name in it, holds a control "
        "character or a byte outside ASCII, which none invoke save writes holds (said as it is, an escape sequence would "
        "drive the terminal)",
        f"run.sh: the image of {archive} is not loaded here: load it first, sh load.sh {archive}"]


def test_a_driver_that_is_installed_but_fails_stops_the_run_instead_of_training_on_cpu(node):
    """nvidia-smi fails as it does after a driver upgrade without a reboot: that is said, with the fix; it is no
    node without GPUs. --cpu trains on CPU anyway."""
    mismatch = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.65"
    proc, argv = node("--run-id=d1", variant="cu132", FAKE_SMI_ERROR=mismatch)
    assert proc.returncode == 1 and not argv and "training on CPU" not in proc.stderr
    assert "nvidia-smi fails here (Failed to initialize NVML: Driver/library version mismatch)" in proc.stderr
    assert "reboot" in proc.stderr and "--cpu" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc, argv = node("--run-id=d2", "--cpu", variant="cu132", FAKE_SMI_ERROR=mismatch)
    assert "DS_ACCELERATOR=cpu" in argv and "--gpus" not in argv, proc.stderr


def test_an_image_newer_than_the_driver_s_cuda_is_refused_naming_the_image_to_load(node):
    """A 535 driver (CUDA 12.2) and the cu132 image: inside, torch would find no usable GPU and train on CPU. run.sh
    refuses as invoke run does, naming the image this driver runs; cu128 runs there (minor-version compatibility)."""
    old = {"FAKE_DRIVER": "535.183.01", "FAKE_CUDA": "12.2"}
    proc, argv = node("--run-id=c1", variant="cu132", gpus=2, **old)
    assert proc.returncode == 1 and not argv and len(proc.stderr.splitlines()) == 1
    assert "image cu132 needs CUDA 13.2 but driver 535.183.01 supports CUDA 12.2: load the cu128 image " \
           "(invoke save --variant=cu128, then sh load.sh NAME here) or upgrade the driver to 580 or newer" in proc.stderr
    # the image to use instead loaded already: named, not "load it" (a CUDA 12 node given --image of cu132)
    proc, argv = node("--run-id=c1b", variant="cu132", gpus=2, **old,
                      FAKE_LOADED="dockyard:0.1.0-cu132 dockyard:0.1.0-cu128")
    assert proc.returncode == 1 and not argv and len(proc.stderr.splitlines()) == 1
    assert "supports CUDA 12.2: dockyard:0.1.0-cu128 is loaded here and runs on this driver: " \
           "--image=dockyard:0.1.0-cu128; or upgrade the driver to 580 or newer" in proc.stderr, proc.stderr
    proc, argv = node("--run-id=c2", variant="cu128", gpus=2, **old)
    assert argv[argv.index("--gpus") + 1] == "all" and "--nproc-per-node=2" in argv, proc.stderr
    proc, argv = node("--run-id=c3", "--cpu", variant="cu132", gpus=2, **old)
    assert "DS_ACCELERATOR=cpu" in argv and "--gpus" not in argv, proc.stderr


@pytest.mark.parametrize("driver, cuda", [("535.183.01", "12.2"), ("580.65.06", "13.0")])
def test_an_image_without_code_for_the_node_s_gpus_is_refused_naming_the_image_that_has(node, driver, cuda):
    """Two V100s and the cu132 image (README's step 1 gives cu132 to drivers from 580 on): on 580 run.sh started it
    and torch stopped at its first kernel in the container, cu132's torch having no sm_70; on 535 it was told to
    upgrade the driver to 580, on which the same happened. It is refused for the GPUs, naming cu128, which has them."""
    v100 = {"FAKE_DRIVER": driver, "FAKE_CUDA": cuda, "FAKE_CAP": "7.0", "FAKE_GPU_NAME": "Tesla V100-SXM2-16GB"}
    proc, argv = node("--run-id=a1", variant="cu132", gpus=2, **v100)
    assert proc.returncode == 1 and not argv and len(proc.stderr.splitlines()) == 1
    assert ("image dockyard:0.1.0-cu132's torch has no code for GPU 0 (Tesla V100-SXM2-16GB, 7.0), GPU 1 "
            "(Tesla V100-SXM2-16GB, 7.0)") in proc.stderr and "upgrade the driver" not in proc.stderr
    assert "load the cu128 image (invoke save --variant=cu128, then sh load.sh NAME here)" in proc.stderr
    proc, argv = node("--run-id=a2", variant="cu128", gpus=2, **v100)
    assert argv[argv.index("--gpus") + 1] == "all" and "--nproc-per-node=2" in argv, proc.stderr


def test_without_a_cuda_version_the_driver_s_own_version_decides(node):
    """An nvidia-smi whose header gives no CUDA version: the least driver of each CUDA major decides, as in invoke run."""
    proc, argv = node("--run-id=c4", variant="cu128", gpus=1, FAKE_DRIVER="470.256.02", FAKE_CUDA="N/A")
    assert proc.returncode == 1 and not argv
    assert "image cu128 needs CUDA 12.8 but driver 470.256.02: upgrade the driver to 525.60.13 or newer" in proc.stderr
    proc, argv = node("--run-id=c5", variant="cu128", gpus=1, FAKE_DRIVER="550.54.15", FAKE_CUDA="N/A")
    assert "--gpus" in argv, proc.stderr


def test_a_cuda_12_driver_below_the_least_for_cuda_12_is_refused_as_invoke_run_refuses_it(node):
    """525.60.11 says CUDA 12.0 and is below 525.60.13 (NVIDIA's least for CUDA 12.x builds): run.sh passed it on the
    CUDA major alone."""
    proc, argv = node("--run-id=c6", variant="cu128", gpus=1, FAKE_DRIVER="525.60.11", FAKE_CUDA="12.0")
    assert proc.returncode == 1 and not argv
    assert "image cu128 needs CUDA 12.8 but driver 525.60.11 supports CUDA 12.0: upgrade the driver to 525.60.13 or " \
           "newer" in proc.stderr
    proc, argv = node("--run-id=c7", variant="cu128", gpus=1, FAKE_DRIVER="525.60.13", FAKE_CUDA="12.0")
    assert "--gpus" in argv, proc.stderr


@pytest.mark.parametrize(("visible", "device", "nproc"), [
    ("1", '"device=1"', 1), ("GPU-1111-uuid", '"device=1"', 1), ("GPU-11", '"device=1"', 1),  # a unique start
    ("2, 0", '"device=2,0"', 2), ("0,0", '"device=0"', 1), ("1,2,", '"device=1,2"', 2),
    ("0,,1", '"device=0"', 1), ("2,-1,1", '"device=2"', 1),  # CUDA reads no further than an entry naming no device
    (None, "all", 3)])
def test_cuda_visible_devices_picks_the_gpus_docker_gets_one_process_each(node, visible, device, nproc):
    """As invoke run reads it: indices or UUIDs, up to an entry naming no device, as CUDA reads them (`0,,1` trained
    on GPUs 0 and 1, where CUDA sees GPU 0 alone); docker gets the indices as its device list."""
    proc, argv = node("--run-id=v1", variant="cu132", gpus=3, **({} if visible is None else
                                                                 {"CUDA_VISIBLE_DEVICES": visible}))
    assert argv[argv.index("--gpus") + 1] == device and f"--nproc-per-node={nproc}" in argv, proc.stderr
    cut = visible in ("0,,1", "2,-1,1")  # said where GPUs named after the stop are left out
    assert (f"CUDA_VISIBLE_DEVICES={visible} leaves GPU" in proc.stderr) == cut, proc.stderr
    if cut:  # the entry it stops at, said once ("its entry '-1'-1" where ${token:-...} gave the entry again)
        stop = "entry '-1'" if "-1" in visible else "empty entry"
        assert f"CUDA reads no further than its {stop}\n" in proc.stderr, proc.stderr


@pytest.mark.parametrize("visible", ["3", "-1", "GPU-nope", ",", "0;touch x", ""])
def test_cuda_visible_devices_naming_no_gpu_of_the_node_is_refused(node, visible):
    proc, argv = node("--run-id=v2", variant="cu132", gpus=2, CUDA_VISIBLE_DEVICES=visible)
    assert proc.returncode == 1 and not argv and "CUDA_VISIBLE_DEVICES" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "nvidia-smi -L lists them" in proc.stderr
    if visible == "3":
        assert "GPU 3 (from CUDA_VISIBLE_DEVICES=3) is not on this node: it has 0, 1" in proc.stderr


def test_a_mig_device_or_more_processes_than_the_gpus_chosen_is_refused(node):
    """Runs take whole GPUs (a MIG device's UUID is no GPU of nvidia-smi -L); a second process would ask for a GPU the
    container does not have: both are said, as invoke run says them."""
    proc, argv = node("--run-id=m1", variant="cu132", gpus=2, CUDA_VISIBLE_DEVICES="MIG-c6d4f1ef-1234")
    assert proc.returncode == 1 and not argv and "names a MIG device (MIG-c6d4f1ef-1234)" in proc.stderr
    proc, argv = node("--run-id=m2", "--nproc=2", variant="cu132", gpus=2, CUDA_VISIBLE_DEVICES="1")
    assert proc.returncode == 1 and not argv
    assert "--nproc=2 but this node has 1 GPU(s) in CUDA_VISIBLE_DEVICES: one process per GPU" in proc.stderr


@pytest.mark.parametrize("options", [["name=seccomp,profile=default"], ["name=seccomp,profile=default", "name=rootless"],
                                     ["name=seccomp,profile=default", "name=userns"]])
def test_run_sh_starts_the_container_as_invoke_run_does_on_a_rootless_or_remapping_engine(node, options):
    """Rootless Docker maps the container's root to the user and any other uid to a subordinate one, userns-remap maps
    them all: `--user $(id -u):$(id -g)` could not write the run folder there. run.sh asks the node's engine and picks
    the flags `invoke run` picks for the same `docker info` (engine.host_sharing_flags; tests/integration/
    test_engine_userns.py runs a real remapping engine)."""
    import json

    from dockyard import engine

    _, argv = node("--recipe=ddp", FAKE_SECURITY=json.dumps(options))
    want = engine.host_sharing_flags({"SecurityOptions": options})
    at = argv.index(want[0])
    assert argv[at:at + len(want)] == want and argv.count("--user") == 1 and argv.count("--ipc=host") <= 1


def test_disable_require_runs_an_image_newer_than_the_driver_as_invoke_run_does(node, settings, tmp_path):
    """CUDA forward compatibility (a datacenter GPU with the cuda-compat package) runs a CUDA 13 image on a 535 driver;
    `invoke run --disable-require` allowed it, run.sh, the node's only launcher, had no such option and refused."""
    old = {"FAKE_DRIVER": "535.183.01", "FAKE_CUDA": "12.2"}
    proc, argv = node("--run-id=f1", "--disable-require", variant="cu132", gpus=2, **old)
    assert argv[argv.index("--gpus") + 1] == "all" and "--nproc-per-node=2" in argv, proc.stderr
    v = variants.resolve(settings, "cu132")[0]
    host = Host("535.183.01", "12.2", [Gpu(0, "H100", 80 << 30)])
    plan = launch_command.run_command(settings, recipe="ddp", variant=v, host=host, engine_info={},
                                      topo=launch_command.Topology(nproc=2), run_dir=tmp_path / "r",
                                      overrides=[], disable_require=True, checkout_recipes=False)
    wanted = [a for a in plan.argv if a.startswith("NVIDIA_DISABLE_REQUIRE")]
    assert wanted and all(a in argv for a in wanted)


# nvidia/cuda:12.8.1's NVIDIA_REQUIRE_CUDA, shortened (as tests/unit/test_variants.py has it): CUDA 12.8, or one of the
# driver branches it names on the brands it names
def test_nccls_settings_of_the_nodes_own_transport_reach_the_container_and_no_network_name(node):
    """`NCCL_P2P_DISABLE=1 sh run.sh` (the way out of a hang on GPUs whose P2P is claimed and broken) reached no
    container: run.sh passed none of the node's NCCL settings. It passes those of the node's own transport and log by
    name (docker takes the value from run.sh's environment), as invoke run does, and no name of a network or an
    interface (the container has a network of its own)."""
    proc, argv = node("--run-id=n1", variant="cu132", gpus=2, NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO",
                      NCCL_SOCKET_IFNAME="ib0", NCCL_NET="IB", NCCL_IB_HCA="mlx5_0", NCCL_P2P_LEVEL="NVL")
    passed = {argv[i + 1] for i, w in enumerate(argv[:-1]) if w == "-e"}
    assert {"NCCL_P2P_DISABLE", "NCCL_DEBUG", "NCCL_P2P_LEVEL"} <= passed, (passed, proc.stderr)
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_NET", "NCCL_IB_HCA"} & {p.partition("=")[0] for p in passed}, passed
    _, argv = node("--run-id=n2", variant="cu132", gpus=2)
    assert not [w for w in argv if w.startswith("NCCL_")], argv


def test_dry_leaves_a_run_folder_it_did_not_make_and_takes_away_the_one_it_made(node, tmp_path):
    """`sh run.sh --dry --run-id=ID` removed the folder runs/ID where it was there already and empty (one the user
    made for the run, to set its owner or a quota): --dry changes nothing. The folder a --dry made for its own plan
    is still taken away."""
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    proc, _ = node("--dry", "--run-id=mine")
    assert proc.returncode == 0 and "'docker' 'run'" in proc.stdout, proc.stderr
    assert (tmp_path / "runs" / "mine").is_dir()
    proc, _ = node("--dry", "--run-id=fresh")
    assert proc.returncode == 0 and not (tmp_path / "runs" / "fresh").exists(), proc.stderr


REQUIRE_128 = ("cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=tesla,driver>=470,driver<471 "
               "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=550,driver<551")


def test_an_image_whose_nvidia_require_cuda_leaves_the_driver_out_is_refused_before_docker_as_invoke_run_does(node):
    """A --devel cu128 image (FROM nvidia/cuda: NVIDIA_REQUIRE_CUDA cuda>=12.8 or some driver branches) on a 530
    driver (CUDA 12.1, which runs CUDA 12.8 builds): run.sh passed its own driver check and docker refused at start
    ("unsatisfied condition: cuda>=12.8"); invoke run refuses first, saying --disable-require. run.sh now does the
    same. The GPU is faked: a stand-in nvidia-smi (the driver's header) and docker (the image's env) on PATH."""
    old = {"FAKE_DRIVER": "530.30.02", "FAKE_CUDA": "12.1", "FAKE_REQUIRE": REQUIRE_128}
    for dry in ([], ["--dry"]):
        proc, argv = node("--run-id=q1", *dry, variant="cu128", gpus=2, **old)
        assert proc.returncode == 1 and not argv and not proc.stdout and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr == (
            "run.sh: image dockyard:0.1.0-cu128 sets NVIDIA_REQUIRE_CUDA cuda>=12.8 (from its base image), and driver "
            "530.30.02 supports CUDA 12.1: the NVIDIA toolkit would refuse to start it. --disable-require starts it (a "
            "CUDA 12 driver runs any CUDA 12 build), or load the cu128 image built without --devel (invoke build "
            "--variant=cu128, then invoke save)\n")
    proc, argv = node("--run-id=q2", "--disable-require", variant="cu128", gpus=2, **old)
    assert "NVIDIA_DISABLE_REQUIRE=1" in argv and argv[argv.index("--gpus") + 1] == "all", proc.stderr
    proc, argv = node("--run-id=q3", "--cpu", variant="cu128", gpus=2, **old)  # no GPU, no toolkit
    assert "DS_ACCELERATOR=cpu" in argv, proc.stderr
    proc, argv = node("--run-id=q4", variant="cu128", gpus=2, **{**old, "FAKE_REQUIRE": ""})  # the Debian-based build
    assert "--gpus" in argv and "NVIDIA_DISABLE_REQUIRE=1" not in argv, proc.stderr


@pytest.mark.parametrize(("driver", "cuda", "require"), [
    ("530.30.02", "12.1", REQUIRE_128),     # no alternative holds
    ("535.183.01", "12.2", REQUIRE_128),    # its 535 branch on a Tesla: may (nvidia-smi is not asked the brand)
    ("570.133.20", "12.8", REQUIRE_128),    # cuda>=12.8 holds
    ("545.23.08", "N/A", REQUIRE_128),      # no CUDA version in the header: cannot tell
    ("580.65.06", "13.0", "cuda>=13.1"),    # one alternative, its CUDA minor above the driver's
    ("560.35.03", "12.6", "driver>=570,driver<571 driver>=575"),  # none names CUDA: the first is said
    ("560.35.03", "12.6", "cuda>=12.6.0"),  # 12.6 is before 12.6.0, as invoke run compares them
    ("560.35.03", "12.6", "cuda=>12.1 cuda>=12.8"),  # a condition it cannot read may hold
    ("560.35.03", "12.6", "brand=\x1b[2J,driver>=570"),  # the image's escape sequence is not said as it is
    ("560.35.03", "12.6", "cuda>=1" + "0" * 5000),  # a number past int()'s 4300 digits: a traceback, now unread
    ("560.35.03", "12.6", "cuda>=1000000000 cuda>=12.8"),  # of 10 digits: unread by both (may hold)
    ("560.35.03", "12.6", "cuda>=\u0661\u0663.\u0660"),  # Arabic-Indic digits, which Python's \d took: unread
    ("560.35.03", "12.6", "cuda>=99\x1ccuda>=98"),  # \x1c is no blank to the toolkit nor awk (str.split's)
])
def test_run_sh_reads_nvidia_require_cuda_as_invoke_run_reads_it(node, driver, cuda, require):
    """The same requirement on the same driver: run.sh refuses where invoke run (variants.require_refuses) does, naming
    the same condition, and starts where it does not (stand-in nvidia-smi and docker on PATH, as above)."""
    refused = variants.require_refuses(require, Host(driver=driver, cuda=cuda if cuda != "N/A" else ""))
    proc, argv = node("--run-id=q5", variant="cu128", gpus=1, FAKE_DRIVER=driver, FAKE_CUDA=cuda, FAKE_REQUIRE=require)
    if refused:
        said = "".join(c if " " <= c <= "~" else "?" for c in refused)
        assert proc.returncode == 1 and not argv and f"sets NVIDIA_REQUIRE_CUDA {said} (from" in proc.stderr, proc.stderr
    else:
        assert "--gpus" in argv, proc.stderr


@pytest.mark.parametrize(("brands", "visible", "refused"), [
    ("GeForce GeForce", "", True),       # nvidia/cuda:12.8 admits driver 535 on other brands only
    ("Tesla Tesla", "", False),
    ("NVIDIA NVIDIA", "", False),        # a T4, an H100: the toolkit calls NVIDIA "Unknown", which it admits
    ("NVIDIA_RTX NVIDIA_RTX", "", False),
    ("Tesla GeForce", "0", False),       # the toolkit holds the GPUs the container is given to it, no other
    ("Tesla GeForce", "1", True),
    ("N/A N/A", "", False),              # no brand said: may
    ("", "", False),                     # no Product Brand line at all: may
])
def test_run_sh_holds_brand_conditions_against_the_brand_nvidia_smi_says(node, brands, visible, refused):
    """run.sh took every brand= as may-hold: on a GeForce node with driver 535 it started a --devel cu128 image and
    docker's NVIDIA toolkit refused it ("unsatisfied condition: cuda>=12.8"). nvidia-smi's --query-gpu has no field
    for the brand; -q's "Product Brand" line says it, and run.sh now holds it against the image's requirement as invoke
    run does (a stand-in nvidia-smi says the brands: no GPU here)."""
    from tests.support.nvml import REQUIRE_CUDA_128

    proc, argv = node("--run-id=b1", variant="cu128", gpus=2, FAKE_DRIVER="535.183.01", FAKE_CUDA="12.2",
                      FAKE_REQUIRE=REQUIRE_CUDA_128, FAKE_BRANDS=brands,
                      **({"CUDA_VISIBLE_DEVICES": visible} if visible else {}))
    if not refused:
        assert "--gpus" in argv, proc.stderr
        return
    assert proc.returncode == 1 and not argv and proc.stderr == (
        "run.sh: image dockyard:0.1.0-cu128 sets NVIDIA_REQUIRE_CUDA cuda>=12.8 (from its base image), and driver "
        "535.183.01 supports CUDA 12.2; it admits this driver on other brands of GPU only, not on this node's GPUs of "
        "brand=geforce: the NVIDIA toolkit would refuse to start it. --disable-require starts it (a CUDA 12 driver runs "
        "any CUDA 12 build), or load the cu128 image built without --devel (invoke build --variant=cu128, then invoke "
        "save)\n")
    proc, argv = node("--run-id=b2", "--disable-require", variant="cu128", gpus=2, FAKE_DRIVER="535.183.01",
                      FAKE_CUDA="12.2", FAKE_REQUIRE=REQUIRE_CUDA_128, FAKE_BRANDS=brands,
                      **({"CUDA_VISIBLE_DEVICES": visible} if visible else {}))
    assert "NVIDIA_DISABLE_REQUIRE=1" in argv, proc.stderr


def test_without_home_the_hugging_face_cache_is_never_a_folder_in_tmp(node, tmp_path):
    """With HOME unset (`env -i`, a service) and no HF_HOME, run.sh mounted /tmp/.cache/huggingface read-write as the
    run's Hugging Face cache: a folder any user of the node can make first and fill (the models a run loads) or read
    (what the run caches). Now it asks for HF_HOME and runs nothing."""
    proc, argv = node("--run-id=h1", HOME="")
    assert proc.returncode == 1 and not argv
    assert proc.stderr == "run.sh: neither HF_HOME nor HOME is set: set HF_HOME to your Hugging Face cache (a folder of yours)\n"
    proc, argv = node("--run-id=h2", HOME="", HF_HOME=str(tmp_path / "hf"))
    assert proc.returncode == 1 and not argv
    assert "neither DOCKYARD_COMPILE_CACHE nor HOME is set" in proc.stderr  # the same holds for the compile cache
    proc, argv = node("--run-id=h2", HOME="", HF_HOME=str(tmp_path / "hf"), DOCKYARD_COMPILE_CACHE=str(tmp_path / "cc"))
    assert f"{tmp_path}/hf:/workspace/.cache/huggingface" in argv, proc.stderr


def test_run_sh_and_load_sh_say_how_they_are_used_and_a_run_that_never_began_leaves_no_folder(node, tmp_path):
    """`sh run.sh --help` was "unknown option", `sh load.sh --help` looked for an archive named --help; a run the
    trainer refused before its folder was its own (an unknown recipe: `--recipe=zero-2`) left an empty runs/<id>/."""
    proc, argv = node("--help")
    assert proc.returncode == 0 and not argv, proc.stderr
    assert proc.stdout.startswith("Trains a dockyard recipe in a loaded image") and "--recipe=NAME|FOLDER" in proc.stdout
    loader = subprocess.run(["sh", str(ROOT / "dockyard" / "transport" / "load.sh"), "--help"], capture_output=True,
                            text=True)
    assert loader.returncode == 0 and "sh load.sh --inventory" in loader.stdout, loader.stderr
    wrong = subprocess.run(["sh", str(ROOT / "dockyard" / "transport" / "load.sh"), "--force"], capture_output=True,
                           text=True)
    assert wrong.returncode == 1 and wrong.stderr.startswith("load.sh: unknown option --force: sh load.sh [ARCHIVE]")

    proc, argv = node("--recipe=zero-2", "--run-id=typo")  # the stand-in docker writes nothing, as such a trainer
    assert argv and proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "run.sh: the run stopped before it began (exit 0): its reason is above"
    assert not (tmp_path / "runs" / "typo").exists()


def test_a_recipe_name_the_image_holds_none_of_is_refused_before_docker_with_the_name_meant(node, tmp_path):
    """`sh run.sh --recipe=zreo2` started the run's container (seconds of a CUDA image's noise on a GPU node) for the
    trainer inside to refuse the name; invoke run refuses it at once, with its did-you-mean. run.sh lists the recipes
    the image holds (its /opt/dockyard/recipes, in the container it starts anyway for the engine's memlock limit) and
    refuses a name it lacks before the run's container, as invoke run words it."""
    held = {"FAKE_RECIPES": "\n".join(reversed(folder_names()))}  # the recipes/ the image was built from
    proc, argv = node("--recipe=zreo2", "--run-id=typo", **held)
    assert proc.returncode == 1 and not argv, proc.stderr
    assert proc.stderr == (f"run.sh: --recipe=zreo2: image dockyard:0.1.0-cpu holds no recipe zreo2: did you mean "
                           f"zero2? pick one of {', '.join(folder_names())} or give a folder that holds a recipe.yaml\n")
    assert not (tmp_path / "runs" / "typo").exists()
    for typed in ("zero-2", "ZeRO3", "deepspeed", "lroa", "zero3-ofload", "fdsp", "dpp", "zero2-offlaod", "xyz",
                  "qlora zero2", "lor\\141"):  # (two names of the list, side by side; a backslash as typed)
        proc, argv = node(f"--recipe={typed}", **held)
        near = closest_recipe(typed, folder_names())
        assert not argv and (f": did you mean {near}? pick one of" if near else f"recipe {typed}: pick one of") \
            in proc.stderr, (typed, proc.stderr)
    (tmp_path / "zreo3").mkdir()  # a folder of the user's without its recipe.yaml
    proc, argv = node("--recipe=zreo3", **held)
    assert not argv and "holds no recipe zreo3: the folder zreo3 here holds no recipe.yaml; pick one" in proc.stderr
    for given in ("zero2", str(ROOT / "recipes" / "lora")):  # a name it holds, a folder of one's own: trained
        proc, argv = node(f"--recipe={given}", **held)
        assert argv[argv.index("--recipe") + 1].endswith(given.rsplit("/")[-1]), proc.stderr
    proc, argv = node("--recipe=zreo2")  # an image that lists none (not asked): the trainer judges it, as before
    assert argv[argv.index("--recipe") + 1] == "zreo2", proc.stderr
    run_dir = tmp_path / "runs" / "r1"  # a resumed run of a folder recipe, its folder not given again
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": "r1", "recipe": "mine", "status": "failed"},
                                                      indent=2) + "\n")
    proc, argv = node("--run-id=r1", "--resume", **held)
    assert not argv and "holds no recipe mine: the run r1 trained with it: give its folder again " \
                        "(--recipe=FOLDER), or pick one of" in proc.stderr, proc.stderr


def test_a_recipe_path_that_is_no_recipe_folder_here_nor_in_the_image_is_refused_before_docker(node, tmp_path):
    """`sh run.sh --recipe=/host/typo` started the run's container, whose trainer then refused the path it could not
    find ("unknown recipe '/host/typo': no such folder"), leaving a run folder. run.sh refuses it before the run's
    container, as invoke run words it, with the folder beside it that was likely meant; a recipe's folder inside the
    image (its probe says so) still trains."""
    held = {"FAKE_RECIPES": "\n".join(folder_names()), "FAKE_IMAGE_FOLDERS": "/opt/dockyard/recipes/lora"}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("# invoke run --recipe=mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for typed, says in [
        ("/host/typo", "--recipe=/host/typo: no such folder on this node, nor in image dockyard:0.1.0-cpu: give a "
                       "folder that holds a recipe.yaml, or pick one of "),
        (f"{tmp_path}/mnie", f"no such folder on this node, nor in image dockyard:0.1.0-cpu (did you mean {mine}?)"),
        ("./empty", "--recipe=./empty: the folder holds no recipe.yaml: give a folder that holds one, or pick one of"),
        ("mine/recipe.yaml", "--recipe=mine/recipe.yaml is a file: give the folder that holds it, --recipe=mine"),
    ]:
        proc, argv = node(f"--recipe={typed}", "--run-id=t1", **held)
        assert proc.returncode == 1 and not argv, proc.stderr
        assert proc.stderr.startswith("run.sh: ") and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not (tmp_path / "runs" / "t1").exists()
    for given in (str(mine), "/opt/dockyard/recipes/lora"):  # a folder here, a recipe's folder inside the image
        proc, argv = node(f"--recipe={given}", "--run-id=t2", **held)
        assert argv and argv[argv.index("--recipe") + 1].endswith(given.rsplit("/")[-1]), proc.stderr


def test_a_recipe_of_the_image_whose_name_holds_a_blank_trains_as_invoke_run_trains_it(node, tmp_path):
    """invoke run trains recipes/my recipe/ (a folder's name is the recipe's), but run.sh listed the image's recipes
    apart by blanks and refused `--recipe='my recipe'` on the node ("holds no recipe my recipe: pick one of ..., my,
    recipe, ..."). The list is one name a line now: the name is found, passed to the trainer as one word, and a
    misspelling of it meets its did-you-mean; two names side by side are still no recipe."""
    held = {"FAKE_RECIPES": "\n".join([*folder_names(), "my recipe"])}
    proc, argv = node("--recipe=my recipe", "--run-id=b1", **held)
    assert argv[argv.index("--recipe") + 1] == "my recipe", proc.stderr  # docker started (a stand-in here)
    proc, argv = node("--recipe=my recipr", "--run-id=b2", **held)
    assert not argv and "holds no recipe my recipr: did you mean my recipe? pick one of " in proc.stderr, proc.stderr
    assert ", my recipe or give a folder" in proc.stderr or ", my recipe, " in proc.stderr, proc.stderr
    proc, argv = node("--recipe=qlora zero2", "--run-id=b3", **held)
    assert not argv and "holds no recipe qlora zero2: pick one of" in proc.stderr, proc.stderr


@pytest.mark.parametrize("after, says", [
    (["--data", "/tmp/b.jsonl"], "--data after --: a path there is not mounted; give it before -- (--data=PATH)"),
    (["--model=/models/x"], "--model after --: a path there is not mounted; give it before -- (--model=PATH)"),
    (["--eval_data", "held.jsonl"], "--eval_data after --: run.sh mounts --data and --model only"),
])
def test_a_path_given_after_the_double_dash_is_refused_before_docker(node, after, says):
    """`sh run.sh --data=a.jsonl -- --data /tmp/b.jsonl`: b was not mounted, and a (last in the trainer's command) won;
    `-- --data /host/x.jsonl` alone failed inside the container ("no data at /host/x.jsonl") with a run folder."""
    proc, argv = node("--run-id=p1", "--", *after)
    assert proc.returncode == 1 and says in proc.stderr and not argv, proc.stderr
    proc, argv = node("--run-id=p2", "--", "--max_steps", "3")
    assert "--max_steps" in argv, proc.stderr  # docker was started (a stand-in here)


def test_a_run_on_the_air_gapped_node_is_resumed_with_its_own_recipe(node, tmp_path):
    """The newcomer audit: `sh run.sh --run-id=r1 --resume` was "unknown option", and run.sh again "already holds a
    run": a run that died on an air-gapped node could only start over from step 0. --resume hands the trainer its
    --resume (which continues from the last complete checkpoint and checks the data and model given again), with the
    run's own recipe from its manifest unless --recipe names one; a resume of no run is refused before docker."""
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": "r1", "recipe": "ddp", "status": "failed"},
                                                      indent=2) + "\n")
    proc, argv = node("--run-id=r1", "--resume", "--", "--max_steps", "9")
    assert argv, proc.stderr
    entry = argv[argv.index("dockyard.train"):]
    assert entry == ["dockyard.train", "--recipe", "ddp", "--run-dir", "/workspace/runs/r1", "--resume", "--",
                     "--max_steps", "9"]
    assert "run.sh: resuming training ddp" in proc.stderr
    _, argv = node("--run-id=r1", "--resume", "--recipe=zero2")  # named: the trainer says whether it is the run's
    assert argv[argv.index("--recipe") + 1] == "zero2"
    proc, argv = node("--run-id=r1")
    assert proc.returncode == 1 and not argv and "already holds a run: pick another --run-id, or continue it " \
                                                  "(--resume)" in proc.stderr
    for args, says in ((["--resume"], "--resume needs --run-id=ID: the run to continue"),
                       (["--resume", "--run-id=none"], "--resume: ./runs/none holds no run (no manifest.json)"),
                       (["--resume", "--run-id=../r1"], "--run-id=../r1: start with a letter or digit")):
        proc, argv = node(*args)
        assert proc.returncode == 1 and not argv and says in proc.stderr, proc.stderr
    assert not (tmp_path / "runs" / "none").exists()


def test_the_command_save_suggests_trains_the_recipe_run_sh_trains_without_one(node, tmp_path, monkeypatch, capsys):
    """`invoke save` ended "train there without the project: sh run.sh --recipe=ddp ...", while run.sh (and README)
    train zero2 where no --recipe is given. Both now take invoke run's default recipe."""
    import re

    from dockyard.settings import Settings
    from dockyard.transport import inventory
    from dockyard.transport import save as save_mod
    from tests.support.save_tars import saving_docker

    docker, image = saving_docker(tmp_path)
    found = {**image, "labels": {"dockyard.variant": "cpu"}}
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [found])
    save_mod.save(Settings(docker=str(docker), layer_cache_gb=0), image="t:2", out=str(tmp_path / "dist"),
                  compress="none")
    hint = next(line for line in capsys.readouterr().out.splitlines() if "sh run.sh" in line)

    _, argv = node("--run-id=r1")  # no --recipe

    assert f"--recipe={argv[argv.index('--recipe') + 1]} " in hint
    assert re.search(r"--recipe=(\S+)", hint)[1] == launch_run.DEFAULT_RECIPE


@pytest.mark.parametrize("host", ["rtx3090x2_535", "t4x2_535", "v100x2_535", "l40sx2_550", "h100x1_580"])
def test_invoke_save_says_which_nodes_its_cuda_image_trains_on_and_names_the_variant_for_the_others(
        tmp_path, monkeypatch, capsys, host):
    """`invoke save --variant=cu132` said how to ship, load and train, and nothing of the node's driver: the user of a
    CUDA 12 server (535, 550) learnt it after carrying gigabytes, from run.sh. The save now says the driver and GPUs
    the image needs and names the variant for the drivers it leaves out: on each recorded host, where the driver is
    older than the one named, the variant named is the one invoke run's auto picks there."""
    from dockyard import gpus
    from dockyard.settings import Settings
    from dockyard.transport import inventory
    from dockyard.transport import save as save_mod
    from tests.support.save_tars import saving_docker

    docker, image = saving_docker(tmp_path)
    monkeypatch.setattr(inventory, "inspect_images", lambda settings, refs: [
        {**image, "ref": "dockyard:0.1.0-cu132", "tags": ["dockyard:0.1.0-cu132"],
         "labels": {"dockyard.variant": "cu132"}}])
    settings = Settings(docker=str(docker), layer_cache_gb=0)
    save_mod.save(settings, image="dockyard:0.1.0-cu132", out=str(tmp_path / "dist"), compress="none")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("the node: "))
    monkeypatch.setenv(gpus.REPLAY_ENV, str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / f"{host}.json"))
    node_host = gpus.read_host()
    picked = variants.resolve(settings, "auto", node_host)[0].name
    least = line.split("needs an NVIDIA driver ", 1)[1].split(" ", 1)[0]
    if variants.cuda_version(node_host.driver) >= variants.cuda_version(least):
        assert picked == "cu132", line
    else:
        assert f"take {picked} (invoke save --variant={picked})" in line, (host, line)


@pytest.mark.parametrize("typed, says, then", [
    ("--daat=/tmp", "did you mean --data? ", "--data=/tmp"),
    ("--recpie=ddp", "did you mean --recipe? ", "--recipe=ddp"),
    ("--run_id=g1", "did you mean --run-id? ", "--run-id=g1"),
    ("--nprocs=1", "did you mean --nproc? ", "--nproc=1"),
    ("--recipe", "--recipe needs its value after '=', as in --recipe=VALUE", "--recipe=ddp"),
    ("--cpu=yes", "--cpu is a switch and takes no value: give --cpu alone", "--cpu"),
    ("--variant=cu132", "give it as --image=dockyard:0.1.0-cu132 (sh load.sh its archive first)",
     "--image=dockyard:0.1.0-cu132"),
])
def test_an_option_run_sh_lacks_is_answered_with_the_one_meant_which_then_trains(node, tmp_path, typed, says, then):
    """The newcomer's walk: `sh run.sh --daat=x`, `--recpie=ddp` or `--cpu=yes` was "unknown option ... (options take
    the form --name=value ...)" where `invoke run` names the flag meant, and invoke run's `--gpus=1` and
    `--variant=cu132` were "unknown option" too, leaving the user to find CUDA_VISIBLE_DEVICES in --help and that
    run.sh takes an image. Each is refused before docker, saying the option (or the way) meant, and that one trains."""
    loaded = {"FAKE_LOADED": "dockyard:0.1.0-cpu dockyard:0.1.0-cu132"}
    proc, argv = node(typed, **loaded)
    assert proc.returncode == 1 and not argv and says in proc.stderr, proc.stderr
    proc, argv = node(then, **loaded)
    assert argv, proc.stderr  # docker started (a stand-in here)
    if then.startswith("--image="):
        assert then.partition("=")[2] in argv, argv
    proc, argv = node("--max_stepz=3", **loaded)  # nothing near: the old words, pointing trainer settings past --
    assert not argv and proc.stderr == ("run.sh: unknown option --max_stepz=3 (options take the form --name=value; "
                                        "trainer overrides go after --)\n")


def test_invoke_runs_gpus_flag_given_to_run_sh_says_how_run_sh_picks_gpus_and_that_way_trains_on_them(node):
    """`sh run.sh --gpus=1` (invoke run's flag) was "unknown option": run.sh takes the GPUs from CUDA_VISIBLE_DEVICES,
    which it now says with the GPUs given; done so, docker is given that GPU alone. Its multi-node flags and --native
    say that those take invoke run."""
    proc, argv = node("--gpus=1", "--run-id=g1", variant="cu132", gpus=2)
    assert proc.returncode == 1 and not argv, proc.stderr
    assert "run.sh takes the GPUs from CUDA_VISIBLE_DEVICES, as in CUDA_VISIBLE_DEVICES=1 sh run.sh" in proc.stderr
    proc, argv = node("--run-id=g1", variant="cu132", gpus=2, CUDA_VISIBLE_DEVICES="1")
    assert argv[argv.index("--gpus") + 1] == '"device=1"' and "--nproc-per-node=1" in argv, argv
    for flag in ("--nodes=2", "--native", "--master-addr=10.0.0.1"):  # invoke run's, which run.sh has no way for
        proc, argv = node(flag, variant="cu132", gpus=2)
        assert not argv and "run.sh trains in the image on this node alone; several nodes, or a host's own Python, " \
                            "take invoke run" in proc.stderr, proc.stderr


@pytest.mark.parametrize("typed", ["--{long}", "--{long}=1", "--gpus={long}", "--variant={long}"])
def test_an_unknown_option_of_thousands_of_characters_is_said_by_its_start(node, typed):
    """`sh run.sh --<5,000 characters>` echoed the option whole, a screen of it, where invoke run says a flag it lacks
    by its first 60 characters: run.sh says it so too, and the rest of its line (what to do) is still said."""
    long = "zero2-" + "x" * 4994
    proc, argv = node(typed.format(long=long))
    assert proc.returncode == 1 and not argv, proc.stderr
    said = proc.stderr.strip()
    assert said.startswith("run.sh: unknown option --") and "zero2-xxx" in said and "..." in said, said[:400]
    assert "x" * 100 not in said and len(said) < 400 and "\n" not in said, said[:400]


def test_runs_started_in_the_same_second_without_a_run_id_each_get_a_folder_of_their_own(node, tmp_path):
    """Two `sh run.sh` started in the same second without --run-id got the same id (<recipe>-<second>): one after the
    other, the second was refused ("already holds a run"); at once, both trained in one folder, and docker refused the
    second container's name. As invoke run: the id keeps its form where free, else the first free of its -2, -3, ...,
    claimed with one mkdir; an id given is refused as before."""
    (tmp_path / "bin" / "date").write_text("#!/bin/sh\necho 20261207-183005\n")  # every run in that second
    (tmp_path / "bin" / "date").chmod(0o755)
    base = f"{launch_run.DEFAULT_RECIPE}-20261207-183005"
    for taken in (base, f"{base}-2"):  # earlier runs of that second
        (tmp_path / "runs" / taken).mkdir(parents=True)
        (tmp_path / "runs" / taken / "manifest.json").write_text('{\n  "status": "completed",\n}\n')
    proc, argv = node()
    assert argv[argv.index("--name") + 1] == f"dockyard-{base}-3", proc.stderr
    assert f"-> {tmp_path}/runs/{base}-3" in proc.stderr.replace("→", "->"), proc.stderr
    proc, argv = node(f"--run-id={base}")
    assert proc.returncode == 1 and not argv and "already holds a run: pick another --run-id" in proc.stderr


LONG = "x" * 5000


@pytest.mark.parametrize("typed, env", [
    (("--nproc=9" + "9" * 4999,), {}),
    (("--run-id=-" + LONG,), {}),
    (("--run-id=a" + LONG + "!",), {}),
    (("--resume", "--run-id=a" + LONG), {}),
    (("--image=-" + LONG,), {}),
    (("--recipe=" + LONG,), {"FAKE_RECIPES": "lora"}),
    (("--recipe=./" + LONG,), {"FAKE_RECIPES": "lora"}),
    (("--data=" + LONG,), {}),
    (("--model=/" + LONG,), {}),
    (("--runs=a:" + LONG,), {}),
    (("--runs=~" + LONG,), {}),
    ((), {"CUDA_VISIBLE_DEVICES": "7" * 5000}),
    ((), {"CUDA_VISIBLE_DEVICES": "GPU-" + "a" * 5000}),
])
def test_a_value_of_thousands_of_characters_is_said_by_its_start_in_every_error(node, typed, env):
    """run.sh said --nproc=, --run-id=, --image=, --recipe=, a path or CUDA_VISIBLE_DEVICES of thousands of characters
    whole in its error, a screen of it: each is said by its start and '...' (a value's 57 characters, a path's 117, as
    invoke run says them), and the rest of the line (what to do) is still said."""
    gpus = {"gpus": 2, "variant": "cu132"} if "CUDA_VISIBLE_DEVICES" in env else {}
    proc, argv = node(*typed, **gpus, **env)
    said = proc.stderr.strip()
    assert proc.returncode == 1 and not argv and said.startswith("run.sh: "), said[:400]
    assert "..." in said and len(said) < 600 and "\n" not in said, said[:600]
    for ch in "x97a":
        assert ch * 118 not in said, said[:600]
