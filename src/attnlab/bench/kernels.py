"""The ``kernels`` section: each variant's attention core, and its model's training step, on every backend it takes
(``attention.backend``), against vanilla on SDPA in the same run: time and peak memory over sequence lengths.

The core is the layer's own dispatch on random q/k/v (after the variant's ``transform_qkv``, so FoX's gate and SSMax's
scale count): ``sdpa`` the variant's ``attend``, ``flex`` its ``flex_attend`` (compiled on a GPU), ``reference`` the
plain (T x T) math. A GPU times forward and backward; a CPU only the forward, since FlexAttention has no CPU backward
(for the same reason the CPU has no flex training step). Imports torch and attnlab's models only, so it runs where
Hydra and the data stack are not installed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.attention import AttentionContext, AttentionShape, build_variant, resolve_options
from attnlab.bench.peers import Shape, training_step
from attnlab.bench.timing import Contender, Progress, Timing, count_flops, peak_memory, time_round_robin
from attnlab.models import build_gpt

# vanilla first (the baseline), then the variants whose backend changes what runs
KERNEL_VARIANTS = ("vanilla", "clipped_softmax", "sink", "sigmoid", "fox", "ssmax", "ssa_shared")
BASELINE = ("vanilla", "sdpa")


def core_call(
    name: str, backend: str, length: int, heads: int, head_dim: int, batch: int, device: torch.device
) -> Callable[[], None]:
    """One attention core over fresh (B, H, T, d_h) inputs: forward and backward where the backend trains here."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = AttentionShape(heads * head_dim, heads, heads, head_dim, length, pos_encoding="learned")
    variant = build_variant({"name": name, "backend": backend}, shape).to(device)
    trains = device.type == "cuda" or backend != "flex"
    x = torch.randn(batch, length, heads * head_dim, device=device, dtype=dtype)
    q, k, v = (
        torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=trains) for _ in range(3)
    )
    ctx = AttentionContext(positions=torch.arange(length, device=device))

    def forward() -> Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            qt, kt, vt = variant.transform_qkv(x, q, k, v, ctx)
            if backend == "flex":
                return variant.flex_attend(qt, kt, vt, ctx.flex_mask(length))
            mask, is_causal = ctx.mask(length, length, dtype)
            if backend == "reference":
                return variant.reference_attention(qt, kt, vt, mask, is_causal)[0]
            return variant.attend(qt, kt, vt, mask, is_causal, 0.0)

    def call() -> None:
        if trains:
            forward().float().sum().backward()
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                forward()

    return call


def plans(variants: list[str], backends: list[str]) -> list[tuple[str, str]]:
    """(variant, backend) pairs to measure, the baseline first; a backend a variant refuses is left out."""
    pairs = [(n, b) for n in variants for b in backends if b in resolve_options({"name": n})[0].backends()]
    return [BASELINE, *(pair for pair in pairs if pair != BASELINE)]


def benchmark_kernels(
    variants: list[str],
    backends: list[str],
    lengths: list[int],
    batch: int,
    step_shape: Shape,
    device: torch.device,
    rounds: int,
    progress: Progress,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Rows of the core table (per T) and of the training-step table (at ``step_shape``)."""
    pairs = plans(variants, backends)
    cores = []
    for length in lengths:
        contenders = []
        for name, backend in pairs:
            progress(f"kernels: T={length} {name} on {backend}")
            call = core_call(name, backend, length, 12, 64, batch, device)
            call()  # compilation, allocator
            contenders.append(Contender(f"{name}|{backend}", call, peak_bytes=peak_memory(call, device)))
        timings = time_round_robin(contenders, rounds, warmup=1, progress=progress)
        base = timings["|".join(BASELINE)]
        cores += [{"T": length, **row(timings[c.name], base)} for c in contenders]
    steps = []
    tokens = torch.randint(0, step_shape.vocab_size, (step_shape.batch, step_shape.length + 1), device=device)
    counted: dict[str, int | None] = {}  # each variant's FLOPs, counted on its own (non-flex) path
    for name, backend in pairs:
        if backend == "flex" and device.type == "cpu":
            continue  # no FlexAttention backward on the CPU
        progress(f"kernels: {step_shape.name} training step, {name} on {backend}")
        model = build_gpt(step_shape.model_config(), {"name": name, "backend": backend}).to(device)
        step = training_step(model, tokens, device.type == "cuda", fused_adamw=device.type == "cuda")
        # FlopCounterMode cannot run flex's eager path (torch 2.11 on an H100, 2026-11-26: "no implementation found
        # for 'torch.ops.higher_order.flex_attention'"); flex computes the same products, so it takes the count
        # made on the variant's own path
        flops = counted.get(name) if backend == "flex" else counted.setdefault(name, count_flops(step))
        steps.append(Contender(f"{name}|{backend}", step, flops=flops, peak_bytes=peak_memory(step, device)))
    timings = time_round_robin(steps, rounds, warmup=1, progress=progress)
    base = timings["|".join(BASELINE)]
    return cores, [row(timings[c.name], base) for c in steps]


def row(timing: Timing, base: Timing) -> dict[str, object]:
    name, backend = timing.name.split("|")
    return {
        "variant": name,
        "backend": backend,
        "ms": 1000 * timing.median_s,
        "spread": timing.spread,
        "x vanilla sdpa": timing.median_s / base.median_s,
        "peak MiB": timing.peak_bytes / 2**20 if timing.peak_bytes is not None else None,
        "TFLOP/s": timing.flops_per_s / 1e12 if timing.flops_per_s else None,
    }
