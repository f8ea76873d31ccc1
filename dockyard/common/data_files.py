"""What the trainer reads as data, known to the host too (`invoke run --dry` checks inputs as the trainer will)."""

import collections
import csv
import functools
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from dockyard.common.errors import DockyardError, SetTwice, loads, one_of_each, shown

# file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
# org/name: a dataset or model id as the hub spells it (looked up in the local cache only: no network)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The fields that name each format, most specific first (a row with `messages` and `text` is a chat).
FORMATS: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}
# A chat row's turns and the key naming each turn's role, by format; ShareGPT's speakers (`from`) as chat roles
TURNS = {"messages": ("messages", "role"), "sharegpt": ("conversations", "from")}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "tool": "tool", "function_call": "assistant", "observation": "tool"}
FIRST_LINE_LIMIT = 1 << 24  # bytes of a JSON Lines file's first example the host reads (an example is far less)
# Brackets deep in one example: a chat nests 3 or 4. `datasets` makes a table of the examples whose schema nests as
# deep (the example's object one level, each list or object in it one more), and Arrow refuses a 64th level ("Recursion
# level in ArrowSchema struct exceeded", of no line); pyarrow's JSON reader crashes the process (SIGSEGV, no word of the
# file) near 50,000, Python's json raises RecursionError near 1,000. A .json file's array around them is no level.
NESTING_LIMIT = 63
NESTED = (f"nests more than {NESTING_LIMIT} levels deep (the example's object one, each list or object in it one more), "
          "which `datasets` cannot read: flatten that field, or leave it out")
_JSON_EVENTS = re.compile(rb'["\\\[\]{}]')


def data_files_in(folder: Path) -> list[Path]:
    """The data files a folder gives a run: BUILDERS' suffixes, as written, and not hidden (`.old.jsonl`, which `ls`
    does not show, was 98 % of what a run trained on)."""
    return sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in BUILDERS and not f.name.startswith("."))


def saved_by_datasets(folder: Path) -> str:
    """Where `folder` is what `datasets`' save_to_disk writes (Arrow files, read by load_from_disk only), what to do
    instead; "" where it is not. Its dataset_info.json was read as data: "cannot read .../dataset_info.json:1: not
    JSON ... each line must be one JSON object", or a DatasetDict's dataset_dict.json as "fields (splits)"."""
    dict_of_splits = (folder / "dataset_dict.json").is_file()
    if not dict_of_splits and not ((folder / "state.json").is_file() and any(folder.glob("*.arrow"))):
        return ""
    split = "['train']" if dict_of_splits else ""
    return (f"a dataset saved with datasets' save_to_disk (Arrow files), which a run does not read: write it out as "
            f"a data file first, datasets.load_from_disk(FOLDER){split}.to_json('train.jsonl') (or .to_parquet), "
            "and give that file (docs/data.md)")


def left_out(folder: Path) -> list[str]:
    """What a data folder holds besides the data files read from it (data_files_in): `B.JSONL`, `c.jsonl.gz`, a
    subfolder, a hidden data file. Said by the host and the trainer: a run read the one .jsonl of four without a
    word. Other hidden files (.DS_Store, .git/) go unsaid. Each name as a terminal may show it (errors.shown: a name
    holding an escape sequence cleared the screen)."""
    read = set(data_files_in(folder))
    return sorted(shown(f.name) + ("/" if f.is_dir() else "") for f in folder.iterdir() if f not in read
                  and (not f.name.startswith(".") or (f.is_file() and f.suffix in BUILDERS)))


def format_of(fields: list[str]) -> str:
    """The format a row's fields name (FORMATS, most specific first), "" where none."""
    return next((f for f, need in FORMATS.items() if all(k in fields for k in need)), "")


def unknown_format(source: str, fields: list[str], named: list[str] | None = None, example: str = "") -> DockyardError:
    """The refusal of data whose fields name no format: the trainer's, and the host's from a file's first line.
    `named`: every field of the example (`example`: "line 3", "example 1"), null ones too: `{"prompt": "a",
    "completion": null}` was "cannot tell the data format from its fields (prompt)", where completion is there."""
    header = " (a .csv file's first line must name them, e.g. prompt,completion)" if source.endswith(".csv") else ""
    expected = "; ".join(f"{fmt} ({'+'.join(need)})" for fmt, need in FORMATS.items())
    if fmt := format_of(named or []):
        null = [k for k in FORMATS[fmt] if k not in fields]
        one = len(null) == 1
        return DockyardError(f"{source}: {example or 'its first example'}: {' and '.join(null)} "
                             f"{'is' if one else 'are'} null, where the {fmt} format needs {HOLDS.get(null[0], 'text')}: "
                             f"fill {'it' if one else 'them'} in, or leave the example out (docs/data.md)")
    if not fields:  # `{}` first: "from its fields (); rename them" named nothing to rename
        return DockyardError(f"{source}: its first example has no field with a value (each is null, or there is "
                             f"none): fill in its fields or remove it; an example has those of one of "
                             f"{expected}{header} (docs/data.md)")
    # data_format cannot help here: a named format needs the same fields
    return DockyardError(f"{source}: cannot tell the data format from its fields ({fields_said(fields)}); rename them "
                         f"to one of {expected}{header} (docs/data.md)")


FIELDS_SAID = 20  # field names a message names, each cut at 60 characters


def fields_said(names: list[str]) -> str:
    """Field names for a message, the first FIELDS_SAID of them cut short: a .csv header of 200,000 columns, or a field
    name of megabytes, was said whole, an error line of megabytes."""
    cut = [n if len(n) <= 60 else n[:57] + "..." for n in names[:FIELDS_SAID]]
    return ", ".join(cut) + (f" and {len(names) - FIELDS_SAID} more" if len(names) > FIELDS_SAID else "")


def other_format(source: str, fields: list[str], fmt: str, train: str) -> DockyardError | None:
    """The refusal of held-out data whose first example (`fields`, those with a value) is in another format than the
    training data's (`fmt`, of `train`), or None: the trainer read it as the training format, and said "example 1
    lacks prompt, completion" after a warning that its `text` was not trained on."""
    if fmt not in FORMATS or all(k in fields for k in FORMATS[fmt]) or not (other := format_of(fields)):
        return None
    return DockyardError(f"{source}: its first example is in the {other} format ({'+'.join(FORMATS[other])}), and "
                         f"held-out examples must be in the training data's, {fmt} ({'+'.join(FORMATS[fmt])}) as in "
                         f"{train}: convert them to {fmt} (docs/data.md)")


# What a format's field holds, said where one is null.
HOLDS = {"messages": 'a list of turns ([{"role": "user", "content": ...}, {"role": "assistant", "content": ...}])',
         "conversations": 'a list of turns ([{"from": "human", "value": ...}, {"from": "gpt", "value": ...}])'}


def not_an_object(line: str) -> str:
    """Why one line of a JSON Lines file is not one JSON object ("" where it is, or is blank)."""
    raw = line.encode("utf-8", errors="replace")
    if raw.count(b"[") + raw.count(b"{") > NESTING_LIMIT and _nests_past(raw):
        return NESTED
    try:
        value = json_line(line.rstrip("\r\n")) if line.strip() else {}
    except json.JSONDecodeError as e:  # its line is always 1 here: the column says where
        if e.msg == "Extra data" and _opens_object(e.doc[e.pos:]):
            return TWO_OBJECTS.format(e.colno)
        return f"not JSON ({e.msg}: column {e.colno}); each line must be one JSON object"
    except SetTwice as e:  # `datasets`: "JSON parse error: Column(/text) was specified twice in row 0"
        return TWICE.format(e.args[0])
    except PastDouble as e:
        return PAST_DOUBLE.format(e.args[0] if len(e.args[0]) <= 20 else e.args[0][:20] + "...")
    except NotJsonNumber as e:
        return NOT_JSON_NUMBER.format(e.args[0])
    if isinstance(value, dict):
        return lone_surrogate(line, value)
    return f"{json_kind(value)}, not an object; each line must be one JSON object"


# `{...} {...}` on one line: `datasets` read it as two rows, where the host's checks of a line's example (its format, a
# chat's roles, its fields) read one, and line 1 was refused as "not JSON (Extra data)"; two files joined without a
# line break between them (cat a.jsonl b.jsonl, a.jsonl's last line unended) make one.
TWO_OBJECTS = ("two JSON objects on one line (the second from column {}); each line must be one JSON object: put a line "
               "break between them")
_SIDE_BY_SIDE = r"}[ \t\r\f\v]*{"  # where a line may hold a second object (a string may hold these too)
_MORE_OBJECTS = re.compile(_SIDE_BY_SIDE)


def _opens_object(text: str) -> bool:
    """Whether `text` starts with a JSON object (past whitespace)."""
    try:
        return isinstance(json.JSONDecoder().raw_decode(text.lstrip())[0], dict)
    except (ValueError, RecursionError):
        return False


def json_kind(value: Any) -> str:
    """What a JSON value that is no object is, in words: null, an array, a string, true or false, a number."""
    return "null" if value is None else {list: "an array", str: "a string", bool: "true or false"}.get(type(value),
                                                                                                      "a number")


def turn_role(turn: dict[str, Any], fmt: str) -> str | None:
    """A chat turn's role as the trainer takes it (a `messages` turn's `role`, any text; a ShareGPT turn's `from`, one
    SHAREGPT_ROLES knows), None where it has none the trainer takes."""
    role = turn.get(TURNS[fmt][1])
    if fmt == "sharegpt":
        return SHAREGPT_ROLES.get(str(role))
    return role if isinstance(role, str) else None


def bad_role(path: Path, fmt: str) -> str:
    """"" or the one line that names the first chat turn of a JSON Lines file whose role the trainer refuses (it did,
    once the image had started and the model had loaded): the file, its line, the role as written and what the format
    takes. Read no further than COUNT_LIMIT bytes; a line that is no JSON object is said elsewhere (or by the trainer),
    as is a .json file of one array."""
    if fmt not in TURNS or path.suffix not in (".jsonl", ".json"):
        return ""
    key, role_key = TURNS[fmt]
    takes = (f"one of {', '.join(SHAREGPT_ROLES)}" if fmt == "sharegpt"
             else "the role as text (system, user, assistant, tool)")
    with open(path, "rb") as f:
        n = 0
        while (raw := f.readline(COUNT_LIMIT - f.tell() + 1)) and f.tell() <= COUNT_LIMIT:
            n += 1
            try:
                row = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            turns = row.get(key) if isinstance(row, dict) else None
            for turn in turns if isinstance(turns, list) else []:
                if isinstance(turn, dict) and turn_role(turn, fmt) is None:
                    role = f"{role_key!r} {shown(repr(turn[role_key]))[:80]}" if role_key in turn else f"no {role_key!r}"
                    return (f"{path}:{n}: a turn of {role}, which the {fmt} format does not take: give {takes} "
                            "(docs/data.md)")
    return ""


def not_examples(path: Path) -> str:
    """The refusal of a JSON (or JSON Lines) file that is one JSON array of something else than examples (objects),
    "" where it is no array or one of objects: `datasets` read ["a", "b"] as rows of a field `text` that the file never
    names, and trained on them (a list of file names or ids, as documents); [1, 2] the same, refused by the trainer as
    "example 1's text is int"; and [null, {...}] crashed the process (SIGSEGV, no word of the file). Read whole up to
    FIRST_LINE_LIMIT bytes (json_document); a larger file, by its first element."""
    if path.suffix == ".jsonl" and not opens_array(path):  # JSON Lines, as nearly every .jsonl file is
        return ""
    doc = json_document(path) or _first_element(path)
    if not doc.array:
        return ""
    if path.suffix == ".jsonl":  # `datasets` reads it as one array, as a .json file's
        return "" if doc.rows != 0 and doc.odd is None else \
            f"cannot read {path}:1: an array, not an object; each line must be one JSON object"
    if doc.rows == 0:  # `datasets`: 'Instruction "train" corresponds to no data!'
        return f"cannot read {path}: an empty JSON array, which holds no examples: give the data your examples are in"
    if doc.odd is None:
        return ""
    n, item = doc.odd
    said = json.dumps(item)
    kind = json_kind(item) + ("" if item is None else f" ({said[:60]}{'...' if len(said) > 60 else ''})")
    return (f"cannot read {path}: element {n} of its JSON array is {kind}, not an example; each example is an object "
            'whose fields name its format, e.g. {"text": "..."} for a document (a list of file names or ids is not '
            "data: give the data files, or their folder) (docs/data.md)")


def opens_array(path: Path) -> bool:
    """Whether a file's text opens a JSON array (`[`, past a byte order mark and whitespace), read no further than
    that: only such a JSON Lines file can be one array, which not_examples reads whole. It read every .jsonl file whole
    (up to FIRST_LINE_LIMIT) to find none there, and first_example and the count then read its first line again."""
    read = 0
    with open(path, "rb") as f:
        while read < FIRST_LINE_LIMIT and (chunk := f.read(1 << 12)):
            text = chunk.decode("utf-8", errors="replace").removeprefix("" if read else "\ufeff").lstrip()
            read += len(chunk)
            if text:
                return text.startswith("[")
    return False


class Document(NamedTuple):
    """A JSON (or JSON Lines) file read as one JSON value: what the host's checks ask of it (json_document)."""

    array: bool                    # it is one JSON array (else one object, or JSON Lines)
    rows: int | None               # the array's elements, 1 for one object; None: no one value, or not known
    first: dict[str, Any] | None   # the array's first object
    odd: tuple[int, Any] | None    # the array's first element that is no object, and its place (from 1)
    not_utf8: str                  # the refusal of its first byte that is not UTF-8 (not_utf8_in), or ""


def json_document(path: Path) -> Document | None:
    """A JSON (or JSON Lines) file of up to FIRST_LINE_LIMIT bytes, read whole once while it is unchanged: not_examples,
    first_example and the count (examples_in) each read it, and `invoke run --dry` read a .json file three times.
    None for a larger file."""
    st = path.stat()
    return None if st.st_size > FIRST_LINE_LIMIT else _document(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)  # what was read, not the value: a 16 MB file's objects would stay in memory
def _document(path: Path, _size: int, _mtime: int) -> Document:
    data = path.read_bytes()
    try:
        value = loads(data.decode("utf-8-sig", errors="replace"))  # its fields printable, whatever its bytes
    except ValueError:
        value = None
    if not isinstance(value, (list, dict)):
        return _NO_VALUE
    items = value if isinstance(value, list) else [value]
    try:
        data.decode("utf-8")
        bad = ""
    except UnicodeDecodeError:
        bad = not_utf8_in(path, data.decode("utf-8", errors="surrogateescape"), 1)
    return Document(isinstance(value, list), len(items), next((v for v in items if isinstance(v, dict)), None),
                    next(((n, v) for n, v in enumerate(items, 1) if not isinstance(v, dict)), None), bad)


def _first_element(path: Path) -> Document:
    """A larger JSON file, by its first FIRST_LINE_LIMIT bytes: whether it opens an array, and its first element."""
    with open(path, "rb") as f:
        text = f.read(FIRST_LINE_LIMIT).decode("utf-8-sig", errors="replace").lstrip()
    if not text.startswith("["):
        return _NO_VALUE
    try:
        item = json.JSONDecoder().raw_decode(text[1:].lstrip())[0]
    except (ValueError, RecursionError):  # not one JSON value: its own refusal says why
        return _NO_VALUE
    one = isinstance(item, dict)
    return Document(True, None, item if one else None, None if one else (1, item), "")


_NO_VALUE = Document(False, None, None, None, "")  # JSON Lines, or no JSON: read by lines


TWICE = "names the field {} twice in one object: name each field once"
# `datasets` (pyarrow): "JSON parse error: Number too big to be stored in double. in row 1", of no line (its rows count
# from 0) or fix, once the image had started; Python's json reads such a number as infinity
PAST_DOUBLE = ("the number {} is past a double's range (about 1.8e308), which `datasets` cannot read: write a smaller "
               "one, or quote it to keep it as text")


class PastDouble(ValueError):
    """A JSON number of a line that no double holds (its text: args[0])."""


# NaN, Infinity, -Infinity: Python's json reads and writes them (json.dumps of a float nan), JSON does not allow them.
# `datasets` read `{"text": NaN}` as a number, then as no value: "example 1 has no field with a value (... every field
# null)", of a line whose field is there.
NOT_JSON_NUMBER = ("{} is a number JSON does not allow (Python's json.dumps writes a float's nan or inf so, and `datasets` "
                   "reads a field holding it as null): write null where there is no value, or quote it to keep it as "
                   "text")


class NotJsonNumber(ValueError):
    """NaN, Infinity or -Infinity on a line (args[0])."""


def _no_constant(name: str) -> Any:
    raise NotJsonNumber(name)


_EXPONENT = re.compile(r"-?\d+(?:\.(\d+))?[eE]([+-]?\d+)")


def _double(text: str) -> float:
    """A JSON number as Python reads it, PastDouble where pyarrow refuses it: by its exponent less its digits after the
    point, past 308 (1e309, -2.5E+400); 2e308 and a 400-digit number pyarrow reads as infinity, and so does this."""
    value = float(text)
    if math.isinf(value) and (m := _EXPONENT.fullmatch(text)) and int(m[2]) - len(m[1] or "") > 308:
        raise PastDouble(text)
    return value


def json_line(line: str) -> Any:
    """One JSON Lines line as `datasets` takes it: a field named twice (SetTwice) and a number no double holds
    (PastDouble) refused, as pyarrow refuses them, and NaN or Infinity (NotJsonNumber), which it misreads."""
    return loads(line, object_pairs_hook=one_of_each, parse_float=_double, parse_constant=_no_constant)


def datasets_refuses(line: str) -> str:
    """Why a JSON Lines line names a field twice (TWICE), holds half a surrogate pair (lone_surrogate), a number no
    double holds (PAST_DOUBLE), NaN or Infinity (NOT_JSON_NUMBER) or nests past NESTING_LIMIT (NESTED), "" where it
    does not or is no JSON (its own refusal)."""
    if line.count("[") + line.count("{") > NESTING_LIMIT and _nests_past(line.encode("utf-8", "replace")):
        return NESTED
    try:
        return lone_surrogate(line, json_line(line))
    except SetTwice as e:
        return TWICE.format(e.args[0])
    except (PastDouble, NotJsonNumber):
        return not_an_object(line)
    except ValueError:
        pass
    return ""


# `datasets` (pyarrow): "JSON parse error: The surrogate pair in string is invalid. in row 30", of no line or fix,
# once the image had started; Python's json takes the escape as a character of its own, which is no character
LONE = ("a \\u{:04x} escape, half of a UTF-16 surrogate pair without its other half (no character: a text cut inside "
        "an emoji, or a tool that escaped it wrongly): write the character itself, or both halves of its pair")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(line: str, value: Any) -> str:
    """Why a JSON Lines line whose JSON `value` was read from `line` is refused for a lone surrogate escape (LONE), ""
    where it holds none: json reads a pair whole, so any surrogate left in a string (or a field's name) is alone."""
    if not _SURROGATE_ESCAPE.search(line):  # the rare line: nearly every one is passed over here
        return ""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            todo += v
        elif isinstance(v, str) and (half := _SURROGATE.search(v)):
            return LONE.format(ord(half[0]))
    return ""


_SURROGATE = re.compile("[\ud800-\udfff]")


def first_example(path: Path) -> tuple[int, dict[str, Any]] | None:
    """(its line, 0 in a .json file's array, and) a JSON Lines file's first example, as the trainer finds the format from
    it; a first line that is not a JSON object is refused as the trainer would refuse it. None for a file with no
    example in its first FIRST_LINE_LIMIT bytes (the trainer says what it finds there). A .json file holding one
    JSON array (of up to FIRST_LINE_LIMIT bytes): its first object; else it is read as JSON Lines, as `datasets`
    reads it."""
    if path.suffix == ".json" and (doc := json_document(path)) and doc.array:
        return None if doc.first is None else (0, doc.first)
    with open(path, "rb") as f:
        n = 0
        while (raw := f.readline(FIRST_LINE_LIMIT - f.tell() + 1)) and f.tell() <= FIRST_LINE_LIMIT:
            n += 1
            if n == 1 and (kind := other_kind(raw)):  # was "not JSON (Expecting value: column 1)"
                raise DockyardError(f"cannot read {path}: it is {kind}")
            try:  # a BOM: the trainer reads past it, and counts it in a column (data._bad_utf8_line)
                line = raw.decode("utf-8").removeprefix("\ufeff" if n == 1 else "")
            except UnicodeDecodeError as e:  # the trainer's words, before the image starts
                raise DockyardError(f"cannot read {path}:{n} {not_utf8(raw, e)}") from None
            if not line.strip():
                continue
            if why := not_an_object(line):
                if line.lstrip().startswith("[") and why.startswith("not JSON"):  # `[` alone: an array over lines
                    why += ", or the file (named .json) one JSON array"
                raise DockyardError(f"cannot read {path}:{n}: {why}")
            return n, loads(line)
    return None


# A file of another kind by its first bytes, and the fix: a compressed one (`datasets` unpacks some by their bytes;
# the host read it as text: "not JSON (Expecting value: column 1)", a .csv header of binary), or Parquet.
OTHER_KINDS = {b"\x1f\x8b": "gzip-compressed: decompress it first (gunzip)",
               b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first (zstd -d)",
               b"BZh": "bzip2-compressed: decompress it first (bunzip2)",
               b"\xfd7zXZ\x00": "xz-compressed: decompress it first (unxz)",
               b"PK\x03\x04": "a zip archive: unpack it first (unzip)",
               b"PAR1": "a Parquet file: name it .parquet"}
COMPRESSED_SUFFIXES = {".gz": "gunzip", ".zst": "zstd -d", ".bz2": "bunzip2", ".xz": "unxz", ".zip": "unzip"}


def other_kind(head: bytes) -> str:
    """What a data file whose first bytes are `head` is where it is none of the text it is named for, and the fix;
    "" where it is text."""
    return next((what for magic, what in OTHER_KINDS.items() if head.startswith(magic)), "")


def unknown_type(suffix: str) -> str:
    """What follows "unknown data file type SUFFIX" where more than the list of types helps."""
    return f" (a compressed file: decompress it first, {COMPRESSED_SUFFIXES[suffix]})" if suffix in COMPRESSED_SUFFIXES \
        else ""


def not_utf8(line: bytes, e: UnicodeDecodeError, before: int = 0) -> str:
    """Where a line's first byte that is not UTF-8 is, and the fix (a line of a file saved as Latin-1, cp1252).
    `before`: the line's bytes before `line` (where it was read in parts)."""
    return f"(byte 0x{line[e.start]:02x} at column {before + e.start + 1}): it is not UTF-8 text; save it as UTF-8"


def not_utf8_in(path: Path, text: str, line: int, before: int = 0) -> str:
    """The refusal of the first byte of `text` that is not UTF-8 (`text` read with errors="surrogateescape" from
    `before` bytes into line `line`, its lines counted at \n as the trainer counts them: data._bad_utf8_line) in
    first_example's words, naming its line; "" where there is none."""
    if not (bad := _ESCAPED.search(text)):
        return ""
    start, end = text.rfind("\n", 0, bad.start()) + 1, text.find("\n", bad.start())
    raw = text[start:end if end >= 0 else None].encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"{path}:{line + text.count(chr(10), 0, start)}"
        return f"cannot read {where} {not_utf8(raw, e, before if start == 0 else 0)}"
    return ""


_ESCAPED = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, read with errors="surrogateescape"


def valued(row: dict[str, Any]) -> list[str]:
    """A row's fields that hold a value (not null), sorted: those that name its format."""
    return sorted(k for k, v in row.items() if v is not None)


def first_format(path: Path) -> tuple[str, list[str]] | None:
    """The format a JSON Lines (or JSON) file's first example names, and its fields with a value; None where there
    is none to read. One whose fields name none is refused as the trainer refuses it (unknown_format)."""
    first = first_example(path)
    if first is None:
        return None
    line, row = first
    fields = valued(row)
    if not (fmt := format_of(fields)):
        raise unknown_format(str(path), fields, sorted(row), f"line {line}" if line else "")
    return fmt, fields


def another_kind(path: Path) -> str:
    """The refusal of a data file that is another kind than text by its first bytes (other_kind), or ""."""
    with open(path, "rb") as f:
        kind = other_kind(f.read(8))
    return f"cannot read {path}: it is {kind}" if kind else ""


def too_deep(path: Path) -> str:
    """FILE:LINE (FILE for a .json file) where a JSON or JSON Lines file nests deeper than NESTING_LIMIT, or "":
    read before `datasets` is, whose reader would crash the process. A line with fewer brackets than the limit
    cannot nest that deep, so only the rare line with more is read bracket by bracket."""
    if path.suffix == ".json":
        data = path.read_bytes()
        deepest = NESTING_LIMIT + 1  # the array around the examples
        return str(path) if data.count(b"[") + data.count(b"{") > deepest and _nests_past(data, deepest) else ""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.count(b"[") + line.count(b"{") > NESTING_LIMIT and _nests_past(line):
                return f"{path}:{n}"
    return ""


def misread_line(path: Path) -> str:
    """FILE:LINE: why, of the first line of a JSON Lines file that `datasets` would read without a word as something
    else than the line's one object: NaN or Infinity outside its strings (NOT_JSON_NUMBER, read as null in a text
    field), two objects (TWO_OBJECTS, read as two rows); "" where there is none. Read before `datasets` is, in chunks
    searched whole (a file of gigabytes, by every process); the host refuses such lines among those it counts. Only a
    line holding one of those words, or `}` and `{` side by side, is parsed."""
    with open(path, "rb") as f:
        before = 0  # the lines before this chunk
        while chunk := f.read(MISREAD_CHUNK):
            chunk += f.readline()  # to its line's end
            at = 0
            while m := _MISREAD.search(chunk, at):
                start, end = chunk.rfind(b"\n", 0, m.start()) + 1, chunk.find(b"\n", m.end())
                n = before + chunk.count(b"\n", 0, start) + 1
                line = chunk[start:None if end < 0 else end].decode("utf-8", errors="replace")
                if why := not_an_object(line.removeprefix("\ufeff" if n == 1 else "")):
                    return f"{path}:{n}: {why}"
                if end < 0:
                    break
                at = end
            before += chunk.count(b"\n")
    return ""


MISREAD_CHUNK = 16 << 20
_MISREAD = re.compile(rb"NaN|Infinity|" + _SIDE_BY_SIDE.encode())


# Different top-level fields in one data file. `datasets` reads a file as one table with a column for each field any
# row names, every row holding every column: 20,000 rows each naming a field of its own (a 600 KB file) took a minute,
# 7.6 GB of memory and 3 GB of cache in every process before a line was read. A training format reads a handful.
MAX_FIELDS = 1000
TABLE_CHUNK = 10 << 20  # bytes of a JSON Lines file `datasets` makes its table's columns from (a field new after
#                         them is refused as it casts the rest: data.read._new_field_line)


def too_wide(path: Path) -> list[str]:
    """The first fields of a JSON, JSON Lines or Parquet file whose rows name more than MAX_FIELDS different fields
    (the columns of the table `datasets` would make), or []: a .json file's whole array, a .jsonl file's first chunk,
    a .parquet file's schema. Read before `datasets` is; a line that is not JSON is left to its own refusal."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except Exception:  # noqa: BLE001 - not Parquet: `datasets` says so in its words
            return []
        return names[:MAX_FIELDS + 1] if len(names) > MAX_FIELDS else []
    with open(path, "rb") as f:
        data = f.read() if path.suffix == ".json" else f.read(TABLE_CHUNK) + f.readline()
    try:
        rows = [loads(data)] if path.suffix == ".json" else []
    except ValueError:
        rows = []  # JSON Lines in a .json file, as `datasets` reads it too
    if rows and isinstance(rows[0], list):
        rows = rows[0]
    fields: dict[str, None] = {}
    for row in rows or _json_lines(data):
        if isinstance(row, dict):
            fields.update(dict.fromkeys(row))
            if len(fields) > MAX_FIELDS:
                return list(fields)
    return []


def parquet_decoded(path: Path, past: int) -> int:
    """The bytes a Parquet file's rows take decoded (as `datasets` holds them), counted a batch at a time with its
    strings read as dictionaries: a value the file stores once for many rows is counted for each, not copied out.
    Counting stops once past `past`. 0 for a file pyarrow cannot read (`datasets` says why in its words). A file
    compresses such values to nothing: 36 KB held 5 million rows of 400 characters, 2 GB in every process."""
    import pyarrow.parquet as pq

    try:
        strings = [c.path for c in pq.ParquetFile(path).schema if c.physical_type == "BYTE_ARRAY"]
        total = 0
        for batch in pq.ParquetFile(path, read_dictionary=strings).iter_batches(batch_size=PARQUET_BATCH):
            total += sum(_decoded(column) for column in batch.columns)
            if total > past:
                break
        return total
    except Exception:  # noqa: BLE001 - pyarrow raises its own kinds for a file that is not parquet
        return 0


PARQUET_BATCH = 1024  # rows decoded at once: their numbers and nested lists, never a string read as a dictionary


def _decoded(array: Any) -> int:
    """The bytes of an Arrow array with its dictionaries' strings written out, one per row that names them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_dictionary(kind) and (pa.types.is_string(kind.value_type) or pa.types.is_binary(kind.value_type)):
        lengths = pc.take(pc.binary_length(array.dictionary), array.indices)
        return (pc.sum(lengths).as_py() or 0) + 4 * len(array)  # and an offset each
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _decoded(array.flatten()) + 8 * len(array)
    if pa.types.is_struct(kind):
        return sum(_decoded(part) for part in array.flatten())
    return array.nbytes


def _json_lines(data: bytes) -> Iterator[object]:
    for line in data.splitlines():
        try:
            yield loads(line)
        except ValueError:
            continue


def _nests_past(data: bytes, limit: int = NESTING_LIMIT) -> bool:
    """Whether JSON text opens more than `limit` brackets at once (brackets in strings are text)."""
    depth, in_string, skip = 0, False, -1
    for m in _JSON_EVENTS.finditer(data):
        pos = m.start()
        if pos == skip:  # the character after a backslash in a string
            continue
        c = data[pos]
        if in_string:
            if c == 0x5C:
                skip = pos + 1
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif c in (0x5D, 0x7D):
            depth -= 1
    return False


def holds_text(path: Path, within: int | None = None) -> bool | None:
    """Whether a data file holds anything but whitespace (and a byte order mark before it), read only up to its first
    other byte. A BOM and a blank line passed as text, and `datasets` said 'Instruction "train" corresponds to no
    data!'. `within`: the bytes read at most (the host's, COUNT_LIMIT), None where they are all whitespace and the
    file goes on: a blank file of gigabytes was read to its end before `invoke run` said a word."""
    read = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if (chunk if read else chunk.removeprefix(b"\xef\xbb\xbf")).strip():
                return True
            read += len(chunk)
            if within is not None and read >= within:
                return None if f.read(1) else False
    return False


# Characters of the data `invoke run` reads to count its examples (examples_in): a step's worth of any real data is
# far less; past them (a few examples of megabytes each) the count is the trainer's.
COUNT_LIMIT = 64 << 20


def held_out(examples: int, fraction: float) -> int:
    """How many of `examples` rows eval_fraction `fraction` holds out (data.split): its share rounded, one at least and
    never all. The trainer's split and the host's count (preflight.check_enough_examples) both read it."""
    return min(examples - 1, max(1, round(examples * fraction)))


def examples_for(trained: int, fraction: float) -> int:
    """The fewest examples of which `trained` are left to train on once eval_fraction `fraction` holds out its share
    (held_out; 2 at least, which split needs): how far the host counts."""
    if not fraction:
        return trained
    enough = math.ceil((trained + 1) / (1 - fraction)) + 1  # its share rounded up, more than `trained` are left
    # bisected by hand: bisect over range() takes its length as a C ssize_t, which an eval_fraction of 1 - 1e-16
    # passes at a step of 1024 (OverflowError, a traceback of `invoke run --dry`)
    lo, hi = 2, enough + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mid - held_out(mid, fraction) >= trained else (mid + 1, hi)
    return lo


class _Uncounted(Exception):
    """The data cannot be counted cheaply here (COUNT_LIMIT read, a line the count cannot read)."""


def examples_in(files: list[Path], enough: int) -> int | None:
    """The examples (rows) the trainer reads from these .jsonl, .json, .csv or .txt files, as many as there are up to
    `enough` (counting stops there: a file of 50 GB is read no further than a step's worth); None where that is not
    known cheaply: a .parquet file (the host has no pyarrow), past COUNT_LIMIT characters, a JSON Lines line that
    opens an array, a .json file of one array past FIRST_LINE_LIMIT bytes. Never fewer than the trainer finds: a line
    it drops (blank, its example empty) may be counted, one it reads is. A line read here that the trainer would
    refuse, a byte that is not UTF-8 or a JSON object naming a field twice, is refused in first_example's words: line 1
    alone was, and the trainer refused line 3 once the image had started."""
    total, left = 0, [COUNT_LIMIT]

    def lines(path: Path, f: Any) -> Iterator[str]:  # the file's lines (\n, \r\n or \r), within COUNT_LIMIT
        # the line as the trainer counts lines (at \n), and its bytes before this part of it (at \r): a count, not the
        # parts, which a file of blank \r lines piled up by the million (2 GB held for 60 MB read)
        number, before = 1, 0
        while line := f.readline(left[0] + 1):
            left[0] -= len(line)
            if left[0] < 0:
                raise _Uncounted
            if not line.isascii() and _ESCAPED.search(line):  # isascii: a flag of the string, not a scan
                raise DockyardError(not_utf8_in(path, line, number, before))
            yield line if number > 1 or before else line.removeprefix("\ufeff")  # a BOM: not the first line's text
            if line.endswith("\n"):
                number, before = number + 1, 0
            else:
                before += len(line) if line.isascii() else len(line.encode("utf-8", "surrogateescape"))

    try:
        for path in files:
            if path.suffix not in (".jsonl", ".json", ".csv", ".txt"):
                return None
            with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
                for n in _COUNTERS[path.suffix](path, lines(path, f)):
                    total += n
                    if total >= enough:
                        return total
    except (_Uncounted, csv.Error, OSError):
        return None
    return total


def _text_rows(_path: Path, lines: Iterator[str]) -> Iterator[int]:
    """A .txt file: a row per line holding more than whitespace (`datasets` splits at \n, \r\n and \r)."""
    return (1 for line in lines if line.strip())


def _json_lines_rows(path: Path, lines: Iterator[str]) -> Iterator[int]:
    """JSON Lines: a row per line holding a JSON object; `{...} {...}` on one line is refused (TWO_OBJECTS)."""
    for n, line in enumerate(lines, 1):
        if text := line.strip():
            if text.startswith("["):  # an array over lines, or of objects on one: not counted here
                raise _Uncounted
            if twice := datasets_refuses(text) or (_MORE_OBJECTS.search(text) and not_an_object(text)):
                raise DockyardError(f"cannot read {path}:{n}: {twice}")  # numbered as data.read._bad_json_line does
            yield 1


def _json_rows(path: Path, lines: Iterator[str]) -> Iterator[int]:
    """A .json file: the elements of its one JSON array (or 1, one object), else it is read as JSON Lines."""
    doc = json_document(path)
    if doc and doc.rows is not None:
        if doc.not_utf8:
            raise DockyardError(doc.not_utf8)
        yield doc.rows
        return
    yield from _json_lines_rows(path, lines)


def _csv_rows(_path: Path, lines: Iterator[str]) -> Iterator[int]:
    """A .csv file: a row per record after the header that holds a cell of more than whitespace (data.read.read_csv)."""
    reader = csv.reader(lines)
    if next(reader, None):
        yield from (1 for cells in reader if any(c.strip() for c in cells))


_COUNTERS = {".txt": _text_rows, ".jsonl": _json_lines_rows, ".json": _json_rows, ".csv": _csv_rows}


def csv_header(path: Path) -> list[str] | None:
    """The column names a .csv file's first line gives (stripped, as the trainer reads them: data.read.read_csv), None
    where the host cannot tell (an empty first line, a quoted name holding a line break, csv's cell limit): the
    trainer says what it finds there."""
    if said := another_kind(path):  # its bytes were read as the header's field names
        raise DockyardError(said)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        head = f.readline(FIRST_LINE_LIMIT)
    if said := not_utf8_in(path, head, 1):  # was "cannot tell the format from its fields (t\ufffdxt): rename them"
        raise DockyardError(said)
    head = head.removeprefix("\ufeff")
    if head.count('"') % 2:
        return None
    try:
        names = next(csv.reader(io.StringIO(head)), None)
    except csv.Error:
        return None
    if not names:
        return None
    if said := named_twice(path, [n.strip() for n in names]):
        raise DockyardError(said)
    return sorted(n.strip() for n in names if n.strip())


def named_twice(path: Path, names: list[str]) -> str:
    """The refusal of a .csv header (its names stripped) that names a column twice (a row kept the last one's cell,
    unsaid), or "". A column of no name is none: a spreadsheet's trailing empty columns (`text,,`), pandas' index
    (`,text`), whose cells are no field (data.read.read_csv); two of them were "the header names  twice"."""
    twice = sorted(n for n, times in collections.Counter(n for n in names if n).items() if times > 1)
    return f"{path}:1: the header names {', '.join(twice)} twice: name each column once" if twice else ""


def mixed_formats(files: list[Path], known: dict[Path, tuple[str, list[str]] | None] | None = None
                  ) -> DockyardError | None:
    """The refusal of a folder whose JSON Lines (or JSON) files are in different formats (by each file's first
    example), or None: `datasets` reads a folder as one table, and refused it as "Couldn't cast", naming no file.
    `known`: what first_format already found of some files, not read again."""
    found: dict[str, list[str]] = {}
    for f in sorted(files):
        first = (known[f] if known and f in known else first_format(f)) if f.suffix in (".jsonl", ".json") else None
        if first is None:
            continue
        found.setdefault(first[0], []).append(f.name)
    if len(found) < 2:
        return None
    said = "; ".join(f"{fmt}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for fmt, names in found.items())
    return DockyardError(f"{files[0].parent}: its files are in different data formats ({said}); a folder is read as "
                         "one table of one format: put each format in a folder of its own and give one, or convert "
                         "them to one format (docs/data.md)")
