"""What the trainer reads as data, known to the host too (`invoke run --dry` checks inputs as the trainer will)."""

import re

# file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
# org/name: a dataset or model id as the hub spells it (looked up in the local cache only: no network)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
