"""Training data: files or a cached hub dataset → rows → tokenized examples, and the collator that pads them.

Read through `datasets`, offline: a .jsonl/.json, .parquet, .csv or .txt file, a folder of files of one kind,
or a hub id (`org/name`) already in the local Hugging Face cache. The format is found from the fields of the
rows (or named with the `data_format` setting):

| format            | fields                                   | the loss counts                         |
|-------------------|------------------------------------------|-----------------------------------------|
| text              | text                                     | every token                             |
| prompt_completion | prompt, completion                       | the completion                          |
| messages          | messages: [{role, content}, ...]         | the assistant turns (chat template)     |
| alpaca            | instruction, [input], output             | the output (as a user → assistant chat) |
| sharegpt          | conversations: [{from, value}, ...]      | the gpt/assistant turns                 |
| text_label        | text, label (task seq_cls)               | the class                               |
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import random
import re
import reprlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockyard.common import disk, tree
from dockyard.common.data_files import (
    BUILDERS,
    FORMATS,
    HOLDS,
    HUB_ID,
    MAX_FIELDS,
    NESTED,
    another_kind,
    data_files_in,
    first_example,
    format_of,
    held_out,
    holds_text,
    left_out,
    mixed_formats,
    named_twice,
    not_an_object,
    not_examples,
    not_utf8,
    other_format,
    parquet_decoded,
    saved_by_datasets,
    too_deep,
    too_wide,
    unknown_format,
    unknown_type,
    valued,
)
from dockyard.common.errors import DockyardError, Stopped, causes, loads
from dockyard.common.units import human
from dockyard.train.guards import host_memory_available

log = logging.getLogger("dockyard.train.data")  # the same on every rank: said by rank 0 alone (logs.setup_logging)

IGNORE = -100  # label value the loss skips

CHAT_FORMATS = ("messages", "alpaca", "sharegpt")
TEXT_FIELDS = ("text", "prompt", "completion", "instruction", "input", "output")  # a string each
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "tool": "tool", "function_call": "assistant", "observation": "tool"}
ALPACA_PROMPT = "{instruction}\n\n{input}"
MAX_CLASSES = 1 << 16  # a classifier's outputs: more is an id read as a class number (a head of 10^12 outputs)

# For a tokenizer without a chat template of its own (the tiny sample model, base models): role tags, the
# assistant turn ended by the EOS token. It is saved with the trained model, so inference uses the same one.
FALLBACK_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def load(settings: Any, tokenizer: Any, seed: int,
         packing: Callable[[str], tuple[bool, str]] = lambda fmt: (False, "")) -> Loaded:
    """The run's data (`data`, `data_format`, `eval_data` or `eval_fraction`, `task`, `max_seq_length`); `packing`
    decides from the format whether text documents are joined into blocks (autos.resolve_packing), and why."""
    source = str(settings.data_path)
    rows = read_rows(source)
    fmt = detect_format(rows, settings.task, settings.data_format, source)
    packed, why = packing(fmt)
    eval_rows: list[dict[str, Any]] = []
    if settings.eval_data:
        eval_rows = read_rows(settings.eval_data)
        if other := other_format(settings.eval_data, valued(eval_rows[0]), fmt, source):
            raise other
        detect_format(eval_rows, settings.task, fmt, settings.eval_data)
    elif settings.eval_fraction:
        rows, eval_rows = split(rows, settings.eval_fraction, seed)
    eval_source = settings.eval_data or (f"{settings.eval_fraction:g} of the data" if eval_rows else "")
    info: dict[str, Any] = {"source": source, "format": fmt, "eval_source": eval_source}
    if eval_rows:  # a split keeps copies of a row on one side: only a file of its own can repeat training examples
        info["eval_in_training"] = seen = in_training(rows, eval_rows) if settings.eval_data else 0
        if seen:
            log.warning("%d of the %d evaluation examples (%s) are also training examples: eval_loss measures how "
                        "well they were learnt, not how the model does on examples it has not seen; give held-out "
                        "data (-- --eval_data FILE) that is not in --data", seen, len(eval_rows), eval_source)
    if fmt == "text_label":
        labels = label_names(rows)
        # transformers makes a head of one output a regression (MSE), which trained unsaid; a class the held-out share
        # took whole is said below, as such
        if len(labels) < 2 and len(label_names(rows + (eval_rows if settings.eval_fraction else []))) < 2:
            raise DockyardError(f"{source}: every example has label {reprlib.repr(rows[0]['label'])}, and a classifier "
                                "needs examples of 2 classes or more (with one, transformers would train a regression "
                                "instead); add examples of the other classes")
        done = seq_cls_examples(rows, tokenizer, settings.max_seq_length, labels)
        try:
            held = seq_cls_examples(eval_rows, tokenizer, settings.max_seq_length, labels) if eval_rows else Tokenized([])
        except DockyardError as e:
            if not settings.eval_fraction:
                raise
            raise DockyardError(f"{e}: the held-out share (eval_fraction {settings.eval_fraction:g}) took every "
                                "example of it; give it more examples, a smaller --eval_fraction, or held-out data of "
                                "your own (-- --eval_data FILE)") from None
    elif packed:
        labels = []
        done = Tokenized(pack_text(rows, tokenizer, settings.max_seq_length))
        held = Tokenized(pack_text(eval_rows, tokenizer, settings.max_seq_length) if eval_rows else [])
        log.info("packing: %d documents joined into %d blocks of up to %d tokens", len(rows), len(done.examples),
                 settings.max_seq_length)
    else:
        labels = []
        # "example 2: no assistant turn" named no file: the training data's is said as the evaluation data's is
        done = tokenize(rows, fmt, tokenizer, settings.max_seq_length, what=source if not settings.eval_fraction
                        else f"the training share of {source}")
        held = (tokenize(eval_rows, fmt, tokenizer, settings.max_seq_length, what=f"the evaluation data "
                         f"({eval_source})") if eval_rows else Tokenized([]))
    for what, got, total in (("", done, len(rows)), ("eval_", held, len(eval_rows))):
        info.update({f"{what}truncated": got.truncated, f"{what}dropped": got.dropped})
        say_cut(got, total, settings.max_seq_length, fmt, "evaluation " if what else "")
    train, evals = done.examples, held.examples
    info.update(examples=len(train), eval_examples=len(evals), packed=packed)
    log.info("data %s: format %s, %d training examples, %d for evaluation", source, fmt, len(train), len(evals))
    return Loaded(train, evals, labels, info, (packed, why))


def say_cut(done: Tokenized, total: int, max_len: int, fmt: str, which: str) -> None:
    """A warning for examples cut at max_seq_length, and for those dropped: nothing left to learn from (an empty
    text, a prompt as long as max_seq_length), so that no example leaves the run without a word."""
    if done.truncated:
        if fmt == "text_label":
            fix = "raise it with -- --max_seq_length N; a classifier sees only the first max_seq_length tokens"
        else:
            join = " or join the documents into full blocks: -- --packing true" if fmt == "text" else ""
            fix = f"raise it with -- --max_seq_length N{join}"
        log.warning("%d of %d %sexamples are longer than max_seq_length=%d and were cut: %s", done.truncated, total,
                    which, max_len, fix)
    if done.other_roles:
        said = ", ".join(f"{role!r} in {count} example(s)" for role, count in sorted(done.other_roles.items())[:5])
        log.warning("chat turns of roles other than system, user, assistant and tool in the %sdata (%s): the model "
                    "reads them as context and never learns them; where they are the assistant's, name them "
                    "'assistant'", which, said)
    if done.dropped:
        log.warning("%d of %d %sexamples were left out: they hold no token to learn from (empty, or nothing of "
                    "theirs to learn within max_seq_length=%d)", done.dropped, total, which, max_len)


def in_training(rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]]) -> int:
    """How many evaluation examples are also training examples (the same fields and values)."""
    train = {row_key(r) for r in rows}
    return sum(row_key(r) in train for r in eval_rows)


def row_key(row: dict[str, Any]) -> str:
    """The row's filled fields: a field of no value and a field left out are one (a .csv's empty cell, JSON's null)."""
    return json.dumps({k: v for k, v in row.items() if v is not None}, sort_keys=True, default=str)


@dataclass
class Loaded:
    """The training (and evaluation) examples of a run, with what the manifest says about them."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    labels: list[str]                  # class names (seq_cls), else []
    info: dict[str, Any]
    packing: tuple[bool, str]          # text documents joined into blocks, and why (settings_resolved)


def read_rows(source: str | Path) -> list[dict[str, Any]]:
    """Every row of a file, a folder of files of one kind, or a cached hub dataset (its train split)."""
    text = str(source)
    path = Path(text)
    if path.exists():
        files = _files(path)
        builder = BUILDERS[files[0].suffix]
        # a .txt file's byte order mark is no text of its first line (JSON Lines and CSV files read past it already)
        bom = {"encoding": "utf-8-sig"} if builder == "text" else {}
        rows = (read_csv(files) if builder == "csv" else _load(text, builder, data_files=[str(f) for f in files], **bom))
        if builder == "text":
            rows = [r for r in rows if (r.get("text") or "").strip()]
    elif HUB_ID.fullmatch(text):
        rows = _load(text, _hub_snapshot(text) or text)
    else:
        raise DockyardError(f"no data at {text}: give a .jsonl, .json, .parquet, .csv or .txt file, a folder of "
                            f"them, or a hub dataset id (org/name) that is in the local Hugging Face cache")
    if not rows:
        raise DockyardError(f"{text} holds no examples")
    return rows


def _files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix not in BUILDERS:
            raise DockyardError(f"{path}: unknown data file type {path.suffix or '(none)'}{unknown_type(path.suffix)}; "
                                f"use {', '.join(BUILDERS)}")
        return [path]
    if not path.is_dir():
        raise DockyardError(f"{path}: neither a file nor a folder (a device, pipe or socket): give a data file, or a "
                            "folder of them")
    if saved := saved_by_datasets(path):
        raise DockyardError(f"{path}: {saved}")
    files = data_files_in(path)
    if not files:
        raise DockyardError(f"no data at {path}: the folder holds no {', '.join(BUILDERS)} file")
    if skipped := left_out(path):
        log.warning("%s: not read (only %s files not hidden are data): %s", path, ", ".join(BUILDERS), ", ".join(skipped[:10])
                    + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""))
    kinds = {BUILDERS[f.suffix] for f in files}
    if len(kinds) > 1:
        raise DockyardError(f"{path} mixes data files of different kinds ({', '.join(sorted(kinds))}): "
                            f"keep one kind per folder, or point --data at one file")
    return files


CSV_FIELD_LIMIT = 1 << 30  # characters in one cell (csv's own limit, 131072, is a long document)


def read_csv(files: list[Path]) -> list[dict[str, Any]]:
    """Rows of .csv files with a header line, every cell the text written (not pandas' guesses: `4` as a number,
    `NA`, `null` or `true` as no value or a bool), an empty cell left out as no value (a row held every column of the
    header: 2,000 empty columns made a 20 MB file 540 MB in every process); a row of more or fewer cells than its
    header names is refused by its line (pandas took a row with one cell too many, an unquoted comma, as an index
    and dropped its first cell without a word). A `label` column of whole numbers only is class numbers."""
    csv.field_size_limit(CSV_FIELD_LIMIT)
    rows: list[dict[str, Any]] = []
    header: list[str] = []
    for f in files:
        try:
            with open(f, encoding="utf-8-sig", newline="") as lines:
                reader = csv.reader(lines)
                names = next(reader, None)
                if not names:
                    continue
                names = [n.strip() for n in names]  # `prompt, completion`: the space is no part of the name
                if twice := named_twice(f, names):  # a dict keeps the last, unsaid
                    raise DockyardError(twice)
                if header and sorted(names) != sorted(header):
                    raise DockyardError(f"{f} has the fields {','.join(names)} but {files[0].name} has "
                                        f"{','.join(header)}: keep one kind of row per folder")
                header = header or names
                ended = reader.line_num  # the line the row before ended on
                for cells in reader:
                    started, ended = ended + 1, reader.line_num
                    if not any(c.strip() for c in cells):
                        continue  # a blank line
                    if len(cells) != len(names):
                        if len(cells) < len(names) and any("\n" in c for c in cells):  # a quote never closed
                            raise DockyardError(f"{f}:{started}: a double quote opened on this line is never closed "
                                                "(its cell ran on over the lines after it): close it, or write a "
                                                'quote inside a cell as two ("")')
                        raise DockyardError(
                            f"{f}:{reader.line_num}: {len(cells)} cells, but the header names {len(names)} "
                            f"({','.join(names)}): put a cell that holds a comma (or a line break) in double quotes, "
                            'as in "Where is it, exactly?",Bergen')
                    rows.append({k: v for k, v in zip(names, cells, strict=True) if v != "" and k})  # k "": no field
        except UnicodeDecodeError as e:
            if said := another_kind(f):
                raise DockyardError(said) from None
            where = _bad_utf8_line([str(f)])  # its line, as the host names it (its byte was within a block)
            raise DockyardError(f"cannot read {where}" if where else f"cannot read {f}: it is not UTF-8 text "
                                f"({e.reason} at byte {e.start}); save it as UTF-8") from None
        except csv.Error as e:
            raise DockyardError(f"cannot read {f}: line {reader.line_num}: {e}") from None
    labels = [r.get("label") for r in rows]
    if header and "label" in header and all(x is not None and WHOLE.fullmatch(x) for x in labels):
        for r in rows:
            r["label"] = int(r["label"])
    return rows


WHOLE = re.compile(r"-?[0-9]+")


def _hub_snapshot(repo_id: str) -> str:
    """The folder of a hub dataset's files in the local cache (`hf download --repo-type dataset`), or ""."""
    import huggingface_hub

    try:
        return huggingface_hub.snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not a valid id): load_dataset's own cache is tried next
        return ""


def _parquet_rows(path: str) -> int | None:
    """The rows a parquet file's footer counts; None where it cannot be read."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - pyarrow raises its own kinds for a file that is not parquet
        return None


def _load(what: str, builder: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Rows through `datasets`, never over the network: runs are offline, and so are the tests."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)  # its ERROR lines on a bad file: the refusal below says it
    # each JSON and Parquet file, before pyarrow's reader, which would crash every process on one nested too deep or
    # take its memory on one of too many fields: those given, or every one of a cached hub dataset's snapshot
    given = kwargs["data_files"] if "data_files" in kwargs else (
        list(tree.files(Path(builder))) if os.path.isabs(builder) and Path(builder).is_dir() else [])
    for f in (f for f in given if Path(f).suffix in (".json", ".jsonl", ".parquet")):
        try:
            where = too_deep(Path(f)) if Path(f).suffix != ".parquet" else ""
            null = "" if where or Path(f).suffix == ".parquet" else _null_first(Path(f))
            odd = "" if where or null or Path(f).suffix == ".parquet" else not_examples(Path(f))
            if not (where or null or odd) and Path(f).suffix == ".jsonl":
                # its first example as the host reads it: `datasets`, where pyarrow refuses a file of one line (a
                # field named twice), reads its object as columns, a chat's turns as rows of one turn each
                first_example(Path(f))
            wide = [] if where or null or odd else too_wide(Path(f))
        except OSError as e:
            raise DockyardError(f"cannot read {f}: {e.strerror or e}") from None
        if where:
            raise DockyardError(f"cannot read {where}: {NESTED}")
        if null:
            raise DockyardError(f"cannot read {null}: null, not an object; each line must be one JSON object")
        if odd:
            raise DockyardError(odd)
        if wide:
            raise too_many_fields(f, wide)
    if parquet := [Path(f) for f in given if Path(f).suffix == ".parquet"]:
        check_decoded_size(parquet)
    try:
        table = datasets.load_dataset(builder, split="train", **kwargs)
        if table.num_columns > MAX_FIELDS:  # a cached hub dataset, read before it is made rows
            raise too_many_fields(what, table.column_names)
        return table.to_list()  # to_list: the rows decoded
    except Exception as e:  # noqa: BLE001 - datasets/pyarrow raise many types for a malformed or missing source
        if ours := next((c for c in causes(e) if isinstance(c, (DockyardError, Stopped))), None):
            raise ours from None  # a stop from within datasets' work (torchrun's SIGTERM), said as it is
        if disk.disk_full(e, Path(datasets.config.HF_DATASETS_CACHE), by_free_space=False):  # its errors keep the errno
            raise _cache_full(what, kwargs.get("data_files", []), e) from None
        if "data_files" not in kwargs:
            raise DockyardError(f"dataset {what} is not in the local Hugging Face cache (runs are offline): on a "
                                f"machine with internet, `hf download --repo-type dataset {what}`, then copy its "
                                f"~/.cache/huggingface to this host's hf_cache") from None
        if not any(_holds_text(f) for f in kwargs["data_files"]):
            raise DockyardError(f"{what} holds no examples (the file is empty)") from None
        if builder == "parquet" and all(_parquet_rows(f) == 0 for f in kwargs["data_files"]):
            # pyarrow's own words were "BatchSize must be greater than 0, got 0"
            raise DockyardError(f"{what} holds no examples (its table has no rows)") from None
        # a .json file's array: "Invalid octet in UTF-8 sequence when decoding 'string' at position 25"
        if isinstance(e.__cause__ or e, UnicodeDecodeError) or "in UTF-8 sequence" in _first_line(e):
            where = _bad_utf8_line(kwargs["data_files"])
            raise DockyardError(f"cannot read {where}" if where else f"cannot read {what}: it is not UTF-8 text "
                                f"({_first_line(e)}); save it as UTF-8") from None
        if builder == "json" and (mixed := mixed_formats([Path(f) for f in kwargs["data_files"]])):
            raise mixed from None
        if builder == "json" and any(type(c).__name__ == "CastError" for c in causes(e)) and (
                where := _new_field_line(kwargs["data_files"])):
            raise DockyardError(f"cannot read {where}: `datasets` reads the data as one table, of the fields of its "
                                "first rows; give every row the same fields (null where one has no value), or drop "
                                "the new one") from None
        where = _bad_json_line(kwargs["data_files"]) if builder == "json" else ""
        # a line found bad is said in Python's words, with its line number (pyarrow's: "Invalid encoding in
        # string. in row 10", for an unterminated string on line 11)
        raise DockyardError(f"cannot read {where}" if where else f"cannot read {what}: {_first_line(e)}") from None


def _null_first(path: Path) -> str:
    """FILE:LINE of a JSON (Lines) file whose first value is a bare `null`, or "": `datasets` crashed the process on it
    (SIGSEGV, not a word of the file), where `invoke run` refuses the line on the host (a cached hub dataset is not
    read there)."""
    with open(path, "rb") as lines:
        for n, line in enumerate(lines, 1):
            if text := line.removeprefix(b"\xef\xbb\xbf" if n == 1 else b"").strip():
                return f"{path}:{n}" if text == b"null" else ""
    return ""


def check_decoded_size(files: list[Path]) -> None:
    """Parquet files whose rows, decoded, would not fit in this node's free memory once in each of its processes
    (every rank reads the data): refused before `datasets` decodes them, where the OOM killer would end the run."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    free = host_memory_available()
    decoded = 0
    for f in files:
        decoded += parquet_decoded(f, free // processes - decoded)
        if decoded * processes > free:
            on_disk = sum(f.stat().st_size for f in files)
            raise DockyardError(
                f"cannot read {files[0] if len(files) == 1 else f'the {len(files)} Parquet files'} "
                f"({human(on_disk)} of Parquet): its rows decode to more than {human(decoded)}, held by each of "
                f"this node's {processes} process(es), and the node has {human(free)} free "
                "(container limit included); train on a part of it, on fewer processes, or give the node more memory")


def too_many_fields(what: str, names: list[str]) -> DockyardError:
    named = ", ".join(n if n.isprintable() and len(n) <= 64 else ascii(n[:64]) for n in names[:5])
    return DockyardError(f"cannot read {what}: its rows name more than {MAX_FIELDS:,} different fields ({named}, ...); "
                         "`datasets` makes a table of a column for each, every row holding them all (gigabytes of "
                         "memory from a file of kilobytes): keep the fields your data format reads (docs/data.md)")


def _cache_full(what: str, files: list[str], error: BaseException) -> DockyardError:
    """`datasets` writes an Arrow copy of the data into its cache (HF_HOME's datasets/) before the run reads it: a disk
    that fills there is the cache's, not the data's, and says where and what would fix it."""
    import datasets

    cache = Path(datasets.config.HF_DATASETS_CACHE)
    try:
        free = disk.free_bytes(cache)
    except OSError:
        free = None
    about = sum(Path(f).stat().st_size for f in files if Path(f).is_file())
    room = (f" (about {disk.size(about)}, the data's size, and {disk.size(free)} is free there)"
            if about and free is not None else "")
    root = causes(error)[-1]  # the OSError itself, not the library's wrapper around it
    return DockyardError(f"the disk of the Hugging Face cache ({cache}) ran out of space while `datasets` wrote its "
                         f"Arrow copy of {what} there{room}: free space on that disk, or point the cache at a bigger "
                         "one (invoke run: the hf_cache setting, INVOKE_DOCKYARD_HF_CACHE; natively: HF_HOME). The "
                         f"error: {type(root).__name__}: {root}")


def _holds_text(file: str) -> bool:
    """holds_text, a file this process may not read (the run's uid) or a failing disk said in one line."""
    try:
        return holds_text(Path(file))
    except OSError as e:
        raise DockyardError(f"cannot read {file}: {e.strerror or e}") from None


def _bad_utf8_line(files: list[str]) -> str:
    """FILE:LINE (column) of the first byte that is not UTF-8, or "": pyarrow's "position 3" was within a block."""
    for f in files:
        with open(f, "rb") as lines:
            for n, line in enumerate(lines, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    return f"{f}:{n} {not_utf8(line, e)}"
    return ""


def _new_field_line(files: list[str]) -> str:
    """FILE:LINE and the fields of the first JSON Lines row with a field the first row has not, or "": pyarrow's
    "Couldn't cast" (a row's new field past the first block of a file, or in a folder's later file) named neither."""
    first: set[str] | None = None
    for f in files:
        if not f.endswith(".jsonl"):
            continue
        with open(f, encoding="utf-8-sig", errors="replace") as lines:
            for n, line in enumerate(lines, 1):
                try:
                    row = loads(line) if line.strip() else None
                except json.JSONDecodeError:
                    continue
                if not isinstance(row, dict):
                    continue
                if first is None:
                    first, at = set(row), f"{Path(f).name}:{n}"
                elif new := sorted(set(row) - first):
                    return f"{f}:{n}: it has the field{'s' * (len(new) > 1)} {', '.join(new[:5])}, which {at} has not"
    return ""


def _bad_json_line(files: list[str]) -> str:
    """FILE:LINE and what is wrong with the first line of a JSON Lines file that is not a JSON object, or ""."""
    for f in files:
        if not f.endswith(".jsonl"):
            continue
        with open(f, encoding="utf-8-sig", errors="replace") as lines:  # a BOM is no fault of the first line
            for n, line in enumerate(lines, 1):
                if why := not_an_object(line):
                    return f"{f}:{n}: {why}"
    return ""


def _first_line(e: BaseException) -> str:
    cause = e.__cause__ or e
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]


def detect_format(rows: list[dict[str, Any]], task: str, named: str = "auto", source: str = "data") -> str:
    """The format named in the recipe, or the one the fields of the first rows say; checked on every row."""
    # datasets gives every row every column of the file: a missing field is None. The fields some of the first rows
    # fill: a first row with an empty cell is then "example 1 lacks completion", not a format of no name
    found = sorted({k for row in rows[:FORMAT_ROWS] for k in valued(row)})
    if task == "seq_cls" or named == "text_label":
        fmt, need = "text_label", ("text", "label")
    elif named != "auto":
        fmt, need = named, FORMATS[named]
    else:
        fmt = format_of(found)
        if not fmt:  # a format's field null in every first row (so in the first): said as null, not unknown
            raise unknown_format(source, found, sorted({k for row in rows[:FORMAT_ROWS] for k in row}), "example 1")
        need = FORMATS[fmt]
        if fmt == "text" and "label" in found:
            log.warning("%s has a label field, which causal language modelling does not read (it trains on the text "
                        "alone): to train a classifier, add --task seq_cls", source)
    say_unread(source, fmt, need, [k for k in found if not (fmt == "text" and k == "label")])
    # the fields read as text: a number or a list there (token ids, a column shifted) would train on its digits
    texts = [k for k in (*need, *(("input",) if fmt == "alpaca" else ())) if k in TEXT_FIELDS]
    for n, row in enumerate(rows, 1):
        missing = [k for k in need if row.get(k) is None]
        if missing and not valued(row):  # was "lacks text (fields found: ; ...)"
            raise DockyardError(f"{source}: example {n} has no field with a value (a line `null` or `{{}}`, or every "
                                f"field null): remove it, or give it {', '.join(need)} as the {fmt} format needs")
        if missing:
            raise DockyardError(f"{source}: example {n} lacks {', '.join(missing)} for the {fmt} format "
                                f"(fields found: {', '.join(valued(row))}; expected: {', '.join(need)})")
        odd = next((k for k in texts if row.get(k) is not None and not isinstance(row[k], str)), None)
        if odd:
            raise DockyardError(f"{source}: example {n}'s {odd} is {type(row[odd]).__name__} {str(row[odd])[:40]!r}, "
                                f"not text: the {fmt} format trains on the words of {odd} (token ids are not read; "
                                "write the text itself)")
    return fmt


FORMAT_ROWS = 1000  # the rows whose fields name the format
OPTIONAL = {"alpaca": ("input", "system")}  # fields a format reads where a row has them


def say_unread(source: str, fmt: str, need: tuple[str, ...], found: list[str]) -> None:
    """A warning naming the fields the format leaves out of training: a prompt_completion row's `system` prompt was
    dropped without a word."""
    read = (*need, *OPTIONAL.get(fmt, ()))
    unread = [k for k in found if k not in read]
    if not unread:
        return
    hint = (": to train with a system prompt, write it into each prompt or write the rows as messages"
            if fmt == "prompt_completion" and "system" in unread else "")
    # the data's own names: no terminal escapes, and a file of thousands of keys is not a line of thousands
    named = ", ".join(k if k.isprintable() and len(k) <= 64 else ascii(k[:64]) for k in unread[:8])
    more = f" and {len(unread) - 8} more" if len(unread) > 8 else ""
    log.warning("%s: the %s format reads %s; the field%s %s%s %s not trained on%s (docs/data.md)", source, fmt,
                ", ".join(read), "s" * (len(unread) > 1), named, more, "are" if len(unread) > 1 else "is", hint)


CHAT_ROLES = {"system", "user", "assistant", "tool"}  # those every chat template knows; only the assistant's are learned


def to_messages(row: dict[str, Any], fmt: str, n: int) -> list[dict[str, str]]:
    """An Alpaca or ShareGPT row as chat messages; a `messages` row checked."""
    if fmt == "alpaca":
        prompt = ALPACA_PROMPT.format(**row) if row.get("input") else str(row["instruction"])
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(row["output"])}]
        if row.get("system"):
            messages.insert(0, {"role": "system", "content": str(row["system"])})
        return messages
    turns = row["conversations"] if fmt == "sharegpt" else row["messages"]
    role_key, text_key = ("from", "value") if fmt == "sharegpt" else ("role", "content")
    key = "conversations" if fmt == "sharegpt" else "messages"
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise DockyardError(f"example {n}: `{key}` must be a list of {{{role_key!r}: ..., {text_key!r}: ...}} objects")
    if not turns:  # was "no assistant turn, so nothing to learn (roles found: ; ...)"
        raise DockyardError(f"example {n}: `{key}` is an empty list, where the {fmt} format needs {HOLDS[key]}: fill "
                            "it in, or leave the example out")
    messages = []
    for t in turns:
        role, content = t.get(role_key), t.get(text_key)
        if fmt == "sharegpt":
            role = SHAREGPT_ROLES.get(str(role))
        if not isinstance(role, str) or not isinstance(content, str):
            raise DockyardError(f"example {n}: a turn without a known {role_key!r} or a text {text_key!r} ({t!r:.120})")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        roles = ", ".join(sorted({m["role"] for m in messages}))
        raise DockyardError(f"example {n}: no assistant turn, so nothing to learn (roles found: {roles}; the "
                            f"assistant's turns are {'gpt' if fmt == 'sharegpt' else 'assistant'})")
    if messages[0]["role"] == "assistant":  # its prompt would be the empty conversation, which templates refuse
        raise DockyardError(f"example {n}: the conversation opens with an assistant turn, which answers nothing; start "
                            "it with the user's turn (or a system prompt), or drop that first turn")
    return messages


@dataclass
class Tokenized:
    examples: list[dict[str, Any]]
    truncated: int = 0     # examples cut at max_seq_length
    dropped: int = 0       # examples with no token left to learn from after the cut
    other_roles: dict[str, int] = field(default_factory=dict)  # chat roles the loss never learns: examples of each


def causal_lm_examples(rows: list[dict[str, Any]], tokenizer: Any, max_len: int,
                       fmt: str = "auto") -> list[dict[str, list[int]]]:
    return tokenize(rows, fmt if fmt != "auto" else detect_format(rows, "causal_lm"), tokenizer, max_len).examples


def tokenize(rows: list[dict[str, Any]], fmt: str, tokenizer: Any, max_len: int, what: str = "") -> Tokenized:
    """input_ids and labels (IGNORE where the loss must not count) for every row of a causal-LM format."""
    if fmt in CHAT_FORMATS and not tokenizer.chat_template:
        log.info("the tokenizer has no chat template: using dockyard's plain one (saved with the model)")
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = Tokenized([])
    for n, row in enumerate(rows, 1):
        try:
            if fmt == "text":
                ids = text_tokens(row, tokenizer, eos, max_len)
                labels = list(ids)
            elif fmt == "prompt_completion":
                prompt = head_tokens(tokenizer, str(row["prompt"]), max_len, add_special_tokens=True)
                completion = head_tokens(tokenizer, str(row["completion"]), max_len, add_special_tokens=False) + eos
                ids, labels = prompt + completion, [IGNORE] * len(prompt) + completion
            else:
                messages = to_messages(row, fmt, n)
                ids, labels = chat_tokens(messages, tokenizer, n, max_len)
                for role in {m["role"] for m in messages} - CHAT_ROLES:
                    out.other_roles[role] = out.other_roles.get(role, 0) + 1
        except CannotEncode as e:
            raise DockyardError(f"{what + ': ' if what else ''}example {n}: {e}") from None
        except DockyardError as e:  # "example 3" of the evaluation data read as the training data's third
            if not what or fmt not in CHAT_FORMATS:
                raise
            raise DockyardError(f"{what}: {e}") from None
        if len(ids) > max_len:
            out.truncated += 1
            ids, labels = ids[:max_len], labels[:max_len]
        if any(label != IGNORE for label in labels[1:]):
            out.examples.append({"input_ids": ids, "labels": labels})
        else:
            out.dropped += 1
    if not out.examples:
        if not out.truncated:  # nothing was cut: a longer max_seq_length cannot help
            raise DockyardError(f"no example{' of ' + what if what else ''} has a token to learn from: every one is "
                                "empty, or (prompt_completion, chat) has nothing to learn after its prompt; check "
                                "the data (docs/data.md)")
        raise DockyardError(f"no example{' of ' + what if what else ''} has a token to learn from within "
                            f"max_seq_length={max_len}: raise it (-- --max_seq_length 2048)")
    return out


# characters of a document tokenized when only its first max_len tokens are kept: a token is rarely 8 characters,
# never 64; a whole book on one line (tens of MB) took GBs of memory per process to be cut to 128 tokens
CHARS_PER_TOKEN_BOUND = 64


def text_tokens(row: dict[str, Any], tokenizer: Any, eos: list[int], keep: int = 0) -> list[int]:
    """A text document's tokens: the tokenizer's special tokens (BOS), then its EOS (`eos`, [] without one).
    `keep`: only the first `keep` tokens are used (the rest are cut), so a long document's head alone is read; 0:
    all of it (packing), a long one read in pieces."""
    text = str(row["text"])
    ids = head_tokens(tokenizer, text, keep, add_special_tokens=True) if keep else piecewise_tokens(tokenizer, text)
    return ids if keep and len(ids) > keep else ids + eos


# characters tokenized in one call where a document is read whole (packing): the tokenizer holds ~200 bytes per
# character while it works, so one 14 MB document (a book on one line) took 3 GB in every process
PIECE_CHARS = 1 << 20


def piecewise_tokens(tokenizer: Any, text: str) -> list[int]:
    """`text`'s tokens with the tokenizer's special tokens, a long text tokenized a piece at a time (PIECE_CHARS
    at most), each cut where a run of whitespace begins, so no word and no run of newlines is split (the tokens of
    a word keep the space before it): the same tokens as a whole read, for tokenizers that split text at
    whitespace before they merge (byte-level BPE, SentencePiece's Llama 3 and later)."""
    if len(text) <= PIECE_CHARS:
        return encode(tokenizer, text, add_special_tokens=True)
    ids: list[int] = []
    start = 0
    while start < len(text):
        end = len(text) if len(text) - start <= PIECE_CHARS else _piece_end(text, start)
        ids += encode(tokenizer, text[start:end], add_special_tokens=False)
        start = end
    first = text[:min(len(text), 64)]  # the special tokens around a text: where its plain tokens sit in its full ones
    plain, full = (encode(tokenizer, first, add_special_tokens=s) for s in (False, True))
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    return full[:at] + ids + full[at + len(plain):]


def _piece_end(text: str, start: int) -> int:
    """Where the piece of `text` from `start` ends: before the last run of whitespace that begins in its
    PIECE_CHARS (a newline's first, else a space's), or at PIECE_CHARS where it holds none."""
    stop = start + PIECE_CHARS
    cut = max(text.rfind("\n", start + 1, stop), 0) or max(text.rfind(" ", start + 1, stop), 0)
    if not cut:
        return stop
    while cut > start + 1 and text[cut - 1].isspace():
        cut -= 1
    return cut


def head_tokens(tokenizer: Any, text: str, keep: int, **kwargs: Any) -> list[int]:
    """`text`'s tokens, or where only its first `keep` are used (0: all) and it is long, those of its head alone:
    more tokens than are kept, which the example is cut to as a whole would be. A prompt, a chat turn or a
    classifier's text of 15 MB (one field) took 4 GB per process to keep 128 tokens."""
    return read_head(tokenizer, text, keep, **kwargs)[1]


def read_head(tokenizer: Any, text: str, keep: int, **kwargs: Any) -> tuple[str, list[int]]:
    """(the text head_tokens read, its tokens)."""
    if keep and len(text) > keep * CHARS_PER_TOKEN_BOUND:
        head = text[:keep * CHARS_PER_TOKEN_BOUND]
        ids = encode(tokenizer, head, **kwargs)
        if len(ids) > keep:
            return head, ids
    return text, encode(tokenizer, text, **kwargs)


class CannotEncode(DockyardError):
    """The model folder's tokenizer failed on a text (said with the example's number by the caller)."""


def encode(tokenizer: Any, text: str, **kwargs: Any) -> list[int]:
    """`text`'s token ids. A tokenizer that fails on it is the model folder's: its tokenizer.json's regex past the
    backtracking limit (a Rust panic, which is a BaseException), a WordPiece vocabulary without its [UNK], ... were a
    traceback of hundreds of lines on every rank."""
    try:
        return tokenizer(text, **kwargs)["input_ids"]
    except (KeyboardInterrupt, SystemExit, TooSlow, Stopped, DockyardError):
        raise
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException derives from BaseException alone
        raise CannotEncode(f"the model's tokenizer cannot encode it ({type(e).__name__}: {_first_line(e)}): check "
                           "tokenizer.json and tokenizer_config.json in the model folder, or use the model's own "
                           "tokenizer files") from None


def pack_text(rows: list[dict[str, Any]], tokenizer: Any, max_len: int) -> list[dict[str, list[int]]]:
    """Text documents as pretraining reads them: each tokenized as the text format does (its special tokens, EOS
    at its end), all joined into one stream, cut into blocks of `max_len` tokens; the last block holds what is left
    (shorter: the collator pads it). No token is padding and none is cut away. A block's tokens attend to the
    documents before them in the block, the EOS marking where each ends."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    blocks: list[list[int]] = []
    rest: list[int] = []  # the stream not yet cut (less than a block between documents): never held whole
    for n, row in enumerate(rows, 1):
        try:
            rest += text_tokens(row, tokenizer, eos)
        except CannotEncode as e:
            raise DockyardError(f"example {n}: {e}") from None
        cut = len(rest) - len(rest) % max_len
        blocks += [rest[i:i + max_len] for i in range(0, cut, max_len)]
        del rest[:cut]
    blocks.append(rest)
    out = [{"input_ids": b, "labels": list(b)} for b in blocks if len(b) > 1]  # one token predicts nothing
    if not out:
        raise DockyardError("the text data holds no token to learn from")
    return out


def chat_tokens(messages: list[dict[str, str]], tokenizer: Any, n: int, keep: int = 0) -> tuple[list[int], list[int]]:
    """The conversation through the chat template, learning only the assistant turns: each turn's text is
    what the template adds to the conversation so far (templates render a conversation as a prefix of its
    continuation), tokenized on its own; `keep`: only the first `keep` tokens are used (0: all)."""
    def render(msgs: list[dict[str, str]], generation_prompt: bool) -> str:
        try:
            with time_limit(RENDER_SECONDS), memory_limit(RENDER_BYTES):
                return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)
        except TooSlow:
            raise DockyardError(f"example {n}: the model's chat template took more than {RENDER_SECONDS} s to render "
                                f"one conversation (a loop without end?): {CHECK_TEMPLATE}") from None
        except MemoryError:
            raise DockyardError(f"example {n}: the model's chat template took more than {human(RENDER_BYTES)} of "
                                f"memory to render one conversation (a string without end?): {CHECK_TEMPLATE}") from None
        except Exception as e:  # noqa: BLE001 - a template raises what it likes (jinja2's TemplateError, mostly)
            raise DockyardError(f"example {n}: the model's chat template refuses this conversation: "
                                f"{_first_line(e)}") from None

    if len(messages) > MAX_TURNS:  # each assistant turn renders the conversation so far: work grows as its square
        raise DockyardError(f"example {n}: {len(messages):,} turns in one conversation, past the {MAX_TURNS:,} a "
                            "chat example is read with (rendering it takes minutes, on every rank): split it into "
                            "several conversations")
    ids: list[int] = []
    labels: list[int] = []
    done = ""

    def add(text: str, learn: bool) -> None:
        nonlocal done
        piece = head_tokens(tokenizer, text[len(done):], max(keep - len(ids), 1) if keep else 0,
                            add_special_tokens=False)
        ids.extend(piece)
        labels.extend(piece if learn else [IGNORE] * len(piece))
        done = text

    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, through = render(messages[:i], True), render(messages[: i + 1], False)
        if not before.startswith(done) or not through.startswith(before):
            raise DockyardError(f"example {n}: the tokenizer's chat template does not render a conversation as "
                                f"a prefix of its continuation, so the assistant turns cannot be found; convert "
                                f"the data to prompt/completion")
        add(before, learn=False)
        learnt = len(ids)
        add(through, learn=True)
        if len(ids) == learnt:  # "raise max_seq_length" was the advice, which could not help
            raise DockyardError(f"example {n}: the model's chat template renders nothing for an assistant turn, so "
                                "there is nothing to learn: use a template that renders the assistant's messages, or "
                                "convert the data to prompt/completion")
        if keep and len(ids) > keep:  # cut (one token past `keep` says so): the turns after it are not read
            break
    return ids, labels


MAX_TURNS = 1000  # messages in one chat example: 1,000 render in ~6 s, 3,000 took minutes


RENDER_SECONDS = 10  # one conversation through a chat template: milliseconds; a template is the model folder's code


RENDER_BYTES = 4 << 30  # memory one render may take: kilobytes; a template that doubles a string 40 times asks a terabyte
CHECK_TEMPLATE = "check chat_template in the model folder's tokenizer_config.json (or chat_template.jinja)"


@contextlib.contextmanager
def memory_limit(grow: int) -> Iterator[None]:
    """MemoryError, rather than the OOM killer, where this process's address space grows by more than `grow` bytes
    within: the soft RLIMIT_AS is set that far above what the process maps now, and set back afterwards. A limit
    of the user's own (`ulimit -v`) that is lower already stays as it is."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    bound = mapped + grow if hard == resource.RLIM_INFINITY else min(mapped + grow, hard)
    if soft != resource.RLIM_INFINITY and soft <= bound:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class TooSlow(BaseException):
    """A chat template past its time (BaseException: not taken for the template's own error)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TooSlow in the main thread after `seconds` (a model's chat template is Jinja that may loop ~forever: the
    run hung after its settings line, silent). Elsewhere (a thread) no limit. An alarm already set by the caller
    (a test harness's limit) is left to fire first when it is due first, and set again afterwards otherwise."""
    outer, every = signal.getitimer(signal.ITIMER_REAL)
    if threading.current_thread() is not threading.main_thread() or (0 < outer <= seconds and not every):
        yield
        return

    def expired(_signum: int, _frame: Any) -> None:
        raise TooSlow

    before = signal.signal(signal.SIGALRM, expired)
    began = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - began), 0.001), every)


def whole_labels(rows: list[dict[str, Any]]) -> None:
    """A label column `datasets` read as floats (for one 0.5, or a null, among whole numbers): 1.0 is class 1."""
    for r in rows:
        if isinstance(r.get("label"), float) and r["label"].is_integer():
            r["label"] = int(r["label"])


def label_names(rows: list[dict[str, Any]]) -> list[str]:
    """Class names in a stable order: integers by value, names sorted."""
    missing = [n for n, r in enumerate(rows, 1) if r.get("text") is None or r.get("label") is None]
    if missing:
        raise DockyardError(f"seq_cls needs `text` and `label` in every example; example {missing[0]} lacks one "
                            f"(fields found: {', '.join(valued(rows[missing[0] - 1]))})")
    whole_labels(rows)
    odd = next((n for n, r in enumerate(rows, 1) if isinstance(r["label"], bool)
                or not isinstance(r["label"], (int, str))), 0)
    if odd:
        raise DockyardError(f"example {odd}: label {reprlib.repr(rows[odd - 1]['label'])} is neither a class name "
                            f"nor a class number (0, 1, ...)")
    labels = {r["label"] for r in rows}
    if all(isinstance(x, int) for x in labels):
        if min(labels) < 0:
            raise DockyardError(f"integer labels must be 0 or more (found {min(labels)})")
        if max(labels) >= MAX_CLASSES:  # a head of that many outputs: an id, not a class number
            raise DockyardError(f"integer labels are class numbers 0..N-1: {max(labels)} is past the "
                                f"{MAX_CLASSES:,} classes a head is made for here (an id in place of a class?); "
                                "number the classes from 0, or use names")
        unseen = sorted(set(range(max(labels) + 1)) - labels)
        if unseen:
            log.warning("integer labels are class numbers 0..%d, and classes %s have no example: the classifier gets "
                        "outputs for them all; number the classes 0..N-1 (or write their names)", max(labels),
                        ", ".join(map(str, unseen[:10])) + (" ..." if len(unseen) > 10 else ""))
        return [str(i) for i in range(max(labels) + 1)]
    return sorted(str(x) for x in labels)


def seq_cls_examples(rows: list[dict[str, Any]], tokenizer: Any, max_len: int, names: list[str]) -> Tokenized:
    index = {name: i for i, name in enumerate(names)}
    whole_labels(rows)
    unknown = sorted({str(r["label"]) for r in rows} - set(index))
    if unknown:
        raise DockyardError(f"labels not seen in the training data: {', '.join(unknown[:5])}")
    out = Tokenized([])
    for n, r in enumerate(rows, 1):
        try:
            text, ids = read_head(tokenizer, str(r["text"]), max_len)
            if len(ids) > max_len:  # cut as the tokenizer cuts: its special tokens (an encoder's [SEP]) kept
                out.truncated += 1
                ids = encode(tokenizer, text, truncation=True, max_length=max_len)
        except CannotEncode as e:
            raise DockyardError(f"example {n}: {e}") from None
        out.examples.append({"input_ids": ids, "labels": index[str(r["label"])]})
    return out


def split(rows: list[dict[str, Any]], fraction: float, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval): a `fraction` of the rows (at least one, never all) held out, chosen by the seed."""
    if not 0 < fraction < 1:
        raise DockyardError(f"eval_fraction must be between 0 and 1 (got {fraction})")
    if len(rows) < 2:
        raise DockyardError("eval_fraction needs at least 2 examples")
    groups: dict[str, list[int]] = {}  # identical rows go to one side together: a copy in training is no held-out one
    for i, r in enumerate(rows):
        groups.setdefault(row_key(r), []).append(i)
    if len(groups) < 2:
        raise DockyardError("eval_fraction needs at least 2 different examples (every example is the same)")
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    k = held_out(len(rows), fraction)
    held: set[int] = set()
    for group in order[:-1]:  # never all of them
        if len(held) >= k:
            break
        held.update(group)
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def collate(pad_id: int):
    """Pad a batch to its longest example; padded positions are masked out and skipped by the loss (and by the
    count of tokens trained: callbacks.TokenCount)."""
    import torch

    def pad_batch(batch: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(ex["input_ids"]) for ex in batch)
        ids = [ex["input_ids"] + [pad_id] * (width - len(ex["input_ids"])) for ex in batch]
        mask = [[1] * len(ex["input_ids"]) + [0] * (width - len(ex["input_ids"])) for ex in batch]
        if isinstance(batch[0]["labels"], int):
            labels = torch.tensor([ex["labels"] for ex in batch])
        else:
            labels = torch.tensor([ex["labels"] + [IGNORE] * (width - len(ex["labels"])) for ex in batch])
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": labels}

    return pad_batch


def collate_packed():
    """Padding-free batches for causal LM: the batch's examples end to end in one row, no padding, position ids
    restarting at 0 for each example and the first label of each left out (transformers'
    DataCollatorWithFlattening), so no token attends to or predicts across an example's boundary: flash
    attention reads the boundaries from the position ids, SDPA gets a block-diagonal mask from them. transformers
    looks for those boundaries only without a KV cache, which a model makes in training too unless told not to:
    hence use_cache False in every batch."""
    from transformers import DataCollatorWithFlattening

    flatten = DataCollatorWithFlattening(return_tensors="pt", separator_id=IGNORE)

    def pack_batch(batch: list[dict[str, Any]]) -> dict[str, Any]:
        return {**flatten([{"input_ids": ex["input_ids"], "labels": ex["labels"]} for ex in batch]), "use_cache": False}

    return pack_batch
