"""Outliers and quantisability (Bondarenko et al. 2023, seed 000): kurtosis, max infinity norm, W8A8 perplexity.

Attention heads that learn to "do nothing" push a few hidden dimensions to huge values; those outliers show up
as high kurtosis and infinity norm of the layer outputs and make 8-bit activation quantisation fail.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

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
from attnlab.nn_utils import forward_hooks


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


@torch.no_grad()
def activation_outliers(model: nn.Module, tokens: Tokens, eps: float = 1e-6) -> dict[str, Any]:
    """Per hooked module: kurtosis and max |x| of each sequence's flattened (T*d) output, averaged over sequences;
    then the max and mean over modules (the seed's table reports the max infinity norm and the mean kurtosis), and
    which module gave each max."""
    model = unwrap(model)
    modules = hooked_outputs(model)
    sums = {name: torch.zeros(2, dtype=torch.float64) for name in modules}
    sequences = 0

    def record(name: str):
        def hook(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> None:
            rows = output.detach().flatten(1)
            sums[name] += torch.stack([kurtosis(rows, eps).sum(), rows.abs().amax(dim=1).double().sum()]).cpu()

        return hook

    with evaluating(model), forward_hooks((module, record(name)) for name, module in modules.items()):
        for batch in as_batches(tokens, device_of(model)):
            model(batch)
            sequences += batch.shape[0]
    per_module = {
        name: {"kurtosis": (s[0] / sequences).item(), "max_inf_norm": (s[1] / sequences).item()}
        for name, s in sums.items()
    }
    kurt = {name: m["kurtosis"] for name, m in per_module.items()}
    norm = {name: m["max_inf_norm"] for name, m in per_module.items()}
    return {
        "modules": per_module,
        "hooked_modules": HOOKED_MODULES,
        "kurtosis_max": max(kurt.values()),
        "kurtosis_max_module": max(kurt, key=kurt.get),
        "kurtosis_mean": sum(kurt.values()) / len(kurt),
        "max_inf_norm": max(norm.values()),
        "max_inf_norm_module": max(norm, key=norm.get),
        "inf_norm_mean": sum(norm.values()) / len(norm),
        "sequences": sequences,
    }


def fake_quantize(x: Tensor, scale: Tensor, zero_point: Tensor, qmin: int, qmax: int) -> Tensor:
    """Round to the integer grid ``zero_point + k`` (k in [qmin, qmax] after the offset) and map back."""
    return (torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale


def quantize_weight_(weight: Tensor, bits: int) -> None:
    """Symmetric per-tensor: grid step max|W| / (2^(b-1) - 1), integers in [-(2^(b-1) - 1), 2^(b-1) - 1]."""
    qmax = 2 ** (bits - 1) - 1
    scale = (weight.abs().max() / qmax).clamp_min(1e-12)
    weight.copy_(fake_quantize(weight, scale, torch.zeros_like(scale), -qmax, qmax))


class ActivationQuantizer:
    """Forward pre-hook on a Linear: asymmetric per-tensor fake-quant of its input.

    While ``calibrating`` it only tracks the input's min and max (the first batch's, then an exponential moving
    average with ``momentum``); afterwards the range, widened to include 0 so that 0 is exact, is frozen.
    """

    def __init__(self, bits: int, momentum: float) -> None:
        self.bits, self.momentum = bits, momentum
        self.calibrating = True
        self.low: Tensor | None = None
        self.high: Tensor | None = None

    def __call__(self, _module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
        (x,) = args
        if self.calibrating:
            low, high = x.detach().min().float(), x.detach().max().float()
            m = self.momentum
            self.low = low if self.low is None else m * self.low + (1 - m) * low
            self.high = high if self.high is None else m * self.high + (1 - m) * high
            return None
        if self.low is None:
            raise RuntimeError("activation quantizer used before calibration saw any input")
        low, high = self.low.clamp(max=0.0), self.high.clamp(min=0.0)
        scale = ((high - low) / (2**self.bits - 1)).clamp_min(1e-12)
        zero_point = torch.round(-low / scale)
        return (fake_quantize(x.float(), scale, zero_point, 0, 2**self.bits - 1).to(x.dtype),)


@torch.no_grad()
def w8a8_perplexity(
    model: nn.Module, calibration: Tokens, tokens: Tokens, bits: int = 8, momentum: float = 0.9
) -> dict[str, Any]:
    """Perplexity with simulated W{bits}A{bits}: every Linear but the LM head gets fake-quantised weights
    (symmetric per-tensor) and inputs (asymmetric per-tensor, min-max calibrated on the rows ``calibration``
    with an EMA, then frozen). Works on a deep copy; the model passed in is not touched."""
    model = unwrap(model)
    device = device_of(model)
    batches = as_batches(tokens, device)
    quantized = copy.deepcopy(model)
    quantizers = []
    for name, module in quantized.named_modules():
        if isinstance(module, nn.Linear) and name != "lm_head":
            quantize_weight_(module.weight, bits)
            quantizers.append(ActivationQuantizer(bits, momentum))
            module.register_forward_pre_hook(quantizers[-1])
    with evaluating(quantized):
        for batch in as_batches(calibration, device):
            quantized(batch[:, :-1])  # the inputs the perplexity pass will see
    for quantizer in quantizers:
        quantizer.calibrating = False
    return {
        "bits": bits,
        "fp_perplexity": perplexity(model, batches),
        "quantized_perplexity": perplexity(quantized, batches),
        "quantized_linears": len(quantizers),
    }


@register_metric(
    "outliers",
    headline={"kurtosis_max": "kurtosis_max", "kurtosis_mean": "kurtosis_mean", "max_inf_norm": "max_inf_norm"},
    describe=lambda s: [
        f"  kurtosis max / mean     {s['kurtosis_max']:.4g} ({s['kurtosis_max_module']}) / {s['kurtosis_mean']:.4g}",
        f"  max inf norm            {s['max_inf_norm']:.4g} ({s['max_inf_norm_module']})",
    ],
)
def _outliers(inputs: AnalysisInputs) -> dict[str, Any]:
    return activation_outliers(inputs.model, inputs.batches)


@register_metric(
    "w8a8",
    options={
        "calibration_tokens": None,  # W8A8 calibration ids (training text, as the seed); None: first eval batches
        "calibration_batches": 4,
        "bits": 8,
        "quant_momentum": 0.9,  # EMA of the activation min/max while calibrating
    },
    headline={"w8a8_perplexity": "quantized_perplexity"},
    describe=lambda s: [f"  W{s['bits']}A{s['bits']} perplexity{'':<9}{s['quantized_perplexity']:.4g}"],
)
def _w8a8(inputs: AnalysisInputs) -> dict[str, Any]:
    options = inputs.options
    calibration = inputs.batches[: options["calibration_batches"]]
    if options["calibration_tokens"] is not None:
        calibration = inputs.rows(torch.as_tensor(options["calibration_tokens"]).long())
    return w8a8_perplexity(inputs.model, calibration, inputs.batches, options["bits"], options["quant_momentum"])
