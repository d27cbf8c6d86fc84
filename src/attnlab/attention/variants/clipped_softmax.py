"""Clipped softmax (Bondarenko et al. 2023, eq. 4): attention can put exactly zero on a token.

``p~ = clip((zeta - gamma) * softmax(s) + gamma, 0, 1)``; rows no longer sum to one, on purpose. The fused
kernel cannot clip, so ``attend`` runs the plain math over chunks of queries (``attnlab.attention.chunked``): each
chunk sees its full key rows (the softmax is exact) and only a (chunk x T) score block exists at a time, recomputed in
backward when there is more than one chunk.

``attention.backend=flex`` runs it in two fused passes instead (a GPU's path; ``flex_attend``): the first gets
each row's log-sum-exp L_i from FlexAttention, the second recomputes the scores in the same tiled kernel with
``score_mod = log clip((zeta - gamma) exp(s - L_i) + gamma, 0, 1)`` (-inf where it clips to 0), so flex's own
normaliser is sum_j p~_ij and ``out * exp(lse)`` is exactly sum_j p~_ij v_j (``attnlab.attention.flex``). No (T x T)
tensor exists; the gradient flows through both passes' log-sum-exps, L_i captured in the second, as the chain rule
of the reference path does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.attention.base import AttentionShape, AttentionVariant, VariantOptions, compute_dtype, register
from attnlab.attention.chunked import attend_in_chunks
from attnlab.attention.flex import FlexMask, log_weight, unnormalised
from attnlab.errors import require


@dataclass
class ClippedSoftmaxOptions(VariantOptions):
    """Set exactly one of ``gamma`` (direct) and ``alpha`` (``gamma = -alpha / T_ctx``); the other null."""

    zeta: float = 1.0  # stretch above: probabilities >= (1 - gamma) / (zeta - gamma) clip to exactly 1
    gamma: float | None = None  # stretch below (<= 0): probabilities <= -gamma / (zeta - gamma) clip to exactly 0
    alpha: float | None = 12.0  # gamma = -alpha / T_ctx (their OPT-125m run: alpha 12, T_ctx 512)
    context_length: int | None = None  # T_ctx, the training context; None: model.block_size
    chunk_size: int = 256  # queries per chunk of the memory-bounded path

    config_interpolations: ClassVar[dict[str, str]] = {"context_length": "${oc.select:data.block_size,null}"}

    def __post_init__(self) -> None:
        require(self.zeta >= 1, "attention.zeta", f"must be >= 1, got {self.zeta}")
        require(
            (self.gamma is None) != (self.alpha is None),
            "attention.gamma",
            f"set exactly one of attention.gamma (<= 0) and attention.alpha (>= 0) and the other to null; "
            f"got gamma={self.gamma}, alpha={self.alpha}",
        )
        if self.gamma is not None:
            require(self.gamma <= 0, "attention.gamma", f"must be <= 0, got {self.gamma}")
        if self.alpha is not None:
            require(self.alpha >= 0, "attention.alpha", f"must be >= 0 (gamma = -alpha / T_ctx), got {self.alpha}")
        if self.context_length is not None:
            require(self.context_length > 0, "attention.context_length", f"must be positive, got {self.context_length}")
        require(self.chunk_size > 0, "attention.chunk_size", f"must be positive, got {self.chunk_size}")


@register("clipped_softmax")
class ClippedSoftmax(AttentionVariant):
    """o = clip((zeta - gamma) softmax(q k^T / sqrt(d_h)) + gamma, 0, 1) v, softmax in fp32 (or float64)."""

    Options = ClippedSoftmaxOptions

    def __init__(self, shape: AttentionShape, options: ClippedSoftmaxOptions) -> None:
        super().__init__(shape, options)
        self.zeta = options.zeta
        context = options.context_length or shape.block_size
        self.gamma = options.gamma if options.gamma is not None else -options.alpha / context

    def probabilities(self, scores: Tensor) -> Tensor:
        return torch.clamp((self.zeta - self.gamma) * torch.softmax(scores, dim=-1) + self.gamma, 0, 1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        return attend_in_chunks(
            self.probabilities, self.scale, q, k, v, mask, is_causal, dropout, self.options.chunk_size
        )

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        _, lse = flex.attend(q, k, v, self.scale, lse=True)
        # zeta - gamma and gamma as a captured tensor (fp32, or float64 for float64 inputs): captured Python floats
        # that differ between layers or models would make dynamo turn them into symbols that flex's kernel cannot take
        stretch_gamma = torch.tensor([self.zeta - self.gamma, self.gamma], device=q.device, dtype=compute_dtype(q))

        def clipped_log(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            # masked keys are dropped by the block mask after this; the min keeps their exp from overflowing
            p = torch.exp(torch.clamp(score - lse[batch, head, query], max=0))
            return log_weight(torch.clamp(stretch_gamma[0] * p + stretch_gamma[1], 0, 1))

        return unnormalised(*flex.attend(q, k, v, self.scale, clipped_log, lse=True))
