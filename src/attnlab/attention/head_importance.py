"""Head importance and pruning (Michel et al. 2019).

The head mask xi_l,h multiplies head h's output before W_o (buffer ``head_mask`` of each layer). Importance is
``I_l,h = sum over tokens |dL/dxi_l,h|``: as in the authors' code each token gets its own mask variable, so the
absolute value is taken per token before summing, then each layer's row is L2-normalised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from attnlab.nn_utils import forward_hooks, next_token_loss


def head_importance(model: nn.Module, batches: Iterable[Tensor], normalise: bool = True) -> Tensor:
    """(n_layer, H) importance of every head from the next-token loss on (B, T) ``batches``, in eval mode; a head
    already masked to 0 scores 0."""
    per_token_masks: list[Tensor] = []

    def token_mask(n_head: int) -> Callable[[nn.Module, tuple[Tensor]], tuple[Tensor]]:
        def hook(proj: nn.Module, args: tuple[Tensor]) -> tuple[Tensor]:
            """Multiply the W_o input (B, T, H*d_h) by a ones mask (B, T, H, 1) to differentiate against."""
            (heads,) = args
            xi = torch.ones(*heads.shape[:-1], n_head, 1, dtype=heads.dtype, device=heads.device)
            per_token_masks.append(xi.requires_grad_())
            return ((heads.unflatten(-1, (n_head, -1)) * xi).flatten(-2),)

        return hook

    blocks = list(model.blocks)
    masked = forward_hooks(((block.attn.proj, token_mask(block.attn.shape.n_head)) for block in blocks), pre=True)
    importance = torch.zeros(len(blocks), blocks[0].attn.shape.n_head, device=model.head_mask().device)
    was_training = model.training
    model.eval()
    try:
        with masked:
            for batch in batches:
                per_token_masks.clear()
                grads = torch.autograd.grad(next_token_loss(model, batch), per_token_masks)  # one per layer
                importance += torch.stack([g.abs().sum(dim=(0, 1)).squeeze(-1).float() for g in grads])
    finally:
        model.train(was_training)
    if normalise:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp_min(1e-20)
    return importance


def prune_heads_by_importance(importance: Tensor, n_pruned: int, mask: Tensor | None = None) -> Tensor:
    """A {0, 1} mask with ``n_pruned`` heads off in total: those already off in ``mask``, then the least important."""
    mask = torch.ones_like(importance) if mask is None else mask
    order = importance.masked_fill(mask == 0, float("-inf")).flatten().argsort(stable=True)
    pruned = torch.ones(importance.numel(), device=importance.device)
    pruned[order[:n_pruned]] = 0
    return pruned.view_as(importance)
