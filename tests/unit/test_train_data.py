"""Data formats → tokenized examples, on the shipped tokenizer."""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoTokenizer

from dockyard.common.errors import DockyardError
from dockyard.common.run_settings import DATA, TINY_MODEL
from dockyard.train import guards
from dockyard.train.data import batches, formats, read, tokens


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY_MODEL)


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def causal_lm_examples(rows, tok, max_len):
    """The rows' examples as a causal-LM run makes them, their format found from their fields."""
    return tokens.tokenize(rows, formats.detect_format(rows, "causal_lm"), tok, max_len).examples


def test_the_shipped_samples_cover_both_tasks(tok):
    lm = causal_lm_examples(read.read_rows(DATA / "sample.jsonl"), tok, 128)
    assert len(lm) == 2000 and all(ex["input_ids"] == ex["labels"] for ex in lm[:5])
    rows = read.read_rows(DATA / "sample-classify.jsonl")
    assert formats.label_names(rows) == ["calm", "storm"]


def test_prompt_completion_learns_only_the_completion(tok, tmp_path):
    rows = read.read_rows(write(tmp_path / "pc.jsonl", [{"prompt": "Which port?", "completion": " Bergen"}]))
    [ex] = causal_lm_examples(rows, tok, 64)
    prompt_len = len(tok("Which port?")["input_ids"])
    assert ex["labels"][:prompt_len] == [tokens.IGNORE] * prompt_len
    assert ex["labels"][prompt_len:] == ex["input_ids"][prompt_len:]
    assert ex["input_ids"][-1] == tok.eos_token_id


def test_plain_text_files_are_one_document_per_line(tok, tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    rows = read.read_rows(tmp_path)  # a folder: every data file in it, of one kind
    assert rows == [{"text": "first line"}, {"text": "second line"}]


def test_examples_are_truncated_to_max_seq_length(tok):
    [ex] = causal_lm_examples([{"text": "word " * 200}], tok, 16)
    assert len(ex["input_ids"]) == len(ex["labels"]) == 16


def test_examples_with_nothing_to_learn_are_not_told_to_raise_max_seq_length(tok):
    """Empty documents were refused with "raise max_seq_length", which cannot help; a cut example still is."""
    with pytest.raises(DockyardError, match="every one is empty") as empty:
        causal_lm_examples([{"text": ""}] * 2, tok, 64)
    assert "max_seq_length" not in str(empty.value)
    with pytest.raises(DockyardError, match="within max_seq_length=4: raise it"):
        causal_lm_examples([{"prompt": "Which port is number two on the list?", "completion": " Bergen"}], tok, 4)


def test_rows_without_a_known_format_are_refused_with_the_fields_found(tok):
    with pytest.raises(DockyardError, match=r"fields \(answer, question\).*messages \(messages\)"):
        causal_lm_examples([{"question": "x", "answer": "y"}], tok, 64)


def test_bad_files_are_refused_with_their_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(DockyardError, match="bad.jsonl:2"):
        read.read_rows(bad)
    with pytest.raises(DockyardError, match="no data at"):
        read.read_rows(tmp_path / "missing.jsonl")
    (tmp_path / "x.md").write_text("# notes")
    with pytest.raises(DockyardError, match="unknown data file type .md"):
        read.read_rows(tmp_path / "x.md")


@pytest.mark.parametrize("depth", [63, 100, 5_000, 50_000])
def test_json_nested_deeper_than_any_example_is_refused_before_pyarrow_reads_it(tmp_path, depth):
    """At 50,000 brackets pyarrow's reader crashed every process (SIGSEGV), saying nothing of the file; at 5,000
    the trainer's own line check raised RecursionError (a traceback); on the host at 1,000. From 64 levels (a field
    nested 63 deep in the example's object) up to 100, the host passed it and the trainer stopped on `datasets`'
    "Recursion level in ArrowSchema struct exceeded", of no line or fix. Brackets inside a string are text, and are
    read; 63 levels are read, in a .jsonl and a .json file (whose array around the examples is no level)."""
    nested = "[" * depth + "]" * depth
    jsonl, whole = tmp_path / "deep.jsonl", tmp_path / "deep.json"
    jsonl.write_text('{"text": "a"}\n{"text": "b", "x": ' + nested + "}\n")
    whole.write_text('[{"text": "a", "x": ' + nested + "}]")
    for path, where in ((jsonl, "deep.jsonl:2"), (whole, "deep.json")):
        with pytest.raises(DockyardError, match=f"cannot read .*{where}: nests more than 63 levels deep"):
            read.read_rows(path)
    from dockyard.common.data_files import first_example

    first = tmp_path / "first.jsonl"
    first.write_text('{"text": "b", "x": ' + nested + "}\n")
    with pytest.raises(DockyardError, match="first.jsonl:1: nests more than 63 levels"):
        first_example(first)  # what `invoke run --dry` reads
    from dockyard.common.data_files import examples_in

    with pytest.raises(DockyardError, match="deep.jsonl:2: nests more than 63 levels"):
        examples_in([jsonl], 16)  # and the lines it counts
    text = tmp_path / "brackets.jsonl"
    text.write_text(json.dumps({"text": "[" * 500 + '\\" {' * 200}) + "\n")
    assert read.read_rows(text)[0]["text"].startswith("[[[")
    deepest = "[" * 62 + "]" * 62
    jsonl.write_text('{"text": "a"}\n{"text": "b", "x": ' + deepest + "}\n")
    whole.write_text('[{"text": "a", "x": ' + deepest + "}]")
    assert len(read.read_rows(jsonl)) == 2 and len(read.read_rows(whole)) == 1


def test_rows_naming_thousands_of_fields_are_refused_before_datasets_makes_a_table_of_them(tmp_path):
    """The twelfth red-team pass: 20,000 rows each naming a field of its own (a 600 KB .jsonl) took a minute, 7.6 GB
    of memory and 3 GB of cache in every process: `datasets` made a table of 20,001 columns, every row holding all.
    Refused in a line before it reads; a file of a few fields more than the format reads still trains."""
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": "a", f"k{i}": 1} for i in range(5_000)]
    jsonl = write(tmp_path / "wide.jsonl", rows)
    whole = tmp_path / "wide.json"
    whole.write_text(json.dumps(rows))
    parquet = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"text": ["a"], **{f"k{i}": [None] for i in range(1_000)}}), parquet)
    for path in (jsonl, whole, parquet):
        started = time.monotonic()
        with pytest.raises(DockyardError, match=rf"cannot read .*{path.name}: its rows name more than 1,000 different "
                                                r"fields \(text, k0, k1, k2, k3, ...\); .*keep the fields your data"):
            read.read_rows(path)
        assert time.monotonic() - started < 20  # a guard against the minute it took, not a speed goal
    fine = write(tmp_path / "fine.jsonl", [{"text": "a", f"k{i}": 1} for i in range(50)])
    assert [r["text"] for r in read.read_rows(fine)] == ["a"] * 50


def test_parquet_rows_that_decode_past_what_each_process_can_hold_are_refused_before_datasets_reads_them(
        tmp_path, monkeypatch):
    """The twelfth red-team pass: a Parquet file of 220 KB stores one 400-character value once for 5 million rows
    (a dictionary), which `datasets` decoded to 2 GB in every process. Its decoded size is counted first, without
    decoding it, against this node's free memory shared among its processes; the processes here are as many as
    leave each less than 1 GB of the memory this machine has free."""
    import math
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    bomb = tmp_path / "bomb.parquet"
    indices = pa.array([0] * 1_000_000, pa.int32())
    with pq.ParquetWriter(bomb, pa.schema({"text": pa.dictionary(pa.int32(), pa.string())}),
                          compression="zstd") as w:
        for _ in range(5):
            w.write_table(pa.table({"text": pa.DictionaryArray.from_arrays(indices, pa.array(["x" * 400]))}))
    assert bomb.stat().st_size < 1_000_000
    processes = math.ceil(guards.host_memory_available() / 1e9) + 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    started = time.monotonic()
    with pytest.raises(DockyardError, match=rf"cannot read .*bomb.parquet \(.* kB of Parquet\): its rows decode to "
                                            rf"more than .* [MG]B, held by each of this node's {processes} process\(es\), "
                                            r"and the node has .* free .*train on a part of it"):
        read.read_rows(bomb)
    assert time.monotonic() - started < 20  # counted, not decoded: a guard, not a speed goal


def test_the_decoded_size_counted_is_what_the_decoded_rows_take(tmp_path):
    """Strings, repeated strings, numbers and chat messages (lists of records): the count a Parquet file's rows are
    refused by is the size of the same rows decoded into Arrow, within 5 %."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dockyard.common.data_files import parquet_decoded

    rows = [{"messages": [{"role": "user", "content": f"question {i} " * (i % 50)},
                          {"role": "assistant", "content": "the same answer every time " * 20}],
             "score": i / 7, "system": "a long system prompt repeated in every row " * 30} for i in range(20_000)]
    table = pa.Table.from_pylist(rows)
    path = tmp_path / "chat.parquet"
    pq.write_table(table, path)
    counted = parquet_decoded(path, past=10**15)
    assert abs(counted - table.nbytes) < 0.05 * table.nbytes
    assert path.stat().st_size < table.nbytes / 20  # the file is far smaller than its rows: what is counted is not it
    assert parquet_decoded(path, past=1_000_000) < 0.2 * table.nbytes  # stops soon past what it is asked about
    assert read.read_rows(path)[0]["system"] == rows[0]["system"]


def test_a_folder_must_hold_one_kind_of_file(tmp_path):
    write(tmp_path / "a.jsonl", [{"text": "a"}])
    (tmp_path / "b.txt").write_text("b\n")
    with pytest.raises(DockyardError, match="mixes data files of different kinds"):
        read.read_rows(tmp_path)


@pytest.mark.parametrize("splits", [False, True])
def test_a_folder_datasets_saved_to_disk_is_refused_saying_how_to_write_it_out(tmp_path, splits):
    """The newcomer audit: --data at a folder `save_to_disk` wrote was "cannot read .../dataset_info.json:1: not JSON
    (Expecting property name enclosed in double quotes: column 2); each line must be one JSON object" (a
    DatasetDict's: "cannot tell the data format from its fields (splits)"), on the host and in the trainer."""
    import datasets

    from tests.support.cli import invoke_here

    saved = datasets.Dataset.from_list([{"text": f"ships leave Bergen at {h}"} for h in range(8)])
    if splits:
        saved = datasets.DatasetDict({"train": saved, "test": saved.select(range(2))})
    folder = tmp_path / "saved"
    saved.save_to_disk(str(folder))
    says = (f"a dataset saved with datasets' save_to_disk (Arrow files), which a run does not read: write it out as a "
            f"data file first, datasets.load_from_disk(FOLDER){'[' + repr('train') + ']' if splits else ''}"
            ".to_json('train.jsonl') (or .to_parquet), and give that file (docs/data.md)")
    with pytest.raises(DockyardError) as e:
        read.read_rows(folder)
    assert str(e.value) == f"{folder}: {says}"
    r = invoke_here("run", "--dry", "--variant=cpu", f"--data={folder}",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 1 and r.stderr.endswith(f"error: --data {folder}: {says}\n"), r.stderr


def test_labels_may_be_names_or_integers(tok):
    assert formats.label_names([{"text": "a", "label": 2}, {"text": "b", "label": 0}]) == ["0", "1", "2"]
    names = formats.label_names([{"text": "a", "label": "spam"}, {"text": "b", "label": "ham"}])
    examples = tokens.seq_cls_examples([{"text": "a", "label": "spam"}], tok, 8, names).examples
    assert names == ["ham", "spam"] and examples[0]["labels"] == 1
    with pytest.raises(DockyardError, match="`text` and `label`"):
        formats.label_names([{"text": "a"}])


def test_batches_pad_with_masked_positions_the_loss_skips():
    pad = batches.collate(0)
    batch = pad([{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8], "labels": [8]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert pad([{"input_ids": [1], "labels": 1}])["labels"].tolist() == [1]




@pytest.mark.parametrize("rows, said", [
    ([{"text": 5}, {"text": 7}], "example 1's text is int '5', not text"),
    ([{"text": [101, 2023, 102]}], "example 1's text is list '[101, 2023, 102]', not text"),
    ([{"prompt": "Which port?", "completion": "Bergen"}, {"prompt": "Which sea?", "completion": 3}],
     "example 2's completion is int '3', not text"),
    ([{"instruction": "Sum", "input": [1, 2], "output": "3"}], "example 1's input is list"),
])
def test_a_text_field_holding_numbers_or_token_ids_is_refused_not_trained_on_as_digits(tok, tmp_path, rows, said):
    """A .jsonl of {"text": 5} or of token ids in "text" trained on the digits "5" or "[101, 2023, 102]" (str() of the
    value), without a word: now the example and the field are named."""
    with pytest.raises(DockyardError, match=re.escape(said)):
        causal_lm_examples(read.read_rows(write(tmp_path / "d.jsonl", rows)), tok, 64)



def test_a_byte_order_mark_is_no_text_of_a_text_files_first_line(tmp_path):
    """Editors on Windows start a .txt file with one: it was trained on as the first document's first tokens."""
    path = tmp_path / "notes.txt"
    path.write_bytes("\ufeffhello world\nsecond line\n".encode())
    assert read.read_rows(path) == [{"text": "hello world"}, {"text": "second line"}]


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_the_scan_for_lines_datasets_misreads_names_the_line_wherever_its_chunks_end(tmp_path, monkeypatch, chunk):
    """The trainer's scan of a .jsonl file for NaN or Infinity, or two objects on a line, reads it in chunks (a file of
    gigabytes, in every process): the line it names is the file's line whichever chunk it falls in, a BOM before line
    1 is no part of it, and the words and braces within strings are text."""
    from dockyard.common import data_files

    monkeypatch.setattr(data_files, "MISREAD_CHUNK", chunk)
    text = ['{"text": "NaN is a word"}', '{"text": "a} {b Infinity"}'] * 50
    given = tmp_path / "data.jsonl"
    given.write_text("\ufeff" + "\n".join([*text, '{"text": "x", "score": Infinity}', *text]) + "\n")
    assert data_files.misread_line(given).startswith(f"{given}:101: Infinity is a number JSON does not allow")
    given.write_text("\ufeff" + "\n".join(text))  # no line break at its end
    assert data_files.misread_line(given) == ""
    given.write_text('\ufeff{"text": "a"}{"text": "b"}')
    assert data_files.misread_line(given).startswith(f"{given}:1: two JSON objects on one line (the second from "
                                                     "column 14)")
