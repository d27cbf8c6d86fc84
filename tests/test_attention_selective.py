"""Selective attention against a line-by-line port of the reference, its options and its KV-cache state."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionContext, AttentionShape, build_variant
from attnlab.errors import ConfigError
from tests.test_attention_variants import build, tiny_config, tokens

H, KV, DH = 4, 2, 8


def port_selective(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """andrew-healey/context-compression@af2c28a9cdbd53b2fd569bb3fa61a2646e63e3aa context_compression/attn.py,
    ``CausalSelectiveSelfAttention.forward`` (lines 449-745) with selection_head_linear_combo=NONE,
    protect_bos_token, prevent_from_masking_myself, protection_kind=NONE, attn_mult = 1/sqrt(d_h): the paper's
    listing (arXiv 2410.02703). Plain multi-head tensors (B, H, T, d_h)."""
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(torch.tril(torch.ones(T, T)).view(1, 1, T, T) == 0, float("-inf"))
    S = att[:, 0:1, :, :].clone()  # Select head 0 logits
    S = F.relu(S)  # Only positive selection
    S_masked = torch.zeros_like(S)
    S_masked[..., 1:] = S[..., 1:]  # Do not mask <BOS> token
    eye_mask = 1 - torch.eye(T)  # Do not let me hide myself from future tokens
    S = S_masked * eye_mask
    FF = torch.cumsum(S, dim=-2)
    FF_shifted = torch.roll(FF, 1, -2)
    FF_shifted[..., 0, :] = 0
    att = att - FF_shifted[:, :, :, :]
    att = F.softmax(att, dim=-1)
    return att @ v


def selective(kv: int = KV, **options) -> torch.nn.Module:
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=kv, head_dim=DH, block_size=32)
    return build_variant({"name": "selective", **options}, shape)


def qkv(t: int, kv: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple((2 * torch.randn(2, n, t, DH, generator=g)).requires_grad_() for n in (H, kv, kv))


# (batch, T, heads, head_dim, dtype, tolerance): the fp32 case, and float64 on shapes the other tests do not use
CASES = {"fp32": (2, 13, H, DH, torch.float32, 1e-5), "float64": (3, 37, 6, 12, torch.float64, 1e-12)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kv_heads", ["mha", "gqa", "gqa3"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_matches_the_reference_port(kv_heads: str, path: str, case: str) -> None:
    """Values and gradients on identical tensors (GQA: the port on the keys repeated per query head)."""
    batch, t, heads, dh, dtype, tolerance = CASES[case]
    kv = {"mha": heads, "gqa": 2, "gqa3": 3}[kv_heads]
    if heads % kv:
        pytest.skip(f"{heads} heads do not split into {kv} KV heads")
    shape = AttentionShape(n_embd=heads * dh, n_head=heads, n_kv_head=kv, head_dim=dh, block_size=64)
    variant = build_variant({"name": "selective"}, shape)
    g = torch.Generator().manual_seed(0)
    q, k, v = ((2 * torch.randn(batch, n, t, dh, generator=g, dtype=dtype)).requires_grad_() for n in (heads, kv, kv))
    ctx = AttentionContext(positions=torch.arange(t))
    _, k_with_selector, _ = variant.transform_qkv(torch.zeros(batch, t, heads * dh), q, k, v, ctx)
    mask, is_causal = ctx.mask(t, t, dtype)
    if path == "attend":
        out = variant.attend(q, k_with_selector, v, mask, is_causal, 0.0)
    else:
        out = variant.reference_attention(q, k_with_selector, v, mask, is_causal)[0]
    groups = heads // kv
    expected = port_selective(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=10 * tolerance, rtol=10 * tolerance)


def test_selection_changes_attention_and_spares_the_first_token() -> None:
    """Not vanilla, and F never touches column 0 (the first token stays visible)."""
    variant = selective(H)
    q, k, v = qkv(9, H)
    _, k_sel, _ = variant.transform_qkv(torch.zeros(2, 9, H * DH), q, k, v, AttentionContext(torch.arange(9)))
    hidden = variant.selection(k_sel, 9)
    assert hidden[..., 0].abs().max() == 0 and hidden.max() > 0
    _, probs = variant.reference_attention(q, k_sel, v, None, True)
    vanilla = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(DH) + torch.full((9, 9), -math.inf).triu(1), -1)
    assert (probs - vanilla).abs().max() > 1e-3


def test_selection_head_option() -> None:
    """Another head selects: the port applied to the heads rolled so that it comes first."""
    variant = selective(H, selection_head=2)
    q, k, v = qkv(11, H)
    _, k_sel, _ = variant.transform_qkv(torch.zeros(2, 11, H * DH), q, k, v, AttentionContext(torch.arange(11)))
    out = variant.attend(q, k_sel, v, None, True, 0.0)
    order = [2, 0, 1, 3]
    expected = port_selective(q[:, order], k[:, order], v[:, order])[:, [1, 2, 0, 3]]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", [-1, 4])
def test_bad_selection_head_names_the_key(head: int) -> None:
    with pytest.raises(ConfigError, match=r"attention\.selection_head: must be a head index in \[0, 4\)"):
        selective(selection_head=head)


def test_has_no_parameters() -> None:
    """Parameter-free (Leviathan et al.): no overhead; no neutral setting either."""
    model = build({"name": "selective"}, tiny_config(), perturb=False)
    assert model.variant_parameters() == []


def test_kv_cache_one_token_at_a_time_matches_full_forward() -> None:
    """F of a decoded token sums S over every earlier query: the cache keeps the selector queries for it."""
    model = build({"name": "selective"}, tiny_config("learned", None))
    idx = tokens(20)
    full = model(idx)
    cache = model.new_cache()
    steps = [model(idx[:, t : t + 1], t, cache) for t in range(20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)
