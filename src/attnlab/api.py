"""attnlab as a library: ``attnlab.train``, ``attnlab.evaluate`` and ``attnlab.load``. Training and evaluation run
the console scripts' jobs on Hydra's compose API, in this process: the same configs and overrides, and the same run
directory, ``.hydra/`` record and log file as ``attnlab-train`` / ``attnlab-eval``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.errors import ConfigError, require

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from tokenizers import Tokenizer

    from attnlab.models import GPT


def run(config_name: str, overrides: Sequence[str], job: Callable[[DictConfig], dict[str, Any]]) -> dict[str, Any]:
    """Compose ``conf/<config_name>.yaml`` with ``overrides`` and run ``job`` as Hydra's single run would, under a
    run id of its own (each call is a new run): the config checks first (a bad override or value raises
    ``ConfigError`` before anything is written), then the run directory, its ``.hydra/`` and ``<config_name>.log``,
    and Hydra's callbacks around the job."""
    from hydra import compose
    from hydra._internal.callbacks import Callbacks  # Hydra 1.3 exports no public one
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.errors import HydraException
    from hydra.types import HydraContext

    from attnlab.configs import initialized
    from attnlab.resolvers import new_run_id
    from attnlab.validation import ValidateBeforeWriting

    new_run_id()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with initialized("conf", job_name=config_name):
        try:
            cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        except HydraException as exc:
            raise override_error(overrides, exc) from None
        callbacks = Callbacks(cfg)
        for validate in [c for c in callbacks.callbacks if isinstance(c, ValidateBeforeWriting)]:
            callbacks.callbacks.remove(validate)  # its command-line form exits the process; here it raises
            validate.check(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        try:
            done = run_job(
                hydra_context=context, task_function=job, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None
            )
        finally:  # Hydra's job logging (the console and the run's log file) ends with the job, not with the process
            for handler in set(root.handlers) - set(handlers):
                handler.close()
            root.handlers[:], root.level = handlers, level
        callbacks.on_run_end(config=cfg, config_name=config_name, job_return=done)
    return done.return_value  # the job's exception, raised again, when it failed


def override_error(overrides: Sequence[str], exc: Exception) -> ConfigError:
    """Hydra's composition error (an unknown key or option, a malformed override) as ``ConfigError`` naming the
    override's key, as the command line's one line does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    message = " ".join(str(exc).split())
    for override in overrides:
        try:
            key = OverridesParser.create().parse_override(override).key_or_group
        except OverrideParseException:
            return ConfigError(override, message)
        if f"'{key}" in message:  # Hydra quotes the key ('foo') or the option ('model/nope') it could not use
            return ConfigError(key, message)
    return ConfigError("overrides", message)


def train(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train as ``attnlab-train <overrides>`` does; returns the run's ``results.json`` (``output_dir``, ``val_ppl``,
    ``last_checkpoint``, ...)."""
    from attnlab.cli.train import train as job

    return run("train", overrides, job)


def checkpoint_source(path: str | Path, key: str = "path") -> tuple[str, str]:
    """``("ckpt_path", file)`` for one of our checkpoints (a ``.ckpt`` file, or a run directory: its last one), else
    ``("pretrained", "hf:<name or dir>")`` for a Hugging Face directory or hub name (``hf:`` optional). Anything
    else (a path that is not there, a directory holding neither) raises ``ConfigError`` naming ``key``."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from attnlab.models.hf import INIT_FROM_PREFIX
    from attnlab.run_directory import LAST_CHECKPOINT

    text = str(path)
    if text.startswith(INIT_FROM_PREFIX):
        return "pretrained", text
    local = Path(text)
    if (local / LAST_CHECKPOINT).is_file():
        return "ckpt_path", str(local / LAST_CHECKPOINT)
    if local.is_file():
        return "ckpt_path", text
    if (local / "config.json").is_file():
        return "pretrained", INIT_FROM_PREFIX + text
    wanted = f"a .ckpt file, a run directory with {LAST_CHECKPOINT}, a Hugging Face directory or a hub name"
    require(not local.exists(), key, f"{text} holds neither {LAST_CHECKPOINT} nor config.json; expected {wanted}")
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise ConfigError(key, f"no such file or directory: {text}; expected {wanted}") from None
    require(not text.endswith(".ckpt"), key, f"no such file: {text}")
    return "pretrained", INIT_FROM_PREFIX + text


def evaluate(checkpoint: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate as ``attnlab-eval`` does (``overrides``: ``eval=<suite>``, ``limit=``, ...); ``checkpoint`` as for
    ``load``. Returns the evaluation's ``results.json`` (``summary``: the suite's numbers)."""
    from attnlab.cli.evaluate import evaluate as job

    key, value = checkpoint_source(checkpoint, "checkpoint")
    return run("evaluate", [f"{key}={value}", *overrides], job)


def load(path: str | Path, attention: dict[str, Any] | str = "vanilla") -> tuple[GPT, Tokenizer]:
    """The model (in eval mode) and tokenizer of one of our checkpoints (a ``.ckpt`` or a run directory) or of a
    Hugging Face model (directory or hub name; ``attention``: the variant to put into it, at its fine-tune init)."""
    from attnlab.eval.lm import load_model, load_tokenizer
    from attnlab.models.checkpoint import load_checkpoint

    key, value = checkpoint_source(path)
    if key == "ckpt_path":
        run_checkpoint = load_checkpoint(value)
        return load_model(run_checkpoint).eval(), load_tokenizer(run_checkpoint)
    return load_model(pretrained=value, attention=attention).eval(), load_tokenizer(pretrained=value)
