"""Which format the rows are in (named, or found from their fields: the table in dockyard.train.data), checked on
every row; a chat row (messages, alpaca, sharegpt) as chat messages; a classifier's labels as class names."""

from __future__ import annotations

import logging
import reprlib
from typing import Any

from dockyard.common.data_files import FORMATS, HOLDS, TURNS, format_of, turn_role, unknown_format, valued
from dockyard.common.errors import DockyardError

log = logging.getLogger(__package__)  # dockyard.train.data, whichever module says it: rank 0 alone (logs.setup_logging)


CHAT_FORMATS = ("messages", "alpaca", "sharegpt")
TEXT_FIELDS = ("text", "prompt", "completion", "instruction", "input", "output")  # a string each
ALPACA_PROMPT = "{instruction}\n\n{input}"
MAX_CLASSES = 1 << 16  # a classifier's outputs: more is an id read as a class number (a head of 10^12 outputs)


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
    key, role_key = TURNS[fmt]
    turns, text_key = row[key], "value" if fmt == "sharegpt" else "content"
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise DockyardError(f"example {n}: `{key}` must be a list of {{{role_key!r}: ..., {text_key!r}: ...}} objects")
    if not turns:  # was "no assistant turn, so nothing to learn (roles found: ; ...)"
        raise DockyardError(f"example {n}: `{key}` is an empty list, where the {fmt} format needs {HOLDS[key]}: fill "
                            "it in, or leave the example out")
    messages = []
    for t in turns:
        role, content = turn_role(t, fmt), t.get(text_key)
        if role is None or not isinstance(content, str):
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
