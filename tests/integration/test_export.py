"""`invoke export`: a run's model as a plain Hugging Face folder that transformers alone (or peft, for an adapter)
reloads into the model that was trained. ddp, lora and qlora trained for real (tiny model, CPU), exported as users
run it; and once through the image, the way a run in a container is exported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from dockyard import ROOT
from tests.support.cli import INVOKE, invoke
from tests.support.training import FAST, LORA_LR, manifest, train

SHORT = [*FAST, "--max_steps", "4", "--save_steps", "100"]


def _logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1, :16]


@pytest.mark.parametrize("recipe", ["ddp", "lora", "qlora"])
def test_export_writes_a_folder_that_reloads_into_the_trained_model(tmp_path, recipe):
    runs = tmp_path / "runs"
    train(recipe, runs / "r", *SHORT, *(LORA_LR if "lora" in recipe else []))
    m = manifest(runs / "r")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}

    r = invoke("export", "--run=r", env=env)  # trained on this host: said by the user, not read from the manifest
    assert r.returncode == 1 and "say so: invoke export --run=r --native" in r.stderr, r.stderr
    r = invoke("export", "--run=r", "--native", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "largest logit difference" in r.stdout and "tolerance" in r.stdout
    # the saved model is the one that ended training (its probe): said, no warning (a real run's bf16/4-bit logits)
    assert "model/ is the model as training ended" in r.stdout and "warning" not in r.stderr, r.stderr
    folder = runs / "r" / "export"
    assert (folder / "tokenizer.json").is_file()
    if recipe == "ddp":
        got = _logits(folder, m["probe"]["input_ids"])
        assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=1e-4), "not the model that was trained"
    else:
        assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA"
        r = invoke("export", "--run=r", "--merge", "--native", f"--out={tmp_path / 'merged'}", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        merged = tmp_path / "merged"
        assert not (merged / "adapter_config.json").exists(), "a plain model: no adapter left"
        got = _logits(merged, m["probe"]["input_ids"])
        # against the run's own (bf16 base + adapter; for QLoRA the 4-bit base it trained on, hence the margin)
        margin = 0.1 if recipe == "qlora" else 0.05
        assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=margin), (got, m["probe"]["logits"])
        if recipe == "qlora":
            assert "4-bit model as trained differs from it by up to" in r.stdout
        assert "model/ is the model as training ended" in r.stdout and "warning" not in r.stderr, r.stderr

    r = invoke("export", "--run=r", "--native", env=env)
    assert r.returncode == 1 and "already exists" in r.stderr, "an export never overwrites"


def test_export_of_a_run_in_the_image_merges_there(cpu_image, tmp_path):
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke("run", "--variant=cpu", "--recipe=lora", "--run-id=l1", "--", "--max_steps", "3",
               "--learning_rate", "1e-2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    r = invoke("export", "--run=l1", "--merge", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = manifest(tmp_path / "runs" / "l1")
    got = _logits(tmp_path / "runs" / "l1" / "merged", m["probe"]["input_ids"])
    assert torch.allclose(got, torch.tensor(m["probe"]["logits"]), atol=0.05)


def _until(found, what: str, bound: float = 120):
    """found()'s first true answer, polled; a failure naming `what` past `bound` seconds."""
    deadline = time.monotonic() + bound
    while not (got := found()):
        assert time.monotonic() < deadline, f"no {what} in {bound} s"
        time.sleep(0.05)
    return got


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True).stdout.strip()


def _exporter(target) -> int | None:
    """The pid of a native export's Python writing `target` (python -m dockyard.train.export ... --out TARGET)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"dockyard.train.export" in argv and str(target).encode() in argv:
            return int(pid)
    return None


def _kill_invoke_alone(env: dict, *args: str, writer) -> tuple[subprocess.Popen, object]:
    """`invoke export ARGS` started, then, once `writer()` names what it started (a container, a process), that
    writer frozen (it stands for an export of a large model, minutes long) and `kill -9` of invoke's process alone,
    not of its group: what it started is left writing."""
    p = subprocess.Popen([*INVOKE, "export", *args], cwd=ROOT, env={**os.environ, **env}, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found = _until(lambda: writer(p.pid), "writer of the export")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    return p, found


def test_an_export_whose_invoke_alone_was_killed_is_left_to_its_container(cpu_image, tmp_path):
    """`kill -9` of `invoke export` alone while its container writes: the container went on writing runs/ID/export,
    and the next export took the folder for abandoned (its marker names invoke's pid, gone) and removed it under the
    container. It is refused, naming the container, until that container is gone; then the folder is removed and
    written again."""
    runs = tmp_path / "runs"
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}
    r = invoke("run", "--variant=cpu", "--recipe=ddp", "--run-id=k", "--", "--max_steps", "2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]

    def container(pid):
        names = _docker("ps", "--format", "{{.Names}}", "--filter", f"name=dockyard-export-{pid}").split()
        name = next((n for n in names if n == f"dockyard-export-{pid}" or n.startswith(f"dockyard-export-{pid}-")), "")
        return name and _docker("pause", name) and name

    _, name = _kill_invoke_alone(env, "--run=k", writer=container)
    try:
        r = invoke("export", "--run=k", env=env)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [
            f"error: an export of run k into {runs / 'k' / 'export'} is still being written by container {name}, "
            f"though the invoke export that started it was killed: wait for it to end, or stop it (docker stop "
            f"{name}), then export again; nothing was removed"], r.stderr
        assert (runs / "k" / "export").is_dir() and [p for p in (runs / "k").iterdir() if p.suffix == ".partial"]
        _docker("unpause", name)
        _until(lambda: not _docker("ps", "-aq", "--filter", f"name={name}"), "end of the container")
    finally:
        _docker("rm", "-f", name)
    r = invoke("export", "--run=k", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"removed {runs / 'k' / 'export'}: an export killed before it finished left it" in r.stdout
    assert not [p for p in (runs / "k").iterdir() if p.suffix == ".partial"]


def test_a_native_export_whose_invoke_alone_was_killed_is_left_to_its_python(tmp_path):
    """The same for --native: the export's Python, a child of invoke, outlives it and writes on."""
    runs = tmp_path / "runs"
    train("ddp", runs / "n", "--max_steps", "2", "--save_steps", "100")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs)}
    target = runs / "n" / "export"

    def frozen(_pid):
        pid = _exporter(target)
        if pid:
            os.kill(pid, signal.SIGSTOP)
        return pid

    _, pid = _kill_invoke_alone(env, "--run=n", "--native", writer=frozen)
    try:
        r = invoke("export", "--run=n", "--native", env=env)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [
            f"error: an export of run n into {target} is still being written by process {pid}, though the invoke "
            f"export that started it was killed: wait for it to end, or stop it (kill {pid}), then export again; "
            "nothing was removed"], r.stderr
        assert target.is_dir()
        os.kill(pid, signal.SIGCONT)
        _until(lambda: _exporter(target) is None, "end of the export's Python")
    finally:
        if _exporter(target):
            os.kill(pid, signal.SIGKILL)
    r = invoke("export", "--run=n", "--native", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert not [p for p in (runs / "n").iterdir() if p.suffix == ".partial"]
