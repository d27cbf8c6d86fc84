"""Content names: a cached dataset, a table cell or a resumable run is named after everything that determines it,
so a changed setting gets a new name instead of reusing stale work."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


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
