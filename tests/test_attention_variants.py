"""Every attention variant against vanilla on a tiny GPT: identity at the neutral setting, causality, fused vs
reference math, gradients, KV-cache decoding, absolute positions and the fine-tuning init."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import AttentionContext, available_attention, resolve_options
from attnlab.attention.variants.gated import HeadGate
from attnlab.attention.variants.gated_sdpa import Gate
from attnlab.attention.variants.ssa import SelectiveTemperature
from attnlab.errors import ConfigError
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT, document_ids

VOCAB = 61
# Every registered name, plus overrides reaching the options no preset uses.
CONFIGS = [{"name": name} for name in available_attention()] + [
    {"name": "clipped_softmax", "zeta": 1.05, "gamma": -0.05, "alpha": None, "chunk_size": 5},
    {"name": "gated", "gate_type": "mlp"},
    {"name": "gated", "gate_type": "all_features", "pi_init": 0.5},
    {"name": "gated_sdpa", "position": "key"},
    {"name": "gated_sdpa", "position": "query", "granularity": "headwise"},
    {"name": "gated_sdpa", "position": "dense"},
    {"name": "gated_sdpa", "activation": "silu"},
    {"name": "gated_sdpa", "activation": "silu", "form": "additive"},
    {"name": "gated_sdpa", "activation": "ns_sigmoid", "form": "additive", "position": "dense"},
    {"name": "gated_value", "granularity": "headwise", "share_across_heads": True},
    {"name": "gated_sdpa", "share_across_heads": True},
    {"name": "ssa", "share_across_heads": True, "components": ["q", "k", "v"]},
    {"name": "ssa_shared", "components": ["q", "k", "v"]},
    {"name": "ssa_shared", "share_across_heads": True},
    {"name": "ssa_feature", "components": ["k"]},
    {"name": "ssa_tok_only", "components": ["q"]},
    {"name": "ssa_pos_only", "components": ["k"], "terms": ["position", "constant"]},
    {"name": "sink", "chunk_size": 5},
    {"name": "softmax1", "sink_init": 1.5},
    {"name": "softpick", "chunk_size": 5},
    {"name": "sigmoid", "chunk_size": 5, "bias": -1.0},
    {"name": "stickbreaking", "attend_current": True},
    {"name": "fox", "key_shift": True, "output_gate": True},
    {"name": "fox", "value_shift": True, "qk_norm": True, "output_norm": True},
    {"name": "diff", "subln_affine": False},
    {"name": "gated_sdpa", "gate_bias": False},
]
IDS = [c["name"] + "".join(f"-{k}={v}" for k, v in c.items() if k != "name") for c in CONFIGS]
POSITION_ENCODINGS = ["learned", "rotary", "alibi", "sinusoidal"]
# Variants with no setting that is vanilla (a fixed map other than softmax, a norm on q and k, a rule of their own);
# their docstrings and own test files say why (fox: f = 1 needs an infinite bias).
NO_NEUTRAL_SETTING = {"qk_norm", "qk_norm_projection", "softpick", "sigmoid", "ssmax", "selective", "stickbreaking"}
NO_NEUTRAL_SETTING |= {"fox", "fox_pro", "diff"}
# Variants whose logits depend on the absolute position without an SSA position term.
POSITION_DEPENDENT = {"ssmax"}


def tiny_config(pos: str = "rotary", kv: int | None = 2, block_size: int = 32) -> ModelConfig:
    return ModelConfig(
        n_layer=2, n_head=4, n_kv_head=kv, n_embd=32, vocab_size=VOCAB, block_size=block_size, pos_encoding=pos
    )


def new_gpt(config: ModelConfig, attention: dict) -> GPT:
    """GPT(config, attention) in eval mode; skipped where the variant refuses the model (fox, stick-breaking: the
    position encoding; diff: an odd number of heads): their own test files cover the models they take."""
    try:
        return GPT(config, attention).eval()
    except ConfigError as error:
        if error.key not in ("model.pos_encoding", "model.n_head", "model.n_kv_head"):
            raise
        pytest.skip(str(error))


def build(attention: dict, config: ModelConfig, seed: int = 0, perturb: bool = True) -> GPT:
    """A model in eval mode with token frequencies set and (optionally) every variant parameter moved off init."""
    torch.manual_seed(seed)
    model = new_gpt(config, attention)
    model.set_token_frequencies(torch.randint(0, 1000, (VOCAB,)))
    if perturb:
        with torch.no_grad():
            for _, p in model.variant_parameters():
                p.add_(0.5 * torch.randn_like(p))
    return model


def variant_copy(vanilla: GPT, attention: dict) -> GPT:
    """A model with ``attention`` that shares every weight of ``vanilla``: only variant keys may be missing."""
    model = new_gpt(vanilla.config, attention)
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    variant_keys = {k for k in model.state_dict() if ".variant." in k}
    if hasattr(model, "token_log_frequency"):
        variant_keys.add("token_log_frequency")
        model.set_token_frequencies(torch.randint(0, 1000, (VOCAB,)))
    assert unexpected == []
    assert set(missing) == variant_keys
    return model


def neutralise(model: GPT) -> None:
    """The variant's neutral setting: gates exactly 1 (their fine-tuning init), tau = 1 (alpha -> -inf)."""
    with torch.no_grad():
        for block in model.blocks:
            variant = block.attn.variant
            if isinstance(variant, Gate | HeadGate | SelectiveTemperature):
                variant.init_for_finetuning()
            for name, p in variant.named_parameters():
                if name.endswith("alpha"):
                    p.fill_(-1e4)  # sigmoid(-1e4) == 0 in fp32


def tokens(length: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def terms(attention: dict) -> set[str]:
    """The SSA terms of a config (empty for other variants)."""
    return set(asdict(resolve_options(attention)[1]).get("terms", []))


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
@pytest.mark.parametrize(("pos", "kv"), [("learned", None), ("rotary", 2), ("alibi", None)])
def test_neutral_setting_is_vanilla(attention: dict, pos: str, kv: int | None) -> None:
    if "yarn" in terms(attention):
        pytest.skip("temp_yarn is a fixed rule without a neutral setting: see test_position_rules_formula")
    if attention["name"] in NO_NEUTRAL_SETTING:
        pytest.skip(f"{attention['name']} has no neutral setting (see its docstring and its own test file)")
    if attention["name"] in ("sink", "softmax1"):
        attention = {**attention, "sink_init": float("-inf")}  # s_h -> -inf: the sink takes no mass
    if attention["name"] == "clipped_softmax":
        attention = {**attention, "zeta": 1.0, "gamma": 0.0, "alpha": None}
    if attention["name"] == "value_select":
        attention = {**attention, "threshold": float("-inf")}  # keeps every value
    vanilla = build({"name": "vanilla"}, tiny_config(pos, kv))
    model = variant_copy(vanilla, attention)
    neutralise(model)
    idx = tokens(20)
    torch.testing.assert_close(model(idx), vanilla(idx), atol=1e-6, rtol=0)


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
def test_not_vanilla_off_the_neutral_setting(attention: dict) -> None:
    """The identity above is not vacuous: perturbed variants (other than vanilla) change the logits."""
    if attention["name"] == "value_select":
        attention = {**attention, "threshold": 1.5}  # no parameters: off vanilla where the rule drops a value
    vanilla = build({"name": "vanilla"}, tiny_config())
    model = variant_copy(vanilla, attention)
    with torch.no_grad():
        for _, p in model.variant_parameters():
            p.add_(0.5 * torch.randn_like(p))
    difference = (model(tokens(20)) - vanilla(tokens(20))).abs().max().item()
    assert (difference == 0) == (attention["name"] == "vanilla")


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
@pytest.mark.parametrize("kv", [None, 2], ids=["mha", "gqa"])
def test_causal(attention: dict, pos: str, kv: int | None) -> None:
    model = build(attention, tiny_config(pos, kv))
    idx = tokens(16)
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1 + torch.arange(8)) % VOCAB
    before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :8], before[:, :8], atol=1e-6, rtol=0)
    assert (after[:, 8:] - before[:, 8:]).abs().max() > 1e-4  # the perturbation is visible later


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
@pytest.mark.parametrize(("pos", "kv"), [("rotary", 2), ("alibi", None), ("learned", 1)])
def test_fused_matches_reference(attention: dict, pos: str, kv: int | None) -> None:
    model = build(attention, tiny_config(pos, kv))
    idx = tokens(19)
    fused = model(idx)
    for block in model.blocks:
        block.attn.record_probabilities = True
    reference = model(idx)
    torch.testing.assert_close(fused, reference, atol=2e-5, rtol=1e-5)
    probabilities = model.blocks[0].attn.probabilities
    assert probabilities.shape == (2, 4, 19, 19)
    assert probabilities.triu(1).abs().max() == 0


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
def test_gradients_reach_every_variant_parameter(attention: dict) -> None:
    model = build(attention, tiny_config("rotary", 2)).train()
    idx = tokens(17)
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    for name, p in model.variant_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
@pytest.mark.parametrize(("pos", "kv"), [("learned", None), ("rotary", 2), ("alibi", 2), ("sinusoidal", None)])
def test_kv_cache_decoding_matches_full_forward(attention: dict, pos: str, kv: int | None) -> None:
    model = build(attention, tiny_config(pos, kv))
    idx = tokens(14)
    full = model(idx)
    cache = model.new_cache()
    steps = [model(idx[:, :5], 0, cache), model(idx[:, 5:9], 5, cache)]  # prefill, then a chunk
    steps += [model(idx[:, t : t + 1], t, cache) for t in range(9, 14)]  # then one token at a time
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", CONFIGS, ids=IDS)
@pytest.mark.parametrize("pos", ["rotary", "alibi", "learned"])
def test_window_uses_absolute_positions(attention: dict, pos: str) -> None:
    """q/k/v after the variant for a window starting at 100 equal the full sequence's at the same positions.

    transform_qkv is per token, so this holds exactly. With ALiBi (translation invariant) the same window
    evaluated as if it started at 0 must differ exactly when the variant has a position term: that is what a
    position term indexed by window position (log 1 instead of log 101) would have produced.
    """
    model = build(attention, tiny_config(pos, 2, block_size=128))
    variant = model.blocks[0].attn.variant
    recorded = []
    transform = variant.transform_qkv
    variant.transform_qkv = lambda *args: recorded.append(transform(*args)) or recorded[-1]
    idx = tokens(112)
    model(idx)
    model(idx[:, 100:], start_pos=100)
    model(idx[:, 100:], start_pos=0)
    full, window, relative = ([t[:, :, -12:] for t in qkv] for qkv in recorded)
    for a, b in zip(full, window, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    if pos == "alibi":
        same = all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(full, relative, strict=True))
        assert same != (bool({"position", "yarn"} & terms(attention)) or attention["name"] in POSITION_DEPENDENT)


@pytest.mark.parametrize("component", ["q", "k"])
def test_shared_token_temperature_reads_the_projection_before_rope(component: str) -> None:
    """ssa_shared's f(x) = w . GeLU(W_c x) (Zhang et al.) is on the raw projection: on a rotary model the same
    token gets the same token temperature at every position (after RoPE it would vary with the position)."""
    attention = {"name": "ssa_shared", "components": [component], "terms": ["token"]}
    model = build(attention, tiny_config("rotary", None, block_size=64))
    variant = model.blocks[0].attn.variant
    variant.recorded = {}
    model(torch.full((1, 40), 7))
    tau = variant.recorded[f"temperature_{component}"][0]  # (1, H, T, 1)
    assert tau.std(dim=2).max() < 1e-6
    assert (tau - 1).abs().max() > 1e-3  # the token term is on (perturbed weights), not a constant 1


def test_kv_cache_without_start_pos_is_an_error() -> None:
    model = build({"name": "vanilla"}, tiny_config())
    cache = model.new_cache()
    model(tokens(5), start_pos=0, cache=cache)
    with pytest.raises(ValueError, match="start_pos"):
        model(tokens(1), cache=cache)


@pytest.mark.parametrize("rule", [["position"], ["yarn"], ["constant", "position"]])
@pytest.mark.parametrize("start_pos", [0, 37])
def test_position_rules_formula(rule: list[str], start_pos: int) -> None:
    """tau(n) on q from the plain formula: 1 + sigmoid(alpha_h) log n, 0.1 ln n + 1, c_h + ..., n absolute."""
    attention = {"name": "ssa", "components": ["q"], "terms": rule}
    model = build(attention, tiny_config("alibi", None, block_size=64))
    variant = model.blocks[0].attn.variant
    temperature = variant.temperatures["q"]
    x = torch.randn(2, 9, 32)
    q, k, v = (torch.randn(2, 4, 9, 8) for _ in range(3))
    ctx = model.context(tokens(9), start_pos=start_pos)
    n = torch.arange(start_pos + 1, start_pos + 10, dtype=torch.float32)
    base = temperature.constant.view(4, 1) if "constant" in rule else 1.0
    slope = 0.1 * torch.ones(4, 1) if "yarn" in rule else torch.sigmoid(temperature.alpha).view(4, 1)
    expected = base + slope * torch.log(n)  # (H, T)
    new_q, new_k, new_v = variant.transform_qkv(x, q, k, v, ctx)
    torch.testing.assert_close(new_q, q * expected[None, :, :, None])
    assert new_k is k and new_v is v


def finetune_deviation(attention: dict) -> float:
    vanilla = build({"name": "vanilla"}, tiny_config("learned", None, block_size=64))
    model = variant_copy(vanilla, attention)
    with torch.no_grad():
        for _, p in model.variant_parameters():
            p.add_(torch.randn_like(p))  # whatever a pretraining init left there
    model.init_variant_for_finetuning()
    idx = tokens(64)
    return (model(idx) - vanilla(idx)).abs().max().item()


EXACT_AT_FINETUNE = ["gated_sdpa", "gated_sdpa_headwise", "gated_value", "ssa_tok_only", "temp_constant"]


@pytest.mark.parametrize("name", ["vanilla", "gated", *EXACT_AT_FINETUNE, "temp_frequency"])
def test_finetune_init_is_exactly_the_pretrained_layer(name: str) -> None:
    assert finetune_deviation({"name": name}) == 0.0


@pytest.mark.parametrize(
    "attention",
    [
        {"name": "gated_sdpa", "activation": "silu"},
        {"name": "gated_sdpa", "activation": "silu", "form": "additive"},
        {"name": "gated_sdpa", "activation": "ns_sigmoid", "position": "key"},
        {"name": "gated", "gate_type": "mlp", "pi_init": 0.5},
        {"name": "gated", "gate_type": "all_features"},
    ],
)
def test_finetune_init_gate_options(attention: dict) -> None:
    assert finetune_deviation(attention) <= 1e-6


@pytest.mark.parametrize("name", ["ssa", "ssa_shared", "ssa_feature", "ssa_pos_only", "temp_kqv"])
def test_finetune_init_position_term_is_small_but_on(name: str) -> None:
    """tau = 1 + 6.11e-4 log n at fine-tuning init: not vanilla, but within a few 1e-3 here."""
    assert 0 < finetune_deviation({"name": name}) < 0.02


def test_finetune_init_with_the_papers_gate_weights_is_close() -> None:
    """Bondarenko's N(0, 1e-3) fine-tuning weights: close to, not exactly, the pretrained layer."""
    assert 0 < finetune_deviation({"name": "gated", "finetune_weight_std": 1e-3}) < 0.02


def test_finetune_init_of_clipped_softmax_is_only_vanilla_at_zeta_1_gamma_0() -> None:
    assert finetune_deviation({"name": "clipped_softmax", "gamma": 0.0, "alpha": None}) <= 1e-6
    assert finetune_deviation({"name": "clipped_softmax"}) > 1e-3  # gamma = -12/64 clips: not vanilla


def test_ssa_pretrain_init_values() -> None:
    model = build({"name": "ssa"}, tiny_config(), perturb=False)
    temperature = model.blocks[0].attn.variant.temperatures["v"]
    assert torch.sigmoid(temperature.alpha).allclose(torch.full((2,), 0.0113), atol=1e-4)  # per KV head
    assert temperature.out.weight.abs().max() == 0 and temperature.out.bias.abs().max() == 0
    model.init_variant_for_finetuning()  # sigmoid(-7.4) = 6.109e-4 (the official code's exp(-exp(2)) is 6.180e-4)
    assert torch.sigmoid(temperature.alpha).allclose(torch.full((2,), 6.109e-4), rtol=1e-3, atol=0)
    official = build({"name": "ssa", "alpha_init_finetune": -7.3884}, tiny_config(), perturb=False)
    official.init_variant_for_finetuning()
    alpha = official.blocks[0].attn.variant.temperatures["v"].alpha
    assert torch.sigmoid(alpha).allclose(torch.full((2,), math.exp(-math.exp(2))), rtol=1e-4, atol=0)


def test_gate_pretrain_init_values() -> None:
    model = build({"name": "gated"}, tiny_config(), perturb=False)
    variant = model.blocks[0].attn.variant
    assert torch.sigmoid(variant.bias).allclose(torch.full((4,), 0.25))
    assert variant.weight.abs().max() <= 1 / math.sqrt(8) and variant.weight.std() > 0.05
    qiu = build({"name": "gated_sdpa"}, tiny_config(), perturb=False).blocks[0].attn.variant
    assert abs(qiu.proj.weight.std().item() - 0.02) < 0.003 and qiu.proj.bias.abs().max() == 0


@pytest.mark.parametrize("gate_type", ["linear", "mlp", "all_features"])
def test_gate_init_reference_biases_and_finetunes_only_the_linear_gate(gate_type: str) -> None:
    """gate_init=reference (Qualcomm's opt_attention.py): bias logit(pi_init) and N(0, 1e-3) fine-tuning weights for
    the per-head linear gate only; the others keep nn.Linear's default init; all scale by 1 / pi_init to fine-tune."""
    attention = {"name": "gated", "gate_type": gate_type, "gate_init": "reference"}
    model = build(attention, tiny_config(), perturb=False)
    variant = model.blocks[0].attn.variant
    bound = 1 / math.sqrt(variant.weight.shape[1])
    linear = gate_type == "linear"
    assert torch.sigmoid(variant.bias).allclose(torch.full((4,), 0.25)) == linear
    assert variant.bias.abs().max() <= bound or linear
    model.init_variant_for_finetuning()
    assert (variant.weight.abs().max() < 5e-3) == linear and variant.weight.abs().max() > 0
    assert variant.output_scale == 4.0


def test_gate_init_refuses_an_unknown_rule() -> None:
    with pytest.raises(ConfigError, match=r"^attention\.gate_init: "):
        resolve_options({"name": "gated", "gate_init": "paper"})


def test_qiu_gate_without_bias_as_the_reference_on_bias_free_projections() -> None:
    """gate_bias=false: no b_g (Qwen3's gate is q_proj rows, qkv_bias off); the SiLU gate then has no neutral start."""
    variant = build({"name": "gated_sdpa", "gate_bias": False}, tiny_config(), perturb=False).blocks[0].attn.variant
    assert variant.proj.bias is None and [n for n, _ in variant.named_parameters()] == ["proj.weight"]
    assert finetune_deviation({"name": "gated_sdpa", "gate_bias": False}) == 0.0
    with pytest.raises(ConfigError, match=r"^attention\.gate_bias: a multiplicative silu gate starts neutral"):
        finetune_deviation({"name": "gated_sdpa", "gate_bias": False, "activation": "silu"})


def layer_inputs(seed: int = 3) -> tuple[torch.Tensor, ...]:
    """x (B, T, d), q (B, H, T, d_h), k and v (B, KV, T, d_h), o like q, y like x, for the tiny GQA shape."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g) for s in [(2, 5, 32), (2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)])


def apply_hooks(variant, x, q, k, v) -> dict[str, torch.Tensor]:
    ctx = AttentionContext(positions=torch.arange(5))
    new_q, new_k, new_v = variant.transform_qkv(x, q, k, v, ctx)
    return {
        "q": new_q,
        "k": new_k,
        "v": new_v,
        "o": variant.transform_heads(x, q, ctx),
        "y": variant.transform_output(x, x, ctx),
    }


@pytest.mark.parametrize("position", ["sdpa", "value", "key", "query", "dense"])
@pytest.mark.parametrize("activation", ["sigmoid", "silu", "ns_sigmoid"])
@pytest.mark.parametrize("form", ["multiplicative", "additive"])
def test_gate_formula(position: str, activation: str, form: str) -> None:
    """g = act(x W_g + b_g) multiplies (or is added to) exactly the tensor its position names, per head."""
    model = build({"name": "gated_sdpa", "position": position, "activation": activation, "form": form}, tiny_config())
    variant = model.blocks[0].attn.variant
    x, q, k, v = layer_inputs()
    z = x @ variant.proj.weight.t() + variant.proj.bias
    g = {"sigmoid": torch.sigmoid(z), "silu": z * torch.sigmoid(z), "ns_sigmoid": 0.5 + 0.5 * torch.sigmoid(z)}[
        activation
    ]
    target = {"sdpa": "o", "value": "v", "key": "k", "query": "q", "dense": "y"}[position]
    expected = {"q": q, "k": k, "v": v, "o": q, "y": x}
    original = expected[target]
    heads = original if target != "y" else original.unflatten(-1, (4, 8)).transpose(1, 2)
    g = g.unflatten(-1, (heads.shape[1], 8)).transpose(1, 2)
    gated = heads * g if form == "multiplicative" else heads + g
    expected[target] = gated if target != "y" else gated.transpose(1, 2).flatten(-2)
    for name, tensor in apply_hooks(variant, x, q, k, v).items():
        torch.testing.assert_close(tensor, expected[name], msg=name)


@pytest.mark.parametrize("gate_type", ["linear", "mlp", "all_features"])
def test_head_gate_formula(gate_type: str) -> None:
    """pi_h = sigmoid(G_h(x_h)) from head h's slice of the layer input, times o_h; nothing else changes."""
    variant = build({"name": "gated", "gate_type": gate_type}, tiny_config()).blocks[0].attn.variant
    x, q, k, v = layer_inputs()
    pis = []
    for h in range(4):
        if gate_type == "all_features":
            logit = x @ variant.weight[h] + variant.bias[h]
        elif gate_type == "mlp":
            hidden = F.relu(x[..., 8 * h : 8 * h + 8] @ variant.hidden_weight[h] + variant.hidden_bias[h])
            logit = hidden @ variant.weight[h] + variant.bias[h]
        else:
            logit = x[..., 8 * h : 8 * h + 8] @ variant.weight[h] + variant.bias[h]
        pis.append(torch.sigmoid(logit))
    expected = {"q": q, "k": k, "v": v, "o": q * torch.stack(pis, dim=1).unsqueeze(-1), "y": x}
    for name, tensor in apply_hooks(variant, x, q, k, v).items():
        torch.testing.assert_close(tensor, expected[name], msg=name)


@pytest.mark.parametrize("parameterisation", ["base", "shared", "feature"])
@pytest.mark.parametrize("share_across_heads", [False, True])
def test_token_temperature_formula(parameterisation: str, share_across_heads: bool) -> None:
    """tau = 1 + tanh(f(x)) on q (per head) and k (per KV head), f from the chosen parameterisation."""
    attention = {"name": "ssa_tok_only", "components": ["q", "k"], "parameterisation": parameterisation}
    model = build({**attention, "share_across_heads": share_across_heads}, tiny_config())
    variant = model.blocks[0].attn.variant
    x, q, k, v = layer_inputs()
    phi = torch.randn(2, 5)
    ctx = AttentionContext(positions=torch.arange(5), token_features=phi)
    new_q, new_k, new_v = variant.transform_qkv(x, q, k, v, ctx)
    for c, old, new in (("q", q, new_q), ("k", k, new_k)):
        t = variant.temperatures[c]
        if parameterisation == "base":
            f = (F.gelu(x @ t.hidden.weight.t() + t.hidden.bias) @ t.out.weight.t() + t.out.bias).transpose(1, 2)
        elif parameterisation == "shared":
            f = torch.einsum("bhtd,hd->bht", F.gelu(old), t.weight.expand(old.shape[1], -1)) + t.bias[:, None]
        else:
            f = phi[:, None, :] * t.beta[:, None]
        torch.testing.assert_close(new, old * (1 + torch.tanh(f)).unsqueeze(-1).expand_as(old))
    assert new_v is v


def test_document_ids_count_the_separators_before_each_token() -> None:
    idx = torch.tensor([[5, 0, 3, 0, 0, 7], [0, 1, 2, 3, 4, 5]])
    assert document_ids(idx, separator=0).tolist() == [[0, 0, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1]]


# every config on SDPA's path; each registered variant also on flex (ALiBi's bias too) and the reference path
OTHER_BACKENDS = [("alibi", "flex"), ("rotary", "reference")]
DOCUMENT_CASES = [(c, "learned", "sdpa") for c in CONFIGS]
DOCUMENT_CASES += [({"name": n}, pos, b) for n in available_attention() for pos, b in OTHER_BACKENDS]
# the variants that take no position encoding (stick-breaking) or refuse ALiBi and RoPE (FoX), on every backend
UNENCODED = [(n, b) for n in ("stickbreaking", "fox", "fox_pro") for b in ("sdpa", "flex", "reference")]
DOCUMENT_CASES += [({"name": n}, "none", b) for n, b in UNENCODED]
DOCUMENT_IDS = [f"{i}-learned-sdpa" for i in IDS] + [
    f"{n}-{p}-{b}" for n in available_attention() for p, b in OTHER_BACKENDS
]
DOCUMENT_IDS += [f"{n}-none-{b}" for n, b in UNENCODED]


@pytest.mark.parametrize(("attention", "pos", "backend"), DOCUMENT_CASES, ids=DOCUMENT_IDS)
def test_document_mask_keeps_the_documents_of_a_block_apart(attention: dict, pos: str, backend: str) -> None:
    """data.document_mask: a token attends to its own document of a packed block only, on every backend. Changing
    the first document changes nothing after its separator, though the mask changes what comes after it (it is in
    effect); the backend agrees with SDPA's path; a block of one document is the plain causal forward."""
    if backend not in resolve_options({**attention, "backend": backend})[0].backends():
        pytest.skip(f"{attention['name']} has no {backend} path")
    model, sdpa = (build({**attention, "backend": name}, tiny_config(pos, 2)) for name in (backend, "sdpa"))
    separator, idx = 0, tokens(20) % (VOCAB - 1) + 1
    idx[:, 7], idx[1, 12] = separator, separator
    changed = idx.clone()
    changed[:, :7] = (changed[:, :7] + 3) % (VOCAB - 1) + 1
    with torch.no_grad():  # (flex has no backward on the CPU)
        masked, changed_masked = (model(x, documents=document_ids(x, separator)) for x in (idx, changed))
        torch.testing.assert_close(changed_masked[:, 8:], masked[:, 8:], atol=1e-6, rtol=0)
        assert (model(idx)[:, 8:] - masked[:, 8:]).abs().max() > 1e-4
        torch.testing.assert_close(masked, sdpa(idx, documents=document_ids(idx, separator)), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(model(idx, documents=torch.zeros_like(idx)), model(idx), atol=2e-5, rtol=1e-5)


def test_document_mask_refuses_a_kv_cache() -> None:
    model = build({"name": "vanilla"}, tiny_config())
    idx = tokens(8)
    with pytest.raises(ValueError, match="no KV cache"):
        model(idx, 0, model.new_cache(), documents=torch.zeros_like(idx))
