"""Regenerate the sample data in data/ and the tiny model's tokenizer in dockyard/train/assets/.

    python -m dockyard.train.make_assets

Both are generated (seeded, so the output is the same every time) rather than copied from somewhere:
the sentences follow simple patterns so that even a tiny model's loss falls within a few steps, which
is what the recipe tests and the quick start need.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dockyard import ROOT

DATA = ROOT / "data"
TINY_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-llama"

VESSELS = ["Aurora", "Bramble", "Cormorant", "Dunlin", "Egret", "Fulmar", "Gannet", "Heron", "Ibis", "Jackdaw"]
PORTS = ["Rotterdam", "Antwerp", "Hamburg", "Gdansk", "Genoa", "Valencia", "Piraeus", "Bergen", "Tallinn", "Lisbon"]
CARGO = ["grain", "timber", "coffee", "steel coils", "wind blades", "copper", "wool", "salt", "paper", "olive oil"]
CALM = ["light breeze", "clear skies", "slight swell", "calm sea", "gentle wind", "good visibility"]
STORM = ["gale warning", "heavy swell", "storm force winds", "driving rain", "thick fog", "rough sea"]


def harbour_log(rng: random.Random) -> str:
    """One log entry: a few sentences whose structure repeats, so a language model learns it quickly."""
    vessel, port, cargo = rng.choice(VESSELS), rng.choice(PORTS), rng.choice(CARGO)
    berth, crates = rng.randint(1, 40), rng.randint(2, 90) * 10
    hour = rng.randint(0, 23)
    weather = rng.choice(CALM + STORM)
    return (f"The vessel {vessel} docked at {port} berth {berth} at {hour:02d}:00. "
            f"She carried {crates} containers of {cargo}. "
            f"Weather on arrival: {weather}. The crane crew unloaded the {cargo} before the next tide.")


def weather_report(rng: random.Random) -> dict:
    """A report labelled 'storm' or 'calm': the label follows from the words used, so it can be learned."""
    label = rng.choice(["calm", "storm"])
    words = rng.sample(CALM if label == "calm" else STORM, 2)
    port = rng.choice(PORTS)
    return {"text": f"Forecast for {port}: {words[0]} and {words[1]} expected this afternoon.", "label": label}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_tokenizer(texts: list[str], vocab_size: int = 512) -> Tokenizer:
    """Byte-level BPE: any text encodes (no unknown tokens), and the vocabulary stays tiny."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main() -> None:
    rng = random.Random(0)
    logs = [{"text": harbour_log(rng)} for _ in range(2000)]
    reports = [weather_report(rng) for _ in range(1000)]
    write_jsonl(DATA / "sample.jsonl", logs)
    write_jsonl(DATA / "sample-classify.jsonl", reports)

    tok = make_tokenizer([r["text"] for r in logs + reports])
    TINY_MODEL.mkdir(parents=True, exist_ok=True)
    tok.save(str(TINY_MODEL / "tokenizer.json"))
    (TINY_MODEL / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "model_max_length": 512,
    }, indent=2) + "\n")
    print(f"wrote {DATA / 'sample.jsonl'}, {DATA / 'sample-classify.jsonl'}, {TINY_MODEL / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
