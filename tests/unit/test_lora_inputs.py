"""LoRA's adapters take their input as the base layer got it while training under autocast: the fp32 copies peft
made of every adapted layer's input (and autocast's copies back to 16 bits) are gone, and the loss and every
adapter gradient are the same to the bit. On CPU, under CPU autocast in bf16, as the Trainer trains on GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.train import model as models


class Copies(TorchDispatchMode):
    """Counts the dtype casts of tensors at least `size` elements large (activations, not the tiny adapters)."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.casts = size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].numel() >= self.size and "dtype" in kwargs:
            self.casts += 1
        return func(*args, **kwargs)


def lora_model(tmp_path):
    recipe = load_recipe("lora")
    settings, _ = resolve_settings(recipe, {})
    models.materialize_tiny_model(tmp_path / "base")
    tokenizer = models.load_tokenizer(str(tmp_path / "base"))
    model = models.load_model(str(tmp_path / "base"), recipe, settings, tokenizer, [], 0).to(torch.bfloat16)
    model = models.add_lora(model, recipe, settings, gradient_checkpointing=False)
    with torch.no_grad():  # B starts at zero: make the adapters' path count in the loss
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.02)
    return recipe, model


def step(model, ids, size):
    model.zero_grad(set_to_none=True)
    copies = Copies(size)
    with torch.autocast("cpu", dtype=torch.bfloat16), copies:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, copies.casts


def test_adapters_under_autocast_train_the_same_without_copying_their_inputs(tmp_path):
    recipe, model = lora_model(tmp_path)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trained} == {torch.float32}, "peft keeps the adapters in fp32 over the bf16 base"
    ids = torch.randint(3, 500, (4, 64))
    hidden = model.config.hidden_size
    size = ids.numel() * hidden  # one layer's input

    loss_cast, grads_cast, casts_before = step(model, ids, size)
    with models.adapter_inputs_as_given(model, recipe, SimpleNamespace(bf16=True, fp16=False)):
        loss, grads, casts = step(model, ids, size)
    adapted = sum(1 for m in model.modules() if hasattr(m, "lora_A"))
    assert adapted >= 14 and casts_before - casts >= 2 * adapted, (casts, casts_before, adapted)  # to fp32 and back
    assert torch.equal(loss, loss_cast)
    assert grads.keys() == grads_cast.keys() and all(torch.equal(grads[n], grads_cast[n]) for n in grads)
    # and the casts are back once training ends (a reload or a probe outside autocast needs them)
    assert step(model, ids, size)[2] == casts_before


def test_without_mixed_precision_the_adapters_keep_casting(tmp_path):
    """On CPU the Trainer runs without autocast: a bf16 input would meet the fp32 adapters, so nothing changes."""
    recipe, model = lora_model(tmp_path)
    ids = torch.randint(3, 500, (2, 16))
    with models.adapter_inputs_as_given(model, recipe, SimpleNamespace(bf16=False, fp16=False)):
        loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    full = load_recipe("ddp")
    with models.adapter_inputs_as_given(model, full, SimpleNamespace(bf16=True, fp16=False)):
        assert all(getattr(m, "cast_input_dtype_enabled", True) for m in model.modules())


def test_adding_the_adapters_logs_no_deprecation_warning(tmp_path):
    """peft reads transformers 4's name of the checkpointing flag; every lora run's log said it goes in v6."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lora_model(tmp_path)
    assert not [w for w in seen if issubclass(w.category, FutureWarning)], [str(w.message) for w in seen]


def test_loading_a_runs_adapter_logs_no_deprecation_warning(tmp_path):
    """`invoke export` of a lora run printed the same FutureWarning when peft loaded the saved adapter."""
    import warnings

    from dockyard.train import export

    _, model = lora_model(tmp_path)
    model.save_pretrained(tmp_path / "adapter")
    m = {"model": {"format": "adapter", "base": str(tmp_path / "base")}, "strategy": {"peft": "lora"}}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loaded = export.load_run_model(m, tmp_path, torch.bfloat16, quantized=False, adapter_dir=tmp_path / "adapter")
    assert any("lora_A" in n for n, _ in loaded.named_parameters())
    assert not [w for w in seen if issubclass(w.category, FutureWarning)], [str(w.message) for w in seen]


def test_a_target_modules_expression_that_backtracks_or_does_not_compile_is_one_line(tmp_path, monkeypatch):
    """The twelfth red-team pass: `(.*.*)*z` took peft hours against module names of 30 characters, silently on every
    rank; `([` was re's traceback from inside peft, after the model had loaded. Now: a bounded match, then one
    line; an expression that does not compile is refused with the other settings. A sane one still adapts."""
    import pytest

    from dockyard.common.errors import DockyardError

    recipe = load_recipe("lora")
    # quoted once, by the setting's name, however long (it was twice past reprlib's 30 characters)
    for target in ("([", "model.layers.[0-9]+.self_attn.(q|v)_proj("):
        with pytest.raises(DockyardError) as refused:
            resolve_settings(recipe, {"lora_target_modules": target})
        said = str(refused.value)
        assert said.startswith(f"invalid setting: --lora_target_modules {target!r}: is not a regular expression (")
        assert said.count(target) == 1 and "\n" not in said, said
    models.materialize_tiny_model(tmp_path / "base")
    tokenizer = models.load_tokenizer(str(tmp_path / "base"))
    monkeypatch.setattr(models, "MATCH_SECONDS", 1)
    for target, adapted in (("(.*.*)*z", None), (r".*\.(q|v)_proj", 2)):
        settings, _ = resolve_settings(recipe, {"lora_target_modules": target})
        model = models.load_model(str(tmp_path / "base"), recipe, settings, tokenizer, [], 0)
        if adapted is None:
            with pytest.raises(DockyardError, match=r"matching it against the model's module names took more than 1 s"):
                models.add_lora(model, recipe, settings, gradient_checkpointing=False)
        else:
            model = models.add_lora(model, recipe, settings, gradient_checkpointing=False)
            layers = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n}
            assert layers == {"q_proj", "v_proj"}


def test_a_target_modules_expression_the_model_refuses_at_train_time_is_said_once_and_short(tmp_path, monkeypatch):
    """The trainer's own refusals of lora_target_modules (an expression that matches no layer, one that backtracks)
    said a long expression whole, and twice where it matched nothing: ours, then peft's 'Target modules <it> not found
    in the base model. Please check the target modules and try again.', cut at 200 characters mid-expression. Now as
    every setting's: `lora_target_modules '<it, short>': what is wrong; what to give`, the expression once."""
    import pytest

    from dockyard.common.errors import DockyardError

    recipe = load_recipe("lora")
    models.materialize_tiny_model(tmp_path / "base")
    tokenizer = models.load_tokenizer(str(tmp_path / "base"))
    monkeypatch.setattr(models, "MATCH_SECONDS", 1)
    nowhere = "model.layers.[0-9]+.self_attn.(query|value)_projection_of_a_model_this_is_not" * 3
    slow = "(.*.*)*(z|" + "y" * 200 + ")"
    for target, says in ((nowhere, ": matches no layer of the model; give the names of its linear layers"),
                         (slow, ": matching it against the model's module names took more than 1 s")):
        settings, _ = resolve_settings(recipe, {"lora_target_modules": target})
        model = models.load_model(str(tmp_path / "base"), recipe, settings, tokenizer, [], 0)
        with pytest.raises(DockyardError) as refused:
            models.add_lora(model, recipe, settings, gradient_checkpointing=False)
        said = str(refused.value)
        assert said.startswith(f"lora_target_modules {target[:10]!r}"[:-1]) and says in said, said
        assert said.count(target[:10]) == 1 and len(said) < 300 and "\n" not in said, said
