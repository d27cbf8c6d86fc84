"""The FlexAttention backend (``attention.backend=flex``): a variant's change as a score modification on a fused kernel.

``torch.nn.attention.flex_attention`` generates one fused (flash-style) kernel from a ``score_mod`` applied to each
scaled score and a block mask that skips the masked tiles, so a variant whose change is a term in the logits (ALiBi,
FoX's decay) runs without the (T x T) bias SDPA needs, and one that needs each row's log-sum-exp (the sink, clipped
softmax's second pass) gets it from the same kernel. On a GPU the call is compiled (``torch.compile``), which is what
makes it a kernel; on the CPU it runs eagerly, as plain math over the full score matrix, and torch refuses its
backward there, so training with it needs a GPU (the CPU checks forward agreement).

Unnormalised maps (sigmoid attention, clipped softmax) use one identity: with ``score_mod = log w(s)`` (-inf where
w = 0) flex's own softmax normalises by sum_j w_ij, so ``out * exp(lse) = sum_j w_ij v_j`` exactly (``unnormalised``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

from attnlab.errors import ConfigError

# (score, batch, head, query index, key index) -> modified score; the indices are 0-d int tensors
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def causal(_batch: Tensor, _head: Tensor, query: Tensor, key: Tensor) -> Tensor:
    """Flex's mask_mod for causal attention over one sequence: a query sees its own and earlier keys."""
    return query >= key


@lru_cache(maxsize=16)
def _cached_causal_block_mask(length: int, device: torch.device) -> BlockMask:
    return create_block_mask(causal, None, None, length, length, device=device)


def causal_block_mask(length: int, device: torch.device) -> BlockMask:
    """The causal block mask for ``length`` queries over as many keys: cached between eager forwards; inside a compiled
    graph it is built in the graph (compiled, cheap) rather than read from a Python cache dynamo cannot see into."""
    if torch.compiler.is_compiling():
        return create_block_mask(causal, None, None, length, length, device=device)
    return _cached_causal_block_mask(length, device)


def document_block_mask(documents: Tensor) -> BlockMask:
    """Flex's block mask for packed blocks (B, T) of document ids: causal within each document, nothing across them,
    and the tiles that hold only other documents' keys are skipped, not computed and masked."""

    def same_document(batch: Tensor, _head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return (query >= key) & (documents[batch, query] == documents[batch, key])

    batch, length = documents.shape
    return create_block_mask(same_document, batch, None, length, length, device=documents.device)


@cache
def _compiled_flex_attention() -> Callable[..., object]:
    return torch.compile(flex_attention, dynamic=False)


@dataclass
class FlexMask:
    """What a layer hands a variant's ``flex_attend``: the causal block mask and the position bias, for queries and
    keys of one full sequence (decoding with a KV cache stays on the variant's own path)."""

    block_mask: BlockMask
    alibi_slopes: Tensor | None = None  # (H,): ALiBi adds -slope_h * (i - j) to the scaled scores

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, scale: float, score_mod: ScoreMod | None = None, lse: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Causal flex attention, ``score_mod`` applied after the position bias (to the scores SDPA's path would
        see); with ``lse``, also each row's log-sum-exp (B, H, T) in fp32, differentiable like the output."""
        # compiled on a GPU; inside a graph being compiled (train.py compile=true) the outer compile does it
        compiled = q.device.type == "cuda" and not torch.compiler.is_compiling()
        call = _compiled_flex_attention() if compiled else flex_attention
        try:
            out = call(
                q,
                k,
                v,
                score_mod=self.score_mod(score_mod),
                block_mask=self.block_mask,
                scale=scale,
                enable_gqa=q.shape[1] != k.shape[1],
                return_aux=AuxRequest(lse=True) if lse else None,
            )
        except NotImplementedError as error:  # torch's own refusal, e.g. of a backward on the CPU
            raise ConfigError(
                "attention.backend", f"flex cannot run this call ({error}); flex trains on a GPU, sdpa runs anywhere"
            ) from error
        return (out[0], out[1].lse) if lse else out

    def score_mod(self, inner: ScoreMod | None) -> ScoreMod | None:
        """``inner`` after the position bias, as SDPA's path adds the (ALiBi) mask before the variant's map."""
        slopes = self.alibi_slopes
        if slopes is None:
            return inner

        def alibi(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            biased = score - slopes[head].to(score.dtype) * (query - key).to(score.dtype)
            return biased if inner is None else inner(biased, batch, head, query, key)

        return alibi


def log_weight(weight: Tensor) -> Tensor:
    """log(weight), -inf where the weight is 0, with a zero (not NaN) gradient there: the score_mod of a map whose
    weights are not normalised (see ``unnormalised``)."""
    positive = weight > 0
    return torch.where(positive, torch.log(torch.where(positive, weight, 1.0)), float("-inf"))


def unnormalised(out: Tensor, lse: Tensor) -> Tensor:
    """sum_j w_ij v_j from flex's output and lse under ``score_mod = log_weight(w)``: out * exp(lse), in fp32 or the
    output's dtype when wider (a row whose weights are all 0 has out = 0 and lse = -inf, so it gives 0)."""
    dtype = torch.promote_types(out.dtype, torch.promote_types(lse.dtype, torch.float32))
    return (out.to(dtype) * lse.to(dtype).exp().unsqueeze(-1)).to(out.dtype)
