"""Training data: JSONL or plain text on disk → tokenized examples and the collator that pads them.

Formats (one example per line):
- causal_lm: {"text": ...}, or {"prompt": ..., "completion": ...} (the loss counts only the completion),
  or a .txt file (each non-empty line is a document);
- seq_cls: {"text": ..., "label": ...}, labels as names or integers.
A folder means every *.jsonl and *.txt file in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dockyard.errors import DockyardError

IGNORE = -100  # label value the loss skips


def read_rows(path: Path) -> list[dict[str, Any]]:
    files = sorted([*path.glob("*.jsonl"), *path.glob("*.txt")]) if path.is_dir() else [path]
    if not path.exists() or not files:
        raise DockyardError(f"no data at {path}: set --data to a .jsonl or .txt file (or a folder of them)")
    rows: list[dict[str, Any]] = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            if f.suffix != ".jsonl":
                rows.append({"text": line})
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DockyardError(f"{f}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise DockyardError(f"{f}:{n}: each line must be a JSON object")
            rows.append(row)
    if not rows:
        raise DockyardError(f"{path} holds no examples")
    return rows


def causal_lm_examples(rows: list[dict[str, Any]], tokenizer: Any, max_len: int) -> list[dict[str, list[int]]]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for n, row in enumerate(rows, 1):
        if "prompt" in row and "completion" in row:
            prompt = tokenizer(row["prompt"], add_special_tokens=True)["input_ids"]
            completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + eos
            ids = (prompt + completion)[:max_len]
            labels = ([IGNORE] * len(prompt) + completion)[:max_len]
        elif "text" in row:
            ids = (tokenizer(row["text"], add_special_tokens=True)["input_ids"] + eos)[:max_len]
            labels = list(ids)
        else:
            raise DockyardError(f"example {n} has neither `text` nor `prompt`+`completion` "
                                f"(keys: {', '.join(row) or 'none'})")
        if any(label != IGNORE for label in labels[1:]):
            out.append({"input_ids": ids, "labels": labels})
    if not out:
        raise DockyardError(f"no example has a token to learn from within max_seq_length={max_len}")
    return out


def label_names(rows: list[dict[str, Any]]) -> list[str]:
    """Class names in a stable order: integers by value, names sorted."""
    missing = [n for n, r in enumerate(rows, 1) if "text" not in r or "label" not in r]
    if missing:
        raise DockyardError(f"seq_cls needs `text` and `label` in every example; example {missing[0]} lacks one")
    labels = {r["label"] for r in rows}
    if all(isinstance(x, int) for x in labels):
        return [str(i) for i in range(max(labels) + 1)]
    return sorted(str(x) for x in labels)


def seq_cls_examples(rows: list[dict[str, Any]], tokenizer: Any, max_len: int,
                     names: list[str]) -> list[dict[str, Any]]:
    index = {name: i for i, name in enumerate(names)}
    return [{"input_ids": tokenizer(r["text"], truncation=True, max_length=max_len)["input_ids"],
             "labels": index[str(r["label"])]} for r in rows]


def collate(pad_id: int, tokens: Any = None):
    """Pad a batch to its longest example; padded positions are masked out and skipped by the loss.

    `tokens`, a multiprocessing.Value, counts the real (non-padding) tokens of every batch made, in this
    process or in dataloader workers (then also the few batches they prefetch past the last step): the
    manifest's tokens/s without a collective at every step."""
    import torch

    def pad_batch(batch: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(ex["input_ids"]) for ex in batch)
        if tokens is not None:
            with tokens.get_lock():
                tokens.value += sum(len(ex["input_ids"]) for ex in batch)
        ids = [ex["input_ids"] + [pad_id] * (width - len(ex["input_ids"])) for ex in batch]
        mask = [[1] * len(ex["input_ids"]) + [0] * (width - len(ex["input_ids"])) for ex in batch]
        if isinstance(batch[0]["labels"], int):
            labels = torch.tensor([ex["labels"] for ex in batch])
        else:
            labels = torch.tensor([ex["labels"] + [IGNORE] * (width - len(ex["labels"])) for ex in batch])
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": labels}

    return pad_batch
