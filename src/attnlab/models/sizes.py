"""A model's sizes, checked before anything is built: against the weights that will fill it and against the memory
this machine has. Every way to a model goes through here (our checkpoints' records, a Hugging Face ``config.json``,
a config from scratch), because a size is data from a file: one claiming a million layers must be one line, not a
process that allocates until the machine stops."""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

from attnlab.errors import ConfigError, require
from attnlab.models.config import ModelConfig

FLOAT32_BYTES = 4  # every model is built in float32 (a lower precision is a cast afterwards)
BLOCK_INDEX = re.compile(r"blocks\.(\d+)\.")


def parameter_count(config: ModelConfig) -> int:
    """The parameters (and the one vocabulary-sized buffer) ``GPT(config)`` allocates, counted from the sizes alone:
    nothing is built, so a config of any size is counted at once. Variants' own parameters (a few per head) are
    left out."""
    width, rows, mlp = config.n_embd, config.embedding_rows, config.mlp_width
    kv_width = config.n_kv_head * config.head_dim
    bias = int(config.bias)
    norm = width * (1 if config.family == "llama" else 1 + bias)
    attention = width * (width + 2 * kv_width) + width * width + bias * (2 * width + 2 * kv_width)
    gated = config.family == "llama"
    feed_forward = width * mlp * (3 if gated else 2) + bias * (mlp * (2 if gated else 1) + width)
    embeddings = rows * width * (1 if config.tie_embeddings else 2)
    positions = config.block_size * width if config.pos_encoding == "learned" else 0
    return embeddings + positions + config.n_layer * (2 * norm + attention + feed_forward) + norm + config.vocab_size


def available_memory() -> int:
    """Bytes this machine can give a new allocation now without swapping (the kernel's MemAvailable)."""
    import psutil

    return psutil.virtual_memory().available


def check_fits_in_memory(config: ModelConfig, source: str, key: str) -> None:
    """The weights alone must fit in the memory available now; ``source`` names what claimed the sizes."""
    needed = parameter_count(config) * FLOAT32_BYTES
    available = available_memory()
    require(
        needed <= available,
        key,
        f"{source}: a model of n_layer={config.n_layer}, n_embd={config.n_embd}, MLP width {config.mlp_width}, "
        f"{config.embedding_rows} vocabulary rows and block_size={config.block_size} needs {needed / 2**30:,.1f} GiB "
        f"for its weights alone; this machine has {available / 2**30:,.1f} GiB available",
    )


def check_against_weights(
    config: ModelConfig, weights: Mapping[str, Tensor], source: str, key: str, claimant: str = "config"
) -> None:
    """Each size ``config`` claims must be the one the weights (in our parameter names) have: the layers, the
    embedding's rows and width, the learned positions, the MLP's and the fused q/k/v projection's widths. A source
    with no weights is refused (there would be nothing to check the sizes against), and so is a weight of the wrong
    shape; then the memory the model needs is checked. ``claimant``: what in ``source`` states the sizes."""
    require(bool(weights), key, f"{source} holds no model weights; there is nothing to build a model from")
    blocks = {int(match[1]) for name in weights if (match := BLOCK_INDEX.match(name))}
    claims = {
        "n_layer": (config.n_layer, len(blocks) if blocks else None),
        "block_size": (config.block_size, rows_of(weights, "wpe.weight", source, key)),
        "vocab_size": (config.embedding_rows, rows_of(weights, "wte.weight", source, key)),
        "n_embd": (config.n_embd, width_of(weights, "wte.weight")),
        "intermediate_size": (config.mlp_width, rows_of(weights, "blocks.0.mlp.fc.weight", source, key)),
        "n_head": (
            (config.n_head + 2 * config.n_kv_head) * config.head_dim,
            rows_of(weights, "blocks.0.attn.qkv.weight", source, key),
        ),
    }
    if config.pos_encoding != "learned":
        del claims["block_size"]  # no weight holds it; positions cost no memory
    for name, (claimed, actual) in claims.items():
        if actual is None or claimed == actual:
            continue
        what = "q/k/v rows (n_head, n_kv_head, n_embd)" if name == "n_head" else f"model.{name}"
        raise ConfigError(
            key,
            f"{source}: its {claimant} says {what}={claimed} but its weights have {actual}; the file is inconsistent",
        )
    check_fits_in_memory(config, source, key)


def rows_of(weights: Mapping[str, Tensor], name: str, source: str, key: str) -> int | None:
    tensor = weights.get(name)
    if tensor is None:
        return None
    require(tensor.dim() == 2, key, f"{source}: its {name} has shape {tuple(tensor.shape)}, not a matrix")
    return int(tensor.shape[0])


def width_of(weights: Mapping[str, Tensor], name: str) -> int | None:
    tensor = weights.get(name)
    return int(tensor.shape[1]) if tensor is not None and tensor.dim() == 2 else None
