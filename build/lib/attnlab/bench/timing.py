"""Side-by-side timing in one process: contenders warmed up, then timed in a freshly shuffled order each round.

A fixed order lets one contender's after-effects (a GEMM probe heating the cores, the allocator's state) land on
whichever follows it; shuffling spreads them over all. Times come from ``torch.utils.benchmark``'s clock, which
synchronises the accelerator when it reads (its ``Timer`` would add two warm-up calls to every timed call and
pin the process to one thread); FLOPs from ``FlopCounterMode`` (matrix products and attention, as
PyTorch counts them), so achieved FLOP/s are comparable between models that count their own FLOPs differently.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.benchmark.utils.timer import timer as synchronised_clock
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class Contender:
    name: str
    run: Callable[[], object]  # one measured call (a training step, an attention forward and backward, ...)
    flops: float | None = None  # FLOPs of one call, counted by ``count_flops``
    peak_bytes: int | None = None  # CUDA memory peak of one call


@dataclass
class Timing:
    name: str
    median_s: float
    q1_s: float
    q3_s: float
    flops: float | None
    peak_bytes: int | None

    @property
    def spread(self) -> float:
        """Interquartile range over the median: how much the machine moved during the measurement."""
        return (self.q3_s - self.q1_s) / self.median_s

    @property
    def flops_per_s(self) -> float | None:
        return self.flops / self.median_s if self.flops else None


class Progress:
    """Lines on stderr with the elapsed time, so a run of many minutes shows where it is."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, what: str) -> None:
        print(f"bench [{time.perf_counter() - self.started:6.0f} s] {what}", file=sys.stderr, flush=True)


def count_flops(run: Callable[[], object]) -> float:
    with FlopCounterMode(display=False) as counter:
        run()
    return float(counter.get_total_flops())


def peak_memory(run: Callable[[], object], device: torch.device) -> int | None:
    """CUDA bytes allocated at the peak of one call (CPU: None; see ``attnlab.bench.clipped`` for a CPU measure)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def time_round_robin(
    contenders: list[Contender], rounds: int, warmup: int, progress: Progress, seed: int = 0
) -> dict[str, Timing]:
    """Median and quartiles of each contender's call time over ``rounds`` shuffled rounds."""
    for contender in contenders:
        progress(f"warming up {contender.name}")
        for _ in range(warmup):
            contender.run()
    order, times = list(contenders), {c.name: [] for c in contenders}
    shuffle = random.Random(seed).shuffle
    for number in range(1, rounds + 1):
        progress(f"round {number}/{rounds} of {len(contenders)} contenders")
        shuffle(order)
        for contender in order:
            start = synchronised_clock()
            contender.run()
            times[contender.name].append(synchronised_clock() - start)
    results = {}
    for contender in contenders:
        samples = times[contender.name]
        q1, median, q3 = (
            statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
        )
        results[contender.name] = Timing(contender.name, median, q1, q3, contender.flops, contender.peak_bytes)
    return results


def gemm_probe(device: torch.device, dtype: torch.dtype, size: int) -> Contender:
    """A square matrix product in the models' dtype: the machine's achievable FLOP/s, measured beside them."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    return Contender(f"GEMM {size}^3", lambda: a @ b, flops=2.0 * size**3)
