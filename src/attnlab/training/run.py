"""The training job behind ``python train.py``: compose data, model, callbacks, loggers and trainer, then fit."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from attnlab.data import TextDataModule
from attnlab.errors import ConfigError, require
from attnlab.models import GPT, ModelConfig
from attnlab.training.checkpointing import last_checkpoint_path
from attnlab.training.guards import RunStopped, stop_cleanly
from attnlab.training.module import LanguageModel
from attnlab.training.sweeps import in_multirun

log = logging.getLogger(__name__)


def container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def output_dir(cfg: DictConfig) -> Path:
    """The run's own directory: Hydra's when running under it, else ``paths.output_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.output_dir)


def model_and_attention(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any], GPT | None]:
    """Model config, attention config and (when fine-tuning) the pretrained model they describe."""
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:
        require(Path(ckpt_path).is_file(), "ckpt_path", f"no checkpoint at {ckpt_path}")
        hparams = torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True)["hyper_parameters"]
        log.info("Resuming %s: model and attention come from the checkpoint", ckpt_path)
        return dict(hparams["model"]), dict(hparams["attention"]), None
    model, attention = container(cfg.model), container(cfg.attention)
    if model.get("init_from"):
        from attnlab.models.hf import from_hf, parse_init_from

        # the architecture and tokenizer are the checkpoint's; dropout and the head mask are ours to set
        source = parse_init_from(model["init_from"])
        pretrained = from_hf(source, attention=attention, dropout=model["dropout"], head_mask=model.get("head_mask"))
        converted = pretrained.config.to_dict()
        if model.get("tokenizer") not in (None, converted["tokenizer"]):
            log.warning("model.tokenizer=%s ignored: %s brings its own tokenizer", model["tokenizer"], source)
        converted["init_from"] = None
        converted["extra"] = {**converted.get("extra", {}), "init_from": model["init_from"]}
        return converted, attention, pretrained
    ModelConfig.from_dict(model)  # validate early, before any data work
    return model, attention, None


def resumed_step(ckpt_path: str | None) -> int:
    """The optimizer step a resumed run starts from (0 for a fresh one)."""
    if not ckpt_path:
        return 0
    return int(torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True)["global_step"])


def build_datamodule(cfg: DictConfig, model: dict[str, Any]) -> TextDataModule:
    require(
        cfg.data.block_size <= model["block_size"],
        "data.block_size",
        f"{cfg.data.block_size} exceeds the model's context model.block_size={model['block_size']}",
    )
    return instantiate(cfg.data, tokenizer=model.get("tokenizer") or (cfg.data.get("tokenizer") or None))


def steps_for_tokens(cfg: DictConfig, world_size: int) -> int:
    """Optimizer steps that consume ``train_tokens``: each step sees batch x block x accumulation x devices."""
    per_step = cfg.data.batch_size * cfg.data.block_size * cfg.trainer.accumulate_grad_batches * world_size
    require(cfg.train_tokens > 0, "train_tokens", f"must be positive, got {cfg.train_tokens}")
    return math.ceil(cfg.train_tokens / per_step)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one model; returns (and writes to ``results.json``) the final metrics."""
    L.seed_everything(cfg.seed, workers=True)
    out = output_dir(cfg)
    model_cfg, attention, pretrained = model_and_attention(cfg)
    datamodule = build_datamodule(cfg, model_cfg)
    datamodule.prepare_data()
    if rank_zero_only.rank == 0:  # evaluation finds the tokenizer next to the checkpoints
        out.mkdir(parents=True, exist_ok=True)
        datamodule.tokenizer.save(str(out / "tokenizer.json"))
    vocab = datamodule.vocab_size
    if model_cfg.get("tokenizer") or pretrained is not None:
        size = model_cfg["vocab_size"]
        require(vocab <= size, "model.vocab_size", f"{size} is smaller than the tokenizer's {vocab} tokens")
    else:
        model_cfg["vocab_size"] = vocab
    module = LanguageModel(model_cfg, attention, container(cfg.optim), pretrained=pretrained)
    module.model.set_token_frequencies(torch.from_numpy(datamodule.token_counts))
    log.info(describe_model(module.model, attention))

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if cfg.get("train_tokens"):
        trainer.fit_loop.epoch_loop.max_steps = steps_for_tokens(cfg, trainer.world_size)
    for logger in loggers:
        logger.log_hyperparams(container(cfg))

    unigram = datamodule.unigram_perplexity()
    log.info("Unigram baseline (add-one, training counts) validation perplexity: %.1f", unigram)
    started = time.perf_counter()
    with stop_cleanly(trainer):  # reliab: signals, NaN, failed writes -> RunStopped naming the saved step
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    seconds = time.perf_counter() - started

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1}
    checkpoint = trainer.checkpoint_callback
    tokens_per_step = (
        cfg.data.batch_size * cfg.data.block_size * cfg.trainer.accumulate_grad_batches * trainer.world_size
    )
    tokens = trainer.global_step * tokens_per_step  # all the model has seen, the resumed-from steps included
    tokens_this_run = (trainer.global_step - resumed_step(cfg.get("ckpt_path"))) * tokens_per_step
    results = {
        "experiment": cfg.experiment_name,
        "model": model_cfg["name"],
        "attention": attention["name"],
        "val_loss": metrics.get("val/loss"),
        "val_ppl": metrics.get("val/ppl"),
        "unigram_ppl": unigram,
        "steps": trainer.global_step,
        "train_tokens": tokens,
        "run_tokens": tokens_this_run,
        "train_seconds": seconds,
        "tokens_per_second": tokens_this_run / seconds if seconds > 0 else None,
        "parameters": module.model.num_parameters(),
        "best_checkpoint": getattr(checkpoint, "best_model_path", None) or None,
        "last_checkpoint": last_checkpoint_path(trainer),  # reliab: last.ckpt is LastCheckpoint's
        "output_dir": str(out),
    }
    if trainer.is_global_zero and cfg.get("eval") and cfg.eval.get("after_train"):
        from attnlab.eval.harness import evaluate_after_training

        results["eval"] = evaluate_after_training(cfg, results["best_checkpoint"] or results["last_checkpoint"], out)
    if trainer.is_global_zero:
        (out / "results.json").write_text(json.dumps(results, indent=2))
        print(summary(results))
    return results


def describe_model(model: GPT, attention: dict[str, Any]) -> str:
    """Parameter count and what the attention variant adds, with its share of the model."""
    total = model.num_parameters()
    added = sum(p.numel() for _, p in model.variant_parameters())
    return (
        f"Model {model.config.name} ({model.config.family}): {total:,} parameters; "
        f"attention={attention['name']} adds {added:,} ({100 * added / total:.3f}% of the model)"
    )


def summary(results: dict[str, Any]) -> str:
    val_ppl = results["val_ppl"]
    ppl = f"{val_ppl:.1f}" if val_ppl is not None else "n/a"
    rate = results["tokens_per_second"] or 0.0
    return (
        f"\nattnlab: {results['model']} + attention={results['attention']}, {results['steps']} steps, "
        f"{results['run_tokens']:,} tokens in {results['train_seconds']:.0f} s ({rate:,.0f} tokens/s)\n"
        f"  validation perplexity {ppl}  vs  unigram baseline {results['unigram_ppl']:.1f}\n"
        f"  outputs: {results['output_dir']}\n"
    )


def main(cfg: DictConfig) -> dict[str, Any]:
    """Hydra task: a bad config prints one line naming the key and exits 2; W&B is closed after every run."""
    try:
        return run(cfg)
    except (ConfigError, RunStopped) as exc:
        if in_multirun():  # reliab: the job fails alone; the sweep callback reports it with the others
            raise
        raise SystemExit(f"error: {exc}") from None
    finally:
        import wandb

        if wandb.run is not None:
            wandb.finish()
