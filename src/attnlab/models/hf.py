"""Load Hugging Face GPT-2, GPT-NeoX/Pythia and Llama checkpoints into ``GPT``, for fine-tuning with any variant.

Only the checkpoint's files are read (config.json and safetensors, or ``pytorch_model.bin`` via
``torch.load(weights_only=True)``); no HF model code is imported or run, so there is no ``trust_remote_code``.
Every checkpoint weight must land in one of our parameters and every parameter must get one, except the
attention variant's own new parameters: a mismatch is an error listing the keys, never a silent re-init.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import ConfigError, require
from attnlab.hub import hub_reachable, local_dir, snapshot
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT

HF_MODEL_TYPES = {"gpt2": "gpt2", "gpt_neox": "neox", "llama": "llama"}  # HF model_type -> our family
SUPPORTED_ROPE_TYPES = ("default", "llama3")
INIT_FROM_PREFIX = "hf:"

# HF key template -> our key template; "{}" is the layer index. Several HF keys with one target are
# concatenated along the output dim in the order listed (Llama's q, k, v -> our fused qkv).
WEIGHT_MAPS: dict[str, dict[str, str]] = {
    "gpt2": {
        "transformer.wte.weight": "wte.weight",
        "transformer.wpe.weight": "wpe.weight",
        "transformer.h.{}.ln_1.weight": "blocks.{}.norm_1.weight",
        "transformer.h.{}.ln_1.bias": "blocks.{}.norm_1.bias",
        "transformer.h.{}.attn.c_attn.weight": "blocks.{}.attn.qkv.weight",
        "transformer.h.{}.attn.c_attn.bias": "blocks.{}.attn.qkv.bias",
        "transformer.h.{}.attn.c_proj.weight": "blocks.{}.attn.proj.weight",
        "transformer.h.{}.attn.c_proj.bias": "blocks.{}.attn.proj.bias",
        "transformer.h.{}.ln_2.weight": "blocks.{}.norm_2.weight",
        "transformer.h.{}.ln_2.bias": "blocks.{}.norm_2.bias",
        "transformer.h.{}.mlp.c_fc.weight": "blocks.{}.mlp.fc.weight",
        "transformer.h.{}.mlp.c_fc.bias": "blocks.{}.mlp.fc.bias",
        "transformer.h.{}.mlp.c_proj.weight": "blocks.{}.mlp.proj.weight",
        "transformer.h.{}.mlp.c_proj.bias": "blocks.{}.mlp.proj.bias",
        "transformer.ln_f.weight": "norm_f.weight",
        "transformer.ln_f.bias": "norm_f.bias",
        "lm_head.weight": "lm_head.weight",
    },
    "neox": {
        "gpt_neox.embed_in.weight": "wte.weight",
        "gpt_neox.layers.{}.input_layernorm.weight": "blocks.{}.norm_1.weight",
        "gpt_neox.layers.{}.input_layernorm.bias": "blocks.{}.norm_1.bias",
        "gpt_neox.layers.{}.attention.query_key_value.weight": "blocks.{}.attn.qkv.weight",
        "gpt_neox.layers.{}.attention.query_key_value.bias": "blocks.{}.attn.qkv.bias",
        "gpt_neox.layers.{}.attention.dense.weight": "blocks.{}.attn.proj.weight",
        "gpt_neox.layers.{}.attention.dense.bias": "blocks.{}.attn.proj.bias",
        "gpt_neox.layers.{}.post_attention_layernorm.weight": "blocks.{}.norm_2.weight",
        "gpt_neox.layers.{}.post_attention_layernorm.bias": "blocks.{}.norm_2.bias",
        "gpt_neox.layers.{}.mlp.dense_h_to_4h.weight": "blocks.{}.mlp.fc.weight",
        "gpt_neox.layers.{}.mlp.dense_h_to_4h.bias": "blocks.{}.mlp.fc.bias",
        "gpt_neox.layers.{}.mlp.dense_4h_to_h.weight": "blocks.{}.mlp.proj.weight",
        "gpt_neox.layers.{}.mlp.dense_4h_to_h.bias": "blocks.{}.mlp.proj.bias",
        "gpt_neox.final_layer_norm.weight": "norm_f.weight",
        "gpt_neox.final_layer_norm.bias": "norm_f.bias",
        "embed_out.weight": "lm_head.weight",  # the name on disk; transformers 5 calls the module lm_head
    },
    "llama": {
        "model.embed_tokens.weight": "wte.weight",
        "model.layers.{}.input_layernorm.weight": "blocks.{}.norm_1.weight",
        "model.layers.{}.self_attn.q_proj.weight": "blocks.{}.attn.qkv.weight",
        "model.layers.{}.self_attn.k_proj.weight": "blocks.{}.attn.qkv.weight",
        "model.layers.{}.self_attn.v_proj.weight": "blocks.{}.attn.qkv.weight",
        "model.layers.{}.self_attn.o_proj.weight": "blocks.{}.attn.proj.weight",
        "model.layers.{}.post_attention_layernorm.weight": "blocks.{}.norm_2.weight",
        "model.layers.{}.mlp.up_proj.weight": "blocks.{}.mlp.fc.weight",
        "model.layers.{}.mlp.gate_proj.weight": "blocks.{}.mlp.gate.weight",
        "model.layers.{}.mlp.down_proj.weight": "blocks.{}.mlp.proj.weight",
        "model.norm.weight": "norm_f.weight",
        "lm_head.weight": "lm_head.weight",
    },
}
# Old checkpoints store the base model without its prefix (the official gpt2 has "h.0.attn...").
BASE_PREFIX = {"gpt2": "transformer.", "neox": "gpt_neox.", "llama": "model."}
HEAD_KEYS = {"gpt2": ("lm_head.weight",), "neox": ("embed_out.weight", "lm_head.weight"), "llama": ("lm_head.weight",)}
# Buffers (causal masks, rotary caches) that older transformers saved; we recompute them, so they carry nothing.
SKIPPED_BUFFERS = re.compile(
    r"(\.attn\.bias|\.attn\.masked_bias|\.attention\.bias|\.attention\.masked_bias|rotary_emb\.inv_freq)$"
)
# Ours that a checkpoint never provides: the variant's new parameters and buffers the data/config set.
NOT_IN_CHECKPOINT = re.compile(r"(\.attn\.variant\.|\.attn\.head_mask$|^token_log_frequency$)")
# Fields a caller may set freely; the rest are the architecture and must match the checkpoint.
RUNTIME_FIELDS = ("name", "dropout", "block_size", "tokenizer", "init_from", "head_mask", "padded_vocab_size", "extra")
WEIGHT_PATTERNS = ["*.json", "model*.safetensors", "tokenizer*"]
BIN_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def parse_init_from(init_from: str | None) -> str | None:
    """``"hf:<hub name or dir>"`` -> the name or dir; None/empty -> None (train from scratch)."""
    if not init_from:
        return None
    if not init_from.startswith(INIT_FROM_PREFIX) or len(init_from) == len(INIT_FROM_PREFIX):
        raise ConfigError("model.init_from", f"got {init_from!r}; expected 'hf:<hub name or local directory>' or null")
    return init_from[len(INIT_FROM_PREFIX) :]


# ---------------------------------------------------------------------------------------------- config


def _rope_settings(hf: dict[str, Any]) -> tuple[str, dict[str, Any], float, float]:
    """(rope type, its parameters, theta, rotary fraction) across the config.json spellings of transformers 4 and 5."""
    params = dict(hf.get("rope_scaling") or {})  # transformers 4: scaling only
    params.update(hf.get("rope_parameters") or {})  # transformers 5: theta, partial factor and scaling together
    if any(isinstance(value, Mapping) for value in params.values()):
        raise ConfigError("rope_parameters", "per-layer-type rope parameters are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    pct = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    return rope_type, params, float(theta), float(pct)


def _llama3_scaling(rope_type: str, params: dict[str, Any]) -> dict[str, float] | None:
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError("rope_scaling.rope_type", f"got {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return None
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [key for key in keys if key not in params]
    if missing:
        raise ConfigError("rope_scaling", f"llama3 rope needs {', '.join(keys)}; missing {', '.join(missing)}")
    return {key: float(params[key]) if key != keys[-1] else int(params[key]) for key in keys}


def _expect(hf: dict[str, Any], key: str, default: Any, allowed: tuple) -> None:
    value = hf.get(key, default)
    if value not in allowed:
        raise ConfigError(key, f"got {value!r}; supported: {', '.join(map(repr, allowed))}")


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Our ``ModelConfig`` for an HF config.json; features ``GPT`` cannot reproduce exactly raise ``ConfigError``."""
    model_type = hf.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError("model_type", f"got {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)}")
    family = HF_MODEL_TYPES[model_type]
    name = Path(hf.get("_name_or_path") or model_type).name
    common = {"name": name, "family": family, "dropout": 0.0, "extra": {"hf_model_type": model_type}}
    if family == "gpt2":
        _expect(hf, "activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh"))
        _expect(hf, "scale_attn_weights", True, (True,))
        _expect(hf, "scale_attn_by_inverse_layer_idx", False, (False,))
        _expect(hf, "add_cross_attention", False, (False,))
        return ModelConfig(
            **common,
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            block_size=hf["n_positions"],
            vocab_size=hf["vocab_size"],
            intermediate_size=hf.get("n_inner") or 4 * hf["n_embd"],
            bias=True,
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            pos_encoding="learned",
            tie_embeddings=hf.get("tie_word_embeddings", True),
        )
    rope_type, rope_params, theta, pct = _rope_settings(hf)
    rope = {"rope_base": theta, "rotary_pct": pct, "rope_scaling": _llama3_scaling(rope_type, rope_params)}
    sizes = {
        "n_layer": hf["num_hidden_layers"],
        "n_head": hf["num_attention_heads"],
        "n_embd": hf["hidden_size"],
        "block_size": hf["max_position_embeddings"],
        "vocab_size": hf["vocab_size"],
        "intermediate_size": hf["intermediate_size"],
    }
    if family == "neox":
        _expect(hf, "hidden_act", "gelu", ("gelu",))
        _expect(hf, "attention_bias", True, (True,))  # our bias flag covers attention, MLP and norms together
        return ModelConfig(
            **common,
            **sizes,
            **rope,
            bias=True,
            norm_eps=hf.get("layer_norm_eps", 1e-5),
            pos_encoding="rotary",
            parallel_residual=hf.get("use_parallel_residual", True),
            tie_embeddings=hf.get("tie_word_embeddings", False),
        )
    _expect(hf, "hidden_act", "silu", ("silu",))
    _expect(hf, "attention_bias", False, (False,))
    _expect(hf, "mlp_bias", False, (False,))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise ConfigError("head_dim", f"got {head_dim}; supported: hidden_size / num_attention_heads only")
    return ModelConfig(
        **common,
        **sizes,
        **rope,
        n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        bias=False,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        pos_encoding="rotary",
        tie_embeddings=hf.get("tie_word_embeddings", False),
    )


# ---------------------------------------------------------------------------------------------- weights


def _transpose(w: Tensor, config: ModelConfig) -> Tensor:
    """GPT-2's Conv1D stores (in, out); ``nn.Linear`` wants (out, in)."""
    return w.t().contiguous()


def _neox_qkv_to_ours(w: Tensor, config: ModelConfig) -> Tensor:
    """NeoX interleaves per head [q_h, k_h, v_h]; we want [all q | all k | all v]."""
    h, dh = config.n_head, config.head_dim
    return w.reshape(h, 3, dh, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()


def _neox_qkv_from_ours(w: Tensor, config: ModelConfig) -> Tensor:
    h, dh = config.n_head, config.head_dim
    return w.reshape(3, h, dh, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()


TO_OURS: dict[str, dict[str, Callable[[Tensor, ModelConfig], Tensor]]] = {
    "gpt2": {
        key: _transpose
        for key in WEIGHT_MAPS["gpt2"]
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
    },
    "neox": {
        "gpt_neox.layers.{}.attention.query_key_value.weight": _neox_qkv_to_ours,
        "gpt_neox.layers.{}.attention.query_key_value.bias": _neox_qkv_to_ours,
    },
    "llama": {},  # HF's conversion script already permuted q/k to rotate-half: no reordering
}
FROM_OURS = {
    "gpt2": TO_OURS["gpt2"],
    "neox": {key: _neox_qkv_from_ours for key in TO_OURS["neox"]},
    "llama": {},
}


def _template(key: str) -> tuple[str, str | None]:
    """``"model.layers.3.mlp.x"`` -> (``"model.layers.{}.mlp.x"``, ``"3"``)."""
    match = re.search(r"\.(\d+)\.", key)
    if match is None:
        return key, None
    return key[: match.start()] + ".{}." + key[match.end() :], match.group(1)


def _limited(keys: list[str], limit: int = 40) -> str:
    more = f", ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def convert_hf_state_dict(hf_state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """HF tensors -> ours (names, layouts, fused q/k/v); an unknown checkpoint key raises, listing them all."""
    family = config.family
    weight_map, transforms, prefix = WEIGHT_MAPS[family], TO_OURS[family], BASE_PREFIX[family]
    order = {template: i for i, template in enumerate(weight_map)}
    parts: dict[str, list[tuple[int, Tensor]]] = {}
    unknown = []
    for key, tensor in hf_state.items():
        if SKIPPED_BUFFERS.search(key):
            continue
        if not key.startswith(prefix) and key not in HEAD_KEYS[family]:
            key = prefix + key
        template, layer = _template(key)
        if family == "neox" and template == "lm_head.weight":
            template = "embed_out.weight"
        if template not in weight_map:
            unknown.append(key)
            continue
        ours = weight_map[template].format(layer)
        transform = transforms.get(template)
        try:
            converted = transform(tensor, config) if transform else tensor
        except RuntimeError:  # a reshape to the config's heads that the tensor's shape does not allow
            raise ConfigError(
                "model.init_from", f"{key}: shape {tuple(tensor.shape)} does not fit the config"
            ) from None
        parts.setdefault(ours, []).append((order[template], converted))
    if unknown:
        raise ConfigError("model.init_from", f"checkpoint keys with no place in the model: {_limited(sorted(unknown))}")
    state = {ours: _joined(ours, [t for _, t in sorted(group, key=lambda p: p[0])]) for ours, group in parts.items()}
    if config.tie_embeddings and "wte.weight" in state:
        head = state.setdefault("lm_head.weight", state["wte.weight"])
        if not torch.equal(head, state["wte.weight"]):
            raise ConfigError("model.tie_embeddings", "the checkpoint is tied but its lm_head differs from wte")
    return state


def _joined(name: str, pieces: list[Tensor]) -> Tensor:
    """Llama's q, k and v as our fused projection; pieces whose widths disagree are the file's error."""
    try:
        return torch.cat(pieces)
    except RuntimeError:
        shapes = ", ".join(str(tuple(piece.shape)) for piece in pieces)
        raise ConfigError("model.init_from", f"the pieces of {name} have shapes that do not join: {shapes}") from None


def to_hf_state_dict(model: GPT) -> dict[str, Tensor]:
    """Our vanilla model's weights under the HF names and layouts save_pretrained writes (for exporting)."""
    config = model.config
    variant = [name for name, _ in model.variant_parameters()]
    if variant:
        raise ConfigError("attention.name", f"HF has no place for variant parameters: {_limited(variant)}")
    family = config.family
    transforms = FROM_OURS[family]
    targets: dict[str, list[str]] = {}
    for hf_template, ours in WEIGHT_MAPS[family].items():
        targets.setdefault(ours, []).append(hf_template)
    qkv_sizes = model.blocks[0].attn.shape.qkv_sizes  # the fused projection's q, k and v widths
    out = {}
    for key, tensor in model.state_dict().items():
        if NOT_IN_CHECKPOINT.search(key) or (key == "lm_head.weight" and config.tie_embeddings):
            continue
        if key in ("wte.weight", "lm_head.weight"):
            tensor = tensor[: config.vocab_size]  # a padded head's extra rows are ours only
        template, layer = _template(key)
        hf_templates = targets[template]
        pieces = tensor.split(qkv_sizes) if len(hf_templates) == 3 else [tensor]
        for hf_template, piece in zip(hf_templates, pieces, strict=True):
            transform = transforms.get(hf_template)
            out[hf_template.format(layer)] = (transform(piece, config) if transform else piece).detach().clone()
    return out


def _expected_keys(config: ModelConfig) -> set[str]:
    """Names a vanilla ``GPT(config)`` expects from a checkpoint; built on the meta device, so free."""
    with torch.device("meta"):
        model = GPT(config)
    return {key for key in model.state_dict() if not NOT_IN_CHECKPOINT.search(key)}


def _check_keys(state: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]] | set[str]) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    problems = []
    if missing:
        problems.append(f"model parameters the checkpoint does not provide: {_limited(missing)}")
    if unexpected:
        problems.append(f"converted checkpoint keys the model does not have: {_limited(unexpected)}")
    if isinstance(expected, Mapping):
        problems += [
            f"{key}: checkpoint {tuple(state[key].shape)} vs model {shape}"
            for key, shape in expected.items()
            if key in state and tuple(state[key].shape) != shape
        ]
    if problems:
        raise ConfigError("model.init_from", "; ".join(problems))


# ---------------------------------------------------------------------------------------------- files


def _weight_files(directory: Path) -> list[Path]:
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = directory / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [directory / shard for shard in shards]
        if (directory / single).is_file():
            return [directory / single]
    return []


def _read_weights(files: list[Path]) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                state.update(load_file(file))
            else:
                state.update(torch.load(file, map_location="cpu", weights_only=True))
        except Exception as exc:  # safetensors' and torch's own errors for a truncated, corrupt or pickled file
            raise ConfigError(
                "model.init_from", f"{file} is not a readable weights file ({type(exc).__name__})"
            ) from None
    return state


def resolve_checkpoint(path_or_name: str) -> Path:
    """Directory holding config.json and the weights: the given one, or the hub snapshot (downloaded if needed)."""
    directory = local_dir(path_or_name)
    if directory is None:
        directory = snapshot(path_or_name, WEIGHT_PATTERNS)
        if not _weight_files(directory) and hub_reachable():
            directory = snapshot(path_or_name, BIN_PATTERNS)  # older repos have only pytorch_model.bin
    return directory


def load_hf_checkpoint(path_or_name: str) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Our config and converted state dict for a local HF checkpoint directory or a hub repo id. Its config.json is
    data from a file: its sizes are checked against the weights (``check_against_weights``) before a model is built,
    and whatever in it or in the weights does not fit is one ``ConfigError`` naming the file."""
    from attnlab.models.sizes import check_against_weights

    directory = resolve_checkpoint(path_or_name)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError("model.init_from", f"no config.json in {directory}")
    try:
        hf = json.loads(config_file.read_text())
        require(isinstance(hf, dict), "model.init_from", "not a JSON object")
        config = config_from_hf(hf)
    except (ValueError, UnicodeDecodeError) as exc:  # ConfigError is a ValueError: said with the file's name
        raise ConfigError("model.init_from", f"{config_file}: {exc}") from None
    except KeyError as exc:
        raise ConfigError("model.init_from", f"{config_file}: no {exc.args[0]!r}, which the model needs") from None
    except TypeError as exc:  # a size of the wrong type meets arithmetic
        raise ConfigError("model.init_from", f"{config_file}: a value of the wrong type ({exc})") from None
    config.name = Path(path_or_name.rstrip("/")).name
    config.tokenizer = path_or_name
    config.init_from = INIT_FROM_PREFIX + path_or_name
    config.extra["hf_source"] = path_or_name
    files = _weight_files(directory)
    if not files:
        present = ", ".join(sorted(p.name for p in directory.iterdir()))
        raise ConfigError(
            "model.init_from",
            f"no model.safetensors(.index.json) or pytorch_model.bin in {directory} ({present}); for a hub repo "
            "cached without its weights, run once with internet access",
        )
    state = convert_hf_state_dict(_read_weights(files), config)
    check_against_weights(config, state, str(directory), "model.init_from", "config.json")
    _check_keys(state, _expected_keys(config))
    return config, state


# ---------------------------------------------------------------------------------------------- model


def apply_overrides(config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """Runtime fields override; architecture fields must agree with the checkpoint (a preset can be passed whole)."""
    merged = ModelConfig.from_dict(
        {**config.to_dict(), **overrides, "extra": {**config.extra, **(overrides.get("extra") or {})}}
    )
    for key in overrides:
        if key in RUNTIME_FIELDS:
            continue
        ours, theirs = getattr(merged, key), getattr(config, key)
        if key == "intermediate_size":
            ours, theirs = merged.mlp_width, config.mlp_width
        if ours != theirs:
            raise ConfigError(f"model.{key}", f"{ours!r} differs from the checkpoint's {theirs!r}")
    if merged.pos_encoding == "learned" and merged.block_size > config.block_size:
        raise ConfigError(
            "model.block_size", f"{merged.block_size} exceeds the checkpoint's {config.block_size} learned positions"
        )
    return merged


def load_pretrained_into(model: GPT, state: Mapping[str, Tensor]) -> None:
    """Copy converted weights in; every pretrained parameter must be covered, only variant params may be left."""
    expected = {key: tuple(t.shape) for key, t in model.state_dict().items() if not NOT_IN_CHECKPOINT.search(key)}
    rows = model.config.embedding_rows
    state = {  # model.padded_vocab_size: the checkpoint's vocabulary, then zero rows no token id reaches
        key: F.pad(tensor, (0, 0, 0, rows - len(tensor)))
        if key in ("wte.weight", "lm_head.weight") and len(tensor) < rows
        else tensor
        for key, tensor in state.items()
    }
    _check_keys(state, expected)
    model.load_state_dict(state, strict=False)
