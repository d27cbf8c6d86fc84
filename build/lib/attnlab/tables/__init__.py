"""Paper tables as data (``experiments/conf/table/``), run by one engine: grid -> training multiruns -> evaluation ->
table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def load_table(name: str, root: Path) -> dict[str, Any]:
    """``experiments/conf/table/<name>.yaml`` as the engine gets it: composed by Hydra (its ``/table_protocol``
    defaults merged)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import attnlab.resolvers  # noqa: F401  (the config's ${project_root:})

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(root / "experiments" / "conf"), version_base="1.3"):
        cfg = compose(config_name="reproduce_table", overrides=[f"table={name}"])
    return OmegaConf.to_container(cfg.table, resolve=True)


def reproduce(
    table: dict[str, Any],
    scale: str,
    *,
    root: Path,
    runs_dir: Path,
    results_dir: Path,
    force: bool = False,
    args: Sequence[str] = (),
    launcher: Sequence[str] = (),
) -> str:
    """Train what is missing, evaluate what is not evaluated, write and print the table (and log it to W&B when the
    cells log there); returns its Markdown."""
    from attnlab.tables.collect import write
    from attnlab.tables.engine import Engine
    from attnlab.tables.reports import REPORTS

    engine = Engine(table, scale, root=root, runs_dir=runs_dir, force=force, args=args, launcher=launcher)
    cells = engine.cells()
    engine.check_requirements()
    engine.train(cells)
    project = next((c.wandb_project for c in cells if c.wandb_project), None)
    wandb_cfg = None  # logger=wandb cells: the finished table joins their runs' group (its run dir: runs_dir/wandb)
    if project is not None:
        wandb_cfg = {"project": project, "group": engine.wandb_group, "tags": engine.wandb_tags(), "dir": str(runs_dir)}
    records = engine.evaluate(cells)
    sections = [REPORTS[name](engine, cells, results_dir) for name in table.get("reports") or []]
    markdown = write(records, table, scale, results_dir, wandb_cfg, engine.trajectories(cells), sections)
    print(markdown)
    return markdown


def render(table: dict[str, Any], scale: str, *, results_dir: Path, root: Path | None = None) -> str:
    """Write the table again from the records it committed (``runs.csv``, ``curves.csv``), without its cells: what a
    fresh clone can do when the way a table is read changes (phenomenon checks, corrected verdicts, labels). A
    report is written again from the CSV it committed (``root``: the repository, for our models' sizes); without
    that CSV the table has to be reproduced instead."""
    import pandas as pd

    from attnlab.errors import ConfigError
    from attnlab.tables.collect import write
    from attnlab.tables.reports import RENDERS

    runs = results_dir / "runs.csv"
    if not runs.is_file():
        raise ConfigError("render_only", f"no records to render: {runs} is missing (run the table first)")
    reports = table.get("reports") or []
    for name in reports:
        if name not in RENDERS or root is None or not (results_dir / RENDERS[name][0]).is_file():
            source = RENDERS[name][0] if name in RENDERS else "CSV to render it from"
            found = f"{table['name']} has reports computed from its cells' files (no committed {source})"
            raise ConfigError("render_only", f"{found}: reproduce it")
    records = pd.read_csv(runs).to_dict("records")
    curves = pd.read_csv(results_dir / "curves.csv") if (results_dir / "curves.csv").is_file() else None
    sections = [RENDERS[name][1](table, scale, root, results_dir) for name in reports]
    markdown = write(records, table, scale, results_dir, curves=curves, sections=sections)
    print(markdown)
    return markdown
