"""Softpick (Zuhri et al. 2025): a rectified, not-sum-to-one softmax with no attention sink.

``p_ij = relu(exp(s_ij) - 1) / (sum_j |exp(s_ij) - 1| + eps)`` over the unmasked keys, computed as the reference
``softpick`` (zaydzuhri/softpick-attention ``naive_softpick_attn.py``) does: numerator and denominator shifted by
the row max m, i.e. ``relu(exp(s - m) - exp(-m)) / (sum |exp(s - m) - exp(-m)| + eps)``. The reference wins over
the paper's formula where they differ: its eps (1e-8) is added after the shift, so it acts as eps * exp(m) on the
unshifted sum. The fused kernel cannot compute it (the reference's is a GPU Triton kernel), so ``attend`` runs the
plain math over chunks of queries in fp32 (``attnlab.attention.chunked``: no (T x T) per head is kept).
There is no neutral setting: softpick is not softmax for any eps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.base import AttentionVariant, VariantOptions, register
from attnlab.attention.chunked import attend_in_chunks
from attnlab.errors import require


@dataclass
class SoftpickOptions(VariantOptions):
    eps: float = 1e-8  # added to the shifted denominator (the reference's default)
    chunk_size: int = 256  # queries per chunk of the memory-bounded path

    def __post_init__(self) -> None:
        require(self.eps >= 0, "attention.eps", f"must be >= 0, got {self.eps}")
        require(self.chunk_size > 0, "attention.chunk_size", f"must be positive, got {self.chunk_size}")


@register("softpick")
class Softpick(AttentionVariant):
    """o = softpick(q k^T / sqrt(d_h)) v, in fp32; masked keys count neither above nor below the line."""

    Options = SoftpickOptions

    def probabilities(self, scores: Tensor) -> Tensor:
        shift = scores.max(dim=-1, keepdim=True).values
        shifted = torch.exp(scores - shift) - torch.exp(-shift)  # exp(s) - 1, divided by exp(m)
        magnitude = torch.where(scores.isfinite(), shifted.abs(), 0)
        return F.relu(shifted) / (magnitude.sum(dim=-1, keepdim=True) + self.options.eps)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        return attend_in_chunks(
            self.probabilities, self.scale, q, k, v, mask, is_causal, dropout, self.options.chunk_size
        )
