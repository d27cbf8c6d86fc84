"""The lm-eval model against direct computation: log-likelihoods, rolling perplexity, batch size, cached decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from tokenizers import Tokenizer

from attnlab.data.tokenizer import eos_token_id, train_bpe_tokenizer
from attnlab.eval.lm import AttnlabLM
from attnlab.models import GPT, ModelConfig

BLOCK = 64


@pytest.fixture(scope="module")
def tokenizer(wiki_docs: list[dict[str, str]]) -> Tokenizer:
    return train_bpe_tokenizer((d["text"] for d in wiki_docs), 300)


@pytest.fixture(scope="module")
def model(tokenizer: Tokenizer) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, vocab_size=tokenizer.get_vocab_size())
    gpt = GPT(config, {"name": "vanilla"}).eval()
    with torch.no_grad():  # sharper than the N(0, 0.02) init, so log-probs differ between tokens
        gpt.wte.weight.mul_(20)
    return gpt


def make_lm(model: GPT, tokenizer: Tokenizer, batch_size: int = 4) -> AttnlabLM:
    return AttnlabLM(model=model, tokenizer=tokenizer, batch_size=batch_size)


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


PAIRS = [
    ("The cat sat on the", " mat"),
    ("In 1905 Einstein published", " four papers that changed physics"),
    ("A", " b"),
    ("The river flows through the old town and", " into the sea"),
    ("Paris is the capital of", " France"),
    ("Water boils at one hundred", " degrees"),
    ("She opened the door and saw", " nothing at all"),
    (("A context longer than the model's window is cut on the left, keeping its end. " * 3).rstrip(), " Like this"),
]


def direct_loglikelihood(model: GPT, tokenizer: Tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) summed token by token, from one unpadded forward pass over the last
    ``BLOCK + 1`` tokens."""
    n_cont = len(tokenizer.encode(context + continuation).ids) - len(tokenizer.encode(context).ids)
    whole = tokenizer.encode(context + continuation).ids[-(BLOCK + 1) :]
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([whole[:-1]])).float(), dim=-1)[0]
    return sum(float(logprobs[i - 1, whole[i]]) for i in range(len(whole) - n_cont, len(whole)))


def test_loglikelihood_equals_direct_sum_of_token_logprobs(model: GPT, tokenizer: Tokenizer) -> None:
    got = make_lm(model, tokenizer).loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (context, continuation), (logprob, _) in zip(PAIRS, got, strict=True):
        assert logprob == pytest.approx(direct_loglikelihood(model, tokenizer, context, continuation), abs=1e-4)
    assert len({round(lp, 3) for lp, _ in got}) == len(PAIRS)


def test_greedy_flag_is_true_exactly_for_the_argmax_continuation(model: GPT, tokenizer: Tokenizer) -> None:
    context = "The cat sat on the"
    ids = tokenizer.encode(context).ids
    with torch.no_grad():
        best = int(model(torch.tensor([ids]))[0, -1].argmax())
    worst = int(model(torch.tensor([ids]))[0, -1].argmin())
    lm = make_lm(model, tokenizer)
    results = lm._loglikelihood_tokens([(None, ids, [best]), (None, ids, [worst])])
    assert [greedy for _, greedy in results] == [True, False]


def direct_rolling(model: GPT, tokens: list[int], prefix: int, window: int) -> float:
    """Tokens scored in disjoint chunks of ``window``; each chunk's input is the ``window`` tokens before its last
    target (the prefix token first), so a short final chunk sees a full window of context."""
    total, padded = 0.0, [prefix, *tokens]  # padded[i] is the input that predicts tokens[i]
    for start in range(0, len(tokens), window):
        end = min(start + window, len(tokens))
        inputs = padded[max(0, end - window) : end]
        with torch.no_grad():
            logprobs = F.log_softmax(model(torch.tensor([inputs])).float(), dim=-1)[0, -(end - start) :]
        total += float(logprobs.gather(-1, torch.tensor(tokens[start:end])[:, None]).sum())
    return total


DOCS = [
    "The history of the city goes back to Roman times, when a small fort guarded the river crossing. " * 4,
    "Short text.",
    "Mathematics is the study of numbers, shapes and patterns; physics asks how the world moves. " * 3,
]


def test_rolling_loglikelihood_of_long_documents_equals_disjoint_windows(model: GPT, tokenizer: Tokenizer) -> None:
    lm = make_lm(model, tokenizer)
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(d,) for d in DOCS]), disable_tqdm=True)
    assert len(tokenizer.encode(DOCS[0]).ids) > 3 * BLOCK  # several windows
    for doc, value in zip(DOCS, got, strict=True):
        expected = direct_rolling(model, tokenizer.encode(doc).ids, eos_token_id(tokenizer), BLOCK)
        assert value == pytest.approx(expected, abs=1e-3)


def test_scores_do_not_depend_on_the_batch_size(model: GPT, tokenizer: Tokenizer) -> None:
    ll, rolling = [], []
    for batch_size in (1, 3, 8):
        lm = make_lm(model, tokenizer, batch_size)
        ll.append([lp for lp, _ in lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)])
        rolling.append(lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(d,) for d in DOCS]), True))
    for other in ll[1:]:
        assert other == pytest.approx(ll[0], abs=1e-4)
    for other in rolling[1:]:
        assert other == pytest.approx(rolling[0], abs=1e-3)


def greedy_without_cache(model: GPT, ids: list[int], steps: int, eot: int) -> list[int]:
    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            next_id = int(model(torch.tensor([ids + out]))[0, -1].argmax())
        if next_id == eot:
            break
        out.append(next_id)
    return out


def test_generate_with_kv_cache_equals_greedy_decoding_without_it(model: GPT, tokenizer: Tokenizer) -> None:
    lm = make_lm(model, tokenizer)
    contexts = ["The cat sat on the", "Mathematics is the study of numbers, shapes and patterns; physics " * 2]
    args = [(c, {"until": [], "max_gen_toks": 12, "do_sample": False}) for c in contexts]
    got = lm.generate_until(requests("generate_until", args), disable_tqdm=True)
    for context, text in zip(contexts, got, strict=True):
        ids = tokenizer.encode(context).ids[-(BLOCK - 12) :]  # left-truncated to leave room for the answer
        expected = greedy_without_cache(model, ids, 12, eos_token_id(tokenizer))
        assert text == tokenizer.decode(expected)
        assert len(expected) > 1


def test_generation_stops_at_the_first_stop_string(model: GPT, tokenizer: Tokenizer) -> None:
    lm = make_lm(model, tokenizer)
    free = lm.generate_until(requests("generate_until", [("The cat sat on the", {"max_gen_toks": 12})]), True)[0]
    assert len(free) > 2
    stop = free[1:3]
    cut = lm.generate_until(
        requests("generate_until", [("The cat sat on the", {"max_gen_toks": 12, "until": [stop]})]), True
    )[0]
    assert cut == free.split(stop)[0]
