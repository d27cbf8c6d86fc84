"""Each committed cell's config as it ran, beside the table's records (``<results>/<table>/<scale>/cells.jsonl``).

Run directories stay on the machine that trained them, so without this file a committed number could only be traced
to the config today's code composes. One JSON line per cell of ``runs.csv``: its name, the overrides it was composed
from, the identity its name digests (every setting that decides its numbers), the code and packages and machine it
ran with (its ``results.json``) and its data's content hash. A line whose identity equals today's cell's is that
cell, finished: a new machine renders or extends the table from it without training the cell again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.digest import digest
from attnlab.files import write_atomic

CELLS_FILE = "cells.jsonl"
# from the cell's results.json: what ran it (code, packages, machine) and on what (its data's content hash)
RAN_WITH = ("attnlab", "commit", "packages", "torch", "cpu_kernels", "mkl_branch", "cpu_threads", "cpu", "device")
TRAINED = ("corpus_sha256", "steps", "train_tokens", "parameters")


AT_FINISH = "when the cell finished, from its run directory"


def as_run(
    name: str,
    key: dict[str, Any],
    overrides: Iterable[str],
    identity: dict[str, Any],
    results: dict[str, Any],
    recorded: str = AT_FINISH,
) -> dict[str, Any]:
    """One cell's line: ``key`` (stage, row, attention, seed), how it was composed, what its name digests and what
    its ``results.json`` says it ran with (keys it predates are null); ``recorded``: how the line was made."""
    return (
        {"name": name, **key, "recorded": recorded, "overrides": list(overrides), "identity": identity}
        | {"digest": digest(identity, 10), "ran_with": {k: results.get(k) for k in RAN_WITH}}
        | {"trained": {k: results.get(k) for k in TRAINED}}
    )


def write_cells(lines: list[dict[str, Any]], results_dir: Path) -> None:
    """``cells.jsonl``: one line per cell, in the records' order, with sorted keys (a re-collected table whose cells
    did not change leaves the file byte for byte as it was)."""
    text = "".join(json.dumps(line, sort_keys=True, default=str) + "\n" for line in lines)
    write_atomic(results_dir / CELLS_FILE, text)


def read_cells(results_dir: Path) -> dict[str, dict[str, Any]]:
    """Run name -> its as-run line; empty for a table recorded before the file existed."""
    path = results_dir / CELLS_FILE
    if not path.is_file():
        return {}
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {line["name"]: line for line in lines}


def stale(recorded: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between a recorded identity and today's (empty: the same cell)."""

    def flat(node: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(node, dict):
            return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): node}

    before, now = flat(recorded), flat(json.loads(json.dumps(identity, default=str)))
    return sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key))


def committed_cells(cells: list[Any], results_dir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The committed records (``runs.csv`` lines, run name -> record) of ``cells`` not trained here whose as-run
    identity is today's (finished: neither trained nor evaluated again), and a line per other committed cell (it will
    be trained again), keyed by today's name of the cell: its new name where today's config names it differently
    (stale), and what changed where its as-run line says, or that it has none."""
    import pandas as pd

    runs = results_dir / "runs.csv"
    if not runs.is_file():
        return {}, {}
    records = {Path(str(r["run"])).name: r for r in pd.read_csv(runs).to_dict("records")}
    recorded = read_cells(results_dir)
    reused: dict[str, dict[str, Any]] = {}
    changed: dict[str, str] = {}
    today = {(c.stage, c.row, c.attention, c.seed): c for c in cells}
    for name, record in records.items():
        cell = today.get((record["stage"], record["row"], record["attention"], int(record["seed"])))
        if cell is None or cell.finished:
            continue
        line = recorded.get(name)
        differs = stale(line["identity"], cell.identity) if line else None
        renamed = name != cell.directory.name
        if not renamed and differs == []:
            reused[name] = record
        else:
            why = f"changed: {', '.join(differs)}" if differs else "recorded before its as-run config was committed"
            changed[cell.directory.name] = f"{name}{f' is now {cell.directory.name}' if renamed else ''} ({why})"
    return reused, changed


@dataclass(frozen=True)
class SharedCell:
    """A cell of this table that another table committed at the same scale, keyed as this table keys it."""

    record: dict[str, Any]  # its runs.csv line, with this table's stage and row
    line: dict[str, Any]  # its as-run line, likewise
    source: Path  # the results directory that committed it (``<results>/<table>/<scale>``)
    source_key: tuple[str, str, str, int]  # (stage, row, attention, seed) there: its curves' key in that table


def shared_cells(cells: list[Any], results_dir: Path, same_evaluation: Callable[[str], bool]) -> dict[str, SharedCell]:
    """The unfinished ``cells`` that other tables committed at this scale (``<results>/*/<scale>/``): the same name
    and as-run identity (everything that decides the cell's numbers) and the same evaluation (``same_evaluation`` of
    the other table's name), so a cell the outliers table trained is the variants table's too, on a machine that
    never had its run directory. Tables name their rows differently (``OPT-125m``, ``from scratch``): a shared cell
    is matched by its name and re-keyed to this table's stage and row."""
    import pandas as pd

    wanted = {cell.directory.name: cell for cell in cells if not cell.finished}
    found: dict[str, SharedCell] = {}
    for runs in sorted(results_dir.parent.parent.glob(f"*/{results_dir.name}/runs.csv")):
        source = runs.parent
        if source.resolve() == results_dir.resolve():
            continue
        records = {Path(str(r["run"])).name: r for r in pd.read_csv(runs).to_dict("records")}
        hits = [name for name in records if name in wanted and name not in found]
        if not hits or not same_evaluation(source.parent.name):
            continue
        lines = read_cells(source)
        for name in hits:
            cell, line, record = wanted[name], lines.get(name), records[name]
            if line is None or stale(line["identity"], cell.identity):
                continue
            key = {"stage": cell.stage, "row": cell.row}
            source_key = (record["stage"], record["row"], record["attention"], int(record["seed"]))
            found[name] = SharedCell(record | key, line | key, source, source_key)
    return found
