"""The auto settings: what each becomes on CPU (what every run did before) and on recorded GPU hosts (the real
H100 recording, a T4 pair), what can be overridden, and the short errors for settings that contradict each other."""

from __future__ import annotations

import json

import pytest

from dockyard.common import autos, memory
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.gpus import Recorded
from dockyard.machine import planner
from tests.support.measured import H100, HOSTS, measured_shape

LLAMA_8B = HOSTS.parents[1] / "models" / "llama-3.1-8b"

H100_GPU = autos.device_from_host(Recorded.from_file(H100).host())
T4_GPU = autos.device_from_host(Recorded.from_file(HOSTS / "t4x2_535.json").host())
# Qwen3-4B's config.json sizes (4.02B parameters)
QWEN3_4B = {"model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "intermediate_size": 9728,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "tie_word_embeddings": True}
TRAINING_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                 "torch_compile", "use_liger_kernel")


@pytest.fixture(scope="module")
def shape(tmp_path_factory) -> memory.Shape:
    return measured_shape(tmp_path_factory.mktemp("one-b"))


def resolve(name: str, given: dict | None = None, *, world: int = 1, device=None, shape=None, liger=False,
            kind="llama") -> autos.Resolved:
    recipe = load_recipe(name)
    settings, overrides = resolve_settings(recipe, given or {})
    return autos.resolve(recipe, settings, overrides, world_size=world, gpus_per_node=world, device=device,
                         shape=shape, kind=kind, liger=autos.LIGER_TYPES if liger else ())


def values(r: autos.Resolved) -> dict:
    return {k: r.overrides[k] for k in TRAINING_KEYS}


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3", "fsdp", "lora", "qlora"])
def test_on_cpu_every_auto_is_what_runs_did_before(name):
    r = resolve(name, world=2)
    assert values(r) == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                         "gradient_checkpointing": bool(load_recipe(name).peft),  # the adapter recipes checkpointed
                         "torch_compile": False, "use_liger_kernel": False}
    assert r.record["global_batch"]["value"] == 16
    for key in ("global_batch", *TRAINING_KEYS):
        assert set(r.record[key]) == {"value", "why"} and r.record[key]["why"]
    assert autos.resolve_padding_free("auto", "messages", "causal_lm", None, "sdpa", 8, 128) == \
        (False, "CPU: padded batches")


def test_a_micro_batch_given_keeps_the_old_meaning_and_a_global_batch_is_made_up_by_accumulation():
    given = resolve("ddp", {"per_device_train_batch_size": 4}, world=2)
    assert values(given)["per_device_train_batch_size"] == 4 and values(given)["gradient_accumulation_steps"] == 1
    assert given.record["global_batch"]["value"] == 8
    big = resolve("ddp", {"global_batch": 64}, world=2)
    assert (values(big)["per_device_train_batch_size"], values(big)["gradient_accumulation_steps"]) == (8, 4)
    accum = resolve("ddp", {"global_batch": 64, "gradient_accumulation_steps": 2}, world=2)
    assert values(accum)["per_device_train_batch_size"] == 16


@pytest.mark.parametrize("given,problem", [
    ({"global_batch": 7}, "cannot be split evenly over 2 processes"),
    ({"global_batch": 16, "per_device_train_batch_size": 3}, "does not divide the 8 examples"),
    ({"global_batch": 16, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, "set two of the three"),
    # two of the three set: the accumulation cannot share out the examples (it was told "set two of the three")
    ({"global_batch": 4, "gradient_accumulation_steps": 8}, "gradient_accumulation_steps 8 does not divide the 2 "
                                                            "examples each of the 2 process"),
    ({"per_device_train_batch_size": "many"}, "whole number of examples"),
    ({"per_device_train_batch_size": 0}, "whole number of examples"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a whole number of steps, 1 or more"),
    ({"gradient_checkpointing": "sometimes"}, "true, false or auto"),
    ({"activation_checkpointing": "maybe"}, r"gradient_checkpointing \(or activation_checkpointing\) must be true"),
    ({"use_liger_kernel": True}, "needs liger-kernel"),
])
def test_settings_that_contradict_each_other_are_short_errors(given, problem):
    with pytest.raises(DockyardError, match=problem):
        resolve("ddp", given, world=2)


def test_liger_set_true_on_cpu_is_refused_even_where_it_is_installed():
    """A CUDA image run with --cpu has liger-kernel, whose Triton kernels fail on CPU tensors mid-step."""
    with pytest.raises(DockyardError, match="for GPUs only, and this run trains on CPU"):
        resolve("ddp", {"use_liger_kernel": True}, liger=True)


def test_liger_set_true_on_a_model_type_it_does_not_cover_is_refused(shape):
    """liger-kernel skips such a model (at info level), so the run was sized for kernels that never ran: out of
    memory where the plan said it fits. Where the model type is not known (it could not be sized), taken as asked."""
    with pytest.raises(DockyardError, match="Liger has no kernels for model type 'gpt2'"):
        resolve("ddp", {"use_liger_kernel": True}, device=H100_GPU, shape=shape, liger=True, kind="gpt2")
    assert values(resolve("ddp", {"use_liger_kernel": True}, device=H100_GPU, shape=None, liger=True,
                          kind=""))["use_liger_kernel"] is True


def test_each_reason_says_how_its_value_came_about(shape):
    """Once the CPU's micro-batch 6 of a global batch of 12 said "CPU: 8 as before", and a micro-batch made up from
    the accumulation given said "set"."""
    cpu = resolve("ddp", {"global_batch": 12})
    assert values(cpu)["per_device_train_batch_size"] == 6
    assert cpu.record["per_device_train_batch_size"]["why"] == ("CPU: 6, the largest divisor of the 12 examples per "
                                                                "process up to 8, the default")
    assert resolve("ddp").record["per_device_train_batch_size"]["why"] == "CPU: 8, the default"
    for device in (None, T4_GPU):
        r = resolve("lora", {"max_seq_length": 2048, "global_batch": 8, "gradient_accumulation_steps": 2}, device=device,
                    shape=shape)
        assert values(r)["per_device_train_batch_size"] == 4
        assert r.record["per_device_train_batch_size"]["why"] == ("global_batch 8 / (gradient_accumulation_steps 2 × 1 "
                                                                  "process(es))")
        assert r.record["gradient_accumulation_steps"]["why"] == "set"


def test_a_global_batch_that_is_not_a_number_is_refused():
    with pytest.raises(DockyardError, match="global_batch"):
        resolve_settings(load_recipe("ddp"), {"global_batch": True})


def test_on_the_h100_the_micro_batch_is_the_largest_that_fits_and_the_global_batch_stays(shape):
    r = resolve("ddp", {"max_seq_length": 2048}, device=H100_GPU, shape=shape)
    assert values(r)["per_device_train_batch_size"] == 8 and values(r)["gradient_checkpointing"] is False
    big = resolve("ddp", {"max_seq_length": 2048, "global_batch": 64, "torch_compile": False}, device=H100_GPU,
                  shape=shape)
    m, a = values(big)["per_device_train_batch_size"], values(big)["gradient_accumulation_steps"]
    assert m * a == 64 and m == 8  # uncompiled, 16 would need ~95 GiB by the plan; measured 53.4 GiB at 8
    # compiled (this run's 50 steps of 64 examples repay it), activations shrink and 16 fits: measured 61.0 GiB
    on = resolve("ddp", {"max_seq_length": 2048, "global_batch": 64}, device=H100_GPU, shape=shape)
    assert values(on)["torch_compile"] is True and values(on)["per_device_train_batch_size"] == 16
    assert "accumulation makes up the rest" in big.record["per_device_train_batch_size"]["why"]
    est = memory.estimate(shape, load_recipe("ddp"), world_size=1, gpus_per_node=1, seq_len=2048, batch=m,
                        gradient_checkpointing=False, regime=big.regime)
    assert est["gpu_bytes"] <= H100_GPU.memory_bytes * (1 - memory.MARGIN)


def test_checkpointing_only_where_nothing_fits_without_it(shape):
    """LoRA of the 944M model on a 16 GB T4: at 2048 tokens a smaller micro-batch fits without checkpointing;
    at 16k tokens not even one example does, so checkpointing goes on. Full fine-tuning (16 GiB of states)
    fits nowhere there, said before any weight loads, and said to be the model's states."""
    lora = resolve("lora", {"max_seq_length": 2048}, device=T4_GPU, shape=shape)
    assert values(lora)["gradient_checkpointing"] is False
    m, a = values(lora)["per_device_train_batch_size"], values(lora)["gradient_accumulation_steps"]
    assert 1 <= m < 8 and m * a == 8
    long = resolve("lora", {"max_seq_length": 16384}, device=T4_GPU, shape=shape)
    assert values(long)["gradient_checkpointing"] is True
    assert "not even one example fits" in long.record["gradient_checkpointing"]["why"]
    with pytest.raises(DockyardError, match="not even one example of 16384 tokens fits"):
        resolve("lora", {"max_seq_length": 16384, "gradient_checkpointing": False}, device=T4_GPU, shape=shape)
    # the model's states alone overflow the T4, before any example: said as such, not as the examples' fault
    states = (memory.model_states("ddp", None, shape, 1, 1)[0] + memory.OVERHEAD) / 2**30  # 16 bytes a weight
    with pytest.raises(DockyardError, match=rf"ddp: the model alone does not fit: .* take {states:.1f} GiB per GPU "
                                            r"at their peak in a step, of 13\.3 GiB \(90% of the Tesla T4\)"):
        resolve("ddp", {"max_seq_length": 2048}, device=T4_GPU, shape=shape)
    # states that fit only before DDP's gradient buckets (two GPUs) or ZeRO-2's step partition are the model's to
    # blame as well: "lower max_seq_length" cannot help them
    for name, world in (("ddp", 2), ("zero2", 1)):
        model = memory.shape_from_count(650_000_000)
        with pytest.raises(DockyardError, match=f"{name}: the model alone does not fit"):
            resolve(name, {"max_seq_length": 128}, world=world, device=T4_GPU, shape=model)
    # a micro-batch given is run as asked: checkpointing on where the plan says it does not fit without it
    given = resolve("lora", {"max_seq_length": 2048, "per_device_train_batch_size": 8}, device=T4_GPU, shape=shape)
    assert values(given)["gradient_checkpointing"] is True and values(given)["per_device_train_batch_size"] == 8
    assert given.record["per_device_train_batch_size"] == {"value": 8, "why": "set"}
    small = resolve("lora", {"max_seq_length": 2048, "per_device_train_batch_size": 1}, device=T4_GPU, shape=shape)
    assert values(small)["gradient_checkpointing"] is False


def test_torch_compile_goes_on_where_its_gain_was_measured_when_the_run_repays_it(shape):
    """ddp, zero2, lora and qlora, all compiled block by block, each by its compile cost and saving; the 944M model
    at seq 2048 and micro-batch 8 on an H100 takes ~0.30 s a step, so the break-even lies where those figures put it."""
    breaks_even = {}
    for name in ("ddp", "zero2", "lora", "qlora"):
        short = resolve(name, {"max_seq_length": 2048, "max_steps": 100}, device=H100_GPU, shape=shape)
        why = short.record["torch_compile"]["why"]
        assert values(short)["torch_compile"] is False and "pays from about" in why, why
        breaks_even[name] = int(why.split("pays from about ")[1].split()[0])
        long = resolve(name, {"max_seq_length": 2048, "max_steps": 5000}, device=H100_GPU, shape=shape)
        assert values(long)["torch_compile"] is True and "it pays" in long.record["torch_compile"]["why"]
        assert long.regime.compiled  # the plan counts compile's smaller activations
        at = resolve(name, {"max_seq_length": 2048, "max_steps": breaks_even[name]}, device=H100_GPU, shape=shape)
        assert values(at)["torch_compile"] is True  # on from the step it names, not later
        assert "block by block, 22 layers" in long.record["torch_compile"]["why"]
    # block by block compiles in seconds, so a few hundred steps repay it; lora is counted as saving what zero2 saves,
    # ddp what it saved itself block by block (31 % on an H200, against zero2's 24 %)
    assert 100 < breaks_even["ddp"] < breaks_even["zero2"] == breaks_even["lora"] < 200, breaks_even
    # qlora's own (H200, 2026-12-04): a longer compile (0.75 s a layer) for less saved (22 %)
    assert breaks_even["lora"] < breaks_even["qlora"] < 300, breaks_even
    # where Liger's kernels would go on instead (liger-kernel installed, a Llama), compiling pays only by what it saves
    # beyond what they save for that recipe (measured: ddp 24 %, zero2 13 %, lora 22 %), so later
    for name, (lo, hi) in {"ddp": (3, 6), "zero2": (1.5, 3), "lora": (8, 15)}.items():
        short = resolve(name, {"max_seq_length": 2048, "max_steps": breaks_even[name]}, device=H100_GPU, shape=shape,
                        liger=True)
        why = short.record["torch_compile"]["why"]
        assert values(short)["torch_compile"] is False and values(short)["use_liger_kernel"] is True
        assert "with Liger's kernels, which compiling replaces" in why, why
        over_liger = int(why.split("pays from about ")[1].split()[0])
        assert lo * breaks_even[name] < over_liger < hi * breaks_even[name], (name, over_liger, breaks_even)
        long = resolve(name, {"max_seq_length": 2048, "max_steps": over_liger}, device=H100_GPU, shape=shape,
                       liger=True)
        assert values(long)["torch_compile"] is True and values(long)["use_liger_kernel"] is False
        assert "torch_compile is on" in long.record["use_liger_kernel"]["why"]
    # qlora's kernels were measured no faster with Liger: compiling pays over them as over a plain step, and Liger goes
    # off for it (qlora keeps less with Liger, but a compiled run is sized compiled)
    qlora = resolve("qlora", {"max_seq_length": 2048, "max_steps": breaks_even["qlora"]}, device=H100_GPU, shape=shape,
                    liger=True)
    assert values(qlora)["torch_compile"] is True and values(qlora)["use_liger_kernel"] is False
    assert "with Liger's kernels" not in qlora.record["torch_compile"]["why"]
    # a model Liger has no kernels for compiles by the plain rule
    gpt2 = resolve("zero2", {"max_seq_length": 2048, "max_steps": breaks_even["zero2"]}, device=H100_GPU, shape=shape,
                   liger=True, kind="gpt2")
    assert values(gpt2)["torch_compile"] is True and values(gpt2)["use_liger_kernel"] is False


def test_where_liger_saves_as_much_as_compiling_it_stays_and_compiling_never_goes_on(shape, monkeypatch):
    """A Liger gain within SAVINGS_APART of compiling's (lora's 24 %): no run is long enough to repay compiling
    for what it would add, so Liger stays, whatever the length."""
    monkeypatch.setitem(autos.LIGER_MEASURED, "lora", (50_000, 65_000))  # 23 % saved
    r = resolve("lora", {"max_seq_length": 2048, "max_steps": 10**6}, device=H100_GPU, shape=shape, liger=True)
    assert values(r)["torch_compile"] is False and values(r)["use_liger_kernel"] is True
    assert r.record["torch_compile"]["why"].startswith("Liger's kernels go on instead"), r.record["torch_compile"]
    assert "lora of a 1.1B Llama measured 1.30x as fast" in r.record["use_liger_kernel"]["why"]
    # where the gain is not measured on a GPU, never on by itself, whatever the length; the reason says how to try it
    for name in ("fsdp", "zero3", "zero2-offload"):
        r = resolve(name, {"max_seq_length": 2048, "max_steps": 10**6}, device=H100_GPU, shape=shape)
        why = r.record["torch_compile"]["why"]
        assert values(r)["torch_compile"] is False and "not measured yet" in why and "torch_compile true" in why
    gc_on = resolve("zero2", {"max_steps": 10**6, "gradient_checkpointing": True}, device=H100_GPU, shape=shape)
    assert values(gc_on)["torch_compile"] is False
    assert values(resolve("lora", {"max_steps": 10**6}, device=None, shape=shape))["torch_compile"] is False  # CPU
    given = resolve("ddp", {"torch_compile": True}, device=H100_GPU, shape=shape)
    assert given.record["torch_compile"] == {"value": True, "why": "set"}


@pytest.mark.parametrize("model,seq", [("qwen3-4b", 4096), ("4.2B", 2048), ("944M", 2048), ("944M", 16384),
                                       ("8B", 1024), ("1.5B", 8192)])
def test_a_recipe_the_plan_says_fits_is_one_the_trainer_takes_with_the_same_settings(tmp_path, model, seq):
    """Once `invoke plan --seq-len=4096` recommended ddp for Qwen3-4B on the H100 ("68.4 GiB of 79.6 GiB per GPU with
    gradient checkpointing") and the trainer, with the same inputs, refused it (not even one example fits in 71.7
    GiB): the plan sized one micro-batch with no accumulation against the whole GPU, the trainer eight accumulated
    (their gradients held) against 90 % of it. Now both size the run one way: every row the plan says fits, the
    trainer takes, with checkpointing only where the plan needs it; every row it says does not, the trainer refuses."""
    if model == "qwen3-4b":
        (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
        model = str(tmp_path)
    result = planner.plan_model(model, seq_len=seq, host=Recorded.from_file(H100).host(), cpu_mem_gib=4096)
    shape = planner.shape_for(model)
    for row in result["recipes"]:
        try:
            r = resolve(row["recipe"], {"max_seq_length": seq}, device=H100_GPU, shape=shape, liger=True,
                        kind=shape.model_type)  # the CUDA images hold liger-kernel
        except DockyardError as e:
            assert not (row["fits"] or row["fits_checkpointed"]), (row["recipe"], str(e))
            continue
        assert row["fits"] or row["fits_checkpointed"], row["recipe"]
        assert values(r) == {"per_device_train_batch_size": row["micro_batch"],
                             "gradient_accumulation_steps": row["gradient_accumulation_steps"],
                             "gradient_checkpointing": not row["fits"], "torch_compile": row["torch_compile"],
                             "use_liger_kernel": row["use_liger_kernel"]}, row["recipe"]
    rec = result["recommendation"]
    if rec["recipe"]:
        r = resolve(rec["recipe"], {"max_seq_length": seq}, device=H100_GPU, shape=shape, liger=True,
                    kind=shape.model_type)
        assert values(r)["gradient_checkpointing"] == rec["gradient_checkpointing"]


def test_where_only_the_accumulated_gradients_do_not_fit_the_trainer_says_so(tmp_path):
    """ddp of Qwen3-4B at 4096 tokens on the H100: one example fits (68.4 GiB with checkpointing), but the default
    global batch of 8 accumulates over micro-batches of 1, and the gradients held between them (16 GB) do not."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    qwen = memory.shape_from_folder(tmp_path)
    with pytest.raises(DockyardError, match=r"ddp: no micro-batch that divides the 8 examples each process takes per "
                                            r"step \(global_batch 8\) fits .* set global_batch 1"):
        resolve("ddp", {"max_seq_length": 4096}, device=H100_GPU, shape=qwen)
    one = resolve("ddp", {"max_seq_length": 4096, "global_batch": 1}, device=H100_GPU, shape=qwen)
    assert values(one)["gradient_checkpointing"] is True and values(one)["gradient_accumulation_steps"] == 1
    with pytest.raises(DockyardError, match="ddp: not even one example of 65536 tokens fits"):
        resolve("ddp", {"max_seq_length": 65536, "global_batch": 1}, device=H100_GPU, shape=qwen)


def test_the_advice_for_held_gradients_is_one_that_works_with_the_global_batch_given():
    """4.2B ddp at 2048 tokens on the H100, one example per process fits without accumulation. With --global_batch 16
    the refusal also offered "per_device_train_batch_size 1", which beside that global batch accumulates 16 micro-batches
    and did not fit (it ran as asked, 73.7 GiB of 71.7); now it offers only global_batch 1, which the trainer takes.
    With the global batch auto, a micro-batch of 1 alone means one example per process, so it is still offered."""
    big = planner.shape_for("4.2B")
    with pytest.raises(DockyardError, match=r"fits \(71.4 GiB\): set global_batch 1, or run `invoke plan "
                                                r"--model=MODEL_FOLDER --seq-len=2048`") as e:
        resolve("ddp", {"max_seq_length": 2048, "global_batch": 16}, device=H100_GPU, shape=big)
    assert "per_device_train_batch_size" not in str(e.value)
    with pytest.raises(DockyardError, match=r"set global_batch 1 \(or per_device_train_batch_size 1\)"):
        resolve("ddp", {"max_seq_length": 2048}, device=H100_GPU, shape=big)
    for advice in ({"global_batch": 1}, {"per_device_train_batch_size": 1}):
        took = values(resolve("ddp", {"max_seq_length": 2048, **advice}, device=H100_GPU, shape=big))
        assert (took["per_device_train_batch_size"], took["gradient_accumulation_steps"]) == (1, 1), advice


def test_checkpointing_says_when_it_is_the_accumulations_gradients_that_do_not_fit():
    """1B ddp on 2 × 24 GiB at 256 tokens: one example alone fits without checkpointing (21.5 GiB of 21.6), micro-batch 1
    × 8 accumulated does not (its gradients held: 22.2), nor do 2, 4 or 8 at once; checkpointing goes on and said
    "not even one example fits without it", which was not so."""
    gpu = autos.Device("24 GiB GPU", 24 * 2**30, (8, 9))
    r = resolve("ddp", {"max_seq_length": 256}, world=2, device=gpu, shape=planner.shape_for("1B"), kind="")
    assert values(r)["gradient_checkpointing"] is True and values(r)["per_device_train_batch_size"] == 8
    assert r.record["gradient_checkpointing"]["why"] == ("needed: no micro-batch dividing the 8 examples per process "
                                                         "fits without it (the accumulation holds the gradients)")


def test_compiling_goes_off_where_checkpointing_goes_on_and_the_micro_batch_is_sized_uncompiled(shape):
    """LoRA of the 944M model at 12288 tokens on a T4: the run is long enough to repay compiling, but not even one
    example fits without checkpointing. Once compile went on anyway and micro-batch 4 was sized with the compiled
    activations (at 8192 tokens, by the plan of then: "12.4 GiB of 13.3"; uncompiled, as it runs checkpointed,
    15.0 GiB on a 14.8 GiB card)."""
    r = resolve("lora", {"max_seq_length": 12288}, device=T4_GPU, shape=shape)
    assert values(r)["gradient_checkpointing"] is True and values(r)["torch_compile"] is False
    assert r.record["torch_compile"]["why"] == autos.COMPILE_CHECKPOINTED and not r.regime.compiled
    m = values(r)["per_device_train_batch_size"]
    est = memory.estimate(shape, load_recipe("lora"), world_size=1, gpus_per_node=1, seq_len=12288, batch=m,
                          gradient_checkpointing=True, regime=r.regime)
    assert memory.fits(est, T4_GPU.memory_bytes) and f"{est['gpu_bytes'] / 2**30:.1f} GiB" in \
        r.record["per_device_train_batch_size"]["why"]
    # without checkpointing it still compiles where it pays, and compiling set true stays on with checkpointing
    short = resolve("lora", {"max_seq_length": 2048, "max_steps": 5000}, device=T4_GPU, shape=shape)
    assert values(short)["torch_compile"] is True and values(short)["gradient_checkpointing"] is False
    asked = resolve("lora", {"max_seq_length": 12288, "torch_compile": True}, device=T4_GPU, shape=shape)
    assert values(asked)["torch_compile"] is True and values(asked)["gradient_checkpointing"] is True


@pytest.mark.parametrize("name", ["lora", "qlora"])
def test_the_adapters_rank_and_the_bases_dtype_size_the_micro_batch(name):
    """Llama-3.1-8B on an L40S (45 GiB): once lora_r 16, 64, 128 and 256, and a float32 base, all gave LoRA's
    micro-batch 2 at "37.4 GiB of 40.5" (rank 256 adds 11 GiB of adapter states, the fp32 base 15 GiB)."""
    l40s = autos.device_from_host(Recorded.from_file(HOSTS / "l40sx2_550.json").host())
    llama = memory.shape_from_folder(LLAMA_8B)
    seen = {}
    for given in ({}, {"lora_r": 64}, {"lora_r": 256}, {"dtype": "float32"}):
        r = resolve(name, {"max_seq_length": 2048, **given}, device=l40s, shape=llama)
        est = memory.estimate(llama, load_recipe(name), world_size=1, gpus_per_node=1, seq_len=2048,
                              batch=values(r)["per_device_train_batch_size"],
                              gradient_checkpointing=values(r)["gradient_checkpointing"], regime=r.regime)
        assert memory.fits(est, l40s.memory_bytes)  # as the trainer's manifest will predict it (r.regime)
        seen[str(given)] = est["gpu_model_states_bytes"], values(r)
    states = {k: v[0] for k, v in seen.items()}
    assert states["{}"] < states["{'lora_r': 64}"] < states["{'lora_r': 256}"]
    assert states["{'lora_r': 256}"] - states["{}"] == 18 * 15 * llama.lora_params  # 18 bytes per adapter parameter
    assert states["{'dtype': 'float32'}"] - states["{}"] == 2 * (llama.params - (llama.linear_params if name == "qlora"
                                                                                else 0))
    if name == "lora":  # micro-batch 2 fits rank 16 only: rank 256 takes 1, the fp32 base needs checkpointing
        assert seen["{}"][1]["per_device_train_batch_size"] == 2 and not seen["{}"][1]["gradient_checkpointing"]
        assert seen["{'lora_r': 256}"][1]["per_device_train_batch_size"] == 1
        assert seen["{'dtype': 'float32'}"][1]["gradient_checkpointing"] is True


def test_liger_goes_on_wherever_its_kernels_apply_and_the_run_is_not_compiled(shape):
    """Measured faster (ddp of the 1.1B model on an H200: 1.31x) and never heavier: on by itself on a GPU for the
    model types it covers, with the plan sizing the micro-batch as it runs."""
    fits = resolve("ddp", {"max_seq_length": 2048}, device=H100_GPU, shape=shape, liger=True)
    assert values(fits)["use_liger_kernel"] is True and fits.regime.liger
    assert "1.31x as fast" in fits.record["use_liger_kernel"]["why"]
    assert "memory binds" not in fits.record["use_liger_kernel"]["why"]  # micro-batch 8 fits either way
    # a micro-batch given that fits nowhere: run as asked, with the kernels that keep the least
    big = resolve("ddp", {"max_seq_length": 2048, "per_device_train_batch_size": 512, "torch_compile": False},
                  device=H100_GPU, shape=shape, liger=True)
    assert values(big)["use_liger_kernel"] is True and values(big)["gradient_checkpointing"] is True
    assert "does not fit even with them" in big.record["use_liger_kernel"]["why"]
    for kind, name, word in (("gpt2", "ddp", "no kernels for model type"), ("llama", "zero3", "partitioned")):
        r = resolve(name, {"max_seq_length": 2048}, device=H100_GPU, shape=shape, liger=True, kind=kind)
        assert values(r)["use_liger_kernel"] is False and word in r.record["use_liger_kernel"]["why"]
    absent = resolve("ddp", {"max_seq_length": 2048}, device=H100_GPU, shape=shape, liger=False)
    assert "not installed" in absent.record["use_liger_kernel"]["why"]
    # under fsdp, on by itself as measured (1.31x; FSDP2 gathers the output layer's weight with the root's, for the
    # whole forward, where Liger's loss reads it)
    fsdp = resolve("fsdp", {"max_seq_length": 2048}, device=H100_GPU, shape=shape, liger=True)
    assert values(fsdp)["use_liger_kernel"] is True
    assert "fsdp of a 1.1B Llama measured 1.31x as fast" in fsdp.record["use_liger_kernel"]["why"]
    # set true under ZeRO-3: refused before anything loads (DeepSpeed hands Liger's loss an empty shard), under
    # fsdp taken as asked
    for name in ("zero3", "zero3-offload"):
        with pytest.raises(DockyardError, match="under ZeRO-3 Liger's fused loss reads the output layer's weight"):
            resolve(name, {"use_liger_kernel": True}, device=H100_GPU, shape=shape, liger=True)
    fsdp = resolve("fsdp", {"use_liger_kernel": True, "max_seq_length": 2048}, device=H100_GPU, shape=shape, liger=True)
    assert values(fsdp)["use_liger_kernel"] is True
    with pytest.raises(DockyardError, match="do not work together"):
        resolve("ddp", {"use_liger_kernel": True, "torch_compile": True}, device=H100_GPU, shape=shape, liger=True)
    # Liger asked for on a run long enough to compile: the compile auto steps aside, it does not refuse the run
    asked = resolve("ddp", {"use_liger_kernel": True, "max_seq_length": 2048, "max_steps": 5000}, device=H100_GPU,
                    shape=shape, liger=True)
    assert values(asked)["use_liger_kernel"] is True and values(asked)["torch_compile"] is False
    assert "use_liger_kernel is set true" in asked.record["torch_compile"]["why"]


def test_liger_buys_a_larger_micro_batch_where_the_logits_are_what_does_not_fit(tmp_path):
    """A small model with a big vocabulary (the fp32 logits dominate) on a T4: Liger's fused loss turns a
    micro-batch that does not fit into one that does."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 512,
                                                      "intermediate_size": 1408, "num_hidden_layers": 4,
                                                      "num_attention_heads": 8, "vocab_size": 152064}))
    small = memory.shape_from_folder(tmp_path)
    given = {"max_seq_length": 4096, "global_batch": 32, "torch_compile": False}  # Liger and compile exclude each other
    plain = resolve("ddp", given, device=T4_GPU, shape=small, liger=False, kind="qwen2")
    fused = resolve("ddp", given, device=T4_GPU, shape=small, liger=True, kind="qwen2")
    assert values(fused)["use_liger_kernel"] is True and "memory binds too" in fused.record["use_liger_kernel"]["why"]
    assert values(fused)["per_device_train_batch_size"] > values(plain)["per_device_train_batch_size"]


@pytest.mark.parametrize("fmt,attention,micro,seq,on", [
    ("messages", "sdpa", 8, 128, True),
    ("alpaca", "sdpa", 4, 1024, True),
    ("prompt_completion", "sdpa", 8, 2048, False),       # a 16k-token row: attention over it costs more than padding
    ("sharegpt", "flash_attention_2", 8, 2048, True),
    ("text", "sdpa", 8, 128, False),
    ("text_label", "sdpa", 8, 128, False),
])
def test_padding_free_on_gpus_for_instruction_and_chat_data_where_attention_makes_it_pay(fmt, attention, micro, seq,
                                                                                         on):
    got, why = autos.resolve_padding_free("auto", fmt, "causal_lm", H100_GPU, attention, micro, seq)
    assert got is on and why


def test_padding_free_says_why_it_is_off_for_the_attention_at_hand():
    """eager attention on a short row was said to be off "(more than 4096)" tokens: a row of 1024."""
    off, why = autos.resolve_padding_free("auto", "messages", "causal_lm", H100_GPU, "eager", 8, 128)
    assert off is False and "eager attention" in why and "1024 tokens" in why and "more than" not in why
    off, why = autos.resolve_padding_free("auto", "messages", "causal_lm", H100_GPU, "sdpa", 8, 2048)
    assert off is False and "16384 tokens (more than 4096)" in why


def test_padding_free_can_be_set_but_not_for_classification():
    assert autos.resolve_padding_free(True, "text", "causal_lm", None, "sdpa", 8, 128) == (True, "set")
    with pytest.raises(DockyardError, match="not seq_cls"):
        autos.resolve_padding_free(True, "text_label", "seq_cls", None, "sdpa", 8, 128)
    with pytest.raises(DockyardError, match="true, false or auto"):
        autos.resolve_padding_free("yes", "messages", "causal_lm", None, "sdpa", 8, 128)


def test_a_huge_global_batch_is_answered_at_once(shape):
    huge = 2 * 3 * 5 * 7 * 11 * 13 * 10**6
    r = resolve("ddp", {"max_seq_length": 2048, "global_batch": huge}, device=H100_GPU, shape=shape)
    # steps that long repay compiling, whose smaller activations fit 16 (measured: 61.0 GiB on the H100)
    assert values(r)["torch_compile"] is True
    assert (values(r)["per_device_train_batch_size"], values(r)["gradient_accumulation_steps"]) == (16, huge // 16)
    assert memory.divisors(12) == [1, 2, 3, 4, 6, 12] and memory.divisors(1) == [1] and memory.divisors(49) == [1, 7, 49]


def test_the_plan_counts_the_liger_kernels_the_trainer_turns_on(tmp_path):
    """Qwen3-4B at 4096 tokens on the H100: the plan sized every row without Liger and recommended zero2-offload (its
    optimizer step on the CPU), saying ddp fits nowhere ("73.6 GiB per GPU even with gradient checkpointing"), while
    the trainer in a CUDA image (liger-kernel installed) turns Liger's fused loss on where memory binds and runs ddp
    at micro-batch 8 with checkpointing. The plan now runs the trainer's rules: it recommends that run."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    result = planner.plan_model(str(tmp_path), seq_len=4096, host=Recorded.from_file(H100).host(), cpu_mem_gib=512)
    rec = result["recommendation"]
    assert (rec["recipe"], rec["micro_batch"], rec["gradient_checkpointing"]) == ("ddp", 8, True), rec
    assert "with gradient checkpointing and Liger's kernels" in rec["why"]
    ddp = next(r for r in result["recipes"] if r["recipe"] == "ddp")
    assert ddp["use_liger_kernel"] and ddp["gpu_bytes_checkpointed"] <= memory.budget(H100_GPU.memory_bytes)
    shape = planner.shape_for(str(tmp_path))
    trainer = resolve("ddp", {"max_seq_length": 4096}, device=H100_GPU, shape=shape, liger=True, kind="qwen3")
    assert values(trainer) == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                               "gradient_checkpointing": True, "torch_compile": False, "use_liger_kernel": True}
