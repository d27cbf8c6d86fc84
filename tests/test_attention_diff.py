"""Differential attention against a line-by-line port of the reference, its lambda_init by layer and refusals."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionContext, AttentionShape, build_variant
from attnlab.errors import ConfigError
from tests.test_attention_variants import build, tiny_config, tokens

H, DH = 4, 8


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """microsoft/unilm@637157e8e9a2199c2b65d8c08558739f5d6a4df8 Diff-Transformer/multihead_diffattn.py ``repeat_kv``."""
    bs, n_kv_heads, slen, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, None, :, :]
        .expand(bs, n_kv_heads, n_rep, slen, head_dim)
        .reshape(bs, n_kv_heads * n_rep, slen, head_dim)
    )


def rms_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Same repository, Diff-Transformer/diff/rms_norm.py ``RMSNorm`` with ``elementwise_affine=False``."""
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def multihead_diff_attn(q, k, v, lambdas, depth: int, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """``MultiheadDiffAttn.forward`` of the same file from the projections to before ``out_proj``, line by line
    (rotary dropped: here it is the model's, applied before the variant). q (B, T, d), k and v (B, T, d / n_rep);
    ``num_heads`` is the number of differential heads (half the layer's)."""
    bsz, tgt_len, embed_dim = q.size()
    src_len = tgt_len
    head_dim = embed_dim // num_heads // 2
    scaling = head_dim**-0.5
    n_rep = num_heads // num_kv_heads
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lambda_q1, lambda_k1, lambda_q2, lambda_k2 = lambdas
    q = q.view(bsz, tgt_len, 2 * num_heads, head_dim)
    k = k.view(bsz, src_len, 2 * num_kv_heads, head_dim)
    v = v.view(bsz, src_len, num_kv_heads, 2 * head_dim)
    offset = src_len - tgt_len
    q = q.transpose(1, 2)
    k = repeat_kv(k.transpose(1, 2), n_rep)
    v = repeat_kv(v.transpose(1, 2), n_rep)
    q = q * scaling  # (the reference scales in place)
    attn_weights = torch.matmul(q, k.transpose(-1, -2))
    attn_mask = torch.triu(
        torch.zeros([tgt_len, src_len]).float().fill_(float("-inf")).type_as(attn_weights), 1 + offset
    )
    attn_weights = torch.nan_to_num(attn_weights)
    attn_weights += attn_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).type_as(attn_weights)
    lambda_1 = torch.exp(torch.sum(lambda_q1 * lambda_k1, dim=-1).float()).type_as(q)
    lambda_2 = torch.exp(torch.sum(lambda_q2 * lambda_k2, dim=-1).float()).type_as(q)
    lambda_full = lambda_1 - lambda_2 + lambda_init
    attn_weights = attn_weights.view(bsz, num_heads, 2, tgt_len, src_len)
    attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
    attn = torch.matmul(attn_weights, v)
    attn = rms_norm(attn)
    attn = attn * (1 - lambda_init)
    return attn.transpose(1, 2).reshape(bsz, tgt_len, num_heads * 2 * head_dim)


def diff(kv: int = 2, layer: int = 3, heads: int = H) -> torch.nn.Module:
    shape = AttentionShape(n_embd=heads * DH, n_head=heads, n_kv_head=kv, head_dim=DH, block_size=32, layer=layer)
    return build_variant({"name": "diff"}, shape)


@pytest.mark.parametrize("kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_matches_the_reference(kv: int, path: str) -> None:
    """fp32 values and gradients (q, k, v and the four lambda vectors) on identical projections."""
    variant = diff(kv)
    g = torch.Generator().manual_seed(0)
    q_flat, k_flat, v_flat = (torch.randn(2, 11, n * DH, generator=g).requires_grad_() for n in (H, kv, kv))
    q, k, v = (t.view(2, 11, -1, DH).transpose(1, 2) for t in (q_flat, k_flat, v_flat))
    ctx = AttentionContext(positions=torch.arange(11))
    if path == "attend":
        o = variant.attend(q, k, v, None, True, 0.0)
    else:
        o = variant.reference_attention(q, k, v, None, True)[0]
    out = variant.transform_heads(torch.zeros(2, 11, H * DH), o, ctx).transpose(1, 2).reshape(2, 11, H * DH)
    lambdas = (variant.lambda_q1, variant.lambda_k1, variant.lambda_q2, variant.lambda_k2)
    expected = multihead_diff_attn(q_flat, k_flat, v_flat, lambdas, depth=3, num_heads=H // 2, num_kv_heads=kv // 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    inputs = (q_flat, k_flat, v_flat, *lambdas)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)


def test_lambda_init_follows_the_layer_index() -> None:
    """lambda_init = 0.8 - 0.6 exp(-0.3 l), l the 0-based block index, as the model passes it."""
    model = build({"name": "diff"}, tiny_config("rotary", 2), perturb=False)
    for layer, block in enumerate(model.blocks):
        assert block.attn.variant.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
    assert model.blocks[0].attn.variant.lambda_init == pytest.approx(0.2)


def test_init_is_the_references() -> None:
    """Four lambda vectors of d_h, N(0, 0.1): 4 d_h parameters a layer, nothing else."""
    model = build({"name": "diff"}, tiny_config("rotary", 2), perturb=False)
    params = dict(model.blocks[0].attn.variant.named_parameters())
    assert sorted(params) == ["lambda_k1", "lambda_k2", "lambda_q1", "lambda_q2"]
    stacked = torch.cat(list(params.values()))
    assert stacked.shape == (4 * 8,) and 0.05 < stacked.std().item() < 0.2


@pytest.mark.parametrize(("heads", "kv", "key"), [(3, 3, "model.n_head"), (4, 1, "model.n_kv_head")])
def test_refuses_odd_heads(heads: int, kv: int, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: attention=diff pairs heads: must be even, got"):
        diff(kv, heads=heads)


def test_kv_cache_and_causality_with_gqa_and_rotary() -> None:
    model = build({"name": "diff"}, tiny_config("rotary", 2))
    idx = tokens(14)
    full = model(idx)
    cache = model.new_cache()
    steps = [model(idx[:, :6], 0, cache)] + [model(idx[:, t : t + 1], t, cache) for t in range(6, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)
