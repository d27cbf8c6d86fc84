"""GPU only (skipped without CUDA): ``attention.backend=flex`` compiled into kernels trains exactly as the exact paths.

FlexAttention's backward exists only on a GPU, so what the CPU suite checks through flex's eager math is checked here
on the compiled kernels: values and gradients of clipped softmax's two passes, the sink, sigmoid and FoX against their
exact (chunked or SDPA) paths, clipped softmax's memory growing linearly in T, and a whole model's training step.
Imports torch and attnlab only (no Hydra, no datasets), so ``experiments/gpu_kernels_check.sh`` runs it with
``--noconftest`` on a machine that has nothing else.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import AttentionContext, AttentionShape, build_variant
from attnlab.models import build_gpt
from attnlab.models.gpt import alibi_slopes, document_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H, KV, DH = 4, 2, 64
CUDA = torch.device("cuda")


def variant(name: str, **options) -> torch.nn.Module:
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=KV, head_dim=DH, block_size=512)
    return build_variant({"name": name, **options}, shape).to(CUDA)


def values_and_grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).view(out.shape).to(out.dtype)
    return (out, *torch.autograd.grad((out * weights).sum(), inputs, retain_graph=True))


@pytest.mark.parametrize(
    ("name", "options", "alibi", "dtype"),
    [  # each case compiles its own kernels: a few that cover fp32 and bf16, causal and ALiBi, every score_mod
        ("clipped_softmax", {"zeta": 1.1, "gamma": -0.03, "alpha": None}, False, torch.float32),
        ("clipped_softmax", {"zeta": 1.1, "gamma": -0.03, "alpha": None}, True, torch.bfloat16),
        ("sink", {"sink_init": 0.5}, True, torch.float32),
        ("sigmoid", {}, False, torch.bfloat16),
        ("fox", {}, False, torch.float32),
    ],
    ids=["clipped_softmax-fp32", "clipped_softmax-alibi-bf16", "sink-alibi-fp32", "sigmoid-bf16", "fox-fp32"],
)
def test_compiled_flex_trains_as_the_exact_path(name: str, options: dict, alibi: bool, dtype: torch.dtype) -> None:
    """Values and gradients (inputs and the variant's parameters), T = 300 (not a multiple of flex's 128 blocks)."""
    t = 300
    v = variant(name, **options)
    g = torch.Generator(device=CUDA).manual_seed(0)
    q, k, val = (torch.randn(2, h, t, DH, generator=g, device=CUDA).to(dtype).requires_grad_() for h in (H, KV, KV))
    if name == "fox":
        x = torch.randn(2, t, H * DH, generator=g, device=CUDA)
        _, k, _ = v.transform_qkv(x, q, k, val, AttentionContext(positions=torch.arange(t, device=CUDA)))
    ctx = AttentionContext(
        positions=torch.arange(t, device=CUDA), alibi_slopes=alibi_slopes(H).to(CUDA) if alibi else None
    )
    inputs = (q, k, val, *v.parameters())
    flex = values_and_grads(v.flex_attend(q, k, val, ctx.flex_mask(t)), inputs)
    exact = values_and_grads(v.attend(q, k, val, *ctx.mask(t, t, dtype), 0.0), inputs)
    tol = 2e-4 if dtype == torch.float32 else 5e-2
    for index, (a, b) in enumerate(zip(flex, exact, strict=True)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol, msg=lambda m, i=index: f"{i}: {m}")


def peak_mib(call) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def test_two_pass_clipped_softmax_memory_is_linear_in_t() -> None:
    """Forward and backward at T = 2,048 and 8,192 (batch 1, 12 heads x 64, bf16): 4x the tokens at most ~4x the
    memory, and far below one fp32 (T x T) score matrix per head at 8,192 (3 GiB)."""
    v = build_variant({"name": "clipped_softmax", "backend": "flex"}, AttentionShape(768, 12, 12, 64, 1024)).to(CUDA)
    peaks = []
    for t in (2048, 8192):
        q, k, val = (torch.randn(1, 12, t, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
        flex_mask = AttentionContext(positions=torch.arange(t, device=CUDA)).flex_mask(t)
        v.flex_attend(q, k, val, flex_mask).sum().backward()  # compile outside the measurement
        peaks.append(peak_mib(lambda: v.flex_attend(q, k, val, flex_mask).sum().backward()))  # noqa: B023
    assert peaks[1] < 5 * peaks[0], peaks
    assert peaks[1] < 1024, peaks


@pytest.mark.parametrize("packed", [False, True], ids=["one-document", "document-mask"])
@pytest.mark.parametrize("name", ["vanilla", "clipped_softmax"])
def test_a_model_on_flex_takes_the_same_training_step_as_on_its_exact_path(name: str, packed: bool) -> None:
    """A whole GPT, fp32: the loss and every parameter's gradient equal the sdpa backend's (ALiBi: flex's bias;
    packed: three documents in each block under document masking, flex's per-batch block mask)."""
    model = {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 256, "block_size": 256, "pos_encoding": "alibi"}
    torch.manual_seed(0)
    flex = build_gpt(model, {"name": name, "backend": "flex"}).to(CUDA)
    exact = build_gpt(model, {"name": name}).to(CUDA)
    exact.load_state_dict(flex.state_dict())
    tokens = torch.randint(1, 256, (2, 257), device=CUDA)
    tokens[:, 60], tokens[0, 150], tokens[1, 200] = 0, 0, 0
    documents = document_ids(tokens[:, :-1], separator=0) if packed else None
    losses = []
    for gpt in (flex, exact):
        logits = gpt(tokens[:, :-1], documents=documents)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (label, a), b in zip(flex.named_parameters(), exact.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-4, rtol=2e-3, msg=lambda m, n=label: f"{n}: {m}")


def test_a_compiled_model_on_flex_equals_its_eager_forward() -> None:
    """train.py's compile=true compiles the forward with flex inside (the block mask built in the graph)."""
    model = {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 256, "block_size": 256}
    torch.manual_seed(0)
    gpt = build_gpt(model, {"name": "clipped_softmax", "backend": "flex"}).to(CUDA)
    tokens = torch.randint(0, 256, (2, 256), device=CUDA)
    compiled = torch.compile(gpt)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), gpt(tokens), atol=1e-4, rtol=1e-4)
