"""Plumbing every metric shares: the metric registry, batches of token ids, eval mode, the LM loss and recorded
attention maps."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention import CausalSelfAttention
from attnlab.models.gpt import GPT
from attnlab.nn_utils import forward_hooks, next_token_loss

Tokens = Tensor | Iterable[Tensor]  # one (B, T) batch, a 1-D sequence, or an iterable of either


@dataclass
class AnalysisInputs:
    """What ``run_analysis`` hands every metric: the model, its tokenizer, the rows to score, the options."""

    model: GPT
    tokenizer: Any  # tokenizers.Tokenizer, to decode tokens for figures
    batches: list[Tensor]  # perplexity-type metrics: at most ``eval_max_tokens`` tokens
    map_batches: list[Tensor]  # attention-map metrics: the first ``max_tokens`` tokens
    options: dict[str, Any]
    out: Path  # the analysis folder: a metric writes its figures and CSVs here
    seq_len: int
    files: list[str] = field(default_factory=list)  # what the metrics wrote to ``out``

    def rows(self, tokens: Tensor, max_tokens: int | None = None) -> list[Tensor]:
        """A 1-D stream (or (N, T) rows) as batches of ``seq_len``-token rows on the model's device."""
        batch_size = self.options["batch_size"]
        batches = windows(tokens, self.seq_len, batch_size) if tokens.dim() == 1 else list(tokens.split(batch_size))
        if max_tokens is not None:
            batches = first_tokens(batches, max_tokens)
        return [b.to(device_of(self.model)) for b in batches]


@dataclass(frozen=True)
class Metric:
    """One section of analysis.json: how to compute it, its own options, its headline numbers, its printout."""

    compute: Callable[[AnalysisInputs], dict[str, Any] | None]  # None: the metric does not apply to this model
    options: dict[str, Any]  # option -> default; run_analysis accepts these besides the shared ones
    headline: dict[str, str]  # summary key -> key of the section, copied into analysis.json's "summary"
    describe: Callable[[dict[str, Any]], list[str]]  # the section -> lines for ``format_summary``


METRICS: dict[str, Metric] = {}  # in registration order, which is the order they run and print in


def register_metric(
    name: str,
    options: dict[str, Any] | None = None,
    headline: dict[str, str] | None = None,
    describe: Callable[[dict[str, Any]], list[str]] = lambda section: [],
) -> Callable[[Callable[[AnalysisInputs], dict[str, Any] | None]], Callable]:
    """Decorator: make ``compute(inputs)`` the analysis metric ``name`` (``analysis.metrics`` lists it)."""

    def decorate(compute: Callable[[AnalysisInputs], dict[str, Any] | None]) -> Callable:
        if name in METRICS:
            raise ValueError(f"analysis metric {name!r} registered twice")
        METRICS[name] = Metric(compute, dict(options or {}), dict(headline or {}), describe)
        return compute

    return decorate


def per_layer_line(label: str, values: list[float]) -> str:
    """``label  mean m; per layer v1 v2 ...``, the printout's form for a per-layer quantity."""
    numbers = " ".join(f"{v:.3g}" for v in values)
    return f"  {label:<23} mean {sum(values) / len(values):.4g}; per layer {numbers}"


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


def probed(
    model: nn.Module, tokens: Tokens, probe: str, describe: Callable[[nn.Module, list[Tensor]], dict[str, Any]]
) -> list[dict[str, Any] | None] | None:
    """Per layer, ``describe(variant, values)`` of what its variant recorded as ``probe`` over every batch of
    ``tokens`` (None for a layer without that probe); None when no layer has it, so the metric does not apply."""
    model = unwrap(model)
    variants = [block.attn.variant for block in model.blocks]
    if not any(probe in variant.probes() for variant in variants):
        return None
    with evaluating(model), recording(model) as recorded:
        for batch in as_batches(tokens, device_of(model)):
            model(batch)
    layers = zip(variants, recorded, strict=True)
    return [describe(variant, probes[probe]) if probe in probes else None for variant, probes in layers]


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

    for layer in layers:
        layer.record_probabilities = True
    try:
        with forward_hooks((layer, hand_over(i)) for i, layer in enumerate(layers)):
            yield
    finally:
        for layer, flag in zip(layers, previous, strict=True):
            layer.record_probabilities = flag
            layer.probabilities = None


@torch.no_grad()
def mean_loss(model: nn.Module, batches: list[Tensor]) -> float:
    """Token-weighted next-token cross-entropy over all batches (each row predicts its tokens 2..T)."""
    total, count = 0.0, 0
    with evaluating(model):
        for batch in batches:
            total += next_token_loss(model, batch, reduction="sum").item()
            count += batch[:, 1:].numel()
    if count == 0:
        raise ValueError("no tokens to score: every row needs at least 2 tokens")
    return total / count


def perplexity(model: nn.Module, batches: list[Tensor]) -> float:
    return math.exp(mean_loss(model, batches))
