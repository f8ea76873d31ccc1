"""The collators: a batch of tokenized examples → the tensors one training step reads."""

from __future__ import annotations

from typing import Any

from dockyard.train.data.tokens import IGNORE


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
