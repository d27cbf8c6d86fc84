"""Training-step benchmark of every attention variant against vanilla, measured side by side in one process.

``python -m attnlab.bench --out outputs/bench/cpu.md`` (``make bench``). Variants are timed
round-robin, so a slow moment of the machine hits all of them alike; the report gives the median time per step
and its ratio to vanilla. On a GPU it also reports tokens/s and model FLOP utilisation (bf16 autocast).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from attnlab.attention import available_attention
from attnlab.models import GPT, ModelConfig, build_gpt
from attnlab.nn_utils import next_token_loss

# H100 SXM dense bf16 peak, the usual denominator for MFU; pass --peak-flops for other devices
H100_BF16_PEAK = 989e12


def make_step(model: GPT, tokens: torch.Tensor, autocast: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def benchmark(config: ModelConfig, names: list[str], batch: int, length: int, rounds: int, device: str) -> list[dict]:
    torch.manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, length + 1), device=device)
    autocast = device.startswith("cuda")
    steps, models = {}, {}
    started = time.perf_counter()
    for number, name in enumerate(names, 1):
        progress(f"building and warming up {name} ({number}/{len(names)})", started)
        models[name] = build_gpt(config.to_dict(), name).to(device)
        steps[name] = make_step(models[name], tokens, autocast)
        steps[name]()  # warm-up: allocator, kernels selection
    timings: dict[str, list[float]] = {name: [] for name in names}
    for number in range(1, rounds + 1):
        progress(f"round {number}/{rounds}: one step of each of the {len(names)} variants", started)
        for name in names:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            steps[name]()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            timings[name].append(time.perf_counter() - start)
    base = statistics.median(timings["vanilla"])
    rows = []
    for name in names:
        seconds = statistics.median(timings[name])
        model = models[name]
        rows.append(
            {
                "attention": name,
                "ms_per_step": 1000 * seconds,
                "ratio_to_vanilla": seconds / base,
                "tokens_per_s": batch * length / seconds,
                "flops_per_s": model.flops_per_token(length) * batch * length / seconds,
                "params": model.num_parameters(),
            }
        )
    return rows


def progress(what: str, started: float) -> None:
    """A line on stderr, so a run of several minutes shows where it is (the report goes to stdout and --out)."""
    print(f"bench [{time.perf_counter() - started:5.0f} s] {what}", file=sys.stderr, flush=True)


def report(rows: list[dict], header: str, peak_flops: float | None) -> str:
    table = pd.DataFrame(
        {
            "attention": r["attention"],
            "ms/step": f"{r['ms_per_step']:.1f}",
            "x vanilla": f"{r['ratio_to_vanilla']:.2f}",
            "tokens/s": f"{r['tokens_per_s']:,.0f}",
            "MFU": f"{100 * r['flops_per_s'] / peak_flops:.1f}%" if peak_flops else "-",
            "params": f"{r['params']:,}",
        }
        for r in rows
    )
    return f"{header}\n\n{table.to_markdown(index=False, disable_numparse=True)}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write (never overwritten)")
    parser.add_argument("--attention", nargs="*", default=None, help="variants (default: all registered)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--peak-flops", type=float, default=None, help="device peak FLOP/s for MFU")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"--out {args.out} exists; choose a new file (results are never overwritten)")
    names = ["vanilla", *(n for n in args.attention or available_attention() if n != "vanilla")]
    config = ModelConfig(
        name="bench",
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        vocab_size=args.vocab,
        block_size=args.length,
    )
    rows = benchmark(config, names, args.batch, args.length, args.rounds, args.device)
    peak = args.peak_flops or (H100_BF16_PEAK if "H100" in _device_name(args.device) else None)
    header = (
        f"# Training step per attention variant ({_device_name(args.device)}, torch {torch.__version__}, "
        f"{args.n_layer} layers x {args.n_head} heads x {args.n_embd}, vocab {args.vocab}, batch {args.batch} x "
        f"{args.length} tokens, median of {args.rounds} round-robin rounds)"
    )
    text = report(rows, header, peak)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"written: {args.out}", file=sys.stderr)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
