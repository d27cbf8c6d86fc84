"""W&B run names and tags carry the seed (a single run used to be named ``...-None``)."""

from omegaconf import OmegaConf


def test_wandb_run_name_and_tags_carry_the_seed(make_config) -> None:
    cfg = make_config(["logger=wandb", "model=tiny-neox", "attention=ssa", "seed=7"])
    wandb = OmegaConf.to_container(cfg.logger.wandb, resolve=True)
    assert wandb["name"] == "tiny-neox-ssa-s7"
    assert {"ssa", "tiny-neox", "seed-7"} <= set(wandb["tags"])
