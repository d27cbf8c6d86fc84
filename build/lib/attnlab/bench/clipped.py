"""Clipped softmax's attention core against fused SDPA and against the naive full (T x T) clipped softmax, over
sequence lengths: time of a forward and backward, and the peak memory it takes.

The fused kernels cannot clip, so attnlab runs the exact math over chunks of queries (``chunk_size`` rows of
scores at a time, recomputed in backward when there are several): memory grows linearly in T where the naive
version's grows as T^2.
CUDA peaks come from the allocator; on a CPU each case runs in a fresh process and the peak is the growth of its
peak resident set (Linux's VmHWM, reset first) over one forward and backward.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from queue import Empty

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.base import AttentionShape, build_variant, causal_bias
from attnlab.bench.timing import Contender, Progress, Timing, count_flops, peak_memory, time_round_robin

METHODS = ("sdpa", "clipped", "clipped naive")
MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
CHILD_TIMEOUT_S = 900  # one forward and backward; a child that died (out of memory, no /proc) answers never


def attention_call(
    method: str, length: int, heads: int, head_dim: int, batch: int, device: str, dtype: torch.dtype
) -> Callable[[], None]:
    """One causal attention forward and backward over fresh (B, H, T, d) inputs."""
    q, k, v = (
        torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    grad = torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype)
    shape = AttentionShape(heads * head_dim, heads, heads, head_dim, length)
    variant = build_variant({"name": "clipped_softmax"}, shape).to(device)

    def naive(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = (q.float() @ k.float().transpose(-2, -1)) * variant.scale + causal_bias(length, length, q.device)
        return (variant.probabilities(scores) @ v.float()).to(q.dtype)

    forward = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "clipped": lambda: variant.attend(q, k, v, None, True, 0.0),
        "clipped naive": lambda: naive(q, k, v),
    }[method]

    def call() -> None:
        forward().backward(grad)
        q.grad = k.grad = v.grad = None

    return call


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field (VmRSS: now, VmHWM: the peak since the last reset), in KiB."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1])


def _cpu_peak_child(queue: multiprocessing.Queue, *args: object) -> None:
    call = attention_call(*args)  # type: ignore[arg-type]
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS (Linux >= 4.0)
    before = _status_kib("VmRSS")
    call()
    queue.put(1024 * (_status_kib("VmHWM") - before))


def cpu_peak_bytes(method: str, length: int, heads: int, head_dim: int, batch: int) -> int:
    """Growth of a fresh process's peak resident memory over one call (the inputs already allocated)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    # glibc keeps freed heap blocks (RSS would count its fragmentation): in the child every block over 64 KiB is
    # its own mapping, returned on free, so the peak is that of live tensors
    os.environ[MMAP_THRESHOLD], earlier = "65536", os.environ.get(MMAP_THRESHOLD)
    child = context.Process(
        target=_cpu_peak_child, args=(queue, method, length, heads, head_dim, batch, "cpu", torch.float32)
    )
    try:
        child.start()
    finally:
        if earlier is None:
            del os.environ[MMAP_THRESHOLD]
        else:
            os.environ[MMAP_THRESHOLD] = earlier
    try:
        peak = queue.get(timeout=CHILD_TIMEOUT_S)
    except Empty:
        raise RuntimeError(
            f"the memory probe for {method} at T={length} gave no answer (exit {child.exitcode})"
        ) from None
    finally:
        child.join(timeout=CHILD_TIMEOUT_S)
    return peak


def benchmark_clipped(
    lengths: list[int], heads: int, head_dim: int, batch: int, device: str, rounds: int, progress: Progress
) -> list[dict[str, object]]:
    """Inputs in bf16 on a GPU (the clipped paths compute in fp32 inside, as in training), fp32 on a CPU."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    rows = []
    for length in lengths:
        contenders, out_of_memory = [], []
        for method in METHODS:
            call = attention_call(method, length, heads, head_dim, batch, device, dtype)
            try:
                call()
            except torch.OutOfMemoryError:
                progress(f"T={length} {method}: out of memory")
                out_of_memory.append(method)
                del call
                torch.cuda.empty_cache()
                continue
            if device == "cpu":
                progress(f"T={length} {method}: peak memory in a fresh process")
                peak = cpu_peak_bytes(method, length, heads, head_dim, batch)
            else:
                peak = peak_memory(call, torch.device(device))
            contenders.append(Contender(method, call, flops=count_flops(call), peak_bytes=peak))
        timings: dict[str, Timing] = time_round_robin(contenders, rounds, warmup=1, progress=progress)
        base = timings["sdpa"]
        for method in METHODS:
            if method in out_of_memory:
                rows.append(
                    {"T": length, "method": method, "ms": None, "spread": None, "x sdpa": None, "peak_mb": None}
                )
                continue
            timing = timings[method]
            rows.append(
                {
                    "T": length,
                    "method": method,
                    "ms": 1000 * timing.median_s,
                    "spread": timing.spread,
                    "x sdpa": timing.median_s / base.median_s,
                    "peak_mb": timing.peak_bytes / 2**20 if timing.peak_bytes is not None else None,
                }
            )
    return rows
