"""The local corpora a config names by place (data=text_files's files, data=registry_text's build) and the content
that tells two texts under one config apart: a run's name, its caches' keys and its record carry it."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import attnlab.data.registry as registry  # the module (tests replace its functions), named below its package
from attnlab.digest import digest, file_sha256
from attnlab.errors import ConfigError


def resolve_text_files(patterns: str | Sequence[str]) -> list[str]:
    """The files ``data.files`` names (paths or globs, from the directory the command starts in), each checked to be
    text."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ConfigError("data.files", "data=text_files needs data.files (paths or globs of text files)")
    resolved = sorted({match for pattern in patterns for match in glob.glob(pattern, recursive=True)})
    resolved = [f for f in resolved if Path(f).is_file()]
    if not resolved:
        raise ConfigError("data.files", f"no files match {patterns}")
    for path in resolved:
        _require_text_file(path)
    return resolved


def corpus_sha256(source: str, files: str | Sequence[str], cache_dir: Path) -> str | None:
    """12 hex digits naming a local corpus's text: the registry build's SHA-256 (Debian's packages move with stable's
    point releases), or one over the user's files' (edited in place, they keep their names). None for the embedded
    corpus, which the installed package fixes, and for the hub's, which are named by their revision."""
    if source == "registry":
        return registry.corpus_fingerprint(cache_dir)
    if source == "files":
        return digest([file_sha256(Path(path), cache_dir) for path in resolve_text_files(files)], 12)
    return None


def _require_text_file(path: str) -> None:
    """Fail naming the file, before ``datasets`` fails on it without a name (empty, binary, not UTF-8)."""
    with open(path, "rb") as fh:
        head = fh.read(65536)
    if not head.strip():
        raise ConfigError("data.files", f"{path} is empty; text files with at least two paragraphs are allowed")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a multi-byte character cut at the end of the sample
            raise ConfigError("data.files", f"{path} is not UTF-8 text; only text files are allowed") from None
    if b"\0" in head:
        raise ConfigError("data.files", f"{path} contains NUL bytes (binary?); only text files are allowed")
