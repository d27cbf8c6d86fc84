"""attnlab: GPT-style language models with interchangeable attention, trained with Lightning and Hydra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab.models import GPT

__all__ = ["build_model", "from_hf"]


def build_model(cfg: Any) -> GPT:
    """The model a composed config describes (``cfg.model``, ``cfg.attention``); loads HF weights if ``init_from``."""
    from omegaconf import OmegaConf

    from attnlab.models import GPT, ModelConfig

    model = OmegaConf.to_container(cfg.model, resolve=True) if OmegaConf.is_config(cfg.model) else dict(cfg.model)
    attention = cfg.attention
    attention = OmegaConf.to_container(attention, resolve=True) if OmegaConf.is_config(attention) else dict(attention)
    if model.get("init_from"):
        from attnlab.models.hf import from_hf as load
        from attnlab.models.hf import parse_init_from

        return load(parse_init_from(model["init_from"]), attention=attention)
    return GPT(ModelConfig.from_dict(model), attention)


def from_hf(path_or_name: str, attention: dict | str = "vanilla", **overrides: Any) -> GPT:
    """A Hugging Face GPT-2 / GPT-NeoX / Llama checkpoint (hub name or directory) with ``attention`` swapped in."""
    from attnlab.models.hf import from_hf as load

    return load(path_or_name, attention=attention, **overrides)
