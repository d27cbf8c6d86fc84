"""Converted HF checkpoints compute what the HF model computes, and every checkpoint mismatch is an error.

Tiny random transformers models (hidden 64, 2 layers, vocab 128) are saved with ``save_pretrained`` and loaded
back through ``attnlab.models.hf``; all offline.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.attention import available_attention, resolve_options
from attnlab.errors import ConfigError
from attnlab.hub import hf_tokenizer_path, hub_reachable
from attnlab.models.builder import from_hf
from attnlab.models.hf import config_from_hf, load_hf_checkpoint, parse_init_from, to_hf_state_dict

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, TOL = 128, 32, 1e-4
# eager attention on the HF side, so SDPA kernel differences cannot hide or cause a mismatch
SMALL = {"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0, "attn_implementation": "eager"}
LLAMA3_ROPE = {  # original context 32 with head_dim 16: some frequencies kept, some blended, some scaled
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 10000.0,
}
CASES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, **SMALL)
    ),
    "neox_parallel": lambda: _neox(use_parallel_residual=True),
    "neox_sequential": lambda: _neox(use_parallel_residual=False),
    "llama_gqa_llama3_rope": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=64,
            intermediate_size=160,
            max_position_embeddings=128,
            rope_parameters=LLAMA3_ROPE,
            **SMALL,
        )
    ),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch):
    """No test may touch the network: hub calls otherwise hang for tens of seconds."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


def _neox(use_parallel_residual: bool):
    config = transformers.GPTNeoXConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=64,
        intermediate_size=256,
        max_position_embeddings=64,
        rotary_pct=0.25,
        use_parallel_residual=use_parallel_residual,
        **SMALL,
    )
    return transformers.GPTNeoXForCausalLM(config)


def _randomise(model: torch.nn.Module) -> None:
    """Replace the 0.02-std init with O(1) activations, so layout mistakes move the logits visibly."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim == 1:
                p.copy_(1 + 0.2 * noise if name.endswith("weight") else 0.2 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor, torch.Tensor]]:
    """Each case saved once: (directory, token ids, the HF model's fp32 logits)."""
    torch.manual_seed(0)
    out = {}
    for case, build in CASES.items():
        hf_model = build()
        assert hf_model.config._attn_implementation == "eager"
        _randomise(hf_model)
        hf_model.eval()
        idx = torch.randint(0, VOCAB, (2, SEQ))
        with torch.no_grad():
            logits = hf_model(idx).logits
        directory = tmp_path_factory.mktemp(case)
        hf_model.save_pretrained(directory)
        out[case] = (directory, idx, logits)
    return out


# Options that make a fixed-rule variant vanilla (the rule switched off; the sink at -inf takes no mass)
NEUTRAL_OPTIONS = {
    "clipped_softmax": {"alpha": None, "gamma": 0.0},
    "value_select": {"threshold": float("-inf")},
    "sink": {"sink_init": float("-inf")},
    "softmax1": {"sink_init": float("-inf")},
}
# Variants that are vanilla for no setting (a fixed map other than softmax, a norm on q and k, s_h log n)
NO_NEUTRAL_SETTING = {"qk_norm", "qk_norm_projection", "softpick", "sigmoid", "ssmax"}


def exact_at_finetune_init(name: str) -> bool:
    """Whether the paper makes the variant's fine-tune init the pretrained layer exactly.

    Not so: clipped softmax with gamma < 0, value selection's hard rule, and the SSA position / YaRN terms
    (alpha_ft = -7.4 still adds 6.11e-4 * log n to the temperature), the sink (s_h = sink_init = 0 takes mass; at
    -inf it is vanilla but learns nothing). Those are compared at their neutral setting instead; the variants in
    ``NO_NEUTRAL_SETTING`` are skipped.
    """
    options = asdict(resolve_options({"name": name})[1])
    if name == "clipped_softmax":
        return options["zeta"] == 1 and options["gamma"] == 0
    if name == "value_select":
        return options["threshold"] == float("-inf")
    if name in NO_NEUTRAL_SETTING or name in NEUTRAL_OPTIONS or name in NOT_FROM_PRETRAINED:
        return False
    return not {"position", "yarn"} & set(options.get("terms", []))


# Variants that cannot start as a pretrained vanilla model: a fixed rule, or a position encoding of their own
NOT_FROM_PRETRAINED = {
    "selective": "a parameter-free rule with no neutral setting",
    "fox": "its forget gate is 1 only at an infinite bias, and it refuses rotary",
    "fox_pro": "fox's reasons, and its q/k and output norms change the layer at any weight",
    "stickbreaking": "it takes no position encoding",
    "diff": "a different attention rule at every parameter value (the difference of two maps, normed)",
}


def neutral_at_finetune(model) -> None:
    """Turn the SSA position term off (sigmoid(alpha) -> 0) after the fine-tune init."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".variant." in name and name.endswith("alpha"):
                param.fill_(-1e4)


@pytest.mark.parametrize("attention", available_attention())
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(checkpoints, case: str, attention: str) -> None:
    """Every variant at its fine-tune init reproduces the pretrained model (at its neutral setting where the paper's
    fine-tune init is not exact), so conversion drops or reinitialises no pretrained weight."""
    directory, idx, expected = checkpoints[case]
    if attention in NOT_FROM_PRETRAINED:
        pytest.skip(f"{attention}: {NOT_FROM_PRETRAINED[attention]}")
    config: dict = {"name": attention}
    exact = exact_at_finetune_init(attention)
    if attention in NEUTRAL_OPTIONS:
        config.update(NEUTRAL_OPTIONS[attention])
    elif not exact and "position" not in getattr(resolve_options(config)[1], "terms", []):
        pytest.skip(f"{attention} is a fixed rule with no neutral setting")
    model = from_hf(str(directory), attention=config)
    if not exact:
        neutral_at_finetune(model)
    assert not model.training
    with torch.no_grad():
        logits = model(idx)
    assert expected.abs().max() > 1.0  # a meaningful comparison, not two near-zero tensors
    torch.testing.assert_close(
        logits, expected, atol=TOL, rtol=0, msg=lambda m: f"attention={attention} after init_for_finetuning: {m}"
    )


def test_exactness_classification() -> None:
    exact = {name for name in available_attention() if exact_at_finetune_init(name)}
    assert {"vanilla", "gated", "gated_sdpa", "gated_sdpa_headwise", "gated_value", "ssa_tok_only"} <= exact
    assert not {"ssa", "ssa_shared", "temp_yarn", "clipped_softmax", "ssa_pos_only", "value_select"} & exact
    assert not {"sink", "softmax1", *NO_NEUTRAL_SETTING} & exact


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_to_hf_names(checkpoints, case: str) -> None:
    directory = checkpoints[case][0]
    saved = load_file(directory / "model.safetensors")
    exported = to_hf_state_dict(from_hf(str(directory)))
    assert exported.keys() == saved.keys()
    for key, tensor in saved.items():
        assert torch.equal(exported[key], tensor), key


def test_config_carries_provenance(checkpoints) -> None:
    directory = checkpoints["llama_gqa_llama3_rope"][0]
    config, _ = load_hf_checkpoint(str(directory))
    assert config.extra == {"hf_model_type": "llama", "hf_source": str(directory)}
    assert config.n_kv_head == 2 and config.rope_scaling["original_max_position_embeddings"] == 32
    assert config.init_from == f"hf:{directory}"
    assert parse_init_from(config.init_from) == str(directory)


def test_legacy_unprefixed_bin_with_buffers(checkpoints, tmp_path: Path) -> None:
    """The official gpt2 checkpoint: no ``transformer.`` prefix, causal-mask buffers saved, pytorch_model.bin."""
    directory, idx, expected = checkpoints["gpt2"]
    state = {k.removeprefix("transformer."): v for k, v in load_file(directory / "model.safetensors").items()}
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.ones(1, 1, 64, 64).tril()
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with torch.no_grad():
        torch.testing.assert_close(from_hf(str(tmp_path))(idx), expected, atol=TOL, rtol=0)


def test_sharded_safetensors(checkpoints, tmp_path: Path) -> None:
    directory, idx, expected = checkpoints["llama_gqa_llama3_rope"]
    state = load_file(directory / "model.safetensors")
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for shard, shard_keys in shards.items():
        save_file({k: state[k] for k in shard_keys}, tmp_path / shard)
    weight_map = {k: shard for shard, shard_keys in shards.items() for k in shard_keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with torch.no_grad():
        torch.testing.assert_close(from_hf(str(tmp_path))(idx), expected, atol=TOL, rtol=0)


def _copy_with(directory: Path, target: Path, edit) -> Path:
    state = load_file(directory / "model.safetensors")
    edit(state)
    save_file(state, target / "model.safetensors")
    (target / "config.json").write_text((directory / "config.json").read_text())
    return target


def test_unknown_checkpoint_key_is_an_error(checkpoints, tmp_path: Path) -> None:
    directory = checkpoints["neox_parallel"][0]
    extra = "gpt_neox.layers.0.attention.extra_scale"
    _copy_with(directory, tmp_path, lambda state: state.update({extra: torch.ones(4)}))
    with pytest.raises(ConfigError, match=extra.replace(".", r"\.")):
        from_hf(str(tmp_path))


def test_missing_checkpoint_key_is_an_error(checkpoints, tmp_path: Path) -> None:
    directory = checkpoints["gpt2"][0]
    _copy_with(directory, tmp_path, lambda state: state.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(ConfigError, match=r"does not provide: blocks\.1\.mlp\.fc\.bias"):
        from_hf(str(tmp_path))


def test_layer_beyond_config_is_an_error(checkpoints, tmp_path: Path) -> None:
    directory = checkpoints["llama_gqa_llama3_rope"][0]
    extra = "model.layers.2.input_layernorm.weight"
    _copy_with(directory, tmp_path, lambda state: state.update({extra: torch.ones(64)}))
    with pytest.raises(ConfigError, match=r"its config.json says model\.n_layer=2 but its weights have 3"):
        from_hf(str(tmp_path))


def test_overrides(checkpoints) -> None:
    directory, idx, expected = checkpoints["gpt2"]
    model = from_hf(str(directory), block_size=SEQ, dropout=0.1, n_layer=2)
    assert model.wpe.weight.shape[0] == SEQ and model.config.dropout == 0.1
    with torch.no_grad():
        torch.testing.assert_close(model(idx), expected, atol=TOL, rtol=0)
    with pytest.raises(ConfigError, match=r"model\.n_layer: 3 differs from the checkpoint's 2"):
        from_hf(str(directory), n_layer=3)
    with pytest.raises(ConfigError, match=r"model\.block_size"):
        from_hf(str(directory), block_size=128)


def test_unsupported_configs() -> None:
    with pytest.raises(ConfigError, match=r"model_type: got 'bert'; supported: gpt2, gpt_neox, llama"):
        config_from_hf({"model_type": "bert"})
    llama = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "intermediate_size": 160,
        "max_position_embeddings": 128,
        "vocab_size": VOCAB,
    }
    with pytest.raises(ConfigError, match=r"rope_type: got 'yarn'; supported: default, llama3"):
        config_from_hf({**llama, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ConfigError, match=r"attention_bias"):
        config_from_hf({**llama, "attention_bias": True})
    with pytest.raises(ConfigError, match=r"rope_scaling: llama3 rope needs .* missing low_freq_factor"):
        config_from_hf({**llama, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}})


def test_hub_name_offline_and_not_cached_fails_clearly() -> None:
    repo = "attnlab-tests/no-such-model"
    with pytest.raises(ConfigError) as info:
        from_hf(repo)
    message = str(info.value)
    assert repo in message and "not in the local cache" in message and "internet" in message
    assert "local directory" in message


def test_init_from_parsing() -> None:
    assert parse_init_from(None) is None
    assert parse_init_from("hf:EleutherAI/pythia-160m") == "EleutherAI/pythia-160m"
    with pytest.raises(ConfigError, match=r"model\.init_from"):
        parse_init_from("EleutherAI/pythia-160m")


def test_tokenizer_next_to_weights(checkpoints, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    directory = _copy_with(checkpoints["gpt2"][0], tmp_path, lambda state: None)
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        hf_tokenizer_path(str(directory))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(["attention is all you need"] * 10, trainers.BpeTrainer(vocab_size=300))
    tokenizer.save(str(directory / "tokenizer.json"))
    path = hf_tokenizer_path(str(directory))
    assert path == str(directory / "tokenizer.json")
    assert Tokenizer.from_file(path).encode("attention").ids
