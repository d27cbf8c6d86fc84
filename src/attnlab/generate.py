"""``attnlab-generate <checkpoint> <prompt>``: continue a prompt with one of our checkpoints (``GPT.generate``), its
own tokenizer (it travels inside the checkpoint), stopping at end-of-text; ``--seed`` makes sampling repeatable."""

from __future__ import annotations

import argparse
import sys

from attnlab.errors import ConfigError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="attnlab-generate", description=__doc__.split("\n")[0].strip("`"))
    parser.add_argument(
        "checkpoint", help="a training checkpoint, e.g. outputs/<experiment>/<run>/checkpoints/last.ckpt"
    )
    parser.add_argument("prompt", help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="at most this many new tokens (default 64)")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 decodes greedily")
    parser.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only")
    parser.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of probability p")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling generator (repeatable output)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def generate_text(args: argparse.Namespace) -> str:
    """The prompt and its continuation, decoded by the checkpoint's tokenizer."""
    import torch

    from attnlab.data.tokenizer import eos_token_id
    from attnlab.models.checkpoint import load_checkpoint

    run = load_checkpoint(args.checkpoint, key="checkpoint")
    tokenizer = run.tokenizer
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device", f"{args.device} requested but CUDA is not available")
    model = run.build_model().to(args.device).eval()
    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        raise ConfigError("prompt", "encodes to no tokens; give some text to continue")
    generator = None
    if args.seed is not None:
        generator = torch.Generator(device=args.device).manual_seed(args.seed)
    out = model.generate(
        torch.tensor([ids], device=args.device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        eos=eos_token_id(tokenizer),
        generator=generator,
    )
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=True)


def main(argv: list[str] | None = None) -> None:
    """``attnlab-generate``: prints the prompt and its continuation; a bad input is one ``error:`` line, exit 1."""
    from attnlab.cli import reproducible_kernels

    reproducible_kernels()
    args = parse_args(argv)
    try:
        text = generate_text(args)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    print(text)


if __name__ == "__main__":
    main()
