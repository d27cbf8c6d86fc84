"""Training loops of the two synthetic tables: Adam at the paper's lr 1e-4, fresh samples every step, for a fixed
number of steps or until the monitored values stop moving (``Convergence``), which can take hours: that mode saves
a checkpoint at every check and resumes from it, exactly.

All seeds of one configuration train together: their parameters are stacked and the model runs under
``torch.func.vmap``. Adam is elementwise and the summed loss gives each seed its own gradient, so this is
exactly S independent runs (tested), at a fraction of the per-step Python overhead that dominates on CPU.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from attnlab.attention.variants.temp_lookup import TemperatureLookup
from attnlab.errors import require
from attnlab.synthetic.data import (
    bayes_optimal,
    denoising_batch,
    entropy,
    graph_batch,
    naive_average,
    normalised_mse,
    query_sequences,
    transition_matrix,
)
from attnlab.synthetic.model import SyntheticAttentionModel
from attnlab.training.checkpointing import AtomicCheckpointIO

log = logging.getLogger(__name__)
Batch = Callable[[torch.Generator], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Convergence:
    """Train until the monitored values stop moving instead of for a fixed budget, so a table reports where the
    optimisation ends rather than wherever the budget cut it. A check every ``check_every`` steps records, per
    seed, the loss (column 0) and the temperatures (the other columns). A seed has settled at a check when, over
    the last ``window`` checks, every value stayed within tolerance of its value at the check before them:
    |L - L0| <= loss_rtol * |L0| and |T - T0| <= temperature_atol + temperature_rtol * |T0|. Training stops at
    the first check where every seed has settled, or at ``max_steps``."""

    check_every: int  # steps between checks
    window: int  # checks over which the values must stay within tolerance
    loss_rtol: float  # relative tolerance on the loss
    temperature_rtol: float  # relative tolerance on each temperature
    temperature_atol: float  # absolute tolerance on each temperature (matters near the floor 1e-3)
    max_steps: int  # the cap: stop here even if some seed has not settled

    def __post_init__(self) -> None:
        require(self.check_every >= 1, "optim.convergence.check_every", f"must be >= 1, got {self.check_every}")
        require(self.window >= 1, "optim.convergence.window", f"must be >= 1, got {self.window}")
        require(
            self.max_steps % self.check_every == 0,
            "optim.convergence.max_steps",
            f"must be a multiple of check_every={self.check_every}, got {self.max_steps}",
        )

    def settled(self, history: Tensor) -> Tensor:
        """Per seed, whether the criterion holds at the last check; ``history`` is (checks, seeds, values)."""
        if history.shape[0] <= self.window:
            return torch.zeros(history.shape[1], dtype=torch.bool)
        start, recent = history[-self.window - 1], history[-self.window :]
        rtol = torch.full(history.shape[-1:], self.temperature_rtol, dtype=history.dtype)
        atol = torch.full(history.shape[-1:], self.temperature_atol, dtype=history.dtype)
        rtol[0], atol[0] = self.loss_rtol, 0.0
        return ((recent - start).abs() <= atol + rtol * start.abs()).all(dim=0).all(dim=-1)

    def describe(self) -> str:
        """The criterion in words, for the tables' headers."""
        span = self.window * self.check_every
        return (
            f"checked every {self.check_every} steps; a seed has converged when, at each of the last {self.window} "
            f"checks ({span} steps), its loss L was within {self.loss_rtol:g}·L0 of L0 and each temperature T within "
            f"{self.temperature_atol:g} + {self.temperature_rtol:g}·T0 of T0 (L0, T0: the values {span} steps "
            f"earlier); training stops at the first check where every seed has converged, or at {self.max_steps} steps"
        )


@dataclass
class Training:
    """Models trained together, and how the training ended."""

    models: list[SyntheticAttentionModel]
    steps: int  # optimizer steps taken
    history: Tensor | None  # (checks, seeds, values) at steps 0, check_every, ...; None for a fixed step count
    settled: list[bool] | None  # per seed, whether it had converged when training stopped; None: fixed steps

    @property
    def converged(self) -> bool | None:
        """Every seed converged (False: the cap stopped training); None for a fixed step count."""
        return None if self.settled is None else all(self.settled)


def train_seeds(
    build: Callable[[], SyntheticAttentionModel],
    seeds: Sequence[int],
    steps: int | Convergence,
    lr: float,
    batch: Batch,
    loss: Callable[[Tensor, Tensor], Tensor],
    monitor: Callable[[SyntheticAttentionModel], Tensor] | None = None,
    checkpoint: Path | None = None,
) -> Training:
    """One model per seed (init from ``torch.manual_seed(seed)``, data from its own generator), trained jointly,
    for ``steps`` steps or until ``steps`` (a ``Convergence``) says every seed's ``monitor`` values have settled.
    The checks read the models without touching any generator, so the first n steps are the same in both modes.

    Until convergence, ``checkpoint`` (a file) is written atomically at every check: parameters, Adam's state, the
    data generators and the checks so far. A run that finds it resumes where it stopped, with the same result as
    an uninterrupted run; a killed run loses at most ``check_every`` steps. A finished run's file stays, so running
    the same configuration again returns at once, and a higher ``max_steps`` continues a capped run. The caller
    names the file after everything else that determines the training and where it stops."""
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

    def unstack() -> None:
        """Copy the stacked parameters into the per-seed models that the monitor and the caller read."""
        for i, model in enumerate(models):
            model.load_state_dict({name: value[i].detach() for name, value in params.items()}, strict=False)

    def fit(count: int) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*batching rule.*")  # SDPA under vmap: a loop, still exact
            for _ in range(count):
                inputs, targets = zip(*(batch(generator) for generator in generators), strict=True)
                total = per_seed_loss(forward(params, buffers, torch.stack(inputs)), torch.stack(targets)).sum()
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()
        unstack()

    if isinstance(steps, int):
        if checkpoint is not None:
            raise ValueError("train_seeds: checkpoints are for training until convergence")
        fit(steps)
        return Training(models, steps, history=None, settled=None)
    if monitor is None:
        raise ValueError("train_seeds: training until convergence needs a monitor")
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        require(
            state["taken"] <= steps.max_steps,
            "optim.convergence.max_steps",
            f"{checkpoint} has already trained {state['taken']} steps, past the cap {steps.max_steps}: raise the "
            "cap, or move the file away to train this setting anew",
        )
        with torch.no_grad():
            for name, value in params.items():
                value.copy_(state["params"][name])
        optimizer.load_state_dict(state["optimizer"])
        for generator, generator_state in zip(generators, state["generators"], strict=True):
            generator.set_state(generator_state)
        unstack()
        checks, taken = list(state["checks"]), state["taken"]
        log.info("resumed from %s at step %d (any steps after it were lost with the stopped run)", checkpoint, taken)
    else:
        checks, taken = [torch.stack([monitor(model) for model in models])], 0
    settled = steps.settled(torch.stack(checks))
    while taken < steps.max_steps and not settled.all():
        fit(steps.check_every)
        taken += steps.check_every
        checks.append(torch.stack([monitor(model) for model in models]))
        settled = steps.settled(torch.stack(checks))
        if checkpoint is not None:
            state = {
                "params": {name: value.detach() for name, value in params.items()},
                "optimizer": optimizer.state_dict(),
                "generators": [generator.get_state() for generator in generators],
                "checks": torch.stack(checks),
                "taken": taken,
            }
            AtomicCheckpointIO().save_checkpoint(state, checkpoint)
    return Training(models, taken, history=torch.stack(checks), settled=settled.tolist())


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
    steps: int | Convergence,
    batch_size: int,
    lr: float,
    seeds: Sequence[int],
    bias: bool = False,
    checkpoint: Path | None = None,
) -> tuple[list[GraphRun], Training]:
    """Fit the 1-layer model to next-token prediction on the graph with cross-entropy (the paper's section 4.1).
    Until convergence, the checks watch the exact cross-entropy and the learned temperatures (``graph_values``),
    and ``checkpoint`` makes the training resumable (``train_seeds``)."""
    transition = transition_matrix(nodes, edges)
    training = train_seeds(
        lambda: SyntheticAttentionModel(dim, attention, nodes, vocab_size=nodes, num_outputs=nodes, bias=bias),
        seeds,
        steps,
        lr,
        lambda generator: graph_batch(transition, batch_size, generator),
        F.cross_entropy,
        monitor=lambda model: graph_values(evaluate_graph(model, transition)),
        checkpoint=checkpoint,
    )
    return [evaluate_graph(model, transition) for model in training.models], training


def graph_values(run: GraphRun) -> Tensor:
    """A check's values: the exact cross-entropy, then the temperature of each group (none for vanilla)."""
    return torch.tensor([run.cross_entropy, *(run.temperatures or [])], dtype=torch.float64)


@torch.no_grad()
def evaluate_graph(model: SyntheticAttentionModel, transition: Tensor) -> GraphRun:
    nodes = transition.shape[0]
    sequences = query_sequences(nodes)
    log_probs = torch.log_softmax(model(sequences), dim=-1)
    cross_entropy = -(transition * log_probs).sum(dim=1).mean()
    attention_map = torch.zeros(nodes, nodes).scatter_(1, sequences, model.last_attention(sequences))
    variant = model.attn.variant
    temperatures = None
    if isinstance(variant, TemperatureLookup):
        temperatures = variant.temperature[0].clamp_min(variant.options.min_temperature).tolist()
    return GraphRun(
        cross_entropy=cross_entropy.item(),
        kl=(cross_entropy - entropy(transition)).item(),
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
    ).models
    x, y = task.sample(eval_samples, torch.Generator().manual_seed(eval_seed))
    with torch.no_grad():
        return [normalised_mse(y, model(x)).item() for model in models]
