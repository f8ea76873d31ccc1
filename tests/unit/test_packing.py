"""Packed text (the `packing` setting): text documents joined end to end and cut into max_seq_length blocks, as
pretraining reads them; when the auto turns it on, and the errors where it cannot apply."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer

from dockyard.common import autos
from dockyard.common.errors import DockyardError
from dockyard.common.run_settings import DATA, TINY_MODEL, RunSettings
from dockyard.gpus import Recorded
from dockyard.train import data
from dockyard.train.data import read, tokens
from tests.support.measured import H100

GPU = autos.device_from_host(Recorded.from_file(H100).host())


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY_MODEL)


def documents(tok, rows):
    return [tok(r["text"], add_special_tokens=True)["input_ids"] + [tok.eos_token_id] for r in rows]


def test_every_token_of_every_document_is_trained_once_in_order_and_none_is_padding(tok):
    rows = [{"text": "short one"}, {"text": "word " * 90}, {"text": "a middle sized document of a few words"}]
    blocks = tokens.pack_text(rows, tok, 16)
    stream = [t for d in documents(tok, rows) for t in d]
    assert [t for b in blocks for t in b["input_ids"]] == stream  # nothing cut, nothing added, the order kept
    assert all(len(b["input_ids"]) == 16 for b in blocks[:-1]) and 1 < len(blocks[-1]["input_ids"]) <= 16
    assert all(b["labels"] == b["input_ids"] for b in blocks)
    assert len(blocks) == math.ceil(len(stream) / 16)
    # the long document (about 90 tokens) runs on across blocks instead of being cut at 16
    assert len(documents(tok, rows[1:2])[0]) > 5 * 16
    assert sum(b["input_ids"].count(tok.eos_token_id) for b in blocks) == 3  # one EOS ends each document


def test_a_last_block_of_one_token_is_left_out(tok):
    rows = [{"text": "word " * 20}]
    n = len(documents(tok, rows)[0])
    blocks = tokens.pack_text(rows, tok, n - 1)  # one token left over: it predicts nothing
    assert [len(b["input_ids"]) for b in blocks] == [n - 1]


def test_load_packs_the_sample_and_says_so(tok):
    settings = RunSettings(max_seq_length=128, eval_fraction=0.1)
    loaded = data.load(settings, tok, seed=0, packing=lambda fmt: (fmt == "text", "why"))
    rows = read.read_rows(DATA / "sample.jsonl")
    tokens = sum(len(d) for d in documents(tok, rows))
    assert loaded.info["packed"] is True and loaded.info["truncated"] == 0 and loaded.packing == (True, "why")
    assert sum(len(b["input_ids"]) for b in loaded.train + loaded.eval) == tokens
    assert len(loaded.train) < 0.5 * len(rows)  # ~40-token documents, three to a block
    padded = data.load(settings, tok, seed=0)
    assert padded.info["packed"] is False and len(padded.train) == len(rows) - len(padded.eval)


def test_a_truncating_run_of_text_says_packing_would_keep_the_rest(tok, tmp_path, caplog):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "word " * 100}) + "\n")
    with caplog.at_level("WARNING", logger="dockyard.train"):
        data.load(RunSettings(data=str(path), max_seq_length=16), tok, seed=0)
    assert "--packing true" in caplog.text


@pytest.mark.parametrize("value,fmt,task,device,padding_free,on,says", [
    ("auto", "text", "causal_lm", GPU, "auto", True, "no document cut short"),
    ("auto", "text", "causal_lm", None, "auto", False, "CPU: one example per document"),
    ("auto", "messages", "causal_lm", GPU, "auto", False, "padding_free"),
    ("auto", "text_label", "seq_cls", GPU, "auto", False, "only text documents"),
    ("auto", "text", "causal_lm", GPU, True, False, "padding_free is set"),
    (True, "text", "causal_lm", None, "auto", True, "set"),
    (False, "text", "causal_lm", GPU, "auto", False, "set"),
])
def test_the_auto_joins_text_documents_on_gpus_only(value, fmt, task, device, padding_free, on, says):
    got, why = autos.resolve_packing(value, fmt, task, device, padding_free)
    assert got is on and says in why


@pytest.mark.parametrize("fmt,task,padding_free,says", [
    ("messages", "causal_lm", "auto", "this data is messages: instruction and chat examples keep their boundaries"),
    ("text_label", "seq_cls", "auto", "for causal language modelling, not seq_cls"),
    ("text", "causal_lm", True, "packing and padding_free are both true"),
])
def test_packing_set_where_it_cannot_apply_is_refused(fmt, task, padding_free, says):
    with pytest.raises(DockyardError, match=says):
        autos.resolve_packing(True, fmt, task, GPU, padding_free)


def test_padding_free_left_off_for_text_points_to_packing():
    off, why = autos.resolve_padding_free("auto", "text", "causal_lm", GPU, "sdpa", 8, 128)
    assert off is False and "text documents have packing" in why


PROSE = ("It was the best of times,  it was the worst of times.\n\nChapter 2\n\t  indented line, numbers 12345 67890;"
         " punctuation!? (brackets) [and] {braces}\n") * 400  # 48 kB of words, runs of spaces and newlines


@pytest.mark.parametrize("text", [PROSE, "x" * 20_000, PROSE.replace("\n", " ")])
def test_a_long_document_is_packed_a_piece_at_a_time_to_the_tokens_of_a_whole_read(tok, monkeypatch, text):
    """The twelfth red-team pass: one 14 MB document took 3 GB in every process, tokenized in one call when packing
    read it whole. It is read in pieces now (here of 4 kB, 1 MiB in a run), cut where whitespace begins: the same
    tokens, BOS first and EOS last, whether it has newlines, only spaces, or no whitespace at all."""
    seen = []

    def counting(text, **kw):
        seen.append(len(text))
        return tok(text, **kw)

    counting.eos_token_id = tok.eos_token_id
    monkeypatch.setattr(tokens, "PIECE_CHARS", 4096)
    blocks = tokens.pack_text([{"text": text}, {"text": "short one"}], counting, 512)
    stream = [t for d in documents(tok, [{"text": text}, {"text": "short one"}]) for t in d]
    assert [t for b in blocks for t in b["input_ids"]] == stream
    assert max(seen) <= 4096 and len([n for n in seen if n > 64]) >= len(text) // 4096, "read in pieces"
