"""Native training runs for the tests: torchrun of `python -m dockyard.train` from this checkout, and what a
run leaves behind (its manifest, the logits of its saved model reloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dockyard import ROOT
from dockyard.common import runfolder

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LORA_LR = ["--learning_rate", "1e-2"]  # adapters on a random tiny base need a push to learn in 12 steps
FAST = ["--max_steps", "12", "--per_device_train_batch_size", "4", "--max_seq_length", "64",
        "--learning_rate", "3e-3", "--lr_scheduler_type", "constant", "--save_steps", "6", "--logging_steps", "1"]


def env(gpu: bool = False) -> dict[str, str]:
    """The trainer's environment; on CPU DeepSpeed must use its CPU accelerator, on GPUs it must not (it would
    run beside an NCCL process group on CUDA batches)."""
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    e.pop("DS_ACCELERATOR", None)
    if not gpu:
        e["DS_ACCELERATOR"] = "cpu"
    for k in ("DOCKYARD_VARIANT", "DOCKYARD_IMAGE_REF", "DOCKYARD_IMAGE_ID"):
        e.pop(k, None)
    return e


def command(recipe: str, run_dir: Path, *overrides: str, nproc: int = 2, resume: bool = False,
            logs: Path | None = None) -> list[str]:
    """torchrun of the trainer, its logs folder in `logs` (default: torchrun-logs beside the run folder, in the test's
    own tmp folder): plain torchrun makes a /tmp/torchelastic_<random> per run and never removes it."""
    logs = logs or run_dir.parent / "torchrun-logs"
    return [*TORCHRUN, "--nproc-per-node", str(nproc), "--standalone", "--log-dir", str(logs), "-m", "dockyard.train",
            "--recipe", recipe, "--run-dir", str(run_dir), *(["--resume"] if resume else []), "--", *overrides]


def train(recipe: str, run_dir: Path, *overrides: str, nproc: int = 2, resume: bool = False,
          ok: bool = True, gpu: bool = False, logs: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(recipe, run_dir, *overrides, nproc=nproc, resume=resume, logs=logs), cwd=ROOT,
                          env=env(gpu),
                          capture_output=True, text=True, timeout=900)
    if ok and proc.returncode != 0:
        pytest.fail(f"{recipe} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def chat_data(path: Path) -> Path:
    """A small chat dataset (the `messages` format: short user/assistant turns), for the padding-free tests."""
    turns = [("What is two and two?", "Four."), ("Name a colour.", "Blue is a colour."), ("Say hi.", "Hi there!")]
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                            + "\n" for q, a in turns * 64))  # more than a step of 8 GPUs takes (8 each)
    return path


def manifest(run_dir: Path, node_rank: int = 0) -> dict:
    """The manifest a node of the run wrote (node 0's manifest.json, node 1's manifest-node1.json...)."""
    return json.loads((run_dir / runfolder.manifest_file(node_rank)).read_text())


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
        # bitsandbytes puts a QLoRA base on the GPU where there is one: the input goes where the model is.
        ids = torch.tensor([m["probe"]["input_ids"]], device=model.device)
        out = model(input_ids=ids).logits.float().cpu()
    return (out[0, -1] if out.dim() == 3 else out[0])[:16]
