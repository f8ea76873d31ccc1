"""Names a user gives that are not what they look like (a second red-team pass): an output file that is a pipe or a
link to a device, a data file that is a link to a content-addressed blob, an empty user or host, a misspelt key, an
archive set renamed after saving, a NUL in a setting, a damaged Hugging Face cache, an NVML recording that would drive
the terminal. Each is refused in one line before anything is made, or, where the name is sound, works.

Through the real CLI (Invoke's Program, the real tasks.py); no engine is reached: each refusal comes before it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess

import pytest

from dockyard import ROOT
from tests.support.archive_sets import make_set
from tests.support.cli import invoke, invoke_here, short_error
from tests.support.data import a_step_of

NVML_HOSTS = ROOT / "tests" / "fixtures" / "nvml" / "hosts"


@pytest.mark.parametrize("task", [["inventory", "--out={}"], ["doctor", "--record={}"],
                                  ["slurm", "--recipe=zero2", "--nodes=2", "--gpus-per-node=1", "--out={}"]],
                         ids=["inventory", "doctor", "slurm"])
@pytest.mark.parametrize("through_a_link", [False, True], ids=["pipe", "link-to-a-pipe"])
def test_an_output_that_is_a_pipe_or_links_to_one_is_refused_and_left_as_it_was(tmp_path, task, through_a_link):
    """The file is written beside the name and renamed over it: as root, `--out=/dev/stdout` (a link to the terminal)
    or `--record=/dev/null` replaced a system file with a plain one, and said "wrote". A fifo stands in for the device
    here (the check is the same: anything but a plain file or folder), so the test needs no root."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    named = pipe
    if through_a_link:
        named = tmp_path / "stdout"
        named.symlink_to(pipe)
    r = invoke_here(*[a.format(named) for a in task], env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"),
                                                            "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    short_error(r, "a pipe, not a file")
    assert stat.S_ISFIFO(os.stat(named).st_mode), "the pipe is still there"
    assert named.is_symlink() is through_a_link
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"pipe", named.name}), "nothing else was written"


def test_a_data_file_that_is_a_link_to_a_blob_is_read_by_the_name_it_was_given(tmp_path):
    """The Hugging Face cache (snapshots/REV/train.jsonl -> ../../blobs/<sha256>), DVC and git-annex keep data files
    as links to blobs of no suffix: the file was refused as "unknown data file type (none)", and its folder as holding
    a link that leaves it, with "give the file itself" as the fix. It is mounted under its own name, which the
    trainer reads its kind from."""
    blob = tmp_path / "blobs" / ("9f86d081" * 8)
    blob.parent.mkdir()
    blob.write_text(a_step_of('{"text": "hello"}'))
    link = tmp_path / "snapshots" / "rev" / "train.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    r = invoke_here("run", "--dry", "--variant=cpu", f"--data={link}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert f"-v {blob}:/workspace/inputs/data/train.jsonl:ro" in r.stderr
    assert "--data /workspace/inputs/data/train.jsonl" in r.stderr


def test_a_link_whose_own_name_holds_a_colon_is_refused_as_a_mount(tmp_path):
    blob = tmp_path / "blob"
    blob.write_text(a_step_of('{"text": "hello"}'))
    link = tmp_path / "a:b.jsonl"
    link.symlink_to(blob)
    short_error(invoke_here("run", "--dry", "--variant=cpu", f"--data={link}",
                            env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}), "':'")


@pytest.mark.parametrize("to, says", [("@127.0.0.1", "no user"), ("root@", "no host")])
def test_an_empty_user_or_host_is_said_as_such_not_as_an_unreachable_node(to, says):
    """`--to=@host` got ssh's usage text as the node's failure, `--to=root@:/dir` "Could not resolve hostname"."""
    short_error(invoke_here("ship", "--image=dockyard:0.1.0-cpu", f"--to={to}"), says)
    short_error(invoke_here("save", "--variant=cpu", f"--thin-for=ssh://{to}"), says)


@pytest.mark.parametrize("to", ["2001:db8::5", "[::1]:/tmp/x", "fe80::1:/srv/img", "root@[::1]:/x"])
def test_an_ipv6_destination_is_refused_with_the_way_to_name_it_not_cut_at_its_first_colon(to, tmp_path):
    """ssh was run with host `2001` (glibc reads it as 0.0.7.209: another machine) or `[`, the rest of the address
    taken for the folder. An ssh config alias is how a node at an IPv6 address is named here."""
    archive = make_set(tmp_path).archive
    for args in (["--image=dockyard:0.1.0-cpu"], [f"--file={archive}"]):
        short_error(invoke_here("ship", *args, f"--to={to}", env={"INVOKE_DOCKYARD_SSH": "/bin/false"}),
                    "an IPv6 address", "Host node9")


def test_a_misspelt_identity_is_named_before_ssh_hides_it(tmp_path):
    """ssh only warns of a key file it cannot read and tries the others: the error was its last line, "Permission
    denied (publickey)", as if the node refused the key."""
    short_error(invoke_here("ship", "--image=dockyard:0.1.0-cpu", "--to=root@127.0.0.1",
                            f"--identity={tmp_path}/id_ed25591"), "--identity", "no such key file")


@pytest.mark.parametrize("port", ["99999", "0"])
def test_a_port_out_of_range_in_an_ssh_url_is_said_before_ssh_runs(port):
    """--port is range-checked; the port of ssh://host:PORT was handed to ssh, whose "Bad port" came back as the
    node's failure."""
    short_error(invoke_here("save", "--variant=cpu", f"--thin-for=ssh://root@127.0.0.1:{port}"), "not a TCP port")
    short_error(invoke_here("doctor", f"--peer=ssh://root@127.0.0.1:{port}"), "not a TCP port")


def test_a_renamed_archive_set_is_said_to_be_renamed_not_tampered(tmp_path):
    """The .sha256 lists the names `invoke save` gave; renamed files were refused as "the manifest was changed or
    damaged", which sends the user after an attacker."""
    archive, manifest = b"not read", json.dumps({"archive_bytes": 8}).encode()
    (tmp_path / "mine.tar").write_bytes(archive)
    (tmp_path / "mine.manifest.json").write_bytes(manifest)
    (tmp_path / "mine.sha256").write_text(f"{hashlib.sha256(manifest).hexdigest()}  dockyard_0.1.0-cpu.manifest.json\n"
                                          f"{hashlib.sha256(archive).hexdigest()}  dockyard_0.1.0-cpu.tar\n")
    r = invoke_here("load", f"--file={tmp_path}/mine.tar", env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    short_error(r, "renamed")
    assert "dockyard_0.1.0-cpu.tar" in r.stderr and "nothing was loaded" in r.stderr


def test_a_checksum_file_in_uppercase_hex_passes_its_check_as_sha256sum_c_would(tmp_path):
    """A .sha256 rewritten by a tool that prints its digests in capitals (sha256sum -c takes them) was refused by
    `invoke load` as a changed manifest and by load.sh as a malformed list. Both now go on to the next check: here
    the manifest's own fields, which this stand-in lacks."""
    archive = b"not read"
    manifest = (f'{{\n  "archive_sha256": "{hashlib.sha256(archive).hexdigest()}",\n  "archive_bytes": 8\n}}\n').encode()
    (tmp_path / "mine.tar").write_bytes(archive)
    (tmp_path / "mine.manifest.json").write_bytes(manifest)
    (tmp_path / "mine.sha256").write_text(f"{hashlib.sha256(manifest).hexdigest().upper()}  mine.manifest.json\n"
                                          f"{hashlib.sha256(archive).hexdigest().upper()}  mine.tar\n")
    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = invoke_here("load", f"--file={tmp_path}/mine.tar", env=no_engine)
    short_error(r, "is not a manifest `invoke save` writes")
    shutil.copy(ROOT / "dockyard" / "transport" / "load.sh", tmp_path)
    r = subprocess.run(["sh", "load.sh", "mine.tar"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, **no_engine})
    assert r.returncode != 0 and "mine.manifest.json is not a dockyard manifest" in r.stderr, r.stderr


def test_a_nul_in_a_path_setting_is_a_settings_error_not_a_traceback(tmp_path):
    config = tmp_path / "invoke.yaml"
    config.write_text('dockyard:\n  runs_dir: "/tmp/\\x00runs"\n')
    short_error(invoke_here("-f", str(config), "run", "--dry", "--variant=cpu"), "runs_dir", "NUL")


@pytest.mark.parametrize("ref", [b"\xff\xfe\x00", b"a" * 5000])
def test_a_damaged_ref_in_the_hugging_face_cache_falls_back_to_its_snapshots(tmp_path, ref):
    """refs/main of bytes that are not UTF-8 (a disk error, a cut copy) was a UnicodeDecodeError's traceback; one of
    5,000 characters an error "File name too long", for plan and run alike."""
    repo = tmp_path / "hub" / "models--org--m5"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_bytes(ref)
    snapshot = repo / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}))
    r = invoke_here("plan", "--model=org/m5", "--gpus=1", "--gpu-mem=80", env={"INVOKE_DOCKYARD_HF_CACHE": str(tmp_path)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("field, value", [("driver", "570.1\u001b[2J\u001b[31mHACK"), ("driver", "abc"),
                                          ("name", "NVIDIA H100\u001b[2J"), ("name", "NVIDIA\u2028FAKE LINE"),
                                          ("name", "NVIDIA A100\u202eevil"), ("visible", "0;touch /tmp/x"),
                                          ("visible", "1"), ("visible", "0,0"), ("error", "boom \u001b[2J")])
def test_an_nvml_recording_that_would_drive_the_terminal_is_refused(tmp_path, field, value):
    """A recording is a file users send each other: its words are printed as they are (`auto → cu128: ... driver X`,
    doctor's table), and an escape sequence in them cleared the screen (a line separator split doctor's line, a
    right-to-left mark reversed it); a driver "abc" was said to support CUDA 12. Its `visible` became docker's
    --gpus "device=..." (and run.sh's) as it was: a GPU the host has not, or words."""
    data = json.loads((NVML_HOSTS / "h100x1_580.json").read_text())
    (data["host"] if field in ("driver", "visible", "error") else data["host"]["gpus"][0])[field] = value
    recording = tmp_path / "host.json"
    recording.write_text(json.dumps(data))
    short_error(invoke_here("run", "--dry", env={"DOCKYARD_NVML_REPLAY": str(recording)}), "host.json")


def test_words_from_a_recording_a_recipe_or_a_folder_are_shown_as_text_not_as_rich_tags(tmp_path):
    """rich reads [/] as a closing tag: a GPU named `NVIDIA [/bold] H100` in a recording (doctor), a recipe whose
    `when:` says `For [/] big models` (recipes, plan), a model folder named `x[/y]` (plan) were MarkupError
    tracebacks; `[docs]` vanished from the text."""
    data = json.loads((NVML_HOSTS / "h100x1_580.json").read_text())
    data["host"]["gpus"][0]["name"] = "NVIDIA [/bold] H100"
    recording = tmp_path / "host.json"
    recording.write_text(json.dumps(data))
    r = invoke_here("doctor", env={"DOCKYARD_NVML_REPLAY": str(recording)})
    assert "Traceback" not in r.stderr and "[/bold]" in r.stdout, r.stderr[-2000:]
    model = tmp_path / "x[/y]"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}))
    r = invoke_here("plan", f"--model={model}", "--gpus=1", "--gpu-mem=80")
    assert r.returncode == 0 and "Traceback" not in r.stderr and f"{model}/config.json" in r.stdout.replace("\n", ""), \
        r.stderr[-2000:]


def test_gpus_given_as_empty_names_is_refused_not_a_cpu_run(tmp_path):
    """`--gpus=$A,$B` with both unset is `--gpus=,`: the run went to CPU, saying "NVML sees no GPU" on a GPU host."""
    r = invoke_here("run", "--dry", "--gpus=,", env={"DOCKYARD_NVML_REPLAY": str(NVML_HOSTS / "h100x1_580.json"),
                                                      "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "--gpus=','")
    assert not (tmp_path / "runs").exists()


def test_an_output_under_a_file_is_said_to_be_under_a_file(tmp_path):
    """`--out=afile/x.json` where afile is a file said mkdir's "File exists", naming nothing."""
    (tmp_path / "afile").write_text("")
    short_error(invoke_here("inventory", f"--out={tmp_path}/afile/x.json"), f"{tmp_path}/afile is a file, not a folder")


def test_a_plan_on_a_host_without_gpus_names_the_flag_it_lacks(tmp_path):
    """`--gpus=8` given, `--gpu-mem` not: the error asked for "--gpus=8 --gpu-mem=80" as if neither had been."""
    recording = tmp_path / "no-gpu.json"
    recording.write_text(json.dumps({"kind": "gpu", "host": {"error": "no NVIDIA driver"}, "links": [], "samples": []}))
    r = invoke_here("plan", "--model=8B", "--gpus=8", env={"DOCKYARD_NVML_REPLAY": str(recording)})
    short_error(r, "with --gpu-mem too (0, the default, is this host's; e.g. --gpus=8 --gpu-mem=80)")


def test_an_unreadable_manifest_is_named_with_its_folder(tmp_path):
    """A run's files are opened by name within their folder: "error: manifest.json: Permission denied" named no run.
    Played as a user who cannot read it (root without the capabilities that read past file modes)."""
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / "manifest.json").chmod(0)
    r = invoke("export", "--run=r1", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}, as_a_user=True)
    short_error(r, f"{run}/manifest.json: Permission denied")


def test_a_link_planted_for_the_monitor_is_said_as_text_and_the_monitor_ends_quietly(tmp_path, capsys):
    """metrics.jsonl planted as a link to `/tmp/[/]x`: the monitor's warning named the target, rich read `[/]` as a
    tag, and the MarkupError left `watch()` (which never raises) as a traceback after training, monitor.json unwritten.
    No GPU here: the sampler is a stand-in that sees no process."""
    from dockyard.launch import monitor

    class NoProcesses:
        kind = "gpu"

        def sample(self):
            return []

    (tmp_path / "metrics.jsonl").symlink_to("/tmp/[/]x")
    with monitor.watch(tmp_path, source=NoProcesses(), interval=0.1):
        pass
    err = capsys.readouterr().err
    assert "is a symbolic link (to /tmp/[/]x)" in err and "Traceback" not in err, err
    assert (tmp_path / "monitor.json").is_file()


@pytest.mark.parametrize("memory_bytes", [0, 1])
def test_a_gpu_whose_memory_nvml_could_not_read_is_not_planned_as_0_gib(tmp_path, memory_bytes):
    """memory_bytes 0 (NVML could not read it) was planned as a GPU of 0.0 GiB: "no recipe fits", exit 0; 1 byte
    still was."""
    data = json.loads((NVML_HOSTS / "h100x1_580.json").read_text())
    data["host"]["gpus"][0]["memory_bytes"] = memory_bytes
    recording = tmp_path / "host.json"
    recording.write_text(json.dumps(data))
    env = {"DOCKYARD_NVML_REPLAY": str(recording)}
    short_error(invoke_here("plan", "--model=1B", env=env), "NVML could not read the memory of GPU 0 (it said under "
                                                            "1 GiB): say how much each has, --gpu-mem=GiB")
    r = invoke_here("plan", "--model=1B", "--gpu-mem=80", env=env)
    assert r.returncode == 0 and "1 GPU(s) × 80.0 GiB" in r.stdout, r.stderr


@pytest.mark.parametrize("hidden", ["-1", "NoDevFiles"])
def test_cuda_visible_devices_that_hides_every_gpu_means_cpu_as_cuda_takes_it(tmp_path, hidden):
    """CUDA_VISIBLE_DEVICES=-1 (the usual way to hide GPUs; Slurm's NoDevFiles for a job given none) was "GPU '-1' is
    not on this host", for `plan` and even `run --cpu`. CUDA reads the list up to its first such entry."""
    env = {"DOCKYARD_NVML_REPLAY": str(NVML_HOSTS / "h100x8_580.json"), "CUDA_VISIBLE_DEVICES": hidden,
           "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here("run", "--dry", env=env)
    assert r.returncode == 0 and f"auto → cpu: CUDA_VISIBLE_DEVICES={hidden} hides every GPU" in r.stdout, r.stderr
    assert invoke_here("run", "--dry", "--cpu", env=env).returncode == 0
    short_error(invoke_here("plan", "--model=1B", env=env), f"CUDA_VISIBLE_DEVICES={hidden} hides every GPU: say what "
                                                            "to plan for")
    r = invoke_here("plan", "--model=1B", env={**env, "CUDA_VISIBLE_DEVICES": f"0,1,{hidden},2"})
    assert r.returncode == 0 and "2 GPU(s) ×" in r.stdout, "the list ends at the first such entry, as CUDA reads it"


def test_an_output_named_as_a_folder_with_a_trailing_dot_is_a_folder_not_a_file(tmp_path):
    """`--out=DIR/.` read as the file DIR (pathlib drops the dot): slurm wrote its script as a file named DIR, where
    `DIR/` made DIR/<recipe>-<n>n.sbatch; `doctor --record=DIR/.` wrote the recording as DIR. A folder name, however
    written, now holds the script, and a recording is refused with what to give instead."""
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    for written in ("jobs/.", "jobs/", "jobs/.."):
        r = invoke_here("slurm", "--recipe=zero2", "--nodes=2", "--gpus-per-node=1", f"--out={tmp_path}/{written}",
                        env=env)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "jobs" / "zero2-2n.sbatch").is_file() and (tmp_path / "zero2-2n.sbatch").is_file()
    short_error(invoke_here("doctor", f"--record={tmp_path}/recorded/."), "names a folder; name a file in it")
    assert not (tmp_path / "recorded").exists()


def test_an_output_named_dash_is_refused_not_written_as_a_file_named_dash(tmp_path, monkeypatch):
    """`invoke inventory --out=-` (as `sh load.sh --inventory` writes to standard output) wrote a file named "-" in
    the working folder and said so in a line easy to miss; so did slurm's --out and doctor's --record."""
    monkeypatch.chdir(tmp_path)
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    for args in (("inventory", "--out=-"), ("doctor", "--record=-"),
                 ("slurm", "--recipe=zero2", "--nodes=2", "--gpus-per-node=1", "--out=-")):
        short_error(invoke_here(*args, env=env), "never to standard output; name a file")
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("setting, value, says", [
    ("INVOKE_DOCKYARD_HF_CACHE", "/", "the hf_cache setting '/' is a system folder"),
    ("INVOKE_DOCKYARD_HF_CACHE", "~", "holds your home folder"),
    ("INVOKE_DOCKYARD_RUNS_DIR", "/", "the runs_dir setting '/' is a system folder"),
    ("INVOKE_DOCKYARD_RUNS_DIR", "/etc", "is a system folder"),
    # the eleventh: a folder inside one (a root container wrote the host's cron jobs)
    ("INVOKE_DOCKYARD_RUNS_DIR", "/etc/cron.d", "the runs_dir setting '/etc/cron.d' is inside a system folder"),
    ("INVOKE_DOCKYARD_HF_CACHE", "/usr/local/bin", "is inside a system folder"),
    ("INVOKE_DOCKYARD_COMPILE_CACHE", "/var/lib/dockyard-test", "is inside a system folder"),
    ("INVOKE_DOCKYARD_RUNS_DIR", str(ROOT), "holds the project's checkout"),
    ("INVOKE_DOCKYARD_COMPILE_CACHE", str(ROOT.parent), "holds the project's checkout"),
])
def test_a_cache_or_runs_folder_that_holds_the_system_or_the_home_folder_is_refused(tmp_path, setting, value, says):
    """The tenth red-team pass: INVOKE_DOCKYARD_HF_CACHE=/ (or ~, a slip) mounted the whole filesystem (or the
    home folder, ~/.ssh in it) read-write into every run's container, which runs a model's and a data file's code.
    The home folder is one outside every folder above the checkout (Debian's for a user without one): a checkout
    cloned into the user's (~/dockyard) has it for ROOT.parent, which then holds the home folder too, said first."""
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "hf"),
           "INVOKE_DOCKYARD_COMPILE_CACHE": str(tmp_path / "compile"), "HOME": "/nonexistent", setting: value}
    short_error(invoke_here("run", "--dry", "--variant=cpu", "--recipe=ddp", env=env), says)
    sqsh = tmp_path / "image.sqsh"
    sqsh.write_bytes(b"hsqs")
    short_error(invoke_here("slurm", "--recipe=zero2", "--nodes=2", "--gpus-per-node=1", "--runtime=pyxis",
                            f"--image-file={sqsh}", f"--out={tmp_path}/job.sbatch", env=env), says)
    assert not (tmp_path / "job.sbatch").exists()
