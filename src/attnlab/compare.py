"""Turn the runs of a sweep into one comparison table (Markdown and CSV) and a figure, grouped over seeds.

    attnlab-compare outputs/<experiment>/multirun_<id> [--out experiments/results/<name>]
    (in a clone also: python experiments/compare.py ...)

Reads each run's ``results.json`` (written by train.py) and its ``.hydra/overrides.yaml``; rows are the distinct
settings (attention, model, the swept overrides other than the seed), with the mean and spread over seeds.
Jobs that failed or left no ``results.json`` are listed under the table (and on stderr), never silently dropped.
With ``--out``, ``curves.png`` beside the table draws each setting's training and validation loss against the number
of optimizer steps done (mean over seeds, band: ± one standard deviation where a setting has several seeds) from the
runs' ``csv/metrics.csv``. Every training run draws its own curves the same way when it ends (``run_figure``:
``<run>/loss_curves.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from attnlab.training.sweeps import read_jobs

METRICS = ("val_loss", "val_ppl", "unigram_ppl", "tokens_per_second", "parameters")
ALWAYS_MEASURED = ("tokens_per_second", "parameters")
# columns of each run's csv/metrics.csv (Lightning's CSV logger) and what they are
CURVES = {"train/loss": "training batches", "val/loss": "validation"}
OUTPUTS = ("table.md", "table.csv", "curves.png")


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A finished run's ``results.json`` and ``.hydra/overrides.yaml``; a file that does not read as what train.py
    writes (bad JSON or YAML, a YAML tag, a missing key, a value of the wrong type) raises ``ValueError`` saying
    which and why. Results directories are shared, so these are data from a file like any other."""
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"results.json does not read as JSON ({exc})") from None
    if not isinstance(results, dict) or not all(isinstance(results.get(key), str) for key in ("attention", "model")):
        raise ValueError("results.json has no attention and model names; it was not written by train.py")
    for metric in METRICS:  # a metric may be null (a run that did not validate) except those every run has
        value = results.get(metric)
        if not (type(value) in (int, float) or (value is None and metric not in ALWAYS_MEASURED)):
            raise ValueError(f"results.json's {metric} is {value!r}, not a number")
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    try:
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f".hydra/overrides.yaml does not read as YAML ({problem})") from None
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(".hydra/overrides.yaml is not a list of overrides")
    return results, overrides


def collect(sweep_dir: Path, unreadable: list[str] | None = None) -> pd.DataFrame:
    """One row per finished run under ``sweep_dir``; ``setting`` holds the overrides that differ between runs. A run
    whose files do not read goes to ``unreadable`` (listed under the table, never silently dropped)."""
    found = []
    for results_file in sorted(sweep_dir.rglob("results.json")):
        try:
            found.append((results_file.parent, *read_run(results_file.parent)))
        except ValueError as exc:
            if unreadable is None:
                raise SystemExit(f"error: {results_file.parent}: {exc}") from None
            unreadable.append(f"{results_file.parent.relative_to(sweep_dir)}: {exc}")
    shared = set.intersection(*(set(o) for _, _, o in found)) if found else set()
    rows = []
    for run_dir, results, overrides in found:
        varying = [o for o in overrides if o not in shared and not o.startswith(("seed=", "attention=", "model="))]
        setting = " ".join(varying)
        rows.append(
            {
                "attention": results["attention"],
                "model": results["model"],
                "setting": setting,
                "seed": next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), ""),
                "run": str(run_dir),
                **{m: results.get(m) for m in METRICS},
            }
        )
    if not rows:
        problems = f" ({len(unreadable)} unreadable: {unreadable[0]})" if unreadable else ""
        raise SystemExit(f"error: no readable results.json under {sweep_dir}{problems}")
    return pd.DataFrame(rows)


def missing_jobs(sweep_dir: Path) -> list[str]:
    """One line per job of the sweep that has no ``results.json``: failed (with its error) or never finished."""
    jobs = read_jobs(sweep_dir)
    lines = [
        f"job {j['num']} ({' '.join(j['overrides'])}): {j.get('error', j['status'])}"
        for j in jobs
        if j["status"] != "completed"
    ]
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
    def spread(std: float, digits: int) -> str:
        return "" if pd.isna(std) else f" ± {std:.{digits}f}"

    shown = pd.DataFrame(
        {
            "attention": r.attention,
            "model": r.model,
            "setting": r.setting,
            "seeds": str(r.seeds),
            "val loss": f"{r.val_loss:.3f}{spread(r.val_loss_std, 3)}",
            "val ppl": f"{r.val_ppl:.1f}{spread(r.val_ppl_std, 1)}",
            "tokens/s": f"{r.tokens_per_second:,.0f}",
            "params": f"{r.parameters:,}",
        }
        for r in table.itertuples()
    )
    return shown.to_markdown(index=False, disable_numparse=True) + "\n"


def label(row: Any, models: int) -> str:
    """A setting's name in the figure: its attention, the model when the sweep has several, the other overrides."""
    return " ".join(part for part in (row.attention, row.model if models > 1 else "", row.setting) if part)


def loss_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's logged losses (long format: setting, seed, metric, step, loss); ``step`` counts the optimizer
    steps done (metrics.csv logs the 0-based step, so a validation after 10 steps is its step 9). A resumed run's
    repeated step counts once, as its later row. Runs without ``csv/metrics.csv`` (``logger=none``, ``debug=fdr``)
    are skipped."""
    models = runs["model"].nunique()
    frames = []
    for run in runs.itertuples():
        metrics_file = Path(run.run) / "csv" / "metrics.csv"
        if not metrics_file.is_file():
            continue
        metrics = pd.read_csv(metrics_file)
        for metric in CURVES:
            if metric not in metrics:
                continue
            curve = metrics.dropna(subset=[metric]).groupby("step")[metric].last()
            frames.append(
                pd.DataFrame({"step": curve.index + 1, "loss": curve.to_numpy()}).assign(
                    setting=label(run, models), seed=run.seed, metric=metric
                )
            )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def title_of(runs: pd.DataFrame, sweep_dir: Path) -> str:
    """What the figure compares: the swept keys and the model with its real size (the sweep's directory, whose name
    is an opaque id, only as provenance)."""
    from attnlab.plots import parameters_label

    keys = [key for key in ("attention", "model", "seed") if runs[key].nunique() > 1]
    keys += list(dict.fromkeys(o.split("=", 1)[0] for s in runs["setting"] for o in s.split()))
    models = ", ".join(
        f"{model} ({parameters_label(group['parameters'].iloc[0])})" for model, group in runs.groupby("model")
    )
    what = f"sweep over {', '.join(keys)}" if keys else f"one run, attention={runs['attention'].iloc[0]}"
    return f"Training and validation loss, {what}; model {models}\nruns under {sweep_dir}"


def plot_curves(curves: pd.DataFrame, order: list[str], title: str, path: Path) -> None:
    """One panel per loss: each setting's mean over seeds as a line, ± one standard deviation as a band (only where
    a setting has several seeds)."""
    from attnlab.plots import Panel, curves_figure, save

    panels = [Panel(metric, f"{metric} ({name})", "loss (nats per token)") for metric, name in CURVES.items()]
    frame = curves.rename(columns={"metric": "panel", "setting": "series", "loss": "value"})
    save(curves_figure(frame, panels, title, band="std", order=order), path)


RUN_FIGURE = "loss_curves.png"


def run_figure(run_dir: Path, results: dict[str, Any]) -> Path | None:
    """``<run>/loss_curves.png``: one finished run's training and validation loss against the step, as
    ``attnlab-compare`` draws a sweep's; None when the run logged no ``csv/metrics.csv`` (``logger=none``)."""
    run = {"attention": results["attention"], "model": results["model"], "setting": "", "seed": "", "run": run_dir}
    runs = pd.DataFrame([{**run, "parameters": results.get("parameters")}])
    curves = loss_curves(runs)
    if curves.empty:
        return None
    plot_curves(curves, [label(runs.iloc[0], 1)], title_of(runs, run_dir), run_dir / RUN_FIGURE)
    return run_dir / RUN_FIGURE


def main(argv: list[str] | None = None) -> None:
    """``attnlab-compare <sweep dir> [--out <dir>]``."""
    parser = argparse.ArgumentParser(prog="attnlab-compare", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnlab {version('attnlab')}")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="directory for table.md and table.csv")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        raise SystemExit(f"error: sweep_dir: {args.sweep_dir} is not a directory")
    unreadable: list[str] = []
    runs = collect(args.sweep_dir, unreadable)
    table = summarise(runs)
    markdown = to_markdown(table)
    missing = [*missing_jobs(args.sweep_dir), *unreadable]
    if missing:
        markdown += f"\nMissing from this table ({len(missing)} jobs):\n\n" + "".join(f"- {m}\n" for m in missing)
        print(f"warning: {len(missing)} jobs of the sweep are not in the table", file=sys.stderr)
    print(markdown)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            if (args.out / name).exists():
                raise SystemExit(f"error: {args.out / name} exists; results are never overwritten")
        (args.out / "table.md").write_text(markdown)
        table.to_csv(args.out / "table.csv", index=False)
        curves = loss_curves(runs)
        if curves.empty:
            print("warning: no run logged its losses (csv/metrics.csv); no curves.png", file=sys.stderr)
        else:
            order = [label(r, table["model"].nunique()) for r in table.itertuples()]  # the table's: vanilla first
            plot_curves(curves, order, title_of(runs, args.sweep_dir), args.out / "curves.png")
        print(f"written: {', '.join(str(args.out / n) for n in OUTPUTS if (args.out / n).exists())}")


if __name__ == "__main__":
    main()
