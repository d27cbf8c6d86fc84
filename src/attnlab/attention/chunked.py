"""Plain-math attention over chunks of queries, for variants the fused kernel cannot run.

Each chunk sees its queries' full key rows (row-wise maps such as softpick, sigmoid or a log-sum-exp are exact)
and only a (chunk x T) score block exists at a time; with more than one chunk the block is recomputed in backward,
so no (T x T) matrix per head is kept at long context.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnlab.attention.base import causal_bias, compute_dtype

ChunkFunction = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]  # (q, k, v, bias or None) -> out


def over_query_chunks(
    fn: ChunkFunction, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, chunk_size: int
) -> Tensor:
    """``fn`` on each chunk of queries (B, H, chunk, d_h) over the keys it may see, concatenated on the query axis.

    k and v arrive with H or KV heads (GQA) and are repeated to H; ``mask``/``is_causal`` are SDPA's.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    t_q, offset = q.shape[2], k.shape[2] - q.shape[2]  # query i sits at key index i + offset
    dtype = compute_dtype(q)  # the bias's: fp32, or float64 for float64 inputs
    recompute = torch.is_grad_enabled() and t_q > chunk_size  # one chunk holds no more than the plain math would
    chunks = []
    for start in range(0, t_q, chunk_size):
        stop = min(start + chunk_size, t_q)
        keys, bias = k.shape[2], None
        if mask is not None:
            bias = mask[..., start:stop, :].to(dtype)
        elif is_causal:  # keys after the chunk's last query are masked for every row: skip them
            keys = stop + offset
            bias = causal_bias(stop - start, keys, q.device, dtype)
        args = (q[:, :, start:stop], k[:, :, :keys], v[:, :, :keys], bias)
        chunks.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(chunks, dim=2)


def attend_in_chunks(
    probabilities: Callable[[Tensor], Tensor],
    scale: float,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    dropout: float,
    chunk_size: int,
) -> Tensor:
    """o = dropout(probabilities(q k^T * scale + bias)) v over chunks of queries, in fp32 even under autocast (float64
    for float64 inputs): the explicit path of a variant whose row-wise map (clipped softmax, softpick, sigmoid) the
    fused kernel cannot run."""

    def chunk(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        dtype = compute_dtype(q)
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)) * scale
            probs = probabilities(scores if bias is None else scores + bias)
            return (F.dropout(probs, p=dropout) @ v.to(dtype)).to(q.dtype)

    return over_query_chunks(chunk, q, k, v, mask, is_causal, chunk_size)
