"""Data of the two synthetic tasks, exactly as the SSA paper (section 4) describes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def transition_matrix(nodes: int, edges: Sequence[Sequence[int]]) -> Tensor:
    """P*[i] uniform over node i and its neighbours in the undirected graph (the paper's Figure 3b)."""
    options = torch.eye(nodes)
    for a, b in edges:
        options[a, b] = options[b, a] = 1.0
    return options / options.sum(dim=1, keepdim=True)


def option_counts(transition: Tensor) -> Tensor:
    """Number of possible next tokens per node: itself plus its neighbours (the paper's "# of neighbors")."""
    return (transition > 0).sum(dim=1)


def entropy(transition: Tensor) -> Tensor:
    """H(P*) averaged over the (uniform) queries: the cross-entropy no model can go below."""
    return -(transition * transition.clamp_min(1e-30).log()).sum(dim=1).mean()


def graph_batch(transition: Tensor, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Sequences that hold every token once in random order (L = N); label Y ~ P*[last token]."""
    tokens = torch.rand(batch, transition.shape[0], generator=generator).argsort(dim=1)
    labels = torch.multinomial(transition[tokens[:, -1]], 1, generator=generator).squeeze(1)
    return tokens, labels


def query_sequences(nodes: int) -> Tensor:
    """One sequence per query token q, ending in q. Without positions the last output depends only on q (every
    sequence holds all tokens), so these N sequences evaluate the model on the whole input distribution."""
    return torch.stack(
        [torch.cat([torch.tensor([t for t in range(nodes) if t != q]), torch.tensor([q])]) for q in range(nodes)]
    )


@dataclass
class DenoisingBatch:
    x: Tensor  # (B, L, K): e_q + z_i for signal tokens, z_i for noise tokens
    y: Tensor  # (B, K): e_q
    signal: Tensor  # (B, L) bool: which tokens carry e_q (always the last)


def denoising_batch(
    batch: int, length: int, sigma: float, alpha: float, dim: int, generator: torch.Generator
) -> DenoisingBatch:
    """q ~ Unif[K], y = e_q; x_L = e_q + z_L; x_i (i < L) = e_q + z_i with probability alpha, else z_i."""
    q = torch.randint(dim, (batch,), generator=generator)
    y = F.one_hot(q, dim).float()
    signal = torch.rand(batch, length, generator=generator) < alpha
    signal[:, -1] = True
    z = sigma * torch.randn(batch, length, dim, generator=generator)
    return DenoisingBatch(x=z + signal.unsqueeze(-1) * y.unsqueeze(1), y=y, signal=signal)


def naive_average(x: Tensor, causal: bool = False) -> Tensor:
    """The paper's naive baseline: (1/L) sum_i x_i, (B, d); ``causal``: the mean of each prefix, (B, L, d)."""
    if causal:
        return x.cumsum(dim=1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
    return x.mean(dim=1)


def bayes_optimal(x: Tensor, signal: Tensor, causal: bool = False) -> Tensor:
    """The paper's "Bayes optimal estimator": the mean of the ground-truth signal tokens, (B, d); ``causal``: of
    each prefix's signal tokens, (B, L, d), the zero vector for a prefix without one (it knows nothing of q)."""
    mask = signal.unsqueeze(-1).to(x.dtype)
    if causal:
        return (x * mask).cumsum(dim=1) / mask.cumsum(dim=1).clamp_min(1)
    return (x * mask).sum(dim=1) / mask.sum(dim=1)


def normalised_mse(y: Tensor, y_hat: Tensor) -> Tensor:
    """The paper's risk E ||y - y_hat / ||y_hat|| ||^2, mean over the batch; ``y_hat`` of shape (B, L, K) scores
    every position against its sequence's y (B, K), averaged over positions too."""
    if y_hat.dim() > y.dim():
        y = y.unsqueeze(-2)
    unit = y_hat / y_hat.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return ((y - unit) ** 2).sum(dim=-1).mean()
