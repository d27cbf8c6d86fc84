"""Attention options: bad values fail at construction naming the key, Hydra offers every registered preset,
parameter overheads equal their formulas (tiny model and GPT-2 124M)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from attnlab.attention import available_attention, resolve_options
from attnlab.errors import ConfigError
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT
from tests.conftest import CONF

TINY = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "vocab_size": 61, "block_size": 32}
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 1024}


@pytest.mark.parametrize(
    ("attention", "key", "says"),
    [
        ({"name": "clipped_softmax", "zeta": 0.9}, "attention.zeta", ">= 1"),
        ({"name": "clipped_softmax", "gamma": 0.1, "alpha": None}, "attention.gamma", "<= 0"),
        ({"name": "clipped_softmax", "gamma": -0.1}, "attention.gamma", "exactly one of attention.gamma"),
        ({"name": "clipped_softmax", "alpha": None}, "attention.gamma", "exactly one of attention.gamma"),
        ({"name": "clipped_softmax", "alpha": -1.0}, "attention.alpha", ">= 0"),
        ({"name": "clipped_softmax", "chunk_size": 0}, "attention.chunk_size", "positive"),
        ({"name": "gated", "gate_type": "conv"}, "attention.gate_type", "linear, mlp, all_features"),
        ({"name": "gated", "pi_init": 1.0}, "attention.pi_init", "(0, 1)"),
        ({"name": "gated_sdpa", "activation": "relu"}, "attention.activation", "sigmoid, silu, ns_sigmoid"),
        ({"name": "gated_sdpa", "position": "output"}, "attention.position", "sdpa, value, key, query, dense"),
        ({"name": "gated_sdpa", "granularity": "rowwise"}, "attention.granularity", "elementwise, headwise"),
        ({"name": "gated_sdpa", "form": "gated"}, "attention.form", "multiplicative, additive"),
        ({"name": "ssa", "parameterisation": "lora"}, "attention.parameterisation", "base, shared, feature"),
        ({"name": "ssa", "components": ["q", "o"]}, "attention.components", "q, k, v"),
        ({"name": "ssa", "components": []}, "attention.components", "q, k, v"),
        ({"name": "ssa", "components": ["q", "q"]}, "attention.components", "without repeats"),
        ({"name": "ssa", "terms": ["token", "length"]}, "attention.terms", "token, position, yarn, constant"),
        ({"name": "ssa", "terms": ["position", "yarn"]}, "attention.terms", "pick one"),
        ({"name": "ssa", "hidden_ratio": 0.0}, "attention.hidden_ratio", "positive"),
        ({"name": "ssa", "zeta": 1.0}, "attention.zeta", "allowed: alpha_init"),
        ({"name": "gated", "position": "sdpa"}, "attention.position", "allowed: backend, finetune_weight_std"),
        ({"name": "softermax"}, "attention.name", "allowed: clipped_softmax"),
        ({"name": "sink", "sink_logit": "zero"}, "attention.sink_logit", "learned, fixed"),
        ({"name": "sink", "sink_init": float("nan")}, "attention.sink_init", "nan"),
        ({"name": "sink", "chunk_size": 0}, "attention.chunk_size", "positive"),
        ({"name": "qk_norm", "scope": "layer"}, "attention.scope", "head, projection"),
        ({"name": "qk_norm", "eps": 0.0}, "attention.eps", "positive"),
        ({"name": "softpick", "eps": -1e-8}, "attention.eps", ">= 0"),
        ({"name": "sigmoid", "bias": float("inf")}, "attention.bias", "finite"),
        ({"name": "sigmoid", "context_length": 0}, "attention.context_length", "positive"),
        ({"name": "ssmax", "s_init": 0.0}, "attention.s_init", "positive"),
    ],
)
def test_bad_options_fail_at_construction(attention: dict, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        GPT(ModelConfig(**TINY), attention)
    assert error.value.key == key
    assert says in str(error.value)


@pytest.mark.parametrize("name", available_attention())
def test_hydra_offers_every_preset_with_its_defaults(make_config, name: str) -> None:
    """``attention=<name>`` is generated from the registry: it builds the same options as the name alone, and
    clipped softmax's T_ctx follows the training context."""
    cfg = make_config([f"attention={name}", "data.block_size=128"])
    composed = OmegaConf.to_container(cfg.attention, resolve=True)
    expected = asdict(resolve_options({"name": name})[1])
    if name in ("clipped_softmax", "sigmoid"):
        expected["context_length"] = 128
    assert composed == expected


def test_hydra_group_override() -> None:
    """``attention=ssa_tok_only attention.components=[q]`` composes into options the variant accepts."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(overrides=["+attention=ssa_tok_only", "attention.components=[q]"])
    options = resolve_options(OmegaConf.to_container(cfg.attention))[1]
    assert (options.name, options.components, options.terms) == ("ssa_tok_only", ["q"], ["token"])
    GlobalHydra.instance().clear()


def gamma_of(attention: dict, block_size: int) -> float:
    model = GPT(ModelConfig(**{**TINY, "block_size": block_size}), attention)
    return model.blocks[0].attn.variant.gamma


def test_sigmoid_bias_rule() -> None:
    """b = -log n from the training context (their released config: -7.62 at n = 2048), or given directly."""
    model = GPT(ModelConfig(**{**TINY, "block_size": 2048}), {"name": "sigmoid"})
    assert model.blocks[0].attn.variant.bias == pytest.approx(-7.62, abs=5e-3)
    model = GPT(ModelConfig(**TINY), {"name": "sigmoid", "bias": -10.0, "context_length": 4096})
    assert model.blocks[0].attn.variant.bias == -10.0


def test_clipped_softmax_gamma_rule() -> None:
    assert gamma_of({"name": "clipped_softmax"}, 512) == pytest.approx(-12 / 512)  # their OPT: -0.0234
    assert gamma_of({"name": "clipped_softmax", "gamma": -0.025, "alpha": None}, 512) == -0.025  # their BERT


def expected_overhead(attention: dict, c: dict) -> int:
    """Extra parameters of a variant, from the papers' formulas."""
    _, o = resolve_options(attention)
    n_layer, h, d = c["n_layer"], c["n_head"], c["n_embd"]
    kv, dh = c.get("n_kv_head") or h, d // h
    heads = {"q": h, "k": kv, "v": kv}
    if o.name == "gated":
        r = dh // 4
        per_layer = {"linear": h * (dh + 1), "mlp": h * (dh * r + r + r + 1), "all_features": d * h + h}
        return n_layer * per_layer[o.gate_type]
    if o.name.startswith("gated_"):
        gates = 1 if o.share_across_heads else (kv if o.position in ("key", "value") else h)
        width = dh if o.granularity == "elementwise" else 1
        return n_layer * (d + o.gate_bias) * gates * width
    if o.name.startswith("fox"):
        shifts = (o.key_shift + o.value_shift) * d * kv  # Linear(d, KV) without bias each
        norms = o.qk_norm * (h + kv) * dh + o.output_norm * h * dh  # a weight per head and feature
        return n_layer * (h * (d + 1) + shifts + norms + o.output_gate * d * h * dh)  # forget gate Linear(d, H)
    if o.name == "diff":  # lambda_q1, lambda_k1, lambda_q2, lambda_k2, and the RMSNorm's weight of 2 d_h if affine
        return n_layer * (4 * dh + o.subln_affine * 2 * dh)
    if o.name == "temp_lookup":
        return n_layer * h * o.num_groups
    if o.name in ("sink", "softmax1"):
        return n_layer * h if o.sink_logit == "learned" else 0
    if o.name.startswith("qk_norm"):
        return n_layer * (2 * dh if o.scope == "head" else (h + kv) * dh)
    if o.name == "ssmax":
        return n_layer * h
    if not hasattr(o, "components"):
        return 0
    total = 0
    for component in o.components:
        n, out = heads[component], 1 if o.share_across_heads else heads[component]
        total += n * (("position" in o.terms) + ("constant" in o.terms))
        if "token" in o.terms:
            hidden = round(o.hidden_ratio * d)
            total += {"base": d * hidden + hidden + hidden * out + out, "shared": out * (dh + 1), "feature": out}[
                o.parameterisation
            ]
    return n_layer * total


OVERHEAD_CASES = [{"name": n} for n in available_attention()] + [
    {"name": "gated", "gate_type": "mlp"},
    {"name": "gated", "gate_type": "all_features"},
    {"name": "gated_value", "share_across_heads": True},
    {"name": "gated_sdpa", "position": "key", "granularity": "headwise"},
    {"name": "ssa", "share_across_heads": True, "components": ["k", "v"]},
    {"name": "ssa_shared", "share_across_heads": True},
    {"name": "ssa_feature", "components": ["q", "k", "v"]},
    {"name": "sink", "sink_logit": "fixed"},
    {"name": "qk_norm", "scope": "projection"},
    {"name": "fox", "key_shift": True, "output_norm": True},
    {"name": "diff", "subln_affine": False},
    {"name": "gated_sdpa", "gate_bias": False, "granularity": "headwise"},
]


@pytest.mark.parametrize("attention", OVERHEAD_CASES, ids=lambda a: "-".join(map(str, a.values())))
def test_parameter_overhead_matches_formula(attention: dict) -> None:
    config = {**TINY, "pos_encoding": "none"}  # every variant takes it (stick-breaking takes only it)
    model = GPT(ModelConfig(**config), attention)
    vanilla = GPT(ModelConfig(**config))
    extra = sum(p.numel() for _, p in model.variant_parameters())
    assert extra == model.num_parameters() - vanilla.num_parameters()  # all new parameters live in the variant
    assert extra == expected_overhead(attention, TINY)


def gpt2_overhead(attention: dict) -> tuple[int, float]:
    with torch.device("meta"):
        model = GPT(ModelConfig(**GPT2), attention)
        base = GPT(ModelConfig(**GPT2)).num_parameters()
    extra = sum(p.numel() for _, p in model.variant_parameters())
    assert extra == expected_overhead(attention, GPT2)
    return extra, extra / base


@pytest.mark.slow
def test_gpt2_124m_overheads() -> None:
    assert gpt2_overhead({"name": "gated"})[0] == 12 * 12 * (64 + 1)
    assert 0.045 < gpt2_overhead({"name": "ssa"})[1] < 0.055  # the paper's ~5%
    assert 0.055 < gpt2_overhead({"name": "ssa", "hidden_ratio": 0.5})[1] < 0.06  # the paper's ~5.8%
    assert gpt2_overhead({"name": "ssa_shared"})[1] < 0.005
    assert gpt2_overhead({"name": "ssa_feature"})[0] == 12 * 2 * 2 * 12  # beta + alpha per head, q and v
    assert gpt2_overhead({"name": "temp_frequency"})[0] == 12 * 12  # beta per head
    assert gpt2_overhead({"name": "sink"})[0] == gpt2_overhead({"name": "ssmax"})[0] == 12 * 12  # one per head
    assert gpt2_overhead({"name": "softmax1"})[0] == gpt2_overhead({"name": "softpick"})[0] == 0
    assert gpt2_overhead({"name": "qk_norm"})[0] == 12 * 2 * 64  # one d_h weight for q, one for k
    assert gpt2_overhead({"name": "qk_norm_projection"})[0] == 12 * 2 * 768
    assert gpt2_overhead({"name": "fox"})[0] == 12 * 12 * (768 + 1)  # forget gate Linear(d, H)
    assert gpt2_overhead({"name": "diff"})[0] == 12 * 6 * 64  # four lambda vectors of d_h, the norm's 2 d_h weight
    assert gpt2_overhead({"name": "diff", "subln_affine": False})[0] == 12 * 4 * 64


def test_old_temperature_lr_key_reads_as_variant_lr():
    """Checkpoints written before the rename still build: their ``temperature_lr`` is the variant's lr."""
    from attnlab.attention.base import resolve_options

    _, options = resolve_options({"name": "ssa", "temperature_lr": 0.01})
    assert options.variant_lr == 0.01
