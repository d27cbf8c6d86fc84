"""attnlab: GPT-style language models with interchangeable attention, trained with Lightning and Hydra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from types import ModuleType

    from tokenizers import Tokenizer

    from attnlab.models import GPT

__all__ = ["build_model", "evaluate", "from_hf", "load", "pin_cpu_kernels", "tables", "train"]


def train(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train as ``attnlab-train <overrides>`` does, in this process; returns the run's results (``output_dir``...)."""
    from attnlab.api import train as run

    return run(overrides)


def evaluate(checkpoint: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate our checkpoint (``.ckpt`` or run directory) or an HF model as ``attnlab-eval`` does; its results."""
    from attnlab.api import evaluate as run

    return run(checkpoint, overrides)


def load(path: str | Path, attention: dict | str = "vanilla") -> tuple[GPT, Tokenizer]:
    """``(model, tokenizer)`` from our checkpoint (``.ckpt`` or run directory) or an HF directory or hub name."""
    from attnlab.api import load as run

    return run(path, attention)


def pin_cpu_kernels() -> dict[str, str]:
    """The commands' reproducible numbers in this process: ATen's and MKL's AVX2 kernels (``attnlab/numerics.py``).
    Call it before any torch operation (both libraries choose at their first kernel); returns what it set."""
    from attnlab.numerics import pin_cpu_kernels as pin

    return pin()


def __getattr__(name: str) -> ModuleType:
    """``attnlab.tables.reproduce(name, scale)`` after a plain ``import attnlab``: the subpackage on first use."""
    if name == "tables":
        import importlib

        return importlib.import_module("attnlab.tables")
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def build_model(cfg: Any) -> GPT:
    """The model a composed config describes (``cfg.model``, ``cfg.attention``), through the one builder:
    from scratch, or from ``model.init_from`` (``hf:<name|dir>`` or one of our ``.ckpt`` files)."""
    from attnlab.configs import plain
    from attnlab.models import build_gpt

    return build_gpt(plain(cfg.model), plain(cfg.attention))


def from_hf(path_or_name: str, attention: dict | str = "vanilla", **overrides: Any) -> GPT:
    """A Hugging Face GPT-2 / GPT-NeoX / Llama checkpoint (hub name or directory) with ``attention`` swapped in."""
    from attnlab.models.builder import from_hf as load

    return load(path_or_name, attention=attention, **overrides)
