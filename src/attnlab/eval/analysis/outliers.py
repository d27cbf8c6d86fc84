"""Outliers and quantisability (Bondarenko et al. 2023): kurtosis, max infinity norm, W8A8 perplexity.

Attention heads that learn to "do nothing" push a few hidden dimensions to huge values; those outliers show up
as high kurtosis and infinity norm of the layer outputs and make 8-bit activation quantisation fail.

Every detail follows the paper's code, Qualcomm-AI-research/outlier-free-transformers (cited below as "reference"):
the statistics as in ``validate_clm.py``, W8A8 as ``validate_clm.py --quantize`` sets it up
(``transformers_language/models/quantized_opt.py`` for where it quantises, ``quantization/`` for how).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import require, require_choice
from attnlab.eval.analysis.common import (
    AnalysisInputs,
    Tokens,
    as_batches,
    device_of,
    evaluating,
    perplexity,
    register_metric,
    unwrap,
)
from attnlab.models.gpt import GPT
from attnlab.nn_utils import forward_hooks

# ---------------------------------------------------------------- kurtosis and infinity norm


def kurtosis(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Kurtosis of each row of ``x`` (N, M): mean((x - mu)^4) / (std^4 + eps); not excess, a Gaussian gives 3.

    As the reference's ``transformers_language/utils.py::kurtosis``: ``std`` is ``torch.std`` (Bessel-corrected,
    n - 1), the fourth moment a plain mean; ``eps`` damps the value when std is below ~0.03 (untrained tiny models).
    """
    x = x.double()
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred.pow(4).mean(dim=-1) / (x.std(dim=-1).pow(4) + eps)


HOOKED_MODULES = "norm_1, attn (after W_o), norm_2, mlp (FFN output), block output (residual sum) per block; norm_f"


def hooked_outputs(model: nn.Module) -> dict[str, nn.Module]:
    """The reference's modules (``validate_clm.py``'s ACT_KEYS), by name: per block the pre-attention norm, the
    attention output (after W_o), the pre-FFN norm, the FFN output and the block output (residual sum); then the
    final norm. The reference's headline infinity norm usually comes from a norm output (its gamma scales up the
    outlier dimensions)."""
    model = unwrap(model)
    modules: dict[str, nn.Module] = {}
    for i, block in enumerate(model.blocks):
        modules.update(
            {
                f"blocks.{i}.norm_1": block.norm_1,
                f"blocks.{i}.attn": block.attn,
                f"blocks.{i}.norm_2": block.norm_2,
                f"blocks.{i}.mlp": block.mlp,
                f"blocks.{i}": block,
            }
        )
    modules["norm_f"] = model.norm_f
    return modules


TOP_CHANNELS = 3  # the hidden dimensions named per module, largest max |x| first


class OutlierStatistics:
    """Per hooked module, running sums of each sequence's kurtosis and max |x| over its flattened (T*d) output, and
    each hidden dimension's max |x| over every token: fed by forward hooks, so the forwards can be anyone's
    (``activation_outliers``'s own, or the validation loop's under ``callbacks.outlier_monitor``, inside the
    strategy's wrappers and precision). The per-dimension maxima say whether a few dimensions set a module's range,
    the outlier dimensions the paper finds (sec. 3), which a per-tensor 8-bit grid pays for on every value."""

    def __init__(self, model: nn.Module, eps: float = 1e-6) -> None:
        self.modules = hooked_outputs(model)
        self.eps = eps
        self.sums = {name: torch.zeros(3, dtype=torch.float64) for name in self.modules}  # kurtosis, inf norm, rows
        self.channel_max: dict[str, Tensor] = {}  # module -> (d,) max |x| per hidden dimension

    @property
    def sequences(self) -> int:
        """Sequences recorded so far (every hooked module sees each one)."""
        return int(next(iter(self.sums.values()))[2])

    def hooks(self) -> list[tuple[nn.Module, Callable[..., None]]]:
        return [(module, self._recorder(name)) for name, module in self.modules.items()]

    def _recorder(self, name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> None:
            rows = output.detach().flatten(1)
            kurt, inf = kurtosis(rows, self.eps).sum(), rows.abs().amax(dim=1).double().sum()
            self.sums[name] += torch.stack([kurt, inf, torch.tensor(rows.shape[0], device=kurt.device)]).cpu()
            channels = torch.linalg.vector_norm(output.detach().flatten(0, -2), ord=math.inf, dim=0).double().cpu()
            seen = self.channel_max.get(name)
            self.channel_max[name] = channels if seen is None else torch.maximum(seen, channels)

        return hook

    def summary(self) -> dict[str, Any]:
        """Each module's means over sequences and its dimensions' spread; then the max and mean over modules (the
        seed's table reports the max infinity norm and the mean kurtosis), which module gave each max, and the
        dimension that tops the most modules."""
        per_module = {
            name: {"kurtosis": (s[0] / s[2]).item(), "max_inf_norm": (s[1] / s[2]).item()}
            | channel_spread(self.channel_max[name])
            for name, s in self.sums.items()
        }
        kurt = {name: m["kurtosis"] for name, m in per_module.items()}
        norm = {name: m["max_inf_norm"] for name, m in per_module.items()}
        ratio = {name: m["channel_ratio"] for name, m in per_module.items()}
        tops = Counter(m["top_channels"][0] for m in per_module.values())
        outlier_dim, modules_topped = tops.most_common(1)[0]
        return {
            "modules": per_module,
            "hooked_modules": HOOKED_MODULES,
            "kurtosis_max": max(kurt.values()),
            "kurtosis_max_module": max(kurt, key=kurt.get),
            "kurtosis_mean": sum(kurt.values()) / len(kurt),
            "max_inf_norm": max(norm.values()),
            "max_inf_norm_module": max(norm, key=norm.get),
            "inf_norm_mean": sum(norm.values()) / len(norm),
            "channel_ratio_max": max(ratio.values()),
            "channel_ratio_max_module": max(ratio, key=ratio.get),
            "outlier_dim": outlier_dim,
            "outlier_dim_modules": modules_topped,  # of len(modules): how many modules this dimension tops
            "sequences": self.sequences,
        }


def channel_spread(channel_max: Tensor) -> dict[str, Any]:
    """One module's hidden dimensions by their max |x|: the largest over the median (a few when no dimension stands
    out; outlier dimensions make it tens or more) and the ``TOP_CHANNELS`` largest dimensions' indices."""
    top = channel_max.topk(min(TOP_CHANNELS, channel_max.numel())).indices
    ratio = channel_max[top[0]] / channel_max.quantile(0.5).clamp_min(torch.finfo(channel_max.dtype).tiny)
    return {"channel_ratio": ratio.item(), "top_channels": top.tolist()}


@torch.no_grad()
def activation_outliers(model: nn.Module, tokens: Tokens, eps: float = 1e-6) -> dict[str, Any]:
    """``OutlierStatistics`` of the model's forwards over ``tokens``, in eval mode."""
    model = unwrap(model)
    statistics = OutlierStatistics(model, eps)
    with evaluating(model), forward_hooks(statistics.hooks()):
        for batch in as_batches(tokens, device_of(model)):
            model(batch)
    return statistics.summary()


# ---------------------------------------------------------------- quantisers (reference: quantization/)

EPS = 1e-8  # the reference quantizers' floor on the step and on the top of a range


def fake_quantize(x: Tensor, scale: float | Tensor, zero_point: float, qmin: int, qmax: int) -> Tensor:
    """Round to the integer grid, clamp to [qmin, qmax] after the zero-point offset, and map back."""
    return (torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale


def quantize_symmetric(x: Tensor, low: float, high: float, bits: int) -> Tensor:
    """Reference ``SymmetricUniformQuantizer`` with range [low, high] (widened to include 0): step
    max(|low|, high) / qmax on a signed grid [-2^(b-1), 2^(b-1) - 1] when low < 0, else on [0, 2^b - 1]."""
    low, high = min(low, 0.0), max(high, EPS)
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if low < 0 else (0, 2**bits - 1)
    return fake_quantize(x, max(max(-low, high) / qmax, EPS), 0.0, qmin, qmax)


def quantize_asymmetric(x: Tensor, low: float, high: float, bits: int) -> Tensor:
    """Reference ``AsymmetricUniformQuantizer`` with range [low, high] (widened to include 0, so 0 is exact): step
    (high - low) / (2^b - 1), integer zero point round(-low / step)."""
    low, high = min(low, 0.0), max(high, EPS)
    qmax = 2**bits - 1
    scale = (high - low) / qmax
    zero_point = min(max(round(-low / scale), 0), qmax)
    return fake_quantize(x, max(scale, EPS), zero_point, 0, qmax)


def mse_weight_range(weight: Tensor, bits: int, candidates: int = 100, margin: float = 0.5) -> tuple[float, float]:
    """The range the reference picks for a weight: ``MSE_Estimator`` with ``OptMethod.grid`` and its defaults
    (``quantization/range_estimators.py``; ``validate_clm.py`` sets ``weight_quant_method = RangeEstimators.MSE``).

    Candidates ``c_i = i * (max|W| + margin) / candidates`` for i = 1..candidates, each as the range [-c_i, c_i] on
    the signed grid, or [0, c_i] on the unsigned one when W >= 0 (one-sided, e.g. a norm's gamma), as
    ``quantize_symmetric`` does; the first with the least summed squared error wins. Candidates are scored a chunk
    at a time (at most 2^24 elements at once).
    """
    w = weight.detach().float().flatten()
    one_sided = bool(w.min() >= 0)
    qmin, qmax = (0, 2**bits - 1) if one_sided else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    step = (max(-w.min().item(), w.max().item()) + margin) / candidates
    tops = torch.tensor([step * i for i in range(1, candidates + 1)], device=w.device)  # fp32, as the reference's
    scales = (tops / qmax).clamp_min(EPS)[:, None]
    chunks = scales.split(max(1, 2**24 // w.numel()))
    errors = torch.cat([(fake_quantize(w, chunk, 0.0, qmin, qmax) - w).pow(2).sum(-1) for chunk in chunks])
    best = tops[errors.argmin()].item()  # argmin: the first of equal minima, as the reference's
    return (0.0 if one_sided else -best), best


def weight_range(weight: Tensor, bits: int, method: str) -> tuple[float, float]:
    """``mse``: the reference's W8A8 choice (above); ``minmax``: the tensor's min and max (``current_minmax``)."""
    if method == "mse":
        return mse_weight_range(weight, bits)
    return weight.min().item(), weight.max().item()


def upper_percentile(x: Tensor, percentile: float) -> float:
    """``numpy.percentile(x, percentile)`` (linear interpolation) for a high percentile, sorting only the top tail."""
    flat = x.detach().flatten()
    n = flat.numel()
    position = (n - 1) * percentile / 100
    below = math.floor(position)
    top = flat.topk(n - below).values  # descending: sorted[below] is top[n - 1 - below]
    a, b = top[n - 1 - below].item(), top[max(n - 2 - below, 0)].item()
    return a + (b - a) * (position - below)


class ActivationQuantizer:
    """Asymmetric per-tensor fake-quant of one activation with a running min-max range: the reference's
    ``RunningMinMaxEstimator`` (momentum 0.9; with ``percentile`` p the (100 - p, p) percentiles of each batch instead
    of its min and max) feeding an ``AsymmetricUniformQuantizer``.

    While ``calibrating``, each call first updates the range (the first batch's, then an exponential moving average)
    and quantises with it, as the reference does in its range-estimation state, so later points calibrate on
    quantised inputs; afterwards the range is frozen, and what it does to the values it then sees is counted, the
    two ways outliers cost a per-tensor quantiser accuracy: the values cut off at the range's ends (outliers left
    out of the range), and the grid step against the typical magnitude (``coarsest``: the largest step / median
    nonzero |x| of any batch; outliers inside the range leave the typical value a few steps or none).
    """

    def __init__(self, bits: int, momentum: float = 0.9, percentile: float | None = None) -> None:
        self.bits, self.momentum, self.percentile = bits, momentum, percentile
        self.calibrating = True
        self.low: float | None = None
        self.high: float | None = None
        self.clipped = self.seen = 0
        self.coarsest = 0.0

    def observe(self, x: Tensor) -> None:
        if self.percentile is None:
            low, high = x.min().item(), x.max().item()
        else:
            low, high = -upper_percentile(-x, self.percentile), upper_percentile(x, self.percentile)
        if self.low is None:
            self.low, self.high = low, high
        else:
            m = self.momentum
            self.low, self.high = m * self.low + (1 - m) * low, m * self.high + (1 - m) * high

    def __call__(self, x: Tensor) -> Tensor:
        if self.calibrating:
            self.observe(x.detach().float())
        if self.low is None:
            raise RuntimeError("activation quantizer used before calibration saw any input")
        if not self.calibrating:
            self.count(x.detach().float())
        return quantize_asymmetric(x.float(), self.low, self.high, self.bits).to(x.dtype)

    def count(self, x: Tensor) -> None:
        low, high = min(self.low, 0.0), max(self.high, EPS)  # the range quantize_asymmetric uses
        self.clipped += int(((x < low) | (x > high)).sum())
        self.seen += x.numel()
        step = (high - low) / (2**self.bits - 1)
        nonzero = x[x != 0].abs()
        if nonzero.numel():
            self.coarsest = max(self.coarsest, step / max(nonzero.median().item(), EPS))


# ---------------------------------------------------------------- where W8A8 quantises

QUANT_SCOPES = ("full", "linear")
WEIGHT_RANGES = ("mse", "minmax")
QKV = ("q", "k", "v")
ATTENTION_POINTS = ("scores", "probabilities", "context")  # names of CausalSelfAttention.intermediate_hook


def weight_targets(model: GPT, scope: str) -> list[tuple[str, Tensor]]:
    """(kind, tensor) for every weight W8A8 quantises; the fused q/k/v weight as three views with a range each, as
    the reference's separate q_proj / k_proj / v_proj.

    ``full`` (reference ``quantized_opt.py``): token and position embeddings, every norm weight (not its bias) and
    every Linear weight of the blocks (not the biases); not the LM head (``--quant_setup fp32_head``) and not the
    variant's own parameters (gates, temperatures: the reference leaves its gates in full precision).
    ``linear``: every Linear weight but the LM head's, the variant's included (the earlier, narrower scheme).
    """
    qkv_rows = model.blocks[0].attn.shape.qkv_sizes
    targets: list[tuple[str, Tensor]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name != "lm_head" and (scope == "linear" or ".variant" not in name):
            parts = module.weight.split(qkv_rows) if name.endswith("attn.qkv") else [module.weight]
            targets += [("linear_weight", part) for part in parts]
        elif scope == "full" and isinstance(module, nn.Embedding):
            targets.append(("embedding", module.weight))
        elif scope == "full" and isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
            targets.append(("norm_weight", module.weight))
    return targets


@torch.no_grad()
def quantize_weights_(model: GPT, scope: str, bits: int, method: str) -> list[tuple[str, Tensor]]:
    """Fake-quantise ``weight_targets`` in place (symmetric per-tensor, range from ``method``) and return them.
    A head tied to the token embedding is untied first, so the head stays in full precision."""
    if model.lm_head.weight is model.wte.weight:
        model.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())
    weights = weight_targets(model, scope)
    for _, weight in weights:
        low, high = weight_range(weight, bits, method)
        weight.copy_(quantize_symmetric(weight.float(), low, high, bits).to(weight.dtype))
    return weights


def install_activation_quantizers(
    model: GPT, scope: str, new: Callable[[], ActivationQuantizer]
) -> list[tuple[str, ActivationQuantizer]]:
    """Hook a quantizer from ``new()`` onto every activation W8A8 quantises (on a copy: the hooks stay on it) and
    return (kind, quantizer) pairs.

    ``full``, the reference's points (``quantized_opt.py``): the embedding sum; per block the norm outputs, q, k
    and v (the projection's outputs, before any rotary embedding or temperature), QK^T, the softmax output (the
    variant's, e.g. clipped) and P@V (the attention runs through its plain-math reference path for this), the
    attention output after W_o, the residual sum after attention, the FFN's hidden activation (after its
    nonlinearity: the reference quantises fc1 and ReLU as one), the FFN output and the block output (residual sum);
    the final norm's output. Gates and temperatures are applied unquantised, as the reference's gates.
    ``linear``: the input of every Linear but the LM head.
    """
    points: list[tuple[str, ActivationQuantizer]] = []

    def add(kind: str) -> ActivationQuantizer:
        points.append((kind, new()))
        return points[-1][1]

    def on_output(module: nn.Module, kind: str) -> None:
        quantize = add(kind)
        module.register_forward_hook(lambda _module, _args, output: quantize(output))

    def on_input(module: nn.Module, kind: str) -> None:
        quantize = add(kind)
        module.register_forward_pre_hook(lambda _module, args: (quantize(args[0]), *args[1:]))

    def on_qkv(attn: nn.Module) -> None:
        quantizers, rows = [add(kind) for kind in QKV], attn.shape.qkv_sizes

        def hook(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> Tensor:
            return torch.cat([q(part) for q, part in zip(quantizers, output.split(rows, dim=-1), strict=True)], -1)

        attn.qkv.register_forward_hook(hook)

    def on_intermediates(attn: nn.Module) -> None:
        quantizers = {name: add(name) for name in ATTENTION_POINTS}
        attn.intermediate_hook = lambda name, x: quantizers[name](x)

    if scope == "linear":
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and name != "lm_head":
                on_input(module, "linear_input")
        return points
    on_output(model.drop, "embedding_sum")  # GPT.forward's dropout right after token + position embeddings
    for block in model.blocks:
        on_output(block.norm_1, "norm_output")
        on_qkv(block.attn)
        on_intermediates(block.attn)
        on_output(block.attn.proj, "attention_output")
        if not block.parallel_residual:
            on_output(block.attn_residual, "residual_sum")
        on_output(block.norm_2, "norm_output")
        on_input(block.mlp.proj, "ffn_hidden")
        on_output(block.mlp, "ffn_output")
        on_output(block, "residual_sum")
    on_output(model.norm_f, "norm_output")
    return points


@torch.no_grad()
def w8a8_perplexity(
    model: nn.Module,
    calibration: Tokens,
    tokens: Tokens,
    bits: int = 8,
    momentum: float = 0.9,
    scope: str = "full",
    weight_method: str = "mse",
    percentile: float | None = 99.999,
) -> dict[str, Any]:
    """Perplexity with simulated W{bits}A{bits}, as the reference's ``validate_clm.py --quantize --quant_setup
    fp32_head --ranges_acts running_minmax --qmethod_acts asymmetric_uniform --percentile 99.999``.

    Weights: symmetric per-tensor, range from ``weight_method`` (``mse``, the reference's; or ``minmax``).
    Activations at the ``scope``'s points (``install_activation_quantizers``): asymmetric per-tensor with a running
    min-max range (momentum ``momentum``; of the (100 - p, p) percentiles when ``percentile`` is p), estimated on
    the rows ``calibration`` (the reference: a few training batches) with the weights already quantised, then frozen.
    The LM head stays in full precision. Works on a deep copy; the model passed in is not touched.
    """
    require_choice(scope, QUANT_SCOPES, "analysis.quant_scope")
    require_choice(weight_method, WEIGHT_RANGES, "analysis.weight_range")
    in_range = percentile is None or 50 < percentile <= 100
    require(in_range, "analysis.act_percentile", f"must be in (50, 100] or null, got {percentile}")
    model = unwrap(model)
    device = device_of(model)
    batches = as_batches(tokens, device)
    quantized = copy.deepcopy(model)
    weights = quantize_weights_(quantized, scope, bits, weight_method)
    points = install_activation_quantizers(quantized, scope, lambda: ActivationQuantizer(bits, momentum, percentile))
    calibration = as_batches(calibration, device)
    with evaluating(quantized):
        for batch in calibration:
            quantized(batch[:, :-1])  # the inputs the perplexity pass will see
    for _, quantizer in points:
        quantizer.calibrating = False
    quantized_perplexity = perplexity(quantized, batches)
    damage = quantization_damage(points)
    hidden = {kind: d for kind, d in damage.items() if kind != "probabilities"}  # tiny by nature: a coarse grid
    clipped_at = max(damage, key=lambda kind: damage[kind]["clipped_share"])
    coarsest_at = max(hidden, key=lambda kind: hidden[kind]["step_over_median"])
    return {
        "bits": bits,
        "fp_perplexity": perplexity(model, batches),
        "quantized_perplexity": quantized_perplexity,
        "quant_scope": scope,
        "weight_range": weight_method,
        "act_percentile": percentile,
        "quantized_weights": len(weights),
        "quantized_activations": len(points),
        "weights": dict(Counter(kind for kind, _ in weights)),
        "activations": dict(Counter(kind for kind, _ in points)),
        "calibration_sequences": sum(batch.shape[0] for batch in calibration),
        "damage": damage,
        "clipped_share_max": damage[clipped_at]["clipped_share"],
        "clipped_share_max_at": clipped_at,
        "step_over_median_max": hidden[coarsest_at]["step_over_median"],  # over all kinds but the probabilities
        "step_over_median_max_at": coarsest_at,
    }


def describe_damage(summary: dict[str, Any]) -> list[str]:
    """The summary line of ``w8a8_perplexity``'s damage counts (results recorded before 2026-11-26 have none)."""
    if "clipped_share_max" not in summary:
        return []
    return [
        f"  W{summary['bits']}A{summary['bits']} damage{'':<13}clipped share up to {summary['clipped_share_max']:.2g} "
        f"({summary['clipped_share_max_at']}), grid step up to {summary['step_over_median_max']:.3g} x median "
        f"|x| ({summary['step_over_median_max_at']})"
    ]


def quantization_damage(points: list[tuple[str, ActivationQuantizer]]) -> dict[str, dict[str, float]]:
    """Per kind of activation, what its frozen ranges did to the evaluated values: the share cut off (over all its
    points) and the coarsest grid step / median nonzero |x| (of any of its points)."""
    damage: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(kind for kind, _ in points):
        quantizers = [quantizer for k, quantizer in points if k == kind]
        seen = sum(q.seen for q in quantizers)
        damage[kind] = {
            "clipped_share": sum(q.clipped for q in quantizers) / max(seen, 1),
            "step_over_median": max(q.coarsest for q in quantizers),
        }
    return damage


def describe_dimensions(summary: dict[str, Any]) -> list[str]:
    """The per-dimension line, for analyses that have it (records written before 2026-11-27 do not)."""
    if "channel_ratio_max" not in summary:
        return []
    return [
        f"  top dim / median dim    {summary['channel_ratio_max']:.4g} ({summary['channel_ratio_max_module']}); dim "
        f"{summary['outlier_dim']} is the largest in {summary['outlier_dim_modules']} of {len(summary['modules'])} "
        "modules"
    ]


@register_metric(
    "outliers",
    headline={"kurtosis_max": "kurtosis_max", "kurtosis_mean": "kurtosis_mean", "max_inf_norm": "max_inf_norm"},
    describe=lambda s: [
        f"  kurtosis max / mean     {s['kurtosis_max']:.4g} ({s['kurtosis_max_module']}) / {s['kurtosis_mean']:.4g}",
        f"  max inf norm            {s['max_inf_norm']:.4g} ({s['max_inf_norm_module']})",
        *describe_dimensions(s),
    ],
)
def _outliers(inputs: AnalysisInputs) -> dict[str, Any]:
    return activation_outliers(inputs.model, inputs.batches)


@register_metric(
    "w8a8",
    options={
        "calibration_tokens": None,  # ids of training text (the reference calibrates on training batches)
        "calibration_batches": 4,  # batches of them (reference README's OPT run: --est_num_batches 4)
        "bits": 8,
        "quant_scope": "full",  # full: every layer output, as the reference; linear: Linear weights and inputs only
        "weight_range": "mse",  # mse: the reference's MSE grid search; minmax
        "act_percentile": 99.999,  # running (100-p, p) percentiles, as the reference's OPT runs; null: min and max
        "quant_momentum": 0.9,  # EMA of the activation range while calibrating
    },
    headline={"w8a8_perplexity": "quantized_perplexity"},
    describe=lambda s: [
        f"  W{s['bits']}A{s['bits']} perplexity{'':<9}{s['quantized_perplexity']:.4g} ({s['quant_scope']} scope, "
        f"calibrated on {s['calibration'].replace('_', ' ')})",
        *describe_damage(s),
    ],
)
def _w8a8(inputs: AnalysisInputs) -> dict[str, Any]:
    """Calibrates on ``calibration_tokens`` when given; otherwise on the first evaluation batches, and says so in
    ``calibration`` (the reference calibrates on training batches)."""
    options = inputs.options
    if options["calibration_tokens"] is None:
        calibration, source = inputs.batches, "evaluation_batches"
    else:
        calibration, source = inputs.rows(torch.as_tensor(options["calibration_tokens"]).long()), "calibration_tokens"
    result = w8a8_perplexity(
        inputs.model,
        calibration[: options["calibration_batches"]],
        inputs.batches,
        options["bits"],
        options["quant_momentum"],
        options["quant_scope"],
        options["weight_range"],
        options["act_percentile"],
    )
    return {**result, "calibration": source}
