"""``attnlab-train`` and ``python train.py``: train a model (``model=tiny attention=vanilla ...``, Hydra overrides)."""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
import hydra_plugins.attnlab_launcher  # noqa: F401  (hydra/launcher=joblib is ours on purpose: no schema warning)
from attnlab.cli import ctrl_c_stops, one_line_errors, reproducible_kernels
from attnlab.configs import config_source, run_hydra
from attnlab.errors import interrupted


def train(cfg: DictConfig) -> dict[str, Any]:
    """The training job of the command line and of ``attnlab.train``; ``eval.after_train`` evaluates the run.

    Training and evaluation are imported here, after Hydra's config checks, so a bad value fails in a second."""
    from attnlab.console import log_once, no_logging_tracebacks, print_config
    from attnlab.training.run import main as run_training

    log_once()  # Lightning's lines once, not also through its own handler
    no_logging_tracebacks()  # a signal's log line that collides with a write is dropped, not a traceback
    if cfg.get("print_config", True):
        print_config(cfg)
    evaluate = None
    if OmegaConf.select(cfg, "eval.after_train"):  # lm-eval is imported only by runs that evaluate
        from attnlab.eval.harness import AfterTraining

        evaluate = AfterTraining(cfg)
    return run_training(cfg, evaluate)


def task(cfg: DictConfig) -> float | None:
    """Returns the validation loss, which Hydra sweepers can optimise."""
    with one_line_errors():
        return train(cfg).get("val_loss")


def main(config_dir: str | None = None) -> None:
    """``config_dir``: train.py's own ``conf/``; by default the checkout's, else the installed package's."""
    reproducible_kernels()
    ctrl_c_stops()
    try:
        run_hydra(config_dir or config_source("conf"), "train", task)
    except KeyboardInterrupt:  # inside the training loop a signal is the run's own stop; this is outside it
        sys.exit(interrupted())


if __name__ == "__main__":  # python -m attnlab.cli.train: what the table engine's sweeps run
    main()
