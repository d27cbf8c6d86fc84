"""The ``README.md`` beside an exported model: what a Hugging Face user reads first on the hub or in the directory.

It says what the checkpoint is (architecture, attention variant, data, tokens seen), how well it did (the run's
validation perplexity) and the command that trained it, all from the checkpoint's record and, when the checkpoint
still sits in its run directory, that run's ``results.json`` and ``.hydra/overrides.yaml``. huggingface_hub's
``ModelCard`` writes the metadata header the hub indexes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

    from attnlab.models.checkpoint import RunCheckpoint


def run_directory(checkpoint: Path) -> Path | None:
    """The run that wrote ``checkpoint`` (``<run>/checkpoints/<name>.ckpt``), when it is still there."""
    run = checkpoint.resolve().parent.parent
    return run if (run / ".hydra").is_dir() or (run / "results.json").is_file() else None


def training_command(run: Path | None) -> str:
    """``attnlab-train <the overrides the run was started with>``, from Hydra's record of them."""
    overrides = run / ".hydra" / "overrides.yaml" if run is not None else None
    if overrides is None or not overrides.is_file():
        return "unknown (the checkpoint was exported away from its run directory)"
    from omegaconf import OmegaConf

    return " ".join(["attnlab-train", *map(str, OmegaConf.load(overrides))])


def model_card(run_checkpoint: RunCheckpoint, library: str = "transformers") -> ModelCard:
    """The card for ``run_checkpoint`` exported for ``library`` (``transformers``: an HF directory; ``attnlab``:
    ``GPT.save_pretrained``'s)."""
    from huggingface_hub import ModelCard, ModelCardData

    spec = run_checkpoint.spec
    model, attention, data = spec["model"], spec["attention"], run_checkpoint.data
    run = run_directory(run_checkpoint.path)
    results: dict[str, Any] = {}
    if run is not None and (run / "results.json").is_file():
        results = json.loads((run / "results.json").read_text())
    variant = attention.get("name", "vanilla")
    metadata = ModelCardData(
        library_name=library, pipeline_tag="text-generation", tags=["attnlab", f"attention-{variant}", "causal-lm"]
    )
    tokens = results.get("train_tokens")
    perplexity = results.get("val_ppl")
    source = data.get("source") or data.get("name") or "unknown"
    lines = [
        f"# attnlab {model.get('name', 'model')} ({model.get('family')}) with attention={variant}",
        "",
        "A GPT-style language model trained with attnlab (Lightning and Hydra; its attention variants).",
        "",
        "| | |",
        "|---|---|",
        f"| architecture | {model.get('family')}: {model.get('n_layer')} layers, {model.get('n_head')} heads, "
        f"width {model.get('n_embd')}, context {model.get('block_size')} tokens |",
        f"| attention | `{json.dumps(attention, sort_keys=True)}` |",
        f"| data | {source} (tokenizer: {model.get('vocab_size')} ids) |",
        f"| trained | {run_checkpoint.global_step:,} optimizer steps"
        + (f", {tokens:,} tokens |" if tokens is not None else " |"),
        f"| validation perplexity | {perplexity:.2f} (the run's, at its end) |"
        if perplexity is not None
        else "| validation perplexity | not recorded (the run has no results.json beside this checkpoint) |",
        f"| trained with | `{training_command(run)}` |",
        "",
        f"The tokenizer truncates to the model's context, {model.get('block_size')} tokens, and pads with its "
        "end-of-text token.",
    ]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")
