"""Stick-breaking attention against a port of the reference (both ``attend_current`` settings, fp32 and float64), with
no position encoding (the only one it takes)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionShape, build_variant
from attnlab.errors import ConfigError
from tests.test_attention_variants import build, tiny_config, tokens

H, KV, DH = 4, 2, 8


def wide(x: torch.Tensor) -> torch.dtype:
    """The reference's cast to fp32 (``.float()``), written for fp32 and half inputs, kept wider for float64 ones:
    the same dtype below float64, and a float64 check that is not rounded to fp32."""
    return torch.promote_types(x.dtype, torch.float32)


def stickbreaking(q, k, v, mask, cum_weight):
    """shawntan/stickbreaking-attention@3147a3841b025a31d271fc8f873120ff6fa0461b (2025-03-14)
    stickbreaking_attention/sb_ref.py, line by line (``.float()`` is ``wide``)."""
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    original_dtype = logits.dtype
    logits = logits.to(wide(logits))
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5).to(original_dtype)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0).to(original_dtype)
    re_cum_log_beta = torch.einsum("bhij,jk->bhik", log_beta, cum_weight.to(log_beta))
    log_att = log_z + re_cum_log_beta
    att = log_att.exp()
    return att @ v, 1 - att.sum(dim=-1)


def ref_fwd(q, k, v, length, attend_current=False):
    """Same commit, tests/test_attn.py ``ref_fwd`` (``.cuda()`` dropped)."""
    cm = torch.ones(length, length).tril(-1).to(q)
    mask = torch.ones(length, length).triu(1 if attend_current else 0).bool()  # the source's if/else on one line
    o, rem = stickbreaking(q, k, v, mask, cm)
    o = o + rem[..., None] * v
    return o


def variant(pos: str = "none", kv: int = KV, heads: int = H, head_dim: int = DH, **options) -> torch.nn.Module:
    shape = AttentionShape(
        n_embd=heads * head_dim, n_head=heads, n_kv_head=kv, head_dim=head_dim, block_size=64, pos_encoding=pos
    )
    return build_variant({"name": "stickbreaking", **options}, shape)


# (batch, T, heads, head_dim, dtype, tolerance): the fp32 case, and float64 on shapes the other tests do not use
CASES = {"fp32": (2, 15, H, DH, torch.float32, 1e-5), "float64": (3, 37, 6, 12, torch.float64, 1e-12)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("kv_heads", ["mha", "gqa", "gqa3"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_matches_the_reference(kv_heads: str, path: str, attend_current: bool, case: str) -> None:
    """Values and gradients on identical tensors (the reference on keys repeated per query head)."""
    batch, t, heads, dh, dtype, tolerance = CASES[case]
    kv = {"mha": heads, "gqa": 2, "gqa3": 3}[kv_heads]
    if heads % kv:
        pytest.skip(f"{heads} heads do not split into {kv} KV heads")
    sb = variant(kv=kv, heads=heads, head_dim=dh, attend_current=attend_current)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, n, t, dh, generator=g, dtype=dtype).requires_grad_() for n in (heads, kv, kv))
    out = sb.attend(q, k, v, None, True, 0.0) if path == "attend" else sb.reference_attention(q, k, v, None, True)[0]
    groups = heads // kv
    expected = ref_fwd(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), t, attend_current)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=10 * tolerance, rtol=10 * tolerance)


def test_attend_current_breaks_the_stick_at_the_own_key_first() -> None:
    """attend_current: A_ij = beta_ij prod_{j<k<=i} (1 - beta_ik) for j <= i, the leftover still on the diagonal."""
    scores = torch.randn(1, 1, 6, 6)
    probs = variant(attend_current=True).probabilities(scores)
    beta = torch.sigmoid(scores[0, 0])
    for i in range(6):
        for j in range(i + 1):
            expected = beta[i, j] * torch.prod(1 - beta[i, j + 1 : i + 1])
            leftover = torch.prod(1 - beta[i, : i + 1]) if i == j else 0
            torch.testing.assert_close(probs[0, 0, i, j], expected + leftover)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 1, 6))


def test_probabilities_are_the_stick_breaking_formula() -> None:
    """A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) for j < i, the leftover on the diagonal; rows sum to one."""
    scores = torch.randn(1, 1, 6, 6)
    probs = variant().probabilities(scores)
    beta = torch.sigmoid(scores[0, 0])
    for i in range(6):
        for j in range(i):
            expected = beta[i, j] * torch.prod(1 - beta[i, j + 1 : i])
            torch.testing.assert_close(probs[0, 0, i, j], expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 1, 6))
    assert probs[0, 0, 0, 0] == 1 and probs.triu(1).abs().max() == 0


@pytest.mark.parametrize("pos", ["learned", "rotary", "alibi", "sinusoidal"])
def test_refuses_position_encodings(pos: str) -> None:
    with pytest.raises(ConfigError, match=f"^model.pos_encoding: .*set none, got {pos}$"):
        variant(pos)


@pytest.mark.parametrize("kv", [None, 2], ids=["mha", "gqa"])
def test_causal_and_kv_cache_decoding(kv: int | None) -> None:
    """The generic invariants at pos_encoding=none: causality, fused vs reference, KV cache equals the full forward."""
    model = build({"name": "stickbreaking"}, tiny_config("none", kv))
    idx = tokens(16)
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 61
    before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :8], before[:, :8], atol=1e-6, rtol=0)
    assert (after[:, 8:] - before[:, 8:]).abs().max() > 1e-4
    cache = model.new_cache()
    steps = [model(idx[:, :5], 0, cache), model(idx[:, 5:9], 5, cache)]
    steps += [model(idx[:, t : t + 1], t, cache) for t in range(9, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), before, atol=2e-5, rtol=1e-5)
    for block in model.blocks:
        block.attn.record_probabilities = True
    torch.testing.assert_close(model(idx), before, atol=2e-5, rtol=1e-5)


def test_has_no_parameters() -> None:
    """Parameter-free: no overhead, and no neutral setting (it is not softmax attention at any setting)."""
    assert build({"name": "stickbreaking"}, tiny_config("none"), perturb=False).variant_parameters() == []
