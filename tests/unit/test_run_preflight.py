"""`invoke run --dry` refuses, on the host and without an engine, what the run would refuse later in the container,
and prints the command the run starts; `invoke slurm` and `invoke build` check what they are given the same way.
Through the real CLI (in this process); the trainer's own refusals are in tests/integration/test_recipes.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from dockyard import ROOT
from dockyard.common import run_settings, training_args
from dockyard.train.data import read
from tests.support.cli import invoke_here
from tests.support.data import STEP, a_step_of


@pytest.fixture
def env(tmp_path):
    return {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "hf")}


def dry(env, *args):
    return invoke_here("run", "--dry", "--variant=cpu", *args, env=env)


def refused(r, says: str) -> None:
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and says in r.stderr, r.stderr
    assert "docker run" not in r.stderr, "refused before printing a command"


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_a_misspelt_override_is_refused_naming_the_closest(env):
    refused(dry(env, "--", "--max_stepz", "5"), "--max_stepz (did you mean --max_steps?)")
    refused(dry(env, "--", "--eval_fractoin", "0.1"), "did you mean --eval_fraction?")
    refused(dry(env, "--", "--eval_fraction", "2"), "eval_fraction")  # a project setting out of its range
    # a flag of invoke run written after -- : said where it goes
    refused(dry(env, "--", "--max_steps", "5", "--dry"), "--dry (a flag of invoke run: put it before --)")
    assert dry(env, "--", "--max_steps", "5", "--learning_rate", "1e-4").returncode == 0


def test_packing_that_cannot_apply_is_refused_before_the_run(env):
    refused(dry(env, "--", "--packing", "true", "--padding_free", "true"), "packing and padding_free are both true")
    refused(dry(env, "--", "--packing", "true", "--task", "seq_cls"), "not seq_cls")
    assert dry(env, "--", "--packing", "true").returncode == 0


def test_an_evaluation_without_held_out_data_is_refused_as_the_trainer_refuses_it(env):
    """`invoke run --dry -- --eval_strategy steps` was accepted; the run then failed after loading the model."""
    says = "eval_strategy steps needs held-out data: add --eval_fraction 0.05 or --eval_data FILE (or --eval_strategy no)"
    refused(dry(env, "--recipe=ddp", "--", "--eval_strategy", "steps", "--eval_steps", "2"), says)
    assert dry(env, "--", "--eval_strategy", "steps", "--eval_fraction", "0.05").returncode == 0
    assert dry(env, "--", "--eval_strategy", "no").returncode == 0
    # both: the trainer took the file and held nothing out, without a word
    refused(dry(env, "--", "--eval_data", "data/sample.jsonl", "--eval_fraction", "0.1"),
            "eval_data and eval_fraction are both set (0.1): evaluate on the file (--eval_fraction 0) or on a share")


def test_fsdp_without_gpus_is_refused_as_the_trainer_refuses_it(env):
    refused(dry(env, "--recipe=fsdp"), "FSDP, which the HF Trainer runs only on GPUs")
    refused(invoke_here("run", "--dry", "--recipe=fsdp", "--cpu", env=env), "only on GPUs")


def test_inputs_are_checked_against_what_the_trainer_reads(env, tmp_path, model):
    pdf = tmp_path / "notes.pdf"
    pdf.write_bytes(b"%PDF")
    refused(dry(env, f"--data={pdf}"), "unknown data file type .pdf")
    (tmp_path / "empty").mkdir()
    refused(dry(env, f"--data={tmp_path / 'empty'}"), "holds no .jsonl")
    (tmp_path / "empty" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "empty" / "b.csv").write_text("text\nx\n")
    refused(dry(env, f"--data={tmp_path / 'empty'}"), "mixes data files of different kinds (csv, json)")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "/etc/passwd"}}))
    refused(dry(env, f"--model={model}"), "names the weights file '/etc/passwd', which is not a file of the folder")
    (model / "model.safetensors.index.json").unlink()
    (model / "adapter_config.json").write_text("{}")
    refused(dry(env, f"--model={model}"), "holds a LoRA adapter (adapter_config.json) beside the model")
    (model / "config.json").unlink()
    refused(dry(env, f"--model={model}"), "a LoRA adapter (adapter_config.json), not a model")
    (model / "adapter_config.json").unlink()
    refused(dry(env, f"--model={model}"), "no config.json")
    refused(dry(env, "--", "--model", str(model)), "no config.json")  # the same as an override
    # a hub id not in the cache: the command that downloads it
    refused(dry(env, "--model=acme/never-downloaded"), "`hf download acme/never-downloaded`, then copy its")
    refused(dry(env, "--data=acme/chats"), "`hf download --repo-type dataset acme/chats`")


def test_data_of_fewer_examples_than_one_step_is_refused_before_the_image_starts_in_the_trainers_words(
        env, tmp_path, capsys):
    """Two examples for a step of 16 (8 per process, 2 CPU processes) passed `--dry`; the run started the image, read
    the data and the model, and the trainer refused it. The host counts the examples now (as the trainer reads them:
    two JSON objects on a line, a .txt line ended by \r, a .csv cell over lines) and says the trainer's words."""
    from dockyard.train.__main__ import main

    two = tmp_path / "two.jsonl"
    two.write_text('{"text": "ships sail"}\n\n{"text": "at dawn"}\n')
    says = ("error: global_batch 16: the training data holds 2 examples, fewer than one optimizer step takes; set "
            "global_batch (or per_device_train_batch_size × gradient_accumulation_steps × processes) to at most 2, or "
            "give more data")
    refused(dry(env, f"--data={two}"), says)
    refused(dry(env, "--native", "--cpu", f"--data={two}"), says)
    # the trainer (in this process: one process, so the step of two is given)
    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--data", str(two), "--global_batch",
                 "16"]) == 1
    assert says in capsys.readouterr().err, "the trainer's own words"
    assert dry(env, "--nproc=1", f"--data={two}", "--", "--global_batch", "2").returncode == 0
    # counted as `datasets` reads them: each counts 3, which a step of 4 needs more than
    for name, text in (("a.jsonl", '{"text": "a"}\n{"text": "b"}\n \n{"text": "c"}\n'),  # two on a line: refused
                       ("a.txt", "a\rb\r\n\n  \nc"),
                       ("a.csv", 'text\n"a\n\nb"\n,\nc\nd\n')):
        (tmp_path / name).write_text(text, newline="")
        refused(dry(env, f"--data={tmp_path / name}", "--", "--global_batch", "4"), "holds 3 examples, fewer than one")
        assert dry(env, f"--data={tmp_path / name}", "--", "--global_batch", "2").returncode == 0, name
    # a folder's files together; a .json file's array
    folder = tmp_path / "shards"
    folder.mkdir()
    for n in range(3):
        (folder / f"{n}.jsonl").write_text(a_step_of('{"text": "x"}')[:STEP * 14 // 4])  # 16 lines each
    refused(dry(env, f"--data={folder}", "--", "--global_batch", "64"), "holds 48 examples")
    header = tmp_path / "header.csv"
    header.write_text("prompt,completion\n,\n")
    refused(dry(env, f"--data={header}"), f"--data {header}: holds no examples (a header, or blank lines, alone)")
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": "x"}] * 5))
    refused(dry(env, f"--data={array}"), "holds 5 examples")
    # a share held out: at most all but one are trained on
    refused(dry(env, f"--data={two}", "--", "--eval_fraction", "0.5", "--global_batch", "2"),
            "holds 1 example at most (of its 2, eval_fraction 0.5 holds out 1), fewer than one optimizer "
            "step takes; each of the run's 2 processes takes one example a step at least")


def test_an_eval_fraction_just_below_one_is_counted_without_a_traceback(env, tmp_path):
    """eval_fraction 0.9999999999999999 (below 1, which the setting allows) at a step of 2048: the fewest examples
    that leave a step passed 9.2e18, the length bisect takes of a range as a C ssize_t, and `invoke run --dry` ended
    in an OverflowError traceback. The data is counted, and refused in the trainer's words."""
    fifty = tmp_path / "fifty.jsonl"
    fifty.write_text("".join(json.dumps({"text": f"ship {n} sails"}) + "\n" for n in range(50)))
    refused(dry(env, "--nproc=1", f"--data={fifty}", "--", "--eval_fraction", "0.9999999999999999", "--global_batch",
                "2048"), "global_batch 2048: the training data holds 1 example at most (of its 50")


def test_the_share_eval_fraction_holds_out_is_the_one_the_trainer_holds_out(env, tmp_path, capsys):
    """eval_fraction 0.2 of 11 examples holds out 2 (data.split): the host held out one, passed 9 for a step of 10,
    and the trainer refused them once the image had started. The host's verdict is now the trainer's (its data.load
    and step check, run in this process, as its main does) across fractions, counts and steps."""
    from transformers import AutoTokenizer

    from dockyard.common.batch import check_batch_within_data
    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import TINY_MODEL, RunSettings
    from dockyard.train import data
    from dockyard.train.__main__ import main

    eleven = tmp_path / "eleven.jsonl"
    eleven.write_text("".join(json.dumps({"text": f"ship {n} sails"}) + "\n" for n in range(11)))
    says = "global_batch 10: the training data holds 9 examples at most (of its 11, eval_fraction 0.2 holds out 2)"
    refused(dry(env, "--nproc=1", f"--data={eleven}", "--", "--eval_fraction", "0.2", "--global_batch", "10"), says)
    assert main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r"), "--", "--data", str(eleven), "--eval_fraction",
                 "0.2", "--global_batch", "10"]) == 1
    assert "global_batch 10: the training data holds 9 examples, fewer than one" in capsys.readouterr().err
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    verdicts = []
    for count, fraction, step in ((11, 0.2, 9), (10, 0.2, 8), (10, 0.2, 9), (12, 0.25, 9), (12, 0.25, 10),
                                  (20, 0.3, 14), (20, 0.3, 15), (9, 0.5, 4), (9, 0.5, 5), (7, 0.1, 6), (2, 0.5, 1),
                                  (3, 0.9, 2)):
        given = tmp_path / f"{count}.jsonl"
        given.write_text("".join(json.dumps({"text": f"ship {n} sails"}) + "\n" for n in range(count)))
        host = dry(env, "--nproc=1", f"--data={given}", "--", "--eval_fraction", str(fraction), "--global_batch",
                   str(step))
        try:
            loaded = data.load(RunSettings(data=str(given), eval_fraction=fraction), tok, seed=42)
            check_batch_within_data(step, len(loaded.train), False)
            trainer = ""
        except DockyardError as e:
            trainer = str(e)
        verdicts.append(bool(trainer))
        assert (host.returncode != 0) == bool(trainer), (count, fraction, step, host.stderr, trainer)
        if trainer:  # its words, the host's count said as a bound
            held, fix = trainer.split(", fewer than")
            assert held in host.stderr and f"fewer than{fix}" in host.stderr, (host.stderr, trainer)
    assert 0 < sum(verdicts) < len(verdicts), "both verdicts are tried"


def test_the_host_counts_a_step_of_examples_and_no_further(env, tmp_path, settings):
    """The count stops at a step's worth: a data file of 50 GB (sparse here) is not read to its end, by the count
    or by any other check of the host; one whose few first examples run on for megabytes is left to the trainer.
    What the host's checks read is this process's own count of bytes read (/proc/self/io), not a time: a loaded
    machine makes any time, and a sparse file reads fast enough to pass one."""
    from dockyard.common.data_files import examples_in
    from dockyard.launch.preflight import check_data_fields, check_input

    def bytes_read() -> int:
        return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M)[1])

    big = tmp_path / "big.jsonl"
    big.write_text(a_step_of('{"text": "ships sail"}'))
    with big.open("r+b") as f:
        f.truncate(50 << 30)
    few = tmp_path / "few.jsonl"
    few.write_text('{"text": "ships sail"}\n{"text": "' + "x" * 1000)
    with few.open("r+b") as f:
        f.truncate(50 << 30)
    for data, counted in ((big, STEP), (few, None)):  # None: not counted, the trainer's to say
        before = bytes_read()
        files = check_input("data", str(data), "--data", settings)
        check_data_fields(files)
        assert examples_in(files, STEP) == counted
        assert bytes_read() - before < 512 << 20, f"{data.name} was read far past a step's worth"
        assert dry(env, f"--data={data}").returncode == 0


def test_a_blank_file_of_gigabytes_is_read_no_further_than_a_step_of_examples(env, tmp_path):
    """A data file of whitespace alone (a 2 GB .jsonl of newlines and spaces) was read to its end by the host before
    it said "holds no examples". Every read of the host is bounded (COUNT_LIMIT): it says what it found there, and
    leaves the rest to the trainer. Measured as this process's bytes read (/proc/self/io), as the test above. Read
    once: after its warning ("not read further here") the host read the same bytes again, line by line, for a format
    and a count of examples it could not find there (2.5 COUNT_LIMITs, 12 s of this host's CPU per --dry)."""
    from dockyard.common.data_files import COUNT_LIMIT

    def bytes_read() -> int:
        return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M)[1])

    blank = tmp_path / "blank.jsonl"
    with blank.open("wb") as f:
        for _ in range(4 * COUNT_LIMIT >> 20):
            f.write(b" \n" * (1 << 19))
    for name in ("blank.jsonl", "blank.txt"):
        blank = blank.rename(tmp_path / name)
        before = bytes_read()
        r = dry(env, f"--data={blank}")
        assert bytes_read() - before < 1.5 * COUNT_LIMIT, f"{name} was read past its first COUNT_LIMIT, or again"
        assert r.returncode == 0, r.stderr
        assert (f"warning: --data {blank}: whitespace alone (blank lines, spaces) in its first 64 MiB, no example: not "
                "read further here; the trainer reads on and says what it finds") in r.stderr
    small = tmp_path / "small.txt"
    small.write_bytes(b"\xef\xbb\xbf \n\n\t\n")
    refused(dry(env, f"--data={small}"), f"--data {small}: holds no examples (the file is empty)")


def test_a_line_the_host_counts_is_refused_as_the_trainer_refuses_it(env, tmp_path):
    """A line past the first that is not UTF-8 (a Latin-1 é), or a JSON object naming a field twice, passed the host,
    which read it while counting a step of examples, and the trainer refused it once the image had started. The host
    refuses it now in the trainer's words (its data.load, in this process), naming the line and byte as the trainer
    does (a first line after a BOM named the byte 3 before it); a line past a step's worth is still not read. A .csv
    header that is not UTF-8 and a line holding half a surrogate pair (\\ud83d) likewise."""
    from transformers import AutoTokenizer

    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import TINY_MODEL, RunSettings
    from dockyard.train import data

    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    step = a_step_of('{"text": "d"}').encode()  # the rest of a step, after the line
    for name, text, where in (
            ("latin.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": "caf\xe9"}\n' + step, ":3 (byte 0xe9 at column 14)"),
            ("twice.jsonl", b'{"text": "a"}\n\n{"text": "b", "text": "c"}\n' + step, ":3: names the field text twice"),
            ("latin.txt", b"\xef\xbb\xbfa\r\nb\rcaf\xe9\n" + a_step_of("d").encode(), ":2 (byte 0xe9 at column 6)"),
            ("latin.csv", b'text\na\n"b\nc"\ncaf\xe9\n' + a_step_of("d").encode(), ":5 (byte 0xe9 at column 4)"),
            ("latin.json", b'[{"text": "a"},\n {"text": "caf\xe9"}' + b', {"text": "d"}' * STEP + b"]\n",
             ":2 (byte 0xe9 at column 15)"),
            ("bom.jsonl", b'\xef\xbb\xbf{"text": "caf\xff"}\n' + step, ":1 (byte 0xff at column 17)"),  # a BOM's 3 bytes
            # a header saved as Latin-1, or UTF-16 (a spreadsheet's "Unicode text"): "cannot tell the data format from
            # its fields (compl\ufffdtion, prompt); rename them", or of ��t\x00e\x00x\x00t\x00
            ("latin_header.csv", b"prompt,compl\xe9tion\nq,a\n", ":1 (byte 0xe9 at column 13)"),
            # half a surrogate pair: pyarrow's "The surrogate pair in string is invalid. in row 0", no line, no fix
            ("half.jsonl", b'{"text": "a"}\n{"text": "an emoji cut \\ud83d"}\n' + step,
             ":2: a \\ud83d escape, half of a UTF-16 surrogate pair without its other half"),
            ("utf16.csv", "text\na\n".encode("utf-16"), ":1 (byte 0xff at column 1)")):
        given = tmp_path / name
        given.write_bytes(text)
        with pytest.raises(DockyardError) as trainer:
            data.load(RunSettings(data=str(given)), tok, seed=42)
        assert str(trainer.value).startswith(f"cannot read {given}{where}"), trainer.value  # its line, its byte
        refused(dry(env, f"--data={given}"), f"error: {trainer.value}")
        if name not in ("latin.json", "bom.jsonl", "latin_header.csv", "utf16.csv"):  # an array whole, a first line
            assert dry(env, "--nproc=1", f"--data={given}", "--", "--global_batch", "1").returncode == 0, \
                f"{name}: read past the step of one example"


@pytest.mark.parametrize("number", ["1e999", "-2.5E+400", "1.5e" + "9" * 30])
def test_a_number_no_double_holds_is_refused_by_its_line_and_a_fix(env, tmp_path, number):
    """A number past a double's range on a line (a score of 1e999, a float printed by a tool that writes Infinity so):
    Python's json reads it as infinity and passed it, and the trainer stopped on pyarrow's "JSON parse error: Number
    too big to be stored in double. in row 1", of no line (its row counts from 0) and no fix. The trainer and the
    host now name the line and the number, and say how to write it."""
    from transformers import AutoTokenizer

    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import TINY_MODEL, RunSettings
    from dockyard.train import data

    given = tmp_path / "scores.jsonl"
    given.write_text('{"text": "a", "score": 1}\n{"text": "b", "score": ' + number + "}\n"
                     + a_step_of('{"text": "d", "score": 2}'))
    with pytest.raises(DockyardError) as trainer:
        data.load(RunSettings(data=str(given)), AutoTokenizer.from_pretrained(TINY_MODEL), seed=42)
    said = f"cannot read {given}:2: the number {number[:20]}"
    assert str(trainer.value).startswith(said) and "quote it" in str(trainer.value), trainer.value
    refused(dry(env, f"--data={given}"), f"error: {trainer.value}")
    given.write_text(a_step_of('{"text": "d", "score": 2e308}', '{"text": "e", "score": ' + "1" * 400 + ".0}"))
    data.load(RunSettings(data=str(given)), AutoTokenizer.from_pretrained(TINY_MODEL), seed=42)  # read, as before
    assert dry(env, f"--data={given}").returncode == 0, "pyarrow reads these as infinity: so does the host"


@pytest.mark.parametrize("rows, line, word", [
    (['{"text": NaN}'], 1, "NaN"),
    (['{"prompt": "q", "completion": "a"}', '{"prompt": "q", "completion": "b"}',
      '{"prompt": "q", "completion": Infinity}'], 3, "Infinity"),
    (['{"text": "a", "score": 1}', '{"text": "b", "score": -Infinity}'], 2, "-Infinity"),
])
def test_nan_or_infinity_on_a_line_is_refused_by_its_line_as_no_json_number(env, tmp_path, rows, line, word):
    """`{"text": NaN}` (Python's json.dumps writes a float nan so) passed the host, and the trainer, once the image had
    started, said "example 1 has no field with a value (... every field null)", or of `"completion": Infinity` that
    example 3 "lacks completion": `datasets` reads such a field as null. JSON allows no such number: the trainer and
    the host both name the line and the word, and say what to write; "NaN" within a string is text, read as before."""
    from transformers import AutoTokenizer

    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import TINY_MODEL, RunSettings
    from dockyard.train import data

    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    given = tmp_path / "scores.jsonl"
    fine = rows[0].replace("NaN", '"NaN"') if word == "NaN" else rows[0]
    given.write_text("\n".join(rows) + "\n" + a_step_of(fine))
    with pytest.raises(DockyardError) as trainer:
        data.load(RunSettings(data=str(given)), tok, seed=42)
    said = f"cannot read {given}:{line}: {word} is a number JSON does not allow"
    assert str(trainer.value).startswith(said) and "write null" in str(trainer.value), trainer.value
    refused(dry(env, f"--data={given}"), f"error: {trainer.value}")
    given.write_text(a_step_of(fine.replace("Infinity", '"Infinity"').replace("-\"", '"-')))
    data.load(RunSettings(data=str(given)), tok, seed=42)  # quoted: text, read as before
    assert dry(env, f"--data={given}").returncode == 0


@pytest.mark.parametrize("rows, line, column", [
    (['{"text": "a"} {"text": "b"}'], 1, 15),
    (['{"text": "a"}', '{"text": "b"}{"text": "c"}'], 2, 14),
])
def test_two_json_objects_on_one_line_are_refused_by_host_and_trainer_alike(env, tmp_path, rows, line, column):
    """`{"text": "a"} {"text": "b"}` (two files joined, the first's last line unended): on line 1 the host and the
    trainer refused it as "not JSON (Extra data: column 15)"; on any later line both took it, `datasets` as two rows,
    where the host's checks of a line's example (format, roles, fields) read none of them. Both now refuse it wherever
    it is, naming the line and saying to put a line break between them; braces side by side in a string are text."""
    from transformers import AutoTokenizer

    from dockyard.common.errors import DockyardError
    from dockyard.common.run_settings import TINY_MODEL, RunSettings
    from dockyard.train import data

    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    given = tmp_path / "joined.jsonl"
    given.write_text("\n".join(rows) + "\n" + a_step_of('{"text": "d"}'))
    with pytest.raises(DockyardError) as trainer:
        data.load(RunSettings(data=str(given)), tok, seed=42)
    said = (f"cannot read {given}:{line}: two JSON objects on one line (the second from column {column}); each line "
            "must be one JSON object: put a line break between them")
    assert str(trainer.value) == said, trainer.value
    refused(dry(env, f"--data={given}"), f"error: {said}")
    given.write_text(a_step_of('{"text": "a} {b"}'))  # in a string: one example, read as before
    assert len(data.load(RunSettings(data=str(given)), tok, seed=42).train) == STEP
    assert dry(env, f"--data={given}").returncode == 0


def test_a_file_of_blank_lines_ending_in_cr_alone_is_counted_in_little_memory(tmp_path):
    """The count kept every part of a line read at \\r until a \\n ended it, to name a byte that is not UTF-8 at its
    column: a .txt of blank lines ending in \\r alone (old Mac line ends) piled them up, 2 GB held by `invoke run
    --dry` for 60 MB read. It keeps their length alone, and names the same column."""
    import tracemalloc

    from dockyard.common.data_files import examples_in
    from dockyard.common.errors import DockyardError

    blank = tmp_path / "blank_cr.txt"
    blank.write_bytes(b"ships sail\r" + b" \r" * (1 << 20))
    tracemalloc.start()
    try:
        assert examples_in([blank], STEP) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak >> 20} MiB held to count {blank.stat().st_size >> 20} MiB"
    latin = tmp_path / "latin_cr.txt"
    latin.write_bytes(b"a\r" + b" \r" * 1000 + b"caf\xe9\n")  # one line as the trainer counts lines (at \\n)
    with pytest.raises(DockyardError, match=re.escape(f"{latin}:1 (byte 0xe9 at column {2 + 2000 + 4})")):
        examples_in([latin], STEP)


def test_a_json_file_is_read_once_by_the_host(env, tmp_path):
    """`--dry` read a .json file of one array three times over (for its elements, its first example and its count of
    examples): 48 MB of a file of 16 MB. Read once now, measured as this process's bytes read (/proc/self/io)."""
    from dockyard.common.data_files import FIRST_LINE_LIMIT

    def bytes_read() -> int:
        return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M)[1])

    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": f"ship {n} sails " + "x" * 400} for n in range(FIRST_LINE_LIMIT // 480)]))
    before = bytes_read()
    assert dry(env, f"--data={array}").returncode == 0
    assert bytes_read() - before < 1.5 * array.stat().st_size, "read more than once"


def test_a_json_lines_file_is_read_by_the_host_no_further_than_its_checks_need(env, tmp_path):
    """`--dry` read every .jsonl file whole up to 16 MiB to learn it was not one JSON array (not_examples), then its
    first line again for the format, and, in a folder of several, the first file's first example once more for the
    folder's formats: 16.5 MB read for a 15 MB file of which a step's worth of lines is counted. A JSON Lines file is
    read whole only where it opens with `[`, and the first example once for its format (the count reads it too)."""
    from dockyard.common.data_files import FIRST_LINE_LIMIT

    def bytes_read(*args: str) -> int:
        def rchar() -> int:
            return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M)[1])

        before = rchar()
        assert dry(env, *args).returncode == 0
        return rchar() - before

    bytes_read()  # what any --dry reads (this process's first imports among them)
    lines = tmp_path / "lines.jsonl"
    lines.write_text("".join(json.dumps({"text": f"ship {n} sails " + "x" * 400}) + "\n"
                             for n in range(FIRST_LINE_LIMIT // 480)))
    assert bytes_read(f"--data={lines}") < lines.stat().st_size / 4, "a JSON Lines file read whole"
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"text": "long " * (FIRST_LINE_LIMIT // 7)}) + "\n"
                                    + '{"text": "short"}\n' * 40)
    (folder / "b.jsonl").write_text('{"text": "short"}\n' * 40)
    first = (folder / "a.jsonl").stat().st_size
    assert bytes_read(f"--data={folder}") < 2.5 * first, "its first example read more than once for its format"


def test_the_examples_of_one_step_are_counted_only_where_the_host_can_know_them(tmp_path):
    """Documents the trainer may pack into blocks of tokens (packing true, or auto on GPUs for text) are as many
    examples as their tokens make, which the host does not know: not counted there."""
    from dockyard.common.batch import batch_split
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings
    from dockyard.launch.preflight import check_enough_examples

    two = tmp_path / "two.jsonl"
    two.write_text('{"text": "a"}\n{"text": "b"}\n')
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": []}\n')
    recipe = load_recipe("ddp")
    batch = batch_split("auto", "auto", "auto", 2)

    def check(files, fmt, gpus, **given):
        check_enough_examples("--data X", files, resolve_settings(recipe, given)[0], batch, fmt, gpus)

    check([two], "text", gpus=True)  # packing auto on GPUs: joined into blocks
    check([two], "", gpus=True)
    check([two], "text", gpus=False, packing=True)
    for files, fmt, gpus, given in (([two], "text", False, {}), ([chat], "messages", True, {}),
                                    ([two], "text", True, {"packing": False}),
                                    ([two], "text", True, {"padding_free": True})):
        with pytest.raises(DockyardError, match="global_batch 16: the training data holds"):
            check(files, fmt, gpus, **given)


@pytest.mark.parametrize("array, said", [
    (["train-1.jsonl", "train-2.jsonl"], 'element 1 of its JSON array is a string ("train-1.jsonl"), not an example'),
    ([17, 42], "element 1 of its JSON array is a number (17), not an example"),
    ([None, {"text": "ships sail"}], "element 1 of its JSON array is null, not an example"),
    ([{"text": "ships sail"}, "at dawn"], 'element 2 of its JSON array is a string ("at dawn"), not an example'),
    ([], "an empty JSON array, which holds no examples"),
])
def test_a_json_array_of_other_things_than_examples_is_refused_by_the_host_and_the_trainer(env, tmp_path, array, said):
    """`datasets` read a .json file of ["a", "b"] as rows of a field `text` the file never names: a list of file names
    (or ids) passed `--dry` and was trained on as documents. [17, 42] was refused in the container as "example 1's text
    is int"; [null, {...}] crashed the trainer (SIGSEGV, no word of the file); [] was 'Instruction "train" corresponds
    to no data!'. Each is said now, by the host (whatever the task) and the trainer, with what an example is."""
    from dockyard.common.errors import DockyardError

    f = tmp_path / "data.json"
    f.write_text(json.dumps(array * (STEP if array and isinstance(array[0], str) else 1)))
    refused(dry(env, f"--data={f}"), f"error: cannot read {f}: {said}")
    refused(dry(env, f"--data={f}", "--", "--task", "seq_cls"), said)
    with pytest.raises(DockyardError, match=re.escape(f"cannot read {f}: {said}")):
        read.read_rows(f)
    if array:
        assert 'each example is an object whose fields name its format, e.g. {"text": "..."}' in dry(
            env, f"--data={f}").stderr
    f.write_text(json.dumps([{"text": "ships sail"}] * STEP))
    assert dry(env, f"--data={f}").returncode == 0
    if array:  # one array in a .jsonl file: `datasets` reads it so too (its first line was checked for causal_lm only)
        lines = tmp_path / "data.jsonl"
        lines.write_text(json.dumps(array) + "\n")
        if not isinstance(array[0], dict):
            refused(dry(env, f"--data={lines}", "--", "--task", "seq_cls"), f"cannot read {lines}:1: an array, not "
                    "an object; each line must be one JSON object")
            with pytest.raises(DockyardError, match="an array, not an object"):
                read.read_rows(lines)


def test_a_json_line_that_names_a_field_twice_is_said_by_its_line(env, tmp_path):
    """Red-team pass: `{"text": "a", "text": "b"}` passed `--dry` (Python's json keeps the last) and the trainer said
    pyarrow's "JSON parse error: Column(/text) was specified twice in row 0"; on a later line, "in row 1" for line 2.
    A file of one chat line whose turn named `content` twice was read as two rows of a turn each, unsaid. Said now by
    its line, on the host (the first) and in the trainer."""
    from dockyard.common.errors import DockyardError

    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"text": "a", "text": "b"}\n' + a_step_of('{"text": "c"}'))
    said = f"cannot read {twice}:1: names the field text twice in one object: name each field once"
    refused(dry(env, f"--data={twice}"), said)
    with pytest.raises(DockyardError, match=re.escape(said)):
        read.read_rows(twice)
    twice.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d", "completion": "e"}\n')
    with pytest.raises(DockyardError, match=re.escape(f"{twice}:2: names the field completion twice in one object")):
        read.read_rows(twice)
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "a", "content": "b"}, '
                    '{"role": "assistant", "content": "c"}]}\n')
    refused(dry(env, f"--data={chat}"), f"{chat}:1: names the field content twice in one object")
    with pytest.raises(DockyardError, match=re.escape(f"{chat}:1: names the field content twice in one object")):
        read.read_rows(chat)


def test_an_empty_data_file_is_refused_before_the_engine_is_asked(env, tmp_path):
    """`--data=empty.jsonl` (a file saved before it was written) was accepted by `--dry` and by `invoke run`, which
    started the container and loaded the model before the trainer said the file held no examples."""
    from dockyard.common.errors import DockyardError

    empty = tmp_path / "chat.jsonl"
    empty.write_text("\n  \n")
    refused(dry(env, f"--data={empty}"), f"--data {empty}: holds no examples (the file is empty)")
    # a byte order mark alone (an editor's empty file saved as UTF-8 with one): the trainer said 'Instruction "train"
    # corresponds to no data!'
    empty.write_bytes(b"\xef\xbb\xbf\n")
    refused(dry(env, f"--data={empty}"), f"--data {empty}: holds no examples (the file is empty)")
    with pytest.raises(DockyardError, match=re.escape(f"{empty} holds no examples (the file is empty)")):
        read.read_rows(empty)
    empty.write_text("\n  \n")
    refused(dry(env, "--", "--eval_data", str(empty), "--eval_steps", "2"), "holds no examples")
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.jsonl").write_text("")
    refused(dry(env, f"--data={folder}"), "holds no examples (its files are empty)")
    (folder / "b.jsonl").write_text(a_step_of('{"text": "x"}'))
    assert dry(env, f"--data={folder}").returncode == 0
    empty.write_text(a_step_of('{"text": "x"}'))
    assert dry(env, f"--data={empty}").returncode == 0


def test_a_data_file_that_cannot_be_read_or_is_no_file_is_refused_in_one_line(env, tmp_path):
    """A data file the host could not read was an OSError traceback from the first-example check; a pipe named as
    --data was taken, and the run would have waited on it. (CI runs as root, whom chmod 000 does not stop: a file
    whose read fails for anyone, /proc/self/mem, stands in for one this user may not read.)"""
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.jsonl").symlink_to("/proc/self/mem")
    refused(dry(env, f"--data={folder}"), f"cannot read the data file {folder / 'a.jsonl'}: Input/output error")
    os.mkfifo(tmp_path / "pipe.jsonl")
    refused(dry(env, f"--data={tmp_path / 'pipe.jsonl'}"), "neither a file nor a folder (a device, pipe or socket)")


def test_native_without_the_training_stack_says_how_to_get_it(env, tmp_path, monkeypatch):
    """`invoke run --native` from the README's host venv (`pip install -e .`, no torch) started torchrun, which died
    with "No module named 'torch'", then said "the run did not start (exit 1; docker's message is above)"."""
    monkeypatch.setitem(sys.modules, "torch", None)  # what importlib finds where torch is not installed
    r = dry(env, "--native", "--recipe=ddp", "--", "--max_steps", "2")
    refused(r, "--native trains with this host's Python")
    assert "lacks torch: install the training stack (`pip install -e '.[train]'`), or leave out --native" in r.stderr
    assert not (tmp_path / "runs").exists()
    monkeypatch.delitem(sys.modules, "torch")
    assert dry(env, "--native", "--recipe=ddp").returncode == 0


def test_a_relative_path_that_is_not_there_is_refused_not_taken_for_a_hub_id(env, tmp_path, monkeypatch):
    # models/x has a hub id's form: the error says both what it is not as a folder and as a hub id (it said only
    # "no such file or folder", then how to download models/x from the hub). Run from a folder that holds none of
    # these paths, not wherever pytest was started (a checkout with its own models/x there).
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    r = dry(env, "--model=models/x")
    refused(r, f"--model models/x: neither a folder on this host (if you meant one: no such folder ./models/x in "
               f"{tmp_path / 'here'}) nor a hub id in the Hugging Face cache ")
    assert "`hf download models/x`" in r.stderr
    refused(dry(env, "--data=mydata/x"), "--data mydata/x: neither a file or folder on this host (if you meant one: "
                                         "no such file or folder ./mydata/x in ")
    refused(dry(env, "--data=mydata"), "--data mydata: no such file or folder")
    refused(dry(env, "--data=notes.pdf"), "no such file or folder")


def test_a_hub_id_in_the_cache_is_taken_as_a_flag_and_as_the_setting(env, tmp_path):
    refused(dry(env, "--data=org/name"), "nor a hub id in the Hugging Face cache")
    (tmp_path / "hf" / "hub" / "datasets--org--name").mkdir(parents=True)
    for r in (dry(env, "--data=org/name"), dry({**env, "INVOKE_DOCKYARD_DATA": "org/name"})):
        assert r.returncode == 0, r.stderr
        assert shlex.split(r.stderr.splitlines()[-1])[-2:] == ["--data", "org/name"], "passed on as it is, not mounted"


def test_resume_needs_the_run_id(env):
    refused(dry(env, "--resume"), "--resume needs --run-id")
    runs = Path(env["INVOKE_DOCKYARD_RUNS_DIR"])
    for i, name in enumerate(("old", "newer", "newest")):  # and offers the runs there are, newest first
        _finished_run(runs, name, "ddp")
        os.utime(runs / name, (1e9 + i, 1e9 + i))
    refused(dry(env, "--resume"), f"--resume needs --run-id: the run folder to continue (the newest in {runs}: "
                                  "newest, newer, old; `invoke runs` lists them all)")
    # a run id that names no folder (mistyped) offers them too, and the one meant
    refused(dry(env, "--resume", "--run-id=nwest"), f"--resume: no run folder {runs / 'nwest'} to resume (did you mean "
                                                   f"newest? the newest in {runs}: newest, newer, old; `invoke runs` "
                                                   "lists them all)")


def test_a_runs_folder_every_user_may_write_and_rename_in_is_said(env):
    """A shared runs folder made with chmod 777 (no sticky bit): any user may rename a run folder of another's and
    put theirs in its place, the checkpoints a resume loads included. Nothing said so. Said now, with the fix
    (chmod +t, as /tmp is); not refused (a cluster's volume every pod's uid writes is often so), and not said once
    the folder is sticky or only its owner writes it."""
    runs = Path(env["INVOKE_DOCKYARD_RUNS_DIR"])
    runs.mkdir()
    said = "can be written by every user and is not sticky (mode drwxrwxrwx)"
    for mode, warned in ((0o777, True), (0o1777, False), (0o755, False)):
        os.chmod(runs, mode)
        r = dry(env)
        assert r.returncode == 0, r.stderr
        assert (said in r.stderr and f"`chmod +t {runs}`" in r.stderr) == warned, (oct(mode), r.stderr)


def test_a_folder_above_the_runs_folder_every_user_may_write_and_rename_in_is_said(env):
    """INVOKE_DOCKYARD_RUNS_DIR=/shared/team/runs under a /shared/team made with chmod 777 (the runs folder invoke run
    made there is 755): the warning looked at the runs folder alone and said nothing, while any user could rename the
    runs folder away and put one of theirs, with the run folders and checkpoints a resume loads, in its place."""
    shared = Path(env["INVOKE_DOCKYARD_RUNS_DIR"]) / "team"
    runs = shared / "runs"
    runs.mkdir(parents=True)
    os.chmod(runs, 0o755)
    for mode, warned in ((0o777, True), (0o1777, False), (0o755, False)):
        os.chmod(shared, mode)
        r = dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(runs)})
        assert r.returncode == 0, r.stderr
        assert (f"the folder {shared}, on the way to the runs folder {runs}, can be written by every user and is not "
                f"sticky (mode drwxrwxrwx)" in r.stderr and f"`chmod +t {shared}`" in r.stderr) == warned, (oct(mode),
                                                                                                       r.stderr)


def test_a_folder_every_user_may_write_reached_through_a_link_on_the_way_to_the_runs_folder_is_said(env):
    """INVOKE_DOCKYARD_RUNS_DIR=~/proj/runs where ~/proj is a link to /shared/proj (a scratch volume linked into the
    home folder), /shared made with chmod 777: the folders looked at were those of the path as written (~/proj, ~,
    /), and nothing was said, while any user could rename /shared/proj away and put theirs, run folders and
    checkpoints included, in its place."""
    top = Path(env["INVOKE_DOCKYARD_RUNS_DIR"])
    shared, home = top / "shared", top / "home"
    (shared / "proj" / "runs").mkdir(parents=True)
    home.mkdir()
    (home / "proj").symlink_to(shared / "proj")
    for mode, warned in ((0o777, True), (0o1777, False), (0o755, False)):
        os.chmod(shared, mode)
        r = dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(home / "proj" / "runs")})
        assert r.returncode == 0, r.stderr
        assert (f"the folder {shared}, on the way to the runs folder {home / 'proj' / 'runs'} (through a link: "
                f"{shared / 'proj' / 'runs'}), can be written by every user" in r.stderr) == warned, (oct(mode), r.stderr)


def test_a_runs_folder_on_a_loop_of_links_is_one_line_not_a_traceback(env):
    """INVOKE_DOCKYARD_RUNS_DIR through a loop of links (~/proj -> ~/scratch -> ~/proj, a link made twice): the
    warning about folders on the way, which follows the links since 0ebe7d3, ended in pathlib's RuntimeError
    'Symlink loop from ...' under a traceback; the run is refused in one line, nothing made, as before that."""
    top = Path(env["INVOKE_DOCKYARD_RUNS_DIR"])
    top.mkdir()
    (top / "proj").symlink_to(top / "scratch")
    (top / "scratch").symlink_to(top / "proj")
    r = dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(top / "proj" / "runs")})
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot make the folder {top / 'proj' / 'runs'}: {top / 'proj'} is a link that leads to no folder (to "
        "nothing, or round a loop of links); set the runs_dir"), r.stderr
    assert sorted(p.name for p in top.iterdir()) == ["proj", "scratch"]


def _finished_run(runs, run_id, recipe, native=False):
    """A run folder as a completed run leaves it: its manifest.json (the keys the trainer writes) and a checkpoint;
    trained in the cpu image, or on this host (`native`)."""
    folder = runs / run_id
    (folder / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    manifest = {"run_id": run_id, "recipe": recipe, "variant": "native" if native else "cpu", "status": "completed",
                "world_size": 1, "nodes": 1, "node_rank": 0, "rendezvous": None,
                "strategy": {"requested": "ddp", "in_effect": {"engine": "ddp", "zero_stage": None}, "peft": None},
                "metrics": {"steps": 2, "loss_first": 6.2, "loss_last": 6.2},
                "recipe_files": {f"{recipe}/recipe.yaml": "c3" * 32}}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def _trainer_recipe(r) -> str:
    argv = shlex.split(r.stderr.strip().splitlines()[-1][2:])
    return argv[argv.index("--recipe", argv.index("dockyard.train")) + 1]


@pytest.mark.parametrize("native", [[], ["--native"]])
def test_resume_continues_with_the_runs_own_recipe_and_refuses_another(env, tmp_path, native):
    """Once `--resume` without --recipe took zero2 for a ddp run: DeepSpeed failed on the ddp checkpoint and the
    failure overwrote the finished run's manifest."""
    runs = tmp_path / "runs"
    folder = _finished_run(runs, "n1", "ddp", bool(native))
    before = (folder / "manifest.json").read_text()
    r = dry(env, *native, "--resume", "--run-id=n1", "--", "--max_steps", "3")
    assert r.returncode == 0, r.stderr
    assert _trainer_recipe(r) == "ddp"
    for same in ("--recipe=ddp", f"--recipe={ROOT / 'recipes' / 'ddp'}"):  # a name, or the folder the name is
        r = dry(env, *native, "--resume", "--run-id=n1", same)
        assert r.returncode == 0, r.stderr
    refused(dry(env, *native, "--resume", "--run-id=n1", "--recipe=zero2"),
            "--recipe zero2: run n1 was started with recipe ddp")
    assert (folder / "manifest.json").read_text() == before

    mine = tmp_path / "mine"  # a recipe folder of the user's: the manifest has its name alone
    mine.mkdir()
    (mine / "recipe.yaml").write_text((ROOT / "recipes" / "ddp" / "recipe.yaml").read_text())
    _finished_run(runs, "n2", "mine", bool(native))
    refused(dry(env, *native, "--resume", "--run-id=n2"), "a folder of your own: give that folder again, --recipe=FOLDER")
    r = dry(env, *native, "--resume", "--run-id=n2", f"--recipe={mine}")
    assert r.returncode == 0, r.stderr
    refused(dry(env, *native, "--resume", "--run-id=n2", "--recipe=ddp"), "was started with recipe mine")

    (runs / "n3" / "checkpoints").mkdir(parents=True)  # stopped before writing its manifest
    refused(dry(env, *native, "--resume", "--run-id=n3"), "no manifest naming its recipe")
    r = dry(env, *native, "--resume", "--run-id=n3", "--recipe=ddp")
    assert r.returncode == 0 and _trainer_recipe(r) == "ddp", r.stderr
    r = dry(env, *native, "--run-id=n4")
    assert r.returncode == 0 and _trainer_recipe(r) == "zero2", "a new run's default is unchanged"


@pytest.mark.parametrize("native", [[], ["--native"]])
def test_a_resume_is_checked_with_the_runs_own_settings_under_those_given_now(env, tmp_path, native):
    """A run continues with its own settings (overrides.json) and those given now on top. `--dry --resume` checked
    the new ones alone, so a micro-batch that does not divide the run's own global batch passed the dry run, and the
    trainer refused it once the container had started."""
    folder = _finished_run(tmp_path / "runs", "n1", "ddp", bool(native))
    (folder / "overrides.json").write_text(json.dumps({"global_batch": 64, "max_steps": 3}))
    refused(dry(env, *native, "--resume", "--run-id=n1", "--", "--per_device_train_batch_size", "3"),
            "per_device_train_batch_size 3 does not divide")
    r = dry(env, *native, "--resume", "--run-id=n1", "--", "--per_device_train_batch_size", "3", "--global_batch", "48")
    assert r.returncode == 0, r.stderr
    r = dry(env, *native, "--resume", "--run-id=n1", "--", "--per_device_train_batch_size", "4")
    assert r.returncode == 0, r.stderr
    (folder / "overrides.json").write_text(json.dumps({"global_batch": 63}))  # the run's own alone is wrong: said so
    refused(dry(env, *native, "--resume", "--run-id=n1"), "the run's own settings, from its overrides.json: "
            "--global_batch 63; give one again after -- to change it")
    (folder / "overrides.json").write_text("{not json")  # the trainer refuses it: so does the dry run, by name
    refused(dry(env, *native, "--resume", "--run-id=n1"), "overrides.json is not the list of settings the trainer")


def test_a_resume_whose_overrides_file_is_gone_continues_with_the_settings_its_manifest_records(env, tmp_path):
    """overrides.json removed (or lost with a copy of the folder): --resume trained on with the defaults, and then
    wrote {} over the manifest's record of the run's own settings. The manifest holds them too: they are taken."""
    folder = _finished_run(tmp_path / "runs", "n1", "ddp")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "overrides": {"global_batch": 64}}))
    refused(dry(env, "--resume", "--run-id=n1", "--", "--per_device_train_batch_size", "3"),
            "per_device_train_batch_size 3 does not divide")
    assert dry(env, "--resume", "--run-id=n1", "--", "--per_device_train_batch_size", "4").returncode == 0
    (folder / "manifest.json").write_text(json.dumps({**manifest, "overrides": ["global_batch"]}))
    refused(dry(env, "--resume", "--run-id=n1"), "overrides.json is gone and the settings")


def test_dry_prints_the_command_the_run_starts(env, model):
    """The memlock the engine grants and the image id: what `docker run` really gets, not a placeholder."""
    r = dry(env, f"--model={model}", "--run-id=r1", "--", "--max_steps", "3")
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stderr.strip().splitlines()[-1][2:])
    from dockyard import engine

    hard = engine.daemon_memlock_hard_limit()
    assert f"memlock={hard if hard is not None else -1}" in argv
    image_id = next(a for a in argv if a.startswith("DOCKYARD_IMAGE_ID="))
    assert image_id != "DOCKYARD_IMAGE_ID=" or "not built" in r.stderr, "an empty id is said, not left silent"
    assert argv[argv.index("--", argv.index("dockyard.train")) + 1:] == ["--max_steps", "3", "--model",
                                                                         "/workspace/inputs/model"]


@pytest.mark.parametrize("native", [[], ["--native"]])
@pytest.mark.parametrize("override,says", [
    (["--max_steps", "nan"], "max_steps nan: TrainingArguments.max_steps takes a whole number"),
    (["--max_steps", "inf"], "max_steps inf: TrainingArguments.max_steps takes a whole number"),
    (["--max_steps", "1e400"], "max_steps inf: "),
    (["--max_steps", "2.5"], "max_steps 2.5: TrainingArguments.max_steps takes a whole number"),
    (["--learning_rate", "words"], "learning_rate 'words': TrainingArguments.learning_rate takes a finite number"),
    (["--learning_rate", "inf"], "takes a finite number"),
    (["--learning_rate", "nan"], "takes a finite number"),
    (["--save_total_limit", "all"], "save_total_limit 'all': TrainingArguments.save_total_limit takes a whole number, "
                                    "or null"),
    (["--per_device_train_batch_size", "nan"], "takes a whole number, or auto"),
    # a whole number past the field, or past YAML's 4,300 digits (read as text), was 'takes a whole number' after 12
    # of its digits in quotes; a float's, 'takes a finite number'
    (["--max_steps", "9" * 5000], "max_steps a number of 5,000 digits: TrainingArguments.max_steps takes a whole "
                                  "number of at most 19 digits (up to 9,223,372,036,854,775,807)"),
    (["--max_steps", "9" * 20], "max_steps 99999999999999999999: TrainingArguments.max_steps takes a whole number "
                                "of at most 19 digits"),
    (["--seed", "-" + "9" * 400], "seed a number of 400 digits: TrainingArguments.seed takes a number from 0 to "
                                  "4294967295"),
    (["--weight_decay", "9" * 5000], "weight_decay a number of 5,000 digits: TrainingArguments.weight_decay takes a "
                                     "finite number (a float ends near 1.8e308)"),
    (["--learning_rate", "9" * 5000], "learning_rate a number of 5,000 digits: TrainingArguments.learning_rate takes a "
                                      "number from 0 to 100"),
    # a flag with no value read as a switch was "max_steps True: ... takes a whole number"
    (["--max_steps"], "--max_steps was given no value: put a whole number after it (--max_steps N; true and yes "
                      "are not numbers)"),
    (["--max_steps", "yes"], "--max_steps was given no value: put a whole number after it (--max_steps N; true and "
                             "yes are not numbers)"),
    (["--learning_rate", "--max_steps", "5"], "--learning_rate was given no value: put a number after it"),
    # in range: torch's "Invalid learning rate: -1" was two tracebacks from inside the container; max_steps 0 trained
    # by epochs, -3 too; bf16 "maybe" was taken as it was, and nothing said what it became
    (["--learning_rate", "-1"], "learning_rate -1: TrainingArguments.learning_rate takes a number from 0 to 100"),
    (["--max_steps", "0"], "max_steps 0: give the number of optimizer steps, 1 or more (or -1 to train for "),
    (["--max_steps", "-3"], "max_steps -3: give the number of optimizer steps"),
    (["--adam_beta2", "1"], "adam_beta2 1: TrainingArguments.adam_beta2 takes a number from 0 up to (not including) 1"),
    (["--per_device_eval_batch_size", "0"], "per_device_eval_batch_size 0: TrainingArguments."
                                            "per_device_eval_batch_size takes a number from 1 to 65536"),
    (["--seed", "-1"], "seed -1: TrainingArguments.seed takes a number from 0 to 4294967295"),
    (["--bf16", "maybe"], "bf16 'maybe': TrainingArguments.bf16 is a switch: give true or false"),
    (["--tf32", "2"], "tf32 2: TrainingArguments.tf32 is a switch: give true or false"),
    # TrainingArguments' "--save_steps must be an integer if bigger than 1", once the container had started
    (["--save_steps", "1.5"], "save_steps 1.5: a number of steps above 1 is a whole one (1 or 2)"),
    (["--logging_steps", "2.5"], "logging_steps 2.5: a number of steps above 1 is a whole one"),
])
def test_a_training_argument_number_that_is_not_one_is_refused_on_the_host(env, native, override, says):
    """Once a traceback from the disk estimate (int(nan)), and for the others a failure inside the container."""
    refused(dry(env, *native, "--", *override), says)


def test_training_argument_numbers_that_are_numbers_are_taken(env):
    r = dry(env, "--native", "--", "--max_steps", "7", "--learning_rate", "1", "--save_total_limit", "null",
            "--per_device_train_batch_size", "auto", "--save_steps", "0.5", "--warmup_steps", "1e-1", "--bf16", "false",
            "--learning_rate", "0", "--adam_beta1", "0", "--torch_compile", "auto", "--tf32", "null")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("override,says", [
    (["--lora_r", "-3"], "--lora_r -3: takes a whole number from 1 to 65536"),
    (["--lora_alpha", "0"], "--lora_alpha 0: takes a whole number from 1 to 65536"),
    (["--max_seq_length", "-1"], "--max_seq_length -1: takes a whole number from 1 to 16777216"),
    (["--global_batch", "0"], "--global_batch 0: takes a whole number from 1 to 1000000000000, or auto"),
    (["--global_batch", "-4"], "--global_batch -4: takes a whole number from 1 to 1000000000000, or auto"),
    (["--lora_dropout", "5"], "--lora_dropout 5: takes a number from 0 up to (not including) 1"),
    (["--lora_dropout", "nan"], "--lora_dropout nan: takes a number from 0 up to (not including) 1"),
    (["--eval_fraction", "inf"], "--eval_fraction inf: takes a number from 0 up to (not including) 1"),
    (["--lora_dropout", "true"], "--lora_dropout True: takes a number from 0"),
    (["--padding_free", "maybe"], "--padding_free 'maybe': takes true, false or auto"),  # once pydantic's union of errors
    (["--packing", "2"], "--packing 2: takes true, false or auto"),
])
def test_a_run_setting_out_of_its_range_is_refused_saying_what_it_takes(env, override, says):
    lora = ["--recipe=lora"] if override[0].startswith("--lora") else []  # the recipes with adapters read those
    refused(dry(env, "--native", *lora, "--", *override), f"invalid setting: {says}")


@pytest.mark.parametrize("native", [[], ["--native"]])
@pytest.mark.parametrize("override,says", [
    (["--gradient_checkpointing", "sometimes"], "gradient_checkpointing (or activation_checkpointing) must be true, "
                                                "false or auto (got 'sometimes')"),
    (["--torch_compile", "7"], "torch_compile must be true, false or auto"),
    # a switch given thousands of characters said them all: "(got '7777...<5,000 of them>')"
    (["--use_liger_kernel", "7" * 5000], "use_liger_kernel must be true, false or auto (got a number of 5,000 digits)"),
    (["--gradient_checkpointing", "x" * 5000], "gradient_checkpointing (or activation_checkpointing) must be true, "
                                               f"false or auto (got '{'x' * 56}...)"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be a whole number of examples, 1 or "
                                             "more, or auto (got 0)"),
    (["--global_batch", "16", "--per_device_train_batch_size", "3"], "per_device_train_batch_size 3 does not divide "
                                                                     "the 8 examples each of the 2 process(es)"),
    (["--global_batch", "4", "--gradient_accumulation_steps", "8"], "gradient_accumulation_steps 8 does not divide"),
    (["--global_batch", "3"], "global_batch 3 cannot be split evenly over 2 processes"),
    (["--per_device_train_batch_size", "1000000000000", "--gradient_accumulation_steps", "1000000000000"],
     "is 2e+24 examples per step, more than 1e+12: lower them"),  # global_batch set alone is bounded so
    (["--use_liger_kernel", "true", "--torch_compile", "true"], "use_liger_kernel and torch_compile do not work "
                                                                "together"),
])
def test_auto_settings_the_trainer_would_refuse_are_refused_on_the_host(env, native, override, says):
    """Once these passed `invoke run` and failed inside the container, after the run folder was made. On CPU a run
    has two processes (--nproc, default 2): the batch splits over them."""
    refused(dry(env, *native, "--", *override), says)
    assert dry(env, *native, "--nproc=1", "--", "--global_batch", "3").returncode == 0  # one process takes all 3


def test_liger_set_true_where_it_cannot_run_is_refused_on_the_host(env):
    """`-- --use_liger_kernel true` passed `run --dry` on the cpu image (which has no liger-kernel), and --cpu or
    --native runs (where it cannot run, or is not installed) started, to stop in the container."""
    refused(dry(env, "--", "--use_liger_kernel", "true"), "this run trains on CPU, where Liger's kernels")
    on_gpu = {**env, "DOCKYARD_NVML_REPLAY": str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x1_580.json")}
    native = invoke_here("run", "--dry", "--native", "--", "--use_liger_kernel", "true", env=on_gpu)
    if importlib.util.find_spec("liger_kernel") is None:  # this host's Python, as the run would train in it
        refused(native, "use_liger_kernel true cannot run here: this host's Python has no liger-kernel (--native)")
    else:
        assert native.returncode == 0, native.stderr
    assert dry(env, "--", "--use_liger_kernel", "false").returncode == 0
    # under ZeRO-3, wherever it runs: DeepSpeed would hand Liger's loss an empty shard at the first step
    refused(invoke_here("run", "--dry", "--native", "--recipe=zero3", "--", "--use_liger_kernel", "true", env=on_gpu),
            "under ZeRO-3 Liger's fused loss reads the output layer's weight")


def test_liger_set_true_on_a_model_it_has_no_kernels_for_is_refused_on_the_host(env, tmp_path):
    """A GPT-NeoX model with `use_liger_kernel true` was sized as if Liger's kernels ran (micro-batch 4 "fits" an
    H100 where 83 GiB are needed without them), while liger-kernel skips the model, saying so at info level only:
    out of memory at the first step."""
    neox = tmp_path / "neox"
    neox.mkdir()
    (neox / "config.json").write_text(json.dumps({
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 1024, "hidden_size": 256,
        "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4}))
    on_gpu = {**env, "DOCKYARD_NVML_REPLAY": str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x1_580.json")}
    run = ["run", "--dry", "--recipe=zero2", f"--model={neox}", "--", "--max_seq_length", "2048"]
    refused(invoke_here(*run, "--use_liger_kernel", "true", env=on_gpu),
            "use_liger_kernel true: Liger has no kernels for model type 'gpt_neox'")
    assert invoke_here(*run, env=on_gpu).returncode == 0  # auto: off for it, and sized so


@pytest.mark.parametrize("change,says", [
    ({"hidden_size": 66}, "`hidden_size` 66 is not a multiple of `num_attention_heads` 4"),
    ({"attention_bias": "false"}, "attention_bias 'false': takes true or false (no quotes)"),
    ({"num_hidden_layers": 50_000_000}, "`num_hidden_layers` is 50000000, more than 4096"),
])
def test_a_model_config_transformers_cannot_build_is_refused_before_an_image_starts(env, tmp_path, change, says):
    """`run --dry --model=FOLDER` checked only that config.json was there: the trainer refused these in the container
    (or, for 5e7 layers, built them on the meta device for hours)."""
    from dockyard.common.run_settings import TINY_MODEL

    cfg = {**json.loads((TINY_MODEL / "config.json").read_text()), **change}
    cfg.pop("head_dim", None)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    refused(dry(env, f"--model={folder}"), says)


def test_numa_binding_true_on_cpu_and_an_empty_number_are_said_before_the_run_starts(env):
    """`--cpu -- --numa_binding true` passed `run --dry` and failed in the container; `--global_batch ''` was said
    to be "global_batch None"."""
    refused(dry(env, "--", "--numa_binding", "true"), "numa_binding true cannot bind: CPU: no GPU to bind near")
    refused(dry(env, "--", "--global_batch", ""), "--global_batch given no value: takes a whole number from 1")
    refused(dry(env, "--", "--max_steps", ""), "max_steps given no value: TrainingArguments.max_steps takes")


@pytest.mark.parametrize("given, says", [
    (["--torch_compile_backend", "evil"], "torch_compile_backend 'evil': give one of inductor, eager, aot_eager"),
    (["--ddp_backend", "mpi"], "ddp_backend 'mpi': the images hold nccl and gloo"),
    (["--tf32", "true"], "tf32 true is a mode of NVIDIA GPUs (Ampere and newer), and this run trains on CPU"),
    (["--ddp_backend", "nccl"], "ddp_backend nccl needs GPUs, and this run trains on CPU"),
    # torch's RuntimeError once the model had loaded; the Trainer fell back to its random sampler, and to no count
    (["--torch_compile", "true", "--torch_compile_mode", "fastest"], "torch_compile_mode 'fastest': give one of "
                                                                      "default, lite, reduce-overhead, "),
    (["--train_sampling_strategy", "bogus"], "train_sampling_strategy 'bogus': give one of random, sequential, "
                                             "group_by_length, batch_rebalance"),
    (["--include_num_input_tokens_seen", "bogus"], "include_num_input_tokens_seen 'bogus': give one of all, "
                                                   "non_padding, no, or true (all) or false (no)"),
])
def test_a_backend_no_image_has_and_gpu_switches_on_cpu_are_refused_before_the_run_starts(env, given, says):
    """The thirteenth red-team pass: each passed `run --dry`, then the run refused it (accelerate's enum, its
    "backend mpi is not available", Transformers' "--tf32 requires Ampere") once its folder, and in a container its
    image, had started. Torch's own backends, in any case, still pass."""
    refused(dry(env, "--", *given), says)
    for fine in (["--torch_compile_backend", "Inductor"], ["--ddp_backend", "gloo"], ["--tf32", "false"],
                 ["--torch_compile_mode", "max-autotune-no-cudagraphs"], ["--train_sampling_strategy", "sequential"],
                 ["--include_num_input_tokens_seen", "non_padding"], ["--include_num_input_tokens_seen", "true"]):
        ok = dry(env, "--", *fine)
        assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("native", [[], ["--native"]])
def test_padding_free_on_a_classifier_is_refused_before_the_run_starts(env, native):
    """`--task seq_cls --padding_free true` passed `run --dry`; the trainer refused it once every GPU had loaded the
    model."""
    refused(dry(env, *native, "--", "--task", "seq_cls", "--padding_free", "true"),
            "padding_free applies to causal language modelling, not seq_cls")


def test_the_training_arguments_snapshot_is_the_pinned_transformers():
    """Each field's name, and for a number its type: what the host checks overrides against."""
    import enum
    import types
    import typing

    from transformers import TrainingArguments

    def kind(t) -> str:
        choices = set(typing.get_args(t)) if typing.get_origin(t) in (typing.Union, types.UnionType) else {t}
        named = [c for c in choices if isinstance(c, type) and issubclass(c, enum.Enum)]
        if named:  # one of transformers' names (optim, lr_scheduler_type, the strategies)
            return "choice:" + ",".join(m.value for m in named[0])
        number = choices - {type(None)}
        if len(number) != 1 or not number <= {int, float, bool}:
            return ""
        return number.pop().__name__ + ("|None" if type(None) in choices else "")

    assert training_args.training_arguments() == {f.name: kind(f.type) for f in fields(TrainingArguments)}
    assert training_args.training_arguments()["max_steps"] == "int"  # the snapshot holds the types, not only names
    assert training_args.training_arguments()["bf16"] == "bool"  # and the switches
    assert "adamw_torch_fused" in training_args.training_arguments()["optim"].split(",")  # and the names


def test_a_recipe_saved_with_a_byte_order_mark_passes_the_dry_run(env, tmp_path):
    """A recipe.yaml saved with a UTF-8 BOM was refused by `run --dry`: "the first line must be a comment"."""
    import shutil

    folder = tmp_path / "mine"
    shutil.copytree(ROOT / "recipes" / "zero2", folder)
    (folder / "recipe.yaml").write_bytes(b"\xef\xbb\xbf" + (folder / "recipe.yaml").read_bytes())
    r = dry(env, f"--recipe={folder}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_the_hosts_names_of_modes_and_samplers_are_torchs_and_transformers():
    """The host has neither torch nor transformers: its lists of torch.compile's modes and of the Trainer's samplers
    are the pinned ones' (the trainer asks its own torch for the modes)."""
    from torch._inductor import list_mode_options
    from transformers import TrainingArguments

    from dockyard.train import guards

    assert training_args.COMPILE_MODES == tuple(list_mode_options())
    assert guards.compile_modes("fastest") == tuple(list_mode_options())
    sampler = next(f for f in fields(TrainingArguments) if f.name == "train_sampling_strategy")
    assert training_args.SAMPLING_STRATEGIES == tuple(sampler.metadata["choices"])
    for value in (*training_args.TOKENS_SEEN, True, False):  # what TrainingArguments and the Trainer read
        TrainingArguments(output_dir="/nonexistent", include_num_input_tokens_seen=value, use_cpu=True)


@pytest.mark.parametrize("task", ["slurm", "k8s"])
@pytest.mark.parametrize("override,says", [(["--max_stepz", "5"], "did you mean --max_steps?"),
                                           (["--max_steps", "nan"], "max_steps nan: "),
                                           (["--lora_r", "-3"], "lora_r -3: ")])
def test_the_multinode_writers_refuse_what_the_trainer_would_before_writing(task, override, says, tmp_path):
    refused(invoke_here(task, "--recipe=lora", f"--out={tmp_path / 'out'}", "--", *override), says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task", ["slurm", "k8s"])
def test_the_multinode_writers_refuse_fsdp_on_cpu_nodes_as_invoke_run_does(task, tmp_path):
    """`--recipe=fsdp` without --gpus-per-node (0: CPU nodes) was written, and every node's trainer would have
    stopped once scheduled."""
    refused(invoke_here(task, "--recipe=fsdp", f"--out={tmp_path / 'out'}"),
            "recipe fsdp is FSDP, which the HF Trainer runs only on GPUs (on CPU it would fall back to DDP, so the "
            "trainer stops): give --gpus-per-node (the nodes' GPUs), or pick zero3")
    assert not (tmp_path / "out").exists()
    assert invoke_here(task, "--recipe=fsdp", "--gpus-per-node=8", f"--out={tmp_path / 'gpus'}").returncode == 0


def test_slurm_refuses_a_missing_archive_before_writing(tmp_path):
    out = tmp_path / "job.sbatch"
    refused(invoke_here("slurm", "--archive=/missing.tar.zst", f"--out={out}"), "--archive /missing.tar.zst: no such file")
    assert not out.exists()


def test_a_wheelhouse_elsewhere_is_what_the_build_reads(tmp_path):
    """The build's context is staged beside the wheelhouse it reads (hard links), at the same path every time."""
    r = invoke_here("build", "--variant=cpu", "--dry", env={"INVOKE_DOCKYARD_WHEELHOUSE_DIR": str(tmp_path / "wh")})
    assert r.returncode == 0, r.stderr
    assert f"# in {tmp_path / 'wh' / '.context-cpu'}: this checkout's build files, {tmp_path / 'wh' / 'cpu'}/ and " \
           "cpu.txt as wheels/" in r.stdout
    build_line = next(x for x in r.stdout.splitlines() if " build " in x and "--progress=plain" in x)
    assert build_line.endswith(str(tmp_path / "wh" / ".context-cpu")), "built from the context holding those wheels"
    assert not (tmp_path / "wh").exists(), "--dry stages nothing"
    r = invoke_here("build", "--variant=cpu", "--dry")
    assert next(x for x in r.stdout.splitlines() if "--progress=plain" in x).endswith(
        str(ROOT / "images" / "wheelhouse" / ".context-cpu"))


def test_the_wheelhouse_help_names_the_setting_that_moves_it():
    r = invoke_here("--help", "wheelhouse")
    assert "images/wheelhouse/<variant>/" in r.stdout and "wheelhouse_dir setting moves that folder" in r.stdout
    assert "INVOKE_DOCKYARD_WHEELHOUSE_DIR" in r.stdout


def test_an_unknown_key_in_a_recipes_settings_is_refused_on_the_host_as_the_trainer_refuses_it(env, tmp_path):
    """`settings: {bogus: 1}` in a recipe of your own passed `run --dry` (and started the run): the trainer refused it
    only once the container had started and the base model was made."""
    import shutil

    folder = tmp_path / "mine"
    shutil.copytree(ROOT / "recipes" / "ddp", folder)
    with (folder / "recipe.yaml").open("a") as f:
        f.write("settings:\n  max_step: 5\n")
    refused(dry(env, f"--recipe={folder}"), f"unknown setting(s) max_step in settings: in {folder}/recipe.yaml")


def test_a_runs_folder_that_cannot_be_made_is_refused_by_the_dry_run_too(env, tmp_path):
    """`--dry` printed "59.4 GiB free in /etc/passwd/runs" and exited 0; the run itself then failed making it."""
    (tmp_path / "a-file").write_text("")
    runs = tmp_path / "a-file" / "runs"
    for native in ([], ["--native"]):
        refused(dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(runs)}, *native),
                f"cannot make the folder {runs}: {tmp_path / 'a-file'} is a file, not a folder; set the runs_dir")
    refused(dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "a-file")}),  # the runs folder a file itself
            f"{tmp_path / 'a-file'} is a file, not a folder; set the runs_dir")
    assert dry({**env, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "new" / "runs")}).returncode == 0
    assert not (tmp_path / "new").exists(), "a dry run makes nothing"


def test_a_run_id_whose_run_failed_before_training_says_how_to_use_it_again(env, tmp_path):
    """A run refused in its container (bad data) left its folder, and the same --run-id, once the data was fixed,
    was told "already holds a run: ... add --resume to continue it": a run with nothing to continue."""
    import json

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "status": "failed", "metrics": {"steps": 0},
                                                   "error": "cannot read /data/x.jsonl:3: not JSON"}))
    refused(dry(env, "--run-id=r1"), f"run folder {run} already holds a run, which failed before it trained (cannot "
                                     f"read /data/x.jsonl:3: not JSON); to use the id again, remove it: rm -r {run}. "
                                     "Otherwise: pick another --run-id")
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)  # it trained: resuming it is the way on
    r = dry(env, "--run-id=r1")
    refused(r, f"run folder {run} already holds a run: pick another --run-id, or add --resume")
    assert "rm -r" not in r.stderr


def test_data_of_thousands_of_fields_naming_no_format_is_refused_in_a_short_line(env, tmp_path):
    """A .csv header of 200,000 columns (or a JSON line whose field name is megabytes) naming no format was refused
    with every name in the line: 1.7 MB of error on the terminal. The first names are said, and how many more."""
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(200_000)) + "\n" + ",".join("x" * 200_000) + "\n")
    r = dry(env, f"--data={wide}")
    refused(r, f"{wide}: cannot tell the data format from its fields (c0, c1, c10, c100, c1000, c10000, c100000, ")
    assert "c100012 and 199980 more); rename them to one of messages" in r.stderr and len(r.stderr) < 4000, len(r.stderr)
    long = tmp_path / "long.jsonl"
    long.write_text(a_step_of('{"' + "q" * 1_000_000 + '": "a"}'))
    r = dry(env, f"--data={long}")
    refused(r, f"{long}: cannot tell the data format from its fields ({'q' * 57}...); rename them")
    assert len(r.stderr) < 4000, len(r.stderr)


def test_data_whose_first_example_names_no_format_is_refused_before_the_image_starts(env, tmp_path):
    """`qa.jsonl` with question/answer fields was refused inside the container, ~15 s later, leaving a failed run
    folder; its first line, read on the host, says the same now (the trainer's own words, from the same rules)."""
    import json

    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n" + a_step_of(json.dumps({"question": "2+2?", "answer": "4", "id": None})))
    refused(dry(env, f"--data={qa}"), f"{qa}: cannot tell the data format from its fields (answer, question); rename "
                                      "them to one of messages (messages); sharegpt (conversations); alpaca ")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "fine"}\n')
    (folder / "b.jsonl").write_text('["not", "an object"]\n')
    # every file's first line is read (a folder is one format): the second file's too
    refused(dry(env, f"--data={folder}"), f"cannot read {folder / 'b.jsonl'}:1: an array, not an object")
    (folder / "b.jsonl").write_text(a_step_of('{"text": "fine too"}', '["not", "an object"]'))
    assert dry(env, f"--data={folder}").returncode == 0, "its first lines name the format; the trainer reads the rest"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "cut short\n')
    refused(dry(env, f"--data={broken}"), f"cannot read {broken}:1: not JSON (Unterminated string starting at: "
                                          "column 10); each line must be one JSON object")
    # held-out data is read the same way; a format named is the trainer's to check against every example
    refused(dry(env, f"--data={folder}", "--", "--eval_data", str(qa)), "cannot tell the data format")
    assert dry(env, f"--data={qa}", "--", "--data_format", "text").returncode == 0
    # red-team pass: a first example whose every field is null (or `{}`) was "cannot tell the data format from its
    # fields (); rename them to one of ...": nothing named, and nothing to rename
    empty = tmp_path / "empty-first.jsonl"
    empty.write_text('{}\n{"text": "fine"}\n')
    refused(dry(env, f"--data={empty}"), f"{empty}: its first example has no field with a value (each is null, "
                                         "or there is none): fill in its fields or remove it")


@pytest.mark.parametrize("first, said", [
    ('{"prompt": "a", "completion": null}', "completion is null, where the prompt_completion format needs text"),
    ('{"instruction": "a", "input": "b", "output": null}', "output is null, where the alpaca format needs text"),
    ('{"text": null}', "text is null, where the text format needs text"),
    ('{"messages": null}', 'messages is null, where the messages format needs a list of turns ([{"role": "user"'),
    ('{"conversations": null, "id": 3}', 'conversations is null, where the sharegpt format needs a list of turns'),
])
def test_a_first_example_with_a_field_of_its_format_null_is_said_as_that(env, tmp_path, first, said):
    """Red-team pass: `{"prompt": "a", "completion": null}` first was refused as "cannot tell the data format from
    its fields (prompt); rename them": the field is there, and renaming cannot help. The line and the null field are
    named now, with what the format needs there; in a folder's later file too."""
    data = tmp_path / "nulls.jsonl"
    data.write_text("\n" + first + "\n")
    refused(dry(env, f"--data={data}"), f"{data}: line 2: {said}")
    assert "cannot tell the data format" not in dry(env, f"--data={data}").stderr
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "fine"}\n')
    (folder / "b.jsonl").write_text(first + "\n")
    refused(dry(env, f"--data={folder}"), f"{folder / 'b.jsonl'}: line 1: {said}")


def test_eval_data_in_another_format_than_the_training_data_is_refused_before_the_image_starts(env, tmp_path):
    """Red-team pass: `-- --eval_data` of text rows beside prompt/completion training data passed --dry, and the
    trainer refused it in the container: "example 1 lacks prompt, completion". Its first example says it now, on
    the host; held-out rows that have the training format's fields (and others) are that format's."""
    train, held = tmp_path / "train.jsonl", tmp_path / "held.csv"
    train.write_text(a_step_of('{"prompt": "Which port?", "completion": " Bergen"}'))
    held.write_text("text\nShips leave Bergen at dawn.\n")
    refused(dry(env, f"--data={train}", "--", "--eval_data", str(held)),
            f"-- --eval_data {held}: its first example is in the text format (text), and held-out examples must be in "
            f"the training data's, prompt_completion (prompt+completion) as in --data {train}: convert them to "
            "prompt_completion (docs/data.md)")
    held = tmp_path / "held.jsonl"
    held.write_text('{"messages": [{"role": "user", "content": "Which port?"}]}\n')
    refused(dry(env, f"--data={train}", "--", "--eval_data", str(held)), "is in the messages format (messages)")
    held.write_text('{"prompt": "Which city?", "completion": " Oslo", "text": "x"}\n')
    assert dry(env, f"--data={train}", "--", "--eval_data", str(held)).returncode == 0


def test_data_given_by_a_link_to_a_file_without_a_suffix_is_read_on_the_host(env, tmp_path):
    """Red-team pass: a link named train.jsonl to a file of no suffix (the Hugging Face cache's blobs/<sha256>, DVC,
    git-annex) is read by the run as .jsonl, but the host went by the target's name and read none of it: a first
    example of no format passed --dry and was refused in the container."""
    blob = tmp_path / "blobs" / "9f86d081884c7d65"
    blob.parent.mkdir()
    blob.write_text('{"question": "Which port?", "answer": "Bergen"}\n')
    link = tmp_path / "train.jsonl"
    link.symlink_to(blob)
    refused(dry(env, f"--data={link}"), f"{link}: cannot tell the data format from its fields (answer, question)")
    blob.write_text(a_step_of('{"prompt": "Which port?", "completion": " Bergen"}'))
    assert dry(env, f"--data={link}").returncode == 0


def test_a_data_file_of_another_kind_than_its_name_or_not_utf8_is_said_as_that_before_the_image_starts(env, tmp_path):
    """Red-team pass: a gzip file named train.jsonl was "not JSON (Expecting value: column 1)"; named .csv, its bytes
    were read as the header's field names ("cannot tell the data format from its fields (\\x08\\x01Z...)"); a
    Parquet file named .jsonl was "not JSON"; train.jsonl.gz was an unknown type, no more; a first line saved as
    Latin-1 passed the host, to be refused in the container; a JSON array written over many lines in a .jsonl file
    was "not JSON (Expecting value: column 2)" on its line `[`, where a .json file holds one."""
    import gzip

    rows = '{"prompt": "Which port?", "completion": " Bergen"}\n'
    for name, content, said in (
            ("train.jsonl", gzip.compress(rows.encode()), "it is gzip-compressed: decompress it first (gunzip)"),
            ("train.csv", gzip.compress(b"prompt,completion\nq,a\n"), "it is gzip-compressed: decompress it first"),
            ("train.jsonl", b"PAR1\x15\x04", "it is a Parquet file: name it .parquet"),
            ("train.jsonl", '{"prompt": "café", "completion": " x"}\n'.encode("latin-1"),
             ":1 (byte 0xe9 at column 16): it is not UTF-8 text; save it as UTF-8"),
            ("train.jsonl", b'[\n' + rows.encode() + b']\n', ":1: not JSON (Expecting value: column 2); each line "
             "must be one JSON object, or the file (named .json) one JSON array")):
        f = tmp_path / name
        f.write_bytes(content)
        refused(dry(env, f"--data={f}"), f"cannot read {f}{'' if said.startswith(':') else ': '}{said}")
        f.unlink()
    packed = tmp_path / "train.jsonl.gz"
    packed.write_bytes(gzip.compress(rows.encode()))
    refused(dry(env, f"--data={packed}"), "unknown data file type .gz (a compressed file: decompress it first, gunzip)")


def test_a_csv_file_whose_header_names_no_format_is_refused_before_the_image_starts(env, tmp_path):
    """The host read only JSON files' first examples: a .csv of question,answer columns was refused in the container,
    after the image had started, leaving a failed run folder. Its header line now says it on the host, in the
    trainer's words; a header that names a format (after a BOM, quoted, a space after a comma) is taken."""
    qa = tmp_path / "qa.csv"
    qa.write_text("question,answer\n2+2?,4\n")
    refused(dry(env, f"--data={qa}"), f"{qa}: cannot tell the data format from its fields (answer, question); rename "
                                      "them to one of messages (messages)")
    assert "first line must name them, e.g. prompt,completion" in dry(env, f"--data={qa}").stderr
    for header, row in (("\ufeffprompt,completion", "2+2?,4"), ('"prompt", completion', "2+2?,4"),
                        ("id,prompt,completion", "7,2+2?,4")):
        fine = tmp_path / "fine.csv"
        fine.write_text(f"{header}\n" + a_step_of(row), encoding="utf-8")
        assert dry(env, f"--data={fine}").returncode == 0, header
    # a name twice, whatever the task (the trainer's words); columns of no name (`text,,`, pandas' index) are none
    twice = tmp_path / "twice.csv"
    twice.write_text("text,label,text\n" + a_step_of("a,1,b"))
    for task in ("causal_lm", "seq_cls"):
        refused(dry(env, f"--data={twice}", "--", "--task", task), f"{twice}:1: the header names text twice: name "
                "each column once")
    twice.write_text("text,label,,\n" + a_step_of("a,1,,"))
    assert dry(env, f"--data={twice}", "--", "--task", "seq_cls").returncode == 0
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.csv").write_text("prompt,completion\nQ,A\n")
    (folder / "b.csv").write_text("question,answer\nQ,A\n")
    refused(dry(env, f"--data={folder}"), f"{folder / 'b.csv'}: cannot tell the data format from its fields")


def test_the_command_that_continues_an_interrupted_run_gives_what_the_host_needs_again(tmp_path, monkeypatch):
    """A recipe folder of one's own, and inputs given after `--`, are the host's to mount: a resume without them was
    refused ("give that folder again"), or the trainer found its held-out data missing. The other overrides are the
    run's own (overrides.json)."""
    from dockyard.launch.run import RunRequest, resume_command

    mine = tmp_path / "my-recipe"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("strategy: ddp\n")
    monkeypatch.chdir(tmp_path)
    r = RunRequest(recipe="./my-recipe", data="/d/x.jsonl", cpu=True,
                   overrides=("--eval_data", "/d/held.jsonl", "--max_steps", "5", "--model=/m"))
    assert resume_command(r, "exp1") == ("invoke run --resume --run-id=exp1 " f"--recipe={mine} --data=/d/x.jsonl --cpu "
                                         "-- --eval_data /d/held.jsonl --model /m")
    assert resume_command(RunRequest(), "exp2") == "invoke run --resume --run-id=exp2"
    # a node of several: where it meets the others and how long it waits, as it was given (the interface it chose,
    # lost, made it advertise the default route's address; --disable-require lost, the resume was refused)
    node = RunRequest(nodes=2, node_rank=1, master_addr="192.0.2.1", iface="ib0", join_timeout=900, max_restarts=3,
                      disable_require=True)
    assert resume_command(node, "exp3") == ("invoke run --resume --run-id=exp3 --disable-require --nodes=2 "
                                            "--node-rank=1 --master-addr=192.0.2.1 --master-port=29500 --iface=ib0 "
                                            "--join-timeout=900 --max-restarts=3")


def test_ctrl_c_before_the_first_checkpoint_does_not_say_to_continue_from_one(tmp_path):
    """"Continue it from its last complete checkpoint" of a run that had saved none: the resume started again."""
    from dockyard import engine
    from dockyard.launch.run import RunRequest, _interrupted

    run_dir = tmp_path / "r1"
    (run_dir / "checkpoints" / "checkpoint-4").mkdir(parents=True)  # begun, never completed
    (run_dir / "train.log").write_text("started\n")
    said = str(_interrupted(RunRequest(native=True), run_dir, engine.Interrupted("x", stopped=True), made=True))
    assert said == ("interrupted: run r1 stopped before its first checkpoint. Continuing it starts again from the first "
                    "step, with its own settings: invoke run --resume --run-id=r1 --native")
    (run_dir / "checkpoints" / "checkpoint-4" / "complete.json").write_text("{}")
    said = str(_interrupted(RunRequest(native=True), run_dir, engine.Interrupted("x", stopped=True), made=True))
    assert said.startswith("interrupted: run r1 stopped. Continue it from its last complete checkpoint")


def test_ctrl_c_on_a_node_of_several_names_the_container_that_node_runs(tmp_path):
    """A node of a run of several nodes runs dockyard-<run-id>-node<rank>: Ctrl-C there said "docker stop
    dockyard-<run-id> stops it at once", a container no node has (docker: No such container)."""
    from dockyard import engine
    from dockyard.launch.run import RunRequest, _interrupted

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "train.log").write_text("started\n")
    still = engine.Interrupted("x", stopped=False)
    said = str(_interrupted(RunRequest(nodes=2, node_rank=1), run_dir, still, made=False))
    assert "(docker stop dockyard-r1-node1 stops it at once)" in said, said
    said = str(_interrupted(RunRequest(), run_dir, still, made=True))
    assert "(docker stop dockyard-r1 stops it at once)" in said, said

def test_restarts_on_one_node_reach_torchrun_and_the_flags_of_several_nodes_are_said_to_do_nothing(env):
    """`--max-restarts=3` with one node was left out of torchrun's command without a word, and --master-addr,
    --iface and --join-timeout did nothing."""
    r = dry(env, "--max-restarts=3")
    assert r.returncode == 0 and "--standalone --local-addr=127.0.0.1 --max-restarts=3 " in r.stderr, r.stderr
    assert "--max-restarts" not in dry(env).stderr
    r = dry(env, "--master-addr=198.18.0.1")  # said, not refused: a job script may pass it for one node too
    assert r.returncode == 0 and ("warning: --master-addr: for several nodes (--nodes=N); this run has one node, so it "
                                  "does nothing") in r.stderr, r.stderr
    r = dry(env, "--iface=eth0", "--join-timeout=30", "--master-port=29600")
    assert r.returncode == 0 and "warning: --master-port, --iface, --join-timeout: for several nodes" in r.stderr, \
        r.stderr
    refused(dry(env, "--max-restarts=-1"), "--max-restarts='-1': takes a whole number from 0 to 1000 (`invoke --help run`")
    refused(dry(env, "--nproc=5000"), "--nproc='5000': takes a whole number from 0 to 4096")


def test_the_flags_of_an_image_given_with_native_are_said_to_do_nothing(env):
    """`--native --cpu --variant=cu132` (or --disable-require) exited 0 without a word: no image is used natively."""
    r = invoke_here("run", "--dry", "--native", "--cpu", "--variant=cu132", "--disable-require", env=env)
    assert r.returncode == 0 and ("warning: --variant=cu132, --disable-require: for the image a run trains in; --native "
                                  "trains with this host's Python and its own torch, in no container, so they do "
                                  "nothing") in r.stderr, r.stderr
    r = invoke_here("run", "--dry", "--native", "--disable-require", "--variant=cpu", env=env)
    assert r.returncode == 0 and "warning: --disable-require: for the image a run trains in;" in r.stderr, r.stderr
    assert "--variant" not in r.stderr  # cpu trains on CPU, as --cpu: it does something
    assert "does nothing" not in dry(env, "--disable-require").stderr  # in the image it sets NVIDIA_DISABLE_REQUIRE


def test_more_cpu_processes_than_cores_are_said_not_refused(env, monkeypatch):
    """`--nproc=64 --cpu --native` on a 2-core host was taken without a word: each process got a thirty-second of a
    core (the launcher shares them out: dockyard.common.cores.usable_cores)."""
    from dockyard.common import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    for flags in (["--native", "--cpu"], []):  # natively, or in the cpu image
        r = dry(env, "--nproc=64", *flags)
        assert r.returncode == 0 and ("warning: --nproc=64 CPU processes on 2 usable core(s) of this host: each gets "
                                      "less than a core, and every step waits for the slowest; --nproc=2 gives each "
                                      "one") in r.stderr, r.stderr
        assert "--nproc-per-node=64" in r.stderr
    assert "usable core" not in dry(env, "--nproc=2", "--native").stderr


def test_files_of_a_data_folder_that_are_not_read_are_named(env, tmp_path):
    """A folder of a.jsonl, B.JSONL, c.jsonl.gz and sub/d.jsonl trained on a.jsonl alone, without a word."""
    folder = tmp_path / "fold"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.jsonl", "B.JSONL", "sub/d.jsonl"):
        (folder / name).write_text(a_step_of('{"text": "ships sail"}'))
    (folder / "c.jsonl.gz").write_bytes(b"\x1f\x8b")
    (folder / ".old.jsonl").write_text('{"text": "hidden"}\n')
    r = dry(env, f"--data={folder}")
    assert r.returncode == 0, r.stderr
    assert ("not read (only .jsonl, .json, .parquet, .csv, .txt files not hidden are data): .old.jsonl, B.JSONL, "
            "c.jsonl.gz, sub/" in r.stderr)
    # a name holding an escape sequence is written escaped: said raw, it set the terminal's title and cleared it
    (folder / "x\x1b]0;pwned\x07\x1b[2J.gz").write_bytes(b"")
    r = dry(env, f"--data={folder}")
    assert r.returncode == 0 and "\x1b" not in r.stderr and "x\\x1b]0;pwned\\x07\\x1b[2J.gz" in r.stderr, r.stderr


def test_a_json_lines_file_that_starts_with_a_byte_order_mark_passes_as_the_trainer_reads_it(env, tmp_path):
    """Windows editors save UTF-8 with a BOM: `--dry` refused the file ("Unexpected UTF-8 BOM"), the trainer read it."""
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + a_step_of('{"text": "ships sail"}').encode())
    assert dry(env, f"--data={f}").returncode == 0


def test_a_resume_in_a_container_asks_for_the_inputs_it_mounted_with_the_whole_command(env, tmp_path):
    """`invoke run --resume --run-id=X` of a run trained on --data=/data/chat.jsonl started the container, which
    refused: "X was trained with data /data/chat.jsonl, not /workspace/inputs/data/chat.jsonl", a path never typed.
    The host now says what to give again, before anything starts; given, the resume goes on."""
    data = tmp_path / "my data" / "chat.jsonl"
    data.parent.mkdir()
    data.write_text(a_step_of('{"text": "ships sail"}'))
    folder = _finished_run(tmp_path / "runs", "c1", "ddp")
    m = json.loads((folder / "manifest.json").read_text())
    m["variant"] = "cpu"
    m["inputs"] = {"data": {"path": str(data), "inside": "/workspace/inputs/data/chat.jsonl"},
                   "model": {"path": str(folder / "base"), "inside": "/workspace/runs/c1/base"}}  # the run's own
    (folder / "manifest.json").write_text(json.dumps(m))
    r = dry(env, "--resume", "--run-id=c1")
    refused(r, f"--resume: run c1 read data {data}, and a resume mounts what its command names: give it again: "
               f"invoke run --resume --run-id=c1 --variant=cpu '--data={data}'")
    r = dry(env, "--resume", "--run-id=c1", f"--data={data}")
    assert r.returncode == 0, r.stderr


def _node_1s_record(tmp_path, run_id: str, recipe: str, error: str):
    """A run of two nodes in a container whose node 1 failed (`error`) and wrote its manifest-node1.json, naming the
    data it read at its host path (returned); node 0 wrote no record."""
    data = tmp_path / "node1" / "chat.jsonl"
    data.parent.mkdir()
    data.write_text(a_step_of('{"text": "ships sail"}'))
    folder = _finished_run(tmp_path / "runs", run_id, recipe)
    m = json.loads((folder / "manifest.json").read_text())
    m |= {"variant": "cpu", "status": "failed", "nodes": 2, "node_rank": 1, "world_size": 4, "error": error,
          "inputs": {"data": {"path": str(data), "inside": "/workspace/inputs/data/chat.jsonl"}}}
    (folder / "manifest-node1.json").write_text(json.dumps(m))
    (folder / "manifest.json").unlink()
    return folder, data


@pytest.mark.parametrize("record", ["manifest.json", "manifest-node1.json"])
def test_a_node_resumed_after_it_was_lost_is_not_given_another_nodes_inputs_as_its_own(env, tmp_path, monkeypatch,
                                                                                       record):
    """Node 0 lost before it wrote its record: node 1 wrote the run's manifest.json (its node_rank says whose), and node
    0's `invoke run --resume` without --data said "run m1 read data <node 1's path> ...: give it again", another node's
    host path as this node's own. Said now as node 1's, offered where node 0's is at that path too (the trainer holds it
    against the record's fingerprint); given, the resume goes on with the run's recipe. Node 1 still gets its own
    record's paths. Both nodes lost, node 1 failing on its own error first: no node recorded node 0 lost, so there is
    manifest-node1.json alone, and node 0's resume was refused as a run that wrote no record ("has no manifest naming
    its recipe: give the recipe it was started with"): read the same way now."""
    from dockyard.launch import multinode

    error = ("lost node 0 (198.18.0.1, host gpu-a): it stopped answering" if record == "manifest.json" else
             "out of GPU memory at micro-batch 8 (CUDA out of memory)")
    folder, data = _node_1s_record(tmp_path, "m1", "zero2", error)
    if record == "manifest.json":  # made the run's by node 1's torchrun (torchrun.settle)
        (folder / "manifest.json").write_text((folder / "manifest-node1.json").read_text())
    nodes = ("--nodes=2", "--master-addr=198.18.0.1")
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.1"})
    r = dry(env, "--resume", "--run-id=m1", *nodes, "--node-rank=0")
    refused(r, "--resume: run m1 holds no record of what node 0 read (it wrote none, lost before it could; "
               f"{record} is node 1's), and a resume mounts what its command names: give node 0's as it was "
               f"started. Node 1 read data {data}; where node 0's is there too: invoke run --resume --run-id=m1 "
               f"--variant=cpu --data={data} --nodes=2 --node-rank=0 --master-addr=198.18.0.1 --master-port=29500")
    r = dry(env, "--resume", "--run-id=m1", *nodes, "--node-rank=0", f"--data={data}")
    assert r.returncode == 0 and _trainer_recipe(r) == "zero2", r.stderr
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    r = dry(env, "--resume", "--run-id=m1", *nodes, "--node-rank=1")
    refused(r, f"--resume: run m1 read data {data}, and a resume mounts what its command names: give it again: ")



def test_node_1_started_again_on_a_run_id_it_has_a_record_of_is_refused_as_node_0_is(env, tmp_path, monkeypatch):
    """Two nodes started with another recipe each failed ("the nodes were not started alike"); both started again with
    the same --run-id: node 0 was refused ("already holds a run ... rm -r"), node 1 waited out the join timeout for
    it, then printed its old manifest-node1.json as this run's outcome ("run mn70r: failed · recipe ddp ... the nodes
    were not started alike"). Node 1 is now refused at once in node 0's words."""
    from dockyard.launch import multinode

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    record = {"run_id": "r1", "status": "failed", "metrics": {"steps": 0},
              "error": "the nodes were not started alike: node 1 with recipe ddp (node 0: lora)"}
    (run / "manifest.json").write_text(json.dumps(record))
    (run / "manifest-node1.json").write_text(json.dumps({**record, "node_rank": 1}))
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    refused(dry(env, "--run-id=r1", "--nodes=2", "--master-addr=198.18.0.1", "--node-rank=1"),
            f"run folder {run} already holds a run (this node's record manifest-node1.json, of an earlier start), which "
            "failed before it trained (the nodes were not started alike: node 1 with recipe ddp (node 0: lora)); to "
            f"use the id again, remove it: rm -r {run}. Otherwise: pick another --run-id, or add --resume")
    (run / "manifest-node1.json").unlink()  # a new run's node 1: node 0's record alone is no refusal of node 1's
    assert dry(env, "--run-id=r1", "--nodes=2", "--master-addr=198.18.0.1", "--node-rank=1").returncode == 0



def test_node_1_that_never_met_node_0_keeps_nothing_as_node_0_keeps_nothing(env, tmp_path, monkeypatch, loopback_port):
    """Node 1 started alone (node 0 not started, or at another address): node 0 in its place says "nothing was kept,
    so the same command can be run again" and removes the folder; node 1 left runs/ID holding its monitor's files,
    listed by `invoke runs` as a run "no manifest (stopped before it began?)", said "monitor: no samples" and "the
    run wrote no manifest". A real native torchrun as node 1, its node 0 a loopback port nothing listens on."""
    from dockyard.launch import multinode

    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "lo", "addr": "198.18.0.2"})
    r = invoke_here("run", "--native", "--cpu", "--recipe=lora", "--nproc=1", "--nodes=2", "--node-rank=1",
                    "--master-addr=127.0.0.1", f"--master-port={loopback_port}", "--run-id=r1", "--join-timeout=6",
                    env=env)
    refused(r, "the run did not start on this node (exit 1, for the reason above); nothing of this node's was kept, so "
               "the same command can be run again")
    assert "no samples" not in r.stderr and not (tmp_path / "runs" / "r1").exists(), r.stderr


def test_a_node_resumes_with_the_recipe_its_trainer_holds_the_run_to(env, tmp_path, monkeypatch):
    """Node 1's record names another recipe than the run's manifest.json (a record of another run copied in, or
    crafted): node 1's `invoke run --resume` took its own record's zero3, which the trainer refused ("was trained with
    recipe ddp, not zero3: resume it with --recipe ddp"), and --recipe ddp the host refused ("run m3 was started with
    recipe zero3 ... leave --recipe out"): each refusal sent the user to the other. The host reads the recipe as the
    trainer does now, the run's manifest.json first."""
    from dockyard.launch import multinode
    from dockyard.train import manifest

    folder = _finished_run(tmp_path / "runs", "m3", "ddp")
    m = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest-node1.json").write_text(json.dumps(m | {"node_rank": 1, "recipe": "zero3"}))
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    resume = ("--resume", "--run-id=m3", "--nodes=2", "--master-addr=198.18.0.1", "--node-rank=1")
    r = dry(env, *resume)
    assert r.returncode == 0, r.stderr
    manifest.check_same_recipe(folder, _trainer_recipe(r))  # the trainer takes it
    assert dry(env, *resume, "--recipe=ddp").returncode == 0


def test_a_nodes_record_cut_short_is_refused_with_the_way_on(env, tmp_path, monkeypatch):
    """Both nodes lost, node 1's manifest-node1.json cut short (a copy interrupted, a disk that filled): node 1's
    `invoke run --resume` said "... is not valid JSON (...): not a manifest the trainer wrote", and no more. It says
    what to do now; done, the resume goes on as one of a node that wrote no record (node 0's manifest.json read)."""
    from dockyard.launch import multinode

    folder, data = _node_1s_record(tmp_path, "m2", "zero2", "out of GPU memory at micro-batch 8")
    record = folder / "manifest-node1.json"
    (folder / "manifest.json").write_text(record.read_text().replace('"node_rank": 1', '"node_rank": 0'))
    record.write_text(record.read_text()[:40])
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    resume = ("--resume", "--run-id=m2", "--nodes=2", "--master-addr=198.18.0.1", "--node-rank=1")
    r = dry(env, *resume)
    refused(r, f"error: {record} is not valid JSON (Unterminated string starting at: line 1")
    assert r.stderr.rstrip().endswith(f"not a manifest the trainer wrote; move it aside (mv {record} {record}.broken) "
                                      "and resume again, as a node that wrote no record (--resume then says what to "
                                      "give)"), r.stderr
    record.rename(f"{record}.broken")
    refused(dry(env, *resume), "--resume: run m2 holds no record of what node 1 read (it wrote none, lost before it "
            f"could; manifest.json is node 0's), and a resume mounts what its command names: give node 1's as it was "
            f"started. Node 0 read data {data}")


def test_a_run_resumes_where_it_trained_on_this_host_or_in_an_image(env, tmp_path):
    """A --native run resumed without --native passed the host's checks, started the image and was refused there:
    "lora1 was trained with data /d/chat.jsonl, not /d/chat.jsonl" (the host's path, not mounted). Said on the host
    now, with the command that resumes it; an image's run resumed with --native likewise."""
    native = _finished_run(tmp_path / "runs", "h1", "ddp", native=True)
    before = (native / "manifest.json").read_text()
    refused(dry(env, "--resume", "--run-id=h1"), "--resume: run h1 was trained on this host (--native), and resumes "
            "the same way: invoke run --resume --run-id=h1 --variant=cpu --native")
    assert (native / "manifest.json").read_text() == before
    _finished_run(tmp_path / "runs", "i1", "ddp")
    refused(dry(env, "--native", "--resume", "--run-id=i1"), "--resume: run i1 was trained in an "
            "image, and resumes the same way: invoke run --resume --run-id=i1 --variant=cpu")


def test_a_data_folder_of_two_formats_is_refused_by_the_host_and_by_the_trainer(env, tmp_path):
    """A chat file beside an alpaca file: the run started, then `datasets` said "Couldn't cast", naming no file."""
    from dockyard.common.errors import DockyardError

    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, '
                                       '{"role": "assistant", "content": "hello"}]}\n')
    (folder / "alpaca.jsonl").write_text('{"instruction": "Say hi", "input": "", "output": "hi"}\n')
    says = "its files are in different data formats (alpaca: alpaca.jsonl; messages: chat.jsonl)"
    refused(dry(env, f"--data={folder}"), says)
    with pytest.raises(DockyardError, match=re.escape(says)):
        read.read_rows(folder)
    (folder / "alpaca.jsonl").write_text(a_step_of('{"messages": [{"role": "user", "content": "2+2?"}, '
                                                   '{"role": "assistant", "content": "4"}]}'))
    assert dry(env, f"--data={folder}").returncode == 0
    assert len(read.read_rows(folder)) == 1 + STEP


@pytest.mark.parametrize("name", ["slurm", "k8s", "shell"])
def test_a_run_id_naming_the_folder_of_invoke_slurm_or_k8s_is_refused(env, tmp_path, name):
    """runs/slurm/, runs/k8s/ and runs/shell/ hold what `invoke slurm`, `invoke k8s` and `invoke shell` write: a run
    there would mix with them (and `already holds a run` would call their scripts a run)."""
    r = dry(env, f"--run-id={name}")
    refused(r, f"--run-id {name}: the runs folder's {name}/ holds the ")
    assert "pick another --run-id" in r.stderr and not (tmp_path / "runs" / name).exists()


def test_packing_instruction_data_and_a_bad_checkpointing_mapping_are_refused_before_the_image_starts(env, tmp_path):
    """`--packing true` over instruction data, and `--gradient_checkpointing_kwargs` as a list or with a key torch
    does not take, passed `run --dry`: the trainer refused them in the container, after the image had started."""
    data = tmp_path / "chat.jsonl"
    data.write_text('{"prompt": "2+2?", "completion": "4"}\n')
    refused(dry(env, f"--data={data}", "--", "--packing", "true"),
            "packing joins text documents (the text format), and this data is prompt_completion")
    refused(dry(env, f"--data={data}", "--", "--packing", "true", "--data_format", "alpaca"),
            "this data is alpaca")
    refused(dry(env, "--", "--packing", "true", "--data_format", "sharegpt"), "this data is sharegpt")  # no --data
    text = tmp_path / "docs.jsonl"
    text.write_text('{"text": "a document"}\n')
    assert dry(env, f"--data={text}", "--", "--packing", "true").returncode == 0  # text documents: what it joins
    # the same in a .json file of one array, which the host did not read (the trainer refused it in the container)
    alpaca = tmp_path / "alpaca.json"
    alpaca.write_text('[{"instruction": "2+2?", "output": "4"}]')
    refused(dry(env, f"--data={alpaca}", "--", "--packing", "true"), "this data is alpaca")
    unknown = tmp_path / "foo.json"
    unknown.write_text('[{"foo": 1}]')
    refused(dry(env, f"--data={unknown}"), "cannot tell the data format from its fields (foo)")
    refused(dry(env, "--", "--gradient_checkpointing_kwargs", "[use_reentrant]"),
            "gradient_checkpointing_kwargs (or activation_checkpointing_kwargs) ['use_reentrant']: takes a mapping")
    refused(dry(env, "--", "--activation_checkpointing_kwargs", "{reentrant: false}"),
            "unknown key(s) reentrant; torch.utils.checkpoint takes debug, determinism_check")
    # a value torch would misread ("false" in quotes is a string, which it takes as true) or refuse at the first
    # step, after the model has loaded (determinism_check 5)
    refused(dry(env, "--", "--gradient_checkpointing_kwargs", '{use_reentrant: "false"}'),
            "use_reentrant 'false': takes true or false")
    refused(dry(env, "--", "--gradient_checkpointing_kwargs", "{determinism_check: 5}"),
            'determinism_check 5: takes "default" or "none"')
    assert dry(env, "--", "--gradient_checkpointing_kwargs", "{use_reentrant: false, determinism_check: none}"
               ).returncode == 0


@pytest.mark.parametrize("native", [[], ["--native"]])
def test_resuming_a_run_at_its_max_steps_is_refused_before_the_image_starts(env, tmp_path, native):
    """A finished run resumed as it was: the image started (12 s), then the trainer, torchrun and the host each
    said an error line. The host knows the last complete checkpoint and the run's max_steps."""
    folder = _finished_run(tmp_path / "runs", "n1", "ddp", bool(native))
    done = folder / "checkpoints" / "checkpoint-50"
    done.mkdir()
    (done / "complete.json").write_text("{}")
    (folder / "model").mkdir()
    r = dry(env, *native, "--resume", "--run-id=n1")
    refused(r, f"already at max_steps 50 (checkpoint-50), and completed: its model is in {folder / 'model'}: raise it "
               "to train on (-- --max_steps N")
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1
    assert dry(env, *native, "--resume", "--run-id=n1", "--", "--max_steps", "60").returncode == 0


@pytest.mark.parametrize("native", [[], ["--native"]])
def test_a_resume_that_would_change_the_shape_of_the_checkpoints_tensors_is_refused_before_the_image_starts(
        env, tmp_path, native):
    """Red-team pass: `--resume -- --lora_r 8` of a run trained at r=16 passed the dry run, then every rank failed in
    load_state_dict with a size-mismatch traceback; other lora_target_modules were refused as a checkpoint "not
    written for this run", with the advice to remove it (the one before it fails the same way)."""
    folder = _finished_run(tmp_path / "runs", "n1", "lora", bool(native))
    (folder / "checkpoints" / "checkpoint-2" / "complete.json").write_text("{}")
    (folder / "overrides.json").write_text(json.dumps({"max_steps": 2, "lora_r": 16}))
    resume = (*native, "--resume", "--run-id=n1", "--", "--max_steps", "4")
    refused(dry(env, *resume, "--lora_r", "8"), "--lora_r 8: the run trained with lora_r 16, and its checkpoints hold "
            "tensors of that shape, which a resume cannot change: leave --lora_r out")
    refused(dry(env, *resume, "--lora_target_modules", "q_proj,v_proj"),  # the default, all-linear, taken from
            "--lora_target_modules q_proj,v_proj: the run trained with lora_target_modules all-linear")  # defaults.yaml
    refused(dry(env, *resume, "--task", "seq_cls"), "--task seq_cls: the run trained with task causal_lm")
    # the same values, or settings that leave the tensors' shapes as they are, resume
    assert dry(env, *resume, "--lora_r", "16", "--lora_target_modules", "all-linear", "--lora_alpha", "8",
               "--lora_dropout", "0.1").returncode == 0
    # the same target modules in another order are the same modules (review: refused as another shape)
    (folder / "overrides.json").write_text(json.dumps({"max_steps": 2, "lora_r": 16,
                                                       "lora_target_modules": "q_proj,v_proj"}))
    assert dry(env, *resume, "--lora_target_modules", "v_proj,q_proj").returncode == 0
    (folder / "checkpoints" / "checkpoint-2" / "complete.json").unlink()  # no checkpoint: a fresh start, any shape
    assert dry(env, *resume, "--lora_r", "8").returncode == 0


def test_a_run_that_does_not_fit_the_gpu_is_refused_before_the_image_starts(env, tmp_path):
    """The trainer's autos refuse a run of which not even one example fits the GPU by the plan's estimate; that
    refusal came once the image had started and the processes had imported torch. `run --dry` on a replayed host
    (NVML's readings, recorded: these machines have no GPU) now says it on the host, as the trainer words it, and
    says when it is the model's states, not the examples, that overflow."""
    llama8b = ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"
    t4 = {**env, "DOCKYARD_NVML_REPLAY": str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "t4x2_535.json")}
    run = ["run", "--dry", f"--model={llama8b}"]
    refused(invoke_here(*run, "--recipe=ddp", env=t4),
            "ddp: the model alone does not fit: its weights, gradients and optimizer states take")
    refused(invoke_here(*run, "--recipe=zero3", env=t4),  # both T4s, sharded; the plan at the run's sequence length
            f"run `invoke plan --model={llama8b} --seq-len=128` for a recipe that fits 2 GPU(s)")  # as it runs
    refused(invoke_here(*run, "--recipe=qlora", "--", "--max_seq_length", "65536", env=t4),
            "qlora: not even one example of 65536 tokens fits in 13.3 GiB (90% of the Tesla T4)")
    fits = invoke_here(*run, "--recipe=qlora", "--", "--max_seq_length", "2048", env=t4)
    assert fits.returncode == 0 and "docker run" in fits.stderr, fits.stderr
    # with --cpu on a GPU host, the GPU's memory binds nothing
    refused(invoke_here(*run, "--recipe=lora", env=t4), "lora: the model alone does not fit")  # its 16-bit base
    on_cpu = invoke_here(*run, "--cpu", "--recipe=lora", env=t4)
    assert on_cpu.returncode == 0 and "docker run" in on_cpu.stderr, on_cpu.stderr
    # a hub id is sized from its snapshot in the Hugging Face cache, which the run reads offline
    snapshot = tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((llama8b / "config.json").read_text())
    refused(invoke_here("run", "--dry", "--model=meta-llama/Llama-3.1-8B", "--recipe=ddp", env=t4),
            "ddp: the model alone does not fit")
    # a family the host counts only as a Llama (up to 30 % over: Pythia 2.8B as 3.6B) is left to the trainer, which
    # counts it exactly: zero2 of Pythia 2.8B at 2048 tokens fits an H100 at micro-batch 2, and was refused here
    pythia = tmp_path / "pythia-2.8b"
    pythia.mkdir()
    (pythia / "config.json").write_text(json.dumps({
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 2560,
        "intermediate_size": 10240, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50304,
        "max_position_embeddings": 2048, "tie_word_embeddings": False}))
    h100 = {**env, "DOCKYARD_NVML_REPLAY": str(ROOT / "tests" / "fixtures" / "nvml" / "hosts" / "h100x1_580.json")}
    taken = invoke_here("run", "--dry", "--recipe=zero2", f"--model={pythia}", "--", "--max_seq_length", "2048",
                        "--save_strategy", "no", env=h100)  # (no checkpoints: the disk check is not this test's)
    assert taken.returncode == 0, taken.stderr


def test_a_native_run_gets_the_model_and_data_settings_as_a_run_in_the_image_does(env, tmp_path):
    """`invoke run --native` passed the trainer --model and --data given as flags only: with `model:` (or
    INVOKE_DOCKYARD_MODEL) set, the image's run trained that model, the native run the sample one, without a word,
    while the host's checks sized the setting's."""
    model = tmp_path / "base"
    model.mkdir()
    (model / "config.json").write_text((run_settings.TINY_MODEL / "config.json").read_text())
    data = tmp_path / "d.jsonl"
    data.write_text(a_step_of('{"text": "ships sail"}'))
    r = invoke_here("run", "--dry", "--native", env={**env, "INVOKE_DOCKYARD_MODEL": str(model),
                                                     "INVOKE_DOCKYARD_DATA": str(data)})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stderr.strip().splitlines()[-1])
    assert argv[argv.index("--model") + 1] == str(model) and argv[argv.index("--data") + 1] == str(data)
    flagged = invoke_here("run", "--dry", "--native", f"--model={model}", env=env)
    argv = shlex.split(flagged.stderr.strip().splitlines()[-1])
    assert argv.count("--model") == 1 and argv[argv.index("--model") + 1] == str(model)


@pytest.mark.parametrize("native", [False, True])
def test_an_input_path_holding_a_control_character_is_refused_natively_too(env, tmp_path, native):
    """`invoke run --native --data=<a name with ESC[31m>` was taken and printed raw (the terminal turned red); a run
    in the image refused it. Each way it is given (flag, override) is refused, naming it."""
    data = tmp_path / "a\x1b[31mred.jsonl"
    data.write_text(a_step_of('{"text": "ships sail"}'))
    flags = ["--native", "--cpu"] if native else []
    refused(dry(env, *flags, f"--data={data}"), "--data '" + str(tmp_path) + "/a\\x1b[31mred.jsonl': holds the control "
            "character '\\x1b'")
    refused(dry(env, *flags, "--", "--eval_data", str(data)), "-- --eval_data '")
    assert "\x1b" not in dry(env, *flags, f"--data={data}").stderr



CHAT_OK = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
           "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}


@pytest.mark.parametrize("key,turn,says", [
    ("conversations", {"from": "bot", "value": "4"}, "a turn of 'from' 'bot', which the sharegpt format does not take: "
                                                      "give one of system, human, user, gpt"),
    ("messages", {"role": None, "content": "4"}, "a turn of 'role' None, which the messages format does not take"),
    ("messages", {"content": "4"}, "a turn of no 'role', which the messages format does not take"),
    ("conversations", {"from": "\x1b[2Jbot", "value": "4"}, r"a turn of 'from' '\x1b[2Jbot', which"),
])
def test_a_chat_turn_of_a_role_the_trainer_refuses_is_named_by_its_file_and_line_before_the_run(env, tmp_path, key,
                                                                                                turn, says):
    """A ShareGPT `from` the trainer does not know, a `messages` turn without a role as text: `invoke run --dry`
    passed, and the trainer refused `example 3: a turn without a known 'from'` once the image had started and the
    model had loaded. The host's data checks name the file, its line and the role, in one line, before anything
    starts; a role the trainer takes (any text in `messages`: a warning there) is not refused."""
    from dockyard.common.errors import DockyardError
    from dockyard.train.data.formats import to_messages

    good, bad = {key: CHAT_OK[key]}, {key: [CHAT_OK[key][0], turn]}
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in [good, good, bad] + [good] * 17) + "\n")  # a step: 16
    r = dry(env, f"--data={data}")
    refused(r, f"{data}:3: {says}")
    assert r.stderr.count("\n") == 1, r.stderr  # one line
    fmt = "sharegpt" if key == "conversations" else "messages"
    with pytest.raises(DockyardError, match="a turn without a known"):  # the trainer's refusal of the same turn
        to_messages(bad, fmt, 3)
    assert dry(env, f"--data={data}", "--", "--data_format", fmt).returncode != 0  # the format named, not found
    data.write_text("\n".join(json.dumps(row) for row in [good] * 20) + "\n")
    assert dry(env, f"--data={data}").returncode == 0
    if key == "messages":  # a role of its own: the trainer takes it, and says it is not learned
        narrated = {"messages": [{"role": "narrator", "content": "A quiz."}, *CHAT_OK["messages"]]}
        data.write_text("\n".join(json.dumps(row) for row in [good, narrated] * 10) + "\n")
        assert dry(env, f"--data={data}").returncode == 0


def test_whether_an_image_has_liger_is_read_from_its_lock_as_every_package_is(monkeypatch, tmp_path, settings):
    """liger_absent read the image's lock with a substring test of its own ("\\nliger-kernel=="), where report_to's and
    optim's checks ask preflight.installed (the lock's pins by canonical name, PEP 503): a lock naming it another way
    pip writes (Liger_Kernel==, or on the lock's first line) was "the image has no liger-kernel" to the one and pinned to
    the other. Now one reading: for every variant, and for such a lock."""
    from dockyard.images import variants
    from dockyard.launch import preflight

    for v in variants.all_variants(settings).values():  # the real locks: cpu has none, the CUDA images pin it
        pinned = preflight.installed(v)
        assert (preflight.liger_absent(True, v) == "") == bool(pinned and "liger-kernel" in pinned.packages), v.name
    lock = tmp_path / "lock.txt"
    monkeypatch.setattr(variants.Variant, "lock_file", property(lambda self: lock))
    cu = variants.resolve(settings, "cu132")[0]
    for text in ("liger-kernel==0.8.5 \\\n    --hash=sha256:ab\ntorch==2.9.0\n", "torch==2.9.0\nLiger_Kernel==0.8.5\n"):
        lock.write_text(text)
        assert preflight.liger_absent(True, cu) == "", text
    lock.write_text("torch==2.9.0\n    #   liger-kernel\n")  # named in a comment (what needs it), not pinned
    assert "the cu132 image has no liger-kernel" in preflight.liger_absent(True, cu)
    assert preflight.liger_absent(False, cu).startswith("this run trains on CPU")
