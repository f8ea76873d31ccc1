"""What the trainer reads as data, known to the host too (`invoke run --dry` checks inputs as the trainer will)."""

import re
from pathlib import Path

# file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
# org/name: a dataset or model id as the hub spells it (looked up in the local cache only: no network)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def holds_text(path: Path) -> bool:
    """Whether a data file holds anything but whitespace, read only up to its first other byte."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return True
    return False
