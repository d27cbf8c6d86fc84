"""Turn the runs of a sweep into one comparison table (Markdown and CSV), grouped over seeds.

    python experiments/compare.py outputs/<experiment>/multirun_<id> [--out experiments/results/<name>]

Reads each run's ``results.json`` (written by train.py) and its ``.hydra/overrides.yaml``; rows are the distinct
settings (attention, model, the swept overrides other than the seed), with the mean and spread over seeds.
Jobs that failed or left no ``results.json`` are listed under the table (and on stderr), never silently dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from attnlab.training.sweeps import read_jobs

METRICS = ("val_loss", "val_ppl", "unigram_ppl", "tokens_per_second", "parameters")


def collect(sweep_dir: Path) -> pd.DataFrame:
    """One row per finished run under ``sweep_dir``; ``setting`` holds the overrides that differ between runs."""
    found = []
    for results_file in sorted(sweep_dir.rglob("results.json")):
        overrides_file = results_file.parent / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
        found.append((json.loads(results_file.read_text()), overrides))
    shared = set.intersection(*(set(o) for _, o in found)) if found else set()
    rows = []
    for results, overrides in found:
        varying = [o for o in overrides if o not in shared and not o.startswith(("seed=", "attention=", "model="))]
        setting = " ".join(varying)
        rows.append(
            {
                "attention": results["attention"],
                "model": results["model"],
                "setting": setting,
                "seed": next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), ""),
                **{m: results.get(m) for m in METRICS},
            }
        )
    if not rows:
        raise SystemExit(f"error: no results.json under {sweep_dir}")
    return pd.DataFrame(rows)


def missing_jobs(sweep_dir: Path) -> list[str]:
    """One line per job of the sweep that has no ``results.json``: failed (with its error) or never finished."""
    jobs = read_jobs(sweep_dir)
    lines = [f"job {j['num']} ({' '.join(j['overrides'])}): {j['error']}" for j in jobs if j["status"] != "completed"]
    recorded = {Path(j["output_dir"]).resolve() for j in jobs}
    for overrides_file in sorted(sweep_dir.rglob(".hydra/overrides.yaml")):
        job_dir = overrides_file.parent.parent
        if not (job_dir / "results.json").is_file() and job_dir.resolve() not in recorded:
            lines.append(f"{job_dir.relative_to(sweep_dir)}: no results.json (killed, or still running)")
    return lines


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds of each setting; vanilla first, then by validation loss."""
    grouped = runs.groupby(["attention", "model", "setting"], dropna=False)
    table = grouped.agg(
        seeds=("seed", "count"),
        val_loss=("val_loss", "mean"),
        val_loss_std=("val_loss", "std"),
        val_ppl=("val_ppl", "mean"),
        val_ppl_std=("val_ppl", "std"),
        tokens_per_second=("tokens_per_second", "mean"),
        parameters=("parameters", "first"),
    ).reset_index()
    table["is_vanilla"] = table["attention"] != "vanilla"
    return table.sort_values(["is_vanilla", "val_loss"]).drop(columns="is_vanilla").reset_index(drop=True)


def to_markdown(table: pd.DataFrame) -> str:
    lines = [
        "| attention | model | setting | seeds | val loss | val ppl | tokens/s | params |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        spread = "" if pd.isna(r.val_loss_std) else f" ± {r.val_loss_std:.3f}"
        ppl_spread = "" if pd.isna(r.val_ppl_std) else f" ± {r.val_ppl_std:.1f}"
        lines.append(
            f"| {r.attention} | {r.model} | {r.setting} | {r.seeds} | {r.val_loss:.3f}{spread} "
            f"| {r.val_ppl:.1f}{ppl_spread} | {r.tokens_per_second:,.0f} | {r.parameters:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="directory for table.md and table.csv")
    args = parser.parse_args()
    table = summarise(collect(args.sweep_dir))
    markdown = to_markdown(table)
    missing = missing_jobs(args.sweep_dir)
    if missing:
        markdown += f"\nMissing from this table ({len(missing)} jobs):\n\n" + "".join(f"- {m}\n" for m in missing)
        print(f"warning: {len(missing)} jobs of the sweep are not in the table", file=sys.stderr)
    print(markdown)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name in ("table.md", "table.csv"):
            if (args.out / name).exists():
                raise SystemExit(f"error: {args.out / name} exists; results are never overwritten")
        (args.out / "table.md").write_text(markdown)
        table.to_csv(args.out / "table.csv", index=False)


if __name__ == "__main__":
    main()
