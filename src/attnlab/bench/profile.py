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

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark.utils.timer import timer as synchronised_clock

# the order matters: a fused kernel counts under the first category its name matches
CATEGORIES = (
    ("matrix products", r"gemm|gemv|cutlass|nvjet|xmma|cublas|\b(?:addmm|mm|bmm|baddbmm|matmul)\b"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn::fusion"),
    ("cross-entropy", r"log_softmax|nll_loss|cross_entropy"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("norms", r"layer_norm|rms_norm"),
    ("embedding", r"embedding"),
    ("memory copies and fills", r"memcpy|memset|copy_|fill_|zero_"),
)
OTHER = "other (elementwise, fused, reductions)"
IDLE = "not covered"


def category(name: str) -> str:
    lowered = name.lower()
    return next((label for label, pattern in CATEGORIES if re.search(pattern, lowered)), OTHER)


def profile_step(step: Callable[[], None], device: torch.device, steps: int) -> tuple[float, dict[str, float]]:
    """The wall time of ``steps`` calls and, per category, the seconds of its kernels (CPU: operators' self time)
    over those calls; the wall time not covered by any is the idle row."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as profiler:
        start = synchronised_clock()
        for _ in range(steps):
            step()
        wall = synchronised_clock() - start
    seconds: dict[str, float] = {}
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
        label = category(event.key)
        seconds[label] = seconds.get(label, 0.0) + own / 1e6
    seconds[IDLE] = max(wall - sum(seconds.values()), 0.0)
    return wall, seconds
