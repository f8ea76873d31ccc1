"""A model folder whose files do not agree with each other: it trained from random values and said "completed", or
ended in a traceback on every rank. Each folder here is the tiny sample model with one file changed, loaded as the
trainer loads it."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import RunSettings
from dockyard.train import model as models
from dockyard.train.data import tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "base"
    models.materialize_tiny_model(folder)
    return folder


def _copy(tiny, tmp_path, **config):
    folder = tmp_path / "model"
    shutil.copytree(tiny, folder)
    c = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**c, **config}))
    return folder


def _load(folder, task="causal_lm", labels=()):
    settings = RunSettings(task=task)
    tok = models.load_tokenizer(str(folder))
    return models.load_model(str(folder), load_recipe("ddp"), settings, tok, list(labels), 0)


def _reports(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "LOAD REPORT" in r.getMessage()]


def test_a_config_of_more_layers_than_the_weights_hold_is_refused_not_trained_from_random(tiny, tmp_path, caplog):
    folder = _copy(tiny, tmp_path, num_hidden_layers=4)  # the weights hold 2
    with pytest.raises(DockyardError, match=r"its weights lack 18 of the model's \d+ tensors \(model\.layers\.2\..*"
                                            "which would train from random values"):
        _load(folder)
    [report] = _reports(caplog)  # transformers' table of what is missing, as it says it
    assert "model.layers.{2, 3}.mlp.up_proj.weight" in report and "MISSING" in report, report


def test_a_config_of_fewer_layers_than_the_weights_hold_is_refused(tiny, tmp_path):
    folder = _copy(tiny, tmp_path, num_hidden_layers=1)
    with pytest.raises(DockyardError, match=r"tensors of its weights have no place in the model config.json describes"):
        _load(folder)


def test_a_classifier_on_a_causal_model_starts_its_head_alone_from_random_and_says_so_in_a_line(tiny, caplog):
    """transformers' LOAD REPORT (a table calling the new head MISSING and the LM head UNEXPECTED) printed on every
    rank of every classifier run; a classifier is made that way, and the run's own line says it."""
    caplog.set_level(logging.INFO)
    model = _load(tiny, task="seq_cls", labels=("calm", "storm"))
    assert model.config.num_labels == 2
    assert not _reports(caplog)
    assert ("task seq_cls: the classification head (score) is new, 2 labels, trained from random values; the base's "
            "language-model head is left out") in caplog.messages


def test_a_config_of_another_vocabulary_than_the_weights_is_one_line(tiny, tmp_path):
    c = json.loads((tiny / "config.json").read_text())
    folder = _copy(tiny, tmp_path, vocab_size=c["vocab_size"] * 2)
    with pytest.raises(DockyardError, match="its weights do not have the shapes its config.json gives"):
        _load(folder)


def test_token_ids_past_the_embedding_are_refused_before_the_first_step(tiny):
    model = _load(tiny)
    rows = model.get_input_embeddings().num_embeddings
    models.check_examples_fit(model, [{"input_ids": [1, rows - 1]}], "m")
    with pytest.raises(DockyardError, match=f"m: the tokenizer gives token id {rows}, past the model's {rows} "
                                            "embeddings"):
        models.check_examples_fit(model, [{"input_ids": [1, rows]}], "m")


def test_a_padding_token_past_the_embedding_is_refused_before_the_first_step(tiny):
    """A tokenizer whose pad token the model has no row for (one added without resizing the model, or a tokenizer
    class's default pad token the vocabulary lacks) padded every batch with it: "IndexError: index out of range in
    self" at the first step, after the model had loaded."""
    model = _load(tiny)
    rows = model.get_input_embeddings().num_embeddings
    models.check_examples_fit(model, [{"input_ids": [1, 2]}], "m", pad_id=rows - 1)
    with pytest.raises(DockyardError, match=f"m: the tokenizer pads with token id {rows}, past the model's {rows} "
                                            "embeddings"):
        models.check_examples_fit(model, [{"input_ids": [1, 2]}], "m", pad_id=rows)


def test_examples_longer_than_a_learned_position_table_are_refused_a_rotary_model_is_not(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    models.check_examples_fit(gpt2, [{"input_ids": [1] * 64}], "m")
    with pytest.raises(DockyardError, match=r"the model has 64 learned positions and examples of 65 tokens would "
                                            r"index past them: set -- --max_seq_length 64"):
        models.check_examples_fit(gpt2, [{"input_ids": [1] * 65}], "m")
    llama = _load(tiny)  # rotary: positions are computed, the table has no end
    models.check_examples_fit(llama, [{"input_ids": [1] * (llama.config.max_position_embeddings + 1)}], "m")


def test_tokenizer_files_that_do_not_load_are_one_line(tiny, tmp_path):
    folder = _copy(tiny, tmp_path)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(DockyardError, match=r"cannot load its tokenizer \(KeyError"):
        models.load_tokenizer(str(folder))


def test_a_config_that_divides_by_zero_is_blamed_on_config_json_not_the_tokenizer(tiny, tmp_path):
    """The tenth red-team pass: a GPT-NeoX config.json with num_attention_heads 0 was "cannot load its tokenizer
    (ZeroDivisionError ...); copy the tokenizer's files", which are fine; the sizing step took it as unsizable."""
    from pathlib import Path

    folder = _copy(tiny, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], num_attention_heads=0)
    (folder / "config.json").write_text(json.dumps(cfg))
    for read in (lambda: models.load_tokenizer(str(folder)), lambda: models.model_shape(Path(folder))):
        with pytest.raises(DockyardError, match=r"config.json: transformers cannot build a model from it "
                                                r"\(ZeroDivisionError"):
            read()


def test_a_tokenizer_with_no_token_to_pad_with_is_refused(tiny, tmp_path):
    """It fell back to padding with the end-of-sequence token, which it did not have either: a RuntimeError ("Could
    not infer dtype of NoneType") in the collator, at the first step."""
    folder = _copy(tiny, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": None, "pad_token": None}))
    with pytest.raises(DockyardError, match=r"its tokenizer has neither a padding nor an end-of-sequence token.*add "
                                            '"eos_token"'):
        models.load_tokenizer(str(folder))


def test_a_checkpoint_quantized_by_a_method_the_image_lacks_is_one_line(tiny, tmp_path):
    folder = _copy(tiny, tmp_path, quantization_config={"quant_method": "gptq", "bits": 4})
    with pytest.raises(DockyardError, match=r"cannot load the model from .*: .*this image trains unquantized "
                                            "checkpoints"):
        _load(folder)


def test_saved_weights_are_as_readable_as_the_other_files_of_the_model(tiny, tmp_path):
    """The safetensors library writes 0600: other users of a shared runs folder (a serving container of another
    uid) could read a saved model's config and tokenizer, not its weights."""
    import os
    import stat

    from dockyard.common import runfolder

    umask = os.umask(0o022)
    try:
        assert stat.S_IMODE((tiny / "model.safetensors").stat().st_mode) == 0o644
        folder = tmp_path / "ckpt"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "adapter_model.safetensors").write_bytes(b"w")
        (folder / "sub" / "adapter_model.safetensors").chmod(0o600)
        secret = tmp_path / "secret.safetensors"
        secret.write_bytes(b"s")
        secret.chmod(0o600)
        (folder / "link.safetensors").symlink_to(secret)
        runfolder.share_weights(folder)
        assert stat.S_IMODE((folder / "sub" / "adapter_model.safetensors").stat().st_mode) == 0o644
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, "never through a link"
    finally:
        os.umask(umask)


def test_the_footprint_of_a_zero3_model_is_its_whole_weights_not_its_shard_placeholders(tiny):
    """zero3-offload's manifest said footprint_bytes 64 for 164,160 parameters: ZeRO-3 leaves each parameter an empty
    placeholder, its size in ds_numel (set here by hand as DeepSpeed's zero.Init sets it: no DeepSpeed engine here)."""
    import torch

    from dockyard.train.__main__ import footprint

    model = _load(tiny)
    whole = model.get_memory_footprint()
    assert footprint(model) == whole
    for p in model.parameters():
        p.ds_numel = p.numel()
        p.data = torch.empty(0, dtype=p.dtype)
    assert model.get_memory_footprint() < whole / 100  # what the manifest said
    assert footprint(model) == whole


def test_a_long_example_is_cut_without_transformers_warning_of_indexing_errors(caplog):
    """The sample tokenizer's model_max_length is 512: a longer example was "Token indices sequence length is longer
    ... will result in indexing errors", though dockyard cuts every example at max_seq_length."""
    import transformers

    caplog.set_level("WARNING")
    transformers.utils.logging.enable_propagation()  # as the trainer does: its warnings reach the run's log
    try:
        tok = models.load_tokenizer(str(models.TINY_MODEL))
        done = tokens.tokenize([{"prompt": "Which port? " * 60, "completion": " Bergen " * 40}], "prompt_completion",
                             tok, 1024)
    finally:
        transformers.utils.logging.disable_propagation()
    assert len(done.examples[0]["input_ids"]) > tok.model_max_length
    assert "indexing errors" not in caplog.text


def test_a_classifiers_own_checkpoint_loads_with_no_word_of_a_new_head(tiny, tmp_path, caplog):
    """A classifier trained before (its head in its weights) is not told its head is new."""
    caplog.set_level(logging.INFO)
    first = _load(tiny, task="seq_cls", labels=("calm", "storm"))
    first.save_pretrained(tmp_path / "classifier")
    models.load_tokenizer(str(tiny)).save_pretrained(tmp_path / "classifier")
    caplog.clear()
    again = _load(tmp_path / "classifier", task="seq_cls", labels=("calm", "storm"))
    assert again.config.num_labels == 2 and not _reports(caplog)
    assert not [m for m in caplog.messages if "is new" in m], caplog.messages


def _classifier(tiny, tmp_path, labels=("calm", "storm")):
    """A run's own classifier model/ (head included), as the trainer saves it."""
    _load(tiny, task="seq_cls", labels=labels).save_pretrained(tmp_path / "classifier")
    models.load_tokenizer(str(tiny)).save_pretrained(tmp_path / "classifier")
    return tmp_path / "classifier"


def test_a_classifier_given_data_of_another_number_of_classes_is_told_so_not_to_download_again(tiny, tmp_path):
    """Its head's size mismatch (score.weight [2, 64] against [3, 64]) was said as a config.json of another model:
    "copy or download the model folder again, whole"."""
    folder = _classifier(tiny, tmp_path)
    with pytest.raises(DockyardError) as raised:
        _load(folder, task="seq_cls", labels=("calm", "gale", "storm"))
    assert str(raised.value) == (f"{folder} is a classifier of 2 classes, and the data has 3 classes (calm, gale, "
                                 "storm): its classification head cannot take them. Train from a base model without a "
                                 "classification head (the one it was trained from), or give data of its 2 classes")


def test_a_classifier_given_as_a_language_model_is_told_so_not_to_download_again(tiny, tmp_path):
    """It lacks lm_head.weight, which was said as weights missing: "copy or download the model folder again"."""
    folder = _classifier(tiny, tmp_path)
    with pytest.raises(DockyardError) as raised:
        _load(folder)
    assert str(raised.value) == (f"{folder} is a sequence classifier (LlamaForSequenceClassification in its "
                                 "config.json), and task causal_lm trains a language model, whose head (lm_head.weight) "
                                 "a classifier has not: give the language model it was trained from, or train it as a "
                                 "classifier (--task seq_cls)")


def test_an_attention_implementation_this_machine_lacks_is_said_as_that_not_as_a_quantized_checkpoint(tiny, tmp_path):
    """flash_attention_2 in config.json without flash-attn installed was told to use unquantized weights; and, the
    review found, any missing package of a folder naming torch's own attention (sdpa) was blamed on that key.
    transformers' ImportError for the flash case, as it raises it where flash-attn is missing."""
    flash = ImportError("FlashAttention2 has been toggled on, but it cannot be used due to the following error: the "
                        "package flash_attn seems to be not installed.")
    folder = _copy(tiny, tmp_path, _attn_implementation="flash_attention_2")
    said = str(models.missing_package(folder, flash))
    assert said.startswith(f"cannot load the model from {folder}: "), said
    assert said.endswith(f": {folder / 'config.json'} asks for the attention implementation 'flash_attention_2' "
                         "(\"_attn_implementation\"), which is not available here; set it to \"sdpa\" (PyTorch's own) "
                         "or remove the key"), said
    assert "quantiz" not in said, said
    sdpa = _copy(tiny, tmp_path / "sdpa", attn_implementation="sdpa")
    said = str(models.missing_package(sdpa, ImportError("No module named 'sentencepiece'")))
    assert said.endswith("No module named 'sentencepiece': the model needs a package this environment lacks"), said
