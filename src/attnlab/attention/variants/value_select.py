"""Hard value selection: the SSA paper's Table 2 oracle for value temperature (section 4.2).

The paper replaces the learned value temperature by the selection function ``1[max_j x_ij >= 1/2]`` on the
denoising task: a token whose largest coordinate reaches 1/2 is a signal token ``e_q + z``, the others are
pure noise and contribute nothing. ``v_i <- 1[max_j x_ij >= threshold] * v_i``; x is the layer input.
A fixed rule with no parameters and no neutral setting (threshold -> -inf would be vanilla).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.attention.base import AttentionContext, AttentionVariant, VariantOptions, register


@dataclass
class ValueSelectionOptions(VariantOptions):
    threshold: float = 0.5  # the paper's 1/2


@register("value_select")
class ValueSelection(AttentionVariant):
    """v_i * 1[max_j x_ij >= threshold], then plain SDPA: noise tokens keep their attention weight but add 0."""

    Options = ValueSelectionOptions

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        keep = (x.amax(dim=-1) >= self.options.threshold).to(v.dtype)  # (B, T)
        return q, k, v * keep[:, None, :, None]
