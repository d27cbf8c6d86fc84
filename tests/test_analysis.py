"""Analysis metrics (seeds 000, 001, 002, 004) against hand computations on tiny models."""

from __future__ import annotations

import copy
import csv
import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from attnlab.attention.head_importance import head_importance, prune_heads_by_importance
from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.errors import ConfigError
from attnlab.eval.analysis import (
    activation_outliers,
    attention_sinks,
    attention_spikiness,
    format_summary,
    gate_statistics,
    kurtosis,
    mean_loss,
    pruning_curves,
    qk_operator_norms,
    run_analysis,
    sink_epsilon,
    sink_logits,
    spikiness,
    temperature_html,
    token_temperatures,
    w8a8_perplexity,
)
from attnlab.eval.analysis.common import attention_maps
from attnlab.eval.analysis.outliers import (
    ActivationQuantizer,
    describe_dimensions,
    install_activation_quantizers,
    mse_weight_range,
    quantization_damage,
    quantize_asymmetric,
    quantize_symmetric,
    quantize_weights_,
    upper_percentile,
    weight_targets,
)
from attnlab.eval.analysis.pruning import write_pruning_csv
from attnlab.eval.analysis.sinks import entropy_lines, row_entropy
from attnlab.models import GPT, ModelConfig
from attnlab.nn_utils import forward_hooks
from attnlab.training.module import LanguageModel
from attnlab.validation import OptimSpec

VOCAB, T = 61, 24


def tiny(attention: str = "vanilla", n_kv_head: int = 2, **options) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=32, block_size=32, vocab_size=VOCAB)
    return GPT(config, {"name": attention, **options}).eval()


def rows(n: int = 4, length: int = T, seed: int = 0) -> torch.Tensor:
    """Arithmetic sequences mod VOCAB with a random start: a pattern a tiny model learns in a few steps."""
    start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (start + 7 * torch.arange(length)) % VOCAB


@pytest.fixture(scope="module")
def trained() -> GPT:
    model = tiny().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(30):
        batch = rows(8, T + 1, seed=step + 100)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def no_hooks(model: GPT) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def force_attention_to_first_key(model: GPT) -> None:
    """Make every layer's reference path put all probability on key 0."""
    for block in model.blocks:
        block.attn.variant.probabilities = lambda scores: torch.zeros_like(scores).index_fill_(-1, torch.tensor(0), 1)


def make_attention_uniform(model: GPT) -> None:
    """q = 0, so every score is 0 and each causal row is uniform over its visible keys."""
    dq = model.config.n_head * model.config.head_dim
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:dq] = 0
            block.attn.qkv.bias[:dq] = 0


# ---------------------------------------------------------------- outliers


def test_kurtosis_of_gaussian_is_three_and_an_outlier_makes_it_large() -> None:
    gaussian = torch.randn(4, 200_000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(kurtosis(gaussian), torch.full((4,), 3.0, dtype=torch.float64), atol=0.05, rtol=0)
    x = np.random.default_rng(0).normal(size=10_000)
    x[17] = 1000.0
    hand = ((x - x.mean()) ** 4).mean() / x.var(ddof=1) ** 2  # the reference's torch.std: Bessel-corrected
    assert kurtosis(torch.tensor(x)[None], eps=0.0).item() == pytest.approx(hand, rel=1e-9)
    assert hand > 1000


def test_activation_outliers_hook_the_reference_modules_norms_included() -> None:
    model, batch = tiny(), rows()
    with torch.no_grad():
        model.norm_f.weight[3] = 50.0  # an outlier dimension scaled up by the final norm's gamma
    captured = {}
    names = ["blocks.1.mlp", "blocks.0.norm_2", "norm_f"]
    hooks = [(model.get_submodule(n), lambda _m, _a, out, n=n: captured.update({n: out})) for n in names]
    with torch.no_grad(), forward_hooks(hooks):
        model(batch)
    result = activation_outliers(model, [batch[:2], batch[2:]])
    assert no_hooks(model)
    per_block = ("", ".attn", ".mlp", ".norm_1", ".norm_2")
    assert set(result["modules"]) == {f"blocks.{i}{s}" for i in range(2) for s in per_block} | {"norm_f"}
    assert result["sequences"] == 4
    for name, output in captured.items():
        x = output.flatten(1).double().numpy()
        centred = x - x.mean(axis=1, keepdims=True)
        hand_kurtosis = ((centred**4).mean(axis=1) / (x.std(axis=1, ddof=1) ** 4 + 1e-6)).mean()
        assert result["modules"][name]["kurtosis"] == pytest.approx(hand_kurtosis, rel=1e-6)
        assert result["modules"][name]["max_inf_norm"] == pytest.approx(np.abs(x).max(axis=1).mean(), rel=1e-6)
    kurtoses = {name: m["kurtosis"] for name, m in result["modules"].items()}
    norms = {name: m["max_inf_norm"] for name, m in result["modules"].items()}
    assert result["kurtosis_max"] == kurtoses[result["kurtosis_max_module"]] == max(kurtoses.values())
    assert result["kurtosis_mean"] == pytest.approx(sum(kurtoses.values()) / 11)
    assert result["max_inf_norm"] == norms["norm_f"] == max(norms.values())
    assert result["max_inf_norm_module"] == "norm_f" and "norm_f" in result["hooked_modules"]
    for name, output in captured.items():  # each dimension's max |x| over every token of both batches
        per_dim = np.abs(output.double().numpy()).reshape(-1, output.shape[-1]).max(axis=0)
        assert result["modules"][name]["channel_ratio"] == pytest.approx(per_dim.max() / np.median(per_dim))
        assert result["modules"][name]["top_channels"] == np.argsort(-per_dim)[:3].tolist()
    assert result["modules"]["norm_f"]["top_channels"][0] == 3
    ratios = {name: m["channel_ratio"] for name, m in result["modules"].items()}
    assert result["channel_ratio_max"] == ratios["norm_f"] == max(ratios.values()) > 10
    assert result["channel_ratio_max_module"] == "norm_f"


def test_activation_outliers_name_the_dimension_that_tops_the_most_modules() -> None:
    """An outlier dimension shared by every norm (the paper's sec. 3: the same few dimensions in every layer) is
    found as the one that tops the most modules, counted over all of them; without it, no module's largest
    dimension is ten times its median."""
    model, batch = tiny(), rows()
    clean = activation_outliers(model, [batch])
    with torch.no_grad():
        for name in ("blocks.0.norm_1", "blocks.0.norm_2", "blocks.1.norm_1", "blocks.1.norm_2", "norm_f"):
            model.get_submodule(name).weight[5] = 40.0
    result = activation_outliers(model, [batch])
    tops = [m["top_channels"][0] for m in result["modules"].values()]
    assert result["outlier_dim"] == 5 and result["outlier_dim_modules"] == tops.count(5) >= 5
    assert clean["channel_ratio_max"] < 10 < result["channel_ratio_max"]
    (line,) = describe_dimensions(result)  # what evaluate.py prints; nothing for analyses that predate it
    assert f"dim 5 is the largest in {tops.count(5)} of 11 modules" in line
    assert describe_dimensions({"kurtosis_max": 3.0}) == []


def test_quantizers_follow_the_reference_grids() -> None:
    x = torch.tensor([-3.1, -1.1, 0.0, 0.26, 1.0, 2.4, 9.0])
    step = 2.0 / 3  # signed 3 bits: integers -4..3, step max(|-2|, 1.5) / 3
    torch.testing.assert_close(quantize_symmetric(x, -2.0, 1.5, 3), torch.tensor([-4.0, -2, 0, 0, 2, 3, 3]) * step)
    step = 1.5 / 7  # range from 0: unsigned 3 bits, integers 0..7
    torch.testing.assert_close(quantize_symmetric(x, 0.0, 1.5, 3), torch.tensor([0.0, 0, 0, 1, 5, 7, 7]) * step)
    x = torch.tensor([-5.0, 0.0, 0.2, 2.0, 9.0])
    step = 5.6 / 3  # asymmetric 2 bits on [-1.6, 4]: 4 levels, zero point round(1.6 / step) = 1
    torch.testing.assert_close(quantize_asymmetric(x, -1.6, 4.0, 2), torch.tensor([-1.0, 0, 0, 1, 2]) * step)
    step = 4.0 / 3  # a range above 0 is widened to include it: [0, 4], zero point 0
    torch.testing.assert_close(quantize_asymmetric(x, 0.5, 4.0, 2), torch.tensor([0.0, 0, 0, 2, 3]) * step)


@pytest.mark.parametrize("one_sided", [False, True])
def test_mse_weight_range_is_the_reference_grid_search(one_sided: bool) -> None:
    weight = 0.05 * torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    weight[3, 7] = 1.2  # an outlier the best range clips
    if one_sided:  # e.g. a norm's gamma: the unsigned grid, range [0, c]
        weight = weight.abs() + 0.5
    low, high = mse_weight_range(weight, bits=4)
    w = weight.double().numpy()
    qmin, qmax = (0, 15) if one_sided else (-8, 7)
    candidates = (np.abs(w).max() + 0.5) / 100 * np.arange(1, 101)  # (max|W| + margin 0.5) / 100 * i

    def squared_error(c: float) -> float:
        step = c / qmax
        return ((w - np.clip(np.round(w / step), qmin, qmax) * step) ** 2).sum()

    best = candidates[np.argmin([squared_error(c) for c in candidates])]
    assert (low, high) == pytest.approx((0.0 if one_sided else -best, best), rel=1e-6)
    assert high < weight.max().item()


def test_upper_percentile_is_numpys() -> None:
    x = torch.randn(3, 1001, generator=torch.Generator().manual_seed(0))
    for p in (99.999, 99.9, 90.0, 100.0):
        assert upper_percentile(x, p) == pytest.approx(np.percentile(x.double().numpy(), p), rel=1e-9)


def test_activation_quantizer_runs_the_range_and_quantizes_while_calibrating() -> None:
    quantizer = ActivationQuantizer(bits=2, momentum=0.9)
    first = quantizer(torch.tensor([-2.0, 3.0]))  # range [-2, 3]: step 5/3, zero point 1
    torch.testing.assert_close(first, torch.tensor([-1.0, 2.0]) * 5 / 3)
    quantizer(torch.tensor([2.0, 13.0]))
    assert (quantizer.low, quantizer.high) == pytest.approx((-1.6, 4.0))  # 0.9 first + 0.1 second
    quantizer.calibrating = False
    out = quantizer(torch.tensor([-5.0, 0.0, 0.2, 2.0, 9.0]))
    assert (quantizer.low, quantizer.high) == pytest.approx((-1.6, 4.0))
    torch.testing.assert_close(out, torch.tensor([-1.0, 0, 0, 1, 2]) * 5.6 / 3)
    x = torch.randn(4, 250, generator=torch.Generator().manual_seed(0))
    quantizer = ActivationQuantizer(bits=8, percentile=99.0)
    quantizer(x)
    assert (quantizer.low, quantizer.high) == pytest.approx(tuple(np.percentile(x.double().numpy(), (1.0, 99.0))))


def tiny_family(family: str) -> GPT:
    torch.manual_seed(0)
    extra = {"llama": {"pos_encoding": "rotary", "bias": False, "tie_embeddings": False, "intermediate_size": 64}}
    extra["neox"] = {"pos_encoding": "rotary", "parallel_residual": True}
    config = ModelConfig(
        family=family, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=32, vocab_size=VOCAB, **extra[family]
    )
    return GPT(config, {"name": "vanilla"}).eval()


class Recorder:
    """An activation 'quantizer' that records the shapes it sees and changes nothing."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return x


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_full_scope_quantizes_every_listed_point_once(family: str) -> None:
    model, batch = (tiny() if family == "gpt2" else tiny_family(family)), rows(2)
    with torch.no_grad():
        expected = model(batch)
    hooked = copy.deepcopy(model)
    points = install_activation_quantizers(hooked, "full", Recorder)
    with torch.no_grad():
        torch.testing.assert_close(hooked(batch), expected)  # identity quantizers: the reference path, same logits
    residual_sums = 2 if family == "neox" else 4  # parallel residual: one sum a block
    counts = {"embedding_sum": 1, "norm_output": 5, "q": 2, "k": 2, "v": 2, "scores": 2, "probabilities": 2}
    counts |= {"context": 2, "attention_output": 2, "residual_sum": residual_sums, "ffn_hidden": 2, "ffn_output": 2}
    assert Counter(kind for kind, _ in points) == counts
    b, t, d, h, kv, dh, width = 2, T, 32, 4, 2, 8, model.blocks[0].mlp.proj.in_features
    shapes = {"q": (b, t, h * dh), "k": (b, t, kv * dh), "v": (b, t, kv * dh), "ffn_hidden": (b, t, width)}
    shapes |= {"scores": (b, h, t, t), "probabilities": (b, h, t, t), "context": (b, h, t, dh)}
    for kind, recorder in points:
        assert [x.shape for x in recorder.seen] == [shapes.get(kind, (b, t, d))]
    by_kind = {kind: recorder.seen[0] for kind, recorder in points}  # the last layer's
    torch.testing.assert_close(by_kind["probabilities"].sum(-1), torch.ones(b, h, t))
    assert torch.isfinite(by_kind["scores"]).all()  # before the causal mask, as the reference
    assert by_kind["ffn_hidden"].min() > (-0.3 if family == "llama" else -0.2)  # after the GELU / SiLU gate
    weights = Counter(kind for kind, _ in weight_targets(model, "full"))
    embeddings = 2 if family == "gpt2" else 1  # learned positions are an embedding too
    linears = 2 * (7 if family == "llama" else 6)  # q, k, v, W_o, fc, (gate,) proj
    assert weights == {"embedding": embeddings, "norm_weight": 5, "linear_weight": linears}
    assert no_hooks(model) and all(block.attn.intermediate_hook is None for block in model.blocks)


def test_full_scope_leaves_variant_parameters_and_the_head_in_full_precision() -> None:
    model = tiny("gated_sdpa")
    assert Counter(kind for kind, _ in weight_targets(model, "linear")) == {"linear_weight": 2 * 7}  # gates too
    assert Counter(kind for kind, _ in weight_targets(model, "full"))["linear_weight"] == 2 * 6
    quantized = copy.deepcopy(model)
    quantize_weights_(quantized, "full", bits=4, method="mse")
    assert model.lm_head.weight is model.wte.weight and quantized.lm_head.weight is not quantized.wte.weight
    assert torch.equal(quantized.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(quantized.wte.weight, model.wte.weight)
    assert torch.equal(quantized.blocks[0].attn.variant.proj.weight, model.blocks[0].attn.variant.proj.weight)
    assert quantized.blocks[0].norm_1.weight.unique().numel() <= 16


def test_w8a8_perplexity_tracks_bits_and_leaves_the_model_alone(trained: GPT, monkeypatch) -> None:
    evaluation = [rows(4, T + 1, seed=1), rows(4, T + 1, seed=2)]
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    fp, first = math.exp(mean_loss(trained, evaluation)), evaluation[:1]
    # calibrated on the very batch it is evaluated on, with plain min-max: every activation falls inside its range
    # (the same rows batched differently need not: a matmul's last bits depend on the batch's shape on some CPUs)
    sixteen = w8a8_perplexity(trained, first, first, bits=16, percentile=None)
    assert sixteen["fp_perplexity"] == pytest.approx(math.exp(mean_loss(trained, first)), rel=1e-12)
    assert sixteen["quantized_perplexity"] == pytest.approx(sixteen["fp_perplexity"], rel=1e-5)
    observe, observed = ActivationQuantizer.observe, []
    monkeypatch.setattr(ActivationQuantizer, "observe", lambda self, x: observed.append(observe(self, x)))
    eight = w8a8_perplexity(trained, first, evaluation)
    monkeypatch.undo()
    assert len(observed) == 28  # each point saw the one calibration batch; its range stays frozen for the evaluation
    assert eight["quantized_perplexity"] != fp and math.isfinite(eight["quantized_perplexity"])
    settings = (eight["bits"], eight["quant_scope"], eight["weight_range"], eight["act_percentile"])
    assert settings == (8, "full", "mse", 99.999)
    assert (eight["quantized_weights"], eight["quantized_activations"], eight["calibration_sequences"]) == (19, 28, 4)
    assert sixteen["clipped_share_max"] == 0
    assert set(sixteen["damage"]) == set(sixteen["activations"])
    assert sixteen["step_over_median_max_at"] != "probabilities"
    assert 0 < sixteen["step_over_median_max"] < eight["step_over_median_max"]  # 256 times coarser, give or take
    assert w8a8_perplexity(trained, evaluation[:1], evaluation, bits=4)["quantized_perplexity"] > 1.03 * fp
    linear = w8a8_perplexity(trained, evaluation[:1], evaluation, bits=2, scope="linear", weight_method="minmax")
    assert linear["quantized_perplexity"] > 1.5 * fp
    assert (linear["quantized_weights"], linear["quantized_activations"]) == (12, 8)  # q, k, v, W_o, fc, proj a layer
    assert all(torch.equal(v, before[k]) for k, v in trained.state_dict().items())
    assert trained.lm_head.weight is trained.wte.weight
    assert no_hooks(trained) and all(block.attn.intermediate_hook is None for block in trained.blocks)
    with pytest.raises(ConfigError, match=r"analysis\.quant_scope"):
        w8a8_perplexity(trained, evaluation[:1], evaluation, scope="everything")


def test_a_frozen_range_counts_what_it_cuts_off_and_how_coarse_its_grid_is() -> None:
    """Outliers left out of a range are cut off; outliers inside it make the step large against the typical value."""
    narrow, wide = ActivationQuantizer(8), ActivationQuantizer(8)
    narrow.low, narrow.high, wide.low, wide.high = -1.0, 1.0, -5.0, 2000.0
    for quantizer in (narrow, wide):
        quantizer.calibrating = False
        quantizer(torch.tensor([-3.0, -0.5, 0.0, 0.25, 0.5, 2.0]))  # nonzero |x|: median 0.5
        quantizer(torch.tensor([0.0, 0.1, 0.1]))  # median 0.1: the coarsest batch
    assert (narrow.clipped, narrow.seen) == (2, 9) and (wide.clipped, wide.seen) == (0, 9)
    assert narrow.coarsest == pytest.approx(2 / 255 / 0.1) and wide.coarsest == pytest.approx(2005 / 255 / 0.1)
    calibrating = ActivationQuantizer(8)
    calibrating(torch.tensor([-3.0, 2.0]))
    assert calibrating.seen == 0  # while calibrating nothing is counted
    damage = quantization_damage([("residual_sum", narrow), ("residual_sum", wide), ("norm_output", wide)])
    assert damage["residual_sum"] == {"clipped_share": 2 / 18, "step_over_median": wide.coarsest}
    assert damage["norm_output"]["clipped_share"] == 0


def test_intermediate_hook_sees_the_variants_own_probabilities_and_is_identity_when_unset() -> None:
    model, batch = tiny("clipped_softmax", gamma=-0.05, alpha=None), rows(2)
    with torch.no_grad():
        fused = model(batch)
    seen = {}

    def keep(name: str, x: torch.Tensor) -> torch.Tensor:
        seen[name] = x
        return x

    model.blocks[1].attn.intermediate_hook = keep
    with torch.no_grad():
        torch.testing.assert_close(model(batch), fused)
        assert set(seen) == {"scores", "probabilities", "context"}
        probabilities = seen["probabilities"]
        assert (probabilities == 0).any() and (probabilities.sum(-1) - 1).abs().max() > 0.01  # clipped, not softmax
        model.blocks[1].attn.intermediate_hook = lambda name, x: torch.zeros_like(x) if name == "context" else x
        assert not torch.allclose(model(batch), fused)
        model.blocks[1].attn.intermediate_hook = None
        torch.testing.assert_close(model(batch), fused)


# ---------------------------------------------------------------- sinks and gates


def test_attention_entropy_of_forced_uniform_and_signed_attention() -> None:
    """Forced onto one key: entropy 0; uniform: log(keys seen) per query, 1 normalised; a signed (differential)
    or unnormalised (sigmoid, softpick) row is read as |weights| over their sum; an all-zero row is left out."""
    forced, batch = tiny(), rows(2)
    force_attention_to_first_key(forced)
    result = attention_sinks(forced, batch, skip=4)
    assert result["attention_entropy"] == pytest.approx(0.0, abs=1e-9)
    assert result["attention_entropy_normalized"] == pytest.approx(0.0, abs=1e-9)
    uniform = tiny()
    make_attention_uniform(uniform)
    result = attention_sinks(uniform, batch, skip=4)
    assert result["attention_entropy"] == pytest.approx(sum(math.log(t + 1) for t in range(4, T)) / (T - 4))
    assert result["attention_entropy_normalized"] == pytest.approx(1.0)
    # queries at positions 1, 2, 3 (seeing 2, 3, 4 keys): a signed row, an all-zero one, an unnormalised one
    signed = torch.tensor([[[[0.5, -0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.0, 0.0]]]])
    nats, normalised, counted = row_entropy(signed, first_query=1).tolist()
    assert counted == 2 and nats == pytest.approx(2 * math.log(2))
    assert normalised == pytest.approx(1.0 + math.log(2) / math.log(4))
    # the printout: no line for a record from before the entropy (the README's samples), a dash for all-zero maps
    assert entropy_lines({"first_token_share": [0.1]}) == []
    none = {"attention_entropy": None, "attention_entropy_normalized": None}
    assert entropy_lines(none) == ["  attention entropy       - (no row with any attention weight)"]


def hand_made_maps(sinking: dict[int, set[int]], on_first: float = 0.9, in_even_rows_only: int | None = None):
    """Per layer, a ``probabilities`` that ignores the scores: uniform causal rows, except the heads ``sinking[layer]``,
    whose rows put ``on_first`` on key 0 and spread the rest evenly over the other visible keys (query 0: all on key
    0); the head ``in_even_rows_only`` sinks in the even rows of a batch only."""

    def for_layer(layer: int):
        def probabilities(scores: torch.Tensor) -> torch.Tensor:
            rows, heads, t, _ = scores.shape
            causal = torch.ones(t, t).tril()
            uniform = causal / causal.sum(dim=-1, keepdim=True)
            rest = causal.clone()
            rest[:, 0] = 0
            sink = rest / rest.sum(dim=-1, keepdim=True).clamp_min(1) * (1 - on_first)
            sink[:, 0] = on_first
            sink[0, 0] = 1.0
            maps = uniform.expand(rows, heads, t, t).clone()
            for head in sinking.get(layer, set()):
                chosen = range(0, rows, 2) if head == in_even_rows_only else range(rows)
                maps[list(chosen), head] = sink
            return maps

        return probabilities

    return for_layer


def test_sink_epsilon_is_the_share_of_heads_whose_mean_first_token_attention_exceeds_eps() -> None:
    """Gu et al.'s Sink^eps on hand-made maps: 3 of 8 heads put 0.9 on the first key, so 3/8; a uniform head's mean
    is their mean over all T queries (query 0 included) of 1/(q + 1), under eps = 0.3 at T = 16; a head that sinks in
    half the windows counts half; only the first ``window`` tokens of a row are read, at most ``max_windows`` rows."""
    model, window = tiny(), 16
    make = hand_made_maps({0: {0}, 1: {2, 3}})
    for i, block in enumerate(model.blocks):
        block.attn.variant.probabilities = make(i)
    batch = rows(6, T)  # 24 tokens a row: the windows are the first 16
    result = sink_epsilon(model, batch, epsilon=0.3, window=window)
    assert result["sink_epsilon"] == pytest.approx(3 / 8) and result["windows"] == 6
    assert result["sink_epsilon_per_layer"] == pytest.approx([1 / 4, 2 / 4])
    uniform = sum(1 / (q + 1) for q in range(window)) / window
    sink = (1 + 0.9 * (window - 1)) / window
    first, second = result["first_token_share_per_head"]
    assert first == pytest.approx([sink, uniform, uniform, uniform])
    assert second == pytest.approx([uniform, uniform, sink, sink])
    assert result["sink_epsilon_per_head"] == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    # a head just under eps does not count; just over, it does (on_first is the mean's main term)
    for on_first, expected in ((0.2, 0.0), (0.35, 3 / 8)):
        make = hand_made_maps({0: {0}, 1: {2, 3}}, on_first=on_first)
        for i, block in enumerate(model.blocks):
            block.attn.variant.probabilities = make(i)
        assert sink_epsilon(model, batch, window=window)["sink_epsilon"] == pytest.approx(expected)
    # head 3 of layer 1 sinks in the even rows only: half its windows; at most 4 windows are read (2 of them even)
    make = hand_made_maps({0: {0}, 1: {2, 3}}, in_even_rows_only=3)
    for i, block in enumerate(model.blocks):
        block.attn.variant.probabilities = make(i)
    result = sink_epsilon(model, [batch[:4], batch[4:]], window=window, max_windows=4)
    assert result["windows"] == 4 and result["sink_epsilon_per_head"][1] == [0.0, 0.0, 1.0, 0.5]
    assert result["sink_epsilon"] == pytest.approx(2.5 / 8)
    with pytest.raises(ValueError, match="16 tokens"):
        sink_epsilon(model, batch[:, :12], window=window)
    assert all(not b.attn.record_probabilities and b.attn.probabilities is None for b in model.blocks)


def make_heads_dormant(model: GPT, on_first: float = -2.0, elsewhere: float = -12.0) -> None:
    """Hand-made scores of a head with nothing to read (Gu et al.'s and Guo et al.'s dormant head): every query scores
    every key low, the first key a little less low; the causal mask and each variant's own normalisation still run."""

    def scores(q: torch.Tensor, k: torch.Tensor, hook) -> torch.Tensor:
        made = torch.full((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), elsewhere)
        made[..., 0] = on_first
        return hook("scores", made)

    for block in model.blocks:
        block.attn.variant.scaled_scores = scores


@pytest.mark.parametrize(("attention", "expected"), [("vanilla", 1.0), ("sink", 0.0), ("sigmoid", 0.0)])
def test_a_dormant_head_sinks_on_the_first_token_only_where_its_row_must_sum_to_one(
    attention: str, expected: float
) -> None:
    """The controls of Gu et al. (their model-architecture experiments): the same dormant scores give softmax a
    first-token sink in every head (its rows must put their mass somewhere), while the learnable per-head key logit of
    ``sink`` (at its init, 0) takes the mass off the first token and unnormalised ``sigmoid`` attends to nothing:
    Sink^eps 1, 0, 0."""
    model = tiny(attention)
    make_heads_dormant(model)
    result = sink_epsilon(model, rows(4, T), window=16)
    assert result["sink_epsilon"] == expected
    shares = torch.tensor(result["first_token_share_per_head"])
    assert bool((shares > 0.9).all()) if expected else bool((shares < 0.15).all())


def test_first_token_share_of_forced_and_uniform_attention() -> None:
    forced, batch = tiny(), rows(2)
    force_attention_to_first_key(forced)
    assert attention_sinks(forced, batch, skip=4)["first_token_share"] == pytest.approx([1.0, 1.0])
    uniform = tiny()
    make_attention_uniform(uniform)
    result = attention_sinks(uniform, [batch[:1], batch[1:]], skip=4)
    hand = sum(1 / (t + 1) for t in range(4, T)) / (T - 4)
    assert result["first_token_share"] == pytest.approx([hand, hand], rel=1e-6)
    deep = sum(1 / (t + 1) for t in range(8, T)) / (T - 8)  # the phenomenon check's share: later layers, later queries
    assert attention_sinks(uniform, batch, skip=4, deep_skip=8)["sink_share"] == pytest.approx(deep, rel=1e-6)
    assert attention_sinks(forced, batch, skip=4, deep_skip=8)["sink_share"] == pytest.approx(1.0)
    assert all(not b.attn.record_probabilities and b.attn.probabilities is None for b in uniform.blocks)
    assert no_hooks(uniform)
    with torch.no_grad():
        handle = uniform.blocks[1].register_forward_hook(lambda m, a, out: setattr(m, "seen", out.abs().max()))
        uniform(batch)
        handle.remove()
    assert result["max_activation"][1] == pytest.approx(uniform.blocks[1].seen.item(), rel=1e-6)


@pytest.mark.parametrize(("attention", "value"), [("gated_sdpa", 0.2), ("gated_sdpa_headwise", 0.7), ("gated", 0.3)])
def test_gate_statistics_of_constant_gates(attention: str, value: float) -> None:
    model = tiny(attention)
    with torch.no_grad():
        for block in model.blocks:
            variant = block.attn.variant
            weight, bias = (
                (variant.proj.weight, variant.proj.bias) if hasattr(variant, "proj") else (variant.weight, variant.bias)
            )
            weight.zero_()
            bias.fill_(math.log(value / (1 - value)))
    result = gate_statistics(model, rows(), bins=10)
    assert result["mean"] == pytest.approx(value, rel=1e-5)
    for layer in result["layers"]:
        assert layer["histogram"][int(value * 10)] == sum(layer["histogram"]) > 0
    assert no_hooks(model)
    assert gate_statistics(tiny(), rows()) is None


def test_gate_mean_matches_the_gate_computed_by_hand() -> None:
    model, batch = tiny("gated_sdpa"), rows()
    inputs = {}
    handle = model.blocks[0].attn.register_forward_pre_hook(lambda m, args: inputs.update(x=args[0]))
    with torch.no_grad():
        model(batch)
        handle.remove()
        proj = model.blocks[0].attn.variant.proj
        hand = torch.sigmoid(inputs["x"] @ proj.weight.T + proj.bias).mean().item()
    assert gate_statistics(model, batch)["layers"][0]["mean"] == pytest.approx(hand, rel=1e-5)


@pytest.mark.parametrize("attention", ["sink", "softmax1"])
def test_sink_logits_and_the_share_the_sink_takes_match_the_dropped_softmax_column(attention: str) -> None:
    model, batch = tiny(attention), rows()
    learned = attention == "sink"
    if learned:
        with torch.no_grad():
            for i, block in enumerate(model.blocks):
                block.attn.variant.sinks.copy_(torch.tensor([-1.0, 0.0, 1.5, 3.0]) + i)
    dropped = {}

    def add(i: int, probabilities: torch.Tensor) -> None:
        dropped[i] = (1 - probabilities.double().sum(dim=-1)).transpose(0, 1).flatten(1).mean(dim=1)

    with torch.no_grad(), attention_maps(model, add):
        model(batch)
    result = sink_logits(model, batch)
    for i, layer in enumerate(result["layers"]):
        expected = [-1.0 + i, i, 1.5 + i, 3.0 + i] if learned else [0.0] * 4
        assert layer["logits"] == pytest.approx(expected)
        assert layer["mass_per_head"] == pytest.approx(dropped[i].tolist(), rel=1e-5)
    if learned:  # a larger sink logit takes more of every row
        assert result["layers"][0]["mass_per_head"] == sorted(result["layers"][0]["mass_per_head"])
    assert result["sink_logit_mean"] == pytest.approx(0.875 + 0.5 if learned else 0.0)
    assert result["sink_mass"] == pytest.approx(torch.stack(list(dropped.values())).mean().item(), rel=1e-5)
    assert no_hooks(model)
    assert sink_logits(tiny(), batch) is None


# ---------------------------------------------------------------- selective attention


def test_spikiness_of_hand_rows() -> None:
    maps = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    hand = torch.tensor([1.0, 1 / (0.5 * 2), 1 / ((0.04 + 0.09 + 0.25) * 3)], dtype=torch.float64)
    torch.testing.assert_close(spikiness(maps), hand)
    one_hot = torch.eye(5)
    torch.testing.assert_close(spikiness(one_hot), 1 / torch.arange(1, 6, dtype=torch.float64))


def test_model_spikiness_uniform_forced_and_token_budget() -> None:
    uniform = tiny()
    make_attention_uniform(uniform)
    result = attention_spikiness(uniform, [rows(2), rows(2, seed=1)], max_tokens=60)
    assert result["tokens"] == 60  # two whole rows of 24, then 12 tokens of the third
    assert result["layers"] == pytest.approx([1.0, 1.0], rel=1e-6)  # fp32 maps
    forced = tiny()
    force_attention_to_first_key(forced)
    hand = sum(1 / (t + 1) for t in range(T)) / T
    assert attention_spikiness(forced, rows(3))["mean"] == pytest.approx(hand, rel=1e-9)
    assert all(not b.attn.record_probabilities for b in forced.blocks)
    assert no_hooks(forced)


def test_operator_norm_pairs_each_query_head_with_its_kv_head() -> None:
    model = tiny(n_kv_head=2)
    result = qk_operator_norms(model)
    dh = model.config.head_dim
    for layer, block in enumerate(model.blocks):
        weight = block.attn.qkv.weight.detach().double()
        for h in range(4):
            w_q = weight[h * dh : (h + 1) * dh]
            w_k = weight[4 * dh + (h // 2) * dh : 4 * dh + (h // 2 + 1) * dh]
            hand = torch.linalg.matrix_norm(w_q.T @ w_k, ord=2).item()
            assert result["heads"][layer][h] == pytest.approx(hand, rel=1e-9)
    assert result["layers"][1] == pytest.approx(sum(result["heads"][1]) / 4)


def test_token_temperatures_match_the_ssa_formula() -> None:
    model, batch = tiny("ssa"), rows(2)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.blocks[1].attn.variant.parameters():
            p.normal_(0, 0.5)
    inputs = {}
    handle = model.blocks[1].attn.register_forward_pre_hook(lambda m, args: inputs.update(x=args[0]))
    taus = token_temperatures(model, batch)
    handle.remove()
    tq = model.blocks[1].attn.variant.temperatures["q"]
    with torch.no_grad():
        token = torch.tanh(tq.out(F.gelu(tq.hidden(inputs["x"]))))  # (B, T, H)
        position = torch.sigmoid(tq.alpha) * torch.log(torch.arange(1, T + 1.0))[:, None]  # (T, H)
        hand = (1 + token + position).mean(-1)
    assert taus.shape == (2, 2, T)
    torch.testing.assert_close(taus[1], hand)
    yarn = token_temperatures(tiny("temp_yarn"), batch)
    torch.testing.assert_close(yarn, (1 + 0.1 * torch.log(torch.arange(1, T + 1.0))).expand(2, 2, T))
    assert token_temperatures(tiny(), batch).isnan().all()


def test_temperature_html_escapes_text_and_is_darker_for_lower_values() -> None:
    page = temperature_html(["low", "<mid>", "high"], [1.0, 2.0, 3.0], "tau")
    assert "&lt;mid&gt;" in page and "<mid>" not in page

    def luminance(piece: str) -> float:
        colour = page.split(f">{piece}</span>")[0].rsplit("background:#", 1)[1][:6]
        r, g, b = (int(colour[i : i + 2], 16) for i in (0, 2, 4))
        return 0.299 * r + 0.587 * g + 0.114 * b

    assert luminance("low") < luminance("&lt;mid&gt;") < luminance("high")


# ---------------------------------------------------------------- head pruning


def test_pruning_curves_follow_importance_and_restore_the_mask(tmp_path: Path) -> None:
    model, evaluation = tiny(), [rows(4, T + 1, seed=1)]
    original = torch.tensor([[1.0, 0, 1, 1], [1, 1, 1, 1]])
    model.set_head_mask(original)
    fractions = [0.0, 0.25, 0.5]
    curves = pruning_curves(model, evaluation, fractions, seed=3, random_orders=2)
    assert torch.equal(model.head_mask(), original)
    assert no_hooks(model)
    model.set_head_mask(torch.ones(2, 4))
    assert curves["rows"][0]["loss"] == pytest.approx(mean_loss(model, evaluation), rel=1e-9)
    importance = head_importance(model, evaluation)
    torch.testing.assert_close(torch.tensor(curves["importance"]), importance)
    least = importance.flatten().argsort()[:4]
    kept = torch.ones(8)
    kept[least] = 0
    half = next(r for r in curves["rows"] if r["order"] == "importance" and r["fraction"] == 0.5)
    assert half["heads_kept_per_layer"] == kept.view(2, 4).sum(1).int().tolist()
    model.set_head_mask(kept.view(2, 4))
    assert half["loss"] == pytest.approx(mean_loss(model, evaluation), rel=1e-9)
    orders = [("importance", 0), ("random", 0), ("random", 1)]
    assert [(r["order"], r["repeat"], r["fraction"], r["heads_pruned"]) for r in curves["rows"]] == [
        (order, repeat, f, round(8 * f)) for order, repeat in orders for f in fractions
    ]
    random_half = [r["perplexity"] for r in curves["rows"] if r["order"] == "random" and r["fraction"] == 0.5]
    assert curves["pruned50_importance_ppl"] == half["perplexity"]
    assert curves["pruned50_random_ppl"] == pytest.approx(sum(random_half) / 2)
    write_pruning_csv(curves, tmp_path / "pruning.csv")
    with (tmp_path / "pruning.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 9 and float(table[7]["perplexity"]) == pytest.approx(curves["rows"][7]["perplexity"])
    assert table[2]["heads_kept_per_layer"] == " ".join(map(str, half["heads_kept_per_layer"]))
    assert table[7]["repeat"] == "1"


def test_pruning_curves_recompute_importance_under_the_current_mask() -> None:
    """Michel et al.'s iterative variant: after each step the importance is scored again with the pruned heads off."""
    model, evaluation = tiny(), [rows(4, T + 1, seed=1)]
    fractions = [0.0, 0.25, 0.5]
    curve = pruning_curves(model, evaluation, fractions, recompute_importance=True)["rows"][:3]
    mask = torch.ones(2, 4)
    for row, fraction in zip(curve, fractions, strict=True):
        model.set_head_mask(mask)
        mask = prune_heads_by_importance(head_importance(model, evaluation), round(8 * fraction), mask)
        model.set_head_mask(mask)
        assert row["heads_kept_per_layer"] == mask.sum(1).int().tolist()
        assert row["loss"] == pytest.approx(mean_loss(model, evaluation), rel=1e-9)


def test_random_order_is_seeded() -> None:
    model, evaluation = tiny(), [rows(2, T + 1)]
    first = pruning_curves(model, evaluation, [0.0, 0.5], seed=0, random_orders=3)["rows"]
    again = pruning_curves(model, evaluation, [0.0, 0.5], seed=0, random_orders=3)["rows"]
    assert first == again
    halves = [r["heads_kept_per_layer"] for r in first if r["order"] == "random" and r["fraction"] == 0.5]
    other = [pruning_curves(model, evaluation, [0.0, 0.5], seed=s, random_orders=1)["rows"][3] for s in (1, 2, 3)]
    assert any(row["heads_kept_per_layer"] != first[3]["heads_kept_per_layer"] for row in other)
    assert len(halves) == 3


# ---------------------------------------------------------------- run_analysis


@pytest.fixture(scope="module")
def tokenizer():
    text = "the cat sat on the mat. " * 40 + "attention sinks and gates, selective temperatures. " * 20
    return train_bpe_tokenizer([text], 300), text


@pytest.mark.parametrize("attention", ["vanilla", "ssa", "gated_sdpa", "sink"])
def test_run_analysis_writes_every_applicable_file(attention: str, tokenizer, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="attnlab.eval.analysis")
    tok, text = tokenizer
    config = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=tok.get_vocab_size())
    torch.manual_seed(0)
    module = LanguageModel(GPT(config, {"name": attention}), OptimSpec(), schedule_steps=1, run_record={})
    cfg = {"texts": [text, text[:200]], "max_tokens": 50, "eval_max_tokens": 160, "batch_size": 8, "prune_step": 0.5}
    cfg["calibration_tokens"] = torch.arange(100) % 50  # a stream longer than the context: cut into rows
    result = run_analysis(module, tok, tmp_path, cfg)
    files = {p.name for p in tmp_path.iterdir()}
    expected = {"analysis.json", "pruning.csv", "pruning.png"} | (
        {"temperatures.html", "temperatures.png"} if attention == "ssa" else set()
    )
    assert files == expected == set(result["files"])
    saved = json.loads((tmp_path / "analysis.json").read_text())
    assert saved["summary"] == pytest.approx(result["summary"])
    assert saved["summary"]["eval_tokens"] == 160 and saved["summary"]["map_tokens"] == 50
    assert ("gates" in saved) == (attention == "gated_sdpa")
    assert ("temperature_mean" in saved["summary"]) == (attention == "ssa")
    assert [r["fraction"] for r in saved["pruning"]["rows"]] == [0.0, 0.5] * (1 + 5)  # importance, 5 random orders
    assert saved["summary"]["pruned50_random_ppl"] > 1 and saved["summary"]["pruned50_importance_ppl"] > 1
    assert math.isfinite(saved["summary"]["w8a8_perplexity"])
    assert saved["w8a8"]["calibration"] == "calibration_tokens" and saved["w8a8"]["quant_scope"] == "full"
    assert all(not b.attn.record_probabilities and b.attn.probabilities is None for b in module.model.blocks)
    assert no_hooks(module.model)
    printed = format_summary(result)
    assert "perplexity" in printed and "heads kept per layer" in printed
    # progress: eval=analysis once printed nothing for 8 minutes
    progress = [r.getMessage() for r in caplog.records if r.name.startswith("attnlab.eval.analysis")]
    assert any(m.startswith("analysis: pruning (") for m in progress) and any("done in" in m for m in progress)
    assert sum(m.startswith("pruning: ") for m in progress) == 6  # one line per order
    assert ("gate value" in printed) == (attention == "gated_sdpa")
    assert ("attention to the sink" in printed) == ("sink_mass" in saved["summary"]) == (attention == "sink")
    if attention == "sink":  # learned logits start at 0
        assert saved["summary"]["sink_logit_mean"] == saved["summary"]["sink_logit_max"] == 0.0
        assert 0 < saved["summary"]["sink_mass"] < 1


def test_sink_epsilon_runs_where_rows_hold_its_window_and_draws_the_heads(tokenizer, tmp_path: Path) -> None:
    """``sink_epsilon`` in ``run_analysis``: on 64-token rows its headline, section, printout line and the per-head
    figure; on a model whose context is shorter than the window it is left out (another T is another metric)."""
    tok, text = tokenizer
    cfg = {"texts": [text], "eval_max_tokens": 640, "metrics": ["sink_epsilon"], "sink_windows": 6}
    for block_size, runs in ((64, True), (32, False)):
        config = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=block_size, vocab_size=tok.get_vocab_size())
        torch.manual_seed(0)
        out = tmp_path / str(block_size)
        result = run_analysis(GPT(config, {"name": "vanilla"}), tok, out, cfg)
        assert ("sink_epsilon" in result["summary"]) == runs and ("sink_heads.png" in result["files"]) == runs
        assert (out / "sink_heads.png").exists() == runs and ("Sink^eps" in format_summary(result)) == runs
    assert result is not None and "sink_epsilon" not in result
    saved = json.loads((tmp_path / "64" / "analysis.json").read_text())
    assert saved["sink_epsilon"]["windows"] == 6 and len(saved["sink_epsilon"]["sink_epsilon_per_head"]) == 2


def test_w8a8_metric_says_which_rows_it_calibrated_on(tokenizer, tmp_path: Path) -> None:
    cfg = {"eval_tokens": rows(4, T).flatten(), "metrics": ["w8a8"], "batch_size": 2, "seq_len": T}
    evaluation = run_analysis(tiny(), tokenizer[0], tmp_path, cfg)
    assert evaluation["w8a8"]["calibration"] == "evaluation_batches"
    assert evaluation["w8a8"]["calibration_sequences"] == 4  # the two evaluation batches (calibration_batches 4)
    printed = format_summary(evaluation)
    assert "calibrated on evaluation batches" in printed
    assert f"clipped share up to {evaluation['w8a8']['clipped_share_max']:.2g}" in printed
    del evaluation["w8a8"]["clipped_share_max"]  # as in results recorded before the damage counts
    assert "W8A8 perplexity" in format_summary(evaluation) and "damage" not in format_summary(evaluation)
    cfg |= {"calibration_tokens": rows(8, T, seed=5).flatten(), "calibration_batches": 3}
    training = run_analysis(tiny(), tokenizer[0], tmp_path, cfg)
    assert training["w8a8"]["calibration"] == "calibration_tokens"
    assert training["w8a8"]["calibration_sequences"] == 6  # three batches of two rows
    assert training["w8a8"]["quantized_perplexity"] != evaluation["w8a8"]["quantized_perplexity"]
    with pytest.raises(ConfigError, match=r"analysis\.quant_scope"):
        run_analysis(tiny(), tokenizer[0], tmp_path, cfg | {"quant_scope": "all"})


def test_run_analysis_rejects_unknown_options_and_missing_text(tokenizer, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"analysis\.max_token"):
        run_analysis(tiny(), tokenizer[0], tmp_path, {"texts": "a b", "max_token": 10})
    with pytest.raises(ConfigError, match="eval_tokens"):
        run_analysis(tiny(), tokenizer[0], tmp_path, {})


def validated(
    model: GPT, monitor: Callback, rows: list[torch.Tensor], reads: Callable = lambda row: row[:, :-1]
) -> dict:
    """What ``monitor`` logs over a validation loop of ``rows`` (the model reads ``reads(row)``, as the loop does)."""
    from types import SimpleNamespace

    logged: dict[str, float] = {}
    module = SimpleNamespace(model=model, log_dict=lambda values, **_: logged.update(values))
    trainer = SimpleNamespace(sanity_checking=False)
    monitor.on_validation_epoch_start(trainer, module)
    with torch.no_grad():
        for index, row in enumerate(rows):
            monitor.on_validation_batch_start(trainer, module, {"input_ids": row}, index)
            model(reads(row))
            monitor.on_validation_batch_end(trainer, module, None, {"input_ids": row}, index)
    monitor.on_validation_epoch_end(trainer, module)
    return logged


def test_the_outlier_monitor_reads_the_validation_forwards_of_its_first_batches() -> None:
    """The callback hooks the loop's own forwards (no extra forward, so FSDP's wrappers and the precision context
    apply): what it logs equals ``activation_outliers`` on the same first batches, and later batches are not read."""

    from attnlab.eval.analysis.monitor import OutlierMonitor

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=16), {"name": "vanilla"}).eval()
    batches = [torch.randint(0, 61, (3, 16)) for _ in range(4)]
    logged = validated(model, OutlierMonitor(batches=2), batches, reads=lambda batch: batch)
    expected = activation_outliers(model, batches[:2])
    assert logged == pytest.approx({f"outliers/{key}": expected[key] for key in OutlierMonitor.LOGGED})
    assert not any(getattr(m, "_forward_hooks", None) for m in model.modules())  # every hook removed


def test_the_outlier_monitor_logs_sink_epsilon_on_rows_as_long_as_its_window() -> None:
    """Rows of at least Gu et al.'s 64 tokens: ``sinks/sink_epsilon`` and one line per layer, ``sink_epsilon`` of the
    monitored inputs; shorter rows log none (the window would be another metric)."""

    from attnlab.eval.analysis.monitor import OutlierMonitor

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=64), {"name": "vanilla"}).eval()
    make = hand_made_maps({1: {0}})
    model.blocks[1].attn.variant.probabilities = make(1)  # one head of four sinks
    rows = [torch.randint(0, 61, (3, 65)) for _ in range(3)]
    logged = validated(model, OutlierMonitor(batches=2, sinks=True), rows)
    expected = sink_epsilon(model, [row[:, :-1] for row in rows[:2]])
    assert logged["sinks/sink_epsilon"] == pytest.approx(expected["sink_epsilon"]) == pytest.approx(1 / 4)
    assert [logged[f"sinks/sink_epsilon_layer{i}"] for i in range(2)] == pytest.approx([0.0, 0.5])
    short = validated(model, OutlierMonitor(batches=2, sinks=True), [row[:, :21] for row in rows])
    assert "sinks/sink_share" in short and "sinks/sink_epsilon" not in short


def test_the_outlier_monitor_logs_the_sink_share_of_the_same_batches_when_asked() -> None:
    """``sinks=True``: the first-token shares and the normalised attention entropy of ``attention_sinks`` on the
    monitored batches' inputs (all but the last token of each validation row), beside the outlier statistics; later
    batches are not read."""

    from attnlab.eval.analysis.monitor import OutlierMonitor

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=24), {"name": "vanilla"}).eval()
    rows = [torch.randint(0, 61, (3, 21)) for _ in range(3)]  # 21 tokens: the model reads 20
    logged = validated(model, OutlierMonitor(batches=2, sinks=True), rows)
    expected = attention_sinks(model, [row[:, :-1] for row in rows[:2]])
    assert logged["sinks/first_token_share"] == pytest.approx(expected["first_token_share_mean"])
    assert logged["sinks/sink_share"] == pytest.approx(expected["sink_share"])
    entropy = expected["attention_entropy_normalized"]
    assert logged["sinks/attention_entropy_normalized"] == pytest.approx(entropy) and 0 < entropy < 1
    # sink_share: layers after the first, queries at positions >= 16 (4 of 20 per row)
    assert expected["sink_share"] == pytest.approx(expected["sink_share_per_layer"][1])
    assert "outliers/kurtosis_max" in logged
    assert not OutlierMonitor(batches=2).sinks


def test_the_token_temperature_spread_is_zero_at_init_and_reads_only_the_token_term() -> None:
    """Per position, the std over sequences of tau: the base and the position term are the same for every sequence
    at a position, so a freshly built SSA model (token term's last layer at zero) gives exactly 0, and a token
    function that has moved gives more; the monitor logs it for temperature models only."""

    from attnlab.eval.analysis.monitor import OutlierMonitor
    from attnlab.eval.analysis.selectivity import token_temperature_spread

    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=24)
    model = GPT(config, {"name": "ssa"}).eval()
    batches = [torch.randint(0, 61, (3, 20)) for _ in range(2)]
    assert token_temperature_spread(model, batches) == 0.0
    with torch.no_grad():
        for block in model.blocks:
            block.attn.variant.temperatures["q"].out.weight.normal_(0, 1.0)
    moved = token_temperature_spread(model, batches)
    assert moved is not None and moved > 0.05
    assert token_temperature_spread(model, [b[:1] for b in batches]) is None  # one sequence: no spread to read
    assert token_temperature_spread(GPT(config, {"name": "vanilla"}), batches) is None

    logged = validated(model, OutlierMonitor(batches=2), list(torch.randint(0, 61, (3, 3, 21))))
    assert logged["temperatures/token_spread"] > 0 and "sinks/sink_share" not in logged
