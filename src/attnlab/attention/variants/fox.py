"""Forgetting attention (FoX, Lin et al. 2025; spec section 9): a learned per-head forget gate decays old keys.

``f_t = sigmoid(x_t w_h + b_h)`` per query head, ``c_t = sum_{u <= t} log f_u``, logits ``s_ij + c_i - c_j``
(zhixuan-lin/forgetting-transformer ``ops/forgetting_attention.py``: ``log_lambda = cumsum(log_fgate)``,
``decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]``, log f in fp32). The gate is the reference's
``fgate_type="full"``: one ``Linear(d, H)`` with bias; init N(0, 0.02) weights, zero bias (the model's init).
The decay replaces position encoding: rotary is refused, learned / sinusoidal / ALiBi / none are allowed.

Runs on ``F.scaled_dot_product_attention`` with the decay as an additive float mask (the memory-efficient kernel
takes it; flash does not): the mask costs O(T^2) memory per head. ``attention.backend=flex`` adds c_i - c_j in a
score_mod instead (c captured, O(T) memory, the gate's gradient through it), the spec's FlexAttention form.
KV cache: the reference's own cache keeps log f per key (``FgateDynamicCache``); here ``transform_qkv`` appends each
token's log f (fp32, one channel per query head of the group) to its key, so the cache keeps it, and ``attend``
recomputes c over every cached position. c_i - c_j does not depend on where the cumulative sum starts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    IntermediateHook,
    VariantOptions,
    causal_bias,
    compute_dtype,
    register,
    unchanged,
)
from attnlab.attention.flex import FlexMask
from attnlab.errors import require


@register("fox")
class ForgettingAttention(AttentionVariant):
    """softmax(q k^T / sqrt(d_h) + c_i - c_j) v with c the cumulative log forget gate of each head."""

    Options = VariantOptions

    def __init__(self, shape: AttentionShape, options: VariantOptions) -> None:
        super().__init__(shape, options)
        require(
            shape.pos_encoding != "rotary",
            "model.pos_encoding",
            "attention=fox replaces rotary positions with its forget gate (Lin et al.); "
            "use learned, sinusoidal, alibi or none",
        )
        self.gate = nn.Linear(shape.n_embd, shape.n_head)
        self.reset_parameters()

    def probes(self) -> list[str]:
        return ["forget_gate"]

    def reset_parameters(self) -> None:
        nn.init.normal_(self.gate.weight, 0.0, 0.02)
        nn.init.zeros_(self.gate.bias)

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        log_f = F.logsigmoid(self.gate(x).to(compute_dtype(k)))  # (B, T, H), fp32 (or wider) as the reference requires
        self.record("forget_gate", log_f.exp())
        batch, t, _ = log_f.shape
        per_kv_head = log_f.view(batch, t, k.shape[1], -1).transpose(1, 2)  # (B, KV, T, H / KV)
        return q, torch.cat([k.to(log_f.dtype), per_kv_head], dim=-1), v

    def cumulative_gate(self, k: Tensor) -> Tensor:
        """c (B, H, t_k), the cumulative log forget gate over the keys, from the log f stored with them."""
        return torch.cumsum(k[..., self.shape.head_dim :].transpose(-2, -1).flatten(1, 2), dim=-1)

    def decay(self, k: Tensor, t_q: int) -> Tensor:
        """c_i - c_j (B, H, t_q, t_k) for the last t_q of the t_k keys."""
        c = self.cumulative_gate(k)
        return c[..., -t_q:, None] - c[..., None, :]

    def bias(self, q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """The additive bias in k's dtype (fp32 or wider): decay plus the causal (or ALiBi) mask."""
        t_q, t_k = q.shape[2], k.shape[2]
        bias = self.decay(k, t_q)
        if mask is not None:
            return bias + mask.to(bias.dtype)
        return bias + causal_bias(t_q, t_k, q.device, bias.dtype) if is_causal else bias

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        keys = k[..., : self.shape.head_dim].to(q.dtype)
        return F.scaled_dot_product_attention(
            q,
            keys,
            v,
            attn_mask=self.bias(q, k, mask, is_causal).to(q.dtype),
            dropout_p=dropout,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        c = self.cumulative_gate(k)

        def decayed(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            return score + (c[batch, head, query] - c[batch, head, key]).to(score.dtype)

        return flex.attend(q, k[..., : self.shape.head_dim].to(q.dtype), v, self.scale, decayed)

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        hook = hook or unchanged
        scores = self.scaled_scores(q, k[..., : self.shape.head_dim], hook)
        probs = hook("probabilities", torch.softmax(scores + self.bias(q, k, mask, is_causal), dim=-1))
        values = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(probs.dtype)
        return hook("context", probs @ values).to(q.dtype), probs
