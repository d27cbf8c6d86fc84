"""Models: the config dataclass and the GPT built from it.

Each name is imported on first use: ``attnlab.resolvers`` reads ``attnlab.models.config`` while Hydra composes a
config (``--help`` included), which must not pay for the model's modules."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab.models.builder import build_gpt
    from attnlab.models.config import ModelConfig
    from attnlab.models.gpt import GPT

__all__ = ["GPT", "ModelConfig", "build_gpt"]
_MODULES = {"GPT": "attnlab.models.gpt", "ModelConfig": "attnlab.models.config", "build_gpt": "attnlab.models.builder"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'attnlab.models' has no attribute {name!r}")
