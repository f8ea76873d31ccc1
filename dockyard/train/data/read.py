"""Reading the data: a file, a folder of files of one kind, or a cached hub dataset → rows (dicts), through
`datasets` and offline. A file that would crash or swamp every process (nested too deep, thousands of fields,
Parquet that decodes past the node's memory) is refused before `datasets` reads it, and a file it cannot read
is named by its line: FILE:LINE and what is wrong there."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from dockyard.common import disk, tree
from dockyard.common.data_files import (
    BUILDERS,
    HUB_ID,
    MAX_FIELDS,
    NESTED,
    another_kind,
    data_files_in,
    first_example,
    holds_text,
    left_out,
    misread_line,
    mixed_formats,
    named_twice,
    not_an_object,
    not_examples,
    not_utf8,
    parquet_decoded,
    saved_by_datasets,
    too_deep,
    too_wide,
    unknown_type,
)
from dockyard.common.errors import DockyardError, Stopped, cause_line, causes, loads
from dockyard.common.units import human
from dockyard.train.guards import host_memory_available

log = logging.getLogger(__package__)  # dockyard.train.data, whichever module says it: rank 0 alone (logs.setup_logging)


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
                if misread := misread_line(Path(f)):
                    raise DockyardError(f"cannot read {misread}")
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
        if isinstance(e.__cause__ or e, UnicodeDecodeError) or "in UTF-8 sequence" in cause_line(e):
            where = _bad_utf8_line(kwargs["data_files"])
            raise DockyardError(f"cannot read {where}" if where else f"cannot read {what}: it is not UTF-8 text "
                                f"({cause_line(e)}); save it as UTF-8") from None
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
        raise DockyardError(f"cannot read {where}" if where else f"cannot read {what}: {cause_line(e)}") from None


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
