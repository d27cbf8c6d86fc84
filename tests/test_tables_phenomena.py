"""Phenomenon checks and the four verdicts, raw and corrected over a paper's family, on hand-made numbers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from attnlab.errors import ConfigError
from attnlab.tables.collect import (
    ABSENT,
    NO_PAPER_VALUE,
    NOT_MEASURED,
    PRESENT,
    effects,
    phenomena,
    raw_effects,
    seeds_label,
    seeds_needed,
    summarise,
    to_markdown,
    with_derived,
)
from attnlab.tables.stats import (
    IDENTICAL,
    OPPOSITE,
    REPRODUCES,
    SMALLER,
    UNRESOLVED,
    decide,
    paired_test,
    step_down,
)


def test_the_p_value_agrees_with_the_interval_and_matches_a_hand_computation() -> None:
    """p < 0.05 exactly when the 95% interval excludes 0 (the same t-test), and p paper < 0.05 exactly when it
    excludes the paper's effect on the paper's side."""
    for diffs in ([-1.0, -1.2, -0.9], [-1.0, 1.5, 0.2], [0.1, 0.3, 0.2, 0.25], [0.5, -0.1, 0.4, 0.3, 0.6]):
        for paper in (-2.0, -0.5, 0.3, 1.0):
            tested = paired_test(diffs, [0.0] * len(diffs), paper)
            assert (tested.p < 0.05) == (not tested.low <= 0 <= tested.high)
            beyond = tested.low > paper if paper < 0 else tested.high < paper
            assert (tested.p_paper < 0.05) == beyond, (diffs, paper)
    # by hand: mean -1.0333, sd 0.15275, t = -11.72 on 2 degrees of freedom, two-sided p = 0.0072
    tested = paired_test([0.0, -0.2, 0.1], [1.0, 1.0, 1.0], paper_effect=-3.0)
    assert math.isclose(tested.p, 0.0072, rel_tol=1e-2)
    # against -3: t = (-1.0333 + 3) / 0.08819 = 22.30, one-sided p = 0.001 on 2 df, doubled 0.002
    assert math.isclose(tested.p_paper, 2 * 0.0010, rel_tol=0.05)
    one = paired_test([0.4], [0.0], paper_effect=1.0)
    assert (one.p, one.p_paper, one.low, one.high) == (1.0, 1.0, -math.inf, math.inf)


def test_identical_differences_are_not_p_zero_and_all_zero_ones_are_not_tested() -> None:
    """The t statistic is undefined when the differences do not vary: the sign-flip test's p stands in (3 seeds all
    the same sign: 2 / 2^3 = 0.25), never 0. Rounding (3.1 - 1.1 against 4.1 - 2.1) counts as not varying."""
    same = paired_test([3.1, 4.1, 5.1], [1.1, 2.1, 3.1], paper_effect=5.0)
    assert same.p == pytest.approx(0.25) and same.low == same.high == pytest.approx(2.0)
    assert same.p_paper == pytest.approx(0.25)  # 2 below the paper's 5 in every seed: the sign-flip floor again
    assert decide(same.mean, same.p, same.p_paper, 5.0) == UNRESOLVED
    assert paired_test([1.0] * 6, [0.0] * 6).p == pytest.approx(2 / 64)  # six seeds can go below 0.05
    zero = paired_test([2.0, 3.0, 4.0], [2.0, 3.0, 4.0], paper_effect=1.0)
    assert zero.identical and zero.p_paper is None
    assert not paired_test([1.0, -1.0, 0.0], [0.0, 0.0, 0.0]).identical  # mean 0, but the differences vary


def test_each_of_the_four_verdicts_by_hand() -> None:
    """A paper effect of -1 (lower is better): the interval [low, high] decides."""
    cases = {
        REPRODUCES: [-1.1, -0.9, -1.0, -1.05],  # excludes 0 on the paper's side
        OPPOSITE: [0.9, 1.1, 1.0, 1.05],  # excludes 0 on the other
        SMALLER: [0.05, -0.05, 0.02, -0.01],  # holds 0, excludes -1
        UNRESOLVED: [0.5, -1.5, 0.2, -0.8],  # holds 0 and -1
    }
    for expected, diffs in cases.items():
        tested = paired_test(diffs, [0.0] * 4, paper_effect=-1.0)
        assert decide(tested.mean, tested.p, tested.p_paper, direction=-1.0) == expected
        assert (tested.low <= 0 <= tested.high) == (expected in (SMALLER, UNRESOLVED))
        if expected in (SMALLER, UNRESOLVED):
            assert (tested.low <= -1 <= tested.high) == (expected == UNRESOLVED)
    # a claim with a direction but no size has no paper-side test: it can only be unresolved when 0 is held
    tested = paired_test(cases[SMALLER], [0.0] * 4)
    assert tested.p_paper is None and decide(tested.mean, tested.p, None, -1.0) == UNRESOLVED


@pytest.mark.slow
def test_the_step_down_is_holm_when_each_comparison_has_one_hypothesis() -> None:
    """Checked against statsmodels' Holm, and by hand."""
    for p_values in ([0.03, 0.01, 0.5, 0.02], [0.4, 0.6], [0.9, 0.8], [0.001, 0.2, 0.04, 0.04, 0.3]):
        expected = multipletests(p_values, method="holm")[1]
        assert step_down([(i, None, p) for i, p in enumerate(p_values)]) == pytest.approx(list(expected))
    # sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06, kept monotone), 0.5 (x1 = 0.5)
    by_hand = step_down([(i, None, p) for i, p in enumerate([0.03, 0.01, 0.5, 0.02])])
    assert by_hand == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert step_down([]) == []


def test_the_step_down_counts_comparisons_not_hypotheses() -> None:
    """Two comparisons with two hypotheses each: the first step multiplies by 2 (comparisons), not 4; the step
    after it still by 2 (comparison a keeps its other hypothesis), then by 1 once a is done."""
    hypotheses = [("a", None, 0.01), ("a", -1.0, 0.6), ("b", None, 0.02), ("b", -2.0, 0.03)]
    # sorted: a 0.01 (x2 = 0.02), b 0.02 (x2 = 0.04), b 0.03 (x2: a and b still open = 0.06), a 0.6 (x1 = 0.6)
    assert step_down(hypotheses) == pytest.approx([0.02, 0.6, 0.04, 0.06])
    # statsmodels over all four hypotheses would ask more of each (x4 first)
    assert multipletests([p for *_, p in hypotheses], method="holm")[1][0] == pytest.approx(0.04)


def test_two_paper_numbers_against_the_same_cells_can_both_be_true() -> None:
    """Tables 3 and 7 set -5.2% and -0.6% against the same SSA fine-tune: "at least -5.2%" and "at least -0.6%" can
    both hold, so that comparison counts 2 while both are open (only "no effect" excludes them)."""
    hypotheses = [("a", None, 0.5), ("a", -5.2, 0.01), ("a", -0.6, 0.02)]
    # sorted: a -5.2 0.01 (x2 = 0.02), a -0.6 0.02 (x1: one paper-side left, or "no effect" = 0.02), no effect 0.5
    assert step_down(hypotheses) == pytest.approx([0.5, 0.02, 0.02])
    assert step_down([("a", None, 0.5), ("a", -5.2, 0.01)]) == pytest.approx([0.5, 0.01])  # exclusive: x1


TABLE = {
    "name": "t",
    "title": "T",
    "baseline": "vanilla",
    "variants": ["vanilla", "a", "b"],
    "columns": [{"paper": "ppl", "better": "lower"}, {"paper": "w8", "better": "lower"}],
    "standins": {"ppl": {"ours": "perplexity", "standin": "ppl"}, "w8": {"ours": "w8a8_perplexity", "standin": "w"}},
    "paper": {"pretrain": {"R": {"vanilla": [10.0, 12.0], "a": [9.0, 10.0], "b": [9.5, None]}}},
    "phenomena": [
        {
            "name": "outliers",
            "conditions": [{"metric": "kurtosis_max", "at_least": 50}, {"metric": "w8a8_gap_pct", "at_least": 2}],
            "source": "hand-made",
        },
        {"name": "fits", "conditions": [{"metric": "ppl_over_unigram", "at_most": 0.5}]},
        {"name": "sink", "conditions": [{"metric": "sink_share", "at_least": 0.2}]},
    ],
}


def records(kurtosis: list[float], w8a8_gap: float) -> list[dict]:
    """Three seeds of vanilla, a (clearly lower perplexity) and b (noise)."""
    out = []
    for seed, (k, noise) in enumerate(zip(kurtosis, [0.3, -0.2, 0.1], strict=True), start=1):
        base = 10.0 + noise
        for attention, ppl in (("vanilla", base), ("a", base - 1.0 - 0.01 * seed), ("b", base + noise)):
            out.append(
                {"stage": "pretrain", "row": "R", "model": "m", "attention": attention, "seed": seed}
                | {"perplexity": ppl, "w8a8_perplexity": ppl * (1 + w8a8_gap / 100), "kurtosis_max": k}
                | {"val_ppl": ppl, "unigram_ppl": 4 * ppl}
            )
    return out


def test_phenomena_present_absent_and_not_measured() -> None:
    checks = phenomena(records([60.0, 70.0, 50.0], w8a8_gap=3.0), TABLE, "cpu").set_index("phenomenon")
    assert checks.loc["outliers", "status"] == PRESENT
    assert "kurtosis_max 60 (>= 50 needed; 3 seed(s))" in checks.loc["outliers", "evidence"]
    assert "w8a8_gap_pct 3 (>= 2 needed" in checks.loc["outliers", "evidence"]
    assert checks.loc["fits", "status"] == PRESENT  # 0.25 of the unigram perplexity
    assert checks.loc["sink", "status"] == NOT_MEASURED
    # the mean decides: 4.2 is far below 50, and one condition failing makes it absent
    checks = phenomena(records([4.0, 4.5, 4.1], w8a8_gap=3.0), TABLE, "cpu").set_index("phenomenon")
    assert checks.loc["outliers", "status"] == ABSENT and "kurtosis_max 4.2" in checks.loc["outliers", "evidence"]
    checks = phenomena(records([60.0, 70.0, 50.0], w8a8_gap=1.0), TABLE, "cpu").set_index("phenomenon")
    assert checks.loc["outliers", "status"] == ABSENT


def test_derived_metrics_only_where_their_inputs_are() -> None:
    rows = with_derived([{"perplexity": 100.0, "w8a8_perplexity": 102.5}, {"perplexity": 100.0}])
    assert rows[0]["w8a8_gap_pct"] == pytest.approx(2.5) and "w8a8_gap_pct" not in rows[1]


def test_holm_verdicts_beside_the_raw_ones() -> None:
    data = records([60.0, 70.0, 50.0], w8a8_gap=3.0)
    effect = effects(data, TABLE, "cpu").set_index(["attention", "column"])
    a = effect.loc[("a", "ppl")]
    assert a["verdict"] == REPRODUCES and a["p"] < 0.05
    # the family: the comparisons with a paper direction (a/ppl, a/w8, b/ppl; b/w8 has no paper value)
    judged = effect[effect["verdict"] != NO_PAPER_VALUE]
    assert len(judged) == 3 and effect["p_holm"].notna().sum() == 3
    assert effect["family"].iloc[0] == "t: 3 comparisons in t"
    assert a["p_holm"] >= a["p"] and effect.loc[("b", "w8"), "verdict_holm"] == NO_PAPER_VALUE
    for row in judged.itertuples():
        assert row.verdict_holm == decide(row.diff, row.p_holm, row.p_paper_holm, row.paper_diff)
        assert row.p_holm >= row.p and row.p_paper_holm >= row.p_paper


def test_a_comparison_two_tables_share_is_counted_once_in_the_family() -> None:
    """Tables 3, 5, 7 and 8 hold the same SSA-vs-vanilla fine-tune: the same runs and metric are one comparison of
    the paper's family, whichever table is written, and every table gets the same corrected p for it."""
    data = [r | {"run": f"runs/{r['attention']}-s{r['seed']}"} for r in records([60.0, 70.0, 50.0], w8a8_gap=3.0)]
    alone = effects(data, TABLE, "cpu")
    sibling = raw_effects(data, {**TABLE, "name": "u"}, "cpu")  # another table of the same cells
    shared = effects(data, TABLE, "cpu", siblings={"u": sibling})
    assert shared["p_holm"].dropna().tolist() == pytest.approx(alone["p_holm"].dropna().tolist())  # the same 3
    assert shared["family"].iloc[0] == "t: 3 comparisons in t, u"
    other = raw_effects([r | {"run": r["run"] + "-other"} for r in data], {**TABLE, "name": "u"}, "cpu")
    doubled = effects(data, TABLE, "cpu", siblings={"u": other})  # other cells: 3 more comparisons
    assert doubled["family"].iloc[0] == "t: 6 comparisons in t, u"
    assert (doubled["p_holm"].dropna() >= alone["p_holm"].dropna()).all()


def test_all_zero_comparisons_stay_out_of_the_family() -> None:
    """A metric no variant moves at this scale (every paired difference 0) is labelled identical, not judged."""
    data = [r | {"w8a8_perplexity": 12.0} for r in records([60.0, 70.0, 50.0], w8a8_gap=3.0)]
    effect = effects(data, TABLE, "cpu").set_index(["attention", "column"])
    assert effect.loc[("a", "w8"), "verdict"] == IDENTICAL == effect.loc[("a", "w8"), "verdict_holm"]
    assert pd.isna(effect.loc[("a", "w8"), "p_holm"]) and effect["family"].iloc[0] == "t: 2 comparisons in t"


def test_seeds_needed_by_hand() -> None:
    """The fewest seeds whose 95% half-width t(n-1) * sd / sqrt(n) is at most the paper's effect: sd 1 and an effect
    of 1 need 7 (t(5) 2.571 / sqrt(6) = 1.050 is still wider; t(6) 2.447 / sqrt(7) = 0.925 is not)."""
    assert seeds_needed([1.0, 2.0, 3.0], 1.0) == 7
    assert seeds_needed([1.0, 2.0, 3.0], -1.0) == 7  # the effect's size, whichever its side
    assert seeds_needed([1.0, 2.0, 3.0], 1.06) == 6
    assert seeds_needed([0.2, 0.2, 0.2], 0.01) == 2  # no spread: two seeds show it
    assert seeds_needed([0.5], 1.0) is None and seeds_needed([1.0, 2.0], 0.0) is None
    assert seeds_needed([1.0, 2.0], None) is None
    assert seeds_needed([0.0, 100.0], 0.001) == 1001 and seeds_label(1001) == ">1000"
    assert seeds_label(None) == "-" and seeds_label(4.0) == "4"


def test_the_effects_say_how_many_seeds_would_resolve_the_papers_effect() -> None:
    """b's paired differences (0.3, -0.2, 0.1: sd 0.2517) against the paper's -5% of our baseline (10.067: 0.503)
    need 4 seeds (t(2) 4.303 x 0.2517 / sqrt(3) = 0.625 is wider, t(3) 3.182 x 0.2517 / 2 = 0.400 is not); a's
    (sd 0.01) need 2; b's W8A8 has no paper value, so nothing to resolve."""
    data = records([60.0, 70.0, 50.0], w8a8_gap=3.0)
    effect = effects(data, TABLE, "cpu").set_index(["attention", "column"])
    assert effect.loc[("b", "ppl"), "seeds_needed"] == 4
    assert effect.loc[("a", "ppl"), "seeds_needed"] == 2 and effect.loc[("a", "w8"), "seeds_needed"] == 2
    assert pd.isna(effect.loc[("b", "w8"), "seeds_needed"])
    markdown = to_markdown(summarise(data, TABLE, "cpu"), effects(data, TABLE, "cpu"), TABLE, "cpu")
    assert "seeds for paper %" in markdown
    wider = "Seeds: at 3 seeds the interval is wider than the paper's effect in 1 of 3 comparisons;"
    assert f"{wider} 5 seeds would narrow 1 of them enough." in markdown
    vanilla = {r["seed"]: r["perplexity"] for r in data if r["attention"] == "vanilla"}
    # b now 0.5 below vanilla in every seed, give or take 0.001
    tight = [
        r | {"perplexity": vanilla[r["seed"]] - 0.5 - 0.001 * r["seed"]} if r["attention"] == "b" else r for r in data
    ]
    markdown = to_markdown(summarise(tight, TABLE, "cpu"), effects(tight, TABLE, "cpu"), TABLE, "cpu")
    assert "Seeds: at 3 seeds the interval is narrower than the paper's effect in all 3 comparisons." in markdown


def test_the_papers_effect_is_read_as_a_share_of_our_baseline_not_in_its_own_units() -> None:
    """A paper at twice our perplexity (vanilla 20, b 19: -5%) asks b for 0.503 of ours, so 4 seeds, as above; its
    raw difference (1.0) would ask for 3. At -1% (0.1007 of ours) b needs 27 seeds: t(25) 2.060 x 0.2517 / sqrt(26)
    = 0.1016 is still wider, t(26) 2.056 x 0.2517 / sqrt(27) = 0.0996 is not."""
    data = records([60.0, 70.0, 50.0], w8a8_gap=3.0)
    doubled = {**TABLE, "paper": {"pretrain": {"R": {"vanilla": [20.0, 12.0], "a": [18.0, 10.0], "b": [19.0, None]}}}}
    assert effects(data, doubled, "cpu").set_index(["attention", "column"]).loc[("b", "ppl"), "seeds_needed"] == 4
    small = {**TABLE, "paper": {"pretrain": {"R": {"vanilla": [10.0, 12.0], "a": [9.0, 10.0], "b": [9.9, None]}}}}
    effect = effects(data, small, "cpu")
    assert effect.set_index(["attention", "column"]).loc[("b", "ppl"), "seeds_needed"] == 27
    markdown = to_markdown(summarise(data, small, "cpu"), effect, small, "cpu")
    assert "in 1 of 3 comparisons; 5 seeds would narrow none of them enough; it needs 27." in markdown
    assert "| 27 " in markdown and "80% power takes about twice the seeds" in markdown


def test_markdown_opens_with_the_phenomena_and_shows_both_verdicts() -> None:
    data = with_derived(records([4.0, 4.5, 4.1], w8a8_gap=0.5))
    markdown = to_markdown(
        summarise(data, TABLE, "cpu"), effects(data, TABLE, "cpu"), TABLE, "cpu", phenomena(data, TABLE, "cpu")
    )
    assert markdown.index("Is the paper's phenomenon there?") < markdown.index("## pretrain")
    assert "- outliers (pretrain, R, vanilla): **absent**: kurtosis_max 4.2" in markdown
    assert "  - outliers: hand-made" in markdown and "read in that light" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| stage") and "Holm" in line)
    assert [c.strip() for c in header.split("|")][-7:-1] == [
        "p",
        "p paper",
        "verdict",
        "Holm p",
        "Holm p paper",
        "verdict (Holm)",
    ]
    assert "After Holm over t: 3 comparisons in t: reproduces " in markdown
    assert "can go below p = 0.25 (the sign-flip floor)" in markdown


def test_a_table_renders_again_from_its_committed_records(tmp_path) -> None:
    """`make reproduce-<table> RENDER=1`: the Markdown, effects and phenomenon checks rewritten from runs.csv alone."""
    import pandas as pd

    from attnlab.errors import ConfigError
    from attnlab.tables import render

    with pytest.raises(ConfigError, match="render_only: no records to render"):
        render(TABLE, "cpu", results_dir=tmp_path)
    pd.DataFrame(records([60.0, 70.0, 50.0], w8a8_gap=3.0)).to_csv(tmp_path / "runs.csv", index=False)
    markdown = render(TABLE, "cpu", results_dir=tmp_path)
    assert markdown == (tmp_path / "t.md").read_text() and "- outliers (pretrain, R, vanilla): **present**" in markdown
    assert pd.read_csv(tmp_path / "phenomena.csv")["status"].tolist() == [PRESENT, PRESENT, NOT_MEASURED]
    allowed = {REPRODUCES, OPPOSITE, SMALLER, UNRESOLVED, NO_PAPER_VALUE}
    assert set(pd.read_csv(tmp_path / "effects.csv")["verdict_holm"]) <= allowed
    with pytest.raises(ConfigError, match="reports computed from its cells"):
        render(TABLE | {"reports": ["pruning"]}, "cpu", results_dir=tmp_path)


def test_a_check_on_a_variant_reads_that_variants_cells_and_is_not_measured_where_it_did_not_run() -> None:
    """SSA's temperatures have moved from their init (the phenomena search's check): a check on ``variant: a``, not
    the baseline."""
    moved = {"name": "moved", "variant": "a", "conditions": [{"metric": "temperature_token_spread", "at_least": 0.01}]}
    absent_variant = {**moved, "name": "elsewhere", "variant": "c"}
    table = {**TABLE, "phenomena": [moved, absent_variant]}
    rows = records([60.0, 70.0, 50.0], w8a8_gap=3.0)
    for row in rows:
        row["temperature_token_spread"] = {"a": 0.03 * row["seed"], "vanilla": None, "b": 0.0}[row["attention"]]
    checks = phenomena(rows, table, "cpu").set_index("phenomenon")
    assert checks.loc["moved", "status"] == PRESENT and checks.loc["moved", "variant"] == "a"
    assert "temperature_token_spread 0.06 (>= 0.01 needed; 3 seed(s))" in checks.loc["moved", "evidence"]
    assert checks.loc["elsewhere", "status"] == NOT_MEASURED
    either = {**moved, "variant": ["c", "a"]}  # the first the table compares
    assert phenomena(rows, {**table, "phenomena": [either]}, "cpu").iloc[0]["variant"] == "a"
    narrowed = {**table, "scales": {"cpu": {"stage_variants": {"pretrain": ["vanilla"]}}}}
    assert "moved" not in set(phenomena(rows, narrowed, "cpu")["phenomenon"])  # a stage that never runs ``a``
    assert set(phenomena(rows, narrowed, "paper")["phenomenon"]) == {"moved", "elsewhere"}
    for row in rows:
        row["temperature_token_spread"] = 0.0 if row["attention"] == "a" else None  # never left its init
    assert phenomena(rows, table, "cpu").set_index("phenomenon").loc["moved", "status"] == ABSENT


def test_a_paper_range_is_shown_beside_ours_and_never_judged() -> None:
    """Qiu et al. give the mean gate only as "about 0.11-0.25": the table shows the range, and no verdict is drawn
    from it (a difference against a range means nothing)."""
    table = {**TABLE, "paper": {"pretrain": {"R": {"vanilla": [10.0, 12.0], "a": [9.0, [0.11, 0.25]]}}}}
    summary = summarise(records([3, 3, 3], 0.5), table, "cpu")
    a_w8 = summary[(summary["attention"] == "a") & (summary["column"] == "w8")].iloc[0]
    assert pd.isna(a_w8["paper"]) and (a_w8["paper_low"], a_w8["paper_high"]) == (0.11, 0.25)
    a_ppl = summary[(summary["attention"] == "a") & (summary["column"] == "ppl")].iloc[0]
    assert a_ppl["paper"] == a_ppl["paper_low"] == a_ppl["paper_high"] == 9.0
    markdown = to_markdown(summary, effects(records([3, 3, 3], 0.5), table, "cpu"), table, "cpu", None)
    assert "0.110-0.250" in markdown and "9.000" in markdown
    verdicts = effects(records([3, 3, 3], 0.5), table, "cpu").set_index(["attention", "column"])["verdict"]
    assert verdicts[("a", "w8")] == NO_PAPER_VALUE and verdicts[("a", "ppl")] != NO_PAPER_VALUE


OURS = {k: v for k, v in TABLE.items() if k != "paper"} | {
    "variants": ["vanilla", "a", "b", "c"],
    "claims": [
        {"variant": "a", "column": "ppl", "direction": "lower", "says": "a is better", "source": "Paper A 2024"},
        {
            "variant": "a",
            "column": "w8",
            "direction": "higher",
            "says": "a quantises worse",
            "source": "Paper A, fig 2",
        },
        {"variant": "c", "column": "ppl", "direction": "lower", "says": "c is better", "source": "Paper C 2025"},
    ],
}


def test_a_papers_stated_direction_is_judged_and_joins_the_holm_family() -> None:
    """A table of our own comparisons (no paper numbers): each ``claims`` entry is judged like a paper number's sign,
    the rest say "no paper value", and the Markdown shows each claim with its source, ours and its verdicts."""
    data = with_derived(records([4.0, 4.5, 4.1], w8a8_gap=0.5))
    effect = effects(data, OURS, "cpu").set_index(["attention", "column"])
    assert effect.loc[("a", "ppl"), "verdict"] == REPRODUCES  # lower in every seed, as claimed
    assert effect.loc[("a", "w8"), "verdict"] == OPPOSITE  # its W8A8 perplexity is lower too, not higher
    assert effect.loc[("b", "ppl"), "verdict"] == NO_PAPER_VALUE and effect["p_holm"].notna().sum() == 2
    p_values = effect.loc[[("a", "ppl"), ("a", "w8")], "p"].tolist()
    expected = multipletests(p_values, method="holm")[1]  # a direction without a size: one hypothesis each
    assert effect.loc[[("a", "ppl"), ("a", "w8")], "p_holm"].tolist() == pytest.approx(list(expected))
    markdown = to_markdown(summarise(data, OURS, "cpu"), effects(data, OURS, "cpu"), OURS, "cpu", None)
    assert "(paper)" not in markdown and "paper %" not in markdown  # no paper: no columns of dashes
    assert "a `claims` entry gives a direction for" in markdown
    claims = markdown[markdown.index("## The papers' claims") :].splitlines()
    (a_ppl,) = [line for line in claims if "| a is better" in line]
    cells = [c.strip() for c in a_ppl.split("|")]
    assert cells[1:6] == ["a", "ppl", "lower", "a is better", "Paper A 2024"]
    # -1.02 = -(1 + 0.01 x mean seed); vanilla mean 10.067
    assert cells[6].startswith("-1.02 [") and cells[7] == "-10.13%" and cells[8:10] == [REPRODUCES, REPRODUCES]
    (c_ppl,) = [line for line in claims if "| c is better" in line]
    assert [c.strip() for c in c_ppl.split("|")][6:10] == ["not run at this scale", "-", "-", "-"]


@pytest.mark.parametrize(
    ("change", "key"),
    [({"direction": "smaller"}, "direction"), ({"column": "kurtosis"}, "column"), ({"variant": "vanilla"}, "variant")],
)
def test_a_bad_claim_is_one_line_naming_its_key(change: dict, key: str) -> None:
    table = OURS | {"claims": [OURS["claims"][0] | change]}
    with pytest.raises(ConfigError, match=rf"^table\.claims\[0\]\.{key}: one of "):
        effects(records([4.0, 4.5, 4.1], 0.5), table, "cpu")


def test_a_claim_without_a_paired_difference_says_why() -> None:
    """A claim on a column the baseline's cells never measured (cells shared from a table that predates the metric)
    says so, not that the variant did not run; a variant a partial table still trains has no paired cells yet; one
    the scale leaves out is not run at this scale; one paired in a single seed has its difference and no interval."""
    data = with_derived(records([4.0, 4.5, 4.1], w8a8_gap=0.5))
    for record in data:
        if record["attention"] == "vanilla":
            record["w8a8_perplexity"] = float("nan")
    table = OURS | {"stages": {"pretrain": {}}, "scales": {"cpu": {"variants": ["vanilla", "a", "b", "c"]}}}
    done = to_markdown(summarise(data, table, "cpu"), effects(data, table, "cpu"), table, "cpu", None)
    partial = to_markdown(summarise(data, table, "cpu"), effects(data, table, "cpu"), table, "cpu", None, "partial")

    def ours(markdown: str, says: str) -> str:
        (line,) = [line for line in markdown[markdown.index("## The papers' claims") :].splitlines() if says in line]
        return [c.strip() for c in line.split("|")][6]

    assert ours(done, "a quantises worse") == ours(partial, "a quantises worse") == "not measured on vanilla"
    assert ours(done, "a is better").startswith("-1.02 [")
    assert (
        ours(done, "c is better") == "not run at this scale" and ours(partial, "c is better") == "no paired cells yet"
    )
    one_seed = [r for r in data if r["attention"] != "a" or r["seed"] == 1]  # a partial table: a's first seed
    markdown = to_markdown(summarise(one_seed, table, "cpu"), effects(one_seed, table, "cpu"), table, "cpu", None)
    assert ours(markdown, "a is better") == "-1.01 (one seed: no interval)"  # not [-inf, +inf]
