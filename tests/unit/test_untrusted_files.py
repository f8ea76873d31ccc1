"""What the sixth red-team pass planted in files and folders the host and the trainer read: a JSON integer of 5,000
digits, JSON nested 100,000 deep on one line of metrics.jsonl, a folder nested 1,200 deep, values no run logs, and
control characters in a manifest. Each is one error line, or a line skipped, never a traceback; a run that trained
still writes its manifest and its monitor's verdict."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from dockyard import ROOT
from dockyard.common import recipes, runfolder
from dockyard.common.errors import DockyardError, json_object
from dockyard.common.recipes import RECIPES
from dockyard.launch import monitor
from dockyard.launch.summary import summarise
from dockyard.train import checkpoints, guards, manifest
from tests.support.cli import invoke_here, short_error

HUGE = "9" * 5000  # past the 4,300 digits Python converts to an int


def test_an_integer_of_thousands_of_digits_is_one_error_line_wherever_json_is_read(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(f'{{"model_type": "llama", "hidden_size": {HUGE}}}')
    r = invoke_here("plan", f"--model={model}", "--gpus=1", "--gpu-mem=80")
    short_error(r, f"{model}/config.json is not valid JSON: a number of more digits than can be read (4,300)")
    data = tmp_path / "d.jsonl"
    data.write_text(f'{{"text": "hi", "id": {HUGE}}}\n')
    r = invoke_here("run", "--dry", "--variant=cpu", f"--data={data}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, f"{data}:1: not JSON (a number of more digits than can be read (4,300)")
    with pytest.raises(DockyardError, match="nested too deeply to read"):
        (tmp_path / "deep.json").write_text("[" * 100_000)
        json_object(tmp_path / "deep.json", "a test")


def test_a_deep_or_foreign_line_in_metrics_leaves_the_runs_manifest_and_its_plot(tmp_path):
    """One line nested 100,000 deep: manifest.build (outside the trainer's try) raised RecursionError, so a run that
    trained and saved its model ended in a traceback with no manifest.json; `"loss": [1]` went into the manifest as
    loss_last, which the host then refused as no manifest of the trainer's."""
    (tmp_path / runfolder.METRICS).write_text('{"step": 1, "loss": 2.5}\n' + "[" * 100_000 + "\n"
                                              '{"step": 2, "loss": [1]}\n{"step": 3, "loss": 2.0}\n')
    m = manifest.build(tmp_path, None, "completed", 1, None, {"peak_memory_bytes": 1}, {})
    assert (m["metrics"]["loss_first"], m["metrics"]["loss_last"]) == (2.5, 2.0)
    runfolder.write(tmp_path, runfolder.MANIFEST, json.dumps(m))
    assert runfolder.read_manifest(tmp_path).metrics.loss_last == 2.0
    assert monitor.read_losses(tmp_path) == {"loss": [(1, 2.5), (3, 2.0)]}


def test_values_no_run_logs_are_left_out_of_the_loss_plot_which_still_draws(tmp_path):
    """`"loss": 10**400` was an OverflowError and ±1e308 left matplotlib no axis: either way the monitor wrote no
    verdict (monitor.json) and no loss.png."""
    (tmp_path / runfolder.METRICS).write_text(
        f'{{"step": 1, "loss": {HUGE[:400]}}}\n{{"step": 2, "loss": 1e308}}\n{{"step": 3, "loss": -1e308}}\n'
        '{"step": true, "loss": 1.0}\n{"step": 4, "loss": 3.0}\n{"step": 5, "loss": 2.0}\n')
    series = monitor.read_losses(tmp_path)
    assert series == {"loss": [(4, 3.0), (5, 2.0)]}
    assert monitor.plot_loss(series).startswith(b"\x89PNG")


@pytest.mark.parametrize("change,says", [
    ({"status": "completed\n\x1b[31mred"}, "status .*: holds a control character"),
    ({"metrics": {"peak_memory_bytes": 10**400}}, "metrics.peak_memory_bytes"),
    ({"model": {"quantized_layers": -5}}, "model.quantized_layers"),
])
def test_a_manifest_the_summary_cannot_print_is_refused_in_one_line(tmp_path, change, says):
    """The end of `invoke run`: an escape sequence in the status reached the terminal as it was, and 10**400 bytes
    of peak memory was an OverflowError traceback."""
    m = {"run_id": "x", "status": "completed", "recipe": "ddp", "metrics": {"steps": 1}, **change}
    (tmp_path / runfolder.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DockyardError, match=f"is not a manifest the trainer writes .*{says}"):
        summarise(tmp_path)


def test_a_checkpoint_whose_safetensors_header_nests_deep_is_damaged_not_a_traceback(tmp_path):
    checkpoint = tmp_path / "checkpoint-5"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(struct.pack("<Q", 50_000) + b"[" * 50_000)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 5}')
    with pytest.raises(DockyardError, match=r"checkpoint-5 is damaged \(model.safetensors: not a safetensors file "
                                            r"\(its header: nested too deeply to read\)\)"):
        checkpoints.check(checkpoint)


def test_a_quantization_config_given_as_text_is_one_line_in_the_trainer(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "quantization_config": "gptq"}')
    with pytest.raises(DockyardError, match="quantization_config is str, where from_pretrained reads an object"):
        guards.reject_prequantized(str(tmp_path), "zero3")


def _nest(top: Path, depth: int) -> list[Path]:
    """`depth` folders, each in the last (os.makedirs recurses too), deepest last."""
    made, path = [], top
    for _ in range(depth):
        path = path / "a"
        os.mkdir(path)
        made.append(path)
    return made


def test_folders_nested_past_pythons_recursion_limit_are_walked(tmp_path):
    """Python 3.11's os.walk and Path.rglob recurse per level: a folder 1,200 deep planted in a run folder or a recipe
    folder was a RecursionError traceback in `invoke export`, `run --resume` and `run --dry --recipe=FOLDER`. The
    folders are removed here one by one: shutil.rmtree recurses as well."""
    run, recipe = tmp_path / "run", tmp_path / "myrec"
    run.mkdir()
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text((RECIPES / "ddp" / "recipe.yaml").read_text())
    made = _nest(run, 1200) + _nest(recipe, 1200)
    try:
        (made[1199] / "weights.bin").write_bytes(b"x" * 10)
        os.symlink("/etc/passwd", made[-1] / "planted")
        runfolder.check(run)  # nothing but folders and a file: passes
        assert runfolder.fingerprint(run)["bytes"] == 10
        with pytest.raises(DockyardError, match=f"{made[-1]}/planted is a link to /etc/passwd, outside the recipe"):
            recipes.load_recipe(str(recipe))
    finally:
        for path in [made[-1] / "planted", made[1199] / "weights.bin"]:
            path.unlink()
        for path in reversed(made):
            os.rmdir(path)


def _variants_file(tmp_path: Path, *, extra_name: str = "") -> Path:
    """images/variants.yaml with its cpu variant alone (and, with `extra_name`, a copy of it of that name); the lock
    files it names are the checkout's."""
    import yaml

    raw = yaml.safe_load((ROOT / "images" / "variants.yaml").read_text())
    raw["variants"] = {"cpu": raw["variants"]["cpu"], **({extra_name: raw["variants"]["cpu"]} if extra_name else {})}
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_variants_file_of_cpu_alone_plans_cpu_and_refuses_gpu_nodes_in_one_line(tmp_path):
    """max() of no CUDA variant was a ValueError traceback in slurm and k8s with --gpus-per-node; on a GPU host, auto
    said the driver was "older than every CUDA variant: " (none listed)."""
    env = {"INVOKE_DOCKYARD_VARIANTS_FILE": str(_variants_file(tmp_path)),
           "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    for task in ("slurm", "k8s"):
        r = invoke_here(task, "--recipe=ddp", "--nodes=2", "--gpus-per-node=4", f"--out={tmp_path}/{task}", env=env)
        short_error(r, "defines no CUDA variant, and GPU nodes need one")
    r = invoke_here("build", "--dry", env={**env, "DOCKYARD_NVML_REPLAY": str(
        ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x1_580.json")})
    assert r.returncode == 0 and "auto → cpu: the variants file defines no CUDA variant" in r.stdout + r.stderr, r.stderr


def test_names_another_word_holds_are_refused_in_a_variants_file_and_a_recipe(tmp_path):
    """A variant named `all` could never be locked alone (`invoke lock --variant=all` locks every one); `name:` in a
    recipe.yaml was "Recipe() got multiple values for keyword argument 'name'"."""
    r = invoke_here("lock", "--dry", "--variant=cpu",
                    env={"INVOKE_DOCKYARD_VARIANTS_FILE": str(_variants_file(tmp_path, extra_name="all"))})
    short_error(r, "variant 'all': `all` is `invoke lock`'s word for every variant, never a variant's name")
    short_error(invoke_here("lock", "--dry", "--variant=CPU"), "unknown variant 'CPU'; valid: all, auto,")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text((RECIPES / "ddp" / "recipe.yaml").read_text() + "name: other\n")
    with pytest.raises(DockyardError, match="recipe.yaml: name cannot be set here: a recipe's name is its folder's"):
        recipes.load_recipe(str(mine))


def _settle_lost_node_0(tmp_path: Path, monkeypatch, own: dict, node_0s: dict | None = None,
                        rank: str | None = "1") -> None:
    """The image's torchrun on node 1 once its workers stopped with node 0 gone (dockyard.train.torchrun.settle),
    with the run folder's manifests as `own` (node 1's, this attempt's) and `node_0s` (the run's manifest.json)."""
    from dockyard.train import torchrun

    if rank is None:
        monkeypatch.delenv("DOCKYARD_NODE_RANK", raising=False)
    else:
        monkeypatch.setenv("DOCKYARD_NODE_RANK", rank)
    args = ["--nnodes=2", "--rdzv-endpoint=10.0.0.9:29500", "--rdzv-id=r1", "-m", "dockyard.train", "--run-dir",
            str(tmp_path)]
    (tmp_path / "manifest-node1.json").write_text(json.dumps(own))
    if node_0s is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(node_0s))
    torchrun.settle(args, torchrun.torchrun_args(args), None, {})


LOST_0 = {"run_id": "r1", "node_rank": 1, "status": "failed", "error": "lost node 0 (10.0.0.9, host gpu-a): it stopped "
          "answering", "nodes_seen": [{"node_rank": 0, "host": "gpu-a", "addr": "10.0.0.9"}]}


def test_node_0s_error_said_by_the_node_that_outlived_it_reaches_the_terminal_as_text(tmp_path, monkeypatch, capfd):
    """Node 1 says node 0's error from the run's manifest.json, which anything that ran with the runs folder mounted
    can write: an escape sequence in it drove the terminal of node 1's `invoke run` (retitled it, cleared it)."""
    _settle_lost_node_0(tmp_path, monkeypatch, LOST_0,
                        {"run_id": "r1", "node_rank": 0, "status": "failed", "error": "\x1b]0;owned\x07\x1b[2JCUDA oom"})
    said = capfd.readouterr().err
    assert "failed first: \\x1b]0;owned\\x07\\x1b[2JCUDA oom" in said and "\x1b" not in said and "\x07" not in said


def test_a_node_not_told_its_rank_rewrites_no_record(tmp_path, monkeypatch):
    """A torchrun of several nodes started by hand, without DOCKYARD_NODE_RANK: torchrun numbers the nodes itself, and
    the agent of node 1 took itself for node 0, reading the run's manifest.json (node 0's) as its own record."""
    node_0s = {"run_id": "r1", "node_rank": 0, "status": "failed", "nodes_seen": LOST_0["nodes_seen"],
               "error": "lost node 1 (10.0.0.10, host gpu-b): it stopped answering"}
    node_1s = {**LOST_0, "error": "CUDA out of memory"}
    _settle_lost_node_0(tmp_path, monkeypatch, node_1s, node_0s, rank=None)
    assert json.loads((tmp_path / "manifest.json").read_text()) == node_0s
    _settle_lost_node_0(tmp_path, monkeypatch, node_1s, node_0s, rank="0")  # told: node 0 says who failed first
    assert json.loads((tmp_path / "manifest.json").read_text())["error"].startswith("node 1 (?) failed first: CUDA")


def test_a_record_nested_deep_left_for_the_node_that_outlived_node_0_is_no_traceback(tmp_path, monkeypatch, capfd):
    """Node 1's manifest-node1.json rewritten, nested 600 deep (json reads it): its torchrun, making it the run's
    manifest.json, ended in a RecursionError traceback from manifest.finite instead of its one line."""
    _settle_lost_node_0(tmp_path, monkeypatch, {**LOST_0, "metrics": json.loads("[" * 600 + "]" * 600)})
    assert "Traceback" not in capfd.readouterr().err
    assert not (tmp_path / "manifest.json").exists(), "a record no trainer writes is not made the run's"
