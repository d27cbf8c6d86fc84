"""Head masking, importance and pruning (Michel et al. 2019)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention.head_importance import head_importance, prune_heads_by_importance
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT

VOCAB = 53


def tiny(attention: str = "vanilla", **overrides) -> GPT:
    torch.manual_seed(0)
    config = {"n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "vocab_size": VOCAB, "block_size": 32}
    config.update(overrides)
    return GPT(ModelConfig(pos_encoding="rotary", **config), {"name": attention}).eval()


def batches(n: int = 3, length: int = 17) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (2, length), generator=g) for _ in range(n)]


@pytest.mark.parametrize("attention", ["vanilla", "gated_sdpa", "ssa", "clipped_softmax"])
def test_all_ones_mask_is_the_unmasked_model(attention: str) -> None:
    model = tiny(attention)
    idx = batches()[0]
    before = model(idx)
    model.set_head_mask(torch.ones(3, 4))
    assert torch.equal(model(idx), before)
    model.set_head_mask(torch.tensor([[1.0, 0, 1, 1]] * 3))
    assert not torch.allclose(model(idx), before)


@pytest.mark.parametrize("attention", ["vanilla", "gated", "gated_sdpa", "ssa"])
def test_masking_a_head_zeroes_its_slice_before_w_o(attention: str) -> None:
    model = tiny(attention)
    idx = batches()[0]
    mask = torch.ones(3, 4)
    mask[1, 2] = mask[0, 0] = 0
    model.set_head_mask(mask)
    masked = model(idx)
    model.set_head_mask(torch.ones(3, 4))

    def zero_slice(layer: int, head: int):
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor]) -> tuple[torch.Tensor]:
            heads = args[0].unflatten(-1, (4, 8)).clone()
            heads[..., head, :] = 0
            return (heads.flatten(-2),)

        return model.blocks[layer].attn.proj.register_forward_pre_hook(hook)

    handles = [zero_slice(1, 2), zero_slice(0, 0)]
    try:
        torch.testing.assert_close(model(idx), masked, atol=0, rtol=0)
    finally:
        for handle in handles:
            handle.remove()


def test_head_mask_from_config() -> None:
    mask = [[1.0, 0.0, 1.0, 1.0], [1.0] * 4, [0.0] * 4]
    assert torch.equal(tiny(head_mask=mask).head_mask(), torch.tensor(mask))


def mask_gradient(model: GPT, batch: torch.Tensor) -> torch.Tensor:
    """dL/dxi with xi the layer's (H,) mask buffer: the token-summed gradient, before any absolute value."""
    masks = [block.attn.head_mask.requires_grad_() for block in model.blocks]
    loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
    grads = torch.autograd.grad(loss, masks)
    for m in masks:
        m.requires_grad_(False)
    return torch.stack(grads)


def test_importance_is_gradient_of_the_mask_for_one_token() -> None:
    model = tiny()
    batch = torch.tensor([[3, 7]])  # one input token: per-token and summed gradients coincide
    importance = head_importance(model, [batch], normalise=False)
    torch.testing.assert_close(importance, mask_gradient(model, batch).abs(), atol=1e-7, rtol=1e-5)


def test_importance_takes_absolute_value_per_token() -> None:
    """|sum_t g_t| <= sum_t |g_t|, strictly for some head: the absolute value is not taken after summing."""
    model = tiny()
    batch = batches(1, 17)[0]
    importance = head_importance(model, [batch], normalise=False)
    summed = mask_gradient(model, batch).abs()
    assert (importance >= summed - 1e-7).all()
    assert (importance > summed + 1e-6).any()


def test_importance_is_normalised_per_layer_and_accumulates_over_batches() -> None:
    model = tiny("ssa")
    data = batches(3)
    importance = head_importance(model, data)
    assert importance.shape == (3, 4)
    torch.testing.assert_close(importance.norm(dim=-1), torch.ones(3))
    raw = head_importance(model, data, normalise=False)
    parts = sum(head_importance(model, [b], normalise=False) for b in data)
    torch.testing.assert_close(raw, parts)
    assert model.training is False and all(p.grad is None for p in model.parameters())


def test_masked_head_scores_zero() -> None:
    model = tiny()
    model.set_head_mask(torch.tensor([[0.0, 1, 1, 1], [1.0] * 4, [1.0] * 4]))
    assert head_importance(model, batches(1))[0, 0] == 0


def test_prune_heads_by_importance_is_global_and_keeps_pruned_heads_off() -> None:
    importance = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.3]])
    mask = prune_heads_by_importance(importance, 2)
    assert torch.equal(mask, torch.tensor([[1.0, 0, 1], [0, 1, 1]]))
    previous = torch.tensor([[0.0, 1, 1], [1, 1, 1]])  # the most important head was already pruned
    mask = prune_heads_by_importance(importance, 2, previous)
    assert torch.equal(mask, torch.tensor([[0.0, 0, 1], [1, 1, 1]]))


def test_a_loaded_mask_is_applied_and_an_all_ones_mask_costs_nothing() -> None:
    """The multiply is skipped for an all-ones mask; a mask that arrives through a state dict (a checkpoint) is
    still applied, and the flag survives pickling (spawned DDP workers get the model that way)."""
    import pickle

    masked = tiny()
    masked.set_head_mask(torch.tensor([[1.0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]))
    fresh = tiny()
    assert not any(block.attn.masks_heads for block in fresh.blocks)
    fresh.load_state_dict(masked.state_dict())
    assert [block.attn.masks_heads for block in fresh.blocks] == [True, False, True]
    idx = batches()[0]
    assert torch.equal(fresh(idx), masked(idx))
    assert torch.equal(pickle.loads(pickle.dumps(fresh))(idx), masked(idx))
