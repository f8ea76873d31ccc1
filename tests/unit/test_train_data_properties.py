"""Properties of the data loader over every shape of input (hypothesis): the format a dataset is read as, whatever
extra columns it carries, and an eval split that always leaves rows to train on."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard.common.data_files import FORMATS
from dockyard.train import data
from dockyard.train.data import formats, read

FIELDS = sorted({f for fields in FORMATS.values() for f in fields})
VALUES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"}],
          "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ho"}]}


def completes_another(fmt: str, columns: set[str]) -> bool:
    return any(other != fmt and set(fields) <= columns for other, fields in FORMATS.items())


@st.composite
def dataset_with_extra_columns(draw):
    """(format, rows): rows of one format, each with the same extra columns: some named like another format's
    fields (never all of another format's), some unrelated."""
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    own = set(FORMATS[fmt])
    borrowed = draw(st.sets(st.sampled_from([f for f in FIELDS if f not in own])))
    if completes_another(fmt, own | borrowed):
        borrowed = set()
    unrelated = draw(st.sets(st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(lambda c: c not in FIELDS),
                             max_size=3))
    columns = sorted(own | borrowed | unrelated)
    n = draw(st.integers(1, 4))
    rows = [{c: VALUES.get(c, f"{c} {i}") for c in columns} for i in range(n)]
    return fmt, rows


@hsettings(max_examples=300, deadline=None)
@given(dataset_with_extra_columns())
def test_a_dataset_with_extra_columns_is_read_as_its_own_format(case):
    fmt, rows = case
    assert formats.detect_format(rows, "causal_lm", "auto", "d.jsonl") == fmt


def test_a_text_file_with_a_column_named_like_another_formats_field_is_text(tmp_path):
    """`text` with the `prompt` that produced it, or with the `instruction` of its source: still text."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"story {i}", "prompt": "write", "instruction": "x"}) + "\n"
                            for i in range(3)))
    assert formats.detect_format(read.read_rows(path), "causal_lm", "auto", str(path)) == "text"


@hsettings(max_examples=500, deadline=None)
@given(st.integers(2, 400), st.floats(0, 1, exclude_min=True, exclude_max=True), st.integers(0, 2**32))
def test_an_eval_split_leaves_rows_for_both_sides_and_loses_none(n, fraction, seed):
    rows = [{"text": str(i)} for i in range(n)]
    train, evals = data.split(rows, fraction, seed)
    assert len(train) >= 1 and len(evals) >= 1
    assert sorted(train + evals, key=lambda r: int(r["text"])) == rows
    assert train == [r for r in rows if r not in evals]  # the training rows keep their order
