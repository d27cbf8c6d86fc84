"""Head importance and pruning (Michel et al. 2019, seed 001; spec section 7).

The head mask xi_l,h multiplies head h's output before W_o (buffer ``head_mask`` of each layer). Importance is
``I_l,h = sum over tokens |dL/dxi_l,h|``: as in the authors' code each token gets its own mask variable, so the
absolute value is taken per token before summing, then each layer's row is L2-normalised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Batch = Tensor | tuple[Tensor, Tensor]


def language_model_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Mean next-token cross-entropy; ``batch`` is (B, T+1) token ids or an (inputs, targets) pair."""
    inputs, targets = (batch[:, :-1], batch[:, 1:]) if isinstance(batch, Tensor) else batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def head_importance(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[nn.Module, Batch], Tensor] = language_model_loss,
    normalise: bool = True,
) -> Tensor:
    """(n_layer, H) importance of every head, in eval mode; a head already masked to 0 scores 0."""
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
    handles = [block.attn.proj.register_forward_pre_hook(token_mask(block.attn.shape.n_head)) for block in blocks]
    importance = torch.zeros(len(blocks), blocks[0].attn.shape.n_head, device=model.head_mask().device)
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            per_token_masks.clear()
            grads = torch.autograd.grad(loss_fn(model, batch), per_token_masks)  # one per layer, in order
            importance += torch.stack([g.abs().sum(dim=(0, 1)).squeeze(-1).float() for g in grads])
    finally:
        for handle in handles:
            handle.remove()
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


def pruning_curve(
    model: nn.Module,
    batches: Iterable[Batch],
    evaluate: Callable[[nn.Module], float],
    step: float = 0.1,
    recompute_importance: bool = False,
    loss_fn: Callable[[nn.Module, Batch], Tensor] = language_model_loss,
) -> list[tuple[float, float]]:
    """(fraction pruned, ``evaluate(model)``) from all heads on to all off, removing heads globally by importance.

    With ``recompute_importance`` the importance is recomputed under the current mask after each step (Michel et
    al.'s iterative variant). The model's head mask is restored at the end.
    """
    if not 0 < step <= 1:
        raise ValueError(f"step must be in (0, 1], got {step}")
    original = model.head_mask().clone()
    batches = list(batches)
    importance = head_importance(model, batches, loss_fn)
    mask = torch.ones_like(original)
    fractions = [min(1.0, i * step) for i in range(int(1 / step + 1e-9) + 1)]
    fractions += [1.0] if fractions[-1] < 1.0 else []
    curve = []
    try:
        for fraction in fractions:
            mask = prune_heads_by_importance(importance, round(fraction * mask.numel()), mask)
            model.set_head_mask(mask)
            curve.append((fraction, evaluate(model)))
            if recompute_importance and fraction < 1.0:
                importance = head_importance(model, batches, loss_fn)
    finally:
        model.set_head_mask(original)
    return curve
