"""Model presets: every YAML builds a ModelConfig, the paper sizes have the published parameter counts, and the
official HF config.json of each converts to exactly its preset (so ``model=X model.init_from=hf:X`` agree)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from attnlab.models import GPT, ModelConfig
from attnlab.models.hf import RUNTIME_FIELDS, config_from_hf

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"

# config.json of the official checkpoints (as on the hub, transformers 4 spellings), for config_from_hf.
GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
}
PYTHIA_160M = {
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_act": "gelu",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "vocab_size": 50304,
}
PYTHIA_410M = {**PYTHIA_160M, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16}
PYTHIA_410M["num_hidden_layers"] = 24
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
LLAMA3_8B = {
    **LLAMA2_7B,
    "attention_bias": False,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
}
LLAMA31_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
# preset, official config, parameter count (tied GPT-2 counts its embedding once)
PAPER_SIZES = [
    ("gpt2", GPT2, 124_439_808),
    ("pythia-160m", PYTHIA_160M, 162_322_944),
    ("pythia-410m", PYTHIA_410M, 405_334_016),
    ("llama-7b", LLAMA2_7B, 6_738_415_616),
    ("llama3-8b", LLAMA3_8B, 8_030_261_248),
]
HF_MODELS = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM")}
HF_MODELS["llama"] = ("LlamaConfig", "LlamaForCausalLM")


def load_preset(name: str) -> dict:
    """``model=<name>`` as Hydra composes it: ModelConfig's defaults with what the YAML states on top."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PRESETS.parent), version_base="1.3"):
        return OmegaConf.to_container(compose(overrides=[f"+model={name}"]).model)


@pytest.mark.parametrize("path", sorted(PRESETS.glob("*.yaml")), ids=lambda p: p.stem)
def test_preset_composes_every_field_and_builds(path: Path) -> None:
    values = load_preset(path.stem)
    assert set(values) == {f.name for f in fields(ModelConfig)}
    assert values["name"] == path.stem
    ModelConfig.from_dict(values)


@pytest.mark.parametrize(("preset", "hf_config", "count"), PAPER_SIZES, ids=[p[0] for p in PAPER_SIZES])
def test_paper_sizes_match_published_counts(preset: str, hf_config: dict, count: int) -> None:
    with torch.device("meta"):
        model = GPT(ModelConfig.from_dict(load_preset(preset)))
    assert model.num_parameters() == count


@pytest.mark.parametrize(("preset", "hf_config", "count"), PAPER_SIZES, ids=[p[0] for p in PAPER_SIZES])
def test_official_config_converts_to_preset(preset: str, hf_config: dict, count: int) -> None:
    converted = config_from_hf(hf_config).to_dict()
    expected = ModelConfig.from_dict(load_preset(preset)).to_dict()
    for key in RUNTIME_FIELDS:
        converted.pop(key), expected.pop(key)
    assert converted == expected


@pytest.mark.parametrize(("preset", "hf_config", "count"), PAPER_SIZES, ids=[p[0] for p in PAPER_SIZES])
def test_transformers_agrees_on_counts(preset: str, hf_config: dict, count: int) -> None:
    """An independent count: the transformers model built from the same config.json."""
    transformers = pytest.importorskip("transformers")
    config_class, model_class = (getattr(transformers, n) for n in HF_MODELS[hf_config["model_type"]])
    with torch.device("meta"):
        model = model_class(config_class(**hf_config))
    assert sum(p.numel() for p in model.parameters()) == count


def test_llama31_rope_scaling_in_both_spellings() -> None:
    """Llama 3.1's config.json (transformers 4: rope_scaling) and transformers 5's rope_parameters agree."""
    legacy = config_from_hf({**LLAMA3_8B, "max_position_embeddings": 131072, "rope_scaling": LLAMA31_ROPE})
    current = {**LLAMA3_8B, "max_position_embeddings": 131072, "rope_scaling": None}
    current["rope_parameters"] = {**LLAMA31_ROPE, "rope_theta": 500000.0}
    del current["rope_theta"]
    assert legacy == config_from_hf(current)
    assert legacy.rope_base == 500000.0 and legacy.block_size == 131072
    assert legacy.rope_scaling == {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_type"}


def test_neox_rotary_fraction_spellings() -> None:
    current = {k: v for k, v in PYTHIA_160M.items() if k not in ("rotary_pct", "rotary_emb_base")}
    current["rope_parameters"] = {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}
    assert config_from_hf(current) == config_from_hf(PYTHIA_160M)
    assert config_from_hf({**current, "rope_parameters": None, "partial_rotary_factor": 0.5}).rotary_pct == 0.5
