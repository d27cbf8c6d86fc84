"""The phenomena search's curves (issue 23): each run's outlier and sink metrics against the step, with the tables'
phenomenon thresholds drawn in, from the runs' ``csv/metrics.csv`` (``conf/experiment/emergence.yaml``).

    python experiments/emergence.py outputs/emergence/search --out experiments/results/emergence
    python experiments/emergence.py --render --out experiments/results/emergence   # the figure again, from curves.csv

Writes ``curves.csv`` (one row per run, step and metric) and ``emergence.png``; a run still training shows the
steps it has logged. ``--render`` draws ``emergence.png`` again from the committed ``curves.csv`` alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from attnlab.plots import Panel, curves_figure, parameters_label, save
from attnlab.tables.sizes import config_parameters

ROOT = Path(__file__).resolve().parents[1]

# the paper's value on the same metric, drawn on the same axis (Bondarenko et al., vanilla OPT-125m, as the spec
# quotes it, unverified); its 1,778 kurtosis is an average over modules, not our max, so it is not drawn
PAPER = {"outliers/max_inf_norm": (340.0, "paper: vanilla OPT-125m, 125M params (340)")}
# metric logged while training -> (panel title, y label with its unit, threshold of the table's phenomenon check or
# None, log y)
PANELS = {
    "outliers/kurtosis_max": ("max kurtosis over modules", "kurtosis (Gaussian: 3)", 50.0, True),
    "outliers/max_inf_norm": ("max infinity norm over modules", "max |activation| (activation units)", None, True),
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


def model_size(sweep_dir: Path | None) -> str:
    """The searched model's real size, from a run's config (or, with no sweep at hand, ``experiment=emergence``
    composed as ``train.py`` would)."""
    configs = sorted(sweep_dir.glob("*/.hydra/config.yaml")) if sweep_dir is not None else []
    if configs:
        cfg = yaml.safe_load(configs[0].read_text())
    else:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        import attnlab.resolvers  # noqa: F401  (the attention presets and model defaults train.yaml composes)

        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose(config_name="train", overrides=["experiment=emergence"]))
    model = cfg["model"]
    parameters = config_parameters(model, cfg["attention"], cfg["data"].get("tokenizer_vocab_size"))
    return (
        f"our {model['name']}: {model['n_layer']} layers x {model['n_embd']} wide, {model['n_head']} heads, "
        f"{parameters_label(parameters)}"
    )


def plot(curves: pd.DataFrame, title: str, path: Path) -> None:
    """One panel per metric, each setting a line (one seed each), the checks' thresholds and the paper's value as
    reference lines on the same axis."""
    panels = []
    for metric, (panel, ylabel, threshold, log) in PANELS.items():
        thresholds = ((threshold, f"phenomenon check's threshold ({threshold:g})"),) if threshold is not None else ()
        paper = (PAPER[metric],) if metric in PAPER else ()
        panels.append(Panel(metric, panel, ylabel, log=log, thresholds=thresholds, paper=paper))
    frame = curves.rename(columns={"metric": "panel", "setting": "series", "run": "seed"})
    xlabel = "optimizer steps done (2,048 tokens a step)"
    save(curves_figure(frame, panels, title, xlabel=xlabel, band="min-max"), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, nargs="?", help="the search's sweep directory (not with --render)")
    parser.add_argument("--out", type=Path, required=True, help="directory for curves.csv and emergence.png")
    parser.add_argument("--render", action="store_true", help="draw emergence.png again from --out's curves.csv")
    args = parser.parse_args()
    if args.render == (args.sweep_dir is not None):
        parser.error("give a sweep directory, or --render to draw the committed curves.csv again")
    if args.render:
        curves = pd.read_csv(args.out / "curves.csv")
    else:
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
