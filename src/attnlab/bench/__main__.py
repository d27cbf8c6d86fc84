"""``python -m attnlab.bench`` (``make bench``): attnlab's training step against its peers, the attention
variants against vanilla, clipped softmax against SDPA over T, train.py against a bare loop, and evaluation (the
lm-eval adapter and KV-cache decoding) against lm-eval's HFLM and HF ``generate``; where a step's time goes
(``profile``); and each variant's attention core and step on each backend (``kernels``).

Everything in one process is measured side by side (``attnlab.bench.timing``): ratios, not absolute times, are
what carries over between machines. The report is a Markdown file that is never overwritten. The ``step`` and
``kernels`` sections import torch (and numpy) only, so they run on a GPU machine without the training stack; the
other sections import what they need when they run.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import torch

from attnlab.attention import available_attention
from attnlab.bench.clipped import benchmark_clipped
from attnlab.bench.kernels import KERNEL_VARIANTS, benchmark_kernels
from attnlab.bench.peers import PEERS, SHAPES, Shape, build_peer, litgpt_available, training_step
from attnlab.bench.profile import CATEGORIES, IDLE, OTHER, category, profile_step
from attnlab.bench.timing import Contender, Progress, Timing, count_flops, gemm_probe, peak_memory, time_round_robin
from attnlab.errors import ConfigError

SECTIONS = ("step", "variants", "clipped", "stack", "eval", "profile", "kernels")
GEMM_SIZE = {"cpu": 2048, "cuda": 8192}


def contender(
    name: str,
    model: torch.nn.Module,
    shape: Shape,
    device: torch.device,
    fused: bool,
    compile: str | None = None,
    fused_loss: bool = False,
) -> Contender:
    """A training step of ``model`` on fixed random tokens, its FLOPs counted on the eager model (compiled code
    bypasses the counter) and (CUDA) its memory peak taken."""
    tokens = fixed_tokens(shape, device)
    bf16 = device.type == "cuda"
    flops = count_flops(training_step(model, tokens, bf16, fused, fused_loss=fused_loss))
    step = training_step(model, tokens, bf16, fused, compile, fused_loss)
    step()  # allocator, kernel choice, compilation
    return Contender(name, step, flops=flops, peak_bytes=peak_memory(step, device))


def fixed_tokens(shape: Shape, device: torch.device) -> torch.Tensor:
    """The same random (batch, length + 1) ids for every model measured at ``shape``."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, shape.vocab_size, (shape.batch, shape.length + 1), generator=generator).to(device)


def timing_row(timing: Timing, base: Timing, shape: Shape, gemm: Timing | None, peak: float | None) -> dict:
    achieved = timing.flops_per_s
    return {
        "contender": timing.name,
        "ms/step": f"{1000 * timing.median_s:,.1f}",
        "spread": f"{100 * timing.spread:.0f}%",
        "attnlab speed-up": f"{timing.median_s / base.median_s:.2f}",
        "tokens/s": f"{shape.batch * shape.length / timing.median_s:,.0f}",
        "TFLOP/s": f"{achieved / 1e12:.3f}" if achieved else "-",
        "of GEMM": f"{100 * achieved / gemm.flops_per_s:.0f}%" if achieved and gemm else "-",
        "MFU": f"{100 * achieved / peak:.1f}%" if achieved and peak else "-",
        "peak GiB": f"{timing.peak_bytes / 2**30:.2f}" if timing.peak_bytes else "-",
    }


def step_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    parts = []
    peers = ["attnlab", *(p for p in args.peers if p != "attnlab" and (p != "litgpt" or litgpt_available()))]
    for shape_name in args.shapes:
        shape = resized(SHAPES[shape_name], args)
        contenders = []
        for peer in peers:
            progress(f"{shape.name}: building {peer}")
            contenders.append(contender(peer, build_peer(peer, shape).to(device), shape, device, args.fused_adamw))
        for what in ("model", "loss") if args.compile else ():
            progress(f"{shape.name}: compiling attnlab's {what}")
            model = build_peer("attnlab", shape).to(device)
            label = f"attnlab compiled ({'model' if what == 'model' else 'model + loss'})"
            contenders.append(contender(label, model, shape, device, args.fused_adamw, compile=what))
        for fused_loss in (False, True) if args.padded_vocab else ():
            label = "attnlab compiled (model + loss), padded vocab" + (", fused loss" if fused_loss else "")
            progress(f"{shape.name}: compiling {label}")
            model = build_peer("attnlab", shape, padded_vocab_size=shape.vocab_size).to(device)
            contenders.append(contender(label, model, shape, device, args.fused_adamw, "loss", fused_loss))
        gemm = gemm_probe(device, dtype(device), GEMM_SIZE[device.type])
        timings = time_round_robin([*contenders, gemm], args.rounds, warmup=1, progress=progress)
        base, gemm_timing = timings["attnlab"], timings[gemm.name]
        peak = peak_flops(device)
        rows = [timing_row(timings[c.name], base, shape, gemm_timing, peak) for c in contenders]
        missing = [p for p in args.peers if p not in peers]
        parts.append(
            f"### Training step at the `{shape.name}` shape ({shape.n_layer} layers x {shape.n_head} heads x "
            f"{shape.n_embd}, vocab {shape.vocab_size}, batch {shape.batch} x {shape.length} tokens)\n\n"
            f"{markdown(rows)}\n\n"
            f"GEMM probe ({gemm.name}, {dtype(device)}): {gemm_timing.flops_per_s / 1e12:.3f} TFLOP/s. "
            "attnlab speed-up = the contender's time / attnlab's (above 1: attnlab is faster). FLOPs counted by "
            "`FlopCounterMode` (matrix products and attention, forward and backward)."
            + (
                f" Not measured: {', '.join(missing)} (not installed: `pip install --no-deps litgpt`)."
                if missing
                else ""
            )
        )
    return "\n\n".join(parts)


def variants_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    from attnlab.validation import SYNTHETIC_ONLY_ATTENTION

    shape = resized(SHAPES[args.variants_shape], args)
    language = [n for n in available_attention() if n not in SYNTHETIC_ONLY_ATTENTION]  # not the synthetic ones
    names = ["vanilla", *(n for n in args.attention or language if n != "vanilla")]
    # fox and stick-breaking refuse some position encodings: timed with none, beside vanilla with none
    no_positions = [name for name in names if refuses_position_encoding(name, shape)]
    plans = [(name, {}) for name in names if name not in no_positions]
    if no_positions:
        plans += [(name, {"pos_encoding": "none"}) for name in ("vanilla", *no_positions)]
    contenders, baselines = [], {}  # contender -> the vanilla it is timed against
    for name, model_options in plans:
        for compiled in (False, True) if args.compile_variants else (False,):
            suffix = (" compiled" if compiled else "") + (" (pos_encoding=none)" if model_options else "")
            progress(f"variants: building {name}{suffix}")
            model = build_peer("attnlab", shape, attention=name, **model_options).to(device)
            contenders.append(
                contender(name + suffix, model, shape, device, args.fused_adamw, "model" if compiled else None)
            )
            baselines[name + suffix] = "vanilla" + suffix
    timings = time_round_robin(contenders, args.rounds, warmup=1, progress=progress)
    peak = peak_flops(device)
    rows = []
    for c in contenders:
        timing, base = timings[c.name], timings[baselines[c.name]]
        row = timing_row(timing, base, shape, None, peak)
        del row["attnlab speed-up"], row["of GEMM"]
        rows.append({**row, "x vanilla": f"{timing.median_s / base.median_s:.2f}"})
    return (
        f"### Attention variants at the `{shape.name}` shape (batch {shape.batch} x {shape.length} tokens)\n\n"
        f"{markdown(rows)}\n\nx vanilla = the variant's time / vanilla's (compiled: / vanilla compiled)."
        + (
            " Timed with `pos_encoding=none` against vanilla with none, as they refuse this shape's position"
            f" encoding: {', '.join(no_positions)}."
            if no_positions
            else ""
        )
    )


def refuses_position_encoding(name: str, shape: Shape) -> bool:
    """Whether the variant refuses the shape's position encoding (fox: rotary; stick-breaking: all but none)."""
    try:
        build_peer("attnlab", shape, attention=name)
    except ConfigError as error:
        if error.key != "model.pos_encoding":
            raise
        return True
    return False


def clipped_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    batch = args.clipped_batch
    rows = benchmark_clipped(args.lengths, 12, 64, batch, str(device), args.rounds, progress)
    table = [
        {
            "T": row["T"],
            "method": row["method"],
            "ms fwd+bwd": f"{row['ms']:,.2f}" if row["ms"] is not None else "out of memory",
            "spread": f"{100 * row['spread']:.0f}%" if row["ms"] is not None else "-",
            "x sdpa": f"{row['x sdpa']:.2f}" if row["ms"] is not None else "-",
            "peak MiB": f"{row['peak_mb']:,.0f}" if row["peak_mb"] is not None else "-",
        }
        for row in rows
    ]
    where = "CUDA allocator peak" if device.type == "cuda" else "growth of a fresh process's peak RSS"
    return (
        f"### Clipped softmax core vs SDPA and the naive T x T version (batch {batch}, 12 heads x 64, causal, "
        f"forward + backward)\n\n{markdown(table)}\n\nPeak memory: {where} over one call."
    )


def stack_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    from attnlab.bench.stack import stack_overhead

    rows = stack_overhead(args.stack_steps, args.stack_repeats, device, progress)
    table = [
        {
            "repeat": row["repeat"],
            "train.py tokens/s": f"{row['train.py']:,.0f}",
            "bare loop tokens/s": f"{row['bare loop']:,.0f}",
            "overhead": f"{100 * row['overhead']:+.1f}%",
        }
        for row in rows
    ]
    overheads = [row["overhead"] for row in rows]
    return (
        f"### Stack overhead: train.py against a bare loop ({args.stack_steps} steps of the default `tiny` model on "
        f"the embedded corpus, each timed from the start of fitting)\n\n{markdown(table)}\n\n"
        f"Overhead (bare loop tokens/s / train.py's - 1): mean {100 * sum(overheads) / len(overheads):+.1f}% over "
        f"{len(rows)} alternating pairs, from {100 * min(overheads):+.1f}% to {100 * max(overheads):+.1f}%: the two "
        "run minutes apart in separate processes, so a machine whose speed drifts shows up here as spread."
    )


def eval_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    from attnlab.bench.evaluation import CONTEXT_WORDS, CONTINUATION_WORDS, benchmark_evaluation
    from attnlab.bench.stack import default_training

    shape = SHAPES[args.eval_shape]
    progress("evaluation: the embedded corpus's held-out documents and tokenizer (train.yaml's data)")
    _, _, data = default_training([])
    data.prepare()
    documents = data.validation_documents()["text"]
    rows = benchmark_evaluation(
        shape,
        documents,
        data.tokenizer,
        device=device,
        n_loglikelihood=args.eval_requests,
        n_rolling=args.eval_documents,
        n_prompts=args.eval_prompts,
        prompt_len=args.prompt_tokens,
        new_tokens=args.new_tokens,
        batch_size=args.eval_batch,
        rounds=args.rounds,
        progress=progress,
    )
    vocab = data.tokenizer.get_vocab_size()
    return (
        f"### Evaluation on the same weights at the `{shape.name}` shape (fp32 on {device.type}, lm-eval batch "
        f"{args.eval_batch}, context {shape.length})\n\n{markdown(rows)}\n\n"
        f"Requests from the embedded corpus's held-out articles (its {vocab}-token BPE): loglikelihood = a "
        f"stretch of {CONTEXT_WORDS} words and the {CONTINUATION_WORDS} after it; rolling = whole articles "
        f"in lm-eval's disjoint windows; greedy decoding = {args.eval_prompts} prompts of {args.prompt_tokens} "
        f"tokens, {args.new_tokens} new tokens each, batch 1 (end-of-text does not stop either side). attnlab's "
        "model is exported to `GPT2LMHeadModel` (SDPA attention) for the reference; speed-up = the reference's time "
        "/ attnlab's. max abs diff: the largest difference of a request's summed log-probability between the sides "
        "(relative: over that log-probability)."
    )


def profile_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    parts = []
    for shape_name in args.shapes:
        shape = resized(SHAPES[shape_name], args)
        profiles = {}
        for compile in (None, "loss") if args.compile else (None,):
            label = "attnlab compiled (model + loss)" if compile else "attnlab"
            progress(f"{shape.name}: profiling {label}")
            model = build_peer("attnlab", shape).to(device)
            step = training_step(model, fixed_tokens(shape, device), device.type == "cuda", args.fused_adamw, compile)
            for _ in range(2):  # allocator, kernel choice, compilation
                step()
            profiles[label] = profile_step(step, device, args.profile_steps)
        per_step = 1000 / args.profile_steps  # seconds over the profiled steps -> ms per step
        categories = {label: profile.by_category() for label, profile in profiles.items()}
        found = {name for seconds in categories.values() for name in seconds}
        names = [name for name in (*(label for label, _ in CATEGORIES), OTHER, IDLE) if name in found]
        rows = [
            {
                "where the time goes": name,
                **{
                    f"{label}: {unit}": value
                    for label, seconds in categories.items()
                    for unit, value in (
                        ("ms/step", f"{per_step * seconds.get(name, 0.0):,.1f}"),
                        ("share", f"{100 * seconds.get(name, 0.0) / profiles[label].wall_s:.1f}%"),
                    )
                },
            }
            for name in names
        ]
        rows.append(
            {
                "where the time goes": "step (wall)",
                **{
                    f"{label}: {unit}": value
                    for label, profile in profiles.items()
                    for unit, value in (("ms/step", f"{per_step * profile.wall_s:,.1f}"), ("share", "100%"))
                },
            }
        )
        longest = [
            {
                "contender": label,
                "kernel": name if len(name) <= 100 else name[:97] + "...",
                "category": category(name),
                "ms/step": f"{per_step * seconds:,.2f}",
                "share": f"{100 * seconds / profile.wall_s:.1f}%",
            }
            for label, profile in profiles.items()
            for name, seconds in profile.longest(args.profile_kernels)
        ]
        what, uncovered = (
            ("kernels' GPU time", "launch gaps, Python, synchronisation")
            if device.type == "cuda"
            else ("ATen operators' own CPU time", "Python, and compiled code's own C++ kernels, which are no ATen ops")
        )
        parts.append(
            f"### Where the training step's time goes at the `{shape.name}` shape (batch {shape.batch} x "
            f"{shape.length} tokens, vocab {shape.vocab_size}, {args.profile_steps} profiled steps)\n\n"
            f"{markdown(rows)}\n\n"
            f"Time = the {what} under `torch.profiler`, grouped by name: a kernel counts under the first category "
            f'of `attnlab.bench.profile.CATEGORIES` its name matches. "{IDLE}" = the wall time none of those covered '
            f"({uncovered}). The profiler's own cost lengthens the wall time: compare shares, and the step section "
            f"for speed.\n\nThe longest kernels of each:\n\n{markdown(longest)}"
        )
    return "\n\n".join(parts)


def kernels_section(args: argparse.Namespace, device: torch.device, progress: Progress) -> str:
    gpu = device.type == "cuda"
    lengths = args.kernel_lengths or ([1024, 2048, 4096, 8192] if gpu else [128, 256])
    batch = args.kernel_batch or (4 if gpu else 1)
    step_shape = resized(SHAPES[args.variants_shape], args)
    cores, steps = benchmark_kernels(
        args.kernel_variants, args.kernel_backends, lengths, batch, step_shape, device, args.rounds, progress
    )
    measured = "forward + backward" if gpu else "forward only (FlexAttention has no CPU backward)"
    return (
        f"### Attention cores per backend (batch {batch}, 12 heads x 64, causal, {measured})\n\n"
        f"{markdown([formatted(r) for r in cores])}\n\n"
        f"### Training step per backend at the `{step_shape.name}` shape (batch {step_shape.batch} x "
        f"{step_shape.length} tokens{', bf16 autocast, fused AdamW' if gpu else ', fp32'})\n\n"
        f"{markdown([formatted(r) for r in steps])}\n\n"
        "x vanilla sdpa = the time over vanilla's on SDPA in the same run. sdpa = the variant's own path (the fused "
        "kernel, or its exact chunked math: clipped softmax, sigmoid, the sink's log-sum-exp), flex = "
        "FlexAttention (compiled on a GPU; clipped softmax in two passes), reference = the plain (T x T) math. A flex "
        "step's TFLOP/s uses the FLOPs counted on the variant's own path (the same products: PyTorch's FLOP counter "
        "cannot trace flex)." + ("" if gpu else " The CPU has no flex training step (no FlexAttention backward).")
    )


def formatted(row: dict[str, object]) -> dict[str, str]:
    """A kernels row for the report: times in ms, ratios, MiB; '-' where not measured."""
    units = {
        "ms": "{:,.2f}",
        "spread": "{:.0%}",
        "x vanilla sdpa": "{:.2f}",
        "peak MiB": "{:,.0f}",
        "TFLOP/s": "{:.3g}",
    }
    return {key: "-" if value is None else units.get(key, "{}").format(value) for key, value in row.items()}


def peak_flops(device: torch.device) -> float | None:
    """The device's peak FLOP/s in the models' dtype (for MFU), from Lightning's table where Lightning is installed
    (a GPU machine running only the step and kernels sections may not have it: MFU is then left out)."""
    try:
        from lightning.fabric.utilities.throughput import get_available_flops
    except ImportError:
        return None
    return get_available_flops(device, dtype(device))


def resized(shape: Shape, args: argparse.Namespace) -> Shape:
    """The shape with ``--batch`` and ``--vocab`` applied (a vocabulary padded to a multiple of 64, say)."""
    changes = {"batch": args.batch, "vocab_size": args.vocab}
    return Shape(**{**shape.__dict__, **{key: value for key, value in changes.items() if value is not None}})


def dtype(device: torch.device) -> torch.dtype:
    """What the models compute in: bf16 autocast on a GPU, fp32 on a CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def markdown(rows: list[dict]) -> str:
    """A GitHub table of string cells, columns padded to their widest cell (no pandas: see the module's doc)."""
    columns = list(rows[0]) if rows else []
    widths = {c: max(len(str(c)), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = [
        "| " + " | ".join(str(c).ljust(widths[c]) for c in columns) + " |",
        "|" + "|".join(":" + "-" * (widths[c] + 1) for c in columns) + "|",
    ]
    lines += ["| " + " | ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> None:
    from attnlab.cli import reproducible_kernels

    reproducible_kernels()  # the kernels the training commands use, so the timings are theirs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write (never overwritten)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "gpt2"])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default: each shape's own)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: each shape's own)")
    parser.add_argument("--profile-steps", type=int, default=5, help="profile: steps under the profiler")
    parser.add_argument("--profile-kernels", type=int, default=10, help="profile: longest kernels listed")
    parser.add_argument("--attention", nargs="*", default=None, help="variants (default: all registered)")
    parser.add_argument("--variants-shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--clipped-batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--stack-steps", type=int, default=100)
    parser.add_argument("--stack-repeats", type=int, default=3)
    parser.add_argument("--eval-shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--eval-requests", type=int, default=64, help="eval: loglikelihood requests per call")
    parser.add_argument("--eval-documents", type=int, default=2, help="eval: documents (articles) per rolling call")
    parser.add_argument("--eval-prompts", type=int, default=4, help="eval: prompts to continue per decoding call")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--kernel-variants", nargs="+", default=list(KERNEL_VARIANTS), help="kernels: variants")
    parser.add_argument("--kernel-backends", nargs="+", choices=("sdpa", "flex", "reference"), default=["sdpa", "flex"])
    parser.add_argument(
        "--kernel-lengths", nargs="+", type=int, default=None, help="kernels: T (GPU 1k-8k, CPU 128, 256)"
    )
    parser.add_argument("--kernel-batch", type=int, default=None, help="kernels: batch of the cores (GPU 4, CPU 1)")
    parser.add_argument("--compile", action="store_true", help="step, profile: also compiled attnlab models")
    parser.add_argument(
        "--padded-vocab",
        action="store_true",
        help="step: also compiled attnlab with model.padded_vocab_size, with and without the fused loss",
    )
    parser.add_argument("--compile-variants", action="store_true", help="variants: also time each one compiled")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) instead of foreach")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.profile_steps < 1:
        parser.error(f"--profile-steps {args.profile_steps}: at least 1")
    if args.out.exists():
        parser.error(f"--out {args.out} exists; choose a new file (results are never overwritten)")
    device = torch.device(args.device)
    progress = Progress()
    builders = {
        "step": step_section,
        "variants": variants_section,
        "clipped": clipped_section,
        "stack": stack_section,
        "eval": eval_section,
        "profile": profile_section,
        "kernels": kernels_section,
    }
    header = (
        f"# attnlab benchmark: {device_name(device)}, torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}\n\n"
        f"`python -m attnlab.bench {' '.join(argv if argv is not None else sys.argv[1:])}`; median of "
        f"{args.rounds} rounds, contenders in a shuffled order each round; spread = interquartile range / median."
    )
    parts = [header]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # one process compiles many models whose forward is the same code: each is a legitimate entry, not a leak
    unlimited = torch._dynamo.config.patch(recompile_limit=512, accumulated_recompile_limit=512)
    for section in args.sections:
        progress(f"section {section}")
        with unlimited:
            parts.append(builders[section](args, device, progress))
        args.out.write_text("\n\n".join(parts) + "\n")  # each finished section is kept, even if a later one fails
    print("\n\n".join(parts))
    print(f"written: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
