"""``model.padded_vocab_size``: the embedding and head get aligned rows, and nothing downstream ever sees them (loss,
metrics, sampling, the fused loss, HF export); ``fused_next_token_loss`` equals the plain loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.models import ModelConfig, build_gpt
from attnlab.models.checkpoint import check_record_against_weights
from attnlab.models.hf import load_pretrained_into, to_hf_state_dict
from attnlab.nn_utils import fused_next_token_loss, next_token_loss

MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 100, "block_size": 32}


@pytest.mark.parametrize(("padded", "rows"), [(None, 50257), (1, 50304), (50304, 50304), (50305, 50368)])
def test_padding_rounds_up_to_a_multiple_of_64_and_never_below_the_vocabulary(padded: int | None, rows: int) -> None:
    assert ModelConfig(vocab_size=50257, padded_vocab_size=padded).embedding_rows == rows


def twins() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A padded model (128 rows) whose extra head rows are huge, and the unpadded one with the same real weights."""
    torch.manual_seed(0)
    padded = build_gpt({**MODEL, "padded_vocab_size": 128}).eval()
    with torch.no_grad():
        padded.wte.weight[100:] = 1e3  # tied: the head's extra rows; a leak would win every argmax and softmax
    plain = build_gpt(MODEL).eval()
    plain.load_state_dict(
        {k: v[:100] if k in ("wte.weight", "lm_head.weight") else v for k, v in padded.state_dict().items()}
    )
    return padded, plain


def test_padded_logits_never_leak() -> None:
    padded, plain = twins()
    assert padded.wte.weight.shape[0] == 128
    tokens = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = padded(tokens)
        assert logits.shape == (2, 17, 100)
        torch.testing.assert_close(logits, plain(tokens))
        torch.testing.assert_close(next_token_loss(padded, tokens), next_token_loss(plain, tokens))
        torch.testing.assert_close(fused_next_token_loss(padded, tokens), next_token_loss(plain, tokens))
        greedy = padded.generate(tokens[:, :4], max_new_tokens=10, temperature=0)
        sampled = padded.generate(tokens[:, :4], max_new_tokens=10, generator=torch.Generator().manual_seed(2))
    assert torch.equal(greedy, plain.generate(tokens[:, :4], max_new_tokens=10, temperature=0))
    assert sampled.max() < 100
    exported, reference = to_hf_state_dict(padded), to_hf_state_dict(plain)
    assert exported.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(exported[key], value, msg=key)


def test_fused_loss_equals_the_plain_loss_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over several chunks (the last one short), values and every gradient; the padded rows get none."""
    monkeypatch.setattr("attnlab.nn_utils.LOSS_CHUNK_TOKENS", 7)
    padded, _ = twins()
    tokens = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(1))
    losses, grads = [], []
    for loss_fn in (next_token_loss, fused_next_token_loss):
        padded.zero_grad()
        loss = loss_fn(padded, tokens)
        loss.backward()
        losses.append(loss)
        grads.append({n: p.grad.clone() for n, p in padded.named_parameters()})
    torch.testing.assert_close(losses[0], losses[1])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    embedding_grad = grads[1]["wte.weight"]
    assert (embedding_grad[100:] == 0).all() and (embedding_grad[:100] != 0).any()


def test_a_checkpoint_of_the_vocabulary_loads_into_a_padded_model_and_its_record_checks() -> None:
    padded, plain = twins()
    fresh = build_gpt({**MODEL, "padded_vocab_size": 128})
    load_pretrained_into(fresh, {k: v for k, v in plain.state_dict().items() if not k.endswith("head_mask")})
    tokens = torch.randint(0, 100, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(fresh(tokens), plain(tokens))
    spec = {"model": {**MODEL, "padded_vocab_size": 128}, "attention": {"name": "vanilla"}}
    check_record_against_weights(Path("x.ckpt"), spec, padded.state_dict(), "checkpoint")  # no error
