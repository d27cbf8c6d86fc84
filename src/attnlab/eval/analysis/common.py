"""Plumbing every metric shares: batches of token ids, eval mode, the LM loss and recorded attention maps."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention import CausalSelfAttention
from attnlab.models.gpt import GPT

Tokens = Tensor | Iterable[Tensor]  # one (B, T) batch, a 1-D sequence, or an iterable of either


def unwrap(model_or_module: nn.Module) -> GPT:
    """The ``GPT`` itself, given it or a LightningModule holding it as ``.model``."""
    model = getattr(model_or_module, "model", model_or_module)
    if not isinstance(model, GPT):
        raise TypeError(f"expected a GPT or a module with a GPT as .model, got {type(model_or_module).__name__}")
    return model


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def as_batches(tokens: Tokens, device: torch.device | None = None) -> list[Tensor]:
    """A list of (B, T) long tensors on ``device``; a 1-D tensor is one sequence."""
    items = [tokens] if isinstance(tokens, Tensor) else list(tokens)
    batches = []
    for item in items:
        batch = torch.as_tensor(item).long()
        batches.append((batch[None] if batch.dim() == 1 else batch).to(device))
    return batches


def first_tokens(batches: list[Tensor], max_tokens: int) -> list[Tensor]:
    """The first ``max_tokens`` tokens, row by row: whole rows, then one shortened row as its own batch."""
    kept, left = [], max_tokens
    for batch in batches:
        rows, length = batch.shape
        whole = min(rows, left // length)
        if whole:
            kept.append(batch[:whole])
            left -= whole * length
        if whole < rows and 0 < left < length:
            kept.append(batch[whole : whole + 1, :left])
            left = 0
        if left == 0:
            break
    return kept


def windows(stream: Tensor, seq_len: int, batch_size: int) -> list[Tensor]:
    """Cut a 1-D token stream into non-overlapping rows of ``seq_len`` (a leftover row is dropped unless it is
    the only one), grouped ``batch_size`` rows a batch."""
    rows = stream.long().view(-1)
    if rows.numel() < seq_len:
        return [rows[None]]
    rows = rows[: rows.numel() // seq_len * seq_len].view(-1, seq_len)
    return list(rows.split(batch_size))


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration, then the caller's mode back."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def recording(model: nn.Module) -> Iterator[list[dict[str, list[Tensor]]]]:
    """Per layer, the values its variant ``record``s while the model runs (gates, temperatures: ``probes()``)."""
    variants = [block.attn.variant for block in unwrap(model).blocks]
    for variant in variants:
        variant.recorded = {}
    try:
        yield [variant.recorded for variant in variants]
    finally:
        for variant in variants:
            variant.recorded = None


@contextmanager
def attention_maps(model: GPT, consume: Callable[[int, Tensor], None]) -> Iterator[None]:
    """Route every layer through its plain-math reference path and hand each map (B, H, T, T) to
    ``consume(layer_index, map)`` as soon as the layer has run, so only one layer's map is held at a time.

    The ``record_probabilities`` flags are restored and the stored maps dropped afterwards, so the fused
    training path is untouched.
    """
    layers = [block.attn for block in model.blocks]
    previous = [layer.record_probabilities for layer in layers]

    def hand_over(i: int):
        def hook(layer: CausalSelfAttention, _args: tuple[Any, ...], _output: Tensor) -> None:
            consume(i, layer.probabilities.detach())
            layer.probabilities = None

        return hook

    handles = [layer.register_forward_hook(hand_over(i)) for i, layer in enumerate(layers)]
    for layer in layers:
        layer.record_probabilities = True
    try:
        yield
    finally:
        for layer, flag, handle in zip(layers, previous, handles, strict=True):
            layer.record_probabilities = flag
            layer.probabilities = None
            handle.remove()


@torch.no_grad()
def mean_loss(model: nn.Module, batches: list[Tensor]) -> float:
    """Token-weighted next-token cross-entropy over all batches (each row predicts its tokens 2..T)."""
    total, count = 0.0, 0
    with evaluating(model):
        for batch in batches:
            logits = model(batch[:, :-1])
            total += F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
            count += batch[:, 1:].numel()
    if count == 0:
        raise ValueError("no tokens to score: every row needs at least 2 tokens")
    return total / count


def perplexity(model: nn.Module, batches: list[Tensor]) -> float:
    return math.exp(mean_loss(model, batches))
