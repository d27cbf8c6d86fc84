"""The one way to a ``GPT``: from scratch, from a pretrained source (``hf:<name|dir>`` or one of our ``.ckpt``
files, the variant swapped in at its fine-tune init), or restored exactly from a run's weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from attnlab.errors import ConfigError
from attnlab.models.checkpoint import load_checkpoint, restore_gpt
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT
from attnlab.models.hf import (
    INIT_FROM_PREFIX,
    NOT_IN_CHECKPOINT,
    apply_overrides,
    load_hf_checkpoint,
    load_pretrained_into,
    parse_init_from,
)

# What fine-tuning takes from our config; the rest of the architecture is the pretrained checkpoint's.
FINETUNE_OVERRIDES = ("dropout", "head_mask")


def build_gpt(
    model: Mapping[str, Any],
    attention: Mapping[str, Any] | str = "vanilla",
    weights: Mapping[str, Tensor] | None = None,
) -> GPT:
    """``weights``: restore a run exactly; else ``model.init_from`` set: fine-tune init; else a fresh model."""
    attention = {"name": attention} if isinstance(attention, str) else dict(attention)
    model = dict(model)
    if weights is not None:
        return restore_gpt(model, attention, weights)
    if not model.get("init_from"):
        return GPT(ModelConfig.from_dict(model), attention)
    overrides = {key: model[key] for key in FINETUNE_OVERRIDES if key in model}
    return finetune_init(*pretrained_weights(model["init_from"]), attention, overrides)


def pretrained_weights(init_from: str) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Architecture and weights of ``hf:<name|dir>`` or of one of our checkpoints (its variant's own left out)."""
    if init_from.startswith(INIT_FROM_PREFIX):
        return load_hf_checkpoint(parse_init_from(init_from))
    if not init_from.endswith(".ckpt"):
        raise ConfigError(
            "model.init_from",
            f"got {init_from!r}; expected 'hf:<hub name or local directory>', a path to .ckpt or null",
        )
    run = load_checkpoint(init_from, key="model.init_from")
    config = ModelConfig.from_dict(run.spec["model"])
    config.tokenizer = config.tokenizer or str(Path(init_from).resolve())  # else the tokenizer inside the ckpt
    config.init_from = init_from
    return config, {key: value for key, value in run.state_dict.items() if not NOT_IN_CHECKPOINT.search(key)}


def finetune_init(
    config: ModelConfig, state: dict[str, Tensor], attention: Mapping[str, Any] | str, overrides: dict[str, Any]
) -> GPT:
    """A ``GPT`` with pretrained weights and the variant at its fine-tune init, so it computes what the source does.

    ``overrides`` are ModelConfig fields: runtime ones (dropout, block_size, ...) are applied; a smaller
    ``block_size`` keeps the first rows of learned position embeddings.
    """
    config = apply_overrides(config, overrides)
    config.extra = {**config.extra, "init_from": config.init_from}  # provenance, kept in every later checkpoint
    if "wpe.weight" in state:
        state["wpe.weight"] = state["wpe.weight"][: config.block_size]
    attention = {"name": attention} if isinstance(attention, str) else dict(attention)
    model = GPT(config, attention)
    load_pretrained_into(model, state)
    model.init_variant_for_finetuning()
    return model.eval()


def from_hf(path_or_name: str, attention: Mapping[str, Any] | str = "vanilla", **overrides: Any) -> GPT:
    """An HF checkpoint (hub name or directory) with ``attention`` at its fine-tune init (see ``finetune_init``)."""
    return finetune_init(*load_hf_checkpoint(path_or_name), attention, overrides)
