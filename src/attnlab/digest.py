"""Content names: a cached dataset, a table cell or a resumable run is named after everything that determines it,
so a changed setting gets a new name instead of reusing stale work."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(value: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``value`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]
