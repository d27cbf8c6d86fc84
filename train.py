"""Train a model: ``python train.py model=tiny attention=vanilla data=wiki_sample`` (Hydra overrides)."""

from functools import partial

import hydra
from omegaconf import DictConfig, OmegaConf

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
from attnlab.eval.harness import evaluate_after_training
from attnlab.training.run import main as run_training


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns the validation loss, which Hydra sweepers can optimise; ``eval.after_train`` evaluates the run."""
    evaluate = partial(evaluate_after_training, cfg) if OmegaConf.select(cfg, "eval.after_train") else None
    return run_training(cfg, evaluate).get("val_loss")


if __name__ == "__main__":
    main()
