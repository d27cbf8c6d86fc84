"""The 1-layer, 1-head model of both synthetic tables, around the project's ``CausalSelfAttention``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention
from attnlab.errors import require, require_choice

EMBEDDINGS = ("learned", "unit_norm", "one_hot")
READOUTS = ("head", "attention")
POSITIONS = ("last", "all")


class SyntheticAttentionModel(nn.Module):
    """Embedding -> one causal self-attention layer (any registered variant) -> linear head, read at the last
    position, which attends to the whole sequence. No positional encoding, no residual, no norm (the paper's
    f(X)). ``vocab_size=None``: the inputs are already vectors (Table 2's fixed standard-basis embedding);
    ``num_outputs=None``: no head, the attention output itself is the prediction (Table 2).

    Token inputs are embedded by ``embedding``: ``learned`` (free rows), ``unit_norm`` (learned rows scaled to unit
    l2 norm, the paper's assumption on E) or ``one_hot`` (fixed e_i, needs dim == vocab_size). ``readout="attention"``
    predicts with the last position's attention map itself, scattered onto token ids (what the layer outputs with
    one-hot values and W_v = W_o = I): log-probabilities instead of a head's logits. ``positions="all"`` returns
    every position's output, (B, L, ...), for a risk averaged over causal positions."""

    def __init__(
        self,
        dim: int,
        attention: dict[str, Any],
        max_length: int,
        vocab_size: int | None = None,
        num_outputs: int | None = None,
        bias: bool = False,
        embedding: str = "learned",
        readout: str = "head",
        positions: str = "last",
    ) -> None:
        super().__init__()
        require_choice(embedding, EMBEDDINGS, "model.embedding")
        require_choice(readout, READOUTS, "model.readout")
        require_choice(positions, POSITIONS, "task.positions")
        require(
            embedding != "one_hot" or dim == vocab_size,
            "model.embedding",
            f"one_hot needs dim == vocab_size, got dim {dim} and {vocab_size} tokens",
        )
        require(
            readout == "head" or (vocab_size is not None and positions == "last"),
            "model.readout",
            "attention (the map as the prediction) needs token inputs, read at the last position",
        )
        shape = AttentionShape(n_embd=dim, n_head=1, n_kv_head=1, head_dim=dim, block_size=max_length)
        self.embedding_kind, self.readout, self.positions, self.vocab_size = embedding, readout, positions, vocab_size
        learned = vocab_size is not None and embedding != "one_hot"
        self.embedding = nn.Embedding(vocab_size, dim) if learned else None
        self.attn = CausalSelfAttention(shape, dict(attention), bias=bias, dropout=0.0)
        self.head = nn.Linear(dim, num_outputs, bias=False) if num_outputs is not None and readout == "head" else None

    def embed(self, inputs: Tensor) -> Tensor:
        """Token ids (B, L) -> vectors (B, L, d); vectors pass through."""
        if self.vocab_size is None:
            return inputs
        if self.embedding_kind == "one_hot":
            return F.one_hot(inputs, self.vocab_size).float()
        vectors = self.embedding(inputs)
        return F.normalize(vectors, dim=-1) if self.embedding_kind == "unit_norm" else vectors

    def forward(self, inputs: Tensor) -> Tensor:
        """Token ids (B, L) or vectors (B, L, d) -> prediction at the last position, (B, outputs or d), or at every
        position (``positions="all"``), (B, L, d)."""
        token_ids = inputs if self.vocab_size is not None else None
        x = self.embed(inputs)
        ctx = AttentionContext(positions=torch.arange(x.shape[1], device=x.device), token_ids=token_ids)
        if self.readout == "attention":
            recording = self.attn.record_probabilities
            self.attn.record_probabilities = True
            try:
                self.attn(x, ctx)
                attention = self.attn.probabilities[:, 0, -1]  # (B, L), differentiable: the reference path
            finally:
                self.attn.record_probabilities, self.attn.probabilities = recording, None
            mapped = torch.zeros(x.shape[0], self.vocab_size, dtype=attention.dtype, device=x.device)
            return mapped.scatter_add(1, inputs, attention).clamp_min(torch.finfo(attention.dtype).tiny).log()
        y = self.attn(x, ctx)
        y = y if self.positions == "all" else y[:, -1]
        return self.head(y) if self.head is not None else y

    @torch.no_grad()
    def last_attention(self, inputs: Tensor) -> Tensor:
        """Attention probabilities of the last position over the sequence, (B, L), from the reference path."""
        self.attn.record_probabilities = True
        try:
            ctx = AttentionContext(positions=torch.arange(inputs.shape[1]), token_ids=inputs)
            self.attn(self.embed(inputs), ctx)
            return self.attn.probabilities[:, 0, -1]
        finally:
            self.attn.record_probabilities = False
            self.attn.probabilities = None
