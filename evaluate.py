"""Evaluate a model: ``python evaluate.py ckpt_path=outputs/<run>/checkpoints/last.ckpt eval=table3`` (Hydra)."""

import sys

import hydra
from omegaconf import DictConfig

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
from attnlab.errors import interrupted


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Evaluation is imported here, after Hydra's config checks, so a bad value fails in a second."""
    from attnlab.console import log_once, print_config
    from attnlab.eval.run import main as run_evaluation

    log_once()  # Lightning's lines once, not also through its own handler
    if cfg.get("print_config", True):
        print_config(cfg)
    run_evaluation(cfg)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # inside the training loop a signal is the run's own stop; this is outside it
        sys.exit(interrupted())
