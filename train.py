"""Train a model: ``python train.py model=tiny attention=vanilla data=wiki_sample`` (Hydra overrides)."""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
import hydra_plugins.attnlab_launcher  # noqa: F401  (hydra/launcher=joblib is ours on purpose: no schema warning)
from attnlab.errors import interrupted


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns the validation loss, which Hydra sweepers can optimise; ``eval.after_train`` evaluates the run.

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
    return run_training(cfg, evaluate).get("val_loss")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # inside the training loop a signal is the run's own stop; this is outside it
        sys.exit(interrupted())
