"""Training: the LightningModule and the Hydra-driven run.

``LanguageModel`` is imported on first use: Hydra's plugin discovery imports ``attnlab.training.sweeps`` on every
command (``--help`` and shell completion included), which must not pay for Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab.training.module import LanguageModel

__all__ = ["LanguageModel"]


def __getattr__(name: str) -> Any:
    if name == "LanguageModel":
        from attnlab.training.module import LanguageModel

        return LanguageModel
    raise AttributeError(f"module 'attnlab.training' has no attribute {name!r}")
