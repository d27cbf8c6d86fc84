"""The phenomena search's curves: each run's outlier and sink metrics against the step, with the tables'
phenomenon thresholds drawn in, from the runs' ``csv/metrics.csv`` (``conf/experiment/emergence.yaml``).

    python experiments/emergence.py outputs/emergence/search --out experiments/results/emergence
    python experiments/emergence.py --render --out experiments/results/emergence   # the figure again, from curves.csv
    python experiments/emergence.py outputs/runs/tiny-vanilla-s* --out experiments/results/emergence/gpu  # cells
    python experiments/emergence.py --evaluations outputs/eval/<id> ... --out experiments/results/emergence/registry

Writes ``curves.csv`` (one row per run, step and metric), ``setup.json`` (what the figure's title names: the model,
tokens a step, the corpus) and ``emergence.png``; a run still training shows the steps it has logged. Runs that
differ only in their seed are one setting, drawn as the mean with its min-max band. ``--render`` draws
``emergence.png`` again from the committed ``curves.csv`` and ``setup.json`` alone. ``--evaluations`` tables what
``evaluate.py eval=analysis_cpu`` measured on the runs' checkpoints (W8A8 and what it damages, which no training curve
logs) as ``evaluations.csv``: one row per evaluation, with the run, its setting, the step its checkpoint held and
the outliers and gating tables' phenomenon checks; run it first, and the curves then draw its W8A8 gap too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import yaml

from attnlab.plots import Panel, curves_figure, parameters_label, save
from attnlab.tables.collect import phenomena, with_derived
from attnlab.tables.sizes import config_parameters

ROOT = Path(__file__).resolve().parents[1]

# overrides that do not make a setting (see ``overrides``)
NOT_SETTINGS = (
    "ckpt_path=",
    "callbacks.last_checkpoint.",
    "print_config=",
    "hydra.",
    "seed=",
    "experiment_name=",
    "trainer.max_steps=",
)
EVAL_W8A8 = "eval/w8a8_gap_pct"  # evaluations.csv's W8A8 gap per snapshot: one more curve in curves.csv
PAPER_TABLE, PAPER_ROW = "outliers", "OPT-125m"  # whose paper numbers the curves draw: Bondarenko et al.'s vanilla


def reference_lines() -> tuple[dict[str, float], dict[str, tuple[float, str]]]:
    """What the panels draw beside the runs, from the tables themselves: the ``CHECKS_OF`` tables' phenomenon
    thresholds (checked metric -> at least) and the paper's vanilla values from the outliers table's ``paper``
    numbers (secondhand quotes, unverified; panel metric -> (value, legend)). The paper's kurtosis is an average over
    modules, not our max, so it is not drawn."""
    from attnlab.tables import load_table

    tables = {name: load_table(name) for name in {*CHECKS_OF, PAPER_TABLE}}
    thresholds = {
        condition["metric"]: condition["at_least"]
        for name in CHECKS_OF
        for check in tables[name].get("phenomena") or []
        for condition in check["conditions"]
    }
    paper = tables[PAPER_TABLE]
    names = [column["paper"] for column in paper["columns"]]
    values = dict(zip(names, paper["paper"]["pretrain"][PAPER_ROW]["vanilla"], strict=True))
    gap = with_derived([{"perplexity": values["fp_ppl"], "w8a8_perplexity": values["w8a8_ppl"]}])[0]["w8a8_gap_pct"]
    inf_norm = values["max_inf_norm"]
    return thresholds, {
        "outliers/max_inf_norm": (inf_norm, f"paper: vanilla {PAPER_ROW}, 125M params ({inf_norm:g})"),
        EVAL_W8A8: (gap, f"paper: vanilla {PAPER_ROW} W8A8, 125M params ({gap:+.0f}%)"),
    }


# metric logged while training -> (panel title, y label with its unit, the phenomenon check's metric whose threshold
# the panel draws or None, log y)
PANELS = {
    "outliers/kurtosis_max": ("max kurtosis over modules", "kurtosis (Gaussian: 3)", "kurtosis_max", True),
    "outliers/max_inf_norm": ("max infinity norm over modules", "max |activation| (activation units)", None, True),
    EVAL_W8A8: ("W8A8 cost (evaluate.py on the snapshots)", "W8A8 perplexity above FP (%)", "w8a8_gap_pct", True),
    "sinks/sink_share": (
        "attention sink: first-token share",
        "share of attention (layers 2+, queries 16+)",
        "sink_share",
        False,
    ),
    "sinks/sink_epsilon": (
        "attention sink: Gu et al.'s Sink^eps",
        "share of heads (first-token attention > 0.3)",
        "sink_epsilon",
        False,
    ),
    # near 0: each query reads one key; with a low first-token share that key is not the first (lr 6e-3's collapse)
    "sinks/attention_entropy_normalized": (
        "attention entropy (all layers, queries at positions >= 4)",
        "entropy / log(keys seen) (1: uniform)",
        None,
        False,
    ),
    "val/loss": ("held-out loss", "cross-entropy (nats / token)", None, False),
}


def overrides(run_dir: Path) -> list[str]:
    """What the run was started with, less what does not make a setting: resuming, checkpoint cadence, printing,
    Hydra's own, the seed, the name (cells one table shares with another carry the other's experiment_name) and the
    horizon (the learning rate is constant after warmup, so a run extended by raising trainer.max_steps is the same
    curve, read further)."""
    found = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    return [o for o in found if not o.startswith(NOT_SETTINGS)]


def run_dirs(paths: list[Path]) -> list[Path]:
    """The runs under a sweep directory, or the run directories themselves (a table's cells)."""
    runs = []
    for path in paths:
        found = [metrics.parent.parent for metrics in sorted(path.glob("*/csv/metrics.csv"))]
        runs += found or ([path] if (path / "csv" / "metrics.csv").is_file() else [])
    return runs


def setting_labels(runs: list[Path]) -> dict[Path, str]:
    """Each run's setting: what its overrides set that the other runs' do not (``defaults`` when nothing)."""
    given = {run: overrides(run) for run in runs}
    shared = set.intersection(*(set(o) for o in given.values())) if given else set()
    return {run: " ".join(o for o in given[run] if o not in shared) or "defaults" for run in runs}


def collect(runs: list[Path]) -> pd.DataFrame:
    """Every logged point of every run; a run's ``setting`` is what its overrides set that others' do not."""
    labels = setting_labels(runs)
    rows = []
    for run in runs:
        label = labels[run]
        logged = pd.read_csv(run / "csv" / "metrics.csv")
        for metric in (m for m in PANELS if m in logged):
            points = logged[["step", metric]].dropna().drop_duplicates("step", keep="last")
            for step, value in points.itertuples(index=False):
                rows.append({"run": run.name, "setting": label, "step": int(step) + 1, "metric": metric})
                rows[-1]["value"] = float(value)
    if not rows:
        raise SystemExit(f"error: no csv/metrics.csv with the emergence metrics under {' '.join(map(str, runs))}")
    return pd.DataFrame(rows)


def with_evaluations(curves: pd.DataFrame, evaluations_csv: Path) -> pd.DataFrame:
    """The curves and, where ``evaluations.csv`` is there, the W8A8 gap of each drawn run's evaluated snapshots (no
    training curve logs W8A8); evaluations of other runs, or without a step or a gap, are left out."""
    if not evaluations_csv.is_file():
        return curves
    table = pd.read_csv(evaluations_csv).dropna(subset=["step", "w8a8_gap_pct"])
    settings = curves.drop_duplicates("run").set_index("run")["setting"]
    table = table[table["run"].isin(settings.index)]
    gaps = pd.DataFrame({"run": table["run"], "setting": table["run"].map(settings), "step": table["step"].astype(int)})
    return pd.concat([curves, gaps.assign(metric=EVAL_W8A8, value=table["w8a8_gap_pct"])], ignore_index=True)


def setup(runs: list[Path]) -> dict[str, str | int]:
    """What the figure's title names, from the runs' configs (or, with no run at hand, ``experiment=emergence``
    composed as ``train.py`` would): the models' real sizes, the tokens of one optimizer step and the corpus."""
    from omegaconf import OmegaConf

    import attnlab.resolvers  # noqa: F401  (the resolvers runs' configs use, the presets train.yaml composes)

    configs = [run / ".hydra" / "config.yaml" for run in runs if (run / ".hydra" / "config.yaml").is_file()]
    if configs:
        loaded = [OmegaConf.load(config) for config in configs]
    else:
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            loaded = [compose(config_name="train", overrides=["experiment=emergence"])]
    # only these parts: others interpolate Hydra's run-time values
    parts = ("model", "attention", "data", "optim")
    cfgs = [{key: OmegaConf.to_container(c[key], resolve=True) for key in parts if key in c} for c in loaded]
    sizes = list(dict.fromkeys(model_size(cfg) for cfg in cfgs))
    name = cfgs[0]["model"]["name"]
    model = f"our {name}: {sizes[0]}"
    if len(sizes) > 1:  # a search over the model's size: each curve's model.* settings say which
        model = f"our {name}: {' / '.join(sizes)} (by each curve's model.* settings)"
    data, optim = cfgs[0]["data"], cfgs[0].get("optim") or {}
    accumulate = (loaded[0].get("trainer") or {}).get("accumulate_grad_batches") or 1
    tokens = data.get("batch_size", 0) * data.get("block_size", 0) * accumulate
    return {
        "model": model,
        "tokens_per_step": tokens,
        "corpus": data.get("name", "?"),
        "lr": optim.get("lr"),
        "schedule": f"{optim.get('schedule', '?')} after {optim.get('warmup_steps', '?')} warmup steps",
    }


def model_size(cfg: dict) -> str:
    """``4 layers x 256 wide, 4 heads, 4.3M params``: a run's model as it was built (its vocabulary included)."""
    model = cfg["model"]
    parameters = config_parameters(model, cfg["attention"], cfg["data"].get("tokenizer_vocab_size"))
    return (
        f"{model['n_layer']} layers x {model['n_embd']} wide, {model['n_head']} heads, {parameters_label(parameters)}"
    )


# evaluations.csv's columns: name -> (analysis.json section, key) of the evaluation's value
EVALUATED = {
    "perplexity": ("summary", "perplexity"),
    "w8a8_perplexity": ("summary", "w8a8_perplexity"),
    "kurtosis_max": ("summary", "kurtosis_max"),
    "max_inf_norm": ("summary", "max_inf_norm"),
    "channel_ratio_max": ("outliers", "channel_ratio_max"),  # a module's largest dimension over its median one
    "channel_ratio_max_module": ("outliers", "channel_ratio_max_module"),
    "outlier_dim": ("outliers", "outlier_dim"),  # the hidden dimension that is the largest in the most modules
    "outlier_dim_modules": ("outliers", "outlier_dim_modules"),  # of 5 modules a block + the final norm
    "sink_share": ("summary", "sink_share"),
    "attention_entropy_normalized": ("summary", "attention_entropy_normalized"),
    "clipped_share_max": ("w8a8", "clipped_share_max"),
    "clipped_share_max_at": ("w8a8", "clipped_share_max_at"),
    "step_over_median_max": ("w8a8", "step_over_median_max"),
    "step_over_median_max_at": ("w8a8", "step_over_median_max_at"),
}
DAMAGE_KINDS = ("residual_sum", "norm_output")  # W8A8's grid step over median |x| where the residual stream is read
CHECKS_OF = ("outliers", "gating")  # the tables whose phenomenon checks (outliers; attention sink) each evaluation gets


def evaluations(eval_dirs: list[Path]) -> pd.DataFrame:
    """One row per ``evaluate.py`` run directory: the run and setting its checkpoint came from, the step it held, and
    the analysis numbers (``EVALUATED``, the W8A8 gap, the grid step over median |x| of ``DAMAGE_KINDS``)."""
    found = []
    for eval_dir in eval_dirs:
        if not (eval_dir / "analysis" / "analysis.json").is_file():
            raise SystemExit(f"error: --evaluations: {eval_dir} holds no analysis/analysis.json (eval=analysis_cpu)")
        record = json.loads((eval_dir / "results.json").read_text())
        analysis = json.loads((eval_dir / "analysis" / "analysis.json").read_text())
        checkpoint = record["model"].get("attnlab_checkpoint")  # None: a Hugging Face model, no run of ours
        run = Path(checkpoint).resolve().parents[1] if checkpoint else None  # <run>/checkpoints/<file>.ckpt
        found.append((eval_dir, record["model"], run, analysis))
    known = list(dict.fromkeys(run for _, _, run, _ in found if run and (run / ".hydra/overrides.yaml").is_file()))
    labels = setting_labels(known)
    rows = []
    for eval_dir, model, run, analysis in found:
        row = {"evaluation": eval_dir.name, "run": run.name if run else "?", "setting": labels.get(run, "?")}
        row |= {"step": model.get("attnlab_checkpoint_step"), "attention": model.get("attnlab_attention")}
        row |= {name: (analysis.get(section) or {}).get(key) for name, (section, key) in EVALUATED.items()}
        damage = (analysis.get("w8a8") or {}).get("damage") or {}
        row |= {f"{kind}_step_over_median": (damage.get(kind) or {}).get("step_over_median") for kind in DAMAGE_KINDS}
        rows.append({"w8a8_gap_pct": None} | row)  # the gap computed as the tables compute it (None: no W8A8)
    first = ["evaluation", "run", "setting", "step", "perplexity", "w8a8_perplexity", "w8a8_gap_pct"]
    whole = dict.fromkeys(["step", "outlier_dim", "outlier_dim_modules"], "Int64")  # counts, empty where not measured
    table = checked(pd.DataFrame(with_derived(rows)).astype(whole))
    return table[first + [c for c in table if c not in first]].sort_values(["setting", "step"], kind="stable")


def checked(table: pd.DataFrame) -> pd.DataFrame:
    """Each evaluation with the ``CHECKS_OF`` tables' phenomenon checks as if it were their baseline's only seed:
    their thresholds and their code, so "present at step N" here is what that table would print."""
    from attnlab.tables import load_table

    records = [{"stage": "pretrain", "row": row["evaluation"]} | row for row in table.to_dict("records")]
    for name in CHECKS_OF:
        for check in phenomena(records, load_table(name), "cpu_long").itertuples(index=False):  # its protocol
            column = f"{check.phenomenon.replace(' ', '_')}_check"
            table.loc[table["evaluation"] == check.row, column] = check.status
    return table


def plot(curves: pd.DataFrame, title: str, path: Path, tokens_per_step: int) -> None:
    """One panel per metric the runs logged, each setting a line (the mean over its seeds, with their min-max band),
    the checks' thresholds and the paper's value as reference lines on the same axis."""
    panels, logged = [], set(curves["metric"])
    thresholds_of, papers = reference_lines()
    for metric, (panel, ylabel, checked_metric, log) in PANELS.items():
        if metric not in logged:  # runs from before the monitor logged it
            continue
        threshold = thresholds_of.get(checked_metric)
        thresholds = ((threshold, f"phenomenon check's threshold ({threshold:g})"),) if threshold is not None else ()
        paper = (papers[metric],) if metric in papers else ()
        log = log and bool((curves.loc[curves["metric"] == metric, "value"] > 0).all())  # a W8A8 gain: linear
        panels.append(Panel(metric, panel, ylabel, log=log, thresholds=thresholds, paper=paper))
    frame = curves.rename(columns={"metric": "panel", "setting": "series", "run": "seed"})
    xlabel = f"optimizer steps done ({tokens_per_step:,} tokens a step)"
    save(curves_figure(frame, panels, title, xlabel=xlabel, band="min-max"), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="*", help="a sweep directory, or run directories (not with --render)")
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for curves.csv, setup.json, emergence.png (evaluations.csv)"
    )
    parser.add_argument("--render", action="store_true", help="draw emergence.png again from --out's files")
    parser.add_argument("--evaluations", type=Path, nargs="+", help="evaluate.py run directories: evaluations.csv")
    args = parser.parse_args()
    if args.evaluations:
        if args.runs or args.render:
            parser.error("--evaluations tables evaluations alone: give runs or --render in another call")
        table = evaluations(args.evaluations)
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "evaluations.csv", index=False)
        print(table.to_markdown(index=False, floatfmt=".6g"))
        return
    if args.render == bool(args.runs):
        parser.error("give a sweep directory or run directories, or --render to draw the committed curves again")
    if args.render:
        curves = pd.read_csv(args.out / "curves.csv")
        facts = json.loads((args.out / "setup.json").read_text()) if (args.out / "setup.json").is_file() else setup([])
    else:
        runs = run_dirs(args.runs)
        curves, facts = with_evaluations(collect(runs), args.out / "evaluations.csv"), setup(runs)
        args.out.mkdir(parents=True, exist_ok=True)
        curves.to_csv(args.out / "curves.csv", index=False)
        (args.out / "setup.json").write_text(json.dumps(facts, indent=2) + "\n")
    seeds = curves.groupby("setting")["run"].nunique()
    per_setting = f"{seeds.min()}-{seeds.max()} seeds" if seeds.min() < seeds.max() else f"{seeds.min()} seed(s)"
    swept = curves["setting"].str.contains("optim.lr=").any() or facts.get("lr") is None
    lr = "lr per curve" if swept else f"lr {facts['lr']:g}"
    title = (
        f"Where the papers' phenomena emerge: trained from scratch on data={facts['corpus']}, "
        f"{lr}, {facts.get('schedule', 'schedule as configured')}\n"
        f"{facts['model']}\n{per_setting} per setting; metrics on held-out text at each validation"
        + (", W8A8 on the runs' snapshot checkpoints" if (curves["metric"] == EVAL_W8A8).any() else "")
    )
    plot(curves, title, args.out / "emergence.png", int(facts["tokens_per_step"]))
    last = curves.sort_values("step").groupby(["setting", "run", "metric"]).last()["value"].unstack()
    print(last.groupby("setting").mean().to_markdown(floatfmt=".4g"))


if __name__ == "__main__":
    main()
