"""lm-eval's view of an attnlab model, registered as ``attnlab`` so every lm-eval task can score our checkpoints.

Right padding plus causal attention makes each row's scores independent of what it is batched with, so results
do not move with the batch size (tests check it). Rolling perplexity uses lm-eval's own disjoint windows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tokenizers import Tokenizer
from tqdm import tqdm

from attnlab.config_checks import DTYPES as EVAL_DTYPES
from attnlab.data.tokenizer import eos_token_id
from attnlab.errors import ConfigError
from attnlab.models import GPT, build_gpt
from attnlab.models.checkpoint import RunCheckpoint, load_checkpoint, load_pretrained_tokenizer
from attnlab.models.hf import INIT_FROM_PREFIX

log = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in EVAL_DTYPES}  # evaluate.py checks its dtype= against these names
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>")


def load_tokenizer(
    checkpoint: str | RunCheckpoint | None = None,
    pretrained: str | None = None,
    tokenizer: str | Tokenizer | None = None,
) -> Tokenizer:
    """The checkpoint's own tokenizer (it travels inside it), else an explicit ``tokenizer``, else the pretrained
    model's. An explicit tokenizer that differs from the checkpoint's is an error: its scores would be noise."""
    explicit = load_pretrained_tokenizer(tokenizer) if isinstance(tokenizer, str) and tokenizer else tokenizer
    run = load_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    if run is not None and run.tokenizer_json is not None:
        own = run.tokenizer
        if explicit is not None and explicit.get_vocab() != own.get_vocab():
            raise ConfigError(
                "tokenizer", f"{tokenizer} is not the tokenizer {run.path} was trained with; drop tokenizer="
            )
        return own
    if explicit is not None:
        return explicit
    if run is not None:
        return run.tokenizer  # a legacy checkpoint without one: says what to pass
    if pretrained:
        return load_pretrained_tokenizer(pretrained)
    raise ConfigError("tokenizer", "nothing to load a tokenizer from: pass checkpoint=, pretrained= or tokenizer=")


def load_model(run: RunCheckpoint | None = None, pretrained: str | None = None, attention: Any = "vanilla") -> GPT:
    """The exact model one of our checkpoints holds, or an HF checkpoint with ``attention`` at its fine-tune init."""
    if run is not None:
        return run.build_model()
    if pretrained:
        return build_gpt({"init_from": INIT_FROM_PREFIX + pretrained.removeprefix(INIT_FROM_PREFIX)}, attention)
    raise ConfigError("checkpoint", "pass checkpoint=<run>/checkpoints/last.ckpt or pretrained=hf:<name or dir>")


def resolve_device(device: str | None) -> torch.device:
    """lm-eval's CLI defaults to ``cuda:0``; fall back to the CPU (with a warning) where there is none."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("device=%s requested but CUDA is not available: using the CPU", device)
        device = "cpu"
    return torch.device(device or "cpu")


def greedy_tokens(model: GPT, context: list[int], device: torch.device) -> Iterator[int]:
    """The greedy continuation of ``context`` (``GPT.decode`` at temperature 0), for as long as it is read: the
    caller decides when to stop (end-of-text, a stop string, a budget), and no forward runs for an unread token."""
    for next_ids in model.decode(torch.tensor([context], device=device), temperature=0.0):
        yield int(next_ids[0])


@register_model("attnlab")
class AttnlabLM(TemplateLM):
    """An attnlab ``GPT`` from a Lightning checkpoint (``checkpoint=``), an HF one (``pretrained=hf:<name>``) or
    an in-memory model (``model=``), scored through lm-eval's loglikelihood / rolling / generation requests."""

    def __init__(
        self,
        checkpoint: str | None = None,
        pretrained: str | None = None,
        attention: Any = "vanilla",
        tokenizer: str | Tokenizer | None = None,
        model: GPT | None = None,
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        device: str | None = "cpu",
        max_length: int | None = None,
        dtype: str = "float32",
    ) -> None:
        super().__init__()
        if str(batch_size).startswith("auto"):
            raise ConfigError("batch_size", "batch_size=auto is not supported by the attnlab model; pass an integer")
        if dtype not in DTYPES:
            raise ConfigError("dtype", f"{dtype!r} is not one of {sorted(DTYPES)}")
        self.checkpoint, self.pretrained = checkpoint, pretrained
        run = load_checkpoint(checkpoint) if checkpoint else None
        self.run_data = run.data if run is not None else {}  # what rebuilds the run's held-out split
        # the optimizer steps the checkpoint holds: a run's last.ckpt moves on, so results say which step they scored
        self.checkpoint_step = run.global_step if run is not None else None
        self.model = model if model is not None else load_model(run, pretrained, attention)
        self._device = resolve_device(device)
        self.model = self.model.to(device=self._device, dtype=DTYPES[dtype]).eval()
        self.tokenizer = load_tokenizer(run, pretrained, tokenizer)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length or self.model.config.block_size)
        if self.model.config.pos_encoding == "learned" and self.max_length > self.model.config.block_size:
            raise ConfigError(
                "max_length",
                f"{self.max_length} tokens, but the model's learned position embeddings stop at "
                f"block_size={self.model.config.block_size} (rotary models may score past it)",
            )
        vocab = self.tokenizer.get_vocab_size()
        if vocab > self.model.config.vocab_size:
            raise ConfigError(
                "tokenizer", f"{vocab} tokens but the model has {self.model.config.vocab_size} embeddings"
            )
        self._eot = eos_token_id(self.tokenizer)
        bos = [self.tokenizer.token_to_id(t) for t in BOS_CANDIDATES if self.tokenizer.token_to_id(t) is not None]
        self._prefix = bos[0] if bos else self._eot

    # ------------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        """BOS where the tokenizer has one (Llama), else end-of-text, as the first token of a scored text."""
        return self._prefix

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def get_model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {
            "attnlab_checkpoint": self.checkpoint,
            "attnlab_checkpoint_step": self.checkpoint_step,
            "attnlab_pretrained": self.pretrained,
            "attnlab_model": config.name,
            "attnlab_attention": self.model.attention_config.get("name"),
            "attnlab_parameters": self.model.num_parameters(),
        }

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def _score(self, inputs: list[list[int]], targets: list[list[int]]) -> list[tuple[float, bool]]:
        """Sum of log p(target) over the last ``len(target)`` positions of each right-padded row, and greedy-ness."""
        width = max(len(row) for row in inputs)
        batch = torch.full((len(inputs), width), self._eot, dtype=torch.long)
        for i, row in enumerate(inputs):
            batch[i, : len(row)] = torch.tensor(row)
        logprobs = F.log_softmax(self.model(batch.to(self._device)).float(), dim=-1)
        scores = []
        for i, (row, target) in enumerate(zip(inputs, targets, strict=True)):
            window = logprobs[i, len(row) - len(target) : len(row)]
            target_ids = torch.tensor(target, device=window.device)
            greedy = bool((window.argmax(dim=-1) == target_ids).all())
            scores.append((float(window.gather(-1, target_ids[:, None]).sum()), greedy))
        return scores

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str] | None, list[int], list[int]]], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        """Longest first (lm-eval's Collator), contexts left-truncated so context + continuation fit the window."""
        collator = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        results = []
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="attnlab loglikelihood")
        for chunk in collator.get_batched(n=self.batch_size):
            inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for _, ctx, cont in chunk]
            scores = self._score(inputs, [cont for _, _, cont in chunk])
            for (request, _, _), answer in zip(chunk, scores, strict=True):
                if request is not None:
                    self.cache_hook.add_partial("loglikelihood", request, answer)
                results.append(answer)
                bar.update(1)
        bar.close()
        return collator.get_original(results)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Whole-document log-likelihood over disjoint windows of ``max_length`` tokens (lm-eval's convention)."""
        windows, owners = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            pairs = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.max_length, 1)
            for context, target in map(make_disjoint_window, pairs):
                windows.append((None, context, target))
                owners.append(i)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm), strict=True):
            totals[owner] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------ generation
    def greedy_generate(self, context: list[int], max_new_tokens: int, until: list[str]) -> str:
        """Greedy decoding with the KV cache; stops at end-of-text, after ``max_new_tokens`` or at a stop string."""
        generated: list[int] = []
        text = ""
        for next_id in islice(greedy_tokens(self.model, context, self._device), max_new_tokens):
            if next_id == self._eot:
                break
            generated.append(next_id)
            text = self.tok_decode(generated)
            if any(stop in text for stop in until):
                break
        for stop in until:
            text = text.split(stop)[0]
        return text

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        outputs = []
        for request in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="attnlab generate"):
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs)
            if gen_kwargs.get("do_sample") and gen_kwargs.get("temperature", 1.0) > 0:
                log.warning("attnlab decodes greedily; ignoring do_sample=True")
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", 256))
            if max_new >= self.max_length:
                raise ConfigError("max_gen_toks", f"{max_new} leaves no room for a context in {self.max_length} tokens")
            ids = self.tok_encode(context)[-(self.max_length - max_new) :] or [self.prefix_token_id]
            text = self.greedy_generate(ids, max_new, until)
            self.cache_hook.add_partial("generate_until", (context, request.args[1]), text)
            outputs.append(text)
        return outputs
