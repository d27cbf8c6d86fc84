"""Our model's real size per paper row: a table's rows keep the paper's names ("OPT-125m"), so every figure prints
the parameters of the model that actually stands in for them, counted from the cell's composed config."""

from __future__ import annotations

from typing import Any

import torch

from attnlab.models.builder import build_gpt


def config_parameters(model: dict[str, Any], attention: dict[str, Any], tokenizer_vocab_size: int | None) -> int:
    """Parameters of ``train.py``'s model for this config, built on the meta device (no memory, any size): a model
    on our own BPE takes the tokenizer's vocabulary, as ``train.py`` sets it (``tokenizer_vocab_size``: the data's;
    exact when the corpus fills it, which the embedded corpus does)."""
    model = {k: v for k, v in model.items() if k != "init_from"}
    if not model.get("tokenizer") and tokenizer_vocab_size:
        model["vocab_size"] = tokenizer_vocab_size
    with torch.device("meta"):
        return build_gpt(model, attention).num_parameters()
