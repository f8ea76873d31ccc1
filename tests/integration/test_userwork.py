"""The user's own work through the real image: their data and model mounted read-only, a recipe edited without a
build, and an air-gapped node that trains with nothing but `sh load.sh && sh run.sh` (no project, no venv there)."""

from __future__ import annotations

import hashlib
import json
import shutil

from dockyard import ROOT
from tests.support.cli import invoke
from tests.support.training import manifest

FEW = ["--max_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "2"]


def test_data_model_and_an_edited_recipe_folder_are_mounted_and_recorded(cpu_image, tmp_path):
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    data = tmp_path / "my data.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i} of the user's own data"}) + "\n" for i in range(40)))
    recipe = tmp_path / "mine"
    shutil.copytree(ROOT / "recipes" / "ddp", recipe)
    r = invoke("run", "--variant=cpu", f"--recipe={recipe}", f"--data={data}", "--", *FEW, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    first = next((tmp_path / "runs").glob("mine-*"))
    m = manifest(first)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 2
    assert m["inputs"]["data"]["path"] == str(data) and m["inputs"]["data"]["inside"].startswith("/workspace/inputs/")
    assert m["inputs"]["data"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert m["data"]["examples"] == 40, "the user's file was read, not the sample"

    # The model the first run made, as a host folder; and the recipe edited: the next run uses both, no build.
    (recipe / "recipe.yaml").write_text((recipe / "recipe.yaml").read_text() + "settings:\n  max_seq_length: 48\n")
    r = invoke("run", "--variant=cpu", f"--recipe={recipe}", "--run-id=second", f"--model={first / 'base'}",
               "--", *FEW, f"--data={data}", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m2 = manifest(tmp_path / "runs" / "second")
    assert m2["status"] == "completed" and m2["inputs"]["model"]["path"] == str(first / "base")
    assert m2["inputs"]["model"]["hash_of"] == "file list with sizes"
    assert m2["recipe_files"]["mine/recipe.yaml"] != m["recipe_files"]["mine/recipe.yaml"]
    assert m2["recipe_files"]["mine/recipe.yaml"] == hashlib.sha256((recipe / "recipe.yaml").read_bytes()).hexdigest()
    assert "up to 48 tokens each" in (tmp_path / "runs" / "second" / "train.log").read_text(), "the edit applied"

    r = invoke("run", "--variant=cpu", "--recipe=ddp", f"--data={tmp_path / 'nope.jsonl'}", env=env)
    assert r.returncode == 1 and "nope.jsonl: no such file or folder on this host" in r.stderr


def test_an_edit_to_the_checkouts_defaults_applies_to_the_next_run_without_a_build(cpu_image, tmp_path):
    """In a copy of the checkout (never edit the real one), recipes/defaults.yaml is edited after the image was
    built: the run in that image follows the edit, and says nothing about stale code (the code is the image's)."""
    project = tmp_path / "project"
    for name in ("dockyard", "recipes", "data", "images/locks"):
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("tasks.py", "invoke.yaml", "images/variants.yaml"):
        shutil.copy2(ROOT / name, project / name)
    defaults = project / "recipes" / "defaults.yaml"
    defaults.write_text(defaults.read_text().replace("max_steps: 50", "max_steps: 3"))
    r = invoke("run", "--variant=cpu", "--recipe=ddp", "--run-id=edited", cwd=project,
               env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(project)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = manifest(tmp_path / "runs" / "edited")
    assert m["metrics"]["steps"] == 3, "the image's own defaults say 50"
    assert m["recipe_files"]["defaults.yaml"] == hashlib.sha256(defaults.read_bytes()).hexdigest()
    assert "warning" not in r.stderr


def test_run_sh_trains_on_the_air_gapped_node(node, cpu_image, tmp_path):
    dist = tmp_path / "dist"
    # zstd, the default: the suite's earlier saves of this image (test_slurm, test_transport) left its layers in the
    # layer cache, where --compress=gzip compressed all of them again
    r = invoke("save", "--variant=cpu", f"--out={dist}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (dist / "run.sh").is_file() and (dist / "load.sh").is_file()
    data = tmp_path / "node data" / "x.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}"}) + "\n" for i in range(24)))
    node.wipe()
    runs = tmp_path / "node-runs"
    # On the node: a fresh login shell, no checkout and no venv; only sh, docker and the archive set.
    got = node.ssh(f"cd {dist} && sh load.sh && sh run.sh --recipe=ddp --run-id=air --runs={runs} "
                   f"'--data={data}' -- --max_steps 2 --logging_steps 1", check=False, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    m = manifest(runs / "air")
    assert m["status"] == "completed" and m["world_size"] == 2 and m["metrics"]["steps"] == 2
    assert m["image"]["id"] == node.image_id(cpu_image) and m["variant"] == "cpu"
    assert m["inputs"]["data"]["path"] == str(data) and m["data"]["format"] == "prompt_completion"
    assert (runs / "air" / "model" / "config.json").is_file()
    # a run there continues from its checkpoint with its own recipe, the data given again (run.sh --resume)
    got = node.ssh(f"cd {dist} && sh run.sh --run-id=air --runs={runs} --resume '--data={data}' -- --max_steps 3 "
                   "--logging_steps 1", check=False, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    m = manifest(runs / "air")
    assert m["status"] == "completed" and m["metrics"]["steps"] == 3 and m["recipe"] == "ddp"


def test_run_sh_refuses_a_recipe_the_image_lacks_at_once_and_its_lines_name_this_nodes_paths(settings, cpu_image,
                                                                                                tmp_path):
    """Through the real image and engine: `sh run.sh --recipe=zreo2` started the run's container for the trainer to
    refuse the name; a run's lines named /workspace/runs/ID/model and /workspace/inputs/data/..., the container's
    paths. The image's recipes are read in the probe run.sh starts anyway, and the trainer says the node's paths."""
    import os
    import subprocess

    from dockyard.common.recipes import folder_names
    from dockyard.launch import runscript

    (tmp_path / "run.sh").write_text(runscript.render(settings, cpu_image, "cpu"))
    data, runs = tmp_path / "node data" / "x.jsonl", tmp_path / "node runs"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": f" A{i}"}) + "\n" for i in range(16)))

    def run_sh(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "run.sh", f"--image={cpu_image}", f"--runs={runs}", "--nproc=1", *args],
                              cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True,
                              timeout=600)

    proc = run_sh("--recipe=zreo2", "--run-id=typo")
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr == (
        f"run.sh: --recipe=zreo2: image {cpu_image} holds no recipe zreo2: did you mean zero2? pick one of "
        f"{', '.join(folder_names())} or give a folder that holds a recipe.yaml\n"), proc.stderr
    assert not (runs / "typo").exists()

    proc = run_sh("--recipe=ddp", "--run-id=r1", f"--data={data}", "--", "--max_steps", "1")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert f"data {data}: format prompt_completion" in said
    assert f"the model is in {runs}/r1/model, the record in {runs}/r1/manifest.json" in said
    assert "/workspace/" not in said, said[-3000:]
    data.write_text(data.read_text() + "{not json\n")
    proc = run_sh("--recipe=ddp", "--run-id=r2", f"--data={data}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"error: cannot read {data}:17: not JSON" in said, said[-3000:]
    assert "/workspace/" not in said, said[-3000:]


def test_invoke_shell_runs_the_commands_piped_into_it_and_exits_with_theirs(cpu_image, tmp_path):
    """Without a terminal, `invoke shell` gave docker no -i: bash in the container read nothing, ran nothing and
    exited 0, whatever was piped in. Now the commands reach it, as the image's user, and their exit status is the
    shell's."""
    import os
    import subprocess

    from tests.support.cli import INVOKE

    r = subprocess.run([*INVOKE, "shell", "--variant=cpu"], input="id -u\nexit 3\n", cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str(os.getuid()), "ran as you, in the image"


def test_a_container_names_torchs_own_loopback_address_itself(cpu_image, tmp_path):
    """torch's TCP store meets its processes at ::ffff:127.0.0.1 and looks that address up. With no hosts entry for
    it each lookup asked the DNS server: where that server does not answer (an air-gapped node's resolv.conf), a
    2-process start took 23.9 s, not 4.8 s (docs/multinode.md). Asked of the hosts file alone (`-s files`), so a
    container without the entry fails here rather than asking a DNS server."""
    import os
    import subprocess

    from tests.support.cli import INVOKE

    r = subprocess.run([*INVOKE, "shell", "--variant=cpu"], input="getent -s files hosts ::ffff:127.0.0.1\n",
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["::ffff:127.0.0.1", "loopback-v4mapped"], r.stdout[-2000:]


def test_a_shell_kept_with_keep_is_committed_with_what_was_changed_in_it(cpu_image, tmp_path):
    """The newcomer audit: what a user installed in `invoke shell` was gone when they left it (`docker run --rm`),
    so the `invoke commit` its help pointed to had no container. With --keep the container stays under the name
    the shell says, and commit makes an image that holds the change."""
    import os
    import re
    import subprocess

    from tests.support.cli import INVOKE

    r = subprocess.run([*INVOKE, "shell", "--variant=cpu", "--keep"], input="echo kept > /tmp/mine.txt\nexit 0\n",
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    name = re.search(r"invoke commit --container=(dockyard-shell-\d+)", r.stderr)
    assert r.returncode == 0 and name, r.stdout[-2000:] + r.stderr[-2000:]
    container, tag = name.group(1), f"dockyard-kept-test:{os.getpid()}"
    try:
        got = invoke("commit", f"--container={container}", f"--tag={tag}")
        assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
        shown = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", tag, "/tmp/mine.txt"],
                               capture_output=True, text=True, timeout=120)
        assert shown.stdout.strip() == "kept", shown.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_ctrl_c_stops_the_run_and_says_the_command_that_continues_it(cpu_image, tmp_path):
    """Ctrl-C printed `error: interrupted: ` and the whole ~1000-character docker command, nothing on how to go on.
    The signal reaches the whole process group, as a terminal sends it; the command the message gives then
    continues the run from its checkpoint with its own settings, to its own max_steps."""
    import os
    import shlex
    import signal
    import subprocess
    import time

    from tests.support.cli import INVOKE

    env = {**os.environ, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    run = tmp_path / "runs" / "ctrlc"
    p = subprocess.Popen([*INVOKE, "run", "--variant=cpu", "--recipe=ddp", "--run-id=ctrlc", "--", "--max_steps", "60",
                          "--save_steps", "2", "--logging_steps", "1"], cwd=ROOT, env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        deadline = time.time() + 300
        while not list((run / "checkpoints").glob("checkpoint-*/complete.json")):  # (older ones are rotated away)
            assert p.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err[-3000:]
    said = err.strip().splitlines()[-1]
    assert said.startswith("error: interrupted: run ctrlc stopped. Continue it from its last complete checkpoint, "
                           "with its own settings: invoke run --resume --run-id=ctrlc --variant=cpu"), said
    assert len(said) < 300 and "docker" not in said
    command = shlex.split(said.split("with its own settings: ", 1)[1])
    assert command[:2] == ["invoke", "run"]
    resumed = subprocess.run([*INVOKE, *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 60 and m["overrides"]["max_steps"] == 60
    # done: the trainer's refusal names the checkpoint where it is on this host, not inside the container
    again = subprocess.run([*INVOKE, *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and f"the weights of that step are in {run}/checkpoints/checkpoint-60" in again.stdout \
        + again.stderr, again.stdout[-2000:] + again.stderr[-2000:]
    refusal = [line for line in (again.stdout + again.stderr).splitlines() if "already at max_steps" in line]
    assert refusal and not any("/workspace/" in line for line in refusal), refusal
