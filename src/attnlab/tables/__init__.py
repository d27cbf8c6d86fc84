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
    """Train what is missing, evaluate what is not evaluated, write and print the table; returns its Markdown."""
    from attnlab.tables.collect import write
    from attnlab.tables.engine import Engine

    engine = Engine(table, scale, root=root, runs_dir=runs_dir, force=force, args=args, launcher=launcher)
    cells = engine.cells()
    engine.check_requirements()
    engine.train(cells)
    markdown = write(engine.evaluate(cells), table, scale, results_dir)
    print(markdown)
    return markdown
