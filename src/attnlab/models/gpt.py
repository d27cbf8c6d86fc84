"""GPT: one decoder-only transformer for GPT-2, GPT-NeoX/Pythia and Llama block styles.

Read top to bottom: positions, MLP, Block, GPT. The attention math lives in ``attnlab.attention``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from itertools import count, islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import Tensor, nn

from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention, KVCache
from attnlab.errors import require
from attnlab.models.config import ModelConfig
from attnlab.models.sizes import check_fits_in_memory


def rope_inverse_frequencies(config: ModelConfig) -> Tensor:
    """Rotary inverse frequencies, with Llama 3's wavelength-dependent scaling when ``rope_scaling`` says so."""
    dim = config.rotary_dim
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq.float()
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength) - low) / (high - low)
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    medium = (wavelength <= original / low) & (wavelength >= original / high)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(medium, blended, scaled).float()


def sinusoidal_embedding(positions: Tensor, dim: int) -> Tensor:
    """Vaswani et al.'s fixed sin/cos position embedding for absolute positions."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[:, :dim]


def alibi_slopes(n_head: int) -> Tensor:
    """Press et al.'s geometric head slopes (the closest power of two, interleaved as in their code)."""
    closest = 2 ** math.floor(math.log2(n_head))
    base = 2 ** (-8 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < n_head:
        extra = 2 ** (-4 / closest)
        slopes += [extra ** (2 * i + 1) for i in range(n_head - closest)]
    return torch.tensor(slopes)


class MLP(nn.Module):
    """GELU MLP (GPT-2 tanh-approximate, NeoX exact) or Llama's SwiGLU."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gated = config.family == "llama"
        width = config.mlp_width
        self.fc = nn.Linear(config.n_embd, width, bias=config.bias)
        self.gate = nn.Linear(config.n_embd, width, bias=config.bias) if self.gated else None
        self.proj = nn.Linear(width, config.n_embd, bias=config.bias)
        self.approximate = "tanh" if config.family == "gpt2" else "none"

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            return self.proj(F.silu(self.gate(x)) * self.fc(x))
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


def make_norm(config: ModelConfig) -> nn.Module:
    if config.family == "llama":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


class Block(nn.Module):
    """Pre-norm transformer block; GPT-NeoX adds attention and MLP in parallel when asked."""

    def __init__(self, config: ModelConfig, attention: dict[str, Any], layer: int = 0) -> None:
        super().__init__()
        shape = AttentionShape(
            n_embd=config.n_embd,
            n_head=config.n_head,
            n_kv_head=config.n_kv_head,
            head_dim=config.head_dim,
            block_size=config.block_size,
            pos_encoding=config.pos_encoding,
            layer=layer,
        )
        self.norm_1 = make_norm(config)
        self.attn = CausalSelfAttention(shape, attention, bias=config.bias, dropout=config.dropout)
        self.norm_2 = make_norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)
        self.parallel_residual = config.parallel_residual
        self.attn_residual = nn.Identity()  # names the residual sum after attention, for hooks (W8A8 quantises it)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: KVCache | None = None) -> Tensor:
        attn_out = self.dropout(self.attn(self.norm_1(x), ctx, cache))
        if self.parallel_residual:
            return x + attn_out + self.dropout(self.mlp(self.norm_2(x)))
        x = self.attn_residual(x + attn_out)
        return x + self.dropout(self.mlp(self.norm_2(x)))


class GPT(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="attnlab",
    tags=["attention", "causal-lm"],
):
    """Token ids (B, T) -> logits (B, T, vocab). ``attention`` is the ``attention`` config mapping.

    ``save_pretrained(dir)`` / ``GPT.from_pretrained(dir or hub name)`` / ``push_to_hub`` (huggingface_hub's mixin)
    keep any attention variant, which a transformers export cannot: ``config.json`` holds the architecture and the
    variant, ``model.safetensors`` the weights."""

    def __init__(self, config: ModelConfig, attention: dict[str, Any] | None = None) -> None:
        super().__init__()
        if torch.get_default_device().type == "cpu":  # (on the meta device nothing is allocated: any size counts)
            check_fits_in_memory(config, f"model {config.name}", "model")
        self.config = config
        self.attention_config = dict(attention or {"name": "vanilla"})
        self.wte = nn.Embedding(config.embedding_rows, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos_encoding == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, self.attention_config, i) for i in range(config.n_layer))
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.embedding_rows, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        # kept out of the buffers so that model.to(bfloat16) cannot round the rotary frequencies
        self.rope_inv_freq = rope_inverse_frequencies(config) if config.pos_encoding == "rotary" else None
        if config.pos_encoding == "alibi":
            self.register_buffer("alibi", alibi_slopes(config.n_head), persistent=False)
        if any(block.attn.variant.needs_token_features for block in self.blocks):
            # standardised log unigram frequency of each token id (set by the data module, saved in checkpoints)
            self.register_buffer("token_log_frequency", torch.zeros(config.vocab_size))
        self.reset_parameters()
        if config.head_mask is not None:
            self.set_head_mask(torch.tensor(config.head_mask))

    def _save_pretrained(self, save_directory: Path) -> None:
        """The weights (huggingface_hub's safetensors file) and ``config.json``: ``config`` (the architecture) and
        ``attention`` (the variant), named as ``__init__``'s arguments so the mixin passes them back on load."""
        super()._save_pretrained(save_directory)
        record = {"config": self.config.to_dict(), "attention": self.attention_config}
        (save_directory / "config.json").write_text(json.dumps(record, indent=2, sort_keys=True))

    @classmethod
    def _from_pretrained(cls, *, model_id: str, config: dict[str, Any], attention: dict[str, Any], **hub: Any) -> GPT:
        """The mixin's load, strict (every weight of the variant present) and with the architecture typed again
        (it hands ``config`` over as the JSON mapping)."""
        hub["strict"] = True
        return super()._from_pretrained(
            model_id=model_id, config=ModelConfig.from_dict(config), attention=attention, **hub
        )

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer); then each variant's own."""
        std = 0.02
        for name, module in self.named_modules():
            if ".variant" in name:
                continue
            if isinstance(module, nn.Linear):
                scaled = name.endswith(("attn.proj", "mlp.proj"))
                nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * self.config.n_layer) if scaled else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
        for block in self.blocks:
            block.attn.variant.reset_parameters()

    def init_variant_for_finetuning(self) -> None:
        """Put every variant at its fine-tuning init, so the model computes what the pretrained one did."""
        for block in self.blocks:
            block.attn.variant.init_for_finetuning()

    def set_head_mask(self, mask: Tensor) -> None:
        """Set Michel et al.'s head mask xi, shape (n_layer, n_head)."""
        for block, row in zip(self.blocks, mask, strict=True):
            block.attn.head_mask.copy_(row)
            block.attn.head_mask_changed()

    def head_mask(self) -> Tensor:
        return torch.stack([block.attn.head_mask for block in self.blocks])

    def set_token_frequencies(self, counts: Tensor) -> None:
        """Store phi = standardised log(count + 1) over the vocabulary, for frequency-aware variants."""
        if not hasattr(self, "token_log_frequency"):
            return
        padded = torch.zeros(self.config.vocab_size, dtype=torch.float64)  # ids past the tokenizer's: count 0
        padded[: counts.numel()] = counts.double()
        log_freq = torch.log(padded + 1.0)
        phi = (log_freq - log_freq.mean()) / log_freq.std().clamp_min(1e-12)
        self.token_log_frequency.copy_(phi.to(self.token_log_frequency.dtype))

    def context(self, idx: Tensor, start_pos: int = 0, documents: Tensor | None = None) -> AttentionContext:
        """Positions and per-token features for a forward pass over ``idx`` starting at absolute ``start_pos``."""
        positions = torch.arange(start_pos, start_pos + idx.shape[1], device=idx.device)
        rope = None
        if self.config.pos_encoding == "rotary":
            if self.rope_inv_freq.device != idx.device:
                self.rope_inv_freq = self.rope_inv_freq.to(idx.device)
            angles = positions.float()[:, None] * self.rope_inv_freq[None, :]
            angles = torch.cat([angles, angles], dim=-1)
            rope = (angles.cos(), angles.sin())
        features = self.token_log_frequency[idx] if hasattr(self, "token_log_frequency") else None
        return AttentionContext(
            positions=positions,
            rope=rope,
            alibi_slopes=getattr(self, "alibi", None),
            token_features=features,
            token_ids=idx,
            documents=documents,
        )

    def forward(
        self,
        idx: Tensor,
        start_pos: int | None = None,
        cache: list[KVCache] | None = None,
        documents: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab_size) for ``idx`` (B, T) whose first token sits at absolute position ``start_pos``
        (default 0); a padded output head's extra logits are sliced away here, so no loss, metric or sampler sees them.

        With ``cache`` (one ``KVCache`` per layer) the new tokens attend to the cached ones as well; ``start_pos``
        is then required (a default of 0 would silently place decoded tokens at the start of the sequence).
        ``documents`` (B, T): document masking of packed blocks (``document_ids``), a query attends to its own
        document only; positions still count from the block's start, as in Megatron's and torchtitan's packing.
        """
        return self.head(self.features(idx, start_pos, cache, documents))

    def head(self, features: Tensor) -> Tensor:
        """The output head on ``features``, its padded rows' logits dropped."""
        logits = self.lm_head(features)
        return logits if self.config.embedding_rows == self.config.vocab_size else logits[..., : self.config.vocab_size]

    def features(
        self,
        idx: Tensor,
        start_pos: int | None = None,
        cache: list[KVCache] | None = None,
        documents: Tensor | None = None,
    ) -> Tensor:
        """The final normalised hidden states (B, T, d) that the output head reads (a fused loss takes them)."""
        if start_pos is None:
            if cache is not None:
                raise ValueError("GPT.forward with a KV cache needs start_pos (the absolute position of idx[:, 0])")
            start_pos = 0
        if documents is not None and (cache is not None or documents.shape != idx.shape):
            raise ValueError("GPT.forward's documents mask full packed blocks: one id per token of idx, no KV cache")
        ctx = self.context(idx, start_pos, documents)
        x = self.wte(idx)
        if self.wpe is not None:
            if start_pos + idx.shape[1] > self.config.block_size:
                raise ValueError(
                    f"positions up to {start_pos + idx.shape[1]} exceed model.block_size={self.config.block_size}"
                )
            x = x + self.wpe(ctx.positions)
        elif self.config.pos_encoding == "sinusoidal":
            x = x + sinusoidal_embedding(ctx.positions, self.config.n_embd).to(x.dtype)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, ctx, cache[i] if cache else None)
        return self.norm_f(x)

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.blocks]

    @torch.inference_mode()
    def decode(
        self,
        idx: Tensor,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[Tensor]:
        """The next token of each row of ``idx`` (B, T), as (B,), one step at a time from the KV cache for as long as
        it is read: the caller decides when to stop, and no forward runs for a token nobody reads."""
        check_sampling(temperature, top_k, top_p)
        cache = self.new_cache()
        logits = self(idx, start_pos=0, cache=cache)[:, -1]
        for position in count(idx.shape[1]):
            next_ids = sample_next(logits, temperature, top_k, top_p, generator)
            yield next_ids
            logits = self(next_ids[:, None], start_pos=position, cache=cache)[:, -1]

    @torch.inference_mode()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """``idx`` (B, T) followed by up to ``max_new_tokens`` sampled tokens (``temperature=0``: greedy); a row that
        has emitted ``eos`` is padded with it, and decoding stops once every row has. ``generator`` seeds sampling."""
        check_sampling(temperature, top_k, top_p)
        require(max_new_tokens >= 0, "max_new_tokens", f"must be >= 0, got {max_new_tokens}")
        if self.wpe is not None:
            length = idx.shape[1] + max_new_tokens
            require(
                length <= self.config.block_size,
                "max_new_tokens",
                f"{idx.shape[1]} prompt + {max_new_tokens} new tokens exceed the learned positions "
                f"(model.block_size={self.config.block_size})",
            )
        out, finished = [idx], torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        for next_ids in islice(self.decode(idx, temperature, top_k, top_p, generator), max_new_tokens):
            if eos is not None:
                next_ids = next_ids.masked_fill(finished, eos)
                finished |= next_ids == eos
            out.append(next_ids[:, None])
            if finished.all():
                break
        return torch.cat(out, dim=1)

    def variant_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters the attention variant added (temperatures, gates): their own optimiser group."""
        return [(n, p) for n, p in self.named_parameters() if ".variant." in n]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6N + 12 L H d_h T (PaLM appendix B, as nanoGPT's estimate_mfu)."""
        c = self.config
        return 6 * self.num_parameters() + 12 * c.n_layer * c.n_head * c.head_dim * seq_len


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    require(temperature >= 0, "temperature", f"must be >= 0 (0: greedy), got {temperature}")
    require(top_k is None or top_k >= 1, "top_k", f"must be a positive integer or None, got {top_k}")
    require(top_p is None or 0 < top_p <= 1, "top_p", f"must be in (0, 1] or None, got {top_p}")


def sample_next(
    logits: Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row of ``logits`` (B, V): the argmax at temperature 0, else a sample from softmax(logits / T)
    restricted to the ``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p``
    (Holtzman et al.'s nucleus; the most likely token always stays)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above each one
        ordered = ordered.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def document_ids(idx: Tensor, separator: int) -> Tensor:
    """(B, T) the index of the document each token of packed blocks ``idx`` belongs to: the number of ``separator``
    tokens before it, so a separator closes its document and the token after it opens the next."""
    ends = (idx == separator).long()
    return ends.cumsum(dim=1) - ends
