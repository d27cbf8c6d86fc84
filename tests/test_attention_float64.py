"""Every registered variant in float64, on shapes the other tests do not use (B=3, T=37, 6 heads of 12, GQA with 2
and 3 KV heads where the variant takes them): it runs, stays float64, agrees with itself in fp32, its fused and
plain-math paths agree to float64 precision (values and every parameter's gradient), and its gradient is the
derivative of its float64 output (a path that rounds through fp32 anywhere fails the finite difference).

The per-variant checks against each reference's own math in float64 live with that reference's port
(``test_matches_the_reference_in_float64`` and friends in the variant's test file)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from attnlab.attention import available_attention
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT
from tests.test_attention_variants import VOCAB, build, tokens

BATCH, T, HEADS, HEAD_DIM = 3, 37, 6, 12
# the position encoding each variant takes (fox replaces rotary, stick-breaking takes none); rotary elsewhere
POSITION_ENCODING = {"fox": "learned", "fox_pro": "learned", "stickbreaking": "none"}


def config(name: str, kv: int) -> ModelConfig:
    return ModelConfig(
        n_layer=2,
        n_head=HEADS,
        n_kv_head=kv,
        n_embd=HEADS * HEAD_DIM,
        vocab_size=VOCAB,
        block_size=64,
        pos_encoding=POSITION_ENCODING.get(name, "rotary"),
    )


def twins(name: str, kv: int) -> tuple[GPT, GPT]:
    """The same perturbed model in fp32 and in float64."""
    model32 = build({"name": name}, config(name, kv), seed=7)
    return model32, copy.deepcopy(model32).double()


def use_reference_path(model: GPT, on: bool) -> None:
    for block in model.blocks:
        block.attn.record_probabilities = on


def output_and_grads(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Logits and the gradient of a loss that weighs each logit differently, for every parameter."""
    logits = model(idx)
    weights = torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view(logits.shape)
    params = [p for p in model.parameters() if p.requires_grad]
    return (logits, *torch.autograd.grad((logits * weights).sum(), params))


@pytest.mark.parametrize("kv", [2, 3])
@pytest.mark.parametrize("name", available_attention())
def test_float64_agrees_with_fp32_and_its_paths_agree_to_float64_precision(name: str, kv: int) -> None:
    model32, model64 = twins(name, kv)
    idx = tokens(T, batch=BATCH, seed=5)
    fused = output_and_grads(model64, idx)
    assert all(t.dtype == torch.float64 for t in fused)
    torch.testing.assert_close(model32(idx).double(), fused[0], atol=1e-4, rtol=1e-4)
    use_reference_path(model64, True)
    reference = output_and_grads(model64, idx)
    for index, (a, b) in enumerate(zip(fused, reference, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-10, msg=lambda m, i=index: f"output/grad {i}: {m}")


@pytest.mark.parametrize("name", available_attention())
def test_float64_gradient_is_the_derivative_of_the_float64_output(name: str) -> None:
    """A central difference along a random direction of every parameter equals the gradient's projection: in
    float64 the two agree to ~1e-6 relative (the difference's own eps^2 error), while a value rounded through fp32
    on the way (1e-7 relative) puts the quotient off by ~1e-7 / eps = 0.1 relative. The fused path only: the test
    above ties the plain-math path to it at 1e-10."""
    _, model = twins(name, 2)
    idx = tokens(T, batch=BATCH, seed=5)
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(3)
    direction = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]
    logits = model(idx)
    weights = torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view(logits.shape)
    grads = torch.autograd.grad((logits * weights).sum(), params)
    analytic = sum((g * d).sum() for g, d in zip(grads, direction, strict=True))
    eps = 1e-6

    def loss_at(step: float) -> torch.Tensor:
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(step * d)
            value = (model(idx) * weights).sum()
            for p, d in zip(params, direction, strict=True):
                p.sub_(step * d)
        return value

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    torch.testing.assert_close(numeric, analytic, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv", [2, 3])
@pytest.mark.parametrize("start_pos", [0, 37])
def test_ssa_position_term_is_the_formula_in_float64(kv: int, start_pos: int) -> None:
    """tau = 1 + sigmoid(alpha_h) log n_t on q, k and v with log n in float64: a constant rounded through fp32 keeps
    the gradient consistent, so only the formula itself shows it."""
    attention = {"name": "ssa_pos_only", "components": ["q", "k", "v"]}
    model64 = build(attention, config("ssa_pos_only", kv), seed=7).double()
    variant = model64.blocks[0].attn.variant
    q, k, v = (torch.randn(BATCH, n, T, HEAD_DIM, dtype=torch.float64) for n in (HEADS, kv, kv))
    ctx = model64.context(tokens(T, batch=BATCH), start_pos=start_pos)
    new = variant.transform_qkv(torch.zeros(BATCH, T, HEADS * HEAD_DIM, dtype=torch.float64), q, k, v, ctx)
    log_n = torch.arange(start_pos + 1, start_pos + T + 1, dtype=torch.float64).log()
    for component, before, after in zip("qkv", (q, k, v), new, strict=True):
        alpha = variant.temperatures[component].alpha
        tau = 1 + torch.sigmoid(alpha).view(-1, 1) * log_n  # (heads, T)
        torch.testing.assert_close(after, before * tau[None, :, :, None], atol=1e-15, rtol=1e-14)


@pytest.fixture
def float64_default() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("name", available_attention())
def test_a_model_built_under_a_float64_default_runs_in_float64(float64_default: None, name: str) -> None:
    """Tensors a variant builds without a dtype (eye, ones, masks) follow the default: nothing mixes fp32 in."""
    model = build({"name": name}, config(name, 3 if name != "diff" else 2), seed=7)
    logits = model(tokens(T, batch=BATCH, seed=5))
    logits.square().mean().backward()
    assert logits.dtype == torch.float64
    assert all(p.grad.dtype == torch.float64 for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["vanilla", "clipped_softmax", "sink", "sigmoid", "fox", "fox_pro"])
def test_flex_forward_in_float64_equals_the_reference_path(name: str) -> None:
    """FlexAttention's eager CPU forward in float64 for the variants with a flex path of their own (the others run
    vanilla's), their score_mods' captured constants and the unnormalised maps' rescaling included, against the
    plain-math path (the CPU has no flex backward)."""
    flex = build({"name": name, "backend": "flex"}, config(name, 3), seed=7).double()
    reference = build({"name": name, "backend": "reference"}, config(name, 3), seed=7).double()
    idx = tokens(T, batch=BATCH, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(flex(idx), reference(idx), atol=1e-11, rtol=1e-10)
