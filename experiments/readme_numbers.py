"""Check the numbers the table readings quote against the committed results (``make readme-numbers``).

The readings are in the README.md beside each table's results (``experiments/results/<table>/README.md``); the
README itself and docs/ are checked the same way, so a number moved between them keeps its check. A reading of an
engine table (``<!-- reading: table5 table6 -->`` ... ``<!-- /reading -->``, the tables with a config
in experiments/conf/table/) quotes its tables' numbers in prose, and the tables whose results directory it names
(``experiments/results/outliers/``). Every signed percentage (``+1.36%``), interval (``[+0.91, +1.81]``) and p-value
(``p 0.029``, ``Holm p 0.134``) in it must be one of those tables' committed numbers (any scale) at the precision it
is printed with, or the script names it:
- percentages: each effect's ``diff_pct`` and ``paper_pct``, its interval as a share of the baseline's mean, each
  seed's own change (variant / baseline - 1, per metric of ``runs.csv``) and their mean, a variant's metrics that
  are percentages themselves (``w8a8_gap_pct``), and one column's mean against another's for the same variant in
  the table's CSV (pruning: half the heads masked against none);
- intervals: an effect's ``ci_low``/``ci_high`` in the column's units or as a share of the baseline's mean;
- p-values: ``p``, ``p_paper``, ``p_signflip`` and their Holm-corrected ``p_holm``, ``p_paper_holm``, and those a
  report printed in the table's Markdown (the pruning section's).
A number the reading takes from elsewhere (a paper, a timing) is not of these three forms, or is marked by ending
the sentence's clause with ``(not from a table)`` on the same line.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnlab.tables.collect import with_derived

ROOT = Path(__file__).resolve().parents[1]
READING = re.compile(r"<!-- reading: ([\w ]+) -->\n(.*?)<!-- /reading -->", re.S)
NUMBER = r"[+\-−]?\d[\d,]*(?:\.\d+)?"
PERCENT = re.compile(r"(?<![\w.\[])([+\-−]\d[\d,]*(?:\.\d+)?)%")
INTERVAL = re.compile(rf"\[({NUMBER}), ({NUMBER})\]")
P_VALUE = re.compile(r"\b(?:Holm )?p (0\.\d+|1\.0+|1)\b")
EXEMPT = "(not from a table)"


@dataclass(frozen=True)
class Mismatch:
    line: int
    quoted: str
    kind: str
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.kind} {self.quoted} is in none of the reading's tables' files"


def value(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def matches(text: str, candidates: set[float]) -> bool:
    """The quoted number is one of ``candidates`` at the precision it is printed with (a percentage's sign too)."""
    quoted, half = value(text), 0.5 * 10 ** -decimals(text) + 1e-9
    return any(abs(c - quoted) <= half for c in candidates)


@dataclass
class Numbers:
    """The committed numbers of one reading's tables, by the kind of quote they can stand behind."""

    percents: set[float]
    bounds: set[float]
    p_values: set[float]


def seed_changes(runs: pd.DataFrame, baseline: str) -> set[float]:
    """Each variant's change against the baseline in %, per seed and as the mean of the seeds' changes, for every
    numeric metric of ``runs.csv``."""
    found: set[float] = set()
    metrics = [c for c in runs.select_dtypes("number").columns if c != "seed"]
    for _, group in runs.groupby(["stage", "row"], sort=False):
        by_seed = group.set_index(["seed", "attention"])[metrics]
        if baseline not in by_seed.index.get_level_values("attention"):
            continue
        base = by_seed.xs(baseline, level="attention")
        for attention in set(group["attention"]) - {baseline}:
            change = 100 * (by_seed.xs(attention, level="attention") / base - 1)
            found.update(v for v in change.to_numpy().ravel() if pd.notna(v))
            found.update(v for v in change.mean().to_numpy() if pd.notna(v))
    return found


def own_percents(runs: pd.DataFrame) -> set[float]:
    """Metrics that are percentages themselves (``w8a8_gap_pct``): per cell and as each variant's mean."""
    columns = [c for c in runs.columns if c.endswith("_pct")]
    found = set(runs[columns].to_numpy().ravel())
    found.update(runs.groupby(["stage", "row", "attention"])[columns].mean().to_numpy().ravel())
    return {v for v in found if pd.notna(v)}


def column_changes(summary: pd.DataFrame, runs: pd.DataFrame) -> set[float]:
    """One column against another for the same variant, in %: of their means (the table's tidy CSV), per seed and
    as the mean of the seeds' changes (``runs.csv``)."""
    found: set[float] = set()
    for _, group in summary.groupby(["stage", "row", "attention"], sort=False):
        means = group.set_index("column")["mean"].dropna()
        found.update(100 * (a / b - 1) for a in means for b in means if b)
    metrics = [m for m in summary["metric"].dropna().unique() if m in runs]
    for a in metrics:
        for b in metrics:
            change = 100 * (runs[a] / runs[b] - 1)
            found.update(change.dropna())
            found.update(change.groupby([runs["stage"], runs["row"], runs["attention"]]).mean().dropna())
    return found


def collect(tables: list[str], results: Path) -> Numbers:
    numbers = Numbers(set(), set(), set())
    for name in tables:
        for scale in sorted(path.parent for path in (results / name).glob("*/runs.csv")):
            runs = pd.DataFrame(with_derived(pd.read_csv(scale / "runs.csv").to_dict("records")))
            numbers.percents.update(seed_changes(runs, baseline="vanilla") | own_percents(runs))
            if (scale / f"{name}.csv").is_file():
                numbers.percents.update(column_changes(pd.read_csv(scale / f"{name}.csv"), runs))
            effect = pd.read_csv(scale / "effects.csv")
            base = effect["diff"] / effect["diff_pct"] * 100  # the baseline's mean behind each percentage
            for column in ("diff_pct", "paper_pct"):
                numbers.percents.update(effect[column].dropna())
            for column in ("ci_low", "ci_high"):
                numbers.bounds.update(effect[column].dropna())
                numbers.bounds.update((100 * effect[column] / base).dropna())
            numbers.percents.update(numbers.bounds)
            for column in ("p", "p_paper", "p_signflip", "p_holm", "p_paper_holm"):
                if column in effect:
                    numbers.p_values.update(effect[column].dropna())
            if (scale / f"{name}.md").is_file():  # a report's own tests (the pruning section's p and Holm p)
                numbers.p_values.update(float(v) for v in re.findall(r"\b0\.\d+", (scale / f"{name}.md").read_text()))
    return numbers


def check(readme: str, results: Path, page: str = "README.md") -> list[Mismatch]:
    """Every quote of the three kinds in every reading of the page ``readme`` that is not among its tables' numbers."""
    engine_tables = {path.stem for path in (results.parent / "conf" / "table").glob("*.yaml")}
    found = []
    for match in READING.finditer(readme):
        tagged = [t for t in match[1].split() if t in engine_tables]
        if not tagged:
            continue  # a reading of results that are not engine tables (the synthetic ones, the search, benchmarks)
        named = set(re.findall(r"experiments/results/(\w+)/", match[2])) & engine_tables
        numbers = collect(sorted({*tagged, *named}), results)
        first_line = readme.count("\n", 0, match.start(2)) + 1
        for offset, line in enumerate(match[2].splitlines()):
            if EXEMPT in line:
                continue
            for kind, pattern, pool in (
                ("percentage", PERCENT, numbers.percents),
                ("p-value", P_VALUE, numbers.p_values),
            ):
                for quoted in pattern.findall(line):
                    if not matches(quoted, pool):
                        found.append(
                            Mismatch(first_line + offset, quoted + ("%" if kind == "percentage" else ""), kind, page)
                        )
            for low, high in INTERVAL.findall(line):
                for bound in (low, high):
                    if not matches(bound, numbers.bounds):
                        bound_kind = "interval bound " + bound
                        found.append(Mismatch(first_line + offset, f"[{low}, {high}]", bound_kind, page))
    return found


def pages(root: Path = ROOT) -> list[Path]:
    """Where readings are: the README, docs/ and the README.md beside each table's results."""
    results = sorted((root / "experiments" / "results").glob("*/README.md"))
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *results]


def check_pages(paths: list[Path], results: Path, root: Path = ROOT) -> list[Mismatch]:
    return [m for path in paths for m in check(path.read_text(), results, path.resolve().relative_to(root).as_posix())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", type=Path, nargs="*", help="Markdown files (default: every page with readings)")
    parser.add_argument("--results", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args(argv)
    mismatches = check_pages(args.pages or pages(), args.results)
    for mismatch in mismatches:
        print(mismatch)
    print(f"{len(mismatches)} quoted number(s) not found in the committed results", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
