"""Every data format a user brings, read from disk through `datasets` and tokenized with the shipped tokenizer:
the format found from the fields, and the loss counting only what the model must learn (checked on token ids)."""

from __future__ import annotations

import json
import os
import time

import pytest
from transformers import AutoTokenizer

from dockyard.common.errors import DockyardError, Stopped
from dockyard.common.run_settings import TINY_MODEL, RunSettings
from dockyard.train import data, limits
from dockyard.train.data import formats, read, tokens

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which port?"},
        {"role": "assistant", "content": "Bergen"}, {"role": "user", "content": "And the next?"},
        {"role": "assistant", "content": "Stavanger"}]


@pytest.fixture
def tok():
    return AutoTokenizer.from_pretrained(TINY_MODEL)  # no chat template of its own: the fallback is used


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def learned_text(tok, ex) -> list[str]:
    """The runs of tokens the loss counts, decoded."""
    runs, cur = [], []
    for i, label in zip(ex["input_ids"], ex["labels"], strict=True):
        if label == tokens.IGNORE:
            if cur:
                runs.append(tok.decode(cur))
            cur = []
        else:
            assert label == i
            cur.append(i)
    return runs + ([tok.decode(cur)] if cur else [])


def one_example(tok, path, fmt_expected):
    rows = read.read_rows(path)
    fmt = formats.detect_format(rows, "causal_lm", "auto", str(path))
    assert fmt == fmt_expected
    [ex] = tokens.tokenize(rows, fmt, tok, 512).examples
    return ex


def test_messages_learn_only_the_assistant_turns(tok, tmp_path):
    ex = one_example(tok, jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}]), "messages")
    learned = learned_text(tok, ex)
    assert [t.strip() for t in learned] == [f"Bergen{tok.eos_token}", f"Stavanger{tok.eos_token}"]
    whole = tok.decode(ex["input_ids"])
    assert "Which port?" in whole and "Be brief." in whole and "<|assistant|>" in whole
    assert tok.chat_template == tokens.FALLBACK_CHAT_TEMPLATE  # saved with the model: inference sees the same


def test_a_tokenizer_with_its_own_chat_template_is_used(tok, tmp_path):
    tok.chat_template = ("{% for m in messages %}{{ '[' + m['role'] + ']' + m['content'] + '[/]' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '[assistant]' }}{% endif %}")
    ex = one_example(tok, jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[1:3]}]), "messages")
    assert [t.strip() for t in learned_text(tok, ex)] == ["Bergen[/]"]
    assert tok.decode(ex["input_ids"]).startswith("[user]Which port?[/][assistant]")


def test_alpaca_is_a_user_assistant_chat_learning_the_output(tok, tmp_path):
    rows = [{"instruction": "Name a port.", "input": "In Norway.", "output": "Bergen"}]
    ex = one_example(tok, jsonl(tmp_path / "alpaca.json", rows), "alpaca")
    assert [t.strip() for t in learned_text(tok, ex)] == [f"Bergen{tok.eos_token}"]
    assert "Name a port." in tok.decode(ex["input_ids"]) and "In Norway." in tok.decode(ex["input_ids"])


def test_sharegpt_maps_human_and_gpt_turns(tok, tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "Which port?"}, {"from": "gpt", "value": "Bergen"}]}]
    ex = one_example(tok, jsonl(tmp_path / "sg.jsonl", rows), "sharegpt")
    assert [t.strip() for t in learned_text(tok, ex)] == [f"Bergen{tok.eos_token}"]


def test_prompt_completion_from_parquet_and_text_from_csv(tok, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["Which port?"], "completion": [" Bergen"]}), tmp_path / "pc.parquet")
    ex = one_example(tok, tmp_path / "pc.parquet", "prompt_completion")
    assert [t.strip() for t in learned_text(tok, ex)] == [f"Bergen{tok.eos_token}"]
    (tmp_path / "t.csv").write_text('text\n"Ships sail from Bergen, daily."\n')
    ex = one_example(tok, tmp_path / "t.csv", "text")
    assert ex["labels"] == ex["input_ids"]


def test_a_hub_dataset_is_read_from_the_local_cache_only(tok, tmp_path, monkeypatch):
    """The Hub cache layout `hf download --repo-type dataset acme/chats` leaves behind, made by hand here (the
    tests never reach the Hub)."""
    revision = "0" * 40
    repo = tmp_path / "hub" / "datasets--acme--chats"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision / "data").mkdir(parents=True)
    jsonl(repo / "snapshots" / revision / "data" / "train.jsonl", [{"messages": CHAT[1:3]}])
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read.read_rows("acme/chats") == [{"messages": CHAT[1:3]}]
    with pytest.raises(DockyardError, match="acme/missing is not in the local Hugging Face cache.*hf download"):
        read.read_rows("acme/missing")
    # its files get a local file's checks before pyarrow reads them: one line nested 60,000 deep in a cached dataset
    # crashed every process (SIGSEGV, no manifest), where the same file given by path was refused by its line
    deep = repo / "snapshots" / revision / "data" / "train.jsonl"
    deep.write_text('{"messages": []}\n' + '{"text": "x", "y": ' + "[" * 200 + "]" * 200 + "}\n")
    with pytest.raises(DockyardError, match=r"cannot read .*train.jsonl:2: nests more than 63 levels deep"):
        read.read_rows("acme/chats")


@pytest.mark.parametrize("rows, named, message", [
    ([{"messages": [{"role": "user", "content": "hi"}]}], "auto", "no assistant turn"),
    ([{"messages": "hello"}], "auto", "must be a list"),
    ([{"conversations": [{"from": "robot", "value": "x"}]}], "auto", "without a known 'from'"),
    ([{"text": "a"}, {"txt": "b"}], "auto", r"example 2 lacks text.*fields found: txt"),
    # a later line `null` (or `{}`) was "example 2 lacks text (fields found: ; expected: text)"
    ([{"text": "a"}, None], "auto", r"example 2 has no field with a value \(a line `null` or `\{\}`, or every field "
                                     r"null\): remove it, or give it text as the text format needs"),
    ([{"text": "a"}, {}], "auto", r"example 2 has no field with a value"),
    ([{"text": "a"}], "messages", r"lacks messages for the messages format \(fields found: text"),
])
def test_a_wrong_schema_stops_before_training_naming_the_fields(tok, tmp_path, rows, named, message):
    rows = read.read_rows(jsonl(tmp_path / "bad.jsonl", rows))
    with pytest.raises(DockyardError, match=message):
        fmt = formats.detect_format(rows, "causal_lm", named, "bad.jsonl")
        tokens.tokenize(rows, fmt, tok, 64)


@pytest.mark.parametrize("rows, said", [
    ([{"prompt": "a", "completion": None}], "nulls.jsonl: example 1: completion is null, where the prompt_completion "
                                            "format needs text: fill it in, or leave the example out"),
    ([{"instruction": "a", "output": None}] * 2, "example 1: output is null, where the alpaca format needs text"),
    ([{"messages": None}], 'example 1: messages is null, where the messages format needs a list of turns ([{"role"'),
    ([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, {"messages": []}],
     'example 2: `messages` is an empty list, where the messages format needs a list of turns'),
    ([{"conversations": []}], "example 1: `conversations` is an empty list, where the sharegpt format needs a list"),
])
def test_a_field_of_the_format_that_is_null_or_an_empty_chat_is_named_with_its_example(tok, tmp_path, rows, said):
    """Red-team pass: `{"prompt": "a", "completion": null}` was "cannot tell the data format from its fields
    (prompt); rename them"; `{"messages": []}` was "no assistant turn, so nothing to learn (roles found: ; ...)"."""
    rows = read.read_rows(jsonl(tmp_path / "nulls.jsonl", rows))
    with pytest.raises(DockyardError) as refused:
        tokens.tokenize(rows, formats.detect_format(rows, "causal_lm", "auto", "nulls.jsonl"), tok, 64)
    assert said in str(refused.value) and "cannot tell" not in str(refused.value)


def test_fields_of_no_format_are_asked_to_be_renamed_and_a_csv_without_header_is_said(tmp_path):
    """question/answer rows were told "or name it with data_format", which cannot help (a named format needs the same
    fields: `--data_format prompt_completion` then failed with "lacks prompt, completion" after another start), and a
    CSV without its header line had its first row taken for the field names, unsaid."""
    qa = read.read_rows(jsonl(tmp_path / "qa.jsonl", [{"question": "Which port?", "answer": "Bergen"}]))
    with pytest.raises(DockyardError) as refused:
        formats.detect_format(qa, "causal_lm", "auto", "qa.jsonl")
    said = str(refused.value)
    assert "fields (answer, question); rename them to one of" in said and "prompt_completion (prompt+completion)" in said
    assert "data_format" not in said and "header" not in said and "first line" not in said
    csv = tmp_path / "qa.csv"
    csv.write_text("Which port?,Bergen\nWhich city?,Oslo\n")
    with pytest.raises(DockyardError, match=r"qa.csv: .*fields \(Bergen, Which port\?\).*a .csv file's first line must "
                                            r"name them, e.g. prompt,completion"):
        formats.detect_format(read.read_rows(csv), "causal_lm", "auto", str(csv))


def test_an_eval_fraction_holds_out_rows_by_the_seed(tok, tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"text": f"ship number {i} sails"} for i in range(20)])
    settings = RunSettings(data=str(path), eval_fraction=0.25)
    a, b = data.load(settings, tok, seed=1), data.load(settings, tok, seed=1)
    assert (len(a.train), len(a.eval)) == (15, 5) and a.eval == b.eval
    assert not {tuple(e["input_ids"]) for e in a.eval} & {tuple(e["input_ids"]) for e in a.train}
    assert a.info["format"] == "text" and a.info["eval_examples"] == 5
    other = data.load(settings, tok, seed=2)
    assert other.eval != a.eval


def test_eval_data_from_a_file_must_have_the_training_format(tok, tmp_path, caplog):
    """Red-team pass: held-out text beside prompt/completion training data was "eval.jsonl: example 1 lacks prompt,
    completion", after a warning that its field text was not trained on: the file's format is said now, and the
    one it must be in. Rows of the training format with other fields too are read as that format."""
    train = jsonl(tmp_path / "train.jsonl", [{"prompt": "p", "completion": " c"}])
    held = jsonl(tmp_path / "eval.jsonl", [{"text": "t"}])
    with pytest.raises(DockyardError) as refused:
        data.load(RunSettings(data=str(train), eval_data=str(held)), tok, seed=0)
    assert str(refused.value) == (f"{held}: its first example is in the text format (text), and held-out examples "
                                  "must be in the training data's, prompt_completion (prompt+completion) as in "
                                  f"{train}: convert them to prompt_completion (docs/data.md)")
    assert "not trained on" not in caplog.text
    jsonl(held, [{"prompt": "p2", "completion": " c2", "text": "t"}])
    assert data.load(RunSettings(data=str(train), eval_data=str(held)), tok, seed=0).info["eval_examples"] == 1


def test_a_huge_document_is_cut_from_its_head_alone_as_from_the_whole(tok):
    """A 60 MB document on one line was tokenized whole (31M tokens, 16 GB of memory, 3.5 minutes) to be cut to
    max_seq_length 128: only its head is read now, to the same tokens."""
    seen = []

    def counting(text, **kw):
        seen.append(len(text))
        return tok(text, **kw)

    counting.chat_template, counting.eos_token_id = tok.chat_template, tok.eos_token_id
    words = "the quick brown fox jumps over the lazy dog. " * 2000
    rows = [{"text": words}, {"text": "short one"}]
    whole = tokens.tokenize(rows, "text", tok, 16)
    head = tokens.tokenize(rows, "text", counting, 16)
    assert head.examples == whole.examples and head.truncated == whole.truncated == 1
    assert seen == [16 * tokens.CHARS_PER_TOKEN_BOUND, len("short one")], "the long one's head alone was tokenized"


LONG = "the quick brown fox jumps over the lazy dog. " * 2000  # 90 kB: 20,000 tokens
KEEP = 64  # max_seq_length: room for the chat template's words before the turn learnt


@pytest.mark.parametrize("fmt, row", [
    ("prompt_completion", {"prompt": "Q: say it all.", "completion": LONG}),
    ("prompt_completion", {"prompt": LONG, "completion": "short"}),
    ("messages", {"messages": [{"role": "user", "content": "say it all"}, {"role": "assistant", "content": LONG}]}),
    ("messages", {"messages": [{"role": "user", "content": LONG}, {"role": "assistant", "content": "short"}]}),
])
def test_a_huge_prompt_completion_or_chat_turn_is_read_from_its_head_alone_to_the_same_tokens(tok, fmt, row):
    """The tenth red-team pass: a 15 MB prompt (one field) took 4 GB per process, tokenized whole to keep 128
    tokens; documents (text) were already cut from their head. Each piece is now read from its head, to the tokens
    and labels a whole read cut to max_seq_length gives."""
    seen = []

    def counting(text, **kw):
        seen.append(len(text))
        return tok(text, **kw)

    counting.chat_template, counting.eos_token_id = tok.chat_template, tok.eos_token_id
    counting.apply_chat_template = tok.apply_chat_template
    rows = [row, {"prompt": "p", "completion": " c"} if fmt == "prompt_completion" else
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    whole = tokens.tokenize(rows, fmt, tok, 10**9)
    cut = [{"input_ids": e["input_ids"][:KEEP], "labels": e["labels"][:KEEP]} for e in whole.examples]
    head = tokens.tokenize(rows, fmt, counting, KEEP)
    assert head.examples == [e for e in cut if any(x != tokens.IGNORE for x in e["labels"][1:])]
    assert head.truncated == 1 and max(seen) <= KEEP * tokens.CHARS_PER_TOKEN_BOUND, "the long piece's head alone was read"


def test_a_huge_classifier_text_is_read_from_its_head_alone_to_the_same_tokens(tok):
    seen = []

    def counting(text, **kw):
        seen.append(len(text))
        return tok(text, **kw)

    rows = [{"text": LONG, "label": "a"}, {"text": "short", "label": "b"}]
    head = tokens.seq_cls_examples(rows, counting, 16, ["a", "b"])
    assert [e["input_ids"] for e in head.examples] == [tok(LONG, truncation=True, max_length=16)["input_ids"],
                                                       tok("short")["input_ids"]]
    assert head.truncated == 1 and max(seen) <= 16 * tokens.CHARS_PER_TOKEN_BOUND


def test_cut_examples_are_counted_and_said(tok, tmp_path, caplog):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "word " * 100}, {"text": "short"}])
    with caplog.at_level("WARNING", logger="dockyard.train"):
        loaded = data.load(RunSettings(data=str(path), max_seq_length=16), tok, seed=0)
    assert loaded.info["truncated"] == 1 and "max_seq_length" in caplog.text


def test_a_file_that_is_not_utf8_or_empty_says_so(tmp_path):
    """A Latin-1 file was a UnicodeDecodeError traceback, an empty one "cannot read ...: StopIteration"."""
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "smørbrød på bordet"}\n'.encode("latin-1"))
    with pytest.raises(DockyardError, match=f"cannot read {latin}:1 \\(byte 0xf8 at column 13\\): it is not UTF-8 "
                                            "text; save it as UTF-8"):
        read.read_rows(latin)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DockyardError, match=r"empty.jsonl holds no examples \(the file is empty\)"):
        read.read_rows(tmp_path / "empty.jsonl")
    # a parquet table of no rows (the tenth red-team pass): pyarrow's "BatchSize must be greater than 0, got 0"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "none.parquet")
    with pytest.raises(DockyardError, match=r"none.parquet holds no examples \(its table has no rows\)"):
        read.read_rows(tmp_path / "none.parquet")
    # a file the run may not read was an OSError traceback from every process (as root, whom chmod 000 does not
    # stop, a file whose read fails for anyone stands in)
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.jsonl").symlink_to("/proc/self/mem")
    with pytest.raises(DockyardError, match=f"cannot read {folder / 'a.jsonl'}: Input/output error$"):
        read.read_rows(folder)
    os.mkfifo(tmp_path / "pipe.jsonl")  # was a NotADirectoryError traceback
    with pytest.raises(DockyardError, match="pipe.jsonl: neither a file nor a folder"):
        read.read_rows(tmp_path / "pipe.jsonl")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_file_whose_first_value_is_null_is_refused_not_a_crash(tmp_path, suffix):
    """Red-team pass: a JSON Lines (or JSON) file whose first line is `null` crashed the trainer (SIGSEGV inside
    `datasets`: no message, no manifest). `invoke run` refuses it on the host, but a cached hub dataset is not read
    there."""
    f = tmp_path / f"rows{suffix}"
    f.write_bytes(b"\xef\xbb\xbf\n null \r\n" + b'{"text": "a"}\n')
    with pytest.raises(DockyardError, match=f"cannot read {f}:2: null, not an object; each line must be one JSON "
                                            "object"):
        read.read_rows(f)


def test_a_compressed_data_file_is_said_as_that(tmp_path):
    """Red-team pass: a gzip file named .csv was "it is not UTF-8 text (invalid start byte at byte 1)", and one
    named .csv.gz an unknown type, no more: both are said as compressed now, with what unpacks them."""
    import gzip

    packed = tmp_path / "train.csv"
    packed.write_bytes(gzip.compress(b"prompt,completion\nq,a\n"))
    with pytest.raises(DockyardError, match=f"cannot read {packed}: it is gzip-compressed: decompress it first "
                                            r"\(gunzip\)"):
        read.read_rows(packed)
    packed.rename(tmp_path / "train.csv.gz")
    with pytest.raises(DockyardError, match=r"unknown data file type .gz \(a compressed file: decompress it first, "
                                            r"gunzip\); use .jsonl"):
        read.read_rows(tmp_path / "train.csv.gz")


def test_a_line_that_is_not_a_json_object_is_named_with_what_is_wrong_in_its_own_numbering(tmp_path, caplog):
    """An unterminated string on line 11 was "bad.jsonl:11 (each line ...): Invalid encoding in string. in row 10"
    (pyarrow's words and its own count), under datasets' ERROR line from every process."""
    good = "".join(json.dumps({"text": f"example {i}"}) + "\n" for i in range(10))
    for tail, says in (('{"text": "cut short\n', "not JSON (Unterminated string starting at: column 10)"),
                       ('["text", "a list"]\n', "an array, not an object")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(good + tail)
        with caplog.at_level("ERROR"), pytest.raises(DockyardError) as e:
            read.read_rows(bad)
        assert str(e.value) == f"cannot read {bad}:11: {says}; each line must be one JSON object"
        assert not [r for r in caplog.records if r.name.startswith("datasets")], "said once, by the refusal"


def test_a_chat_template_that_refuses_a_conversation_names_the_example(tok, tmp_path):
    """A template that raises ("roles must alternate") was a jinja2 traceback with no example number."""
    tok.chat_template = ("{% for m in messages %}{% if loop.index0 > 0 and m['role'] == 'system' %}"
                         "{{ raise_exception('roles must alternate') }}{% endif %}{{ m['content'] }}{% endfor %}")
    rows = read.read_rows(jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[1:3]},
                                                          {"messages": [*CHAT[1:3], *CHAT[:1], *CHAT[3:]]}]))
    with pytest.raises(DockyardError, match="example 2: the model's chat template refuses this conversation: "
                                            "roles must alternate"):
        tokens.tokenize(rows, "messages", tok, 512)


@pytest.mark.parametrize("label, message", [
    ([1], r"example 2: label \[1\] is neither a class name nor a class number"),
    (1.5, r"example 2: label 1.5 is neither"),
    (10**12, r"1000000000000 is past the 65,536 classes a head is made for here"),
])
def test_a_label_that_is_not_a_class_is_refused(label, message):
    """`"label": [1]` was a TypeError (unhashable), `"label": 10**12` built a list of 10^12 class names."""
    with pytest.raises(DockyardError, match=message):
        formats.label_names([{"text": "a", "label": 0}, {"text": "b", "label": label}])


def test_a_fractional_label_in_a_file_is_named_by_its_own_example(tmp_path):
    """The thirteenth red-team pass: one `"label": 0.5` on line 41 made `datasets` read the whole column as floats,
    and the refusal named example 1's "label 0.0". Whole numbers read as floats are their classes; the fraction is
    named where it is."""
    rows = [{"text": f"t{i}", "label": i % 2} for i in range(40)] + [{"text": "x", "label": 0.5}]
    got = read.read_rows(jsonl(tmp_path / "labels.jsonl", rows))
    assert isinstance(got[0]["label"], float), "datasets casts the column (what this guards against)"
    with pytest.raises(DockyardError, match=r"example 41: label 0.5 is neither a class name nor a class number"):
        formats.label_names(got)
    assert formats.label_names(read.read_rows(jsonl(tmp_path / "whole.jsonl", rows[:40] + [{"text": "y", "label": 1.0}]))) \
        == ["0", "1"]


def test_a_subset_of_many_classes_keeps_its_class_numbers():
    """40 examples of a 77-class set (a smoke test on a sample) hold 33 of its labels: trained before, then refused
    as "most classes without an example", with advice (renumber) that breaks agreement with the full set."""
    rows = [{"text": str(i), "label": label} for i, label in enumerate([0, 3, 17, 40, 74] * 8)]
    assert formats.label_names(rows) == [str(i) for i in range(75)]


def test_a_csv_row_with_an_unquoted_comma_is_refused_by_its_line_not_cut(tmp_path):
    """pandas took a row with one cell more than its header (an unquoted comma) as an index and dropped its first
    cell without a word: the run trained on " exactly? Bergen"."""
    f = tmp_path / "c.csv"
    f.write_text("prompt,completion\nWhere is it, exactly?, Bergen\nWhich port?, Oslo\n")
    with pytest.raises(DockyardError, match=r"c.csv:2: 3 cells, but the header names 2 \(prompt,completion\): put a "
                                            "cell that holds a comma .* in double quotes"):
        read.read_rows(f)
    f.write_text('prompt,completion\n"Where is it, exactly?", Bergen\n')
    assert read.read_rows(f) == [{"prompt": "Where is it, exactly?", "completion": " Bergen"}]


def test_csv_cells_are_the_text_written_and_whole_number_labels_are_class_numbers(tmp_path):
    """`What is 2+2?,4` was refused ("completion is int 4, not text"), `NA` or `null` read as no value and `true` as
    a bool: a cell is its text now; an empty cell is no value, and a label column of whole numbers counts classes."""
    f = tmp_path / "qa.csv"
    f.write_text("\ufeffprompt,completion\nWhat is 2+2?,4\nSay nothing,NA\nIs it?,true\n")
    assert [r["completion"] for r in read.read_rows(f)] == ["4", "NA", "true"]
    f.write_text("text,label\nstorm,2\ncalm,0\n\nempty,\n")
    assert read.read_rows(f)[2] == {"text": "empty"}
    f.write_text("text,label\nstorm,2\ncalm,0\n")
    assert formats.label_names(read.read_rows(f)) == ["0", "1", "2"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("text,label\nx,1\n")
    (tmp_path / "d" / "b.csv").write_text("prompt,completion\nx,y\n")
    with pytest.raises(DockyardError, match="b.csv has the fields prompt,completion but a.csv has text,label"):
        read.read_rows(tmp_path / "d")


def _settings(path, **kw):
    return RunSettings(data=str(path), **kw)


def test_every_example_cut_or_left_out_is_said_for_training_and_evaluation(tok, tmp_path, caplog):
    """A classifier's texts were cut to max_seq_length without a word (its class may be decided at the end), empty
    documents left out without one (the warning came only with a cut), and the evaluation data's cuts and drops were
    never counted; all of it held out left the error blaming the training data."""
    caplog.set_level("WARNING", logger="dockyard.train")
    long = jsonl(tmp_path / "cls.jsonl", [{"text": "word " * 80 + "storm", "label": "storm"},
                                          {"text": "calm", "label": "calm"}])
    got = data.load(_settings(long, task="seq_cls", max_seq_length=16), tok, seed=0)
    assert got.info["truncated"] == 1 and len(got.train[0]["input_ids"]) == 16
    assert "1 of 2 examples are longer than max_seq_length=16 and were cut" in caplog.text
    caplog.clear()
    empties = jsonl(tmp_path / "e.jsonl", [{"text": "ships sail"}, {"text": ""}, {"text": "boats row"}])
    got = data.load(_settings(empties, eval_data=str(empties)), tok, seed=0)
    assert got.info["dropped"] == 1 and got.info["eval_dropped"] == 1 and got.info["truncated"] == 0
    assert "1 of 3 examples were left out: they hold no token to learn from" in caplog.text
    assert "1 of 3 evaluation examples were left out" in caplog.text
    held = jsonl(tmp_path / "held.jsonl", [{"prompt": "word " * 40, "completion": " Bergen"}])
    train = jsonl(tmp_path / "pc.jsonl", [{"prompt": "Which port?", "completion": " Bergen"}])
    with pytest.raises(DockyardError, match=r"no example of the evaluation data \(.*held.jsonl\) has a token to learn "
                                            "from within max_seq_length=16"):
        data.load(_settings(train, eval_data=str(held), max_seq_length=16), tok, seed=0)


def test_evaluation_examples_that_are_training_examples_are_counted_and_a_fraction_holds_out_none(tok, tmp_path,
                                                                                                   caplog):
    """--eval_data given the training file, or --eval_fraction of data with repeated rows (the shipped
    sample-classify.jsonl: 493 different of 1000), evaluated on examples it trained on, without a word."""
    caplog.set_level("WARNING", logger="dockyard.train")
    rows = [{"text": f"ship number {i % 5} sails"} for i in range(20)]  # each of 5 rows four times
    path = jsonl(tmp_path / "d.jsonl", rows)
    got = data.load(_settings(path, eval_data=str(path)), tok, seed=0)
    assert got.info["eval_in_training"] == 20
    assert "20 of the 20 evaluation examples" in caplog.text and "are also training examples" in caplog.text
    got = data.load(_settings(path, eval_fraction=0.25), tok, seed=0)
    assert got.info["eval_in_training"] == 0 and len(got.eval) == 8  # two whole groups of four
    assert not {tuple(e["input_ids"]) for e in got.eval} & {tuple(e["input_ids"]) for e in got.train}


def test_files_of_a_data_folder_that_are_not_read_are_named(tmp_path, caplog):
    caplog.set_level("WARNING", logger="dockyard.train")
    (tmp_path / "sub").mkdir()
    for name in ("a.jsonl", "B.JSONL", "sub/d.jsonl"):
        jsonl(tmp_path / name, [{"text": "ships sail"}])
    jsonl(tmp_path / ".old.jsonl", [{"text": "a stale copy ls does not show"}] * 50)  # was 50 of the 51 trained on
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    assert read.read_rows(tmp_path) == [{"text": "ships sail"}]
    assert ("not read (only .jsonl, .json, .parquet, .csv, .txt files not hidden are data): .old.jsonl, B.JSONL, sub/"
            in caplog.text)


def test_a_chat_template_that_never_ends_is_stopped_and_named(tok, monkeypatch):
    """A model folder's chat template of two nested loops of 10^5 hung the run after its settings line (killed at 110
    s, nothing said)."""
    monkeypatch.setattr(tokens, "RENDER_SECONDS", 0.5)
    tok.chat_template = ("{% for i in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}"
                         "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(DockyardError, match=r"example 1: the model's chat template took more than 0.5 s to render one "
                                            "conversation"):
        tokens.tokenize([{"messages": CHAT}], "messages", tok, 64)


@pytest.mark.parametrize("builds", [
    "{% set s = 'x' * 10**10 %}",  # ten gigabytes at once
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  # doubled
])
def test_a_chat_template_that_builds_a_string_of_gigabytes_is_stopped_and_named(tok, monkeypatch, builds):
    """The twelfth red-team pass: a template can build a string of gigabytes within its 10 s (Jinja's sandbox caps
    `range`, not a string's size), on every rank at once. Its render may take RENDER_BYTES (here 256 MiB) more
    than the process held; past that it is refused in a line, and the process's own limit is as it was."""
    import resource

    monkeypatch.setattr(tokens, "RENDER_BYTES", 256 << 20)
    tok.chat_template = builds + "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(DockyardError, match=r"example 1: the model's chat template took more than 268.4 MB of memory "
                                            r"to render one conversation \(a string without end\?\): check "
                                            "chat_template"):
        tokens.tokenize([{"messages": CHAT}], "messages", tok, 64)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    tok.chat_template = "{% set s = 'x' * 10**6 %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tokens.tokenize([{"messages": CHAT}], "messages", tok, 64).examples  # a megabyte is no bomb


@pytest.mark.parametrize("fmt, row", [("text", {"text": "hello " + "x" * 30}),
                                      ("prompt_completion", {"prompt": "hello", "completion": " " + "x" * 30}),
                                      ("packed", {"text": "hello " + "x" * 30})])
def test_a_tokenizer_that_fails_on_an_example_is_one_line_naming_it(tmp_path, fmt, row):
    """The thirteenth red-team pass: a model folder's tokenizer.json whose pre-tokenizer regex backtracks past
    Oniguruma's limit on a text panics in Rust, a BaseException (pyo3's PanicException): every rank printed hundreds
    of lines of backtrace and traceback. It is the example's number and the tokenizer's own words, in a line."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(TINY_MODEL, model)
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(x+x+)+y"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    bad = AutoTokenizer.from_pretrained(model)
    rows = [{"text": "fine", "prompt": "fine", "completion": " too"}, row]
    with pytest.raises(DockyardError, match=r"^example 2: the model's tokenizer cannot encode it \(PanicException: "
                                            r"Onig: Regex search error: retry-limit-in-match over\): check "
                                            "tokenizer.json"):
        if fmt == "packed":
            tokens.pack_text(rows, bad, 64)
        else:
            tokens.tokenize(rows, fmt, bad, 64)


def test_the_chat_templates_time_limit_leaves_an_alarm_set_by_its_caller_in_place():
    """The limit took over SIGALRM's timer and cancelled it afterwards: a limit its caller had set (pytest-timeout's
    on a hung test, a user's own watchdog) never fired."""
    import signal

    fired = []
    before = signal.signal(signal.SIGALRM, lambda *_: fired.append("outer"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5)
        with limits.time_limit(1):
            pass
        assert 4 < signal.getitimer(signal.ITIMER_REAL)[0] <= 5, "the caller's alarm is set again, as it was"
        signal.setitimer(signal.ITIMER_REAL, 0.1, 7)  # a repeating one, due first: the limit still holds, and then
        with pytest.raises(limits.TooSlow), limits.time_limit(0.2):  # the caller's fires, and repeats as it did
            time.sleep(2)
        time.sleep(0.1)
        assert fired == ["outer"] and signal.getitimer(signal.ITIMER_REAL)[1] == 7
        fired.clear()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with limits.time_limit(10):  # the caller's is due first: it fires, with its own handler
            time.sleep(0.5)
        assert fired == ["outer"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_a_bad_line_after_a_byte_order_mark_is_named_not_the_mark(tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b'{"text": "ships sail"}\n{"text": "a"}\n{"text": \n')
    with pytest.raises(DockyardError, match=r"bom.jsonl:3: not JSON"):
        read.read_rows(f)


def test_a_first_row_with_an_empty_cell_is_named_not_taken_for_another_format(tmp_path, caplog):
    """`prompt,completion` then `Which port?,` (no answer yet): "cannot tell the data format from its fields
    (prompt)", though the header named both. And text+label data trained as text, the label unread, unsaid."""
    f = tmp_path / "pc.csv"
    f.write_text("prompt,completion\nWhich port?,\nWhich city?,Oslo\n")
    with pytest.raises(DockyardError, match=r"example 1 lacks completion for the prompt_completion format"):
        formats.detect_format(read.read_rows(f), "causal_lm", "auto", str(f))
    caplog.set_level("WARNING", logger="dockyard.train")
    f = jsonl(tmp_path / "cls.jsonl", [{"text": "storm coming", "label": "storm"}])
    assert formats.detect_format(read.read_rows(f), "causal_lm", "auto", str(f)) == "text"
    assert "has a label field, which causal language modelling does not read" in caplog.text
    assert "add --task seq_cls" in caplog.text


def test_class_numbers_with_no_example_are_said(caplog):
    """Labels 1 and 5 made a head of six classes, four never seen, without a word."""
    caplog.set_level("WARNING", logger="dockyard.train")
    assert formats.label_names([{"text": "a", "label": 1}, {"text": "b", "label": 5}]) == ["0", "1", "2", "3", "4", "5"]
    assert "classes 0, 2, 3, 4 have no example" in caplog.text


def test_a_chat_template_that_renders_no_assistant_text_is_said(tok):
    tok.chat_template = "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(DockyardError, match="example 1: the model's chat template renders nothing for an assistant turn"):
        tokens.tokenize([{"messages": CHAT}], "messages", tok, 64)


def test_fields_the_format_does_not_read_are_named(tmp_path, caplog):
    """A prompt_completion row's `system` prompt was dropped without a word; an alpaca row's is read."""
    caplog.set_level("WARNING", logger="dockyard.train")
    f = jsonl(tmp_path / "pc.jsonl", [{"prompt": "Which port?", "completion": " Bergen", "system": "Be brief."},
                                      {"prompt": "Which city?", "completion": " Oslo", "id": 7}])
    assert formats.detect_format(read.read_rows(f), "causal_lm", "auto", str(f)) == "prompt_completion"
    assert "the fields id, system are not trained on" in caplog.text
    assert "write it into each prompt or write the rows as messages" in caplog.text
    caplog.clear()
    f = jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "Name a port.", "output": "Bergen", "system": "Be brief."}])
    assert formats.detect_format(read.read_rows(f), "causal_lm", "auto", str(f)) == "alpaca"
    assert "not trained on" not in caplog.text
    # the names are the data's: a terminal escape is shown, not played; thousands of keys are not a line of thousands
    keys = {"text": "ships", "\x1b]0;owned\x07": 1, **{f"k{i}": i for i in range(500)}}
    f = jsonl(tmp_path / "wide.jsonl", [keys])
    formats.detect_format(read.read_rows(f), "causal_lm", "auto", str(f))
    said = caplog.text.splitlines()[-1]
    assert "\x1b" not in said and "'\\x1b]0;owned\\x07'" in said and "and 493 more are not trained on" in said
    assert len(said) < 600


def test_a_chat_error_in_the_evaluation_data_names_that_file_and_an_assistant_first_turn_is_said_as_such(tok,
                                                                                                     tmp_path):
    """"example 3: no assistant turn" sent the user to row 3 of the training data when it was the evaluation file's;
    a conversation opening with the assistant's turn was "Cannot apply chat template to an empty conversation"."""
    train = jsonl(tmp_path / "train.jsonl", [{"messages": CHAT[1:3]}] * 3)
    held = jsonl(tmp_path / "held.jsonl", [{"messages": CHAT[1:3]}] * 2 + [{"messages": CHAT[1:2]}])
    with pytest.raises(DockyardError, match=r"the evaluation data \(.*held.jsonl\): example 3: no assistant turn, so "
                                            r"nothing to learn \(roles found: user;"):
        data.load(RunSettings(data=str(train), eval_data=str(held)), tok, seed=0)
    # the training data's own such example names its file too (it said "example 2: ..." alone)
    roles = jsonl(tmp_path / "roles.jsonl", [{"messages": CHAT[1:3]}] + [{"messages": [
        {"role": "human", "content": "hi"}, {"role": "bot", "content": "yo"}]}] * 2)
    with pytest.raises(DockyardError, match=r"^\S*roles.jsonl: example 2: no assistant turn, so nothing to learn "
                                            r"\(roles found: bot, human;"):
        data.load(RunSettings(data=str(roles)), tok, seed=0)
    rows = read.read_rows(jsonl(tmp_path / "first.jsonl", [{"messages": CHAT[1:3]}, {"messages": CHAT[2:3]}]))
    with pytest.raises(DockyardError, match="example 2: the conversation opens with an assistant turn"):
        tokens.tokenize(rows, "messages", tok, 512)


def test_a_field_that_only_later_rows_have_is_named_with_its_line(tmp_path):
    """datasets reads a folder (or a file past its first block) as one table of the first rows' fields: a later row's
    new field was "cannot read ...: Couldn't cast ...", naming neither the row nor the field."""
    folder = tmp_path / "data"
    folder.mkdir()
    jsonl(folder / "a.jsonl", [{"prompt": "p", "completion": " c"}] * 3)
    jsonl(folder / "b.jsonl", [{"prompt": "p", "completion": " c"}, {"prompt": "p", "completion": " c", "source": "x"}])
    with pytest.raises(DockyardError, match=r"b.jsonl:2: it has the field source, which a.jsonl:1 has not.*give every "
                                            r"row the same fields"):
        read.read_rows(folder)


def test_chat_turns_of_a_role_no_template_learns_are_said(tok, tmp_path, caplog):
    """A third party's turns ("bot") were read as context without a word: a dataset naming the assistant otherwise
    trained on nothing of its answers but those named "assistant"."""
    chat = [*CHAT[1:3], {"role": "bot", "content": "Oslo"}]
    path = jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[1:3]}, {"messages": chat}, {"messages": chat}])
    caplog.set_level("INFO", logger="dockyard.train.data")
    data.load(_settings(path), tok, seed=0)
    assert ("chat turns of roles other than system, user, assistant and tool in the data ('bot' in 2 example(s)): "
            "the model reads them as context and never learns them") in caplog.text


def test_a_csv_header_with_spaces_a_name_twice_or_a_quote_left_open_is_said_as_it_is(tmp_path):
    """The fourth red-team pass: `prompt, completion` was refused as fields ( completion, prompt), the leading space
    unseen; `text,text` kept the second column alone, unsaid; a quote never closed on line 2 was "line 3: 1 cells
    ... put a cell that holds a comma in double quotes", the opposite of the fix."""
    spaced = tmp_path / "spaced.csv"
    spaced.write_text("prompt, completion\nWhich port?,Bergen\n")
    assert read.read_csv([spaced]) == [{"prompt": "Which port?", "completion": "Bergen"}]
    twice = tmp_path / "twice.csv"
    twice.write_text("text,text\na,b\n")
    with pytest.raises(DockyardError, match="twice.csv:1: the header names text twice"):
        read.read_csv([twice])
    open_quote = tmp_path / "open.csv"
    open_quote.write_text('text,label\n"unterminated,1\nb,2\n')
    with pytest.raises(DockyardError, match=r"open.csv:2: a double quote opened on this line is never closed"):
        read.read_csv([open_quote])


def test_columns_a_csv_header_names_nothing_are_no_fields_and_no_name_given_twice(tmp_path):
    """Red-team pass: a spreadsheet's .csv of `text,,` (two trailing empty columns) passed `--dry` and the trainer
    refused it as "the header names  twice: name each column once", naming nothing; `text,` was read. pandas'
    to_csv writes its index as a column of no name (`,text`), read as a field "" beside text. A column of no name is
    no field now, however many there are."""
    trailing = tmp_path / "trailing.csv"
    trailing.write_text("text,,\nships sail,,\nat dawn,,\n")
    assert read.read_csv([trailing]) == [{"text": "ships sail"}, {"text": "at dawn"}]
    index = tmp_path / "index.csv"
    index.write_text(",text\n0,ships sail\n1,at dawn\n")
    assert read.read_csv([index]) == [{"text": "ships sail"}, {"text": "at dawn"}]


def test_a_csv_header_of_many_columns_is_read_not_hung_on(tmp_path):
    """The tenth red-team pass: the check for a name given twice counted each name over the whole header, 400,000
    columns (19 MB) took half an hour in every process, silently. 100,000 took minutes; now well under a second."""
    import time

    wide = tmp_path / "wide.csv"
    names = ["text", *(f"c{i}" for i in range(100_000))]
    wide.write_text(",".join(names) + "\n" + ",".join(["hello", *[""] * 100_000]) + "\n")
    started = time.monotonic()
    assert read.read_csv([wide])[0]["text"] == "hello"
    assert time.monotonic() - started < 30  # a hang's guard, not a speed goal
    wide.write_text(",".join([*names, "c5"]) + "\n")
    with pytest.raises(DockyardError, match="the header names c5 twice"):
        read.read_csv([wide])


def test_a_csv_of_many_empty_columns_takes_the_memory_of_its_filled_cells(tmp_path):
    """The eleventh red-team pass: each row kept every column of the header, an empty cell as None; a 20 MB file of
    2,000 empty columns took 540 MB in every process. Measured with tracemalloc: the rows are about the size of the
    cells written, and a run on it trains on what is there."""
    import tracemalloc

    wide = tmp_path / "wide.csv"
    names = ["prompt", "completion", *(f"c{i}" for i in range(2_000))]
    row = ",".join(["Which port?", "Bergen", *[""] * 2_000])
    wide.write_text(",".join(names) + "\n" + "\n".join([row] * 1_000) + "\n")
    tracemalloc.start()
    try:
        rows = read.read_csv([wide])
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < wide.stat().st_size  # was 50x the file: 1,000 dicts of 2,002 keys
    assert rows[999] == {"prompt": "Which port?", "completion": "Bergen"}
    assert formats.detect_format(rows, "causal_lm", "auto", str(wide)) == "prompt_completion"


def test_a_class_the_held_out_share_took_whole_is_blamed_on_the_split_not_the_data(tok, tmp_path):
    """Ten examples of one class and one of another: with eval_fraction 0.1 some seeds hold out the one, and the
    error said its label was "not seen in the training data", as if --data lacked it."""
    rows = [{"text": f"calm day {i}", "label": "fair"} for i in range(10)] + [{"text": "gale", "label": "storm"}]
    path = jsonl(tmp_path / "rare.jsonl", rows)
    said = set()
    for seed in range(20):
        try:
            data.load(_settings(path, task="seq_cls", eval_fraction=0.1), tok, seed=seed)
        except DockyardError as e:
            said.add(str(e))
    assert said == {"labels not seen in the training data: storm: the held-out share (eval_fraction 0.1) took every "
                    "example of it; give it more examples, a smaller --eval_fraction, or held-out data of your own "
                    "(-- --eval_data FILE)"}


@pytest.mark.parametrize("label, said", [("a", "'a'"), (0, "0")])
def test_a_classifier_of_one_class_is_refused_not_trained_as_a_regression(tok, tmp_path, label, said):
    """40 examples of one label made a head of one output, which transformers trains as a regression (MSE,
    problem_type regression in the saved config.json), and the run reported a classifier trained."""
    path = jsonl(tmp_path / "one.jsonl", [{"text": f"t {i}", "label": label} for i in range(40)])
    for kw in ({}, {"eval_fraction": 0.1}):
        with pytest.raises(DockyardError) as raised:
            data.load(_settings(path, task="seq_cls", **kw), tok, seed=0)
        assert str(raised.value) == (f"{path}: every example has label {said}, and a classifier needs examples of 2 "
                                     "classes or more (with one, transformers would train a regression instead); add "
                                     "examples of the other classes")


def test_json_files_of_different_formats_in_a_folder_are_named_file_by_file(tmp_path):
    """A folder of .json files (or .json beside .jsonl) in different formats was "cannot read DIR: Couldn't cast",
    naming no file: the check that names them read .jsonl files alone."""
    (tmp_path / "a.json").write_text(json.dumps([{"text": "ships sail"}]))
    (tmp_path / "b.json").write_text(json.dumps([{"prompt": "Which port?", "completion": "Bergen"}]))
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DockyardError, match=r"different data formats \(text: a.json; prompt_completion: b.json; "
                                            r"messages: c.jsonl\)"):
        read.read_rows(tmp_path)


def test_a_chat_of_many_turns_is_read_up_to_what_is_kept_and_a_conversation_past_a_thousand_is_refused(tok):
    """The twelfth red-team pass: each assistant turn renders the whole conversation before it, and every turn was
    rendered even past max_seq_length: 3,000 pairs in one example (900 KB of data) hung every rank for minutes,
    silently. The turns after the cut are not read now; a conversation of more than 1,000 messages is refused."""
    import time

    pairs = [m for i in range(450) for m in ({"role": "user", "content": f"Which port {i}?"},
                                            {"role": "assistant", "content": "Bergen"})]
    started = time.monotonic()
    done = tokens.tokenize([{"messages": pairs}], "messages", tok, 128)
    assert time.monotonic() - started < 10  # the guard against the minutes it took, not a speed goal
    assert done.truncated == 1 and len(done.examples[0]["input_ids"]) == 128
    whole = tokens.tokenize([{"messages": pairs[:40]}], "messages", tok, 4096).examples[0]
    assert len(whole["input_ids"]) > 128 and done.examples[0]["input_ids"] == whole["input_ids"][:128]
    with pytest.raises(DockyardError, match="example 1: 1,002 turns in one conversation, past the 1,000 a chat "
                                            "example is read with .*: split it into several conversations"):
        tokens.tokenize([{"messages": pairs + pairs[:102]}], "messages", tok, 128)


class Field:  # as a dataclass field a lazy import builds: the signal's exception raised in its __set_name__
    def __init__(self, stop: BaseException):
        self.stop = stop

    def __set_name__(self, owner, name):
        raise self.stop


def loads_lazily(call, stop: BaseException):
    """`call`, whose first use imports something that builds a class (jinja2 on a first chat template, say), where
    the signal lands: Python 3.11 raises it as "RuntimeError: Error calling __set_name__ ..."."""
    def first_use(*args, **kwargs):
        class Loaded:  # noqa: F841 - built for its field's __set_name__
            buffer = Field(stop)
        return call(*args, **kwargs)
    return first_use


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), Stopped("stopped by SIGTERM", exit_code=143)],
                         ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("fmt", ["messages", "text"])
def test_a_signal_landing_in_a_lazy_import_while_tokenizing_stays_that_signal(tok, fmt, stop):
    """A Ctrl-C or the trainer's SIGTERM landing while the chat template's first render imported jinja2 ended the run
    as 'example 1: the model's chat template refuses this conversation: ...' (and while the tokenizer's did, 'the
    model's tokenizer cannot encode it (RuntimeError: ...)'), status 1, the model blamed: the run was stopped, not
    refused. The signal's exception now comes out as itself, which the trainer records as the stop it was."""
    if fmt == "messages":
        tok.apply_chat_template = loads_lazily(tok.apply_chat_template, stop)
        runs_it = tok
    else:
        runs_it = loads_lazily(tok, stop)
        runs_it.chat_template, runs_it.eos_token_id = tok.chat_template, tok.eos_token_id
    rows = [{"messages": CHAT}] if fmt == "messages" else [{"text": "the quick brown fox"}]
    with pytest.raises(type(stop)) as raised:
        tokens.tokenize(rows, fmt, runs_it, 64)
    assert raised.value is stop


def test_the_template_s_alarm_landing_in_a_lazy_import_is_said_as_the_template_s_time(tok):
    """The render's time limit is an alarm: landing in a class being built, it read 'the model's chat template refuses
    this conversation: TooSlow'."""
    tok.apply_chat_template = loads_lazily(tok.apply_chat_template, limits.TooSlow())
    with pytest.raises(DockyardError, match=r"^example 1: the model's chat template took more than \d+ s to render"):
        tokens.tokenize([{"messages": CHAT}], "messages", tok, 64)


def test_the_template_s_memory_limit_landing_in_a_lazy_import_is_said_as_the_template_s_memory(tok):
    """The render's memory limit (RLIMIT_AS) can run out while the first render's import builds a class: that read
    'the model's chat template refuses this conversation: MemoryError', where the limit is meant to be said."""
    tok.apply_chat_template = loads_lazily(tok.apply_chat_template, MemoryError())
    with pytest.raises(DockyardError, match=r"^example 1: the model's chat template took more than .* of memory"):
        tokens.tokenize([{"messages": CHAT}], "messages", tok, 64)
