"""Content names: a cached dataset, a table cell or a resumable run is named after everything that determines it,
so a changed setting gets a new name instead of reusing stale work."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from attnlab.files import write_atomic


def digest(value: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``value`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]


def start_identity(init_from: str) -> str:
    """A start checkpoint in a run's ``checkpoints/`` is named by that run, whose name is its identity: a fine-tune
    cell keeps its name, and resumes, when the repository or the runs directory moves. Any other start (a hub id, a
    file of the user's) is what it says."""
    path = Path(init_from)
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"run:{path.parent.parent.name}/{path.name}"
    return init_from


def file_sha256(path: Path, cache_dir: Path) -> str:
    """The SHA-256 of a file's content, remembered under ``cache_dir/sha256/`` by its path, size and modification
    time, so naming a table's grid reads a large corpus once. The record is written atomically: jobs that name cells
    side by side never read half of one."""
    path = path.resolve()
    stat = path.stat()
    key = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    record = cache_dir / "sha256" / f"{digest(str(path))}.json"
    try:
        remembered = json.loads(record.read_text())
    except (OSError, ValueError):  # none yet, or damaged outside attnlab: read the file again
        remembered = {}
    if remembered.get("sha256_of") == key:
        return remembered["sha256"]
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    write_atomic(record, json.dumps({"sha256_of": key, "sha256": sha.hexdigest()}))
    return sha.hexdigest()
