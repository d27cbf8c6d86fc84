"""The training job behind ``python train.py``: compose data, model, callbacks, loggers and trainer, then fit."""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from omegaconf import DictConfig

from attnlab.compare import run_figure
from attnlab.configs import plain
from attnlab.console import announce
from attnlab.data import TextDataModule
from attnlab.errors import ConfigError, require
from attnlab.models import GPT, ModelConfig, build_gpt
from attnlab.models.checkpoint import check_resume, load_checkpoint, record
from attnlab.numerics import kernel_record
from attnlab.run_directory import (
    RESULTS_FILE,
    RunDirectoryInUse,
    claim_run_directory,
    in_multirun,
    output_dir,
    release_run_directory,
    remove_stub,
    write_results,
)
from attnlab.slurm import cluster_plugins
from attnlab.training.callbacks import TokenThroughput
from attnlab.training.checkpointing import last_checkpoint_path
from attnlab.training.guards import final_validation_missing, stop_cleanly
from attnlab.training.loggers import log_results, logged_config
from attnlab.training.module import LanguageModel
from attnlab.validation import validate_train_config

log = logging.getLogger(__name__)


def build_datamodule(cfg: DictConfig, model: dict[str, Any]) -> TextDataModule:
    require(
        cfg.data.block_size <= model["block_size"],
        "data.block_size",
        f"{cfg.data.block_size} exceeds the model's context model.block_size={model['block_size']}",
    )
    return instantiate(cfg.data, tokenizer=model.get("tokenizer") or (cfg.data.get("tokenizer") or None))


def steps_for_tokens(cfg: DictConfig, accumulation: int, world_size: int) -> int:
    """Optimizer steps that consume ``train_tokens``: each step sees batch x block x accumulation x devices."""
    per_step = cfg.data.batch_size * cfg.data.block_size * accumulation * world_size
    require(cfg.train_tokens > 0, "train_tokens", f"must be positive, got {cfg.train_tokens}")
    return math.ceil(cfg.train_tokens / per_step)


def batches_per_step(cfg: DictConfig, world_size: int) -> int:
    """``trainer.accumulate_grad_batches``, or the accumulation that makes each optimizer step see
    ``global_batch_tokens`` whatever the number of processes (the batch a paper states, on any machine)."""
    tokens = cfg.get("global_batch_tokens")
    if tokens is None:
        return cfg.trainer.accumulate_grad_batches
    per_batch = cfg.data.batch_size * cfg.data.block_size * world_size
    require(
        cfg.trainer.accumulate_grad_batches == 1,
        "global_batch_tokens",
        "decides trainer.accumulate_grad_batches: set one of the two",
    )
    require(
        isinstance(tokens, int) and tokens > 0 and tokens % per_batch == 0,
        "global_batch_tokens",
        f"must be a positive multiple of data.batch_size x data.block_size x {world_size} process(es) = {per_batch}, "
        f"got {tokens!r}",
    )
    return tokens // per_batch


class Evaluation(Protocol):
    """What ``eval.after_train`` gives training (train.py builds it; training never imports evaluation)."""

    def check(self, window: int) -> None: ...  # the suite fits a model of this window: before any training

    def __call__(self, checkpoint: str) -> dict[str, Any]: ...  # evaluate the finished run's checkpoint


def run(cfg: DictConfig, evaluate: Evaluation | None = None) -> dict[str, Any]:
    """Train one model; returns (and writes to ``results.json``) the final metrics.

    ``evaluate``: called with the best (else last) checkpoint when training ends; its summary joins the results.
    """
    optim = validate_train_config(cfg)
    L.seed_everything(cfg.seed, workers=True)
    out = output_dir(cfg)
    if not (HydraConfig.initialized() and HydraConfig.get().output_subdir is None):  # DDP rank > 0: rank 0 holds it
        claim_run_directory(out, "hydra.sweep.dir" if in_multirun() else "hydra.run.dir")
    request, attention = plain(cfg.model), plain(cfg.attention)
    resumed = load_checkpoint(cfg.ckpt_path) if cfg.get("ckpt_path") else None
    if resumed is not None:
        check_resume(resumed, request, attention, asdict(optim))
        log.info("Resuming %s at step %d", resumed.path, resumed.global_step)
        model_cfg, attention = dict(resumed.spec["model"]), dict(resumed.spec["attention"])
        pretrained = None
        source = str(model_cfg.get("tokenizer") or "")
        if source.endswith(".ckpt") and not Path(source).is_file() and resumed.tokenizer_json is not None:
            model_cfg["tokenizer"] = str(resumed.path)  # the start moved with its checkout; this one carries the same
    elif request.get("init_from"):
        pretrained = build_gpt(request, attention)  # architecture and tokenizer are the source's
        model_cfg = pretrained.config.to_dict()
        if request.get("tokenizer") not in (None, model_cfg["tokenizer"]):
            log.warning(
                "model.tokenizer=%s ignored: %s brings its own tokenizer", request["tokenizer"], request["init_from"]
            )
    else:
        model_cfg, pretrained = dict(request), None
        ModelConfig.from_dict(model_cfg)  # validate early, before any data work
    if evaluate is not None:
        evaluate.check(model_cfg["block_size"])
    datamodule = build_datamodule(cfg, model_cfg)
    datamodule.prepare_data()
    tokenizer = datamodule.tokenizer
    if resumed is not None and resumed.tokenizer_json is not None:
        require(
            tokenizer.get_vocab() == resumed.tokenizer.get_vocab(),
            "data.tokenizer",
            f"the data's tokenizer differs from the one {resumed.path} was trained with",
        )
    vocab = datamodule.vocab_size
    if model_cfg.get("tokenizer") or pretrained is not None or resumed is not None:
        size = model_cfg["vocab_size"]
        require(vocab <= size, "model.vocab_size", f"{size} is smaller than the tokenizer's {vocab} tokens")
    else:
        model_cfg["vocab_size"] = vocab
    # train mode: a pretrained model comes back in eval mode, and Lightning keeps the mode it finds, which would
    # fine-tune with dropout off
    # a resumed run is its checkpoint's weights, not its start's again (which may have moved with the checkout)
    weights = resumed.state_dict if resumed is not None else None
    model = (pretrained or build_gpt(model_cfg, attention, weights=weights)).train()
    model.set_token_frequencies(torch.from_numpy(datamodule.token_counts))
    log.info(describe_model(model, attention))

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate_logger(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    plugins = [*instantiate(cfg.trainer.get("plugins") or []), *cluster_plugins()]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=plugins)
    require(
        not (in_multirun() and relaunches_command(trainer)),
        "trainer.devices",
        f"{trainer.num_devices} processes in a -m sweep: Lightning starts the other ranks by re-running the command, "
        "which would re-run the sweep; start one train.py per job (a shell loop), or use trainer.devices=1",
    )
    trainer.accumulate_grad_batches = accumulation = batches_per_step(cfg, trainer.world_size)
    if cfg.get("train_tokens"):
        trainer.fit_loop.epoch_loop.max_steps = steps_for_tokens(cfg, accumulation, trainer.world_size)
    horizon = (resumed and resumed.spec.get("schedule_steps")) or trainer.max_steps
    if not cfg.trainer.get("limit_val_batches", 1.0):  # allowed (make bench times the loop alone), never silent
        log.warning("trainer.limit_val_batches=0: this run does not validate; results.json reports val_loss null")
    if optim.warmup_steps > horizon:  # legitimate for a smoke run, but never what a real run wants: say so
        log.warning(
            "optim.warmup_steps=%d is longer than the run (%d steps): the learning rate never reaches optim.lr=%g",
            optim.warmup_steps,
            horizon,
            optim.lr,
        )
    spec = {
        "model": model.config.to_dict(),
        "model_request": request,
        "attention": attention,
        "optim": asdict(optim),
        "schedule_steps": horizon,
    }
    separator = datamodule.document_separator_id
    if resumed is not None and resumed.spec.get("document_separator") != separator:
        raise ConfigError(
            "data.document_mask",
            f"{separator is not None} differs from the resumed checkpoint's "
            f"{resumed.spec.get('document_separator') is not None}; resuming continues the same run",
        )
    if separator is not None:  # only when masking: records of runs without it stay as they were
        spec["document_separator"] = separator
    run_record = record(spec, tokenizer, plain(cfg.data))
    module = LanguageModel(
        model,
        optim,
        horizon,
        run_record,
        cfg.get("compile", False),
        cfg.get("fused_loss", False),
        separator,
    )
    for logger in loggers:
        logger.log_hyperparams(logged_config(cfg, spec))

    unigram = datamodule.unigram_perplexity()
    log.info("Unigram baseline (add-one, training counts) validation perplexity: %.1f", unigram)
    started = time.perf_counter()
    with stop_cleanly(trainer):  # signals, NaN, failed writes -> RunStopped naming the saved step
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)
        if final_validation_missing(trainer):
            trainer.validate(module, datamodule=datamodule, verbose=False)
    seconds = time.perf_counter() - started

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1}
    checkpoint = trainer.checkpoint_callback
    tokens_per_step = cfg.data.batch_size * cfg.data.block_size * accumulation * trainer.world_size
    tokens = trainer.global_step * tokens_per_step  # all the model has seen, the resumed-from steps included
    tokens_this_run = (trainer.global_step - (resumed.global_step if resumed else 0)) * tokens_per_step
    results = {
        "experiment": cfg.experiment_name,
        "model": model_cfg["name"],
        "attention": attention["name"],
        "val_loss": metrics.get("val/loss"),
        "val_ppl": metrics.get("val/ppl"),
        "unigram_ppl": unigram,
        "corpus_sha256": datamodule.corpus_sha256(),
        # the final validation's monitored statistics (callbacks.outlier_monitor), for the tables' phenomenon checks
        "monitor": {k: v for k, v in metrics.items() if k.split("/")[0] in ("outliers", "sinks", "temperatures")},
        "steps": trainer.global_step,
        "train_tokens": tokens,
        "run_tokens": tokens_this_run,
        "train_seconds": seconds,
        "tokens_per_second": tokens_this_run / seconds if seconds > 0 else None,  # the whole fit: validation too
        "train_loop_tokens_per_second": training_steps_rate(trainer),
        "parameters": model.num_parameters(),
        **kernel_record(),
        "device": f"{trainer.strategy.root_device.type} x{trainer.world_size}",
        "best_checkpoint": own_file(getattr(checkpoint, "best_model_path", None), out),
        "last_checkpoint": own_file(last_checkpoint_path(trainer), out),
        "output_dir": str(out),
    }
    if trainer.is_global_zero and evaluate is not None:
        target = results["best_checkpoint"] or results["last_checkpoint"]
        require(target is not None, "eval.after_train", "training saved no checkpoint to evaluate")
        results["eval"] = evaluate(target)
    if trainer.is_global_zero:
        log_results(loggers, results)
        write_results(out / RESULTS_FILE, results)
        run_figure(out, results)  # loss_curves.png: the run's losses at a glance, as attnlab-compare draws a sweep's
        announce(summary(results, model_label(results["model"])))  # the last words, also at the end of train.log
    return results


def instantiate_logger(node: DictConfig) -> Logger:
    """A ``logger.<name>`` entry instantiated; its factory's ``ConfigError`` (a missing optional package) is raised
    as itself, not inside Hydra's ``InstantiationException``, so the command prints its one line."""
    from hydra.errors import InstantiationException

    try:
        return instantiate(node)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, ConfigError):
            raise exc.__cause__ from None
        raise


def training_steps_rate(trainer: L.Trainer) -> float | None:
    """Tokens per second of the training steps alone, as Lightning's ThroughputMonitor (callbacks.throughput)
    clocks them: validation is left out, so a short run with frequent validation is not reported slow. None
    without the monitor."""
    monitor = next((c for c in trainer.callbacks if isinstance(c, TokenThroughput)), None)
    return monitor.training_tokens_per_second() if monitor is not None else None


def relaunches_command(trainer: L.Trainer) -> bool:
    """Whether Lightning will start this node's other processes by running ``sys.argv`` again (DDP's default)."""
    launcher = getattr(trainer.strategy, "launcher", None)
    return (
        isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
        and trainer.num_devices > 1
    )


def own_file(path: str | None, run_dir: Path) -> str | None:
    """``path`` if it exists inside this run's directory: a resumed run's ModelCheckpoint state still names the old
    run's best checkpoint until this run improves on it."""
    if not path or not Path(path).is_file():
        return None
    return path if Path(path).resolve().is_relative_to(run_dir.resolve()) else None


def describe_model(model: GPT, attention: dict[str, Any]) -> str:
    """Parameter count and what the attention variant adds, with its share of the model."""
    total = model.num_parameters()
    added = sum(p.numel() for _, p in model.variant_parameters())
    return (
        f"Model {model.config.name} ({model.config.family}): {total:,} parameters; "
        f"attention={attention['name']} adds {added:,} ({100 * added / total:.3f}% of the model)"
    )


def model_label(preset: str) -> str:
    """The model preset with the command line's changes to it (``tiny (model.n_layer=2, model.n_embd=32)``): the
    preset's name alone would misname a resized model."""
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    changed = [override.lstrip("+~") for override in overrides if override.lstrip("+~").startswith("model.")]
    return f"{preset} ({', '.join(changed)})" if changed else preset


def summary(results: dict[str, Any], model: str | None = None) -> str:
    """The run's last words; ``model``: how to name it (``model_label``), by default its preset."""
    val_ppl = results["val_ppl"]
    ppl = f"{val_ppl:.1f}" if val_ppl is not None else "n/a"
    rate = f"{results['tokens_per_second'] or 0.0:,.0f} tokens/s"
    if results.get("train_loop_tokens_per_second"):  # runs recorded before it was measured print what they have
        rate += f" overall, {results['train_loop_tokens_per_second']:,.0f} in training steps"
    return (
        f"\nattnlab: {model or results['model']} + attention={results['attention']}, {results['steps']} steps, "
        f"{results['run_tokens']:,} tokens in {results['train_seconds']:.0f} s ({rate})\n"
        f"  validation perplexity {ppl}  vs  unigram baseline {results['unigram_ppl']:.1f}\n"
        f"  outputs: {results['output_dir']}\n"
    )


def main(cfg: DictConfig, evaluate: Evaluation | None = None) -> dict[str, Any]:
    """The training job: a bad config raises ``ConfigError`` leaving no run directory behind (the command line
    prints it as one line, ``attnlab.train`` raises it); W&B is closed after every run."""
    try:
        return run(cfg, evaluate)
    except ConfigError as exc:
        if not isinstance(exc, RunDirectoryInUse):  # (that one is another process's directory)
            remove_stub(output_dir(cfg))
        raise
    finally:
        release_run_directory(output_dir(cfg))  # a sweep's next job may be this directory's next user
        wandb = sys.modules.get("wandb")  # imported only by a W&B logger: nothing to close otherwise
        if wandb is not None and wandb.run is not None:
            wandb.finish()
