"""QK-norm: RMSNorm on q and on k before RoPE, as Qwen3 (per head) and OLMo 2 (per projection).

``scope=head`` (transformers ``Qwen3Attention``): one RMSNorm over d_h, its weight shared by all heads, separate for q
and k. ``scope=projection`` (``Olmo2Attention``): one RMSNorm over the whole q projection (H * d_h) and one over k
(KV * d_h), before the split into heads. Weights init 1, eps 1e-6 (both references' default); the norm is computed
in fp32 and cast back as the references do (Qwen3 casts before the weight, OLMo 2 after: see ``RMSNorm``). Runs on
the fused SDPA kernel. There is no neutral setting: normalising q and k changes the logits for any weight.
Wortsman et al. 2023 (Fig. 1): qk-layernorm removes the attention-logit growth that makes small models diverge
at high learning rates.
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
    register,
    register_preset,
)
from attnlab.errors import require, require_choice

SCOPES = ("head", "projection")


@dataclass
class QKNormOptions(VariantOptions):
    scope: str = "head"  # head: RMSNorm over d_h, shared by heads (Qwen3) | projection: over H * d_h (OLMo 2)
    eps: float = 1e-6  # RMSNorm epsilon (Qwen3's and OLMo 2's rms_norm_eps default)

    def __post_init__(self) -> None:
        require_choice(self.scope, SCOPES, "attention.scope")
        require(self.eps > 0, "attention.eps", f"must be positive, got {self.eps}")


class RMSNorm(nn.Module):
    """x / rms(x) * w over the last dimension in fp32 (float64 inputs in float64); Qwen3 multiplies the weight after
    casting back, OLMo 2 before."""

    def __init__(self, width: int, eps: float, weight_in_fp32: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.weight_in_fp32 = weight_in_fp32

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32, as the references; float64 stays float64
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_fp32:
            return (self.weight * normed).to(x.dtype)
        return self.weight * normed.to(x.dtype)


@register("qk_norm")
class QKNorm(AttentionVariant):
    """q <- RMSNorm_q(q), k <- RMSNorm_k(k) on the raw projections; RoPE and SDPA unchanged."""

    Options = QKNormOptions
    transforms_before_rope = True

    def __init__(self, shape: AttentionShape, options: QKNormOptions) -> None:
        super().__init__(shape, options)
        per_head = options.scope == "head"
        q_width, k_width = (shape.head_dim, shape.head_dim) if per_head else shape.qkv_sizes[:2]
        self.q_norm = RMSNorm(q_width, options.eps, weight_in_fp32=not per_head)
        self.k_norm = RMSNorm(k_width, options.eps, weight_in_fp32=not per_head)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.q_norm.weight)
        nn.init.ones_(self.k_norm.weight)

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        if self.options.scope == "head":
            return self.q_norm(q), self.k_norm(k), v
        return self._over_projection(self.q_norm, q), self._over_projection(self.k_norm, k), v

    @staticmethod
    def _over_projection(norm: RMSNorm, c: Tensor) -> Tensor:
        """Apply ``norm`` to (B, heads, T, d_h) as the (B, T, heads * d_h) projection it came from."""
        batch, heads, t, dh = c.shape
        flat = c.transpose(1, 2).reshape(batch, t, heads * dh)
        return norm(flat).view(batch, t, heads, dh).transpose(1, 2)


register_preset("qk_norm_projection", QKNorm, scope="projection")  # OLMo 2
