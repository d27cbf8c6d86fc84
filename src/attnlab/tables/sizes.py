"""Our model's real size per paper row: a table's rows keep the paper's names ("OPT-125m"), so every figure prints
the parameters of the model that actually stands in for them, counted from the cell's composed config."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from attnlab.models.builder import build_gpt
from attnlab.models.gpt import GPT


def config_model(model: dict[str, Any], attention: dict[str, Any], tokenizer_vocab_size: int | None) -> GPT:
    """``train.py``'s model for this config, freshly initialised (no checkpoint): a model on our own BPE takes the
    tokenizer's vocabulary, as ``train.py`` sets it (``tokenizer_vocab_size``: the data's; exact when the corpus fills
    it, which the embedded corpus does)."""
    model = {k: v for k, v in model.items() if k != "init_from"}
    if not model.get("tokenizer") and tokenizer_vocab_size:
        model["vocab_size"] = tokenizer_vocab_size
    return build_gpt(model, attention)


def config_parameters(model: dict[str, Any], attention: dict[str, Any], tokenizer_vocab_size: int | None) -> int:
    """Parameters of ``config_model``, built on the meta device (no memory, any size)."""
    with torch.device("meta"):
        return config_model(model, attention, tokenizer_vocab_size).num_parameters()


def model_parts(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """A composed ``train.py`` config's model and attention sections, resolved as the job resolves them (clipped
    softmax's context length is ``${data.block_size}``), and the data's tokenizer vocabulary: ``config_model``'s
    arguments."""
    model, attention = (OmegaConf.to_container(cfg[key], resolve=True) for key in ("model", "attention"))
    from attnlab.data import backcopy  # (here: the datasets stack only where a table names the task)

    data = cfg.get("data") or {}
    if data.get("source") == backcopy.SOURCE:  # a word-level vocabulary of the task's characters, not a BPE
        return model, attention, backcopy.tokenizer_vocab_size(data["vocabulary"])
    return model, attention, data.get("tokenizer_vocab_size")
