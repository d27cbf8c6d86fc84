"""A table's definition, ``experiments/conf/table/<name>.yaml``, as the engine, its figures and reports read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def table_config(name: str, scale: str = "cpu", root: Path | None = None) -> Any:
    """``reproduce_table.yaml`` with ``table=<name> scale=<scale>``, composed by Hydra (the table's
    ``/table_protocol`` defaults merged): the table and where its runs and results go. ``root``: a project whose
    ``experiments/conf`` to read instead of the checkout's or the installed package's (a directory with none, an
    installed attnlab's working directory, reads those)."""
    from hydra import compose, initialize_config_dir

    import attnlab.resolvers  # noqa: F401  (the config's ${project_root:})
    from attnlab.configs import initialized

    overrides = [f"table={name}", f"scale={scale}"]
    if root is None or not (root / "experiments" / "conf").is_dir():
        with initialized("experiments/conf", job_name="reproduce_table"):
            return compose(config_name="reproduce_table", overrides=overrides)
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(root / "experiments" / "conf"), version_base="1.3"):
        return compose(config_name="reproduce_table", overrides=overrides)


def load_table(name: str, root: Path | None = None) -> dict[str, Any]:
    """``experiments/conf/table/<name>.yaml`` as the engine gets it (see ``table_config``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(table_config(name, root=root).table, resolve=True)


def stage_variants(table: dict[str, Any], scale: str, stage: str) -> list[str]:
    """The variants a stage trains at a scale: the scale's for the stage (``stage_variants``: table3's cpu_long
    fine-tunes every variant from a vanilla pretraining it shares), else the stage's own (table4 pretrains only the
    baseline), else the scale's, else the table's."""
    settings = table["scales"][scale]
    return (
        (settings.get("stage_variants") or {}).get(stage)
        or (table["stages"][stage] or {}).get("variants")
        or settings.get("variants")
        or table["variants"]
    )
