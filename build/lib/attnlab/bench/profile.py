"""Where a training step's time goes: its kernels' (CPU: its operators') own time, grouped by what they compute.

MFU says how far a step is from the peak, not why. The profile splits the step into matrix products, attention,
the cross-entropy, norms, the optimizer and the rest, plus the time no kernel ran (launch gaps on a GPU), so a
gap between the step and a plain GEMM is measured rather than guessed. Compiled code fuses several of these into
one kernel; inductor names a kernel after the operators it fused, and the first category that matches it wins.
The optimizer is found by its fused or foreach kernels (``--fused-adamw``, or CUDA's default foreach AdamW); a
per-tensor AdamW's multiplies and adds count as elementwise work.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark.utils.timer import timer as synchronised_clock

# the order matters: a fused kernel counts under the first category its name matches
CATEGORIES = (
    ("attention", r"flash|fmha|attention|sdpa|cudnn::fusion"),  # before GEMMs: fmha_cutlass* is attention
    ("matrix products", r"gemm|gemv|cutlass|nvjet|xmma|cublas|\b(?:addmm|mm|bmm|baddbmm|matmul)\b"),
    ("cross-entropy", r"log_?softmax|nll_loss|cross_entropy"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("norms", r"layer_norm|rms_norm"),
    ("embedding", r"embedding"),
    # compiled kernels name a fused cast "_to_copy": that is elementwise work, not a copy
    ("memory copies and fills", r"memcpy|memset|^(?!triton_).*(?:copy_|fill)"),
)
OTHER = "other (elementwise, fused, reductions)"
IDLE = "not covered"


def category(name: str) -> str:
    lowered = name.lower()
    return next((label for label, pattern in CATEGORIES if re.search(pattern, lowered)), OTHER)


@dataclass
class StepProfile:
    wall_s: float  # the profiled steps' wall time
    kernels: dict[str, float]  # seconds per kernel (CPU: ATen operator) name, its own time, over those steps

    def by_category(self) -> dict[str, float]:
        """Seconds per category, and the wall time no kernel covered as ``IDLE``."""
        seconds: dict[str, float] = {}
        for name, own in self.kernels.items():
            label = category(name)
            seconds[label] = seconds.get(label, 0.0) + own
        seconds[IDLE] = max(self.wall_s - sum(seconds.values()), 0.0)
        return seconds

    def longest(self, count: int) -> list[tuple[str, float]]:
        return sorted(self.kernels.items(), key=lambda item: -item[1])[:count]


def profile_step(step: Callable[[], None], device: torch.device, steps: int) -> StepProfile:
    """``steps`` calls of ``step`` under ``torch.profiler``: their wall time and each kernel's own time."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize(device)  # no warm-up kernel may run into the profiled window
    with profile(activities=activities) as profiler:
        start = synchronised_clock()
        for _ in range(steps):
            step()
        wall = synchronised_clock() - start
    kernels: dict[str, float] = {}
    for event in profiler.key_averages():
        if event.is_user_annotation:  # a range around kernels (``Optimizer.step``), which are counted themselves
            continue
        if cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            own = event.self_device_time_total
        else:
            if not event.key.startswith("aten::"):
                continue
            own = event.self_cpu_time_total
        kernels[event.key] = kernels.get(event.key, 0.0) + own / 1e6
    return StepProfile(wall, kernels)
