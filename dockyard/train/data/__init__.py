"""Training data: files or a cached hub dataset → rows → tokenized examples, and the collators that batch them.

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

`load` (here) reads a run's data in that order, one module a step: `read` (files → rows), `formats` (which format,
checked on every row), `tokens` (rows → input_ids and labels), and `batches` holds the collators the Trainer uses.
"""

from __future__ import annotations

import json
import logging
import random
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dockyard.common.data_files import held_out, other_format, valued
from dockyard.common.errors import DockyardError
from dockyard.train.data.formats import detect_format, label_names
from dockyard.train.data.read import read_rows
from dockyard.train.data.tokens import Tokenized, pack_text, seq_cls_examples, tokenize

log = logging.getLogger(__name__)  # the same on every rank: said by rank 0 alone (logs.setup_logging)


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
