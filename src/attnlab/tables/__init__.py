"""Paper tables as data (``experiments/conf/table/``), run by one engine: grid -> training multiruns -> evaluation ->
table."""

from __future__ import annotations

import logging
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
    A table whose report reads its cells' run directories refuses where committed cells have none: it would drop them.
    """
    from omegaconf import OmegaConf

    from attnlab.errors import ConfigError
    from attnlab.tables.as_run import committed_cells, shared_cells, write_cells
    from attnlab.tables.collect import write
    from attnlab.tables.engine import Engine
    from attnlab.tables.figures import save_effects_figure
    from attnlab.tables.reports import READS_CELL_FILES, REPORTS

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
    # committed cells whose as-run config is today's are finished, this table's own and those another table shares
    # (unless a report reads the cells' files, which only their run directories hold)
    reused, changed = committed_cells(grid, results_dir)
    reads_files = [name for name in table.get("reports") or [] if name in READS_CELL_FILES]
    if reads_files:
        if partial and reused:  # committed, not finished here: a partial table would drop them
            raise ConfigError(
                "partial",
                f"the table's {', '.join(reads_files)} report reads its cells' run directories, and {len(reused)} "
                f"committed cell(s) have no finished one here ({', '.join(reused)}): a partial table here would drop "
                "them from the committed one; write it where they are, or train the whole table (without partial)",
            )
        changed |= {
            name: f"{name} (the table's {', '.join(reads_files)} report reads its run directory)" for name in reused
        }
        reused = {}
    shared = (
        {}
        if reads_files
        else shared_cells(
            [cell for cell in grid if cell.directory.name not in reused], results_dir, engine.same_evaluation
        )
    )
    if shared:
        logging.getLogger(__name__).info(
            "%d cell(s) taken from other tables' records at %s: %s",
            len(shared),
            scale,
            ", ".join(f"{name} ({cell.source.parent.name})" for name, cell in shared.items()),
        )
    changed = {name: line for name, line in changed.items() if name not in shared}  # another table has it
    if changed:
        logging.getLogger(__name__).warning(
            "%d committed cell(s) of %s at %s will be trained again: %s",
            len(changed),
            table.get("name"),
            scale,
            "; ".join(changed.values()),
        )
    taken = reused | {name: cell.record for name, cell in shared.items()}
    cells = [cell for cell in grid if cell.finished or cell.directory.name in taken] if partial else grid
    if not cells:
        raise ConfigError("partial", "no cell of this table has finished training yet: run it without partial")
    here = [cell for cell in cells if cell.directory.name not in taken]
    if not all(cell.finished and engine.evaluated(cell) for cell in here):
        engine.check_requirements()  # cells trained and evaluated elsewhere (a GPU's, carried back) need nothing more
    engine.train(here)  # a partial table's cells are all trained already
    evaluated = iter(engine.evaluate(here))
    records = [taken[c.directory.name] if c.directory.name in taken else next(evaluated) for c in cells]
    lines = recorded_cells(engine, cells, reused, shared, results_dir)
    status = missing_cells(records, engine.keys())  # None once the table holds every cell
    project = next((c.wandb_project for c in cells if c.wandb_project), None)
    wandb_cfg = None  # logger=wandb cells: the finished table joins their runs' group (its run dir: runs_dir/wandb)
    if project is not None and status is None:
        wandb_cfg = {"project": project, "group": engine.wandb_group, "tags": engine.wandb_tags(), "dir": str(runs_dir)}
    reports = [] if status else table.get("reports") or []  # a partial table has none yet
    sections = [REPORTS[name](engine, cells, results_dir) for name in reports]
    siblings = family_siblings(table, scale, results_dir)
    curves = engine.trajectories(here)
    if reused and (results_dir / "curves.csv").is_file():
        curves = committed_curves(curves, [c for c in cells if c.directory.name in reused], results_dir, cells)
    if shared:
        curves = shared_curves(curves, shared, cells)
    markdown = write(records, table, scale, results_dir, wandb_cfg, curves, sections, status, siblings)
    write_cells(lines, results_dir)
    save_effects_figure(table, scale, results_dir, engine.row_sizes)
    if salt and status is None:
        forced.unlink(missing_ok=True)  # written whole: the next FORCE=1 starts afresh
    print(markdown)
    refresh_family(siblings, scale, results_dir, root)
    return markdown


def recorded_cells(
    engine: Any, cells: list[Any], reused: dict[str, Any], shared: dict[str, Any], results_dir: Path
) -> list[dict[str, Any]]:
    """The as-run line of each of ``cells``: the committed one of a cell taken from this table's records, the other
    table's of a shared cell (``as_run.SharedCell``), else its own."""
    from attnlab.tables.as_run import read_cells

    committed = read_cells(results_dir) if reused else {}
    committed |= {name: cell.line for name, cell in shared.items()}
    fresh = iter(engine.as_run([c for c in cells if c.directory.name not in committed]))
    return [committed[c.directory.name] if c.directory.name in committed else next(fresh) for c in cells]


def committed_curves(curves: Any, reused: list[Any], results_dir: Path, cells: list[Any]) -> Any:
    """The training curves of the cells trained here and, from the committed ``curves.csv``, of the ``reused``
    ones, in the cells' order."""
    import pandas as pd

    key = ["stage", "row", "attention", "seed"]
    committed = pd.read_csv(results_dir / "curves.csv")
    wanted = pd.DataFrame([(c.stage, c.row, c.attention, c.seed) for c in reused], columns=key)
    return in_cells_order([curves, committed.merge(wanted, on=key)], cells)


def in_cells_order(frames: list[Any], cells: list[Any]) -> Any:
    """Curves frames concatenated, their rows in the order of the cells they belong to (stable within a cell)."""
    import pandas as pd

    order = {(c.stage, c.row, c.attention, c.seed): index for index, c in enumerate(cells)}
    both = pd.concat([frame for frame in frames if len(frame)], ignore_index=True)
    position = both[["stage", "row", "attention", "seed"]].apply(
        lambda r: order[(r.stage, r.row, r.attention, int(r.seed))], axis=1
    )
    return both.assign(_order=position).sort_values("_order", kind="stable").drop(columns="_order")


def shared_curves(curves: Any, shared: dict[str, Any], cells: list[Any]) -> Any:
    """``curves`` with the training curves of the ``shared`` cells (``as_run.SharedCell``) from the tables that
    committed them, keyed as this table keys those cells, in the cells' order."""
    import pandas as pd

    frames = [curves]
    for source in dict.fromkeys(cell.source for cell in shared.values()):
        path = source / "curves.csv"
        if not path.is_file():
            continue
        committed = pd.read_csv(path)
        for cell in (c for c in shared.values() if c.source == source):
            stage, row, attention, seed = cell.source_key
            mine = (committed.stage == stage) & (committed.row == row) & (committed.attention == attention)
            frames.append(
                committed[mine & (committed.seed == seed)].assign(stage=cell.record["stage"], row=cell.record["row"])
            )
    return in_cells_order(frames, cells) if any(len(frame) for frame in frames) else curves


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
    status = missing_cells(records, engine.keys()) if engine is not None else None
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


def missing_cells(records: list[dict[str, Any]], cells: list[tuple[str, str, str, int]]) -> str | None:
    """The line a partial table opens with: how many of its ``cells`` (``Engine.keys``) it holds and which seeds of
    which variants it lacks; None when it holds them all."""
    held = {(r["stage"], r["row"], r["attention"], int(r["seed"])) for r in records}
    lacking: dict[tuple[str, str, str], list[int]] = {}
    for stage, row, attention, seed in cells:
        if (stage, row, attention, seed) not in held:
            lacking.setdefault((stage, row, attention), []).append(seed)
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
