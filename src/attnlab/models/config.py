"""The model's architecture as one plain dataclass: its defaults are every preset's base (conf/model/*.yaml state
only what differs), checkpoints store it."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from attnlab.errors import ConfigError, require, require_choice
from attnlab.field_checks import check_fields

FAMILIES = ("gpt2", "neox", "llama")
POSITION_ENCODINGS = ("learned", "rotary", "sinusoidal", "alibi", "none")
PAD_MULTIPLE = 64  # model.padded_vocab_size rounds up to this


@dataclass
class ModelConfig:
    """Architecture of a decoder-only transformer; ``family`` picks the block style (norm, MLP, residual)."""

    name: str = "tiny"  # the preset's name (conf/model/<name>.yaml); results and table cells are labelled with it
    family: str = "gpt2"  # block style: gpt2 | neox | llama (norm, MLP, residual; see the README's Models)
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block (query heads under GQA); must divide n_embd
    n_embd: int = 256  # width of the residual stream; head size = n_embd / n_head
    n_kv_head: int | None = None  # grouped-query attention; None means n_head (plain multi-head)
    block_size: int = 256  # the model's context: the longest sequence it can take
    vocab_size: int = 8192  # set from the tokenizer when training from scratch
    # rows of the embedding and output head, rounded up to a multiple of 64 (at least vocab_size; GPUs' matrix
    # products want aligned widths: 50,257 -> 50,304); the extra logits are sliced away in forward. None: vocab_size
    padded_vocab_size: int | None = None
    intermediate_size: int | None = None  # MLP width; None means 4 * n_embd
    bias: bool = True  # biases in the linear layers and norms (false: Llama style)
    dropout: float = 0.0  # dropout probability (attention, residual branches, embeddings), in [0, 1); 0: none
    norm_eps: float = 1e-5  # epsilon of LayerNorm / RMSNorm
    pos_encoding: str = "learned"  # learned | rotary | sinusoidal | alibi | none
    rotary_pct: float = 1.0  # fraction of each head's dims that rotary rotates (Pythia 0.25)
    rope_base: float = 10000.0  # rotary base frequency theta (Llama 3: 500000)
    rope_scaling: dict[str, Any] | None = None  # Llama 3 style: factor, low/high_freq_factor, original_max_...
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    tie_embeddings: bool = True  # the output head shares the token embedding matrix (GPT-2); false: its own
    tokenizer: str | None = None  # hub name or directory of the model's own tokenizer; None: train a BPE
    init_from: str | None = None  # "hf:<name or dir>" or one of our .ckpt: start from its weights (fine-tuning)
    head_mask: list[list[float]] | None = None  # (n_layer, n_head) of {0, 1}; None means all heads on
    extra: dict[str, Any] = field(default_factory=dict)  # provenance (e.g. the HF config it came from)

    def __post_init__(self) -> None:
        check_fields(self.__dict__, ModelConfig, "model")  # a config.json or a record is data from a file
        require_choice(self.family, FAMILIES, "model.family")
        require_choice(self.pos_encoding, POSITION_ENCODINGS, "model.pos_encoding")
        for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            value = getattr(self, key)
            allowed = f"must be a positive integer, got {value!r}"
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"model.{key}", allowed)
        if self.padded_vocab_size is not None:
            size = self.padded_vocab_size
            require(size > 0, "model.padded_vocab_size", f"must be positive or null, got {size}")
        require(
            self.n_embd % self.n_head == 0,
            "model.n_embd",
            f"n_embd={self.n_embd} must be divisible by model.n_head={self.n_head}",
        )
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        require(
            0 < self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0,
            "model.n_kv_head",
            f"must divide model.n_head={self.n_head}, got {self.n_kv_head}",
        )
        require(0.0 < self.rotary_pct <= 1.0, "model.rotary_pct", f"must be in (0, 1], got {self.rotary_pct}")
        require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        if self.pos_encoding == "rotary":
            require(self.rotary_dim % 2 == 0, "model.rotary_pct", f"rotary dims {self.rotary_dim} must be even")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "llama3"))
            require_choice(rope_type, ("llama3",), "model.rope_scaling.rope_type")
            require("factor" in self.rope_scaling, "model.rope_scaling", "needs a 'factor' (Llama 3 rope scaling)")
        if self.head_mask is not None:
            shape = (len(self.head_mask), {len(row) for row in self.head_mask})
            require(
                shape == (self.n_layer, {self.n_head}),
                "model.head_mask",
                f"must have shape (n_layer={self.n_layer}, n_head={self.n_head})",
            )

    @property
    def embedding_rows(self) -> int:
        """Rows of the token embedding and output head: ``vocab_size``, or padded (``padded_vocab_size``)."""
        return embedding_rows(self.vocab_size, self.padded_vocab_size)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @property
    def mlp_width(self) -> int:
        return self.intermediate_size or 4 * self.n_embd

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a (Hydra) mapping, rejecting unknown keys by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"model.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(known))}")
        return cls(**values)


def embedding_rows(vocab_size: int, padded_vocab_size: int | None) -> int:
    """``vocab_size``, or ``max(padded_vocab_size, vocab_size)`` rounded up to a multiple of 64."""
    if padded_vocab_size is None:
        return vocab_size
    return -(-max(padded_vocab_size, vocab_size) // PAD_MULTIPLE) * PAD_MULTIPLE


def store_defaults() -> None:
    """``/model_defaults``: the dataclass's defaults as the Hydra node every conf/model preset extends."""
    from hydra.core.config_store import ConfigStore

    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(ModelConfig)}
    ConfigStore.instance().store(name="model_defaults", node=defaults)
