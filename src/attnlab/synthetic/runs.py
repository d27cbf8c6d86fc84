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
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
    history: Tensor | None  # (checks, seeds, values) at steps 0, check_every, ...; None: fixed steps, not recorded
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
    record_every: int | None = None,
) -> Training:
    """One model per seed (init from ``torch.manual_seed(seed)``, data from its own generator), trained jointly,
    for ``steps`` steps or until ``steps`` (a ``Convergence``) says every seed's ``monitor`` values have settled.
    The checks read the models without touching any generator, so the first n steps are the same in both modes.

    Until convergence, ``checkpoint`` (a file) is written atomically at every check: parameters, Adam's state, the
    data generators and the checks so far. A run that finds it resumes where it stopped, with the same result as
    an uninterrupted run; a killed run loses at most ``check_every`` steps. A finished run's file stays, so running
    the same configuration again returns at once, and a higher ``max_steps`` continues a capped run. The caller
    names the file after everything else that determines the training and where it stops.

    For a fixed step count, ``record_every`` records ``monitor`` every that many steps (and at step 0) as the
    history, so a fixed-step table can show its trajectory; the checks do not change the training."""
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
        if record_every is None:
            fit(steps)
            return Training(models, steps, history=None, settled=None)
        require(monitor is not None, "optim.record_every", "recording a trajectory needs a monitor")
        require(
            record_every >= 1 and steps % record_every == 0,
            "optim.record_every",
            f"must divide optim.steps={steps}, got {record_every}",
        )
        checks = [torch.stack([monitor(model) for model in models])]
        for _ in range(steps // record_every):
            fit(record_every)
            checks.append(torch.stack([monitor(model) for model in models]))
        return Training(models, steps, history=torch.stack(checks), settled=None)
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
    transition: Tensor  # G: row q = softmax(C f(X)) for the sequences ending in q (= P^ when the map is the readout)
    attention_entropy: Tensor  # per query q: entropy of P^'s row q in nats (lower = sparser map)
    temperatures: list[float] | None  # T = 1 / (factor on q) per group, the paper's convention (temp_lookup)


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
    embedding: str = "learned",
    readout: str = "head",
    record_every: int | None = None,
) -> tuple[list[GraphRun], Training]:
    """Fit the 1-layer model to next-token prediction on the graph with cross-entropy (the paper's section 4.1).
    Until convergence (or every ``record_every`` steps of a fixed count), the checks record the exact
    cross-entropy and the temperatures (``graph_values``); ``checkpoint`` makes convergence runs resumable."""
    transition = transition_matrix(nodes, edges)
    training = train_seeds(
        lambda: SyntheticAttentionModel(
            dim, attention, nodes, nodes, nodes, bias=bias, embedding=embedding, readout=readout
        ),
        seeds,
        steps,
        lr,
        lambda generator: graph_batch(transition, batch_size, generator),
        F.cross_entropy,
        monitor=lambda model: graph_values(evaluate_graph(model, transition)),
        checkpoint=checkpoint,
        record_every=record_every,
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
    temperatures = variant.temperatures()[0].tolist() if isinstance(variant, TemperatureLookup) else None
    return GraphRun(
        cross_entropy=cross_entropy.item(),
        kl=(cross_entropy - entropy(transition)).item(),
        err_map=(attention_map - transition).abs().sum().item(),
        err_transition=(log_probs.exp() - transition).abs().sum().item(),
        attention_map=attention_map,
        transition=log_probs.exp(),
        attention_entropy=-(attention_map * attention_map.clamp_min(1e-30).log()).sum(dim=1),
        temperatures=temperatures,
    )


@dataclass(frozen=True)
class DenoisingTask:
    length: int  # L
    sigma: float  # noise standard deviation
    alpha: float = 0.25  # probability that a token i < L carries the signal
    dim: int = 8  # K = d
    positions: str = "last"  # where the risk is scored: last (position L) | all (mean over causal positions 1..L)

    def sample(self, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        data = denoising_batch(batch, self.length, self.sigma, self.alpha, self.dim, generator)
        return data.x, data.y


def baseline_mse(task: DenoisingTask, samples: int, seed: int) -> dict[str, float]:
    """The two untrained rows of Table 2 on the test set: naive averaging and the Bayes-optimal estimator, scored
    where the models are (``task.positions``: at every position each sees only its prefix)."""
    data = denoising_batch(samples, task.length, task.sigma, task.alpha, task.dim, torch.Generator().manual_seed(seed))
    causal = task.positions == "all"
    return {
        "naive_average": normalised_mse(data.y, naive_average(data.x, causal)).item(),
        "bayes_optimal": normalised_mse(data.y, bayes_optimal(data.x, data.signal, causal)).item(),
    }


def denoising_loss(prediction: Tensor, y: Tensor) -> Tensor:
    """The paper's training objective E ||y - y_hat / ||y_hat|| ||^2 in ``train_seeds``' (prediction, target) order.
    Passing ``normalised_mse`` itself there normalised the target instead, training on the plain MSE ||y_hat - y||^2
    (fixed by the protocol review)."""
    return normalised_mse(y, prediction)


def small_noise_ratio(length: int, alpha: float) -> float:
    """Naive-averaging risk / Bayes-optimal risk as sigma -> 0, exactly: with S = 1 + Binomial(L - 1, alpha) signal
    tokens, the Bayes mean is e_q + N(0, sigma^2 / S) and the naive mean (S / L) e_q + N(0, sigma^2 / L), so their
    normalised errors are ~(K - 1) sigma^2 / S and ~(K - 1) sigma^2 L / S^2: the ratio is L E[S^-2] / E[S^-1]."""
    others = torch.arange(length, dtype=torch.float64)
    pmf = torch.distributions.Binomial(length - 1, probs=torch.tensor(alpha, dtype=torch.float64)).log_prob(others)
    signal = others + 1
    return (length * (pmf.exp() / signal**2).sum() / (pmf.exp() / signal).sum()).item()


def sigma_for_bayes(task: DenoisingTask, target: float, samples: int, seed: int) -> float:
    """The noise level at which the Bayes-optimal risk of ``task`` (its sigma ignored) equals ``target``, by
    bisection on a log scale: the test set scales one fixed noise draw, so the risk grows monotonically in sigma."""
    low, high = 1.0e-4, 10.0
    for _ in range(30):  # the bracket shrinks to a factor 1 + 1e-8
        middle = math.sqrt(low * high)
        risk = baseline_mse(replace(task, sigma=middle), samples, seed)["bayes_optimal"]
        low, high = (middle, high) if risk < target else (low, middle)
    return math.sqrt(low * high)


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
    """Fit 1-layer attention on the fixed standard-basis embedding to the normalised MSE, scored at
    ``task.positions``; test MSE per seed."""
    models = train_seeds(
        lambda: SyntheticAttentionModel(task.dim, attention, task.length, bias=bias, positions=task.positions),
        seeds,
        steps,
        lr,
        lambda generator: task.sample(batch_size, generator),
        denoising_loss,
    ).models
    x, y = task.sample(eval_samples, torch.Generator().manual_seed(eval_seed))
    with torch.no_grad():
        return [normalised_mse(y, model(x)).item() for model in models]
