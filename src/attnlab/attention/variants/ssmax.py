"""Scalable-Softmax, SSMax (Nakanishi 2025): logits times s_h * log n_t before the softmax.

The paper's n is the number of keys in the softmax; here n_t = t + 1, the query's absolute position plus one. The two
agree on a full sequence and with a KV cache (query t sees t + 1 keys); they differ only for a window evaluated
without its past (``start_pos > 0``, no cache), where the paper's n would restart at 1. We keep the absolute
position there on purpose: each query is then scaled as the model scaled it at that position in training, so a
window's outputs do not depend on where the window was cut (the convention of SSA's position term too).
s_h is learned per layer and head. The factor is per query, so it is applied to q (after RoPE;
a scalar commutes with it) and attention stays on the fused SDPA kernel. No official code exists; the init
``s_init = 0.43`` is the value the paper's text uses (Fig. 1: "The scaling parameter s of SSMax is set to 0.43";
an unofficial port keeps it fixed at 0.43). The paper's training init is not stated in the text we could read:
this is our reading, a config value. There is no neutral setting: s_h log n_t = 1 cannot hold for every t
(the first query, n = 1, has factor 0 for any s, which is harmless: it sees one key).
Compared with SSA's position term (``ssa_pos_only``): SSA scales q by 1 + sigmoid(alpha_h) log n (starts near
vanilla, factor >= 1), SSMax by s_h log n (no leading 1, any sign of s, data independent like SSA's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    VariantOptions,
    compute_dtype,
    register,
)
from attnlab.errors import require


@dataclass
class SSMaxOptions(VariantOptions):
    s_init: float = 0.43  # initial s_h (the paper's Fig. 1 value); logits are scaled by s_h * log(n_t)

    def __post_init__(self) -> None:
        require(self.s_init > 0, "attention.s_init", f"must be positive (s <= 0 flattens or flips), got {self.s_init}")


@register("ssmax")
class SSMax(AttentionVariant):
    """q_t <- s_h log(n_t) q_t, then SDPA: softmax(s_h log(n_t) q k^T / sqrt(d_h))."""

    Options = SSMaxOptions

    def __init__(self, shape: AttentionShape, options: SSMaxOptions) -> None:
        super().__init__(shape, options)
        self.s = nn.Parameter(torch.empty(shape.n_head))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.s.fill_(self.options.s_init)

    def probes(self) -> list[str]:
        return ["logit_scale"]

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        log_n = torch.log(ctx.positions.to(compute_dtype(q)) + 1).unsqueeze(-1)  # (T, 1), absolute positions
        scale = self.s.view(-1, 1, 1) * log_n  # (H, T, 1)
        self.record("logit_scale", scale.expand(*q.shape[:-1], 1))
        return q * scale.to(q.dtype), k, v
