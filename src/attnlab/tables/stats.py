"""The statistics behind a table's verdicts: each variant's paired differences with the baseline (same seed) tested
against no effect and against the paper's effect, four verdicts from those tests, and their correction over the
paper's family of comparisons.

Two tests per comparison, both paired t-tests from scipy:
- *no effect*: ``ttest_rel``, two-sided; its 95% interval is the one the tables print. p < 0.05 exactly when that
  interval excludes 0.
- *an effect at least the paper's* (the paper-side test of a TOST, an equivalence test, at the paper's effect): is
  the mean difference smaller than the paper's in the paper's direction? One-sided at 2.5%, so p < 0.05 (doubled)
  exactly when the 95% interval excludes the paper's effect on the paper's side.

Verdicts, from those p-values: ``reproduces`` (no effect rejected, the mean on the paper's side), ``opposite`` (no
effect rejected, the other side), ``smaller than the paper's`` (no effect not rejected, the paper's effect
rejected), ``unresolved`` (neither: the interval holds 0 and the paper's effect). ``identical``: every paired
difference is exactly 0 (a metric the variant cannot move at this scale): nothing is tested, and it stays out of
the family.

Correction: the two null hypotheses of one comparison exclude each other (the effect cannot be both 0 and at least
the paper's), so at most one of them is true. Holm's step-down then stays valid when each step multiplies by the
most null hypotheses that can still be true together rather than the number of hypotheses left (Shaffer 1986,
logically related hypotheses): at the first true null rejected, every true null is still unrejected, so the
multiplier is at least their count, which is Holm's argument. Per comparison that is one, or more where tables set
several paper numbers against the same cells (two "at least the paper's" can both be true). With one hypothesis per
comparison it is Holm exactly (the tests check it against statsmodels' ``multipletests``); statsmodels has no
variant that counts this way, which is why the step-down is written here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

REPRODUCES, OPPOSITE, SMALLER, UNRESOLVED = "reproduces", "opposite", "smaller than the paper's", "unresolved"
VERDICTS = (REPRODUCES, OPPOSITE, SMALLER, UNRESOLVED)  # in the order the tables count them
IDENTICAL = "identical"  # every paired difference is exactly 0: no test, not in the family
ALPHA = 0.05
CONFIDENCE = 0.95
PERMUTATION_SEEDS = 6  # from here a sign-flip permutation p stands beside the t-test's (below, its floor is >= 0.06)
TOST_NAME = "the paper-side test of a TOST at the paper's effect (one-sided 2.5%: the 95% interval excludes it)"


@dataclass(frozen=True)
class Paired:
    """One comparison's paired differences, tested. ``p``: against no effect; ``p_paper``: against an effect at
    least the paper's (None where the paper gives no size); ``p_signflip``: the exact sign-flip permutation p against
    no effect, from ``PERMUTATION_SEEDS`` seeds (None below)."""

    seeds: int
    mean: float
    low: float
    high: float
    p: float
    p_paper: float | None
    p_signflip: float | None

    @property
    def identical(self) -> bool:
        return self.seeds > 0 and self.mean == 0 and self.low == 0 and self.high == 0


def constant(values: np.ndarray) -> bool:
    """All equal up to rounding (3.1 - 1.1 and 4.1 - 2.1 differ in the last bit): the t statistic is undefined."""
    return bool(np.ptp(values) <= 1e-12 * max(1.0, float(np.max(np.abs(values)))))


def signflip_p(diffs: np.ndarray) -> float:
    """Two-sided exact sign-flip permutation p of the mean (every one of the 2^n sign patterns)."""
    result = stats.permutation_test((diffs,), np.mean, permutation_type="samples", n_resamples=np.inf)
    return float(min(1.0, result.pvalue))


def below_paper_p(diffs: np.ndarray, paper_effect: float) -> float:
    """p of "the effect is at least the paper's, in its direction", doubled (see the module's docstring). Where the
    differences do not vary, the sign-flip test of their distance to the paper's effect stands in for the t-test."""
    shifted = diffs - paper_effect
    if constant(shifted):
        beyond = shifted[0] * paper_effect >= 0  # at or past the paper's effect: nothing says it is smaller
        return 1.0 if beyond else signflip_p(shifted)
    side = "less" if paper_effect > 0 else "greater"
    return float(min(1.0, 2 * stats.ttest_1samp(shifted, 0.0, alternative=side).pvalue))


def paired_test(variant: Sequence[float], baseline: Sequence[float], paper_effect: float | None = None) -> Paired:
    """``variant`` minus ``baseline``, paired by position (seed). Fewer than two seeds: an infinite interval, p 1.
    Differences that do not vary (identical, not all 0) have no t statistic: their interval is that one value and
    their p the sign-flip test's (0.25 at 3 seeds), never 0."""
    a, b = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    diffs = a - b
    n = len(diffs)
    sized = paper_effect is not None and paper_effect != 0 and math.isfinite(paper_effect)
    if n < 2:
        return Paired(n, float(diffs.mean()) if n else math.nan, -math.inf, math.inf, 1.0, 1.0 if sized else None, None)
    mean = float(diffs.mean())
    if not np.any(diffs):
        return Paired(n, 0.0, 0.0, 0.0, 1.0, None, None)
    p_signflip = signflip_p(diffs) if n >= PERMUTATION_SEEDS else None
    if constant(diffs):
        low = high = mean
        p = signflip_p(diffs)
    else:
        result = stats.ttest_rel(a, b)
        interval = result.confidence_interval(CONFIDENCE)
        low, high, p = float(interval.low), float(interval.high), float(result.pvalue)
    p_paper = below_paper_p(diffs, paper_effect) if sized else None
    return Paired(n, mean, low, high, p, p_paper, p_signflip)


def decide(mean: float, p: float, p_paper: float | None, direction: float, alpha: float = ALPHA) -> str:
    """The verdict from the two tests' (raw or corrected) p-values; ``direction``: the sign of the paper's effect."""
    if p < alpha:
        return REPRODUCES if (mean > 0) == (direction > 0) else OPPOSITE
    if p_paper is not None and p_paper < alpha:
        return SMALLER
    return UNRESOLVED


def step_down(hypotheses: Sequence[tuple[Hashable, Hashable | None, float]]) -> list[float]:
    """Adjusted p-values of Holm's step-down where a step multiplies by the most null hypotheses that can still be
    true together, not by the number of hypotheses left. ``hypotheses``: (comparison, paper effect or None, p). Within
    a comparison "no effect" (None) excludes every "an effect at least the paper's", while two of those (two tables
    holding the same cells against two paper numbers) can both be true; so a comparison counts the larger of its
    unrejected paper-side hypotheses and its unrejected "no effect" (1). With one hypothesis per comparison this is
    Holm's own multiplier. Valid under any dependence between the tests."""
    order = sorted(range(len(hypotheses)), key=lambda i: hypotheses[i][2])
    open_zero: dict[Hashable, int] = {}
    open_paper: dict[Hashable, int] = {}
    for comparison, paper, _ in hypotheses:
        counts = open_zero if paper is None else open_paper
        counts[comparison] = counts.get(comparison, 0) + 1

    def could_be_true() -> int:
        return sum(max(open_paper.get(c, 0), open_zero.get(c, 0)) for c in open_zero.keys() | open_paper.keys())

    adjusted, running = [1.0] * len(hypotheses), 0.0
    for i in order:
        comparison, paper, p = hypotheses[i]
        running = max(running, min(1.0, could_be_true() * p))
        adjusted[i] = running
        (open_zero if paper is None else open_paper)[comparison] -= 1
    return adjusted
