"""Selective attention (Leviathan et al. 2024, arXiv 2410.02703): a token can hide earlier ones
from every later token, with no new parameter.

The selecting head's causal logits give ``S = relu(s)`` with S's first column (the first token is never hidden)
and its diagonal (a token does not hide itself) zeroed; ``F_i = sum_{i' < i} S_i'`` (exclusive cumulative sum down
the query axis); every head's logits become ``s - F`` before the softmax, as in the paper's listing and the
andrew-healey/context-compression port. S uses the content logits ``q k^T / sqrt(d_h)`` of the selecting head: an
ALiBi bias is added to every head's logits but not to S (the paper's model has no such bias).

Explicit path only (F needs the selecting head's full T x T logits; no fused kernel takes a per-row bias that is
a cumulative sum of another head's scores). KV-cache decoding: F of a new token sums S over every earlier query,
which the keys and values alone cannot give, so ``transform_qkv`` appends the selecting head's query to each key
(d_h more channels in the cache) and ``attend`` recomputes S over all cached positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    IntermediateHook,
    VariantOptions,
    causal_bias,
    compute_dtype,
    masked,
    register,
    unchanged,
)
from attnlab.errors import require


@dataclass
class SelectiveOptions(VariantOptions):
    selection_head: int = 0  # the query head whose logits select (the paper: head 0)


@register("selective")
class SelectiveAttention(AttentionVariant):
    """softmax(s - F) v with F the exclusive cumulative sum of the selecting head's relu(s), first column and
    diagonal zeroed; fp32 (float64 for float64 inputs), explicit path."""

    Options = SelectiveOptions

    def __init__(self, shape: AttentionShape, options: SelectiveOptions) -> None:
        super().__init__(shape, options)
        require(
            0 <= options.selection_head < shape.n_head,
            "attention.selection_head",
            f"must be a head index in [0, {shape.n_head}), got {options.selection_head}",
        )

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        head = self.options.selection_head
        selector = q[:, head : head + 1].expand(-1, k.shape[1], -1, -1)
        return q, torch.cat([k, selector], dim=-1), v  # the cache keeps the selector's queries with the keys

    def selection(self, k: Tensor, t_q: int) -> Tensor:
        """F (B, 1, t_q, t_k) for the last t_q of the t_k positions, from the selector queries stored with k."""
        dh, head = self.shape.head_dim, self.options.selection_head
        groups = self.shape.n_head // k.shape[1]
        dtype = compute_dtype(k)
        keys, selector = k[:, head // groups, :, :dh].to(dtype), k[:, 0, :, dh:].to(dtype)  # (B, t_k, dh) each
        t_k = keys.shape[1]
        logits = (selector @ keys.transpose(-2, -1)) * self.scale + causal_bias(t_k, t_k, k.device, dtype)
        keep = torch.ones(t_k, t_k, device=k.device, dtype=dtype)
        keep[:, 0] = 0  # never hide the first token
        keep.fill_diagonal_(0)  # a token does not hide itself
        selected = torch.relu(logits) * keep
        hidden = F.pad(selected.cumsum(dim=-2)[:, :-1], (0, 0, 1, 0))  # F_i = sum over i' < i
        return hidden[:, None, t_k - t_q :]

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(q.device.type, enabled=False):
            return self._attention(q, k, v, mask, is_causal, 0.0, hook or unchanged)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return self._attention(q, k, v, mask, is_causal, dropout, unchanged)[0]

    def _attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        dropout: float,
        hook: IntermediateHook,
    ) -> tuple[Tensor, Tensor]:
        scores = masked(self.scaled_scores(q, k[..., : self.shape.head_dim], hook), mask, is_causal)
        probs = hook("probabilities", torch.softmax(scores - self.selection(k, q.shape[2]), dim=-1))
        values = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(probs.dtype)
        context = hook("context", F.dropout(probs, p=dropout) @ values)
        return context.to(q.dtype), probs
