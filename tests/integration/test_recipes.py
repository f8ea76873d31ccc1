"""Every recipe trains for real: 2 processes under torchrun (gloo; DeepSpeed on its CPU accelerator), the tiny
model, a few steps. Each test checks what a user relies on: the run completed, the loss fell, the strategy in
effect is the recipe's, and the saved model reloads into the model that was trained."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LORA_LR = ["--learning_rate", "1e-2"]  # adapters on a random tiny base need a push to learn in 12 steps
FAST = ["--max_steps", "12", "--per_device_train_batch_size", "4", "--max_seq_length", "64",
        "--learning_rate", "3e-3", "--lr_scheduler_type", "constant", "--save_steps", "6"]


def env() -> dict[str, str]:
    e = {**os.environ, "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
         "PYTHONPATH": str(ROOT)}
    for k in ("DOCKYARD_VARIANT", "DOCKYARD_IMAGE_REF", "DOCKYARD_IMAGE_ID"):
        e.pop(k, None)
    return e


def command(recipe: str, run_dir: Path, *overrides: str, nproc: int = 2, resume: bool = False) -> list[str]:
    return [*TORCHRUN, "--nproc-per-node", str(nproc), "--standalone", "-m", "dockyard.train",
            "--recipe", recipe, "--run-dir", str(run_dir), *(["--resume"] if resume else []), "--", *overrides]


def train(recipe: str, run_dir: Path, *overrides: str, nproc: int = 2, resume: bool = False,
          ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(recipe, run_dir, *overrides, nproc=nproc, resume=resume), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=900)
    if ok and proc.returncode != 0:
        pytest.fail(f"{recipe} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def reload_logits(run_dir: Path, m: dict) -> torch.Tensor:
    """Logits of the saved model (or the base plus the saved adapter) on the run's probe input."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if m.get("task") == "seq_cls" else AutoModelForCausalLM
    dtype = getattr(torch, m["probe"]["dtype"])
    if m["model"]["format"] == "adapter":
        from peft import PeftModel

        kwargs = {}
        if m["strategy"]["peft"] == "qlora":
            from dockyard.train.model import quantization_config

            kwargs["quantization_config"] = quantization_config(dtype)
        model = PeftModel.from_pretrained(auto.from_pretrained(m["model"]["base"], dtype=dtype, **kwargs),
                                          run_dir / "model")
    else:
        model = auto.from_pretrained(run_dir / "model", dtype=dtype)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([m["probe"]["input_ids"]])).logits.float()
    return (out[0, -1] if out.dim() == 3 else out[0])[:16]


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
    assert "loss" in (run_dir / "train.log").read_text()
    # bf16 weights (LoRA bases) reload bit-exact, but QLoRA trains its norms in fp32 and reloads them in bf16
    tolerance = 1e-4 if m["probe"]["dtype"] == "float32" else 2e-2
    assert torch.allclose(reload_logits(run_dir, m), torch.tensor(m["probe"]["logits"]), atol=tolerance), \
        "the saved model, reloaded, is not the model that was trained"
    return m


def test_zero2_trains_and_saves_a_model_that_reloads(tmp_path):
    run = tmp_path / "run"
    train("zero2", run, *FAST)
    assert_trained(run, "zero2", "deepspeed", zero_stage=2, offload_optimizer=None, offload_param=None)
    assert (run / "base" / "config.json").is_file()


def test_ddp_trains(tmp_path):
    run = tmp_path / "run"
    train("ddp", run, *FAST)
    assert_trained(run, "ddp", "ddp", zero_stage=None)


def test_zero3_saves_gathered_weights_that_reload(tmp_path):
    run = tmp_path / "run"
    train("zero3", run, *FAST)
    assert_trained(run, "zero3", "deepspeed", zero_stage=3, offload_optimizer=None, offload_param=None)


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
    train("qlora", run, *FAST, *LORA_LR)
    m = assert_trained(run, "qlora", "ddp")
    assert m["strategy"]["peft"] == "qlora"
    assert m["model"]["quantized_layers"] == 14  # q, k, v, o, gate, up, down in both layers: all 4-bit


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
