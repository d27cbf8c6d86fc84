"""The two pieces of torch plumbing that training, benchmarks, analysis and head importance all need."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch.nn.functional as F
from torch import Tensor, nn


def next_token_loss(model: nn.Module, tokens: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of each row's tokens 2..T given the ones before, from (B, T) ids; logits in fp32 so a bf16
    forward does not round the loss."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction=reduction)


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
