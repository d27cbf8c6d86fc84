"""Train a model: ``python train.py model=tiny attention=vanilla data=wiki_sample`` (Hydra overrides)."""

import hydra
from omegaconf import DictConfig

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} before Hydra composes the config)
from attnlab.training.run import main as run_training


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns the validation loss, which Hydra sweepers can optimise."""
    return run_training(cfg).get("val_loss")


if __name__ == "__main__":
    main()
