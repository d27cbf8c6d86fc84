"""The adjacent variants against their reference code on the same tensors, fp32 (and float64 at the end), values and
gradients: gpt-oss's ``sdpa`` (sink), softpick's ``naive_softpick_attn``, ml-sigmoid-attention's ``Attention``
(sigmoid), transformers' Qwen3 / OLMo 2 attention (qk_norm), and the SSMax paper's formula (no official code).
The fixtures port the references line by line (only batch / layout glue added); each cites repo, path and commit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.olmo2.configuration_olmo2 import Olmo2Config
from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention, build_variant
from attnlab.models.gpt import alibi_slopes

H, KV, DH = 4, 2, 8


def variant(name: str, block_size: int = 32, **options):
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=KV, head_dim=DH, block_size=block_size)
    return build_variant({"name": name, **options}, shape)


def qkv(t_q: int, t_k: int, kv: int = KV, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(
        (2 * torch.randn(2, heads, t, DH, generator=g)).to(dtype).requires_grad_()
        for heads, t in ((H, t_q), (kv, t_k), (kv, t_k))
    )


def values_and_grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(
        out.shape
    )  # a loss that weighs every output differently
    return (out, *torch.autograd.grad((out * weights).sum(), inputs))


def assert_all_close(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, i=index: f"output/grad {i}: {m}")


def context(t_q: int, t_k: int, alibi: bool = False) -> tuple[torch.Tensor | None, bool]:
    ctx = AttentionContext(positions=torch.arange(t_k - t_q, t_k), alibi_slopes=alibi_slopes(H) if alibi else None)
    return ctx.mask(t_q, t_k, torch.float32)


def wide(x: torch.Tensor) -> torch.dtype:
    """A reference's casts to fp32 (``.float()``), written for fp32 and half inputs, kept wider for float64 ones:
    the same dtype below float64, and a float64 check that is not rounded to fp32."""
    return torch.promote_types(x.dtype, torch.float32)


# --- sink: openai/gpt-oss gpt_oss/torch/model.py `sdpa`, commit 7b583341fe16729127f6d5b94a7b09ccae97e1a1 ---


def gpt_oss_sdpa(Q, K, V, S, sm_scale, sliding_window=0):
    # sliding_window == 0 means no sliding window
    n_tokens, n_heads, q_mult, d_head = Q.shape
    assert K.shape == (n_tokens, n_heads, d_head)
    assert V.shape == (n_tokens, n_heads, d_head)
    K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
    V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
    S = S.reshape(n_heads, q_mult, 1, 1).expand(-1, -1, n_tokens, -1)
    mask = torch.triu(Q.new_full((n_tokens, n_tokens), -float("inf")), diagonal=1)
    if sliding_window > 0:
        mask += torch.tril(mask.new_full((n_tokens, n_tokens), -float("inf")), diagonal=-sliding_window)
    QK = torch.einsum("qhmd,khmd->hmqk", Q, K)
    QK *= sm_scale
    QK += mask[None, None, :, :]
    QK = torch.cat([QK, S], dim=-1)
    W = torch.softmax(QK, dim=-1)
    W = W[..., :-1]
    attn = torch.einsum("hmqk,khmd->qhmd", W, V)
    return attn.reshape(n_tokens, -1)


def gpt_oss_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Glue: gpt-oss's (tokens, KV, q_mult, d_h) layout has no batch; its head h = kv * q_mult + m is ours."""
    heads, kv, dh = q.shape[1], k.shape[1], q.shape[-1]
    outs = []
    for b in range(q.shape[0]):
        query = q[b].transpose(0, 1).reshape(q.shape[2], kv, heads // kv, dh)
        outs.append(gpt_oss_sdpa(query, k[b].transpose(0, 1), v[b].transpose(0, 1), sinks, 1 / math.sqrt(dh)))
    return torch.stack(outs).view(q.shape[0], q.shape[2], heads, dh).transpose(1, 2)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_sink_matches_gpt_oss(chunk_size: int) -> None:
    """Fused SDPA times sigmoid(lse - s_h), lse from query chunks, equals gpt-oss's appended-column softmax."""
    sink = variant("sink", chunk_size=chunk_size)
    with torch.no_grad():
        sink.sinks.copy_(torch.tensor([-1.0, 0.0, 0.7, 3.0]))
    q, k, v = qkv(13, 13)
    inputs = (q, k, v, sink.sinks)
    ours = values_and_grads(sink.attend(q, k, v, None, True, 0.0), inputs)
    theirs = values_and_grads(gpt_oss_batched(q, k, v, sink.sinks), inputs)
    assert_all_close(ours, theirs)
    reference, probabilities = sink.reference_attention(q, k, v, None, True)
    torch.testing.assert_close(reference, ours[0], atol=1e-5, rtol=1e-5)
    assert (probabilities.sum(-1) < 1).all()  # the sink takes some mass from every row


@pytest.mark.parametrize("alibi", [False, True], ids=["causal", "alibi"])
@pytest.mark.parametrize(("t_q", "t_k"), [(5, 13), (1, 13)], ids=["cache", "decode"])
def test_sink_attend_equals_reference_with_cache_and_alibi(alibi: bool, t_q: int, t_k: int) -> None:
    sink = variant("sink", chunk_size=2, sink_init=0.5)
    q, k, v = qkv(t_q, t_k)
    mask, is_causal = context(t_q, t_k, alibi)
    inputs = (q, k, v, sink.sinks)
    ours = values_and_grads(sink.attend(q, k, v, mask, is_causal, 0.0), inputs)
    assert_all_close(ours, values_and_grads(sink.reference_attention(q, k, v, mask, is_causal)[0], inputs))


def test_softmax1_is_evan_millers_formula() -> None:
    """sink_logit=fixed: s_h = 0, no parameter; p_ij = exp(s_ij) / (1 + sum_j exp(s_ij))."""
    softmax1 = variant("softmax1")
    assert list(softmax1.parameters()) == []
    scores = torch.tensor([0.5, -1.0, float("-inf")]).expand(1, H, 1, 3)
    expected = torch.tensor([0.5, -1.0]).exp() / (1 + torch.tensor([0.5, -1.0]).exp().sum())
    torch.testing.assert_close(softmax1.probabilities(scores), torch.cat([expected, torch.zeros(1)]).expand(1, H, 1, 3))


# --- softpick: zaydzuhri/softpick-attention naive_softpick_attn.py, commit c97f4dc5f9fcec2e8afc2932db2cba6d7d7e5465 ---


def softpick_reference(x, dim=-1, eps=1e-8):
    # softpick function: relu(exp(x)-1) / sum(abs(exp(x)-1))
    # numerically stable version
    x_m = torch.max(x, dim=dim, keepdim=True).values
    x_m_e_m = torch.exp(-x_m)
    x_e_1 = torch.exp(x - x_m) - x_m_e_m
    r_x_e_1 = F.relu(x_e_1)
    a_x_e_1 = torch.where(x.isfinite(), torch.abs(x_e_1), 0)
    return r_x_e_1 / (torch.sum(a_x_e_1, dim=dim, keepdim=True) + eps)


def naive_softpick_attn(q, k, v, scale=None):
    """``naive_softpick_attn`` with head_first=True (the (B, H, T, d) layout), cu_seqlens unused as in the source."""
    head_dim = q.shape[-1]
    if scale is None:
        scale = 1.0 / (head_dim**0.5)
    q_len = q.shape[-2]
    k_len = k.shape[-2]
    mask = torch.tril(torch.ones(k_len, k_len, device=q.device))
    wei = torch.matmul(q, k.transpose(2, 3))  # shape: (batch_size, num_heads, q_len, k_len)
    wei = wei * scale
    wei = wei.masked_fill(mask[k_len - q_len : k_len, :k_len] == 0, float("-inf"))
    wei = softpick_reference(wei.to(wide(wei)), dim=-1).to(q.dtype)  # (.float() in the source: see wide)
    o = torch.matmul(wei, v)  # shape: (batch_size, num_heads, q_len, head_dim)
    return o, wei


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (5, 13), (1, 13)], ids=["full", "cache", "decode"])
def test_softpick_matches_reference(chunk_size: int, t_q: int, t_k: int) -> None:
    softpick = variant("softpick", chunk_size=chunk_size)
    q, k, v = qkv(t_q, t_k, kv=H)  # the reference has no GQA
    mask, is_causal = context(t_q, t_k)
    inputs = (q, k, v)
    ours = values_and_grads(softpick.attend(q, k, v, mask, is_causal, 0.0), inputs)
    theirs_out, theirs_probabilities = naive_softpick_attn(q, k, v)
    assert_all_close(ours, values_and_grads(theirs_out, inputs))
    probabilities = softpick.reference_attention(q, k, v, mask, is_causal)[1]
    torch.testing.assert_close(probabilities, theirs_probabilities, atol=1e-6, rtol=1e-5)


def test_softpick_rows_can_attend_to_nothing() -> None:
    """Scores <= 0 get exactly 0 (no forced sink), and rows sum to at most 1."""
    scores = torch.tensor([[[[-0.5, -2.0, 1.0, float("-inf")], [-1.0, -0.1, 0.0, -3.0]]]])
    p = variant("softpick").probabilities(scores)
    assert p[0, 0, 0, :2].abs().max() == 0 and p[0, 0, 0, 2] > 0 and p[0, 0, 0, 3] == 0
    assert p[0, 0, 1].abs().max() == 0
    assert (p.sum(-1) <= 1).all()


# --- sigmoid: apple/ml-sigmoid-attention attention_simulator/src/attention_simulator/layers/attention.py
# (Attention.forward) with activations.py unnormalized_sigmoid_attention and masking.py's masked_fill,
# commit 9273b493f234ccbb184cab1131010dd0e965d8ce ---


def sigmoid_attention_reference(q, k, v, mask, attn_bias, attn_temp=0.0):
    """Attention.forward from q/k/v on: the scale, causal masking with -finfo.max, exp(temp), + bias, sigmoid."""
    scale = q.shape[-1] ** -0.5
    q = q * scale
    attn = q @ k.transpose(-2, -1)
    attn = attn.masked_fill(~mask.expand_as(attn), -torch.finfo(attn.dtype).max)  # masking_fn
    attn = attn * math.exp(attn_temp)
    attn = attn + attn_bias
    attn_matrix = torch.sigmoid(attn)  # unnormalized_sigmoid_attention
    return attn_matrix @ v, attn_matrix


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (5, 13), (1, 13)], ids=["full", "cache", "decode"])
def test_sigmoid_matches_reference(chunk_size: int, t_q: int, t_k: int) -> None:
    sigmoid = variant("sigmoid", block_size=2048, chunk_size=chunk_size)  # b = -log 2048 = -7.62
    q, k, v = qkv(t_q, t_k, kv=H)
    mask, is_causal = context(t_q, t_k)
    inputs = (q, k, v)
    ours = values_and_grads(sigmoid.attend(q, k, v, mask, is_causal, 0.0), inputs)
    visible = torch.ones(t_k, t_k, dtype=torch.bool).tril()[t_k - t_q :]  # create_decoder_causal_mask, cached rows
    theirs_out, theirs_probabilities = sigmoid_attention_reference(q, k, v, visible, -math.log(2048))
    assert_all_close(ours, values_and_grads(theirs_out, inputs))
    probabilities = sigmoid.reference_attention(q, k, v, mask, is_causal)[1]
    torch.testing.assert_close(probabilities, theirs_probabilities, atol=1e-6, rtol=1e-5)


# --- qk_norm: transformers' Qwen3Attention / Olmo2Attention (the installed version) ---


def rope(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, DH, 2).float() / DH))
    angles = torch.arange(t).float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("scope", ["head", "projection"])
def test_qk_norm_layer_matches_transformers(scope: str) -> None:
    """Our whole layer (q/k norm before RoPE, SDPA, W_o) equals Qwen3Attention (head) / Olmo2Attention (projection)
    with the same weights; gradients to the norm weights agree too."""
    torch.manual_seed(0)
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=KV, head_dim=DH, block_size=32)
    ours = CausalSelfAttention(shape, {"name": "qk_norm", "scope": scope}, bias=False, dropout=0.0)
    common = {"hidden_size": H * DH, "num_attention_heads": H, "num_key_value_heads": KV, "rms_norm_eps": 1e-6}
    if scope == "head":
        theirs = Qwen3Attention(Qwen3Config(**common, head_dim=DH, attention_bias=False), layer_idx=0)
    else:
        theirs = Olmo2Attention(Olmo2Config(**common, attention_bias=False), layer_idx=0)
    with torch.no_grad():
        for norm in (ours.variant.q_norm, ours.variant.k_norm):
            norm.weight.add_(0.3 * torch.randn_like(norm.weight))
        q_w, k_w, v_w = ours.qkv.weight.split(shape.qkv_sizes)
        for target, source in (
            (theirs.q_proj, q_w),
            (theirs.k_proj, k_w),
            (theirs.v_proj, v_w),
            (theirs.o_proj, ours.proj.weight),
        ):
            target.weight.copy_(source)
        theirs.q_norm.weight.copy_(ours.variant.q_norm.weight)
        theirs.k_norm.weight.copy_(ours.variant.k_norm.weight)
    theirs.config._attn_implementation = "eager"
    t = 11
    x = torch.randn(2, t, H * DH)
    cos, sin = rope(t)
    our_out = ours(x, AttentionContext(positions=torch.arange(t), rope=(cos, sin)))
    causal = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))[None, None]
    their_out = theirs(x, position_embeddings=(cos[None], sin[None]), attention_mask=causal)[0]
    ours_all = values_and_grads(our_out, (ours.variant.q_norm.weight, ours.variant.k_norm.weight))
    theirs_all = values_and_grads(their_out, (theirs.q_norm.weight, theirs.k_norm.weight))
    assert_all_close(ours_all, theirs_all)


# --- ssmax: the paper's formula (Nakanishi 2025, eq. for SSMax; no official code) ---


@pytest.mark.parametrize("start_pos", [0, 37])
def test_ssmax_matches_the_papers_formula(start_pos: int) -> None:
    """softmax((s_h log n_t) q k^T / sqrt(d_h)) with n_t the keys the query sees, also for queries after a cache.

    In float64: s_h's gradient sums T x T x d_h terms that cancel (fp32 agrees only to ~1e-4 relative there).
    """
    ssmax = variant("ssmax").double()
    with torch.no_grad():
        ssmax.s.copy_(torch.tensor([0.2, 0.43, 1.0, 2.5]))
    t_q, t_k = 6, start_pos + 6
    q, k, v = qkv(t_q, t_k, kv=H, dtype=torch.float64)
    ctx = AttentionContext(positions=torch.arange(start_pos, start_pos + t_q))
    new_q, _, _ = ssmax.transform_qkv(torch.zeros(2, t_q, H * DH), q, k, v, ctx)
    mask, is_causal = ctx.mask(t_q, t_k, torch.float64)
    ours = values_and_grads(ssmax.attend(new_q, k, v, mask, is_causal, 0.0), (q, k, v, ssmax.s))
    n = (torch.arange(t_q) + start_pos + 1).float()  # keys seen: the query's own 1-based position
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(DH) * (ssmax.s.view(1, H, 1, 1) * n.log().view(1, 1, t_q, 1))
    visible = torch.arange(t_k)[None, :] <= (torch.arange(t_q) + start_pos)[:, None]
    expected = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
    assert_all_close(ours, values_and_grads(expected, (q, k, v, ssmax.s)))


def test_ssmax_init_is_the_papers_value() -> None:
    assert torch.equal(variant("ssmax").s, torch.full((H,), 0.43))


# --- memory: the explicit paths keep no (T x T) matrix for backward ---


@pytest.mark.parametrize("name", ["sink", "softpick", "sigmoid", "clipped_softmax"])
def test_no_score_matrix_is_kept_for_backward(name: str) -> None:
    """With checkpointed query chunks, backward keeps only O(T) tensors; the reference keeps (T x T) maps."""
    t = 64
    layer = variant(name, chunk_size=16)  # a (16 x 64) chunk of scores is larger than q, k or v
    q, k, v = qkv(t, t)
    sizes: list[int] = []

    def record(saved: torch.Tensor) -> torch.Tensor:
        sizes.append(saved.numel())
        return saved

    with torch.autograd.graph.saved_tensors_hooks(record, lambda saved: saved):
        layer.attend(q, k, v, None, True, 0.0)
    assert max(sizes) <= 2 * H * t * DH  # q/k/v-sized
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(record, lambda saved: saved):
        layer.reference_attention(q, k, v, None, True)
    assert max(sizes) >= 2 * H * t * t  # the check above could fail


# --- float64, on shapes the tests above do not use: B=3, T=37, 6 heads of 12, GQA with 2 and 3 KV heads ---

B64, T64, H64, DH64 = 3, 37, 6, 12


def shape64(kv: int, block_size: int = 64) -> AttentionShape:
    return AttentionShape(n_embd=H64 * DH64, n_head=H64, n_kv_head=kv, head_dim=DH64, block_size=block_size)


def qkv64(kv: int, t_q: int = T64, t_k: int = T64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(4)
    return tuple(
        (2 * torch.randn(B64, heads, t, DH64, generator=g, dtype=torch.float64)).requires_grad_()
        for heads, t in ((H64, t_q), (kv, t_k), (kv, t_k))
    )


def assert_float64_close(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11, msg=lambda m, i=index: f"output/grad {i}: {m}")


@pytest.mark.parametrize("kv", [2, 3])
@pytest.mark.parametrize("name", ["sink", "softpick", "sigmoid", "clipped_softmax"])
@pytest.mark.parametrize("path", ["attend", "reference_attention"])
def test_explicit_maps_match_their_references_in_float64(name: str, kv: int, path: str) -> None:
    """gpt-oss's sink, softpick's and ml-sigmoid-attention's references (keys repeated per query head: the last two
    have no GQA) and clipped softmax's formula (Bondarenko et al. eq. 4), float64 values and gradients."""
    layer = build_variant({"name": name, "chunk_size": 5}, shape64(kv)).double()
    if name == "sink":
        with torch.no_grad():
            layer.sinks.copy_(torch.linspace(-1.0, 2.0, H64, dtype=torch.float64))
    q, k, v = qkv64(kv)
    inputs = (q, k, v, *layer.parameters())
    if path == "attend":
        ours = values_and_grads(layer.attend(q, k, v, None, True, 0.0), inputs)
    else:
        ours = values_and_grads(layer.reference_attention(q, k, v, None, True)[0], inputs)
    keys, values = (x.repeat_interleave(H64 // kv, dim=1) for x in (k, v))
    visible = torch.ones(T64, T64, dtype=torch.bool).tril()
    if name == "sink":
        theirs = gpt_oss_batched(q, k, v, layer.sinks)
    elif name == "softpick":
        theirs = naive_softpick_attn(q, keys, values)[0]
    elif name == "sigmoid":
        theirs = sigmoid_attention_reference(q, keys, values, visible, -math.log(64))[0]
    else:  # clip((zeta - gamma) softmax(s) + gamma, 0, 1) with gamma = -alpha / T_ctx = -12 / 64
        scores = (q @ keys.transpose(-2, -1) / math.sqrt(DH64)).masked_fill(~visible, float("-inf"))
        theirs = torch.clamp((1 + 12 / 64) * torch.softmax(scores, dim=-1) - 12 / 64, 0, 1) @ values
    assert_float64_close(ours, values_and_grads(theirs, inputs))


@pytest.mark.parametrize("kv", [2, 3])
@pytest.mark.parametrize("start_pos", [0, 37])
def test_ssmax_matches_the_papers_formula_in_float64(kv: int, start_pos: int) -> None:
    """n_t = t + 1 in float64 too (its log rounded through fp32 would be off by 1e-8 relative)."""
    ssmax = build_variant({"name": "ssmax"}, shape64(kv)).double()
    with torch.no_grad():
        ssmax.s.copy_(torch.linspace(0.2, 2.5, H64, dtype=torch.float64))
    t_k = start_pos + T64
    q, k, v = qkv64(kv, T64, t_k)
    ctx = AttentionContext(positions=torch.arange(start_pos, t_k))
    new_q, _, _ = ssmax.transform_qkv(torch.zeros(B64, T64, H64 * DH64), q, k, v, ctx)
    mask, is_causal = ctx.mask(T64, t_k, torch.float64)
    inputs = (q, k, v, ssmax.s)
    ours = values_and_grads(ssmax.attend(new_q, k, v, mask, is_causal, 0.0), inputs)
    keys, values = (x.repeat_interleave(H64 // kv, dim=1) for x in (k, v))
    log_n = torch.arange(start_pos + 1, t_k + 1, dtype=torch.float64).log()
    scores = (q @ keys.transpose(-2, -1)) / math.sqrt(DH64) * (ssmax.s.view(1, H64, 1, 1) * log_n.view(1, 1, T64, 1))
    visible = torch.arange(t_k)[None, :] <= torch.arange(start_pos, t_k)[:, None]
    expected = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ values
    assert_float64_close(ours, values_and_grads(expected, inputs))


@pytest.mark.parametrize("kv", [2, 3])
@pytest.mark.parametrize("scope", ["head", "projection"])
def test_qk_norm_matches_the_rms_norm_formula_in_float64(kv: int, scope: str) -> None:
    """q / rms(q) * w and the same for k, per head (Qwen3) or over the projection (OLMo 2), in float64: transformers'
    own RMSNorm casts to fp32, so the float64 check is the formula the fp32 test above ties to it."""
    layer = build_variant({"name": "qk_norm", "scope": scope}, shape64(kv)).double()
    with torch.no_grad():
        for norm in (layer.q_norm, layer.k_norm):
            norm.weight.add_(0.3 * torch.randn_like(norm.weight))
    q, k, v = qkv64(kv)
    new_q, new_k, _ = layer.transform_qkv(None, q, k, v, AttentionContext(positions=torch.arange(T64)))
    inputs = (q, k, layer.q_norm.weight, layer.k_norm.weight)
    ours = values_and_grads(torch.cat([new_q.flatten(1, 2), new_k.flatten(1, 2)], dim=1), inputs)

    def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if scope == "head":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        flat = x.transpose(1, 2).flatten(2)  # (B, T, heads * d_h)
        normed = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        return normed.view(B64, T64, -1, DH64).transpose(1, 2)

    expected = torch.cat([rms_norm(q, inputs[2]).flatten(1, 2), rms_norm(k, inputs[3]).flatten(1, 2)], dim=1)
    assert_float64_close(ours, values_and_grads(expected, inputs))
