"""The phenomena search's curves (issue 23): each run's outlier and sink metrics against the step, with the tables'
phenomenon thresholds drawn in, from the runs' ``csv/metrics.csv`` (``conf/experiment/emergence.yaml``).

    python experiments/emergence.py outputs/emergence/search --out experiments/results/emergence

Writes ``curves.csv`` (one row per run, step and metric) and ``emergence.png``; a run still training shows the
steps it has logged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import yaml

# the paper's value on the same metric, drawn on the same axis (Bondarenko et al., vanilla OPT-125m, as the spec
# quotes it, unverified); its 1,778 kurtosis is an average over modules, not our max, so it is not drawn
PAPER = {"outliers/max_inf_norm": (340.0, "paper: vanilla OPT-125m (340)")}
# metric logged while training -> (panel title, y label, threshold of the table's phenomenon check or None, log y)
PANELS = {
    "outliers/kurtosis_max": ("max kurtosis over modules", "kurtosis (Gaussian: 3)", 50.0, True),
    "outliers/max_inf_norm": ("max infinity norm over modules", "max |activation|", None, True),
    "sinks/sink_share": (
        "attention sink: first-token share",
        "share of attention (layers 2+, queries 16+)",
        0.2,
        False,
    ),
    "val/loss": ("held-out loss", "cross-entropy (nats / token)", None, False),
}


def overrides(run_dir: Path) -> list[str]:
    found = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    return [o for o in found if not o.startswith(("ckpt_path=", "hydra."))]


def collect(sweep_dir: Path) -> pd.DataFrame:
    """Every logged point of every run; a run's ``setting`` is what its overrides set that others' do not."""
    runs = [path.parent.parent for path in sorted(sweep_dir.glob("*/csv/metrics.csv"))]
    given = {run: overrides(run) for run in runs}
    shared = set.intersection(*(set(o) for o in given.values())) if given else set()
    rows = []
    for run in runs:
        label = " ".join(o for o in given[run] if o not in shared) or "defaults"
        logged = pd.read_csv(run / "csv" / "metrics.csv")
        for metric in (m for m in PANELS if m in logged):
            points = logged[["step", metric]].dropna().drop_duplicates("step", keep="last")
            for step, value in points.itertuples(index=False):
                rows.append({"run": run.name, "setting": label, "step": int(step) + 1, "metric": metric})
                rows[-1]["value"] = float(value)
    if not rows:
        raise SystemExit(f"error: no csv/metrics.csv with the emergence metrics under {sweep_dir}")
    return pd.DataFrame(rows)


def model_size(sweep_dir: Path) -> str:
    """The searched model's real size, from a run's results.json or its config (the figure names it)."""
    for config_file in sorted(sweep_dir.glob("*/.hydra/config.yaml")):
        model = yaml.safe_load(config_file.read_text())["model"]
        parameters = next((json.loads(p.read_text()).get("parameters") for p in sweep_dir.glob("*/results.json")), None)
        size = f", {parameters / 1e6:.1f}M parameters" if parameters else ""
        return f"{model['n_layer']} layers x {model['n_embd']} wide, {model['n_head']} heads{size}"
    return "unknown model"


def plot(curves: pd.DataFrame, title: str, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(2, 2).flatten()
    for ax, (metric, (panel, ylabel, threshold, log)) in zip(axes, PANELS.items(), strict=True):
        for label, group in curves[curves["metric"] == metric].groupby("setting", sort=True):
            ax.plot(group["step"] / 1000, group["value"], marker="o", markersize=3, label=label)
        if threshold is not None:
            ax.axhline(
                threshold, color="grey", linestyle="--", linewidth=1, label=f"phenomenon threshold ({threshold:g})"
            )
        if metric in PAPER:
            value, paper_label = PAPER[metric]
            ax.axhline(value, color="black", linestyle=":", linewidth=1, label=paper_label)
        ax.set_yscale("log" if log else "linear")
        ax.set_title(panel)
        ax.set_xlabel("optimizer step (thousands; 2,048 tokens a step)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="directory for curves.csv and emergence.png")
    args = parser.parse_args()
    curves = collect(args.sweep_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    curves.to_csv(args.out / "curves.csv", index=False)
    title = (
        "Where the papers' phenomena emerge: vanilla trained from scratch on the embedded corpus\n"
        f"{model_size(args.sweep_dir)}; one seed per setting; metrics on held-out text at each validation"
    )
    plot(curves, title, args.out / "emergence.png")
    last = curves.sort_values("step").groupby(["setting", "metric"]).last()["value"].unstack()
    print(last.to_markdown(floatfmt=".4g"))


if __name__ == "__main__":
    main()
