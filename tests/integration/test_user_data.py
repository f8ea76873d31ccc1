"""A user's own data trains: each format, from the file types users have, through the real trainer (2 processes
under torchrun on CPU, the tiny model). What is checked is what the user relies on: the format was recognised,
the run completed and learned, held-out data gave an eval loss, and a wrong schema stops before any training."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.training import FAST, manifest, train

PORTS = ["Bergen", "Oslo", "Tromso", "Stavanger"]


def questions(n: int = 48) -> list[tuple[str, str]]:
    return [(f"Which port is number {i % 4}?", PORTS[i % 4]) for i in range(n)]


def write_messages(path):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in questions()))


def write_sharegpt(path):
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
                                for q, a in questions()]))


def write_alpaca(path):
    qs = questions()
    pq.write_table(pa.table({"instruction": [q for q, _ in qs], "input": ["" for _ in qs],
                             "output": [a for _, a in qs]}), path)


def write_prompt_completion(path):
    path.write_text("prompt,completion\n" + "".join(f'"{q}"," {a}"\n' for q, a in questions()))


@pytest.mark.parametrize("fmt, file, write, recipe", [
    ("messages", "chat.jsonl", write_messages, "ddp"),
    ("sharegpt", "sharegpt.json", write_sharegpt, "zero2"),
    ("alpaca", "alpaca.parquet", write_alpaca, "lora"),
    ("prompt_completion", "pc.csv", write_prompt_completion, "ddp"),
])
def test_each_data_format_trains_with_a_held_out_eval_loss(tmp_path, fmt, file, write, recipe):
    data = tmp_path / file
    write(data)
    run = tmp_path / "run"
    proc = train(recipe, run, *FAST, "--data", str(data), "--eval_fraction", "0.25", "--logging_steps", "4")
    m = manifest(run)
    assert m["status"] == "completed"
    assert m["data"]["format"] == fmt and m["data"]["examples"] == 36 and m["data"]["eval_examples"] == 12
    assert f"format {fmt}" in proc.stderr  # said to the user, not only recorded
    assert m["metrics"]["loss_last"] < m["metrics"]["loss_first"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [x["eval_loss"] for x in lines if "eval_loss" in x]
    assert len(evals) == 3 and m["metrics"]["eval_loss_last"] == evals[-1]  # steps 4, 8, 12


def test_a_wrong_schema_stops_before_training_with_the_fields(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Which port?", "answer": "Bergen"}) + "\n")
    run = tmp_path / "run"
    proc = train("ddp", run, *FAST, "--data", str(data), ok=False)
    assert proc.returncode != 0
    assert "cannot tell the data format from its fields (answer, question)" in proc.stderr
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert manifest(run)["status"] == "failed"
