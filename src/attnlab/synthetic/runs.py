"""Training loops of the two synthetic tables: Adam at the paper's lr 1e-4, fresh samples every step.

All seeds of one configuration train together: their parameters are stacked and the model runs under
``torch.func.vmap``. Adam is elementwise and the summed loss gives each seed its own gradient, so this is
exactly S independent runs (tested), at a fraction of the per-step Python overhead that dominates on CPU.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from attnlab.attention.variants.temp_lookup import TemperatureLookup
from attnlab.synthetic.data import (
    bayes_optimal,
    denoising_batch,
    graph_batch,
    naive_average,
    normalised_mse,
    query_sequences,
    transition_matrix,
)
from attnlab.synthetic.model import SyntheticAttentionModel

Batch = Callable[[torch.Generator], tuple[Tensor, Tensor]]


def train_seeds(
    build: Callable[[], SyntheticAttentionModel],
    seeds: Sequence[int],
    steps: int,
    lr: float,
    batch: Batch,
    loss: Callable[[Tensor, Tensor], Tensor],
) -> list[SyntheticAttentionModel]:
    """One model per seed (init from ``torch.manual_seed(seed)``, data from its own generator), trained jointly."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build())
    params, buffers = stack_module_state(models)
    template = copy.deepcopy(models[0]).to("meta")
    forward = vmap(lambda p, b, x: functional_call(template, (p, b), (x,)))
    per_seed_loss = vmap(loss)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    optimizer = torch.optim.Adam(list(params.values()), lr=lr)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")  # SDPA under vmap: a loop, still exact
        for _ in range(steps):
            inputs, targets = zip(*(batch(generator) for generator in generators), strict=True)
            total = per_seed_loss(forward(params, buffers, torch.stack(inputs)), torch.stack(targets)).sum()
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
    for i, model in enumerate(models):
        model.load_state_dict({name: value[i].detach() for name, value in params.items()}, strict=False)
    return models


@dataclass
class GraphRun:
    """One Table 1 run, evaluated exactly over the 8 queries (the input distribution has no other randomness)."""

    cross_entropy: float  # E_q E_{Y~P*[q]} -log g(X)[Y]: what training minimises
    kl: float  # cross_entropy - H(P*[q]) = E_q KL(P*[q] || g): the part above the irreducible entropy
    err_map: float  # sum_ij |P^_ij - P*_ij|, P^ = the attention map
    err_transition: float  # sum_ij |G_ij - P*_ij|, G = the model's predicted transition matrix g(X) per query
    attention_map: Tensor  # P^: row q = the last position's attention over token ids, query q
    transition: Tensor  # G: row q = softmax(C f(X)) for the sequences ending in q
    temperatures: list[float] | None  # learned T per group (temp_lookup), else None


def train_graph(
    nodes: int,
    edges: list[list[int]],
    attention: dict[str, Any],
    dim: int,
    steps: int,
    batch_size: int,
    lr: float,
    seeds: Sequence[int],
    bias: bool = False,
) -> list[GraphRun]:
    """Fit the 1-layer model to next-token prediction on the graph with cross-entropy (the paper's section 4.1)."""
    transition = transition_matrix(nodes, edges)
    models = train_seeds(
        lambda: SyntheticAttentionModel(dim, attention, nodes, vocab_size=nodes, num_outputs=nodes, bias=bias),
        seeds,
        steps,
        lr,
        lambda generator: graph_batch(transition, batch_size, generator),
        F.cross_entropy,
    )
    return [evaluate_graph(model, transition) for model in models]


@torch.no_grad()
def evaluate_graph(model: SyntheticAttentionModel, transition: Tensor) -> GraphRun:
    nodes = transition.shape[0]
    sequences = query_sequences(nodes)
    log_probs = torch.log_softmax(model(sequences), dim=-1)
    cross_entropy = -(transition * log_probs).sum(dim=1).mean()
    entropy = -(transition * transition.clamp_min(1e-30).log()).sum(dim=1).mean()
    attention_map = torch.zeros(nodes, nodes).scatter_(1, sequences, model.last_attention(sequences))
    variant = model.attn.variant
    temperatures = None
    if isinstance(variant, TemperatureLookup):
        temperatures = variant.temperature[0].clamp_min(variant.options.min_temperature).tolist()
    return GraphRun(
        cross_entropy=cross_entropy.item(),
        kl=(cross_entropy - entropy).item(),
        err_map=(attention_map - transition).abs().sum().item(),
        err_transition=(log_probs.exp() - transition).abs().sum().item(),
        attention_map=attention_map,
        transition=log_probs.exp(),
        temperatures=temperatures,
    )


@dataclass(frozen=True)
class DenoisingTask:
    length: int  # L
    sigma: float  # noise standard deviation
    alpha: float = 0.25  # probability that a token i < L carries the signal
    dim: int = 8  # K = d

    def sample(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        data = denoising_batch(batch, self.length, self.sigma, self.alpha, self.dim, generator)
        return data.x, data.y


def baseline_mse(task: DenoisingTask, samples: int, seed: int) -> dict[str, float]:
    """The two untrained rows of Table 2 on the test set: naive averaging and the Bayes-optimal estimator."""
    data = denoising_batch(samples, task.length, task.sigma, task.alpha, task.dim, torch.Generator().manual_seed(seed))
    return {
        "naive_average": normalised_mse(data.y, naive_average(data.x)).item(),
        "bayes_optimal": normalised_mse(data.y, bayes_optimal(data.x, data.signal)).item(),
    }


def train_denoising(
    task: DenoisingTask,
    attention: dict[str, Any],
    steps: int,
    batch_size: int,
    lr: float,
    seeds: Sequence[int],
    eval_samples: int,
    eval_seed: int,
    bias: bool = False,
) -> list[float]:
    """Fit 1-layer attention on the fixed standard-basis embedding to the normalised MSE; test MSE per seed."""
    models = train_seeds(
        lambda: SyntheticAttentionModel(task.dim, attention, task.length, bias=bias),
        seeds,
        steps,
        lr,
        lambda generator: task.sample(batch_size, generator),
        normalised_mse,
    )
    x, y = task.sample(eval_samples, torch.Generator().manual_seed(eval_seed))
    with torch.no_grad():
        return [normalised_mse(y, model(x)).item() for model in models]
