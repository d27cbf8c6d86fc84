"""Differential attention against a line-by-line port of the reference as it stands (microsoft/unilm
Diff-Transformer at b3783e7d6c080cd682345aa80f3b2322e447da38, 2025-03-03, unchanged at head 768a3c8), its first
release's non-affine norm as the option it is, its lambda_init by layer and refusals."""

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
    """microsoft/unilm@b3783e7d6c080cd682345aa80f3b2322e447da38 Diff-Transformer/multihead_diffattn.py ``repeat_kv``."""
    bs, n_kv_heads, slen, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, None, :, :]
        .expand(bs, n_kv_heads, n_rep, slen, head_dim)
        .reshape(bs, n_kv_heads * n_rep, slen, head_dim)
    )


class RMSNorm(torch.nn.Module):
    """Same commit, Diff-Transformer/rms_norm.py ``RMSNorm`` (the fallback when apex is absent), line by line but for
    ``wide`` (see ``multihead_diff_attn``)."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine=True, memory_efficient=False):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if self.elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.to(wide(x))).type_as(x)
        if self.weight is not None:
            output = output * self.weight
        return output


def wide(x: torch.Tensor) -> torch.dtype:
    """The reference's casts to fp32 (``.float()``, ``dtype=torch.float32``), written for fp32 and half inputs, kept
    wider for float64 ones: the same dtype below float64, and a float64 check that is not rounded to fp32."""
    return torch.promote_types(x.dtype, torch.float32)


def multihead_diff_attn(
    q, k, v, lambdas, depth: int, num_heads: int, num_kv_heads: int, subln_weight: torch.Tensor | None
) -> torch.Tensor:
    """``MultiheadDiffAttn.forward`` of the same file from the projections to before ``out_proj``, line by line
    (rotary dropped: here it is the model's, applied before the variant). q (B, T, d), k and v (B, T, d / n_rep);
    ``num_heads`` is the number of differential heads (half the layer's). ``subln_weight``: the affine ``subln``'s
    weight (``elementwise_affine=True``, since d088deb); None: 637157e's ``elementwise_affine=False``. Casts to
    fp32 are to ``wide``."""
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
        torch.zeros([tgt_len, src_len]).to(wide(q)).fill_(float("-inf")).type_as(attn_weights), 1 + offset
    )
    attn_weights = torch.nan_to_num(attn_weights)
    attn_weights += attn_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=wide(q)).type_as(attn_weights)
    lambda_1 = torch.exp(torch.sum(lambda_q1 * lambda_k1, dim=-1).to(wide(q))).type_as(q)
    lambda_2 = torch.exp(torch.sum(lambda_q2 * lambda_k2, dim=-1).to(wide(q))).type_as(q)
    lambda_full = lambda_1 - lambda_2 + lambda_init
    attn_weights = attn_weights.view(bsz, num_heads, 2, tgt_len, src_len)
    attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
    attn = torch.matmul(attn_weights, v)
    subln = RMSNorm(2 * head_dim, eps=1e-5, elementwise_affine=subln_weight is not None)
    if subln_weight is not None:
        subln.weight = subln_weight  # the variant's (moved off its init of ones), so its gradient is compared
    attn = subln(attn)
    attn = attn * (1 - lambda_init)
    return attn.transpose(1, 2).reshape(bsz, tgt_len, num_heads * 2 * head_dim)


def diff(kv: int = 2, layer: int = 3, heads: int = H, head_dim: int = DH, **options) -> torch.nn.Module:
    shape = AttentionShape(
        n_embd=heads * head_dim, n_head=heads, n_kv_head=kv, head_dim=head_dim, block_size=64, layer=layer
    )
    return build_variant({"name": "diff", **options}, shape)


def compare_with_the_reference(
    variant: torch.nn.Module, path: str, batch: int, t: int, dtype: torch.dtype, tolerance: float
) -> None:
    """Values and gradients (q, k, v, the four lambda vectors and the norm's weight) on identical projections."""
    heads, kv, dh = variant.shape.n_head, variant.shape.n_kv_head, variant.shape.head_dim
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if variant.subln_weight is not None:
            variant.subln_weight.copy_(1 + 0.5 * torch.randn(2 * dh, generator=g))  # off its init of ones
    q_flat, k_flat, v_flat = (
        torch.randn(batch, t, n * dh, generator=g, dtype=dtype).requires_grad_() for n in (heads, kv, kv)
    )
    q, k, v = (x.view(batch, t, -1, dh).transpose(1, 2) for x in (q_flat, k_flat, v_flat))
    ctx = AttentionContext(positions=torch.arange(t))
    if path == "attend":
        o = variant.attend(q, k, v, None, True, 0.0)
    else:
        o = variant.reference_attention(q, k, v, None, True)[0]
    out = variant.transform_heads(torch.zeros(batch, t, heads * dh), o, ctx).transpose(1, 2).flatten(2)
    lambdas = (variant.lambda_q1, variant.lambda_k1, variant.lambda_q2, variant.lambda_k2)
    expected = multihead_diff_attn(
        q_flat, k_flat, v_flat, lambdas, variant.shape.layer, heads // 2, kv // 2, variant.subln_weight
    )
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    inputs = (q_flat, k_flat, v_flat, *lambdas) + (() if variant.subln_weight is None else (variant.subln_weight,))
    grads = torch.autograd.grad(out.square().sum(), inputs)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=10 * tolerance, rtol=10 * tolerance)


@pytest.mark.parametrize("subln_affine", [True, False], ids=["affine", "637157e"])
@pytest.mark.parametrize("kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_matches_the_reference(kv: int, path: str, subln_affine: bool) -> None:
    """fp32, the reference's own norm (affine as it stands, or the first release's plain one)."""
    compare_with_the_reference(diff(kv, subln_affine=subln_affine), path, 2, 11, torch.float32, 1e-5)


@pytest.mark.parametrize("kv", [6, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_matches_the_reference_in_float64(kv: int, path: str) -> None:
    """float64 on other shapes (B=3, T=37, 6 heads of 12): nothing in our path rounds to fp32."""
    compare_with_the_reference(diff(kv, layer=5, heads=6, head_dim=12).double(), path, 3, 37, torch.float64, 1e-12)


def test_the_norm_weight_changes_the_output() -> None:
    """The affine weight is not a no-op (the two forms agree only while it is 1)."""
    affine, plain = diff(subln_affine=True), diff(subln_affine=False)
    plain.load_state_dict(affine.state_dict(), strict=False)
    o = torch.randn(2, H, 7, DH)
    ctx = AttentionContext(positions=torch.arange(7))
    torch.testing.assert_close(affine.transform_heads(None, o, ctx), plain.transform_heads(None, o, ctx))
    with torch.no_grad():
        affine.subln_weight.fill_(1.5)
    torch.testing.assert_close(affine.transform_heads(None, o, ctx), 1.5 * plain.transform_heads(None, o, ctx))


def test_lambda_init_follows_the_layer_index() -> None:
    """lambda_init = 0.8 - 0.6 exp(-0.3 l), l the 0-based block index, as the model passes it."""
    model = build({"name": "diff"}, tiny_config("rotary", 2), perturb=False)
    for layer, block in enumerate(model.blocks):
        assert block.attn.variant.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
    assert model.blocks[0].attn.variant.lambda_init == pytest.approx(0.2)


@pytest.mark.parametrize("subln_affine", [True, False])
def test_init_is_the_references(subln_affine: bool) -> None:
    """Four lambda vectors of d_h, N(0, 0.1), and the norm's weight of 2 d_h at 1 (none with subln_affine=false)."""
    attention = {"name": "diff", "subln_affine": subln_affine}
    params = dict(build(attention, tiny_config("rotary", 2), perturb=False).blocks[0].attn.variant.named_parameters())
    lambdas = ["lambda_k1", "lambda_k2", "lambda_q1", "lambda_q2"]
    assert sorted(params) == lambdas + (["subln_weight"] if subln_affine else [])
    stacked = torch.cat([params[name] for name in lambdas])
    assert stacked.shape == (4 * 8,) and 0.05 < stacked.std().item() < 0.2
    if subln_affine:
        assert torch.equal(params["subln_weight"], torch.ones(16))


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
