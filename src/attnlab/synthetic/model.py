"""The 1-layer, 1-head model of both synthetic tables, around the project's ``CausalSelfAttention``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention


class SyntheticAttentionModel(nn.Module):
    """Embedding -> one causal self-attention layer (any registered variant) -> linear head, read at the last
    position, which attends to the whole sequence. No positional encoding, no residual, no norm (the paper's
    f(X)). ``vocab_size=None``: the inputs are already vectors (Table 2's fixed standard-basis embedding);
    ``num_outputs=None``: no head, the attention output itself is the prediction (Table 2)."""

    def __init__(
        self,
        dim: int,
        attention: dict[str, Any],
        max_length: int,
        vocab_size: int | None = None,
        num_outputs: int | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        shape = AttentionShape(n_embd=dim, n_head=1, n_kv_head=1, head_dim=dim, block_size=max_length)
        self.embedding = nn.Embedding(vocab_size, dim) if vocab_size is not None else None
        self.attn = CausalSelfAttention(shape, dict(attention), bias=bias, dropout=0.0)
        self.head = nn.Linear(dim, num_outputs, bias=False) if num_outputs is not None else None

    def forward(self, inputs: Tensor) -> Tensor:
        """Token ids (B, L) or vectors (B, L, d) -> prediction at the last position, (B, outputs or d)."""
        token_ids = inputs if self.embedding is not None else None
        x = self.embedding(inputs) if self.embedding is not None else inputs
        ctx = AttentionContext(positions=torch.arange(x.shape[1], device=x.device), token_ids=token_ids)
        y = self.attn(x, ctx)[:, -1]
        return self.head(y) if self.head is not None else y

    @torch.no_grad()
    def last_attention(self, inputs: Tensor) -> Tensor:
        """Attention probabilities of the last position over the sequence, (B, L), from the reference path."""
        self.attn.record_probabilities = True
        try:
            self(inputs)
            return self.attn.probabilities[:, 0, -1]
        finally:
            self.attn.record_probabilities = False
            self.attn.probabilities = None
