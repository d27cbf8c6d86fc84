"""Attention sink (gpt-oss ``AttentionBlock.sinks``; Evan Miller's "softmax off by one").

One logit s_h per head joins every row's softmax and is dropped: p_ij = exp(s_ij) / (exp(s_h) + sum_j exp(s_ij)),
so a head can attend to nothing. Since that equals softmax(s)_ij * sigmoid(lse_i - s_h), ``attend`` keeps the fused
SDPA kernel for the output and multiplies by the sink factor; SDPA's public call does not return the row's
log-sum-exp, so lse comes from the scores over chunks of queries (``attnlab.attention.chunked``: no (T x T) per head
is kept); ``attention.backend=flex`` takes lse from the FlexAttention kernel that computes the output (one pass, the
gradient flowing through both). ``sink_logit=learned``: s_h a parameter per layer and head, init ``sink_init`` = 0
(gpt-oss's inference code allocates it with ``torch.empty`` and loads it, so it gives no init: 0 is our choice).
``fixed``: a constant ``sink_init`` (0 = softmax1), no parameter. s_h -> -inf is vanilla. Like gpt-oss, s_h is on
the scale of the scaled scores q k^T / sqrt(d_h) (and of ALiBi-biased scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionShape,
    AttentionVariant,
    VariantOptions,
    compute_dtype,
    register,
    register_preset,
)
from attnlab.attention.chunked import over_query_chunks
from attnlab.attention.flex import FlexMask
from attnlab.errors import require, require_choice

SINK_LOGITS = ("learned", "fixed")


@dataclass
class SinkOptions(VariantOptions):
    sink_logit: str = "learned"  # learned: s_h a parameter per head (init sink_init) | fixed: s_h = sink_init
    sink_init: float = 0.0  # initial (learned) or constant (fixed) sink logit; -inf is vanilla
    chunk_size: int = 256  # queries per chunk when computing the rows' log-sum-exp

    def __post_init__(self) -> None:
        require_choice(self.sink_logit, SINK_LOGITS, "attention.sink_logit")
        require(not math.isnan(self.sink_init), "attention.sink_init", "must be a number or -inf, got nan")
        require(self.chunk_size > 0, "attention.chunk_size", f"must be positive, got {self.chunk_size}")


@register("sink")
class Sink(AttentionVariant):
    """o = SDPA(q, k, v) * sigmoid(lse(s) - s_h), i.e. softmax with an extra, dropped logit s_h per head."""

    Options = SinkOptions

    def __init__(self, shape: AttentionShape, options: SinkOptions) -> None:
        super().__init__(shape, options)
        if options.sink_logit == "learned":
            self.sinks = nn.Parameter(torch.empty(shape.n_head))
        else:
            self.register_buffer("sinks", torch.empty(shape.n_head))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.sinks.fill_(self.options.sink_init)

    def probes(self) -> list[str]:
        return ["sink_mass"]

    def probabilities(self, scores: Tensor) -> Tensor:
        """gpt-oss ``sdpa``: append s_h as a last column, softmax, drop it."""
        sinks = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        o = super().attend(q, k, v, mask, is_causal, dropout)
        return self.with_sink(o, over_query_chunks(self._lse, q, k, v, mask, is_causal, self.options.chunk_size))

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        o, lse = flex.attend(q, k, v, self.scale, lse=True)
        return self.with_sink(o, lse.unsqueeze(-1))

    def with_sink(self, o: Tensor, lse: Tensor) -> Tensor:
        """The output softmax(s) v times each row's mass not given to the sink, sigmoid(lse - s_h)."""
        kept = torch.sigmoid(lse - self.sinks.to(lse.dtype).view(1, -1, 1, 1))
        self.record("sink_mass", 1 - kept)
        return o * kept.to(o.dtype)

    def _lse(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        """Log-sum-exp of a chunk's scaled scores in ``compute_dtype`` (v is unused: the chunk helper passes it
        along)."""
        dtype = compute_dtype(q)
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)) * self.scale
            return torch.logsumexp(scores if bias is None else scores + bias, dim=-1, keepdim=True)


register_preset("softmax1", Sink, sink_logit="fixed")  # Evan Miller's softmax_1: s_h = 0, no parameter
