"""Paper tables as data (``experiments/conf/table/``), run by one engine: grid -> training multiruns -> evaluation ->
table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.tables.definitions import load_table, table_config

__all__ = ["load_table", "render", "reproduce", "table_config"]


def reproduce(
    table: str | dict[str, Any],
    scale: str,
    *,
    root: Path | None = None,
    runs_dir: Path | None = None,
    results_dir: Path | None = None,
    force: bool = False,
    args: Sequence[str] = (),
    launcher: Sequence[str] = (),
    partial: bool = False,
) -> str:
    """Train what is missing, evaluate what is not evaluated, write and print the table (and log it to W&B when the
    cells log there); returns its Markdown. ``table``: a name in experiments/conf/table/ (what ``attnlab-table
    table=<name>`` runs; the directories it leaves unset come from reproduce_table.yaml: the checkout's outputs/ and
    experiments/results/, or the current directory's when installed) or a table ``load_table`` composed.

    ``partial``: train nothing; write the table from the cells that have finished training so far (evaluating
    those not yet evaluated), headed by what it lacks, so results can be committed while a long table still runs
    (in another process, which later reuses these evaluations). Its reports and its W&B run wait for the whole table.
    """
    from omegaconf import OmegaConf

    from attnlab.errors import ConfigError
    from attnlab.tables.collect import write
    from attnlab.tables.engine import Engine
    from attnlab.tables.figures import save_effects_figure
    from attnlab.tables.reports import REPORTS

    if isinstance(table, str):
        cfg = table_config(table, scale)
        root, runs_dir = root or Path(cfg.root_dir), runs_dir or Path(cfg.runs_dir)
        results_dir = results_dir or Path(cfg.results_dir)
        table = OmegaConf.to_container(cfg.table, resolve=True)
    if root is None or runs_dir is None or results_dir is None:
        raise TypeError("a composed table needs root, runs_dir and results_dir (a table's name does not)")
    forced = runs_dir / f".force-{table.get('name', 'table')}-{scale}"  # the salt of a FORCE=1 table not yet written
    salt = forced_salt(forced) if force and not partial else {}
    engine = Engine(table, scale, root=root, runs_dir=runs_dir, force=force, args=args, launcher=launcher, **salt)
    try:
        grid = engine.cells()
    except ConfigError:  # naming a gpu scale's cells reads its corpus, which only that machine may have
        engine.check_requirements()  # so a scale this machine cannot run says that first
        raise
    if salt and not forced.is_file():  # kept until the table is written, so the same command resumes its cells
        from attnlab.files import write_atomic

        forced.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(forced, salt["salt"] + "\n")
    cells = [cell for cell in grid if cell.finished] if partial else grid
    if not cells:
        raise ConfigError("partial", "no cell of this table has finished training yet: run it without partial")
    if not all(cell.finished and engine.evaluated(cell) for cell in cells):
        engine.check_requirements()  # cells trained and evaluated elsewhere (a GPU's, carried back) need nothing more
    engine.train(cells)  # a partial table's cells are all trained already
    records = engine.evaluate(cells)
    status = missing_cells(records, grid)  # None once the table holds every cell
    project = next((c.wandb_project for c in cells if c.wandb_project), None)
    wandb_cfg = None  # logger=wandb cells: the finished table joins their runs' group (its run dir: runs_dir/wandb)
    if project is not None and status is None:
        wandb_cfg = {"project": project, "group": engine.wandb_group, "tags": engine.wandb_tags(), "dir": str(runs_dir)}
    reports = [] if status else table.get("reports") or []  # a partial table has none yet
    sections = [REPORTS[name](engine, cells, results_dir) for name in reports]
    siblings = family_siblings(table, scale, results_dir)
    curves = engine.trajectories(cells)
    markdown = write(records, table, scale, results_dir, wandb_cfg, curves, sections, status, siblings)
    save_effects_figure(table, scale, results_dir, engine.row_sizes)
    if salt and status is None:
        forced.unlink(missing_ok=True)  # written whole: the next FORCE=1 starts afresh
    print(markdown)
    refresh_family(siblings, scale, results_dir, root)
    return markdown


def forced_salt(path: Path) -> dict[str, str]:
    """``FORCE=1``'s fresh cells are named with a salt; an interrupted forced table kept its salt in ``path``, so the
    same command resumes those cells (a new salt would orphan them) until the table is written whole."""
    import logging
    import time

    if path.is_file() and (salt := path.read_text().strip()):
        logging.getLogger(__name__).info(
            "FORCE=1 resumes the forced run of this table begun %s (its cells are named with that salt; to start "
            "afresh instead, remove %s)",
            salt,
            path,
        )
        return {"salt": salt}
    return {"salt": time.strftime("%Y%m%d-%H%M%S")}


def render(
    table: dict[str, Any], scale: str, *, results_dir: Path, root: Path | None = None, family: bool = True
) -> str:
    """Write the table again from the records it committed (``runs.csv``, ``curves.csv``), without its cells: what a
    fresh clone can do when the way a table is read changes (phenomenon checks, corrected verdicts, labels). A
    report is written again from the CSV it committed (``root``: the repository, for our models' sizes); without
    that CSV the table has to be reproduced instead. ``effects.png`` is drawn again from the CSVs too. ``family``:
    also write again the other tables of the paper's family at this scale, whose corrected verdicts count this
    table's comparisons (they print nothing)."""
    import pandas as pd

    from attnlab.errors import ConfigError
    from attnlab.tables.collect import write
    from attnlab.tables.engine import Engine
    from attnlab.tables.figures import save_effects_figure
    from attnlab.tables.reports import RENDERS, SAYS_WHAT_IS_MISSING

    runs = results_dir / "runs.csv"
    if not runs.is_file():
        raise ConfigError("render_only", f"no records to render: {runs} is missing (run the table first)")
    records = pd.read_csv(runs).to_dict("records")
    engine = Engine(table, scale, root=root, runs_dir=root / "outputs" / "runs") if root is not None else None
    status = missing_cells(records, engine.cells()) if engine is not None else None
    reports = [] if status else table.get("reports") or []  # a partial table has none yet
    for name in reports:
        known = name in RENDERS and (name in SAYS_WHAT_IS_MISSING or (results_dir / RENDERS[name][0]).is_file())
        if root is None or not known:
            source = RENDERS[name][0] if name in RENDERS else "CSV to render it from"
            found = f"{table['name']} has reports computed from its cells' files (no committed {source})"
            raise ConfigError("render_only", f"{found}: reproduce it")
    curves = pd.read_csv(results_dir / "curves.csv") if (results_dir / "curves.csv").is_file() else None
    sections = [RENDERS[name][1](table, scale, engine.row_sizes, results_dir) for name in reports]
    siblings = family_siblings(table, scale, results_dir)
    markdown = write(records, table, scale, results_dir, None, curves, sections, status, siblings)
    save_effects_figure(table, scale, results_dir, engine.row_sizes if engine else dict)
    if family:
        print(markdown)
        refresh_family(siblings, scale, results_dir, root)
    return markdown


def family_siblings(table: dict[str, Any], scale: str, results_dir: Path) -> dict[str, Any]:
    """The raw effects (``collect.raw_effects``) of the other tables of the table's paper family (their configs'
    ``family``) that have records at this scale beside ``results_dir`` (``<results>/<table>/<scale>``)."""
    import pandas as pd
    from omegaconf import OmegaConf

    from attnlab.configs import config_files
    from attnlab.tables.collect import raw_effects, with_derived

    found = {}
    if not table.get("family"):
        return found
    for path in sorted((config_files("experiments/conf") / "table").glob("*.yaml")):
        runs = results_dir.parent.parent / path.stem / scale / "runs.csv"
        if path.stem == table["name"] or not runs.is_file():
            continue
        if OmegaConf.load(path).get("family") == table["family"]:
            records = with_derived(pd.read_csv(runs).to_dict("records"))
            found[path.stem] = raw_effects(records, load_table(path.stem), scale)
    return found


def refresh_family(siblings: dict[str, Any], scale: str, results_dir: Path, root: Path | None) -> None:
    """Write the ``siblings`` again from their records, so their corrected verdicts count the table just written."""
    for name in siblings:
        render(load_table(name), scale, results_dir=results_dir.parent.parent / name / scale, root=root, family=False)


def missing_cells(records: list[dict[str, Any]], cells: list[Any]) -> str | None:
    """The line a partial table opens with: how many of its cells it holds and which seeds of which variants it
    lacks; None when it holds them all."""
    held = {(r["stage"], r["row"], r["attention"], int(r["seed"])) for r in records}
    lacking: dict[tuple[str, str, str], list[int]] = {}
    for cell in cells:
        if (cell.stage, cell.row, cell.attention, cell.seed) not in held:
            lacking.setdefault((cell.stage, cell.row, cell.attention), []).append(cell.seed)
    if not lacking:
        return None
    which = "; ".join(
        f"{attention} ({stage}, {row}) seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        for (stage, row, attention), seeds in lacking.items()
    )
    return (
        f"**Partial: {len(cells) - sum(map(len, lacking.values()))} of {len(cells)} cells** (written with "
        f"`partial=true` while the others train; the reports wait for the whole table). Not yet in it: {which}."
    )
