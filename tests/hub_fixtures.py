"""Local copies of hub datasets in the hub's own layout and schema, built from real text, for offline tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

WIKITEXT_README = """---
configs:
- config_name: {config}
  data_files:
  - split: test
    path: {config}/test-*
  - split: train
    path: {config}/train-*
  - split: validation
    path: {config}/validation-*
---
# wikitext (test fixture with the Salesforce/wikitext layout)
"""


def wikitext_lines(docs: list[dict[str, str]]) -> list[str]:
    """WikiText's raw format: one row per line, ' = Title = ' headings, ' \\n' blank rows between paragraphs."""
    rows: list[str] = []
    for doc in docs:
        rows += [" \n", f" = {doc['title']} = \n", " \n"]
        for paragraph in doc["text"].splitlines():
            rows += [f" {paragraph} \n", " \n"]
    return rows


def make_wikitext(root: Path, docs: list[dict[str, str]], config: str = "wikitext-2-raw-v1") -> Path:
    """A directory that ``load_dataset(root, config)`` reads like ``Salesforce/wikitext``."""
    (root / config).mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text(WIKITEXT_README.format(config=config))
    splits = {"train": docs[:-2], "validation": docs[-2:-1], "test": docs[-1:]}
    for split, split_docs in splits.items():
        table = pa.table({"text": wikitext_lines(split_docs)})
        pq.write_table(table, root / config / f"{split}-00000-of-00001.parquet")
    return root


def make_slimpajama(root: Path, docs: list[dict[str, str]]) -> Path:
    """A directory with SlimPajama's layout: ``{train,validation}/chunk1/*.jsonl.zst`` of ``{text, meta}``."""
    splits = {"train": ("example_train", docs[:-2]), "validation": ("example_holdout", docs[-2:])}
    for split, (stem, split_docs) in splits.items():
        folder = root / split / "chunk1"
        folder.mkdir(parents=True, exist_ok=True)
        half = max(1, len(split_docs) // 2)
        for shard, part in enumerate([split_docs[:half], split_docs[half:]]):
            if not part:
                continue
            lines = "".join(
                json.dumps({"text": d["text"], "meta": {"redpajama_set_name": "RedPajamaWikipedia"}}) + "\n"
                for d in part
            )
            (folder / f"{stem}_{shard}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return root
