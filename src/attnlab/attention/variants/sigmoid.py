"""Sigmoid attention (Ramapuram et al. 2024): ``p_ij = sigmoid(s_ij + b)``, rows not normalised.

``b = -log n`` with n the training context length (``context_length``, default ``data.block_size``, as clipped
softmax's T_ctx), or ``bias`` given directly (their released config: b = -7.62 at n = 2048, with qk-norm on, which
is ``attention=qk_norm`` territory and not part of this variant). Reference: apple/ml-sigmoid-attention
``attention_simulator`` (``Attention.forward`` with ``unnormalized_sigmoid_attention``: logits scaled, masked,
``+ attn_bias``, sigmoid); the reference masks with ``-finfo.max`` where we use -inf: both give exactly 0.
Its fused FlashSigmoid kernel is GPU only, so ``attend`` runs the plain math over chunks of queries in fp32
(``attnlab.attention.chunked``: no (T x T) per head is kept). ``attention.backend=flex`` runs it on FlexAttention
with ``score_mod = log sigmoid(s + b)``, whose normaliser is then sum_j sigmoid(s_ij + b): ``out * exp(lse)`` undoes
it exactly (``attnlab.attention.flex.unnormalised``). There is no neutral setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.base import AttentionShape, AttentionVariant, VariantOptions, compute_dtype, register
from attnlab.attention.chunked import attend_in_chunks
from attnlab.attention.flex import FlexMask, unnormalised
from attnlab.errors import require


@dataclass
class SigmoidOptions(VariantOptions):
    bias: float | None = None  # b added to every logit before the sigmoid; None: -log(context_length)
    context_length: int | None = None  # n in b = -log n, the training context; None: model.block_size
    chunk_size: int = 256  # queries per chunk of the memory-bounded path

    config_interpolations: ClassVar[dict[str, str]] = {"context_length": "${oc.select:data.block_size,null}"}

    def __post_init__(self) -> None:
        if self.bias is not None:
            require(math.isfinite(self.bias), "attention.bias", f"must be a finite number or null, got {self.bias}")
        if self.context_length is not None:
            require(self.context_length > 0, "attention.context_length", f"must be positive, got {self.context_length}")
        require(self.chunk_size > 0, "attention.chunk_size", f"must be positive, got {self.chunk_size}")


@register("sigmoid")
class SigmoidAttention(AttentionVariant):
    """o = sigmoid(q k^T / sqrt(d_h) + b) v with b = -log n; masked keys get exactly 0."""

    Options = SigmoidOptions

    def __init__(self, shape: AttentionShape, options: SigmoidOptions) -> None:
        super().__init__(shape, options)
        context = options.context_length or shape.block_size
        self.bias = options.bias if options.bias is not None else -math.log(context)

    def probabilities(self, scores: Tensor) -> Tensor:
        return torch.sigmoid(scores + self.bias)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        return attend_in_chunks(
            self.probabilities, self.scale, q, k, v, mask, is_causal, dropout, self.options.chunk_size
        )

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        # a captured tensor, not a float (see clipped_softmax)
        bias = torch.tensor(self.bias, device=q.device, dtype=compute_dtype(q))

        def log_sigmoid(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            return F.logsigmoid(score + bias)

        return unnormalised(*flex.attend(q, k, v, self.scale, log_sigmoid, lse=True))
