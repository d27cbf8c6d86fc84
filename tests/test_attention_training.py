"""A short CPU training run per attention variant: the loss stays finite and falls on learnable data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import available_attention
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT

VOCAB = 32
POSITION = {"stickbreaking": "none"}  # variants that take only one position encoding


@pytest.mark.slow
@pytest.mark.parametrize("name", available_attention())
def test_short_training_run_learns(name: str) -> None:
    torch.manual_seed(0)
    config = ModelConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        vocab_size=VOCAB,
        block_size=64,
        pos_encoding=POSITION.get(name, "learned"),
    )
    model = GPT(config, {"name": name})
    model.set_token_frequencies(torch.randint(1, 1000, (VOCAB,)))
    variant = {id(p) for _, p in model.variant_parameters()}
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in model.parameters() if id(p) not in variant], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if id(p) in variant], "weight_decay": 0.0},
        ],
        lr=3e-3,
    )
    motifs = torch.randint(0, VOCAB, (4, 8))  # sequences repeat a motif: learnable by copying from context
    losses = []
    for step in range(40):
        batch = motifs[torch.arange(8) % 4].repeat(1, 5)[:, : 33 if step % 2 else 29]
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
