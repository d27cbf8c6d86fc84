"""attnlab: GPT-style language models with interchangeable attention, trained with Lightning and Hydra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnlab.numerics import pin_cpu_kernels

pin_cpu_kernels()  # before anything imports torch: the same numbers on every x86-64 CPU (attnlab/numerics.py)

if TYPE_CHECKING:
    from attnlab.models import GPT

__all__ = ["build_model", "from_hf"]


def build_model(cfg: Any) -> GPT:
    """The model a composed config describes (``cfg.model``, ``cfg.attention``), through the one builder:
    from scratch, or from ``model.init_from`` (``hf:<name|dir>`` or one of our ``.ckpt`` files)."""
    from attnlab.models import build_gpt
    from attnlab.runs import plain

    return build_gpt(plain(cfg.model), plain(cfg.attention))


def from_hf(path_or_name: str, attention: dict | str = "vanilla", **overrides: Any) -> GPT:
    """A Hugging Face GPT-2 / GPT-NeoX / Llama checkpoint (hub name or directory) with ``attention`` swapped in."""
    from attnlab.models.hf import from_hf as load

    return load(path_or_name, attention=attention, **overrides)
