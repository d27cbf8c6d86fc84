"""Forgetting attention against a port of the reference's plain-torch path, its neutral setting and refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionContext, AttentionShape, build_variant
from attnlab.errors import ConfigError
from attnlab.models.gpt import alibi_slopes
from tests.test_attention_variants import build, tiny_config, tokens, variant_copy

H, KV, DH = 4, 2, 8


def reference_forgetting_attention(q, k, v, log_fgate, sm_scale):
    """zhixuan-lin/forgetting-transformer@883f260c636e87971339749b0d8310004794a5cc
    src/forgetting_transformer/ops/forgetting_attention.py, ``test_op``'s "reference implementation" (lines 1381-1397;
    causal, no seq_start, ``device="cuda"`` and the fp16 cast dropped). q (B, H, M, D), k/v (B, H, N, D), log_fgate
    (B, H, N); the queries are the last M of the N positions."""
    M, N = q.shape[2], k.shape[2]
    P_SEQ = N - M
    mask = torch.tril(torch.ones((M, N)), diagonal=P_SEQ)
    p = torch.matmul(q, k.transpose(2, 3)) * sm_scale
    p = p.float()
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]
    p = p + decay_bias
    p[:, :, mask == 0] = float("-inf")
    p = torch.softmax(p.float(), dim=-1)
    p = p.clone()
    p[torch.isnan(p)] = 0.0
    return torch.matmul(p, v)


def fox(pos: str = "learned", kv: int = KV) -> torch.nn.Module:
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=kv, head_dim=DH, block_size=32, pos_encoding=pos)
    variant = build_variant({"name": "fox"}, shape)
    with torch.no_grad():
        variant.gate.bias.normal_(2.0, 1.0)  # gates well below 1, so the decay is visible
        variant.gate.weight.normal_(0.0, 0.3)
    return variant


@pytest.mark.parametrize("kv", [H, KV], ids=["mha", "gqa"])
@pytest.mark.parametrize(("path", "t_q"), [("attend", 13), ("reference_attention", 13), ("attend", 4)])
def test_matches_the_reference(kv: int, path: str, t_q: int) -> None:
    """fp32 values and gradients (q, k, v and the gate) on identical tensors, also for queries after a KV cache."""
    variant = fox(kv=kv)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 13, H * DH, generator=g)
    q, k, v = (torch.randn(2, n, 13, DH, generator=g).requires_grad_() for n in (H, kv, kv))
    ctx = AttentionContext(positions=torch.arange(13))
    _, k_gated, _ = variant.transform_qkv(x, q, k, v, ctx)
    q_new = q[:, :, -t_q:]
    mask, is_causal = ctx.mask(t_q, 13, torch.float32)
    if path == "attend":
        out = variant.attend(q_new, k_gated, v, mask, is_causal, 0.0)
    else:
        out = variant.reference_attention(q_new, k_gated, v, mask, is_causal)[0]
    log_fgate = F.logsigmoid(variant.gate(x).float()).transpose(1, 2)  # (B, H, T)
    groups = H // kv
    expected = reference_forgetting_attention(
        q_new, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), log_fgate, DH**-0.5
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    inputs = (q, k, v, variant.gate.weight, variant.gate.bias)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)


def test_alibi_adds_to_the_decay() -> None:
    """With ALiBi the mask's bias and the decay add: the reference with the ALiBi bias added to its logits."""
    variant = fox("alibi", kv=H)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 9, H * DH, generator=g)
    q, k, v = (torch.randn(1, H, 9, DH, generator=g) for _ in range(3))
    ctx = AttentionContext(positions=torch.arange(9), alibi_slopes=alibi_slopes(H))
    _, k_gated, _ = variant.transform_qkv(x, q, k, v, ctx)
    mask, is_causal = ctx.mask(9, 9, torch.float32)
    out = variant.attend(q, k_gated, v, mask, is_causal, 0.0)
    log_f = F.logsigmoid(variant.gate(x)).transpose(1, 2)
    c = log_f.cumsum(-1)
    logits = q @ k.transpose(-2, -1) / DH**0.5 + c[..., :, None] - c[..., None, :] + mask
    torch.testing.assert_close(out, torch.softmax(logits, -1) @ v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["learned", "alibi", "sinusoidal", "none"])
def test_forget_gate_one_is_vanilla(pos: str) -> None:
    """The neutral setting f = 1 (w = 0, b = +inf, so log f = 0 exactly) gives vanilla attention."""
    vanilla = build({"name": "vanilla"}, tiny_config(pos, 2))
    model = variant_copy(vanilla, {"name": "fox"})
    with torch.no_grad():
        for block in model.blocks:
            block.attn.variant.gate.weight.zero_()
            block.attn.variant.gate.bias.fill_(float("inf"))
    idx = tokens(20)
    torch.testing.assert_close(model(idx), vanilla(idx), atol=1e-6, rtol=0)


def test_refuses_rotary() -> None:
    with pytest.raises(ConfigError, match=r"^model\.pos_encoding: attention=fox replaces rotary positions"):
        fox("rotary")


@pytest.mark.parametrize("pos", ["learned", "none"])
def test_gradients_reach_the_forget_gate(pos: str) -> None:
    model = build({"name": "fox"}, tiny_config(pos, 2)).train()
    idx = tokens(17)
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    names = [name for name, _ in model.variant_parameters()]
    assert len(names) == 4  # weight and bias of the gate in each of the two layers
    for name, p in model.variant_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_init_is_the_references() -> None:
    """fgate_type="full": Linear(d, H) with bias, weights N(0, 0.02), bias 0 (f starts near 0.5)."""
    gate = build({"name": "fox"}, tiny_config("learned"), perturb=False).blocks[0].attn.variant.gate
    assert gate.weight.shape == (4, 32) and gate.bias.abs().max() == 0
    assert abs(gate.weight.std().item() - 0.02) < 0.006
