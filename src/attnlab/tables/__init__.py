"""Paper tables as data (``conf/table/``), run by one engine: grid -> training multiruns -> evaluation -> table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


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

    engine = Engine(table, scale, root=root, runs_dir=runs_dir, force=force, args=args, launcher=launcher)
    cells = engine.cells()
    engine.check_requirements()
    engine.train(cells)
    project = next((c.wandb_project for c in cells if c.wandb_project), None)
    wandb_cfg = None  # logger=wandb cells: the finished table joins their runs' group (its run dir: runs_dir/wandb)
    if project is not None:
        wandb_cfg = {"project": project, "group": engine.wandb_group, "tags": engine.wandb_tags(), "dir": str(runs_dir)}
    markdown = write(engine.evaluate(cells), table, scale, results_dir, wandb_cfg)
    print(markdown)
    return markdown
