"""The models a training step is compared with, built at one shape: attnlab's GPT, HF GPT-2 (SDPA and eager
attention), litgpt's GPT (a NeoX-style config: litgpt has no learned positions) and the nanoGPT-style reference.

litgpt is optional: ``pip install --no-deps litgpt`` (its pins conflict with transformers 5; its model code needs
only torch). Without it the table says so rather than leaving the column out silently.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.bench.reference import ReferenceGPT
from attnlab.models import build_gpt
from attnlab.nn_utils import fused_next_token_loss

if TYPE_CHECKING:
    from transformers import GPT2Config


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    length: int  # tokens per sequence
    batch: int

    def model_config(self, **overrides: object) -> dict[str, object]:
        return {
            "name": self.name,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "vocab_size": self.vocab_size,
            "block_size": self.length,
            **overrides,
        }


# attnlab's `tiny` preset at its training batch, and GPT-2 small (124M) at its context
SHAPES = {
    "tiny": Shape("tiny", 4, 4, 256, 8192, 256, 8),
    "gpt2": Shape("gpt2", 12, 12, 768, 50257, 1024, 1),
}
PEERS = ("attnlab", "nanogpt", "hf-sdpa", "hf-eager", "litgpt")


def litgpt_available() -> bool:
    return importlib.util.find_spec("litgpt") is not None


def build_peer(name: str, shape: Shape, attention: str = "vanilla", **model: object) -> nn.Module:
    """A freshly initialised model of ``shape`` whose forward maps (B, T) ids to (B, T, V) logits (``model``: attnlab
    model options beside the shape's, e.g. ``pos_encoding="none"``)."""
    if name == "attnlab":
        return build_gpt(shape.model_config(**model), {"name": attention})
    if name == "nanogpt":
        return ReferenceGPT(shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, shape.length)
    if name.startswith("hf-"):
        from transformers import GPT2LMHeadModel

        # GPT-2's token 50256 is outside a smaller vocabulary (only generation reads these)
        config = hf_gpt2_config(shape, use_cache=False, bos_token_id=None, eos_token_id=None)
        return LogitsOf(GPT2LMHeadModel._from_config(config, attn_implementation=name.removeprefix("hf-")))
    if name == "litgpt":
        from litgpt.config import Config
        from litgpt.model import GPT as LitGPT

        config = Config(
            block_size=shape.length,
            vocab_size=shape.vocab_size,
            padded_vocab_size=shape.vocab_size,
            n_layer=shape.n_layer,
            n_head=shape.n_head,
            n_embd=shape.n_embd,
            rotary_percentage=0.25,
            parallel_residual=True,
            bias=True,
            norm_class_name="LayerNorm",
            mlp_class_name="GptNeoxMLP",
            intermediate_size=4 * shape.n_embd,
        )
        return LitGPT(config)
    raise ValueError(f"unknown peer {name!r}; one of {PEERS}")


def hf_gpt2_config(shape: Shape, **overrides: object) -> GPT2Config:
    """HF GPT-2 at ``shape``, without dropout (attnlab's models train without it by default)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=shape.vocab_size,
        n_positions=shape.length,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **overrides,
    )


class LogitsOf(nn.Module):
    """An HF causal LM whose forward returns the logits tensor, like the others."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(input_ids=idx).logits


def training_step(
    model: nn.Module,
    tokens: Tensor,
    bf16: bool,
    fused_adamw: bool,
    compile: str | None = None,
    fused_loss: bool = False,
) -> Callable[[], None]:
    """Forward, next-token cross-entropy (fp32 logits), backward and an AdamW step: the same loss for everyone.

    ``compile``: ``"model"`` compiles the model in place, ``"loss"`` the forward and the loss as one graph (the
    cross-entropy fused with the logits' cast; what ``train.py compile=true`` does). ``fused_loss`` (attnlab's
    ``GPT`` only): the head and the loss by ``attnlab.nn_utils.fused_next_token_loss``, no full logits."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw or None)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].flatten()

    def loss() -> Tensor:
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=bf16):
            if fused_loss:
                return fused_next_token_loss(model, tokens)
            logits = model(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets)

    if compile == "model":
        model.compile()
    elif compile == "loss":
        loss = torch.compile(loss)

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
