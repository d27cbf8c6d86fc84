"""The torch plumbing that training, benchmarks, analysis and head importance all need."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

LOSS_CHUNK_TOKENS = 4096  # rows of logits a chunked cross-entropy holds at a time


def next_token_loss(
    model: nn.Module, tokens: Tensor, reduction: str = "mean", documents: Tensor | None = None
) -> Tensor:
    """Cross-entropy of each row's tokens 2..T given the ones before, from (B, T) ids; logits in fp32 so a bf16
    forward does not round the loss. ``documents``: the inputs' document ids, for document masking (a ``GPT``)."""
    logits = model(tokens[:, :-1]) if documents is None else model(tokens[:, :-1], documents=documents)
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction=reduction)


def fused_next_token_loss(model: nn.Module, tokens: Tensor, documents: Tensor | None = None) -> Tensor:
    """``next_token_loss`` (mean) without the (B*T, vocab) logits in memory: Liger-Kernel's fused linear +
    cross-entropy where it is installed and the model is on a GPU, else the head and the loss over chunks of
    ``LOSS_CHUNK_TOKENS`` rows, each chunk's logits recomputed in backward (``torch.compile`` fuses each chunk's
    cast and log-softmax). A padded head's extra rows never reach the loss. ``model``: a ``GPT``; ``documents``: as in
    ``next_token_loss``."""
    features = model.features(tokens[:, :-1], documents=documents).flatten(0, 1)
    targets, vocab, weight = tokens[:, 1:].flatten(), model.config.vocab_size, model.lm_head.weight
    if features.is_cuda and importlib.util.find_spec("liger_kernel") is not None:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss()(weight[:vocab], features, targets)
    total = features.new_zeros((), dtype=torch.float32)
    for start in range(0, len(targets), LOSS_CHUNK_TOKENS):
        rows = slice(start, start + LOSS_CHUNK_TOKENS)
        total = total + checkpoint(_summed_loss, features[rows], weight, targets[rows], vocab, use_reentrant=False)
    return total / len(targets)


def _summed_loss(features: Tensor, weight: Tensor, targets: Tensor, vocab: int) -> Tensor:
    """Summed cross-entropy of one chunk: the (padded, aligned) head's GEMM, then its first ``vocab`` logits."""
    return F.cross_entropy((features @ weight.T)[:, :vocab].float(), targets, reduction="sum")


@contextmanager
def forward_hooks(hooks: Iterable[tuple[nn.Module, Callable]], pre: bool = False) -> Iterator[None]:
    """Each ``(module, hook)`` registered as a forward hook (``pre``: a forward pre-hook) for the duration, and
    removed afterwards even when the body raises, so analysis never leaves a hook on a model."""
    handles = []
    try:
        for module, hook in hooks:
            handles.append(module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
