"""Inputs that used to fail silently or deep inside a library: a results.csv cut before its newline, a NaN
evaluation row, an empty or binary data file."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from attnlab.data import TextDataModule
from attnlab.errors import ConfigError
from attnlab.eval.harness import append_csv


def test_a_row_is_never_glued_onto_a_last_row_without_newline(tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    results.write_text("run_id,ppl\r\nfirst,12.5")  # the last row lacks its newline
    append_csv(results, {"run_id": "second", "ppl": 11.0})
    assert list(csv.DictReader(results.open(newline=""))) == [
        {"run_id": "first", "ppl": "12.5"},
        {"run_id": "second", "ppl": "11.0"},
    ]


def test_a_nan_metric_is_refused_not_tabled(tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    append_csv(results, {"checkpoint": "a.ckpt", "ppl": 11.0})
    with pytest.raises(ConfigError, match=r"checkpoint: b.ckpt scores non-finite ppl"):
        append_csv(results, {"checkpoint": "b.ckpt", "ppl": float("nan")})
    assert [r["checkpoint"] for r in csv.DictReader(results.open(newline=""))] == ["a.ckpt"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty"),
        (b"  \n\n ", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text"),
        (b"text\x00with NUL", "contains NUL bytes"),
    ],
)
def test_an_unreadable_data_file_is_named(content: bytes, problem: str, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("A paragraph.\n\nAnother one.\n")
    bad.write_bytes(content)
    data = TextDataModule(name="files", source="files", files=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=rf"data.files: {bad} {problem}"):
        data.prepare()
