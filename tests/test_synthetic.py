"""SSA synthetic experiments (Table 1 / Figure 3, Table 2): data distributions, the two oracle variants, exact
multi-seed training, metrics, and each table end to end at a few steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from experiments import paper_numbers
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

import attnlab.resolvers  # noqa: F401
from attnlab.attention import AttentionContext, AttentionShape, CausalSelfAttention
from attnlab.errors import ConfigError
from attnlab.synthetic.data import (
    bayes_optimal,
    denoising_batch,
    graph_batch,
    naive_average,
    normalised_mse,
    option_counts,
    query_sequences,
    transition_matrix,
)
from attnlab.synthetic.model import SyntheticAttentionModel
from attnlab.synthetic.runs import evaluate_graph, train_seeds
from attnlab.synthetic.tables import run

CONF = Path(__file__).resolve().parents[1] / "conf"
EDGES = [[0, 1], [0, 2], [0, 3], [1, 4], [2, 5], [3, 6]]
GROUPS = [3, 2, 2, 2, 1, 1, 1, 0]
LOOKUP = {"name": "temp_lookup", "num_groups": 4, "token_groups": GROUPS}


def compose_synthetic(experiment: str, output_dir: Path):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="synthetic", overrides=[f"synthetic_table={experiment}"])
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.results_dir = str(output_dir)
    return cfg


def test_transition_matrix_is_uniform_over_node_and_neighbours() -> None:
    p = transition_matrix(8, EDGES)
    assert option_counts(p).tolist() == [4, 3, 3, 3, 2, 2, 2, 1]
    torch.testing.assert_close(p.sum(dim=1), torch.ones(8))
    assert p[0, :4].eq(0.25).all() and p[0, 4:].eq(0).all()
    assert p[4].tolist() == [0, 0.5, 0, 0, 0.5, 0, 0, 0] and p[7].tolist() == [0] * 7 + [1]
    assert torch.equal(p > 0, (p > 0).T)


def test_graph_sequences_are_permutations_and_labels_follow_p_star() -> None:
    p = transition_matrix(8, EDGES)
    tokens, labels = graph_batch(p, 40000, torch.Generator().manual_seed(0))
    assert torch.equal(tokens.sort(dim=1).values, torch.arange(8).expand(40000, 8))
    last = tokens[:, -1]
    assert (p[last, labels] > 0).all()
    assert torch.bincount(last, minlength=8).div(40000).sub(1 / 8).abs().max() < 0.01  # query uniform
    for q in range(8):
        empirical = torch.bincount(labels[last == q], minlength=8).float()
        assert (empirical / empirical.sum() - p[q]).abs().max() < 0.03, q


def test_table1_groups_are_the_number_of_options() -> None:
    cfg = compose_synthetic("table1/default", Path("unused"))
    options = option_counts(transition_matrix(cfg.graph.nodes, cfg.graph.edges))
    assert list(cfg.models.ssa.token_groups) == (options - 1).tolist()
    assert cfg.optim.lr == 1e-4 and cfg.models.vanilla.name == "vanilla"


def test_denoising_distribution() -> None:
    sigma, length = 0.3, 12
    data = denoising_batch(50000, length, sigma, 0.25, 8, torch.Generator().manual_seed(0))
    assert data.signal[:, -1].all()
    assert abs(data.signal[:, :-1].float().mean().item() - 0.25) < 0.005
    assert torch.equal(data.y.sum(dim=1), torch.ones(50000)) and data.y.eq(0).logical_or(data.y.eq(1)).all()
    assert data.y.mean(dim=0).sub(1 / 8).abs().max() < 0.01  # q uniform over K
    noise = data.x - data.signal.unsqueeze(-1) * data.y.unsqueeze(1)
    assert abs(noise.mean().item()) < 0.005 and abs(noise.std().item() - sigma) < 0.005


def test_baselines_and_risk() -> None:
    x = torch.tensor([[[1.0, 0, 0], [0, 2, 0], [3, 0, 0]]])
    signal = torch.tensor([[True, False, True]])
    torch.testing.assert_close(bayes_optimal(x, signal), torch.tensor([[2.0, 0, 0]]))
    torch.testing.assert_close(naive_average(x), torch.tensor([[4 / 3, 2 / 3, 0]]))
    y = torch.tensor([[1.0, 0, 0]])
    assert normalised_mse(y, torch.tensor([[5.0, 0, 0]])).item() == 0
    assert normalised_mse(y, torch.tensor([[0.0, 3, 0]])).item() == pytest.approx(2)
    assert normalised_mse(y, torch.tensor([[-1.0, 0, 0]])).item() == pytest.approx(4)


def layer(attention: dict, dim: int = 4, seed: int = 0) -> CausalSelfAttention:
    torch.manual_seed(seed)
    shape = AttentionShape(n_embd=dim, n_head=1, n_kv_head=1, head_dim=dim, block_size=16)
    return CausalSelfAttention(shape, attention, bias=False, dropout=0.0)


def test_value_selection_formula() -> None:
    attn = layer({"name": "value_select"})
    x = torch.tensor([[[0.6, 0, 0, 0], [0.4, 0.49, -1, 0], [0, 0, 0, 0.5], [-2, 0.1, 0.2, 0.3]]])
    q, k, v = (torch.randn(1, 1, 4, 4) for _ in range(3))
    new_q, new_k, new_v = attn.variant.transform_qkv(x, q, k, v, AttentionContext(positions=torch.arange(4)))
    assert new_q is q and new_k is k
    torch.testing.assert_close(new_v, v * torch.tensor([1.0, 0, 1, 0]).view(1, 1, 4, 1))


def test_value_selection_drops_noise_tokens_from_the_output() -> None:
    """A dropped token still takes attention weight but adds nothing: changing its value-side content only
    through the value path (same max, other coordinates) leaves the direction of the output unchanged."""
    model = SyntheticAttentionModel(4, {"name": "value_select"}, 8)
    with torch.no_grad():
        model.attn.qkv.weight[:4].zero_()  # q = 0: uniform attention, so only values matter
    x = torch.tensor([[[1.0, 0, 0, 0], [0.1, 0.2, -0.3, 0.4], [0.9, 0.1, 0, 0]]])
    changed = x.clone()
    changed[0, 1] = torch.tensor([0.45, -0.2, 0.3, 0.1])
    torch.testing.assert_close(model(x), model(changed))
    vanilla = SyntheticAttentionModel(4, {"name": "vanilla"}, 8)
    vanilla.load_state_dict(model.state_dict())
    assert not torch.allclose(vanilla(x), vanilla(changed))


def test_temperature_lookup_formula_and_identity() -> None:
    attn = layer(LOOKUP, dim=8)
    with torch.no_grad():
        attn.variant.temperature.copy_(torch.tensor([[0.5, 2.0, 4.0, 0.25]]))
    ids = torch.tensor([[7, 0, 4, 1, 9]])  # 9 is past the map: group 0
    q, k, v = (torch.randn(1, 1, 5, 8) for _ in range(3))
    ctx = AttentionContext(positions=torch.arange(5), token_ids=ids)
    new_q, new_k, new_v = attn.variant.transform_qkv(torch.randn(1, 5, 8), q, k, v, ctx)
    torch.testing.assert_close(new_q, q / torch.tensor([0.5, 0.25, 2.0, 4.0, 0.5]).view(1, 1, 5, 1))
    assert new_k is k and new_v is v
    lookup = SyntheticAttentionModel(8, LOOKUP, 8, vocab_size=8, num_outputs=8)  # T = 1 at init
    vanilla = SyntheticAttentionModel(8, {"name": "vanilla"}, 8, vocab_size=8, num_outputs=8)
    vanilla.load_state_dict(lookup.state_dict(), strict=False)
    tokens = query_sequences(8)
    torch.testing.assert_close(lookup(tokens), vanilla(tokens), atol=0, rtol=0)
    with torch.no_grad():
        lookup.attn.variant.temperature.fill_(0.3)
    assert not torch.allclose(lookup(tokens), vanilla(tokens))
    with pytest.raises(ValueError, match="token_ids"):
        attn(torch.randn(1, 5, 8), AttentionContext(positions=torch.arange(5)))
    with pytest.raises(ConfigError):
        layer({"name": "temp_lookup", "num_groups": 2, "token_groups": [0, 2]})


def test_temperature_lookup_is_causal() -> None:
    attn = layer(LOOKUP, dim=8)
    with torch.no_grad():
        attn.variant.temperature.uniform_(0.2, 2.0)
    ids = torch.randint(0, 8, (2, 10), generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 10, 8)
    changed_ids, changed_x = ids.clone(), x.clone()
    changed_ids[:, 6:] = (changed_ids[:, 6:] + 1) % 8
    changed_x[:, 6:] += 1.0
    before = attn(x, AttentionContext(positions=torch.arange(10), token_ids=ids))
    after = attn(changed_x, AttentionContext(positions=torch.arange(10), token_ids=changed_ids))
    torch.testing.assert_close(after[:, :6], before[:, :6], atol=1e-6, rtol=0)
    assert (after[:, 6:] - before[:, 6:]).abs().max() > 1e-3


def test_stacked_seeds_equal_independent_runs() -> None:
    p = transition_matrix(8, EDGES)

    def train(seeds: list[int]) -> list[SyntheticAttentionModel]:
        return train_seeds(
            lambda: SyntheticAttentionModel(8, LOOKUP, 8, vocab_size=8, num_outputs=8),
            seeds,
            5,
            1e-2,
            lambda g: graph_batch(p, 16, g),
            F.cross_entropy,
        )

    together, alone = train([0, 1]), train([1])
    assert not torch.equal(together[0].attn.variant.temperature, together[1].attn.variant.temperature)
    for name, value in together[1].state_dict().items():
        torch.testing.assert_close(value, alone[0].state_dict()[name], atol=1e-6, rtol=0, msg=name)


def test_attention_map_is_indexed_by_token_and_err_map_by_formula() -> None:
    """With embedding = I, W_q = I and W_k a scaled permutation, query q attends to token pi(q) wherever it sits,
    so P^ must be that permutation matrix; with q = 0 it is uniform and err_map = sum |1/8 - P*|."""
    p = transition_matrix(8, EDGES)
    model = SyntheticAttentionModel(8, {"name": "vanilla"}, 8, vocab_size=8, num_outputs=8)
    pi = torch.tensor([3, 0, 7, 1, 6, 2, 5, 4])
    with torch.no_grad():
        model.embedding.weight.copy_(torch.eye(8))
        model.attn.qkv.weight[:8] = torch.eye(8)
        model.attn.qkv.weight[8:16] = 60 * torch.eye(8)[pi]  # k_j = 60 e_{pi^-1(j)}: big q.k iff j = pi(q)
    result = evaluate_graph(model, p)
    expected = torch.zeros(8, 8)
    expected[torch.arange(8), pi] = 1.0
    torch.testing.assert_close(result.attention_map, expected, atol=1e-6, rtol=0)
    with torch.no_grad():
        model.attn.qkv.weight[:8] = 0
    result = evaluate_graph(model, p)
    assert result.err_map == pytest.approx((p - 1 / 8).abs().sum().item(), abs=1e-5)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(1).mean().item()
    assert result.cross_entropy - result.kl == pytest.approx(entropy, abs=1e-5)
    assert entropy == pytest.approx((math.log(4) + 3 * math.log(3) + 3 * math.log(2)) / 8)


def test_table1_quick(tmp_path: Path) -> None:
    cfg = compose_synthetic("table1/quick", tmp_path)
    frame = run(cfg, paper_numbers.TABLE1)
    assert list(frame.columns) == ["quantity", "model", "ours_mean", "ours_std", "paper", "ours_minus_paper"]
    assert (frame.model == "vanilla").sum() == 4 and (frame.model == "ssa").sum() == 4 + 2 * 4
    temperatures = frame[frame.quantity.str.startswith("temperature")]
    assert temperatures.paper.tolist() == [0.002, 0.019, 0.152, 0.751]
    assert frame.ours_mean.notna().all() and frame.ours_std.gt(0).any()
    assert {p.name for p in tmp_path.iterdir()} == {"table1.md", "table1.csv", "figure3.png"}
    assert "0.358" in (tmp_path / "table1.md").read_text()


def test_table2_quick(tmp_path: Path) -> None:
    cfg = compose_synthetic("table2/quick", tmp_path)
    frame = run(cfg, paper_numbers.TABLE2)
    assert frame.model.tolist() == ["naive_average", "bayes_optimal", "vanilla", "value_selective"]
    assert frame.paper.tolist() == [2.058, 0.003, 1.390, 0.071]
    assert frame.ours_mean.between(0, 4).all()
    assert frame.ours_std.iloc[:2].eq(0).all() and frame.ours_std.iloc[2:].gt(0).all()
    sweep = (tmp_path / "sweep.csv").read_text().splitlines()
    assert sweep[0] == "length,sigma,vanilla,value_selective,naive_average,bayes_optimal" and len(sweep) == 4
    assert {p.name for p in tmp_path.iterdir()} == {"table2.md", "table2.csv", "sweep.csv"}
