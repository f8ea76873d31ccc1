"""The trainer's guards, one by one, on plain inputs (no processes)."""

from __future__ import annotations

import json

import pytest
import torch

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES, load_recipe, recipe_names
from dockyard.train import guards, strategy


def test_more_than_one_gpu_in_one_process_is_refused_with_how_to_launch():
    with pytest.raises(DockyardError, match="torchrun --nproc-per-node 4"):
        guards.one_process_per_gpu(4)
    with pytest.raises(DockyardError, match="sees 2 GPUs"):  # the smallest DataParallel there is
        guards.one_process_per_gpu(2)
    guards.one_process_per_gpu(1)
    guards.one_process_per_gpu(0)


@pytest.mark.parametrize("strategy_name, cuda, expected", [
    ("ddp", True, {"": 3}),            # DDP, LoRA, QLoRA: the whole model on this process's GPU
    ("ddp", False, None),
    ("zero2", True, None),             # DeepSpeed and FSDP place the weights themselves
    ("zero3", True, None),
    ("zero3-offload", True, None),
    ("fsdp", True, None),
])
def test_device_map_is_never_auto(strategy_name, cuda, expected):
    assert guards.device_map(strategy_name, 3, cuda) == expected


def test_load_model_passes_the_device_map_of_the_local_rank(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    from dockyard.common.run_settings import RunSettings
    from dockyard.train import model as models

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: (seen.update(kw), (torch.nn.Linear(1, 1), {}))[1])
    models.load_model(str(tmp_path), load_recipe("ddp"), RunSettings(), None, [], 1)
    assert seen["device_map"] == {"": 1}
    models.load_model(str(tmp_path), load_recipe("zero3"), RunSettings(), None, [], 1)
    assert seen["device_map"] is None


def test_lora_with_gradient_checkpointing_gets_non_reentrant_checkpointing_and_no_unused_search():
    args = guards.peft_training_args({"gradient_checkpointing": True, "learning_rate": 1e-3}, "lora")
    assert args["ddp_find_unused_parameters"] is False
    assert args["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert args["learning_rate"] == 1e-3
    assert guards.peft_training_args({"gradient_checkpointing": False}, "qlora") == {"gradient_checkpointing": False}
    assert guards.peft_training_args({"gradient_checkpointing": True}, None) == {"gradient_checkpointing": True}


def test_values_the_adapters_need_changed_are_said_not_changed_silently(caplog):
    """`--gradient_checkpointing_kwargs '{use_reentrant: true}' --ddp_find_unused_parameters true` on lora were
    replaced without a line."""
    given = {"gradient_checkpointing": True, "ddp_find_unused_parameters": True,
             "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    args = guards.peft_training_args(given, "lora")
    assert args["ddp_find_unused_parameters"] is False and args["gradient_checkpointing_kwargs"]["use_reentrant"] is False
    assert "ddp_find_unused_parameters true, use_reentrant true: set to false for lora" in caplog.text
    caplog.clear()
    guards.peft_training_args({"gradient_checkpointing": True}, "lora")
    assert "set to false" not in caplog.text


def test_lora_with_gradient_checkpointing_enables_input_grads():
    from transformers import LlamaConfig, LlamaForCausalLM

    from dockyard.common.run_settings import RunSettings
    from dockyard.train.model import add_lora

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    model = add_lora(model, load_recipe("lora"), RunSettings(lora_r=2), gradient_checkpointing=True)
    embeddings = model.get_input_embeddings()(torch.tensor([[1, 2]]))
    assert embeddings.requires_grad, "checkpointed blocks would pass no gradient to the adapters"


def test_qlora_stores_4bit_weights_in_the_model_dtype():
    from dockyard.train.model import quantization_config

    q = quantization_config(torch.bfloat16)
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4"
    assert q.bnb_4bit_quant_storage == torch.bfloat16  # FSDP/ZeRO-3 flatten it with the bf16 weights


@pytest.mark.parametrize("method, strategy_name, refused", [
    ("gptq", "zero3", True), ("awq", "fsdp", True), ("gptq", "zero3-offload", True),
    ("gptq", "ddp", False), ("bitsandbytes", "zero3", False),
])
def test_prequantized_checkpoints_are_refused_where_they_cannot_be_sharded(tmp_path, method, strategy_name, refused):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": method}}))
    if refused:
        with pytest.raises(DockyardError, match=method.upper()):
            guards.reject_prequantized(str(tmp_path), strategy_name)
    else:
        guards.reject_prequantized(str(tmp_path), strategy_name)


@pytest.mark.parametrize("name", [n for n in recipe_names() if load_recipe(n).deepspeed])
def test_shipped_deepspeed_configs_are_valid_and_auto(name):
    recipe = load_recipe(name)
    cfg = guards.deepspeed_config(recipe.file(recipe.deepspeed), recipe.strategy)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert cfg[key] == "auto"  # explicit values that disagree with TrainingArguments are an error


def test_misspelt_deepspeed_keys_are_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipings": 1.0}))
    with pytest.raises(DockyardError, match="unknown DeepSpeed key.*gradient_clipings"):
        guards.deepspeed_config(path, "zero2")
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_com": False}}))
    with pytest.raises(DockyardError, match="overlap_com"):
        guards.deepspeed_config(path, "zero2")


def test_zero3_always_gathers_16bit_weights_on_save(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    cfg = guards.deepspeed_config(path, "zero3")
    assert cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert "stage3_gather_16bit_weights_on_model_save" not in json.loads(path.read_text())["zero_optimization"]


def test_fsdp_always_saves_a_full_state_dict(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text("fsdp: true\nfsdp_config: {version: 2, state_dict_type: SHARDED_STATE_DICT}\n")
    assert guards.fsdp_settings(path) == {"fsdp": True, "fsdp_config": {"version": 2,
                                                                        "state_dict_type": "FULL_STATE_DICT"}}
    shipped = guards.fsdp_settings(load_recipe("fsdp").file("fsdp.yaml"))
    assert shipped["fsdp"] is True and shipped["fsdp_config"]["version"] == 2
    path.write_text("fsdp: true\nlearning_rate: 1\n")
    with pytest.raises(DockyardError, match="not learning_rate"):
        guards.fsdp_settings(path)


def test_offload_is_refused_when_the_host_lacks_the_ram():
    with pytest.raises(DockyardError, match="needs about 18.6 GiB.*only 8.0 GiB"):
        guards.check_offload_memory("zero3-offload", int(18.6 * 2**30), 10**9, 8 * 2**30)
    guards.check_offload_memory("zero3-offload", 2**30, 10**8, 8 * 2**30)


@pytest.mark.parametrize("files", [
    {"memory.max": "2147483648", "memory.current": "536870912"},                       # cgroup v2
    {"memory/memory.limit_in_bytes": "2147483648", "memory/memory.usage_in_bytes": "536870912"},  # v1
])
def test_host_memory_is_the_containers_limit_less_its_usage(tmp_path, files):
    """In a container limited to 2 GiB that uses 0.5 GiB, 1.5 GiB is what the OOM killer leaves."""
    import psutil

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert psutil.virtual_memory().available > 2 * 2**30  # this host has more: the limit is what counts
    assert guards.host_memory_available(tmp_path) == 3 * 2**29


def test_host_memory_without_a_limit_is_what_the_host_has_free(tmp_path):
    import psutil

    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("536870912\n")
    assert guards.host_memory_available(tmp_path) == pytest.approx(psutil.virtual_memory().available, rel=0.05)


def test_defaults_name_no_deepspeed_or_fsdp_keys():
    text = (RECIPES / "defaults.yaml").read_text()
    assert "deepspeed" not in text.split("# --- any other key")[1] and "fsdp" not in text


# --- strategy in effect --------------------------------------------------------------------------

def test_expected_strategy_per_recipe():
    assert strategy.expected("ddp", 2)["engine"] == "ddp"
    assert strategy.expected("ddp", 1)["engine"] == "single"
    assert strategy.expected("zero2-offload", 2) == strategy.describe("deepspeed", 2, "cpu", None)
    assert strategy.expected("zero3-offload", 2) == strategy.describe("deepspeed", 3, "cpu", "cpu")
    assert strategy.expected("fsdp", 2) == strategy.describe("fsdp", fsdp_version=2)


def test_fsdp_falling_back_to_ddp_is_a_mismatch():
    with pytest.raises(DockyardError, match="strategy mismatch.*asks for fsdp.*running ddp.*only on GPUs"):
        strategy.check("fsdp", strategy.describe("ddp"), 2)


def test_a_lost_offload_is_a_mismatch():
    with pytest.raises(DockyardError, match="offload_optimizer: asked 'cpu', running None"):
        strategy.check("zero2-offload", strategy.describe("deepspeed", 2), 2)
    strategy.check("zero2", strategy.describe("deepspeed", 2), 2)


def test_an_unwrapped_model_is_single_process():
    assert strategy.in_effect(torch.nn.Linear(2, 2))["engine"] == "single"


def test_a_compiled_ddp_model_is_still_ddp(tmp_path):
    """torch_compile wraps DDP in torch.compile's OptimizedModule: read through it (the strategy check refused every
    compiled ddp run on 2+ GPUs as 'single' before)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        compiled = torch.compile(DistributedDataParallel(torch.nn.Linear(2, 2)))
        assert strategy.in_effect(compiled)["engine"] == "ddp"
        strategy.check("ddp", strategy.in_effect(compiled), 2)
        assert strategy.in_effect(torch.compile(torch.nn.Linear(2, 2)))["engine"] == "single"
        # one process under torchrun on CPU: accelerate wraps it in DDP all the same; that is the 'single' run
        strategy.check("ddp", strategy.in_effect(DistributedDataParallel(torch.nn.Linear(2, 2))), 1)
        strategy.check("ddp", strategy.in_effect(torch.nn.Linear(2, 2)), 1)
        with pytest.raises(DockyardError, match="strategy mismatch"):  # two processes asked, one running
            strategy.check("ddp", strategy.in_effect(torch.nn.Linear(2, 2)), 2)
        # block by block (accelerate's regional compilation, what the trainer does): a copy of the DDP wrapper
        # holding compiled blocks, still DDP, and said so
        from accelerate.utils import compile_regions

        blocks = compile_regions(DistributedDataParallel(_Stack()))
        assert strategy.in_effect(blocks)["engine"] == "ddp"
        assert strategy.compiled(blocks) == "block by block (4 modules)"  # 3 blocks and the head
    finally:
        dist.destroy_process_group()


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
        self.head = torch.nn.Linear(2, 2)


def test_how_the_model_is_compiled_is_read_from_its_objects():
    assert strategy.compiled(_Stack()) is None
    assert strategy.compiled(torch.compile(_Stack())) == "the whole model"
    inplace = _Stack()  # DeepSpeed's and FSDP2's regional compilation: Module.compile on each block, in place
    for block in inplace.blocks:
        block.compile()
    assert strategy.compiled(inplace) == "block by block (3 modules)"


def _ds_config(tmp_path, optimizer):
    cfg = json.loads((RECIPES / "zero2" / "ds_config.json").read_text())
    cfg.pop("optimizer", None)
    if optimizer:
        cfg["optimizer"] = optimizer
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("optimizer, refused", [
    ({"type": "AdamW", "params": {"lr": "auto"}}, True),      # DeepSpeed's FusedAdam: a CUDA op
    ({"type": "AdamW", "params": {"torch_adam": True}}, False),
    (None, False),                                             # the Trainer's torch AdamW
])
def test_on_gpus_without_nvcc_a_cuda_op_the_image_lacks_is_refused_before_training(tmp_path, monkeypatch,
                                                                                   optimizer, refused):
    """The trainer's own check, for native runs and images run without `invoke run`: on a GPU (faked here: this
    host has none; the GPU is the only thing faked) in an image with no CUDA compiler (cu128) and fused_adam not
    prebuilt, DeepSpeed would try a JIT build that cannot work, minutes in. Refused at once, with the ways out."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr("deepspeed.git_version_info.installed_ops", {"cpu_adam": True, "async_io": True,
                                                                    "fused_adam": False})
    path = _ds_config(tmp_path, optimizer)
    if refused:
        with pytest.raises(DockyardError, match=r"CUDA op fused_adam, which this image does not hold and cannot "
                                                r"compile.*torch_adam.*--devel"):
            guards.deepspeed_config(path, "zero2")
    else:
        assert guards.deepspeed_config(path, "zero2")["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize("cfg, ops", [
    ({"optimizer": "Adam"}, set()),                                                  # not a section: DeepSpeed refuses it
    ({"optimizer": {"type": "AdamW", "params": 3}}, {"fused_adam"}),
    ({"optimizer": {"type": "AdamW"}, "zero_optimization": [1]}, {"fused_adam"}),
    ({"optimizer": {"type": "AdamW"}, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, set()),
    ({"optimizer": {"type": None}}, set()),
])
def test_the_cuda_ops_of_a_malformed_ds_config_are_read_without_a_traceback(cfg, ops):
    """The ds_config is a user's file: its odd shapes are read, and DeepSpeed's own checks refuse them later."""
    from dockyard.common.recipes import deepspeed_cuda_ops

    assert set(deepspeed_cuda_ops(cfg)) == ops


@pytest.mark.parametrize("body,strategy,says", [
    ({"bf16": {"enabled": "auto"}}, "zero3", 'no zero_optimization section: the zero3 strategy needs one, with "stage": 3'),
    ({"zero_optimization": "fast"}, "zero2", "zero_optimization 'fast': takes an object of ZeRO settings"),
])
def test_a_deepspeed_config_without_a_zero_section_is_refused(tmp_path, body, strategy, says):
    """A zero3 ds.json without zero_optimization was a KeyError traceback, `"zero_optimization": "fast"` an
    AttributeError one."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(body))
    with pytest.raises(DockyardError, match=says):
        guards.deepspeed_config(path, strategy)


@pytest.mark.parametrize("text,says", [
    ("fsdp: [true\n", "fsdp.yaml is not valid YAML"),
    ("fsdp: true\nfsdp_config: abc\n", "fsdp_config 'abc': takes `key: value` lines of FSDP settings"),
    ("- fsdp\n", "expected `fsdp:` and `fsdp_config:` lines"),
])
def test_a_broken_fsdp_file_is_one_error_line(tmp_path, text, says):
    """fsdp.yaml that is not YAML was a ParserError traceback, `fsdp_config: abc` a TypeError one."""
    path = tmp_path / "fsdp.yaml"
    path.write_text(text)
    with pytest.raises(DockyardError, match=says) as e:
        guards.fsdp_settings(path)
    assert "\n" not in str(e.value)  # PyYAML's own message is six lines


def test_a_recipe_file_that_is_not_utf8_is_one_error_line(tmp_path):
    """A recipe.yaml in Latin-1 was a UnicodeDecodeError traceback, in the trainer and in `invoke run --dry`."""
    (tmp_path / "recipe.yaml").write_bytes("# invoke run --recipe=x\nwhen: Pick it for smørbrød.\nstrategy: ddp\n"
                                           .encode("latin-1"))
    with pytest.raises(DockyardError, match=r"recipe.yaml is not UTF-8 text \(.*\): save it as UTF-8"):
        load_recipe(tmp_path)


def test_recipe_files_saved_with_a_byte_order_mark_are_read_as_written(tmp_path):
    """A recipe.yaml saved with a UTF-8 BOM (Windows editors) was refused: "the first line must be a comment", though
    it was `# invoke run ...`; its fsdp.yaml and ds_config.json are read the same way."""
    for name in ("zero2", "fsdp"):
        folder = tmp_path / name
        folder.mkdir()
        for f in load_recipe(name).folder.iterdir():
            (folder / f.name).write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
        recipe = load_recipe(folder)
        assert recipe.command == f"invoke run --recipe={name}" and recipe.strategy == name
    assert guards.fsdp_settings(tmp_path / "fsdp" / "fsdp.yaml")["fsdp"] is True
    assert guards.deepspeed_config(tmp_path / "zero2" / "ds_config.json", "zero2")["zero_optimization"]["stage"] == 2


TOO_OLD = ("The NVIDIA driver on your system is too old (found version 12020). Please update your GPU driver by "
           "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx")


def cuda_that_fails(monkeypatch, message: str = TOO_OLD) -> None:
    """torch.cuda as in a CUDA image on a driver older than its CUDA: no usable GPU, and init() says why."""
    def init():
        raise RuntimeError(message)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", init)


def test_a_cuda_image_that_finds_no_usable_gpu_is_refused_with_torch_s_reason(monkeypatch):
    cuda_that_fails(monkeypatch)
    with pytest.raises(DockyardError, match=r"finds no usable GPU: The NVIDIA driver on your system is too old "
                                            r"\(found version 12020\)\. Check with nvidia-smi") as e:
        guards.gpus_as_the_image_says("cuda")
    assert "\n" not in str(e.value) and "--cpu" in str(e.value)
    guards.gpus_as_the_image_says("cpu")  # --cpu in a CUDA image, and the cpu image: CPU is what was asked for
    guards.gpus_as_the_image_says("")     # `python -m dockyard.train` by hand: as before, CPU where there is no GPU
    # `invoke run --native` on a host with GPUs sets cuda too: a CPU build of torch trained on CPU and said completed
    with pytest.raises(DockyardError, match=r"--native on a host with GPUs: this host's torch .* finds no usable GPU: "
                                            r"The NVIDIA driver .*, or add --cpu to train on CPU"):
        guards.gpus_as_the_image_says("cuda", native=True)


CU132_TORCH = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]  # no sm_70


def cuda_on(monkeypatch, capability: tuple[int, int], name: str, arch_list: list[str] = CU132_TORCH) -> None:
    """torch.cuda as a CUDA image's torch (built for `arch_list`) sees a GPU of `capability`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: arch_list)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)


def test_a_gpu_the_image_s_torch_has_no_code_for_is_refused_before_any_kernel(monkeypatch):
    """A V100 (7.0) given the cu132 image by a launcher that checks nothing on the host (a Slurm job's pyxis or
    Apptainer, Kubernetes, compose): torch's "no kernel image is available for execution on the device" at its
    first kernel, a traceback from every rank. One line now, naming the GPU and the variant that has its code."""
    cuda_on(monkeypatch, (7, 0), "Tesla V100-SXM2-16GB")
    with pytest.raises(DockyardError) as e:
        guards.gpus_as_the_image_says("cuda")
    said = str(e.value)
    assert "has no code for GPU 0 (Tesla V100-SXM2-16GB, compute 7.0): it holds 7.5;8.0;8.6;9.0;10.0;12.0;12.0+PTX" \
        in said and "cu128" in said and "\n" not in said
    for capability, name in (((9, 0), "NVIDIA H100 80GB HBM3"), ((8, 9), "NVIDIA L40S"), ((12, 1), "a GB10")):
        cuda_on(monkeypatch, capability, name)  # its own code, an older minor's (sm_86 on 8.9), or PTX
        guards.gpus_as_the_image_says("cuda")
    cuda_on(monkeypatch, (7, 0), "Tesla V100-SXM2-16GB", ["sm_70", "sm_75", "sm_80", "sm_90a"])  # cu128's torch
    guards.gpus_as_the_image_says("cuda")


def test_the_trainer_in_a_cuda_image_without_a_usable_gpu_fails_instead_of_training_on_cpu(monkeypatch, tmp_path,
                                                                                          capsys):
    """What reaches the trainer directly (run.sh, Slurm, Kubernetes): one error line, a failed manifest, no training."""
    from dockyard.train.__main__ import main

    cuda_that_fails(monkeypatch)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setenv("DOCKYARD_VARIANT", "cu132")  # the image's
    run_dir = tmp_path / "runs" / "r1"
    code = main(["--recipe", "ddp", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code != 0 and "error: this CUDA image (DS_ACCELERATOR=cuda) finds no usable GPU" in err
    assert "Traceback" not in err
    record = json.loads((run_dir / "manifest.json").read_text())
    assert record["status"] == "failed" and "too old" in record["error"]
    assert not (run_dir / "checkpoints").exists()


SHM = """
import json
from dockyard.train import guards
import deepspeed.ops
from deepspeed.comm.torch import build_shm_op
kept = guards.cpu_collectives_as_built(2)
print(json.dumps({"kept": kept, "op": build_shm_op() is not None}))
"""


def test_a_cpu_run_without_deepspeeds_shm_op_built_uses_gloo_instead_of_compiling_it():
    """A CUDA image trained with --cpu (and a native run) compiled DeepSpeed's shared-memory allreduce at every
    start, in a container whose compile cache starts empty: 98 s on this machine before the first step. This
    environment's DeepSpeed, like a CUDA image's, has no op built for the CPU: nothing is compiled now. The cpu
    image's own op is kept (tests/integration/test_image.py checks it is built there)."""
    import os
    import subprocess
    import sys

    from dockyard import ROOT

    r = subprocess.run([sys.executable, "-c", SHM], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT),
                            "TORCH_EXTENSIONS_DIR": "/nonexistent/never-compiled"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"kept": False, "op": False}
    assert "built successfully" not in r.stdout + r.stderr and "ninja" not in r.stdout + r.stderr


def test_a_one_process_cpu_run_of_the_cpu_image_leaves_the_shared_memory_op_unloaded_and_unsaid(monkeypatch, capsys):
    """A zero2 run of one process in the cpu image (--nproc=1, or a resume on one) printed "DeepSpeed
    deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" among the run's lines: DeepSpeed loading the op the
    image holds built, for an allreduce with no other process. With two processes the op is kept (and its line was
    already left out); with one, gloo's collectives, and nothing loaded or said."""
    import deepspeed.git_version_info as built
    import deepspeed.ops
    from deepspeed.comm.torch import build_shm_op

    monkeypatch.setattr(built, "installed_ops", {**built.installed_ops, "deepspeed_shm_comm": True})  # the cpu image's
    monkeypatch.setattr(built, "accelerator_name", "cpu")
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", True)
    assert guards.cpu_collectives_as_built(2) is True
    assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is True, "two processes share the op"
    assert guards.cpu_collectives_as_built(1) is False
    assert build_shm_op() is None
    assert "built successfully" not in capsys.readouterr().out


def _strategy_of(body: dict) -> str:
    """zero2, or zero2-offload where the body offloads the optimizer (each strategy refuses the other's config)."""
    return "zero2-offload" if "offload_optimizer" in body.get("zero_optimization", {}) else "zero2"


@pytest.mark.parametrize("body,says", [
    ({"bf16": {"enable": True}}, r"unknown DeepSpeed key bf16.enable \(did you mean bf16.enabled\?\)"),
    ({"fp16": {"enabled": "auto", "loss_scale_windw": 500}}, r"unknown DeepSpeed key fp16.loss_scale_windw"),
    ({"bf16": {"enabled": "yes please"}}, r"bf16: enabled 'yes please': takes true or false"),
    ({"comms_logger": {"enabled": True, "verbos": True}}, r"unknown DeepSpeed key comms_logger.verbos"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decya": 0.1}}},
     r"optimizer.params: weight_decya not known to AdamW \(it takes .*weight_decay"),
    ({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}, r"optimizer.params: max_grad_norm not known"),
    ({"optimizer": {"type": "AdamWW"}}, r'optimizer.type "AdamWW": ZeRO trains with Adam, AdamW.*check the spelling'),
    ({"optimizer": {"type": "AdamWW"}, "zero_allow_untested_optimizer": True},
     r'optimizer.type "AdamWW": DeepSpeed knows Adam, AdamW'),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}},
     r"scheduler.params: warmup_num_step not known to WarmupLR \(it takes .*warmup_num_steps"),
    ({"scheduler": {"type": "Cosine"}}, r'scheduler.type "Cosine": DeepSpeed knows LRRangeTest'),
    ({"optimizer": {"type": 5}}, r'optimizer.type 5: the name of one, in quotes \("type": "AdamW"\)'),
    ({"scheduler": {"type": ["WarmupLR"]}}, r"scheduler.type \['WarmupLR'\]: the name of one"),
    # DeepSpeed passes DeepSpeedCPUAdam its adamw_mode itself: "got multiple values for keyword argument"
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
      "optimizer": {"type": "AdamW", "params": {"adamw_mode": True}}}, r"adamw_mode not known to AdamW"),
])
def test_a_misspelt_key_inside_a_deepspeed_section_is_refused_before_the_model_loads(tmp_path, body, says):
    """DeepSpeed refuses these itself, but in deepspeed.initialize, after the model has loaded, as a traceback
    (bf16/fp16: pydantic's ValidationError; optimizer/scheduler params: a TypeError from the class it builds)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, **body}))
    with pytest.raises(DockyardError, match=says):
        guards.deepspeed_config(path, _strategy_of(body))


@pytest.mark.parametrize("body", [
    {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", "loss_scale_window": 500}},
    {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto",
                                               "adam_w_mode": True, "torch_adam": False}}},
    {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "foreach": True}}},
    # "Adam" with adam_w_mode false and torch_adam is torch's Adam, whose own settings DeepSpeed passes on
    {"optimizer": {"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False,
                                              "decoupled_weight_decay": True}}},
    {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
     "optimizer": {"type": "Lion", "params": {"fp32_optimizer_states": False}}},
    {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, "zero_allow_untested_optimizer": True},
    {"optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}}},
    {"optimizer": {"type": "adagrad"}},
    {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto",
                                                       "warmup_max_lr": "auto"}}},
    {"scheduler": {"type": "CosineAnnealingLR", "params": {"T_max": 100}}},
])
def test_the_sections_deepspeed_documents_pass_the_same_check(tmp_path, body):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, **body}))
    assert guards.deepspeed_config(path, _strategy_of(body))["zero_optimization"]["stage"] == 2


def test_an_offloaded_adam_is_checked_against_deepspeeds_cpu_adam(tmp_path):
    """FusedAdam takes set_grad_none, DeepSpeedCPUAdam (the offloaded optimizer) does not: the class DeepSpeed
    would build is the one asked."""
    path = tmp_path / "ds.json"
    adam = {"type": "Adam", "params": {"set_grad_none": True}}
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "optimizer": adam}))
    with pytest.raises(DockyardError, match="set_grad_none not known to Adam"):
        guards.deepspeed_config(path, "zero2-offload")
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": adam}))
    assert guards.deepspeed_config(path, "zero2")


@pytest.mark.parametrize("body,strategy_name,says", [
    ({"optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": 0.9}}}, "zero2",
     'optimizer.type "SGD": ZeRO trains with Adam, AdamW, Adagrad, Lion or Muon (DeepSpeed stops at its start on any '
     'other: "untested ZeRO Optimizer"): use one of them (check the spelling), or add '
     '"zero_allow_untested_optimizer": true to the file to train with it anyway'),
    ({"optimizer": {"type": "LBFGS"}}, "zero3", 'optimizer.type "LBFGS": ZeRO trains with'),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}}, "zero2",
     'zero_optimization.offload_optimizer.device "nvme": no strategy here offloads to NVMe (the offload recipes use '
     'host RAM): write "cpu" with an -offload strategy (zero2-offload, zero3-offload), or "none"'),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme"}}},
     "zero3-offload", 'zero_optimization.offload_param.device "nvme": no strategy here offloads to NVMe'),
])
def test_what_deepspeed_stops_on_after_the_model_loads_is_refused_by_the_trainer(tmp_path, body, strategy_name, says):
    """An untested ZeRO optimizer was DeepSpeed's AssertionError on every rank, NVMe offload the strategy check's
    mismatch: both once the model had loaded."""
    path = tmp_path / "ds.json"
    stage = 3 if strategy_name.startswith("zero3") else 2
    path.write_text(json.dumps({"zero_optimization": {"stage": stage}, **body}))
    with pytest.raises(DockyardError) as e:
        guards.deepspeed_config(path, strategy_name)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_trainer_asks_deepspeeds_own_list_of_zero_optimizers(tmp_path, monkeypatch):
    """Where the host's names (recipes.ZERO_OPTIMIZERS) let a type through, the class DeepSpeed builds is checked
    against DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS; zero_allow_untested_optimizer lets it train."""
    from dockyard.common import recipes

    monkeypatch.setattr(recipes, "ZERO_OPTIMIZERS", (*recipes.ZERO_OPTIMIZERS, "lamb"))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}}))
    with pytest.raises(DockyardError, match='optimizer.type "Lamb": ZeRO trains with'):
        guards.deepspeed_config(path, "zero2")
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"},
                                "zero_allow_untested_optimizer": True}))
    assert guards.deepspeed_config(path, "zero2")["optimizer"]["type"] == "Lamb"


@pytest.mark.parametrize("recipe,edit,says", [
    ("zero2", lambda z: z.update(overlap_com=True),
     "unknown DeepSpeed key zero_optimization.overlap_com (did you mean zero_optimization.overlap_comm?)"),
    ("zero2-offload", lambda z: z["offload_optimizer"].update(pin_memroy=True),
     "unknown DeepSpeed key zero_optimization.offload_optimizer.pin_memroy (did you mean "
     "zero_optimization.offload_optimizer.pin_memory?)"),
    ("zero2-offload", lambda z: z["offload_optimizer"].update(device="gpu0"),
     'zero_optimization.offload_optimizer.device "gpu0": DeepSpeed takes "none", "cpu" or "nvme"'),
    ("zero3", lambda z: z.update(offload_param={"device": "cpu", "buffer_cnt": 5}),
     "unknown DeepSpeed key zero_optimization.offload_param.buffer_cnt (did you mean "
     "zero_optimization.offload_param.buffer_count?)"),
    ("zero2", lambda z: z.update(stage=7), "zero_optimization.stage 7: takes 0, 1, 2 or 3"),
    # "auto" where nothing fills it in: DeepSpeed dropped it and trained with nothing offloaded, saying nothing
    ("zero3-offload", lambda z: z["offload_param"].update(device="auto"),
     'zero_optimization.offload_param.device "auto": neither the HF Trainer nor DeepSpeed chooses this one, and '
     'DeepSpeed would quietly take its default, "none": write "none", "cpu" or "nvme"'),
])
def test_a_bad_nested_deepspeed_key_is_the_same_line_from_the_dry_run_and_the_trainer(tmp_path, recipe, edit, says):
    """invoke run --dry checked the ds_config's top-level keys only: a key misspelt inside zero_optimization or its
    offloads, or an offload device DeepSpeed does not know, passed the host and stopped the run once the model had
    loaded (the trainer's check, DeepSpeed's ValidationError). The host now reads the same check, from a snapshot of
    DeepSpeed's models (no DeepSpeed on the host), and says it in the trainer's words."""
    import shutil

    from tests.support.cli import invoke_here, short_error

    folder = tmp_path / f"{recipe}-mine"
    shutil.copytree(RECIPES / recipe, folder)
    cfg = json.loads((folder / "ds_config.json").read_text())
    edit(cfg["zero_optimization"])
    (folder / "ds_config.json").write_text(json.dumps(cfg))
    with pytest.raises(DockyardError) as trainer:
        guards.deepspeed_config(folder / "ds_config.json", recipe)
    assert says in str(trainer.value), str(trainer.value)
    dry = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    short_error(dry, says)
    assert f"error: {trainer.value}\n" in dry.stderr, dry.stderr


def test_a_nested_key_set_to_auto_passes_as_deepspeed_takes_it(tmp_path):
    """DeepSpeed drops a key whose value is "auto" before it reads a section (the HF integration fills in the ones it
    knows): the check refused an unknown one as DeepSpeed would, which it does not, in a config DeepSpeed trains with."""
    import shutil

    from tests.support.cli import invoke_here

    folder = tmp_path / "zero3-mine"
    shutil.copytree(RECIPES / "zero3", folder)
    cfg = json.loads((folder / "ds_config.json").read_text())
    cfg["zero_optimization"]["stage3_prefetch_bucket_sise"] = "auto"
    (folder / "ds_config.json").write_text(json.dumps(cfg))
    guards.deepspeed_config(folder / "ds_config.json", "zero3")  # our check, then DeepSpeed's own models
    dry = invoke_here("run", "--dry", "--variant=cpu", f"--recipe={folder}")
    assert dry.returncode == 0, dry.stderr


def test_the_hosts_snapshot_of_deepspeeds_sections_is_the_pinned_deepspeed():
    """What the host checks nested keys against is what DeepSpeed's own models take (python -m
    dockyard.train.make_assets rewrites it)."""
    from dockyard.common.recipes import DEEPSPEED_SECTIONS
    from dockyard.train.make_assets import deepspeed_sections

    snapshot = json.loads(DEEPSPEED_SECTIONS.read_text())
    assert snapshot == deepspeed_sections()
    offload = snapshot["sections"]["zero_optimization"]["keys"]["offload_optimizer"]["keys"]
    assert offload["device"] == {"enum": ["none", "cpu", "nvme"], "default": "none"} and "pin_memory" in offload
    zero = snapshot["sections"]["zero_optimization"]["keys"]  # a field's alias and its name: DeepSpeed takes both
    assert {"stage3_prefetch_bucket_size", "prefetch_bucket_size"} <= set(zero)


def test_the_hosts_zero_optimizers_are_deepspeeds():
    """The host has no DeepSpeed: its names are the types whose classes DeepSpeed lists as ZeRO's, offloaded or not."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    from dockyard.common import recipes

    supported = set()
    names = set(DEEPSPEED_OPTIMIZERS) | {n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)}
    for name in names - (guards.MUP_OPTIMIZERS - {"muon"}):  # mup's own: not DeepSpeed's, and not ZeRO's
        built = [MuonWithAuxAdam] if name == "muon" else \
            [(guards._optimizer_class(name, {}, offloaded) or (None,))[0] for offloaded in (False, True)]
        if all(c in [*ZERO_SUPPORTED_OPTIMIZERS, MuonWithAuxAdam] for c in built):
            supported.add(name.lower())
    assert set(recipes.ZERO_OPTIMIZERS) == supported
