"""As-run lines (``cells.jsonl``) for committed cells recorded before the engine wrote them, where that can be proved.

A cell's name ends with the digest of its identity (every setting that decides its numbers), so where today's table
config gives a committed cell the very name it was recorded under, today's identity is the one it ran with. Those
cells get their line (``recorded`` says how it was made; the code, packages and machine they ran with were not
recorded then and stay null); a cell that today's config names differently gets none, and the report keeps composing
its config with a note. Lines already committed are kept as they are.

    python experiments/backfill_cells.py                 # every committed table at every scale
    python experiments/backfill_cells.py table3 gating   # some tables
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def backfill(name: str, scale: str) -> tuple[int, int]:
    """Write the table's ``cells.jsonl`` with every provable line; returns (lines, cells in runs.csv)."""
    import pandas as pd

    from attnlab.tables import load_table
    from attnlab.tables.as_run import read_cells, write_cells
    from attnlab.tables.engine import Engine

    results = RESULTS / name / scale
    engine = Engine(load_table(name, ROOT), scale, root=ROOT, runs_dir=ROOT / "outputs" / "runs")
    today = {(c.stage, c.row, c.attention, c.seed): c for c in engine.cells()}
    committed = read_cells(results)
    how = f"composed {time.strftime('%Y-%m-%d')} by experiments/backfill_cells.py: today's config names the cell as "
    how += "it was recorded, so this identity is the one its name digests; what it ran with was not recorded then"
    lines = []
    runs = pd.read_csv(results / "runs.csv")
    for run in runs.itertuples():
        recorded = Path(str(run.run)).name
        cell = today.get((run.stage, run.row, run.attention, int(run.seed)))
        if recorded in committed:
            lines.append(committed[recorded])
        elif cell is not None and cell.directory.name == recorded:
            lines.append(engine.as_run_line(cell, {}, recorded=how))
    if lines:
        write_cells(lines, results)
    return len(lines), len(runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", help="table names (default: every committed table)")
    args = parser.parse_args(argv)
    conf = ROOT / "experiments" / "conf" / "table"
    found = sorted(
        (runs.parent.parent.name, runs.parent.name)
        for runs in RESULTS.glob("*/*/runs.csv")
        if (conf / f"{runs.parent.parent.name}.yaml").is_file()
        and (not args.tables or runs.parent.parent.name in args.tables)
    )
    if not found:
        sys.exit(f"error: tables: names of committed tables (got {' '.join(args.tables)})")
    for name, scale in found:
        lines, cells = backfill(name, scale)
        print(f"{name}/{scale}: {lines} of {cells} cells have their as-run line")


if __name__ == "__main__":
    main()
