"""The benchmark's machinery: fair ordering, exact FLOP counts, peers that compute what they claim, memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.bench.__main__ import main as bench_main
from attnlab.bench.clipped import cpu_peak_bytes
from attnlab.bench.evaluation import attnlab_greedy, benchmark_evaluation, hf_greedy, twin_models, workload
from attnlab.bench.peers import PEERS, Shape, build_peer, litgpt_available, training_step
from attnlab.bench.profile import IDLE, category, profile_step
from attnlab.bench.reference import ReferenceGPT
from attnlab.bench.timing import Contender, Progress, count_flops, time_round_robin
from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.models import build_gpt

MICRO = Shape("micro", n_layer=2, n_head=2, n_embd=32, vocab_size=97, length=16, batch=2)
EVAL_SHAPE = Shape("eval", n_layer=2, n_head=2, n_embd=32, vocab_size=320, length=64, batch=1)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """Three 'articles' of random words: long enough for several loglikelihood stretches and rolling windows."""
    rng = torch.Generator().manual_seed(0)
    words = ("the", "a", "of", "attention", "head", "model", "gate", "value", "query", "key", "softmax", "sink")
    return [" ".join(words[i] for i in torch.randint(len(words), (300,), generator=rng).tolist()) for _ in range(3)]


@pytest.fixture(scope="module")
def eval_tokenizer(documents):
    return train_bpe_tokenizer(documents, vocab_size=300)


def test_round_robin_shuffles_the_order_each_round_and_times_every_call() -> None:
    calls: list[str] = []
    contenders = [Contender(name, lambda name=name: calls.append(name)) for name in "abcd"]
    timings = time_round_robin(contenders, rounds=6, warmup=2, progress=Progress())
    rounds = [tuple(calls[8 + 4 * r : 12 + 4 * r]) for r in range(6)]  # after 2 warm-up calls each
    assert calls[:8] == list("aabbccdd")
    assert all(sorted(order) == list("abcd") for order in rounds)
    assert len(set(rounds)) > 1  # not a fixed order
    for timing in timings.values():
        assert 0 < timing.q1_s <= timing.median_s <= timing.q3_s


def test_flops_are_counted_not_estimated() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert count_flops(lambda: a @ b) == 2 * 64 * 32 * 16


def test_the_nanogpt_reference_is_attnlab_vanilla_gpt2_without_the_hooks() -> None:
    """Same weights, same logits: the reference is a fair floor for the gpt2 family, not a smaller model."""
    ours = build_gpt(MICRO.model_config(), {"name": "vanilla"}).eval()
    reference = ReferenceGPT(MICRO.n_layer, MICRO.n_head, MICRO.n_embd, MICRO.vocab_size, MICRO.length).eval()
    renamed = {
        name.replace("norm_1", "ln_1")
        .replace("norm_2", "ln_2")
        .replace("norm_f", "ln_f")
        .replace("mlp.fc", "mlp.0")
        .replace("mlp.proj", "mlp.2"): value
        for name, value in ours.state_dict().items()
        if not name.endswith("head_mask")
    }
    reference.load_state_dict({**renamed, "lm_head.weight": renamed["wte.weight"]})
    idx = torch.randint(0, MICRO.vocab_size, (2, MICRO.length))
    torch.testing.assert_close(reference(idx), ours(idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("peer", PEERS)
def test_every_peer_maps_ids_to_logits_and_trains(peer: str) -> None:
    if peer == "litgpt" and not litgpt_available():
        pytest.skip("litgpt is optional (pip install --no-deps litgpt)")
    torch.manual_seed(0)
    model = build_peer(peer, MICRO)
    tokens = torch.randint(0, MICRO.vocab_size, (MICRO.batch, MICRO.length + 1))
    assert model(tokens[:, :-1]).shape == (MICRO.batch, MICRO.length, MICRO.vocab_size)
    before = [p.detach().clone() for p in model.parameters()]
    training_step(model, tokens, bf16=False, fused_adamw=False)()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matrix products"),
        ("aten::mm", "matrix products"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
        ("triton_red_fused__log_softmax__to_copy__unsafe_view_mm_prepare_softmax_online_view_19", "cross-entropy"),
        ("void cunn_SoftMaxForwardSmem<8, BFloat16, float, BFloat16, LogSoftMaxForwardEpilogue>", "cross-entropy"),
        ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_6", "norms"),
        ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "attention"),  # memory-efficient SDPA, not a GEMM
        ("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>", "optimizer"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "memory copies and fills",
        ),
        ("Memcpy DtoD (Device -> Device)", "memory copies and fills"),
        ("aten::copy_", "memory copies and fills"),
        ("triton_poi_fused__to_copy_gelu_view_3", "other (elementwise, fused, reductions)"),  # a cast fused in
        ("triton_poi_fused_gelu_gelu_backward_view_5", "other (elementwise, fused, reductions)"),
    ],
)
def test_kernels_are_grouped_by_what_they_compute(kernel: str, expected: str) -> None:
    # a fused kernel's name lists "mm" or "_to_copy" among its operators without being a matrix product or a copy
    assert category(kernel) == expected


def test_the_profile_splits_a_steps_time_into_categories() -> None:
    shape = Shape("t", 1, 2, 32, 64, 16, 2)
    tokens = torch.randint(0, 64, (2, 17))
    step = training_step(build_peer("attnlab", shape), tokens, bf16=False, fused_adamw=True)
    profile = profile_step(step, torch.device("cpu"), 2)
    wall, seconds = profile.wall_s, profile.by_category()
    assert profile.longest(1)[0][1] == max(profile.kernels.values())
    assert wall > 0 and seconds["matrix products"] > 0 and seconds["attention"] > 0 and seconds["optimizer"] > 0
    covered = sum(time for name, time in seconds.items() if name != IDLE)
    assert covered <= wall and seconds[IDLE] == pytest.approx(wall - covered)  # no time counted twice


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the CPU memory probe reads Linux's /proc")
@pytest.mark.slow
def test_chunked_clipped_softmax_peaks_far_below_the_naive_version() -> None:
    """Measured in fresh processes: at T=2048 the naive (T x T) fp32 scores alone are 12 x 16 MiB."""
    chunked = cpu_peak_bytes("clipped", 2048, 12, 64, 1)
    naive = cpu_peak_bytes("clipped naive", 2048, 12, 64, 1)
    assert 0 < chunked < naive / 2


def test_an_existing_report_is_never_overwritten(tmp_path, capsys) -> None:
    out = tmp_path / "bench.md"
    out.write_text("earlier results")
    with pytest.raises(SystemExit) as stopped:
        bench_main(["--out", str(out), "--sections", "clipped"])
    assert stopped.value.code != 0 and out.read_text() == "earlier results"
    assert "exists" in capsys.readouterr().err


def test_the_adapter_scores_what_lm_eval_hflm_scores_on_the_exported_weights(documents, eval_tokenizer) -> None:
    """The evaluation benchmark compares like with like: same requests, same numbers to 1e-4 (fp32)."""
    work = workload(documents, eval_tokenizer, n_loglikelihood=8, n_rolling=3, n_prompts=2, prompt_len=8)
    adapter, _, reference = twin_models(EVAL_SHAPE, eval_tokenizer, batch_size=4, device=torch.device("cpu"))
    ours = adapter.loglikelihood(work.loglikelihood, disable_tqdm=True)
    theirs = reference.loglikelihood(work.loglikelihood, disable_tqdm=True)
    assert [greedy for _, greedy in ours] == [greedy for _, greedy in theirs]
    torch.testing.assert_close([ll for ll, _ in ours], [ll for ll, _ in theirs], atol=1e-4, rtol=0)
    rolling = adapter.loglikelihood_rolling(work.rolling, disable_tqdm=True)
    assert len(eval_tokenizer.encode(documents[0]).ids) > 2 * EVAL_SHAPE.length  # several windows per document
    torch.testing.assert_close(
        rolling, reference.loglikelihood_rolling(work.rolling, disable_tqdm=True), atol=1e-4, rtol=0
    )


def test_kv_cache_decoding_chooses_the_tokens_hf_generate_chooses(documents, eval_tokenizer) -> None:
    work = workload(documents, eval_tokenizer, n_loglikelihood=1, n_rolling=1, n_prompts=3, prompt_len=8)
    adapter, hf, _ = twin_models(EVAL_SHAPE, eval_tokenizer, batch_size=4, device=torch.device("cpu"))
    for prompt in work.prompts:
        ours = attnlab_greedy(adapter, prompt, 40)
        assert len(ours) == 40 and ours == hf_greedy(hf, prompt, 40)
        # the adapter's own generation path (stops at end-of-text) reads the same token stream
        text = adapter.greedy_generate(prompt, 40, until=[])
        expected = ours[: ours.index(adapter.eot_token_id)] if adapter.eot_token_id in ours else ours
        assert text == adapter.tok_decode(expected)


def test_the_evaluation_benchmark_reports_rates_and_agreement(documents, eval_tokenizer) -> None:
    rows = benchmark_evaluation(
        EVAL_SHAPE,
        documents,
        eval_tokenizer,
        device=torch.device("cpu"),
        n_loglikelihood=4,
        n_rolling=1,
        n_prompts=2,
        prompt_len=8,
        new_tokens=16,
        batch_size=4,
        rounds=1,
        progress=Progress(),
    )
    assert [row["work"] for row in rows] == ["loglikelihood", "rolling log-likelihood", "greedy decoding"]
    assert rows[2]["per call"] == "32 tokens" and rows[2]["results"] == "same tokens: 32 of 32"
    assert all(float(row["attnlab speed-up"]) > 0 for row in rows)
    with pytest.raises(ValueError, match=r"loglikelihood: \d+ of 1000"):
        workload(documents, eval_tokenizer, n_loglikelihood=1000, n_rolling=1, n_prompts=1, prompt_len=8)


@pytest.mark.slow
def test_make_bench_writes_every_section(tmp_path) -> None:
    out = tmp_path / "bench.md"
    bench_main(
        [
            "--out",
            str(out),
            "--shapes",
            "tiny",
            "--batch",
            "1",
            "--attention",
            "gated_sdpa",
            "--lengths",
            "256",
            "--rounds",
            "2",
            "--stack-steps",
            "5",
            "--stack-repeats",
            "1",
            "--eval-requests",
            "4",
            "--eval-documents",
            "1",
            "--eval-prompts",
            "1",
            "--new-tokens",
            "8",
        ]
    )
    text = out.read_text()
    for heading in (
        "Training step at the `tiny` shape",
        "Attention variants",
        "Clipped softmax core",
        "Stack overhead",
        "Evaluation on the same weights",
        "Where the training step's time goes",
    ):
        assert heading in text
    for peer in ("nanogpt", "hf-sdpa", "hf-eager", "gated_sdpa"):
        assert f"| {peer}" in text


@pytest.mark.slow
def test_variants_that_refuse_the_position_encoding_are_timed_against_vanilla_without_one(tmp_path) -> None:
    """Stick-breaking takes no position encoding and the `tiny` shape learns positions: it is timed with none, beside
    a vanilla with none, instead of being left out."""
    out = tmp_path / "bench.md"
    options = ["--batch", "1", "--vocab", "512", "--rounds", "1"]  # ~1 s a step
    bench_main(["--out", str(out), "--sections", "variants", "--attention", "gated_sdpa", "stickbreaking", *options])
    rows = [line.split("|")[1].strip() for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert rows == ["vanilla", "gated_sdpa", "vanilla (pos_encoding=none)", "stickbreaking (pos_encoding=none)"]
    assert "as they refuse this shape's position encoding: stickbreaking." in out.read_text()


@pytest.mark.slow  # ~40-100 s on 2 cores: a model's training step per backend
def test_kernels_section_times_every_backend_a_variant_takes_beside_vanilla_sdpa(tmp_path: Path) -> None:
    """On the CPU: cores forward-only for every backend, the training step only where it can train (not flex)."""
    out = tmp_path / "kernels.md"
    args = ["--out", str(out), "--sections", "kernels", "--kernel-lengths", "16", "--rounds", "1"]
    bench_main([*args, "--kernel-variants", "vanilla", "clipped_softmax", "diff", "--batch", "1", "--vocab", "97"])
    cores, steps = out.read_text().split("### Training step")

    def rows(text: str) -> set[tuple[str, ...]]:
        return {tuple(cell.strip() for cell in line.split("|")[1:4]) for line in text.splitlines() if "|" in line}

    assert {("16", "vanilla", "sdpa"), ("16", "vanilla", "flex"), ("16", "clipped_softmax", "flex")} <= rows(cores)
    assert ("16", "diff", "flex") not in rows(cores) and ("16", "diff", "sdpa") in rows(cores)  # diff refuses flex
    assert "| vanilla " in steps and "| flex " not in steps


@pytest.mark.slow
def test_the_step_and_kernels_sections_need_only_torch() -> None:
    """A GPU machine with torch alone runs them: no Hydra, data stack, pandas or Lightning is imported."""
    code = (
        "import sys, attnlab.bench.__main__; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'hydra', 'omegaconf', 'datasets', 'pandas', 'lightning', 'transformers', 'lm_eval', 'tokenizers'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
