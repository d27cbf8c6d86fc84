"""Forgetting attention against a port of the reference's plain-torch path (and the Pro block against a port of
``ForgettingAttentionLayer``), in fp32 and in float64, its neutral setting and refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention, build_variant
from attnlab.errors import ConfigError
from attnlab.models.gpt import alibi_slopes
from tests.test_attention_variants import build, tiny_config, tokens, variant_copy

H, KV, DH = 4, 2, 8
REFERENCE = "zhixuan-lin/forgetting-transformer@883f260c636e87971339749b0d8310004794a5cc"  # 2026-02-25


def wide(x: torch.Tensor) -> torch.dtype:
    """The reference's casts to fp32 (``.float()``), written for fp32 and half inputs, kept wider for float64 ones:
    the same dtype below float64, and a float64 check that is not rounded to fp32."""
    return torch.promote_types(x.dtype, torch.float32)


def reference_forgetting_attention(q, k, v, log_fgate, sm_scale):
    """REFERENCE src/forgetting_transformer/ops/forgetting_attention.py, ``test_op``'s "reference implementation"
    (lines 1381-1397; causal, no seq_start, ``device="cuda"`` and the fp16 cast dropped; ``.float()`` is ``wide``).
    q (B, H, M, D), k/v (B, H, N, D), log_fgate (B, H, N); the queries are the last M of the N positions."""
    M, N = q.shape[2], k.shape[2]
    P_SEQ = N - M
    mask = torch.tril(torch.ones((M, N)), diagonal=P_SEQ)
    p = torch.matmul(q, k.transpose(2, 3)) * sm_scale
    p = p.to(wide(p))
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]
    p = p + decay_bias
    p[:, :, mask == 0] = float("-inf")
    p = torch.softmax(p.to(wide(p)), dim=-1)
    p = p.clone()
    p[torch.isnan(p)] = 0.0
    return torch.matmul(p, v)


def fox(pos: str = "learned", kv: int = KV, heads: int = H, head_dim: int = DH) -> torch.nn.Module:
    shape = AttentionShape(
        n_embd=heads * head_dim, n_head=heads, n_kv_head=kv, head_dim=head_dim, block_size=64, pos_encoding=pos
    )
    variant = build_variant({"name": "fox"}, shape)
    with torch.no_grad():
        variant.gate.bias.normal_(2.0, 1.0)  # gates well below 1, so the decay is visible
        variant.gate.weight.normal_(0.0, 0.3)
    return variant


# (batch, T, heads, head_dim, dtype, tolerance): the fp32 case, and float64 on shapes the other tests do not use
CASES = {"fp32": (2, 13, H, DH, torch.float32, 1e-5), "float64": (3, 37, 6, 12, torch.float64, 1e-12)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kv_heads", ["mha", "gqa", "gqa3"])
@pytest.mark.parametrize(("path", "queries"), [("attend", "all"), ("reference_attention", "all"), ("attend", "last")])
def test_matches_the_reference(kv_heads: str, path: str, queries: str, case: str) -> None:
    """Values and gradients (q, k, v and the gate) on identical tensors, also for queries after a KV cache."""
    batch, t, heads, dh, dtype, tolerance = CASES[case]
    kv = {"mha": heads, "gqa": 2, "gqa3": 3}[kv_heads]
    if heads % kv:
        pytest.skip(f"{heads} heads do not split into {kv} KV heads")
    variant = fox(kv=kv, heads=heads, head_dim=dh).to(dtype)
    t_q = t if queries == "all" else 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, t, heads * dh, generator=g, dtype=dtype)
    q, k, v = (torch.randn(batch, n, t, dh, generator=g, dtype=dtype).requires_grad_() for n in (heads, kv, kv))
    ctx = AttentionContext(positions=torch.arange(t))
    _, k_gated, _ = variant.transform_qkv(x, q, k, v, ctx)
    q_new = q[:, :, -t_q:]
    mask, is_causal = ctx.mask(t_q, t, dtype)
    if path == "attend":
        out = variant.attend(q_new, k_gated, v, mask, is_causal, 0.0)
    else:
        out = variant.reference_attention(q_new, k_gated, v, mask, is_causal)[0]
    log_fgate = F.logsigmoid(variant.gate(x).to(wide(x))).transpose(1, 2)  # (B, H, T)
    groups = heads // kv
    expected = reference_forgetting_attention(
        q_new, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), log_fgate, dh**-0.5
    )
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    inputs = (q, k, v, variant.gate.weight, variant.gate.bias)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=10 * tolerance, rtol=10 * tolerance)


def token_shift_reference(x, prev_weight, curr_weight):
    """REFERENCE src/forgetting_transformer/model/forgetting_transformer/token_shift.py, ``test_op``'s reference
    (the Triton ``token_shift``'s math) from ``x_prev`` on. x (B, T, H, D), weights (B, T, H)."""
    dtype = x.dtype
    x_prev = torch.roll(x, shifts=1, dims=1)
    x_prev[:, 0, :, :] = 0.0
    return (x_prev * prev_weight[..., None] + x * curr_weight[..., None]).to(dtype)


def shift_linear(x, weight, shift_weight, num_heads):
    """REFERENCE model/forgetting_transformer/modeling_forgetting_transformer.py ``ShiftLinear.forward`` (T > 1, no
    attention_mask), with the module's two ``nn.Linear`` as ``F.linear`` on the given weights."""
    out = F.linear(x, weight)
    alpha = torch.sigmoid(F.linear(x, shift_weight).to(wide(x))).to(wide(x))
    out_per_head = out.unflatten(-1, (num_heads, -1))  # rearrange(out, 'b t (h d) -> b t h d', h=num_heads)
    result_per_head = token_shift_reference(out_per_head, alpha, 1.0 - alpha)
    result_per_head = result_per_head.to(out.dtype)
    return result_per_head.flatten(-2)  # rearrange(result_per_head, 'b t h d -> b t (h d)', h=num_heads)


def group_norm_ref(x, weight, bias, num_groups, eps=1e-5, is_rms_norm=False):
    """REFERENCE model/forgetting_transformer/layernorm.py ``group_norm_ref`` (no residual, prenorm or upcast; here
    and below einops' ``rearrange`` is written as the torch call it amounts to, its pattern beside it)."""
    dtype = x.dtype
    x, weight = [data.unflatten(-1, (num_groups, -1)) for data in (x, weight)]  # rearrange "... (g d) -> ... g d"
    if bias is not None:
        bias = bias.unflatten(-1, (num_groups, -1))
    if not is_rms_norm:
        mean = x.mean(dim=-1, keepdim=True)
        x = x - mean
    rstd = 1 / torch.sqrt((x.square()).mean(dim=-1, keepdim=True) + eps)
    out = (x * rstd * weight) + bias if bias is not None else (x * rstd * weight)
    out = out.flatten(-2)  # rearrange "... g d -> ... (g d)"
    return out.to(dtype)


def group_norm_gated_ref(x, g, weight, bias, num_groups, eps=1e-5, is_rms_norm=False):
    """REFERENCE model/forgetting_transformer/fuse_norm_gate.py ``group_norm_gated_ref`` (no residual, prenorm or
    upcast): ``group_norm_ref``'s normalisation, then ``out * sigmoid(g)``."""
    dtype = x.dtype
    x, weight = [data.unflatten(-1, (num_groups, -1)) for data in (x, weight)]  # rearrange "... (g d) -> ... g d"
    if not is_rms_norm:
        mean = x.mean(dim=-1, keepdim=True)
        x = x - mean
    rstd = 1 / torch.sqrt((x.square()).mean(dim=-1, keepdim=True) + eps)
    out = (x * rstd * weight) + bias if bias is not None else (x * rstd * weight)
    out = out.flatten(-2)  # rearrange "... g d -> ... (g d)"
    out = out * F.sigmoid(g)
    return out.to(dtype)


def forgetting_attention_layer(layer: CausalSelfAttention, hidden_states: torch.Tensor) -> torch.Tensor:
    """REFERENCE ``ForgettingAttentionLayer.forward`` (no cache, no attention_mask, no rope, fgate_type="full",
    ogate_act="sigmoid", qk_norm_share_param_across_head=False, norm_eps=1e-6) on our layer's weights; the fused
    ``forgetting_attention`` is ``test_op``'s reference above."""
    variant, num_heads = layer.variant, layer.shape.n_head
    head_dim = layer.shape.head_dim
    q_weight, k_weight, v_weight = layer.qkv.weight.split(layer.shape.qkv_sizes)
    batch_size, q_len, _ = hidden_states.size()
    q = F.linear(hidden_states, q_weight)
    if variant.key_shift is not None:
        k = shift_linear(hidden_states, k_weight, variant.key_shift.weight, num_heads)
    else:
        k = F.linear(hidden_states, k_weight)
    if variant.value_shift is not None:
        v = shift_linear(hidden_states, v_weight, variant.value_shift.weight, num_heads)
    else:
        v = F.linear(hidden_states, v_weight)
    if variant.q_norm is not None:
        q = group_norm_ref(q, variant.q_norm.flatten(), None, num_heads, is_rms_norm=True).to(q.dtype)
        k = group_norm_ref(k, variant.k_norm.flatten(), None, num_heads, is_rms_norm=True).to(k.dtype)
    q = q.unflatten(-1, (num_heads, -1))  # rearrange "... (h d) -> ... h d"
    k = k.unflatten(-1, (num_heads, -1))
    v = v.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # rearrange "b t (h d) -> b h t d"
    fgate_logit = F.linear(hidden_states, variant.gate.weight, variant.gate.bias)
    fgate_logit = fgate_logit.transpose(1, 2)  # rearrange "b t h -> b h t"
    log_fgate = torch.nn.functional.logsigmoid(fgate_logit.to(wide(fgate_logit)))
    k = k.transpose(1, 2)  # rearrange "b t h d -> b h t d"
    q = q.transpose(1, 2)
    o = reference_forgetting_attention(q, k, v, log_fgate, 1 / math.sqrt(head_dim))
    o = o.transpose(1, 2)  # rearrange "b h t d -> b t h d"
    o = o.reshape(batch_size, q_len, num_heads * head_dim)
    if variant.output_norm is not None:
        weight = variant.output_norm.flatten()
        if variant.output_gate is not None:
            g = F.linear(hidden_states, variant.output_gate.weight)
            o = group_norm_gated_ref(o, g, weight, None, num_heads, eps=1e-6, is_rms_norm=True)
        else:
            o = group_norm_ref(o, weight, None, num_heads, eps=1e-6, is_rms_norm=True)
        return layer.proj(o)
    if variant.output_gate is not None:  # glu_linear: o_proj(o * sigmoid(ogate_logit))
        return layer.proj(o * torch.sigmoid(F.linear(hidden_states, variant.output_gate.weight)))
    return layer.proj(o)


PRO_PIECES = {
    "pro": {"name": "fox_pro"},
    "key_shift": {"name": "fox", "key_shift": True},
    "value_shift": {"name": "fox", "value_shift": True},
    "qk_norm": {"name": "fox", "qk_norm": True},
    "output_norm": {"name": "fox", "output_norm": True},
    "output_gate": {"name": "fox", "output_gate": True},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("pieces", list(PRO_PIECES))
def test_pro_block_matches_the_reference_layer(pieces: str, case: str) -> None:
    """The whole layer (projections, shifts, norms, forget gate, output norm and gate, W_o) against the reference
    layer on the same weights, every weight moved off its init: values and gradients to the input and every
    parameter. The reference has no GQA: MHA only (``fox_pro``'s GQA is covered by the generic tests)."""
    batch, t, heads, dh, dtype, tolerance = CASES[case]
    shape = AttentionShape(n_embd=heads * dh, n_head=heads, n_kv_head=heads, head_dim=dh, block_size=64)
    torch.manual_seed(0)
    layer = CausalSelfAttention(shape, PRO_PIECES[pieces], bias=False, dropout=0.0).to(dtype)
    with torch.no_grad():
        for name, param in layer.variant.named_parameters():
            param.add_((1.0 if "norm" in name or "bias" in name else 0.3) * torch.randn_like(param))
    x = torch.randn(batch, t, heads * dh, dtype=dtype, requires_grad=True)
    ours = layer(x, AttentionContext(positions=torch.arange(t)))
    theirs = forgetting_attention_layer(layer, x)
    inputs = (x, *layer.parameters())
    weights = torch.linspace(-1, 1, ours.numel(), dtype=dtype).view(ours.shape)
    our_grads = torch.autograd.grad((ours * weights).sum(), inputs)
    their_grads = torch.autograd.grad((theirs * weights).sum(), inputs)
    torch.testing.assert_close(ours, theirs, atol=tolerance, rtol=tolerance)
    for grad, expected in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(grad, expected, atol=10 * tolerance, rtol=10 * tolerance)


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
