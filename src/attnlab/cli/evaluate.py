"""``attnlab-eval`` and ``python evaluate.py``: evaluate a model (``ckpt_path=<run>/checkpoints/last.ckpt eval=quick``,
Hydra overrides)."""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
from attnlab.cli import ctrl_c_stops, one_line_errors, reproducible_kernels
from attnlab.configs import config_source, run_hydra
from attnlab.errors import interrupted


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """The evaluation job of the command line and of ``attnlab.evaluate``; returns what ``results.json`` holds.

    Evaluation is imported here, after Hydra's config checks, so a bad value fails in a second."""
    from attnlab.console import log_once, print_config
    from attnlab.eval.run import main as run_evaluation

    log_once()  # Lightning's lines once, not also through its own handler
    if cfg.get("print_config", True):
        print_config(cfg)
    return run_evaluation(cfg)


def task(cfg: DictConfig) -> None:
    """Hydra's task: the results are in the run directory (a returned dict would be a sweeper's objective)."""
    with one_line_errors():
        evaluate(cfg)


def main(config_dir: str | None = None) -> None:
    """``config_dir``: evaluate.py's own ``conf/``; by default the checkout's, else the installed package's."""
    reproducible_kernels()
    ctrl_c_stops()
    try:
        run_hydra(config_dir or config_source("conf"), "evaluate", task)
    except KeyboardInterrupt:  # inside the training loop a signal is the run's own stop; this is outside it
        sys.exit(interrupted())


if __name__ == "__main__":
    main()
