"""``attnlab-export <checkpoint> <dir>``: one of our vanilla checkpoints as a Hugging Face model directory.

transformers builds the model from its own config class (GPT-2, GPT-NeoX or Llama, by ``model.family``), our weights
go in through ``to_hf_state_dict`` and ``save_pretrained`` writes config.json, generation_config.json and
model.safetensors; the run's tokenizer is saved beside them as a ``PreTrainedTokenizerFast``. So
``AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)`` load it with no attnlab code.
Only what HF's layers compute exactly is exported: any attention variant is refused (HF has no such layer), and so
is an architecture setting the HF class cannot express. Everything is written in a temporary directory beside the
target first, so a failure leaves nothing behind and an existing export is replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.errors import ConfigError, require
from attnlab.files import modes_from_umask, staging_directory
from attnlab.model_card import model_card

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

    from attnlab.models import GPT, ModelConfig

HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM"}
# What each HF class hard-wires; a model that differs would load but compute something else.
FIXED = {
    "gpt2": {"pos_encoding": "learned", "bias": True, "parallel_residual": False, "rope_scaling": None},
    "neox": {"pos_encoding": "rotary", "bias": True, "rope_scaling": None},
    "llama": {"pos_encoding": "rotary", "bias": False, "parallel_residual": False, "rotary_pct": 1.0},
}
HEAD_RENAMES = {"embed_out.weight": "lm_head.weight"}  # transformers 5 calls NeoX's output head lm_head
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>")


def check_exportable(model: GPT) -> None:
    """Refuse, naming the key, what no HF layer reproduces: an attention variant, a head mask, a block setting."""
    name = model.attention_config.get("name", "vanilla")
    require(
        name == "vanilla",
        "attention.name",
        f"{name} cannot be exported: Hugging Face has no such attention layer (only attention=vanilla models export)",
    )
    require(bool((model.head_mask() == 1).all()), "model.head_mask", "masked heads have no place in an HF model")
    config = model.config
    hf_class = HF_CLASSES[config.family]
    fixed = dict(FIXED[config.family])
    if config.family != "llama":
        fixed["n_kv_head"] = config.n_head  # grouped-query attention is Llama's alone
    for key, value in fixed.items():
        require(
            getattr(config, key) == value,
            f"model.{key}",
            f"{hf_class} (family={config.family}) needs {value!r}, this model has {getattr(config, key)!r}",
        )


def hf_config(config: ModelConfig, bos: int | None, eos: int | None) -> PretrainedConfig:
    """transformers' config for ``config``: the inverse of ``attnlab.models.hf.config_from_hf``."""
    import transformers

    tokens = {"vocab_size": config.vocab_size, "bos_token_id": bos, "eos_token_id": eos}
    common = {**tokens, "tie_word_embeddings": config.tie_embeddings}
    if config.family == "gpt2":
        return transformers.GPT2Config(
            **common,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            n_positions=config.block_size,
            n_inner=config.mlp_width,
            activation_function="gelu_new",  # our GPT-2 MLP's tanh-approximate GELU
            layer_norm_epsilon=config.norm_eps,
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
        )
    sizes = {
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.mlp_width,
        "max_position_embeddings": config.block_size,
        "attention_dropout": config.dropout,
    }
    if config.family == "neox":
        return transformers.GPTNeoXConfig(
            **common,
            **sizes,
            hidden_act="gelu",
            rotary_pct=config.rotary_pct,
            rotary_emb_base=config.rope_base,
            layer_norm_eps=config.norm_eps,
            use_parallel_residual=config.parallel_residual,
            hidden_dropout=config.dropout,
            attention_bias=True,
        )
    scaling = {"rope_type": "llama3", **config.rope_scaling} if config.rope_scaling else None
    return transformers.LlamaConfig(
        **common,
        **sizes,
        num_key_value_heads=config.n_kv_head,
        head_dim=config.head_dim,
        hidden_act="silu",
        rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_base,
        rope_scaling=scaling,
        attention_bias=False,
        mlp_bias=False,
    )


def to_hf_model(model: GPT, bos: int | None = None, eos: int | None = None) -> PreTrainedModel:
    """The transformers model computing what ``model`` computes (eval mode, same dtype)."""
    import transformers

    from attnlab.models.hf import to_hf_state_dict

    check_exportable(model)
    hf_class = getattr(transformers, HF_CLASSES[model.config.family])
    hf = hf_class(hf_config(model.config, bos, eos))
    own = set(hf.state_dict())
    state = {HEAD_RENAMES.get(k, k) if k not in own else k: v for k, v in to_hf_state_dict(model).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
    if unexpected or set(missing) - tied:  # a bug in the weight map, not a user error
        raise RuntimeError(f"export does not fit {hf_class.__name__}: missing {missing}, unexpected {unexpected}")
    dtype = next(model.parameters()).dtype
    return hf.to(dtype).eval()


def hf_tokenizer(tokenizer: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """Our ``tokenizers`` tokenizer with its end-of-text (and BOS, else end-of-text) named for transformers, padding
    with end-of-text (GPT-2's convention) and truncating to ``max_length``, the model's context."""
    from transformers import PreTrainedTokenizerFast

    from attnlab.data.tokenizer import eos_token_id

    eos = tokenizer.id_to_token(eos_token_id(tokenizer))
    bos = next((t for t in BOS_CANDIDATES if tokenizer.token_to_id(t) is not None), eos)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos, eos_token=eos, pad_token=eos, model_max_length=max_length
    )


def export(checkpoint: str | Path, directory: str | Path, force: bool = False) -> Path:
    """Write ``checkpoint`` (one of our ``.ckpt``) as an HF model directory; returns it."""
    from attnlab.models.checkpoint import load_checkpoint

    target = Path(directory)
    occupied = target.exists() and (not target.is_dir() or any(target.iterdir()))
    require(
        force or not occupied,
        "directory",
        f"{target} exists and is not empty; pass --force to write the export into it",
    )
    require(not target.exists() or target.is_dir(), "directory", f"{target} is a file, not a directory")
    run = load_checkpoint(checkpoint, key="checkpoint")
    model = run.build_model().eval()
    tokenizer = hf_tokenizer(run.tokenizer, model.config.block_size)
    hf = to_hf_model(model, tokenizer.bos_token_id, tokenizer.eos_token_id)
    hf.generation_config.pad_token_id = tokenizer.pad_token_id
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(target.parent, target.name)  # (a killed export's is removed here)
    try:
        hf.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        model_card(run).save(staging / "README.md")
        modes_from_umask(staging)
        _move_into(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _move_into(staging: Path, target: Path) -> None:
    """A new or empty target becomes the staging directory (one rename); into an existing one, file by file."""
    if not target.exists() or not any(target.iterdir()):
        if target.exists():
            target.rmdir()
        staging.rename(target)
        return
    for item in staging.iterdir():
        destination = target / item.name
        if destination.is_dir():
            shutil.rmtree(destination)
        item.replace(destination)


def parse_export_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="attnlab-export",
        description="Write one of our vanilla checkpoints as a Hugging Face model directory "
        "(config.json, model.safetensors, tokenizer.json), loadable by AutoModelForCausalLM.from_pretrained.",
    )
    parser.add_argument(
        "checkpoint", help="a training checkpoint, e.g. outputs/<experiment>/<run>/checkpoints/last.ckpt"
    )
    parser.add_argument("directory", help="where to write the export (must not exist, or be empty)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory, replacing its files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """``attnlab-export``: a bad input is one ``error:`` line and exit status 1."""
    args = parse_export_args(argv)
    try:
        written = export(args.checkpoint, args.directory, force=args.force)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    print(f"exported {args.checkpoint} to {written}")


if __name__ == "__main__":
    main()
