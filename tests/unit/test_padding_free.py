"""Padding-free batches: the examples of a batch packed into one row train exactly what the padded batch trains
(no token attends to, or predicts, another example's), on the tiny model with SDPA, on CPU."""

from __future__ import annotations

import pytest
import torch

from dockyard.common.run_settings import TINY_MODEL
from dockyard.train.callbacks import TokenCount
from dockyard.train.data.batches import collate, collate_packed
from dockyard.train.data.tokens import IGNORE

EXAMPLES = [  # a prompt left out of the loss, as the instruction formats make them
    {"input_ids": [1, 17, 43, 88, 12, 5, 2], "labels": [IGNORE, IGNORE, IGNORE, 88, 12, 5, 2]},
    {"input_ids": [1, 300, 301, 2], "labels": [1, 300, 301, 2]},
    {"input_ids": [1, 9, 10, 11, 12, 13, 14, 15, 16, 2], "labels": [IGNORE] * 4 + [13, 14, 15, 16, 2, 2][:6]},
]


@pytest.fixture(scope="module")
def model():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(TINY_MODEL, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(config).eval()


def test_a_packed_batch_has_the_padded_batchs_loss_and_counts_the_same_tokens(model):
    padded_count, packed_count = TokenCount(), TokenCount()
    padded = collate(0)(EXAMPLES)
    packed = collate_packed()(EXAMPLES)
    padded_count.add([padded])
    packed_count.add([packed])
    assert packed["input_ids"].shape == (1, sum(len(e["input_ids"]) for e in EXAMPLES))  # no padding
    assert packed["position_ids"].tolist()[0] == [i for e in EXAMPLES for i in range(len(e["input_ids"]))]
    assert "attention_mask" not in packed  # transformers finds the examples from the restarting positions
    assert padded_count.value == packed_count.value == 21
    with torch.no_grad():
        loss_padded = model(**padded).loss
        loss_packed = model(**packed).loss
        # the same row read as one long sequence: tokens see the examples before theirs
        loss_joined = model(input_ids=packed["input_ids"], labels=packed["labels"]).loss
    assert loss_packed.item() == pytest.approx(loss_padded.item(), abs=1e-5)
    assert abs(loss_joined.item() - loss_padded.item()) > 1e-3
