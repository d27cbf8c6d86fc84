"""Clipped softmax: the chunked, memory-bounded path equals the plain reference in every masking situation."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import AttentionContext, AttentionShape, build_variant
from attnlab.models.gpt import alibi_slopes

H, KV, DH = 4, 2, 8


def clipped(chunk_size: int = 4, block_size: int = 32, **options) -> torch.nn.Module:
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=KV, head_dim=DH, block_size=block_size)
    options = {"zeta": 1.1, "gamma": -0.08, "alpha": None, **options}
    return build_variant({"name": "clipped_softmax", "chunk_size": chunk_size, **options}, shape)


def qkv(t_q: int, t_k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        (2 * torch.randn(2, heads, t, DH, generator=g)).requires_grad_()
        for heads, t in ((H, t_q), (KV, t_k), (KV, t_k))
    )


def context(t_q: int, t_k: int, alibi: bool) -> tuple[torch.Tensor | None, bool]:
    ctx = AttentionContext(positions=torch.arange(t_k - t_q, t_k), alibi_slopes=alibi_slopes(H) if alibi else None)
    return ctx.mask(t_q, t_k, torch.float32)


@pytest.mark.parametrize("alibi", [False, True], ids=["causal", "alibi"])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (16, 16), (5, 13), (1, 13)], ids=["odd", "even", "cache", "decode"])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_chunked_attend_equals_reference(alibi: bool, t_q: int, t_k: int, chunk_size: int) -> None:
    """Values and gradients, for T not divisible by the chunk, with a KV-cache offset and ALiBi masks."""
    variant = clipped(chunk_size)
    mask, is_causal = context(t_q, t_k, alibi)
    q, k, v = qkv(t_q, t_k)
    out = variant.attend(q, k, v, mask, is_causal, 0.0)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected, probabilities = variant.reference_attention(q, k, v, mask, is_causal)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)
    future = 2 * H * t_q * (t_q - 1) // 2  # masked entries: query i sees keys up to i + t_k - t_q
    assert (probabilities == 0).sum() > future  # and visible keys were clipped to exactly 0


def test_probabilities_clip_to_exact_zeros_and_ones() -> None:
    variant = clipped(zeta=1.2, gamma=-0.1)
    scores = torch.tensor([[8.0, 0.0, -1.0, float("-inf")]])
    p = variant.probabilities(scores)
    assert p[0, 0] == 1 and p[0, 2] == 0 and p[0, 3] == 0  # large -> 1, small -> 0, masked -> 0
    neutral = clipped(zeta=1.0, gamma=0.0)
    torch.testing.assert_close(neutral.probabilities(scores), torch.softmax(scores, -1), atol=0, rtol=0)


def test_a_single_chunk_is_not_recomputed_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recomputing the only chunk would save no memory and cost a second forward; several chunks still are."""
    from attnlab.attention import chunked

    calls: list[int] = []
    real = chunked.checkpoint
    monkeypatch.setattr(chunked, "checkpoint", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv(16, 16)
    clipped(chunk_size=16).attend(q, k, v, None, True, 0.0)
    assert calls == []
    clipped(chunk_size=8).attend(q, k, v, None, True, 0.0)
    assert len(calls) == 2


def test_softmax_runs_in_fp32_under_bf16_autocast() -> None:
    variant = clipped(chunk_size=5)
    q, k, v = (t.detach().bfloat16() for t in qkv(13, 13))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = variant.attend(q, k, v, None, True, 0.0)
    expected, _ = variant.reference_attention(q.double(), k.double(), v.double(), None, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=1e-2)


def test_dropout_applies_to_clipped_probabilities_in_training() -> None:
    variant = clipped(chunk_size=4)
    q, k, v = qkv(13, 13)
    torch.manual_seed(0)
    dropped = variant.attend(q, k, v, None, True, 0.5)
    torch.manual_seed(0)
    again = variant.attend(q, k, v, None, True, 0.5)
    torch.testing.assert_close(dropped, again)  # deterministic given the seed
    assert not torch.allclose(dropped, variant.attend(q, k, v, None, True, 0.0))


def test_causal_flag_with_cached_keys_aligns_queries_to_the_last_keys() -> None:
    """is_causal with t_q < t_k means the queries are the last t_q positions (as the reference path reads it)."""
    variant = clipped(chunk_size=2)
    q, k, v = qkv(5, 13)
    expected, _ = variant.reference_attention(q, k, v, None, True)
    torch.testing.assert_close(variant.attend(q, k, v, None, True, 0.0), expected, atol=1e-5, rtol=1e-5)
