"""Stick-breaking attention (Tan et al. 2024): each query breaks a stick from its nearest key backwards, so recency
is built in and the model takes no position encoding (``model.pos_encoding=none``).

``beta_ij = sigmoid(s_ij)``, ``A_ij = beta_ij prod_{j < k < i} (1 - beta_ik)`` over the strictly earlier keys
j < i, computed in log space as shawntan/stickbreaking-attention@3147a3841b025a31d271fc8f873120ff6fa0461b (2025-03-14)
``sb_ref.py`` (``stickbreaking``) does. The leftover mass ``1 - sum_j A_ij`` goes to the query's own value, as that
repository's ``ref_fwd`` (tests/test_attn.py) does (``o = o + rem * v``). ``attend_current`` is the kernel's flag
(``sb_attn(..., attend_current=False)``, its default and ours): true lets the stick break at the query's own key too,
``A_ij = beta_ij prod_{j < k <= i} (1 - beta_ik)`` for j <= i (``ref_fwd``'s mask ``triu(1)``), the leftover still
on the own value. ``probabilities`` are A with the leftover on the diagonal, so rows sum to one.

Explicit path only (the fused kernel is a Triton GPU kernel; here the T x T map is materialised in fp32, float64 for
float64 inputs). Depends only on q_i and the keys up to i, so KV-cache decoding is exact without extra state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.base import (
    AttentionShape,
    AttentionVariant,
    IntermediateHook,
    VariantOptions,
    register,
    unchanged,
)
from attnlab.errors import require


@dataclass
class StickBreakingOptions(VariantOptions):
    attend_current: bool = False  # the stick also breaks at the query's own key (the reference kernel's flag)


@register("stickbreaking")
class StickBreaking(AttentionVariant):
    """o_i = sum_{j<i} beta_ij prod_{j<k<i} (1 - beta_ik) v_j + leftover * v_i, beta = sigmoid(q k^T / sqrt(d_h))
    (with ``attend_current``: j <= i and j < k <= i)."""

    Options = StickBreakingOptions

    def __init__(self, shape: AttentionShape, options: StickBreakingOptions) -> None:
        super().__init__(shape, options)
        require(
            shape.pos_encoding == "none",
            "model.pos_encoding",
            f"attention=stickbreaking takes no position encoding (Tan et al.); set none, got {shape.pos_encoding}",
        )

    def probabilities(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        """Stick-breaking weights from unmasked fp32 scores (B, H, t_q, t_k), queries the last t_q keys; keys that
        the additive ``mask`` hides (another document of a packed block) break no stick, like future ones."""
        t_q, t_k = scores.shape[-2:]
        own_key = 0 if self.options.attend_current else 1
        visible = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).tril(t_k - t_q - own_key)  # j < i (<= i)
        if mask is not None:
            visible = visible & (mask > float("-inf"))
        log_beta = F.logsigmoid(scores).masked_fill(~visible, float("-inf"))
        log_rest = F.logsigmoid(-scores).masked_fill(~visible, 0.0)  # log(1 - beta)
        after = F.pad(log_rest.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))  # sum over k > j of log(1 - beta_ik)
        weights = torch.exp(log_beta + after)
        leftover = 1 - weights.sum(dim=-1)
        own = torch.eye(t_k, device=scores.device, dtype=scores.dtype)[t_k - t_q :]  # query i's own key
        return weights + leftover[..., None] * own

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        return self._attention(q, k, v, mask, 0.0, hook or unchanged)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        """The causal structure is the rule itself; a mask (document masking) only hides keys besides."""
        return self._attention(q, k, v, mask, dropout, unchanged)[0]

    def _attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, hook: IntermediateHook
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(q.device.type, enabled=False):
            probs = hook("probabilities", self.probabilities(self.scaled_scores(q, k, hook), mask))
            values = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(probs.dtype)
            return hook("context", F.dropout(probs, p=dropout) @ values).to(q.dtype), probs
