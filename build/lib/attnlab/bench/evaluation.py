"""Evaluation speed on the same weights: attnlab's lm-eval adapter against lm-eval's own ``HFLM``, and greedy
decoding with attnlab's KV cache against HF ``generate``.

One randomly initialised attnlab ``vanilla`` model is exported to ``GPT2LMHeadModel`` (``to_hf_state_dict``), so
both sides hold the same weights; the requests are cut from the embedded corpus's held-out documents with its
tokenizer. Equal results are checked, not assumed: each pair reports its largest log-likelihood difference, and
decoding whether the two sides chose the same tokens.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import torch
from lm_eval.api.instance import Instance
from tokenizers import Tokenizer
from torch import nn

from attnlab.bench.peers import Shape, hf_gpt2_config
from attnlab.bench.timing import Contender, Progress, time_round_robin
from attnlab.data.tokenizer import eos_token_id
from attnlab.eval.lm import AttnlabLM, greedy_tokens
from attnlab.models import build_gpt
from attnlab.models.hf import to_hf_state_dict

if TYPE_CHECKING:
    from lm_eval.models.huggingface import HFLM

CONTEXT_WORDS, CONTINUATION_WORDS = 48, 4  # a loglikelihood request: a stretch of text and the words after it


@dataclass
class Workload:
    loglikelihood: list[Instance]  # (context, continuation) pairs, as a multiple-choice task sends them
    rolling: list[Instance]  # whole documents, as a perplexity task sends them
    prompts: list[list[int]]  # token ids to continue greedily


@dataclass
class Pair:
    """One kind of work done by both sides: the calls are timed, their results compared."""

    work: str
    reference: str  # who attnlab is compared with
    unit: str  # what one call does: requests or tokens
    per_call: int
    ours: Callable[[], list]
    theirs: Callable[[], list]
    compare: Callable[[list, list], str]  # how equal the two results are, in words

    @property
    def names(self) -> tuple[str, str]:
        return f"attnlab {self.work}", f"{self.reference} {self.work}"


def workload(
    documents: list[str], tokenizer: Tokenizer, n_loglikelihood: int, n_rolling: int, n_prompts: int, prompt_len: int
) -> Workload:
    """Requests cut from ``documents`` in order: loglikelihood pairs and prompts from successive stretches of each
    document (the held-out split is a few long articles), rolling requests from whole documents."""
    pairs, prompts, span = [], [], CONTEXT_WORDS + CONTINUATION_WORDS
    for text in documents:
        words = text.split()
        for start in range(0, len(words) - span + 1, span):
            context, continuation = words[start : start + CONTEXT_WORDS], words[start + CONTEXT_WORDS : start + span]
            pairs.append((" ".join(context), " " + " ".join(continuation)))
        ids = tokenizer.encode(text).ids
        prompts += [ids[start : start + prompt_len] for start in range(0, len(ids) - prompt_len + 1, prompt_len)]
    found = {"loglikelihood": len(pairs), "rolling": len(documents), "prompts": len(prompts)}
    wanted = {"loglikelihood": n_loglikelihood, "rolling": n_rolling, "prompts": n_prompts}
    short = [f"{k}: {found[k]} of {wanted[k]}" for k in wanted if found[k] < wanted[k]]
    if short:
        raise ValueError(f"the held-out documents do not give enough requests ({', '.join(short)})")
    return Workload(
        loglikelihood=[Instance("loglikelihood", {}, pair, idx) for idx, pair in enumerate(pairs[:n_loglikelihood])],
        rolling=[Instance("loglikelihood_rolling", {}, (text,), idx) for idx, text in enumerate(documents[:n_rolling])],
        prompts=prompts[:n_prompts],
    )


def twin_models(
    shape: Shape, tokenizer: Tokenizer, batch_size: int, device: torch.device
) -> tuple[AttnlabLM, nn.Module, HFLM]:
    """attnlab's adapter, the HF GPT-2 holding the same weights, and lm-eval's ``HFLM`` around it."""
    from lm_eval.models.huggingface import HFLM
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    ours = build_gpt(shape.model_config(), {"name": "vanilla"}).eval()
    eot = eos_token_id(tokenizer)
    config = hf_gpt2_config(shape, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    hf = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa").eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the head is tied to wte, which was loaded
        raise RuntimeError(f"export does not fit GPT2LMHeadModel: missing {missing}, unexpected {unexpected}")
    hf = hf.to(device)  # HFLM runs a model instance where it is
    eos = tokenizer.id_to_token(eot)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=eos, eos_token=eos, pad_token=eos)
    adapter = AttnlabLM(
        model=ours, tokenizer=tokenizer, batch_size=batch_size, device=str(device), max_length=shape.length
    )
    # HFLM's logits cache only serves requests that share a context; every request here has its own
    reference = HFLM(
        pretrained=hf, tokenizer=hf_tokenizer, batch_size=batch_size, max_length=shape.length, logits_cache=False
    )
    return adapter, hf, reference


def hf_greedy(model: nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """HF ``generate``, greedy with its KV cache, exactly ``new_tokens`` tokens (end-of-text does not stop it)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()


def attnlab_greedy(adapter: AttnlabLM, prompt: list[int], new_tokens: int) -> list[int]:
    return list(islice(greedy_tokens(adapter.model, prompt, adapter.device), new_tokens))


def benchmark_evaluation(
    shape: Shape,
    documents: list[str],
    tokenizer: Tokenizer,
    *,
    device: torch.device,
    n_loglikelihood: int,
    n_rolling: int,
    n_prompts: int,
    prompt_len: int,
    new_tokens: int,
    batch_size: int,
    rounds: int,
    progress: Progress,
) -> list[dict]:
    """Rows of the report: per kind of work, both sides' rate, attnlab's speed-up and how equal the results are."""
    if prompt_len + new_tokens > shape.length:
        raise ValueError(f"prompt {prompt_len} + {new_tokens} new tokens exceed the context of {shape.length}")
    work = workload(documents, tokenizer, n_loglikelihood, n_rolling, n_prompts, prompt_len)
    progress(f"evaluation: building the twin models at the {shape.name} shape")
    adapter, hf, reference = twin_models(shape, tokenizer, batch_size, device)

    def decode_all(decode: Callable[[list[int]], list[int]]) -> Callable[[], list[list[int]]]:
        return lambda: [decode(prompt) for prompt in work.prompts]

    pairs = [
        Pair(
            "loglikelihood",
            "lm-eval HFLM",
            "requests",
            len(work.loglikelihood),
            lambda: adapter.loglikelihood(work.loglikelihood, disable_tqdm=True),
            lambda: reference.loglikelihood(work.loglikelihood, disable_tqdm=True),
            loglikelihood_agreement,
        ),
        Pair(
            "rolling log-likelihood",
            "lm-eval HFLM",
            "requests",
            len(work.rolling),
            lambda: adapter.loglikelihood_rolling(work.rolling, disable_tqdm=True),
            lambda: quiet(reference.loglikelihood_rolling, work.rolling),
            largest_difference,
        ),
        Pair(
            "greedy decoding",
            "HF generate",
            "tokens",
            len(work.prompts) * new_tokens,
            decode_all(lambda prompt: attnlab_greedy(adapter, prompt, new_tokens)),
            decode_all(lambda prompt: hf_greedy(hf, prompt, new_tokens)),
            same_tokens,
        ),
    ]
    progress("evaluation: one call each, to compare the results")
    agreements = [pair.compare(pair.ours(), pair.theirs()) for pair in pairs]
    contenders = [Contender(name, call) for p in pairs for name, call in zip(p.names, (p.ours, p.theirs), strict=True)]
    with torch.inference_mode():
        timings = time_round_robin(contenders, rounds, warmup=0, progress=progress)
    rows = []
    for pair, equal in zip(pairs, agreements, strict=True):
        ours, theirs = (timings[name] for name in pair.names)
        rows.append(
            {
                "work": pair.work,
                "per call": f"{pair.per_call} {pair.unit}",
                "reference": pair.reference,
                "attnlab /s": rate(pair.per_call / ours.median_s),
                "reference /s": rate(pair.per_call / theirs.median_s),
                "attnlab speed-up": f"{theirs.median_s / ours.median_s:.2f}",
                "spread (attnlab / ref)": f"{100 * ours.spread:.0f}% / {100 * theirs.spread:.0f}%",
                "results": equal,
            }
        )
    return rows


def quiet(call: Callable, requests: list[Instance]) -> list:
    """HFLM's rolling path shows a progress bar per batch whatever ``disable_tqdm`` says; it goes nowhere here."""
    with contextlib.redirect_stderr(io.StringIO()):
        return call(requests, disable_tqdm=True)


def rate(per_second: float) -> str:
    return f"{per_second:,.1f}" if per_second >= 10 else f"{per_second:.3g}"


def largest_difference(ours: list[float], theirs: list[float]) -> str:
    """Largest log-likelihood difference, absolute and relative to the request's own (a rolling request sums
    thousands of tokens)."""
    pairs = list(zip(ours, theirs, strict=True))
    worst = max(abs(a - b) for a, b in pairs)
    relative = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)
    return f"max abs diff {worst:.1e} (relative {relative:.0e})"


def loglikelihood_agreement(ours: list[tuple[float, bool]], theirs: list[tuple[float, bool]]) -> str:
    """``largest_difference`` of the log-likelihoods, and how many greedy flags differ (a flip changes accuracy)."""
    flips = sum(a[1] != b[1] for a, b in zip(ours, theirs, strict=True))
    return f"{largest_difference([r[0] for r in ours], [r[0] for r in theirs])}, greedy flags differ: {flips}"


def same_tokens(ours: list[list[int]], theirs: list[list[int]]) -> str:
    agree = sum(a == b for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True))
    total = sum(len(x) for x in ours)
    return f"same tokens: {agree} of {total}"
