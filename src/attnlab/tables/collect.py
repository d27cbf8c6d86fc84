"""From per-cell evaluation records to the finished table: whether the baseline shows the paper's phenomenon at all,
ours (mean ± std over seeds) beside the paper's, and each variant's paired difference with the baseline (same model,
same seed), a 95% t-interval and one of four verdicts, raw and corrected over the paper's family of comparisons
(``attnlab.tables.stats``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from scipy import stats

from attnlab.errors import ConfigError
from attnlab.files import write_atomic
from attnlab.tables.definitions import stage_variants
from attnlab.tables.stats import (
    IDENTICAL,
    PERMUTATION_SEEDS,
    TOST_NAME,
    VERDICTS,
    decide,
    paired_test,
    step_down,
)

NO_PAPER_VALUE = "no paper value"  # the paper gives no number or direction for the variant: nothing to judge
DIRECTIONS = {"lower": -1.0, "higher": 1.0}  # a ``claims`` direction as the sign of the paper's difference


MAX_SEEDS = 1000  # seeds_needed's search stops here: past it, no practical number of seeds resolves the effect
PROPOSED_SEEDS = 5  # the seed count a table moves to where its seeds leave intervals wider than the paper's effects


def seeds_needed(diffs: list[float], target: float | None, confidence: float = 0.95) -> int | None:
    """Fewest seeds whose paired t-interval, at the spread of ``diffs``, has a half-width of at most ``target`` (the
    paper's effect in our units): a difference as large as the paper's would then just exclude 0 (about even odds
    when the true effect is the paper's; 80% power takes about twice the seeds). A planning number, rough: the spread
    is read from the seeds that ran. ``None`` below two seeds, with no effect to resolve or a spread that is not
    finite; ``MAX_SEEDS + 1`` past the search."""
    if len(diffs) < 2 or not target or pd.isna(target):
        return None
    sd = pd.Series(diffs).std(ddof=1)
    if not math.isfinite(sd):
        return None
    for n in range(2, MAX_SEEDS + 1):
        if stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n) <= abs(target):
            return n
    return MAX_SEEDS + 1


def claims(table: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The table's ``claims``: (variant, paper column) -> a paper's stated direction against the baseline where it
    gives no number for this protocol (softpick: "no attention sink"), with what it says and where."""
    found = {}
    allowed = {
        "variant": [v for v in table["variants"] if v != table["baseline"]],
        "column": [c["paper"] for c in table["columns"]],
        "direction": list(DIRECTIONS),
    }
    for index, claim in enumerate(table.get("claims") or []):
        for key, values in allowed.items():
            if claim.get(key) not in values:
                raise ConfigError(f"table.claims[{index}].{key}", f"one of {', '.join(values)} (got {claim.get(key)})")
        found[(claim["variant"], claim["column"])] = claim
    return found


def scale_settings(table: dict[str, Any], scale: str) -> dict[str, Any]:
    """The table's ``scales.<scale>`` block, empty where the table (a hand-made one in a test) has none."""
    return (table.get("scales") or {}).get(scale) or {}


def column_map(table: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """The paper's columns with the metric that stands for each at ``scale`` (``ours`` None: not run); at paper scale
    a column's own ``ours`` (default: its paper name). A scale may restate a stand-in (``scales.<scale>.standins``:
    table3's cpu_long cells train on another corpus)."""
    scale_standins = scale_settings(table, scale).get("standins") or {}
    standins = {} if scale == "paper" else (table.get("standins") or {}) | scale_standins
    mapped = []
    for column in table["columns"]:
        standin = standins.get(column["paper"])
        ours = standin["ours"] if standin else (column.get("ours", column["paper"]) if scale == "paper" else None)
        mapped.append({**column, "ours": ours, "standin": standin["standin"] if standin else None})
    return mapped


def paper_value(
    table: dict[str, Any], stage: str, row: str, attention: str, index: int
) -> float | tuple[float, float] | None:
    """The paper's number, or ``(low, high)`` where it states only a range (Qiu et al.'s mean gate "about
    0.11-0.25"): shown beside ours, never differenced into a verdict."""
    values = (table.get("paper") or {}).get(stage, {}).get(row, {}).get(attention)
    value = values[index] if values else None
    if value is None:
        return None
    if isinstance(value, list | tuple):
        low, high = value
        return float(low), float(high)
    return float(value)


def scalar_paper_value(table: dict[str, Any], stage: str, row: str, attention: str, index: int) -> float | None:
    value = paper_value(table, stage, row, attention, index)
    return None if isinstance(value, tuple) else value


# Metrics computed from a record's own columns when it has their inputs (a table's phenomenon checks read them).
DERIVED: dict[str, tuple[tuple[str, ...], Any]] = {
    "w8a8_gap_pct": (("perplexity", "w8a8_perplexity"), lambda r: 100 * (r["w8a8_perplexity"] / r["perplexity"] - 1)),
    "ppl_over_unigram": (("val_ppl", "unigram_ppl"), lambda r: r["val_ppl"] / r["unigram_ppl"]),
}
PRESENT, ABSENT, NOT_MEASURED = "present", "absent", "not measured"


def with_derived(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record with the ``DERIVED`` metrics whose inputs it has."""
    out = []
    for record in records:
        extra = {
            name: compute(record)
            for name, (inputs, compute) in DERIVED.items()
            if all(record.get(key) is not None and not pd.isna(record[key]) for key in inputs)
        }
        out.append(record | extra)
    return out


def phenomena(records: list[dict[str, Any]], table: dict[str, Any], scale: str) -> pd.DataFrame:
    """The table's ``phenomena`` checks: per check, stage and row, the checked variant's (default: the baseline's)
    mean over seeds of each condition's metric against its threshold. Present when every condition holds; not
    measured when a metric is missing at this scale, or the variant did not run there. A stage whose grid leaves the
    variant out at this scale (``scales.<scale>.stage_variants``) has no line: nothing there was meant to show it."""
    frame = pd.DataFrame(with_derived(records))
    stage_variants = scale_settings(table, scale).get("stage_variants") or {}
    rows = []
    for check in table.get("phenomena") or []:
        named = check.get("variant", table["baseline"])  # or a list: the first of them the table compares
        candidates = [named] if isinstance(named, str) else list(named)
        variant = next((v for v in candidates if v in table.get("variants", [])), candidates[0])
        stages = check.get("stages")
        for (stage, row), cells in frame.groupby(["stage", "row"], sort=False):
            if (stages and stage not in stages) or variant not in stage_variants.get(stage, [variant]):
                continue
            group = cells[cells["attention"] == variant]  # none at this scale: the check is "not measured"
            parts, holds = [], []
            for condition in check["conditions"]:
                metric = condition["metric"]
                values = group[metric].dropna() if metric in group else pd.Series(dtype=float)
                bound, at_least = (
                    (condition["at_least"], True) if "at_least" in condition else (condition["at_most"], False)
                )
                sign = ">=" if at_least else "<="
                if not len(values):
                    parts.append(f"{metric} not measured (needs {sign} {bound:g})")
                    holds.append(None)
                    continue
                value = float(values.mean())
                holds.append(value >= bound if at_least else value <= bound)
                parts.append(f"{metric} {value:.4g} ({sign} {bound:g} needed; {len(values)} seed(s))")
            status = NOT_MEASURED if None in holds else PRESENT if all(holds) else ABSENT
            rows.append(
                {"stage": stage, "row": row, "phenomenon": check["name"], "variant": variant, "status": status}
                | {"evidence": "; ".join(parts)}
            )
    return pd.DataFrame(rows, columns=["stage", "row", "phenomenon", "variant", "status", "evidence"])


def phenomena_markdown(checks: pd.DataFrame, table: dict[str, Any]) -> list[str]:
    """The phenomenon lines that open a table, with what they mean for the verdicts below them."""
    if not len(checks):
        return []
    lines = ["## Is the paper's phenomenon there? (mean over seeds)", ""]
    for check in checks.itertuples(index=False):
        lines.append(
            f"- {check.phenomenon} ({check.stage}, {check.row}, {check.variant}): **{check.status}**: {check.evidence}"
        )
    sources = [f"  - {c['name']}: {c['source']}" for c in table.get("phenomena") or [] if c.get("source")]
    lines += ["", "Thresholds and why (the table config's `phenomena`):", *sources] if sources else []
    if (checks["status"] != PRESENT).any():
        lines += [
            "",
            "Where the phenomenon is absent (or not measured) the verdicts below are read in that light: a variant "
            "cannot fix what the baseline does not show, so an unresolved, smaller-than-the-paper's or opposite "
            "verdict there says little about the paper's claim.",
        ]
    return [*lines, ""]


def summarise(records: list[dict[str, Any]], table: dict[str, Any], scale: str) -> pd.DataFrame:
    """One row per (stage, row, attention, paper column): our mean, std and seed count, and the paper's value."""
    frame = pd.DataFrame(records)
    rows = []
    for (stage, row, attention), group in frame.groupby(["stage", "row", "attention"], sort=False):
        for index, column in enumerate(column_map(table, scale)):
            ours = column["ours"]
            values = group[ours].dropna() if ours in group else pd.Series(dtype=float)
            paper = paper_value(table, stage, row, attention, index)
            low, high = paper if isinstance(paper, tuple) else (paper, paper)
            rows.append(
                {"stage": stage, "row": row, "model": group["model"].iloc[0], "attention": attention}
                | {"column": column["paper"], "metric": ours, "standin": column["standin"], "seeds": len(values)}
                | {"mean": values.mean() if len(values) else None}
                | {"std": values.std(ddof=1) if len(values) > 1 else None}
                | {"paper": None if isinstance(paper, tuple) else paper, "paper_low": low, "paper_high": high}
            )
    return pd.DataFrame(rows)


def comparison_key(group: pd.DataFrame, attention: str, baseline: str, metric: str, seeds: list[Any]) -> str:
    """What a comparison is, whichever table holds it: the metric and the (variant run, baseline run) pairs by seed.
    Tables that share cells (Table 3's SSA fine-tune is Tables 5, 7 and 8's too) share the comparison, and the
    paper's family counts it once. Records without run directories (hand-made ones) fall back to the variant's name
    and seeds."""
    if "run" not in group:
        return f"{metric}:{attention}-{baseline}:{','.join(map(str, seeds))}"
    runs = group.set_index(["seed", "attention"])["run"]
    pairs = [f"{Path(str(runs[(seed, attention)])).name}-{Path(str(runs[(seed, baseline)])).name}" for seed in seeds]
    return f"{metric}:{'|'.join(pairs)}"


def effects(
    records: list[dict[str, Any]],
    table: dict[str, Any],
    scale: str,
    siblings: Mapping[str, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """``raw_effects`` with the verdicts corrected over the paper's family (``corrected``; ``siblings``: the raw
    effects of the family's other tables at this scale, by name)."""
    return corrected(raw_effects(records, table, scale), table, siblings)


def raw_effects(records: list[dict[str, Any]], table: dict[str, Any], scale: str) -> pd.DataFrame:
    """Each variant minus the baseline, paired by seed, per stage, row and column that ran; tested against no effect
    and against the paper's effect taken as the same share of our baseline (``attnlab.tables.stats``), with the raw
    verdict."""
    frame = pd.DataFrame(records)
    baseline = table["baseline"]
    stated = claims(table)
    rows = []
    for index, column in enumerate(column_map(table, scale)):
        ours = column["ours"]
        if ours is None or ours not in frame or column.get("judged") is False:
            continue
        for (stage, row), group in frame.groupby(["stage", "row"], sort=False):
            by_seed = group.pivot_table(index="seed", columns="attention", values=ours)
            for attention in (v for v in table["variants"] if v != baseline):
                if attention not in by_seed or baseline not in by_seed:
                    continue
                pairs = by_seed[[attention, baseline]].dropna()
                if not len(pairs):
                    continue
                paper_variant = scalar_paper_value(table, stage, row, attention, index)
                paper_base = scalar_paper_value(table, stage, row, baseline, index)
                paper_diff = paper_variant - paper_base if None not in (paper_variant, paper_base) else None
                claim = stated.get((attention, column["paper"]))
                direction = paper_diff if paper_diff is not None or claim is None else DIRECTIONS[claim["direction"]]
                base = pairs[baseline].mean()
                paper_pct = 100 * paper_diff / paper_base if paper_diff is not None and paper_base else None
                # the paper's effect as the same share of our baseline: the difference our seeds must resolve
                paper_effect = paper_pct / 100 * base if paper_pct is not None and not pd.isna(base) else None
                tested = paired_test(pairs[attention].tolist(), pairs[baseline].tolist(), paper_effect)
                diffs = (pairs[attention] - pairs[baseline]).tolist()
                if tested.identical:
                    judged = IDENTICAL
                elif not direction:
                    judged = NO_PAPER_VALUE
                else:
                    judged = decide(tested.mean, tested.p, tested.p_paper, direction)
                rows.append(
                    {"stage": stage, "row": row, "attention": attention, "column": column["paper"], "metric": ours}
                    | {"seeds": tested.seeds, "diff": tested.mean, "ci_low": tested.low, "ci_high": tested.high}
                    | {"p": tested.p, "p_signflip": tested.p_signflip, "paper_diff": paper_diff}
                    | {"paper_effect": paper_effect, "p_paper": tested.p_paper}
                    | {"diff_pct": 100 * tested.mean / base if base else None}
                    | {"paper_pct": paper_pct, "seeds_needed": seeds_needed(diffs, paper_effect)}
                    | {"comparison": comparison_key(group, attention, baseline, ours, pairs.index.tolist())}
                    | {"verdict": judged}
                )
    found = pd.DataFrame(rows, columns=RAW_EFFECT_COLUMNS)
    return found.astype({"seeds_needed": "Int64"})


RAW_EFFECT_COLUMNS = ["stage", "row", "attention", "column", "metric", "seeds", "diff", "ci_low", "ci_high", "p"]
RAW_EFFECT_COLUMNS += ["p_signflip", "paper_diff", "paper_effect", "p_paper", "diff_pct", "paper_pct", "seeds_needed"]
RAW_EFFECT_COLUMNS += ["comparison", "verdict"]
EFFECT_COLUMNS = [*RAW_EFFECT_COLUMNS, "family", "p_holm", "p_paper_holm", "verdict_holm"]
SHOWN_EFFECTS = ["stage", "row", "attention", "column", "seeds", "diff", "interval", "ours_pct", "paper_diff"]
SHOWN_EFFECTS += ["paper_pct", "seeds_needed"]  # the Markdown's columns before the p-values and verdicts


def judged(effect: pd.DataFrame) -> pd.Series:
    """The comparisons a verdict is drawn for: the paper gives a direction, and the differences are not all 0."""
    return ~effect["verdict"].isin([NO_PAPER_VALUE, IDENTICAL])


def family_name(table: dict[str, Any]) -> str:
    """The family the table's verdicts are corrected over: its paper's (``family``), else the table alone."""
    return table.get("family") or table["name"]


def corrected(
    effect: pd.DataFrame, table: dict[str, Any], siblings: Mapping[str, pd.DataFrame] | None = None
) -> pd.DataFrame:
    """The family's verdicts: the step-down of ``attnlab.tables.stats`` over every judged comparison of the paper's
    tables at this scale (``siblings``: the other tables' raw effects by name). A comparison's "no effect" counts once
    however many tables hold it; its "an effect at least the paper's" once per paper number set against it (Tables 3
    and 7 hold the same SSA fine-tune against two). The ``family`` column names the family, its size and its tables."""
    siblings = siblings or {}
    family = pd.concat([effect[judged(effect)], *(s[judged(s)] for s in siblings.values())], ignore_index=True)
    zero = family.drop_duplicates("comparison")
    sized = family[family["p_paper"].notna()].drop_duplicates(["comparison", "paper_effect"])
    hypotheses = [(key, None, p) for key, p in zip(zero["comparison"], zero["p"], strict=True)]
    hypotheses += [
        (key, effect_size, p)
        for key, effect_size, p in zip(sized["comparison"], sized["paper_effect"], sized["p_paper"], strict=True)
    ]
    adjusted = dict(zip([(key, size) for key, size, _ in hypotheses], step_down(hypotheses), strict=True))
    members = ", ".join(sorted([table["name"], *siblings]))
    size = zero["comparison"].nunique()
    effect = effect.assign(family=f"{family_name(table)}: {size} comparison{'s' * (size != 1)} in {members}")
    mask = judged(effect)
    rows = list(zip(effect["comparison"], effect["paper_effect"], effect["p_paper"], mask, strict=True))
    effect["p_holm"] = [adjusted[(key, None)] if keep else None for key, _, _, keep in rows]
    effect["p_paper_holm"] = [adjusted[(key, size)] if keep and not pd.isna(p) else None for key, size, p, keep in rows]
    effect["verdict_holm"] = [
        decide(row.diff, row.p_holm, None if pd.isna(row.p_paper_holm) else row.p_paper_holm, row.paper_direction)
        if keep
        else row.verdict
        for row, keep in zip(effect.assign(paper_direction=directions(effect, table)).itertuples(), mask, strict=True)
    ]
    return effect[EFFECT_COLUMNS]


def directions(effect: pd.DataFrame, table: dict[str, Any]) -> list[float]:
    """The sign of each comparison's claim: the paper's difference, else its ``claims`` entry's direction."""
    stated = claims(table)
    found = []
    for row in effect.itertuples():
        claim = stated.get((row.attention, row.column))
        found.append(row.paper_diff if not pd.isna(row.paper_diff) else DIRECTIONS[claim["direction"]] if claim else 0)
    return found


def percent(value: Any) -> str:
    """A relative difference (% of the baseline) for the effects table; ``-`` where there is none."""
    return "-" if value is None or pd.isna(value) else f"{value:+.2f}%"


def _cell(mean: Any, std: Any) -> str:
    if mean is None or pd.isna(mean):
        return "-"
    return f"{mean:.3f}" if std is None or pd.isna(std) else f"{mean:.3f} ± {std:.3f}"


def paper_cell(found: pd.Series) -> str:
    """``5.761``, a stated range ``0.110-0.250``, or ``-`` where the paper gives no number."""
    if not pd.isna(found["paper"]):
        return f"{found['paper']:.3f}"
    if not pd.isna(found["paper_low"]):
        return f"{found['paper_low']:.3f}-{found['paper_high']:.3f}"
    return "-"


def variant_label(table: dict[str, Any], attention: str) -> str:
    """``temp_q (Q)``: our attention= name with the paper's label for it, when the table gives one."""
    paper_name = (table.get("paper_variant_names") or {}).get(attention)
    return f"{attention} ({paper_name})" if paper_name and paper_name != attention else attention


def to_markdown(
    summary: pd.DataFrame,
    effect: pd.DataFrame,
    table: dict[str, Any],
    scale: str,
    checks: pd.DataFrame | None = None,
    status: str | None = None,
) -> str:
    """The table as Markdown: its ``status`` line, whether the phenomenon is there, ours beside the paper's per
    column that ran, the columns' provenance, the verdicts."""
    columns = column_map(table, scale)
    ran = [c for c in columns if c["ours"] is not None]
    has_paper = bool(table.get("paper"))  # a table of our own comparisons (variants) has no paper columns to show
    lines = [f"# {table['title']} ({scale} scale)", ""] + ([status, ""] if status else [])
    lines += [f"- {note}" for note in table.get("notes") or []] + ([""] if table.get("notes") else [])
    lines += phenomena_markdown(checks, table) if checks is not None else []
    for stage, block in summary.groupby("stage", sort=False):
        wide = []
        for (row, attention), group in block.groupby(["row", "attention"], sort=False):
            label = variant_label(table, attention)
            entry = {"stage": stage, "row": row, "model": group["model"].iloc[0], "attention": label}
            for column in ran:
                found = group[group["column"] == column["paper"]].iloc[0]
                ours = f"{column['paper']} (ours)" if has_paper else column["paper"]
                entry[ours] = _cell(found["mean"], found["std"])
                if has_paper:
                    entry[f"{column['paper']} (paper)"] = paper_cell(found)
            wide.append(entry)
        lines += [f"## {stage}", "", pd.DataFrame(wide).to_markdown(index=False), ""]
    seeds = int(summary["seeds"].max()) if len(summary) else 0
    lines += ["## Columns", "", f"Ours: mean ± std over {seeds} seed(s) of the last checkpoint.", ""]
    for column in columns:
        if column["ours"] is None:
            lines.append(f"- {column['paper']}: not run at {scale} scale")
        elif column["standin"]:
            standin = "stand-in " if has_paper else ""
            lines.append(f"- {column['paper']}: {standin}`{column['ours']}` ({column['standin']})")
        else:
            lines.append(f"- {column['paper']}: `{column['ours']}`")
    lines += ["", f"## Each variant against {table['baseline']} (paired by seed, 95% t-interval)", ""]
    shares = "diff % and paper %" if has_paper else "diff %"
    lines += [f"{shares}: the difference as a share of the baseline's value (ours: its mean over seeds).", ""]
    lines += verdicts_explained(effect, table, has_paper)
    if len(effect):
        shown = effect.assign(
            interval=[interval(lo, hi) for lo, hi in zip(effect["ci_low"], effect["ci_high"], strict=True)],
            ours_pct=[percent(v) for v in effect["diff_pct"]],
            paper_pct=[percent(v) for v in effect["paper_pct"]],
            seeds_needed=[seeds_label(v) for v in effect["seeds_needed"]],
        )[SHOWN_EFFECTS]
        if not has_paper:
            shown = shown.drop(columns=["paper_diff", "paper_pct", "seeds_needed"])
        renamed = {"ours_pct": "diff %", "paper_pct": "paper %", "seeds_needed": "seeds for paper %"}
        shown = shown.rename(columns=renamed).assign(
            attention=[variant_label(table, a) for a in effect["attention"]],
            p=effect["p"],
            **({"p sign-flip": maybe(effect["p_signflip"])} if effect["p_signflip"].notna().any() else {}),
            **({"p paper": maybe(effect["p_paper"])} if has_paper else {}),
            verdict=effect["verdict"],
            **{"Holm p": maybe(effect["p_holm"])},
            **({"Holm p paper": maybe(effect["p_paper_holm"])} if has_paper else {}),
            **{"verdict (Holm)": effect["verdict_holm"]},
        )
        formats = [".3g" if "p" in name.split() else "+.3f" for name in shown.columns]
        lines.append(shown.to_markdown(index=False, floatfmt=formats, missingval="-"))
        if judged(effect).any():
            lines += ["", f"Raw verdicts: {verdict_counts(effect['verdict'])}"]
            lines += ["", f"After Holm over {effect['family'].iloc[0]}: {verdict_counts(effect['verdict_holm'])}"]
        lines += seeds_markdown(effect) if has_paper else []
    training = {v for stage in table["stages"] for v in stage_variants(table, scale, stage)} if status else set()
    here = {column["paper"] for column in ran}
    lines += claims_markdown(
        effect, table, lambda variant, column: unpaired(summary, table, variant, column, training, here)
    )
    return "\n".join(lines) + "\n"


def interval(low: float, high: float, digits: str = ".3f", none: str = "-") -> str:
    """``[-0.120, +0.031]``; ``none`` where there is no interval (one seed): the effects and the claims tables."""
    return none if not (math.isfinite(low) and math.isfinite(high)) else f"[{low:+{digits}}, {high:+{digits}}]"


def maybe(values: pd.Series) -> pd.Series:
    """Floats as objects, so the Markdown prints ``-`` for a p-value that was not computed."""
    return pd.Series([None if pd.isna(v) else float(v) for v in values], index=values.index, dtype=object)


def verdict_counts(verdicts: pd.Series) -> str:
    """``reproduces 1, opposite 0, smaller than the paper's 5, unresolved 2`` (and any unjudged labels after)."""
    counts = verdicts.value_counts().to_dict()
    rest = [f"{label} {n}" for label, n in counts.items() if label not in VERDICTS]
    return ", ".join([*(f"{label} {counts.get(label, 0)}" for label in VERDICTS), *rest])


def verdicts_explained(effect: pd.DataFrame, table: dict[str, Any], has_paper: bool) -> list[str]:
    """What the p-values and the four verdicts mean, and which family the correction ran over; one line where no
    comparison has a direction to judge."""
    if not judged(effect).any():
        return [
            "p: the paired t-test (scipy's `ttest_rel`) behind the 95% interval. Nothing here is judged: no paper "
            "gives a direction for these comparisons.",
            "",
        ]
    family = effect["family"].iloc[0]
    judged_by = "the paper gives a direction for" if has_paper else "a `claims` entry gives a direction for"
    few = int(effect["seeds"].max()) if len(effect) else 0
    lines = [
        "p: the paired t-test (scipy's `ttest_rel`) behind the 95% interval, against no effect"
        + (
            "; p paper: against an effect at least the paper's (its share of our baseline), in the paper's direction: "
            f"{TOST_NAME}"
            if has_paper
            else ""
        )
        + ". p sign-flip (from 6 seeds): the exact sign-flip permutation test, which assumes no normality.",
        "",
        "Verdicts: **reproduces** / **opposite**: the interval excludes 0 on the paper's side / the other; "
        + ("**smaller than the paper's**: it holds 0 but excludes the paper's effect; " if has_paper else "")
        + "**unresolved**: it holds 0"
        + (" and the paper's effect" if has_paper else "")
        + "; **identical**: every paired difference is 0 (nothing to test, not in the family).",
        "",
        f"Holm: over the family {family}, every comparison {judged_by} in those tables at this scale, each "
        "once however many tables share it; a comparison's two hypotheses exclude each other, so a step counts "
        "comparisons, not hypotheses (Shaffer's logical constraint; `attnlab.tables.stats`).",
        "",
    ]
    if 1 < few < PERMUTATION_SEEDS:
        lines += [
            f"With {few} seeds no test that assumes nothing about the differences' distribution can go below "
            f"p = {2 / 2**few:.3g} (the sign-flip floor): the t-test's smaller p-values lean on normality.",
            "",
        ]
    return lines


def seeds_label(value: Any) -> str:
    """``5``; ``>1000`` past ``seeds_needed``'s search; ``-`` where no paper effect or no spread."""
    if value is None or pd.isna(value):
        return "-"
    return f">{MAX_SEEDS}" if int(value) > MAX_SEEDS else str(int(value))


def seeds_markdown(effect: pd.DataFrame) -> list[str]:
    """How far the seeds reach: the comparisons whose interval is wider than the paper's effect at the seeds run,
    and how many of them ``PROPOSED_SEEDS`` would narrow enough at the same spread (5 where 3 are too few)."""
    sized = effect[effect["seeds_needed"].notna()]
    if not len(sized):
        return []
    ran = int(sized["seeds"].min())
    short = sized[sized["seeds_needed"] > sized["seeds"]]
    beyond = short[short["seeds_needed"] > PROPOSED_SEEDS]
    if not len(short):
        line = (
            f"Seeds: at {ran} seeds the interval is narrower than the paper's effect in all {len(sized)} comparisons."
        )
    else:
        line = f"Seeds: at {ran} seeds the interval is wider than the paper's effect in {len(short)} of {len(sized)} "
        line += "comparisons"
        if ran < PROPOSED_SEEDS:
            narrowed = len(short) - len(beyond)
            line += f"; {PROPOSED_SEEDS} seeds would narrow {narrowed or 'none'} of them enough"
        if len(beyond):
            need = seeds_label(beyond["seeds_needed"].min())
            if len(short) == 1:
                line += f"; it needs {need}"
            elif len(beyond) == len(short):
                line += f"; all of them need {need} or more"
            else:
                line += f"; the other {len(beyond)} need {need} or more"
        line += "."
    return [
        "",
        "seeds for paper %: the fewest seeds at which a difference as large as the paper's effect (taken as the same "
        "share of our baseline) would exclude 0 from the 95% interval, at the spread of the paired differences "
        f"seen over {ran} seeds. A rough planning number (the spread is read from few seeds), at the unadjusted 0.05 "
        "level (Holm asks more), with about even odds of a verdict when the true effect is the paper's: 80% power "
        "takes about twice the seeds.",
        "",
        line,
    ]


def unpaired(
    summary: pd.DataFrame, table: dict[str, Any], variant: str, column: str, training: set[str], here: set[str]
) -> str:
    """Why a claim has no paired difference: the scale measures no stand-in for the column (not in ``here``), the
    variant has no cells (yet, in a partial table still ``training`` it; or not at this scale), or one side never
    measured the column (a cell shared from a table that predates it)."""
    if column not in here:
        return "not measured at this scale"
    if variant not in set(summary["attention"]):
        return "no paired cells yet" if variant in training else "not run at this scale"
    for side in (table["baseline"], variant):
        values = summary[(summary["attention"] == side) & (summary["column"] == column)]["mean"]
        if not values.notna().any():
            return f"not measured on {side}"
    return "no seed measured on both"


def claims_markdown(effect: pd.DataFrame, table: dict[str, Any], why_unpaired: Callable[[str, str], str]) -> list[str]:
    """The papers' stated directions (``claims``), each with our paired difference and its verdicts, or why it has
    none (``why_unpaired(variant, column)``)."""
    stated = claims(table)
    if not stated:
        return []
    rows = []
    for (variant, column), claim in stated.items():
        found = effect[(effect["attention"] == variant) & (effect["column"] == column)] if len(effect) else effect
        said = {"variant": variant_label(table, variant), "column": column, "paper": claim["direction"]}
        said |= {"what it says": claim["says"], "source": claim["source"]}
        if not len(found):
            ours = why_unpaired(variant, column)
            rows.append(said | {"ours": ours, "ours %": "-", "verdict": "-", "verdict (Holm)": "-"})
        for result in found.itertuples(index=False):
            spread = interval(result.ci_low, result.ci_high, ".3g", "(one seed: no interval)")
            rows.append(
                said
                | {"ours": f"{result.diff:+.4g} {spread}"}
                | {"ours %": percent(result.diff_pct), "verdict": result.verdict, "verdict (Holm)": result.verdict_holm}
            )
    return [
        "",
        f"## The papers' claims (their direction against {table['baseline']}, where no number fits this protocol)",
        "",
        "ours: the paired difference and its 95% interval in the column's units; ours %: as a share of the "
        "baseline's mean. The verdicts are the effects table's (raw, and Holm over the paper's family).",
        "",
        pd.DataFrame(rows).to_markdown(index=False),
    ]


def curves_markdown(curves: pd.DataFrame, table: dict[str, Any]) -> str:
    """Each ``curves`` metric while training: mean over seeds per variant at each logged step, one table per metric
    and stage (the full points are in ``curves.csv``)."""
    lines = ["## While training (mean over seeds; every point in curves.csv)", ""]
    for (metric, stage), group in curves.groupby(["metric", "stage"], sort=False):
        wide = group.pivot_table(index="step", columns="attention", values="value", aggfunc="mean", sort=False)
        wide.columns = [variant_label(table, a) for a in wide.columns]
        lines += [f"### {metric} ({stage})", "", wide.reset_index().to_markdown(index=False, floatfmt=".4g"), ""]
    return "\n".join(lines) + "\n"


def write(
    records: list[dict[str, Any]],
    table: dict[str, Any],
    scale: str,
    out_dir: Path,
    wandb_cfg: dict[str, Any] | None = None,
    curves: pd.DataFrame | None = None,
    sections: Sequence[str] = (),
    status: str | None = None,
    siblings: Mapping[str, pd.DataFrame] | None = None,
) -> str:
    """Write ``<table>.md``, ``<table>.csv`` (tidy), ``effects.csv`` and ``runs.csv`` under ``out_dir`` (and
    ``curves.csv`` when the table has training curves; ``sections``: more Markdown a report wrote; ``status``: a
    line under the title, e.g. what a partial table lacks; ``siblings``: the raw effects of the other tables of the
    paper's family at this scale, for the correction); with ``wandb_cfg``, also log the table to W&B
    (``log_wandb``)."""
    records = with_derived(records)
    summary, effect, checks = (
        summarise(records, table, scale),
        effects(records, table, scale, siblings),
        phenomena(records, table, scale),
    )
    markdown = to_markdown(summary, effect, table, scale, checks, status)
    out_dir.mkdir(parents=True, exist_ok=True)
    if curves is not None and len(curves):
        markdown += "\n" + curves_markdown(curves, table)
        write_atomic(out_dir / "curves.csv", curves.to_csv(index=False))
    markdown += "".join("\n" + section for section in sections)
    write_atomic(out_dir / f"{table['name']}.md", markdown)
    write_atomic(out_dir / f"{table['name']}.csv", summary.to_csv(index=False))
    write_atomic(out_dir / "effects.csv", effect.to_csv(index=False))
    write_atomic(out_dir / "phenomena.csv", checks.to_csv(index=False))
    write_atomic(out_dir / "runs.csv", pd.DataFrame(records).to_csv(index=False))
    if wandb_cfg is not None:
        log_wandb(summary, effect, wandb_cfg)
    return markdown


def log_wandb(summary: pd.DataFrame, effect: pd.DataFrame, wandb_cfg: dict[str, Any]) -> None:
    """The finished table (tidy, as in ``<table>.csv``) and the effects as W&B Tables, in a run of the table's group
    (job type table) beside its cells' training and evaluation runs; the verdict counts are its summary.
    ``wandb_cfg``: project, group, tags and dir."""
    import wandb

    from attnlab.hub import wandb_mode

    def as_table(frame: pd.DataFrame) -> wandb.Table:
        return wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))

    Path(wandb_cfg["dir"]).mkdir(parents=True, exist_ok=True)
    run = wandb.init(**wandb_cfg, job_type="table", name=wandb_cfg["group"], mode=wandb_mode())
    run.log({"table": as_table(summary), "effects": as_table(effect)})
    if len(effect):
        run.summary.update({f"verdicts/{k}": int(v) for k, v in effect["verdict"].value_counts().items()})
    run.finish()
