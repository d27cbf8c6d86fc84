"""``attention.backend``: FlexAttention agrees with the reference path (forward, on the CPU), clipped softmax's two
fused passes agree with its exact chunked path (forward and backward), and a backend a variant cannot take is refused
in one line. Training through flex needs a GPU (tests/test_kernels_gpu.py); here its backward is checked through
flex's own eager math, with torch's CPU refusal lifted for the test."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module

from attnlab.attention import AttentionContext, AttentionShape, available_attention, build_variant
from attnlab.attention.base import _PRESETS
from attnlab.errors import ConfigError
from attnlab.models import build_gpt
from attnlab.models.gpt import alibi_slopes
from attnlab.validation import SYNTHETIC_ONLY_ATTENTION

H, KV, DH, T = 4, 2, 8, 29
MODEL = {"n_layer": 2, "n_head": H, "n_kv_head": KV, "n_embd": H * DH, "vocab_size": 61, "block_size": 40}
FLEX = sorted(n for n in available_attention() if "flex" in _PRESETS[n].variant.backends())
NOT_FLEX = sorted(set(available_attention()) - set(FLEX))
ENCODINGS = ("learned", "alibi", "rotary")


def twins(name: str, pos_encoding: str, backend: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two models with the same weights: attention on ``backend`` and on the plain-math reference path."""
    model = {**MODEL, "pos_encoding": pos_encoding}
    torch.manual_seed(0)
    ours = build_gpt(model, {"name": name, "backend": backend}).eval()
    reference = build_gpt(model, {"name": name, "backend": "reference"}).eval()
    reference.load_state_dict(ours.state_dict())
    return ours, reference


def refuses(name: str, pos_encoding: str) -> bool:
    try:
        build_gpt({**MODEL, "pos_encoding": pos_encoding}, {"name": name})
    except ConfigError as error:
        return error.key == "model.pos_encoding"
    return False


def test_the_backends_split_the_variants_as_documented() -> None:
    """Score modifications and hooks run on flex; the maps flex cannot express refuse it."""
    assert {"vanilla", "clipped_softmax", "sink", "softmax1", "fox", "sigmoid", "ssa", "ssmax", "gated_sdpa"} <= set(
        FLEX
    )
    assert set(NOT_FLEX) == {"diff", "selective", "softpick", "stickbreaking"}


@pytest.mark.parametrize("pos_encoding", ENCODINGS)
@pytest.mark.parametrize("name", [n for n in FLEX if n not in SYNTHETIC_ONLY_ATTENTION])
def test_flex_forward_equals_the_reference_path(name: str, pos_encoding: str) -> None:
    """Every variant flex takes, with grouped-query heads, each position encoding (ALiBi as flex's score_mod)."""
    if refuses(name, pos_encoding):
        pytest.skip(f"{name} refuses model.pos_encoding={pos_encoding}")
    flex, reference = twins(name, pos_encoding, "flex")
    idx = torch.randint(0, MODEL["vocab_size"], (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(flex(idx), reference(idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["vanilla", "clipped_softmax", "fox", "fox_pro"])
def test_kv_cache_decoding_on_flex_equals_the_full_forward(name: str) -> None:
    """A decoding step (one query over cached keys) runs the variant's own path: the same math."""
    flex, _ = twins(name, "learned", "flex")
    idx = torch.randint(0, MODEL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = flex(idx)
        cache = flex.new_cache()
        steps = [flex(idx[:, :8], start_pos=0, cache=cache)]
        steps += [flex(idx[:, i : i + 1], start_pos=i, cache=cache) for i in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NOT_FLEX)
def test_a_variant_without_a_flex_path_refuses_it_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_gpt({**MODEL, "pos_encoding": "none"}, {"name": name, "backend": "flex"})
    assert error.value.key == "attention.backend"
    assert str(error.value) == (f"attention.backend: attention={name} has no flex path; allowed: sdpa, reference")


def test_unknown_backend_and_dropout_are_refused_by_key() -> None:
    with pytest.raises(ConfigError, match=r"^attention.backend: got 'flash'; allowed: sdpa, flex, reference$"):
        build_gpt(MODEL, {"name": "vanilla", "backend": "flash"})
    with pytest.raises(ConfigError, match=r"^attention.backend: flex has no attention dropout \(model.dropout=0.1\)"):
        build_gpt({**MODEL, "dropout": 0.1}, {"name": "vanilla", "backend": "flex"})


def test_training_on_flex_on_the_cpu_is_one_line_naming_the_key() -> None:
    model = build_gpt(MODEL, {"name": "vanilla", "backend": "flex"})
    with pytest.raises(ConfigError) as error:
        model(torch.zeros(1, 8, dtype=torch.long))
    assert error.value.key == "attention.backend" and "\n" not in str(error.value)
    assert "flex trains on a GPU" in str(error.value)


# --- variant level: values and gradients against the exact path, through flex's eager math ---


@pytest.fixture
def flex_backward_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch refuses FlexAttention's backward on the CPU up front; its eager math differentiates all the same (the
    score_mod, captured tensors, and the returned log-sum-exp), which is what the compiled GPU kernel computes."""
    monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)


def variant(name: str, **options):
    shape = AttentionShape(n_embd=H * DH, n_head=H, n_kv_head=KV, head_dim=DH, block_size=32)
    return build_variant({"name": name, **options}, shape)


def qkv(seed: int = 0, scale: float = 2.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple((scale * torch.randn(2, heads, T, DH, generator=g)).requires_grad_() for heads in (H, KV, KV))


def values_and_grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)  # every output weighted differently
    return (out, *torch.autograd.grad((out * weights).sum(), inputs, retain_graph=True))  # (fox: k shared)


def both_paths(v, q, k, val, alibi: bool, extra: tuple[torch.Tensor, ...] = ()) -> tuple[tuple, tuple]:
    """(output, grads) on flex and on the variant's own exact path (``attend``), the same inputs."""
    ctx = AttentionContext(positions=torch.arange(T), alibi_slopes=alibi_slopes(H) if alibi else None)
    inputs = (q, k, val, *extra)
    flex = values_and_grads(v.flex_attend(q, k, val, ctx.flex_mask(T)), inputs)
    mask, is_causal = ctx.mask(T, T, torch.float32)
    exact = values_and_grads(v.attend(q, k, val, mask, is_causal, 0.0), inputs)
    return flex, exact


def assert_all_close(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...], tol: float = 2e-5) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, i=index: f"output/grad {i}: {m}")


@pytest.mark.parametrize("alibi", [False, True], ids=["causal", "alibi"])
@pytest.mark.parametrize(
    ("zeta", "gamma"), [(1.0, 0.0), (1.1, -0.08), (1.0, -0.3)], ids=["identity", "clipped", "rows-clipped-away"]
)
def test_clipped_softmax_two_passes_equal_the_chunked_path(
    flex_backward_on_cpu: None, alibi: bool, zeta: float, gamma: float
) -> None:
    """Values and gradients in fp32, clips at 0 and 1 both hit; at gamma = -0.3 some rows clip to all zeros."""
    v = variant("clipped_softmax", zeta=zeta, gamma=gamma, alpha=None, chunk_size=8)
    q, k, val = qkv()
    flex, exact = both_paths(v, q, k, val, alibi)
    assert_all_close(flex, exact)
    _, probabilities = v.reference_attention(q, k, val, None, True)
    future = 2 * H * T * (T - 1) // 2
    assert ((probabilities == 0).sum() > future) == (gamma < 0)  # visible keys clipped to exactly 0


def test_clipped_softmax_rows_clipped_to_nothing_give_zero_not_nan(flex_backward_on_cpu: None) -> None:
    """Uniform rows (q = 0) over more keys than 1 / clip threshold: every weight clips to 0, output and grads 0."""
    v = variant("clipped_softmax", zeta=1.0, gamma=-0.23, alpha=None)
    q, k, val = qkv()
    q = torch.zeros_like(q, requires_grad=True)
    flex, exact = both_paths(v, q, k, val, alibi=False)
    assert (exact[0][:, :, 5:] == 0).all() and (exact[0][:, :, :5] != 0).all()  # 1/n < 0.23 / 1.23 from n = 6
    assert_all_close(flex, exact)


@pytest.mark.parametrize("alibi", [False, True], ids=["causal", "alibi"])
@pytest.mark.parametrize("name", ["sink", "sigmoid", "fox", "fox_pro"])
def test_score_mod_variants_equal_their_exact_path_with_gradients(
    flex_backward_on_cpu: None, name: str, alibi: bool
) -> None:
    """The sink through flex's log-sum-exp, sigmoid's unnormalised weights, FoX's decay as a captured cumulative sum:
    gradients reach q, k, v and the variant's own parameters (sinks; the forget gate through the captured c; the Pro
    block's shifts and norms, all but the output norm and gate, which act after the attention)."""
    v = variant(name, **({"sink_init": 0.5} if name == "sink" else {}))
    q, k, val = qkv(scale=1.0)
    params = tuple(p for n, p in v.named_parameters() if not n.startswith("output_"))
    if name.startswith("fox"):  # keys carry log f, and with it the gate's gradient (values their shift, in fox_pro)
        x = torch.randn(2, T, H * DH, generator=torch.Generator().manual_seed(3))
        q, k, val = v.transform_qkv(x, q, k, val, AttentionContext(positions=torch.arange(T)))
    flex, exact = both_paths(v, q, k, val, alibi, params)
    assert all(g.abs().sum() > 0 for g in flex[1:])
    assert_all_close(flex, exact)
