"""``attnlab-report`` (``make report`` in a clone): every committed table at every scale as one static site
(``outputs/report/index.html``; it opens from disk, with no server and no network). Each page has the table's reading
(the README.md beside its results), the table as the engine wrote it (ours beside the paper's, the phenomenon checks,
paired effects with raw and Holm-corrected verdicts), its figures, and links to its CSVs and to each cell's config.
Pages come from Jinja2 templates (``experiments/templates/``, shipped in the package as ``attnlab.report_templates``),
Markdown is rendered by markdown-it-py and figures are drawn by ``attnlab.plots``. A clone reports its own
``experiments/results``; an installed attnlab the ``experiments/results`` that ``attnlab-table`` wrote under the
directory it starts from."""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import posixpath
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from attnlab.configs import config_files, project_root

ROOT = project_root()  # the checkout, else the directory the command starts from
TEMPLATES = config_files("experiments/templates")
# marks a directory this script wrote and lists the files it wrote there (JSON), so the next report replaces those
# and nothing else: a file a user put beside them stays
MARKER = ".attnlab-report"
# a reading in a results directory's README.md: <!-- reading: table3 --> ... <!-- /reading -->, shown on the pages of
# the tables it names (each table's beside its results: experiments/results/<table>/README.md)
READING = re.compile(r"<!-- reading: ([\w ]+) -->\n(.*?)<!-- /reading -->", re.S)
READINGS = "README.md"
RELATIVE_LINK = re.compile(r'(src|href)="(?![a-zA-Z][a-zA-Z0-9+.-]*:|#|/)([^"]+)"')  # not a web address or an anchor
JUDGED = ("reproduces", "opposite", "smaller than the paper's", "unresolved")  # the tables' four verdicts
VERDICTS = (*JUDGED, "identical", "present", "absent", "not measured", "no paper value")
VERDICT_CELL = re.compile(rf"<td( style=\"[^\"]*\")?>((?:<strong>)?({'|'.join(VERDICTS)})(?:</strong>)?)</td>")
CSS_CLASS = re.compile(r"[^a-z]+")  # "smaller than the paper's" -> smaller-than-the-paper-s
ORDER = (
    "table1",
    "table2",
    "table3",
    "table4",
    "table5",
    "table6",
    "table7",
    "table8",
    "table8_single_term",
    "outliers",
    "gating",
    "pruning",
)
ORDER += ("emergence", "bench")  # then any other results directory, by name
COPIED = ("*.csv", "*.md", "*.png", "*.jsonl")  # cells.jsonl: each cell's as-run config
RESULTS_LINK = re.compile(r'(src|href)="(experiments/results/[^"#]+)"')
THRESHOLD = re.compile(r" \([<>]= \S+ needed; \d+ seed\(s\)\)")  # "(>= 50 needed; 3 seed(s))": the table states it
PARTIAL = re.compile(r"\*\*Partial: ([^*]+)\*\*")
# the README's overview of every table (written by ``--readme``, checked by a test so that it cannot go stale)
OVERVIEW = re.compile(r"(<!-- overview \(generated\) -->\n).*?(<!-- /overview -->)", re.S)
KEPT = ("reproduces", "opposite")


@dataclass
class Link:
    label: str
    href: str
    note: str = ""


@dataclass
class RunRow:
    """One line of ``runs.csv``: the cell and the link to its config."""

    stage: str
    row: str
    attention: str
    seed: int
    run: str
    config: Link | None


@dataclass
class Page:
    """One table at one scale (or one protocol of a synthetic table; or a results directory with no table)."""

    name: str
    variant: str  # the scale (cpu, cpu_long, smoke), the synthetic protocol (default, converged) or the directory
    source: Path
    title: str = ""
    body: str = ""
    reading: str = ""
    figures: list[Link] = field(default_factory=list)
    files: list[Link] = field(default_factory=list)
    runs: list[RunRow] = field(default_factory=list)
    configs_note: str = ""
    phenomena: list[str] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)
    measured: list[str] = field(default_factory=list)  # each phenomenon's status with the baseline's numbers
    kept: list[str] = field(default_factory=list)  # the effects whose verdict survives Holm
    partial: str = ""  # "3 of 9 cells" for a table written with partial=true
    pipeline_check: bool = False  # every number of ours is 0: the table shows the pipeline runs, not the paper's effect

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.variant}.html"

    @property
    def verdict_counts(self) -> list[tuple[str, str, bool]]:
        """The index's four Holm verdict counts as (verdict, shown, coloured): "-" in each where nothing was judged
        (no effects, or none with a paper value), and a verdict's colour only on a count above 0."""
        if not any(self.verdicts.values()):
            return [(verdict, "-", False) for verdict in JUDGED]
        return [(verdict, str(self.verdicts.get(verdict, 0)), self.verdicts.get(verdict, 0) > 0) for verdict in JUDGED]

    @property
    def status(self) -> str:
        """What the index says beside the scale: a partial table's cells, a table that checks only the pipeline."""
        parts = [f"partial: {self.partial}"] if self.partial else []
        return "; ".join([*parts, *(["pipeline check: every number of ours is 0"] if self.pipeline_check else [])])


def readings(results: Path) -> dict[str, str]:
    """Table name -> its reading as HTML, from the ``<!-- reading: ... -->`` blocks of each results directory's
    README.md. Their links are relative to that README; here they become repository paths (``experiments/results/
    <table>/...``), which ``site_links`` points into the site's copies."""
    found: dict[str, str] = {}
    for readme in sorted(results.glob(f"*/{READINGS}")):
        base = f"experiments/results/{readme.parent.name}"
        for names, text in READING.findall(readme.read_text()):
            rendered = RELATIVE_LINK.sub(
                lambda m, base=base: f'{m[1]}="{posixpath.normpath(posixpath.join(base, m[2]))}"', markdown_html(text)
            )
            for name in names.split():
                found[name] = found.get(name, "") + rendered
    return found


def markdown_html(text: str) -> str:
    """CommonMark with GitHub's pipe tables; verdict and phenomenon cells get a class so the page can colour them.
    Raw HTML in the text is escaped, never passed through: the Markdown comes from files in shared results
    directories, and a ``<script>`` in one must not run in the reader's browser."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return VERDICT_CELL.sub(
        lambda m: f'<td class="verdict {CSS_CLASS.sub("-", m[3])}"{m[1] or ""}>{m[2]}</td>', rendered
    )


def discover(results: Path) -> list[Page]:
    """Every results directory: ``<table>/<scale>/<table>.md`` (the engine's), ``<table>/<table>.md`` and its protocol
    subdirectories (the synthetic tables), or a directory of other results (``emergence``, ``bench``) and its
    subdirectories (``emergence/gpu``)."""
    pages = []
    for table_dir in sorted(results.iterdir(), key=lambda d: (ORDER.index(d.name) if d.name in ORDER else 99, d.name)):
        if not table_dir.is_dir():
            continue
        name = table_dir.name
        found = [d for d in (table_dir, *sorted(table_dir.iterdir())) if (d / f"{name}.md").is_file()]
        if not found:  # other results (emergence, bench), and a scale of them in a subdirectory (emergence/gpu)
            for directory in (table_dir, *sorted(d for d in table_dir.iterdir() if d.is_dir())):
                if any(path.name != READINGS for pattern in COPIED for path in directory.glob(pattern)):
                    pages.append(Page(name, name if directory == table_dir else directory.name, directory))
        for directory in found:
            variant = "default" if directory == table_dir else directory.name
            pages.append(Page(name, variant, directory))
    return pages


def table_configs(root: Path) -> Path:
    """``root``'s ``experiments/conf``; an installed attnlab's copy where ``root`` has none (a user's own directory)."""
    own = root / "experiments" / "conf"
    return own if own.is_dir() else config_files("experiments/conf")


def table_config(name: str, root: Path) -> Path | None:
    path = table_configs(root) / "table" / f"{name}.yaml"
    return path if path.is_file() else None


def synthetic_config(page: Page, root: Path) -> Path | None:
    """The synthetic protocol's config (``experiments/conf/synthetic_table/<table>/[options/]<protocol>.yaml``)."""
    base = table_configs(root) / "synthetic_table" / page.name
    for path in (base / f"{page.variant}.yaml", base / "options" / f"{page.variant}.yaml"):
        if path.is_file():
            return path
    return None


def copy_files(page: Page, out: Path, results: Path, site_paths: dict[str, str]) -> None:
    """The directory's CSVs, Markdown and PNGs (not its subdirectories: those are pages of their own); ``site_paths``
    gets each one's path in the repository (``experiments/results/...``, as a reading links it) -> in the site."""
    target = out / "data" / page.name / page.variant
    target.mkdir(parents=True, exist_ok=True)
    for pattern in COPIED:
        for path in sorted(p for p in page.source.glob(pattern) if p.name != READINGS):  # the reading is the page's
            shutil.copy2(path, target / path.name)
            link = Link(path.name, f"data/{page.name}/{page.variant}/{path.name}")
            (page.figures if path.suffix == ".png" else page.files).append(link)
            site_paths[f"experiments/results/{path.relative_to(results).as_posix()}"] = link.href


def site_links(page_html: str, site_paths: dict[str, str]) -> str:
    """Links to committed results (in a reading or a table's Markdown) point into the site's copies."""
    return RESULTS_LINK.sub(
        lambda m: f'{m[1]}="{html.escape(site_paths[m[2]]) if m[2] in site_paths else m[2]}"', page_html
    )


def draw_engine_figures(page: Page, out: Path, root: Path) -> None:
    """Ours beside the paper's per stage, and the metrics logged while training (``curves.csv``)."""
    import matplotlib.pyplot as plt

    from attnlab.plots import save
    from attnlab.tables.figures import TableResults

    results = TableResults.load(page.source, root, scale=page.variant)
    figures = {f"ours vs the paper's, {stage}": fig for stage, fig in results.stage_figures().items()}
    training = results.training_figure()
    if training is not None:
        figures["metrics while training"] = training
    (out / "figures").mkdir(exist_ok=True)
    for index, (label, fig) in enumerate(figures.items()):
        path = save(fig, out / "figures" / f"{page.name}-{page.variant}-{index}.png")
        plt.close(fig)
        page.figures.insert(index, Link(label, f"figures/{path.name}"))


def cell_configs(page: Page, out: Path, root: Path) -> None:
    """Each cell of ``runs.csv`` with its config: the one it ran with, from the table's ``cells.jsonl`` (or its run
    directory when that is on this machine); for a cell recorded before the engine committed as-run configs, the one
    the table config composes today (said in the file's first lines, with the name it gives the cell)."""
    import pandas as pd
    from omegaconf import OmegaConf, open_dict

    from attnlab.errors import ConfigError
    from attnlab.tables import load_table
    from attnlab.tables.as_run import AT_FINISH, CELLS_FILE, read_cells
    from attnlab.tables.engine import Engine

    runs = pd.read_csv(page.source / "runs.csv")
    recorded = read_cells(page.source)
    try:
        engine = Engine(load_table(page.name, root), page.variant, root=root, runs_dir=root / "outputs" / "runs")
        composed = {(c.stage, c.row, c.attention, c.seed): (c, cfg) for c, cfg in engine.composed_cells()}
    except ConfigError as exc:
        composed = {}
        page.configs_note = f"the table config no longer composes at scale {page.variant} ({exc}): no configs"
    target = out / "configs" / f"{page.name}-{page.variant}"
    target.mkdir(parents=True, exist_ok=True)
    source = f"experiments/conf/table/{page.name}.yaml, scale {page.variant}"
    committed = f"experiments/results/{page.name}/{page.variant}/{CELLS_FILE}"
    for run in runs.itertuples():
        recorded_name = Path(str(run.run)).name
        run_dir = Path(str(run.run)) if Path(str(run.run)).is_absolute() else root / str(run.run)
        cell, composed_cfg = composed.get((run.stage, run.row, run.attention, int(run.seed)), (None, None))
        path = target / f"{recorded_name}.yaml"
        renamed = cell is not None and cell.directory.name != recorded_name
        if recorded_name in recorded:
            line = recorded[recorded_name]
            header = f"# the config this cell ran with, from {committed} (how the line was made: its recorded key)\n"
            if renamed:
                header += f"# stale: today's config names this cell {cell.directory.name} (a reproduction trains it)\n"
            path.write_text(header + OmegaConf.to_yaml(OmegaConf.create(line)))
            backfilled = line.get("recorded", AT_FINISH) != AT_FINISH
            note = "as run" + (", backfilled" if backfilled else "") + (", stale today" if renamed else "")
        elif (run_dir / ".hydra" / "config.yaml").is_file():
            header = f"# the config this cell ran with ({run.run}/.hydra/config.yaml)\n"
            path.write_text(header + (run_dir / ".hydra" / "config.yaml").read_text())
            note = "as run"
        elif composed_cfg is not None:
            with open_dict(composed_cfg):
                del composed_cfg["hydra"]
            header = f"# composed from {source} by today's code ({time.strftime('%Y-%m-%d')}): the cell was recorded "
            header += "before the engine committed each cell's as-run config, and its run directory is not here\n"
            if renamed:
                header += (
                    f"# today's config names this cell {cell.directory.name}, not {recorded_name}: something in its "
                    "identity changed since it ran (a default, or how a fine-tune's start is named)\n"
                )
            path.write_text(header + OmegaConf.to_yaml(composed_cfg))
            note = "composed today" + (", named differently now" if renamed else "")
        else:
            path = None
            note = ""
        link = Link("config", f"configs/{page.name}-{page.variant}/{path.name}", note) if path else None
        page.runs.append(RunRow(run.stage, run.row, run.attention, int(run.seed), recorded_name, link))
    if not page.configs_note and any(row.config and row.config.note.startswith("composed") for row in page.runs):
        page.configs_note = (
            'Configs marked "composed today" belong to cells recorded before the engine committed each cell\'s '
            f"as-run config ({CELLS_FILE}): today's code composed them, and may have named the cell differently."
        )


def paper_side(paper_pct: float) -> str:
    """What a kept effect is set against: the paper's number, or a claim's direction where the paper gives none."""
    return "a paper's claim, no number" if math.isnan(paper_pct) else f"paper {paper_pct:+.1f}%"


def summarise(page: Page) -> None:
    """The index's line per page: the phenomenon checks and the Holm-corrected verdicts' counts."""
    import pandas as pd

    if (page.source / "phenomena.csv").is_file():
        checks = pd.read_csv(page.source / "phenomena.csv")
        page.phenomena = sorted({f"{c.phenomenon}: {c.status}" for c in checks.itertuples()})
        page.measured = [measured(phenomenon, rows) for phenomenon, rows in checks.groupby("phenomenon", sort=False)]
    if (page.source / "effects.csv").is_file():
        effects = pd.read_csv(page.source / "effects.csv")
        column = "verdict_holm" if "verdict_holm" in effects else "verdict"
        counts = Counter(v for v in effects[column] if v in JUDGED)
        page.verdicts = {v: counts[v] for v in JUDGED}
        several = varying(effects)
        page.kept = [
            f"{' '.join(str(getattr(e, key)) for key in several)} `{e.attention}` {e.column}: {percent(e.diff_pct)} "
            f"({paper_side(e.paper_pct)}), {getattr(e, column)}".lstrip()
            for e in effects.itertuples()
            if getattr(e, column) in KEPT
        ]
    if (table := page.source / f"{page.name}.md").is_file() and (partial := PARTIAL.search(table.read_text())):
        page.partial = partial[1]
    if (tidy := page.source / f"{page.name}.csv").is_file() and "mean" in (frame := pd.read_csv(tidy)):
        means = frame["mean"].dropna()
        page.pipeline_check = bool(len(means)) and bool((means == 0).all())


def percent(value: float) -> str:
    """+1.53%, and -0.004% where two decimals would print a significant effect as -0.00%."""
    return f"{value:+.2f}%" if abs(value) >= 0.01 else f"{value:+.1g}%"


def varying(frame) -> list[str]:
    """Which of stage and row take several values in ``frame``: only those are named, to tell its lines apart."""
    return [key for key in ("stage", "row") if frame[key].nunique() > 1]


def measured(phenomenon: str, checks) -> str:
    """``outliers: **present** (kurtosis_max 486.5; w8a8_gap_pct 4.618)``; with the stage (and row) of each check
    where the table checks the phenomenon more than once."""
    several = varying(checks)
    numbers = [
        " ".join([*(str(getattr(c, key)) for key in several), THRESHOLD.sub("", c.evidence)])
        for c in checks.itertuples()
        if c.status != "not measured"
    ]
    statuses = "/".join(dict.fromkeys(checks.status))
    return f"{phenomenon}: **{statuses}**" + (f" ({'; '.join(numbers)})" if numbers else "")


def overview(pages: list[Page], root: Path = ROOT) -> str:
    """Every engine table at every scale in one Markdown table: is the paper's phenomenon there, and which effects
    survive Holm's correction (the README's overview; the pages must have been summarised)."""
    lines = [
        "| table | scale | the phenomenon in the baseline | after Holm over the paper's family: reproduces / "
        "opposite / smaller than the paper's / unresolved "
        "| the effects that survive Holm (variant minus vanilla) |",
        "|---|---|---|---|---|",
    ]
    for page in pages:
        if not (page.measured or any(page.verdicts.values())):
            continue  # the pruning table: curves, with no paper effect to judge
        counts = " / ".join(str(n) for n in page.verdicts.values()) if any(page.verdicts.values()) else "-"
        partial = f" (partial: {page.partial})" if page.partial else ""
        scale = f"[{page.variant}]({shown(page.source, root)}/){partial}"
        cells = [page.name, scale, "; ".join(page.measured) or "-", counts, "; ".join(page.kept) or "-"]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def readme_with_overview(readme: str, results: Path, root: Path = ROOT) -> str:
    """The README with its overview block written again from ``results``."""
    from attnlab.errors import ConfigError

    if not OVERVIEW.search(readme):
        raise ConfigError("README.md", "an <!-- overview (generated) --> ... <!-- /overview --> block to write into")
    pages = discover(results)
    for page in pages:
        summarise(page)
    return OVERVIEW.sub(lambda m: f"{m[1]}\n{overview(pages, root)}\n{m[2]}", readme)


def fill(page: Page, out: Path, root: Path, reading: str, site_paths: dict[str, str]) -> None:
    """The page's text, figures, files and cells (its results files are already copied); ``reading`` is HTML."""
    own = page.source / f"{page.name}.md"
    markdowns = [own] if own.is_file() else sorted(p for p in page.source.glob("*.md") if p.name != READINGS)
    text = "\n\n".join(path.read_text() for path in markdowns)
    if own.is_file() and text.startswith("# "):  # the table's own title is the page's
        page.title, _, text = text[2:].partition("\n")
    page.title = page.title or results_title(page, markdowns)
    page.body = site_links(markdown_html(text), site_paths)
    page.reading = site_links(reading, site_paths) if reading else ""
    if table_config(page.name, root) and (page.source / "runs.csv").is_file():
        draw_engine_figures(page, out, root)
        cell_configs(page, out, root)
        page.files.append(Link(f"{page.name}.yaml (the table config)", f"configs/{page.name}.yaml"))
        shutil.copy2(table_config(page.name, root), out / "configs" / f"{page.name}.yaml")
    elif (config := synthetic_config(page, root)) is not None:
        (out / "configs").mkdir(exist_ok=True)
        shutil.copy2(config, out / "configs" / f"{page.name}-{config.name}")
        page.files.append(Link(f"{config.name} (the protocol's config)", f"configs/{page.name}-{config.name}"))
    summarise(page)


def results_title(page: Page, markdowns: list[Path]) -> str:
    """A results directory with no table of its own (emergence, bench): its one report's heading, else what it
    holds; never its path."""
    headings = [text.partition("\n")[0][2:] for text in (p.read_text() for p in markdowns) if text.startswith("# ")]
    where = page.name if page.variant == page.name else f"{page.name} ({page.variant})"
    if len(headings) == 1:
        return f"{where}: {headings[0]}"
    if headings:
        return f"{where}: {len(headings)} reports"
    return f"{where}: curves and figures"


def written_before(out: Path) -> set[str]:
    """The files an earlier report wrote into ``out`` (its manifest); a directory no report wrote is refused."""
    from attnlab.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"a directory for the site ({out} is a file)")
    if not out.exists() or not any(out.iterdir()):
        return set()
    if not (out / MARKER).is_file():
        raise ConfigError("--out", f"an empty directory or an earlier report ({out} holds other files)")
    try:
        listed = json.loads((out / MARKER).read_text())["files"]
        inside = out.resolve()
        return {str(name) for name in listed if (out / str(name)).resolve().is_relative_to(inside)}
    except (ValueError, KeyError, TypeError):  # a report written before the manifest: everything in it was its own
        return {path.relative_to(out).as_posix() for path in out.rglob("*") if not path.is_dir()}


def swap_in(staging: Path, out: Path, before: set[str]) -> None:
    """The new site's files replace the earlier report's, one ``os.replace`` each; files the earlier report wrote
    and this one does not are removed, and nothing else in ``out`` is touched. The manifest lists the union while
    the files move, so a report killed midway still knows every file it wrote."""
    from attnlab.errors import ConfigError
    from attnlab.files import write_atomic

    files = sorted(path.relative_to(staging).as_posix() for path in staging.rglob("*") if not path.is_dir())
    theirs = sorted(name for name in files if (out / name).exists() and name not in before)
    if theirs:
        raise ConfigError(
            "--out",
            f"{out / theirs[0]} is not the report's (an earlier report did not write it) and the report would replace "
            "it; move it, or choose another --out",
        )
    out.mkdir(parents=True, exist_ok=True)
    manifest = "written by experiments/report.py; the next make report replaces these files and nothing else\n"
    write_atomic(out / MARKER, json.dumps({"note": manifest, "files": sorted(before | set(files))}, indent=1))
    for name in files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, out / name)
    for name in sorted(before - set(files)):
        (out / name).unlink(missing_ok=True)
    for directory in sorted((d for d in out.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(directory.iterdir()):
            directory.rmdir()
    write_atomic(out / MARKER, json.dumps({"note": manifest, "files": files}, indent=1))


def templates():
    """The pages' Jinja2 environment: every value a template prints is HTML-escaped unless it is marked safe (only
    ``markdown_html``'s output is, and it escapes raw HTML itself)."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    environment = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(enabled_extensions=("html.j2",))
    )
    environment.filters["css_class"] = lambda verdict: CSS_CLASS.sub("-", verdict)
    return environment


def build(results: Path, out: Path, root: Path = ROOT) -> Path:
    """Write the site into ``out``, replacing the files a report wrote there before and nothing else; returns its
    index. Every text from a file (names, Markdown, configs) is escaped in the pages (``autoescape`` and
    ``markdown_html``)."""
    from attnlab.errors import ConfigError
    from attnlab.files import staging_directory

    before = written_before(out)
    if not results.is_dir():
        raise ConfigError("--results", f"a directory of table results ({results} is not one)")
    texts = readings(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(out.parent, out.name)  # (a killed report's is removed here)
    try:
        pages = discover(results)
        site_paths: dict[str, str] = {}
        for page in pages:
            copy_files(page, staging, results, site_paths)
        for page in pages:
            fill(page, staging, root, texts.get(page.name, ""), site_paths)
        environment = templates()
        made = time.strftime("%Y-%m-%d %H:%M")
        common = {"pages": pages, "made": made, "results": shown(results, root)}
        for page in pages:
            html_page = environment.get_template("page.html.j2").render(page=page, **common)
            (staging / page.filename).write_text(html_page)
        (staging / "index.html").write_text(environment.get_template("index.html.j2").render(**common))
        swap_in(staging, out, before)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "index.html"


def shown(path: Path, root: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="attnlab-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"attnlab {version('attnlab')}")
    parser.add_argument("--results", type=Path, default=ROOT / "experiments" / "results", help="committed results")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "report", help="where the site is written")
    parser.add_argument("--readme", action="store_true", help="write the README's overview of the tables instead")
    args = parser.parse_args(argv)
    from attnlab.errors import ConfigError
    from attnlab.files import write_atomic

    try:
        if args.readme:
            readme = ROOT / "README.md"
            write_atomic(readme, readme_with_overview(readme.read_text(), args.results))
            print(f"README.md: the overview of {shown(args.results, ROOT)} written")
            return
        index = build(args.results, args.out)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    print(f"report: {index} (open it in a browser; it needs no server)")


if __name__ == "__main__":
    main()
