"""Differential attention (Ye et al. 2024, Differential Transformer): the difference of two softmax maps cancels
attention noise.

The layer's H heads of d_h pair up into H/2 differential heads (heads 2i and 2i+1: Q1/K1 and Q2/K2), each with a
value of width 2 d_h (the consecutive pair of value heads), so q/k/v and W_o keep vanilla's shapes and parameters:
``A = softmax(Q1 K1^T / sqrt(d_h)) - lambda softmax(Q2 K2^T / sqrt(d_h))``, ``o = RMSNorm(A V) (1 - lambda_init)``,
``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``, ``lambda_init = 0.8 - 0.6 exp(-0.3 layer)`` (0-based).
As microsoft/unilm ``Diff-Transformer/multihead_diffattn.py`` (``MultiheadDiffAttn``) at
b3783e7d6c080cd682345aa80f3b2322e447da38 (2025-03-03, the file's last change; unchanged at the repository's head
768a3c8 of 2025-12-14): the four lambda vectors are N(0, 0.1), and ``subln`` is
``RMSNorm(2 d_h, eps=1e-5, elementwise_affine=True)``: one weight of 2 d_h (init 1) shared by the differential heads,
applied after the norm is cast back to the input's dtype (the repository's ``rms_norm.py``). The weight became affine
in d088deb800bc9358bc3d738af409c674baa7ba69 (2024-10-25); the first release, 637157e8e9a2199c2b65d8c08558739f5d6a4df8
(2024-10-09), had none. ``subln_affine=false`` keeps that first form (the four lambda vectors the only new
parameters): the variants table's diff cells recorded before this change used it, so they can be re-made. The
reference's interleaved rotary is the model's rotary here (any position encoding).

Runs on the fused kernel: one SDPA call over all H heads, each query head reading its differential head's 2 d_h
value, then ``A1 V - lambda A2 V`` (``multihead_flashdiff_2.py`` does the same with two calls). Needs an even
number of query and of KV heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    IntermediateHook,
    VariantOptions,
    compute_dtype,
    masked,
    register,
    unchanged,
)
from attnlab.errors import require


@dataclass
class DiffOptions(VariantOptions):
    # the per-head RMSNorm's weight (2 d_h, init 1): true as the reference since d088deb; false: 637157e's first form
    subln_affine: bool = True


@register("diff")
class DifferentialAttention(AttentionVariant):
    """(softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)) V per pair of heads, RMSNorm (affine), times (1 - lambda_init)."""

    Options = DiffOptions

    def __init__(self, shape: AttentionShape, options: DiffOptions) -> None:
        super().__init__(shape, options)
        for key, heads in (("model.n_head", shape.n_head), ("model.n_kv_head", shape.n_kv_head)):
            require(heads % 2 == 0, key, f"attention=diff pairs heads: must be even, got {heads}")
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * shape.layer)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.empty(shape.head_dim)) for _ in range(4)
        )
        self.subln_weight = nn.Parameter(torch.empty(2 * shape.head_dim)) if options.subln_affine else None
        self.reset_parameters()

    def probes(self) -> list[str]:
        return ["lambda"]

    def reset_parameters(self) -> None:
        for vector in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(vector, 0.0, 0.1)
        if self.subln_weight is not None:
            nn.init.ones_(self.subln_weight)

    def lambda_full(self) -> Tensor:
        lam = torch.exp(self.lambda_q1 @ self.lambda_k1) - torch.exp(self.lambda_q2 @ self.lambda_k2) + self.lambda_init
        self.record("lambda", lam)
        return lam

    def values(self, v: Tensor, heads: int) -> Tensor:
        """Differential values (B, heads, T, 2 d_h): consecutive pairs of KV heads, repeated to ``heads`` heads."""
        batch, kv, t, dh = v.shape
        pairs = v.transpose(1, 2).reshape(batch, t, kv // 2, 2 * dh).transpose(1, 2)
        return pairs.repeat_interleave(heads * 2 // kv, dim=1)

    def split(self, o: Tensor) -> Tensor:
        """(B, H/2, T, 2 d_h) -> (B, H, T, d_h) such that the layer's head concatenation is the differential one."""
        batch, pairs, t, _ = o.shape
        return o.view(batch, pairs, t, 2, -1).transpose(2, 3).reshape(batch, 2 * pairs, t, -1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        heads = q.shape[1]
        keys = k.repeat_interleave(heads // k.shape[1], dim=1)
        values = self.values(v, heads)  # each query head reads its differential head's 2 d_h value
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
        o = o.unflatten(1, (heads // 2, 2))
        return self.split(o[:, :, 0] - self.lambda_full().to(o.dtype) * o[:, :, 1])

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Probabilities (B, H, T, T): the two softmax maps of differential head i are heads 2i and 2i + 1."""
        hook = hook or unchanged
        heads = q.shape[1]
        scores = masked(self.scaled_scores(q, k, hook), mask, is_causal)
        probs = hook("probabilities", torch.softmax(scores, dim=-1))
        maps = probs.unflatten(1, (heads // 2, 2))
        difference = maps[:, :, 0] - self.lambda_full().to(probs.dtype) * maps[:, :, 1]
        context = hook("context", difference @ self.values(v, heads // 2).to(probs.dtype))
        return self.split(context).to(q.dtype), probs

    def transform_heads(self, x: Tensor, o: Tensor, ctx: AttentionContext) -> Tensor:
        batch, heads, t, dh = o.shape
        pairs = o.view(batch, heads // 2, 2, t, dh).transpose(2, 3).reshape(batch, heads // 2, t, 2 * dh)
        normed = F.rms_norm(pairs.to(compute_dtype(o)), (2 * dh,), eps=1e-5).to(o.dtype)
        if self.subln_weight is not None:
            normed = normed * self.subln_weight.to(o.dtype)
        return self.split(normed * (1 - self.lambda_init))
