"""Equivalence verdicts (``nas-report --equivalence bleu=0.5``): is the system within ±margin of the
baseline? Two one-sided tests (TOST, Schuirmann 1987) on the same seed-level numbers as the
difference verdict: with d the mean paired difference (system - baseline), se its standard error
and df its degrees of freedom (n - 1 paired; Welch's for unpaired groups),

    p_lower = P(T_df >= (d + margin) / se)     H0: true difference <= -margin
    p_upper = P(T_df <= (d - margin) / se)     H0: true difference >= +margin
    p_TOST  = max(p_lower, p_upper)

"equivalent within ±margin" when p_TOST, Holm-adjusted over the groups compared with the baseline
(as the difference verdicts are), is below 0.05; the same as the 90% interval lying inside
(-margin, +margin) for a single comparison. A true difference exactly at the margin is called
equivalent in at most 5% of experiments (benchmarks/equivalence_calibration.py measures it).
Differences without spread (every seed the same difference) have no t statistic: no verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from nas_cli.report.stats import ALPHA, MIN_SEEDS, holm


@dataclass
class Equivalence:
    margin: float
    p: float  # p_TOST
    p_adj: float | None = None  # after Holm
    low90: float = math.nan  # the (1 - 2 alpha) interval of the difference
    high90: float = math.nan
    n: int = 0

    @property
    def equivalent(self) -> bool:
        p = self.p_adj if self.p_adj is not None else self.p
        return not math.isnan(p) and p < ALPHA

    def verdict(self) -> str:
        p = self.p_adj if self.p_adj is not None else self.p
        if math.isnan(p):
            return f"no equivalence verdict (n={self.n}: needs at least {MIN_SEEDS} seeds and some spread)"
        shown = "<0.001" if p < 0.001 else f"={p:.3f}"
        ci = f"90% CI {self.low90:+.3g}..{self.high90:+.3g}"
        if self.equivalent:
            return f"equivalent within ±{self.margin:g} (n={self.n}, {ci}, p(TOST){shown})"
        return f"not shown equivalent within ±{self.margin:g} (n={self.n}, {ci}, p(TOST){shown})"


def tost_p(diff: float, se: float, df: float, margin: float) -> float:
    """p_TOST of a difference ``diff`` with standard error ``se`` on ``df`` degrees of freedom."""
    from scipy import stats as sps

    if not (margin > 0) or any(math.isnan(x) for x in (diff, se, df)) or se <= 0:
        return math.nan
    p_lower = float(sps.t.sf((diff + margin) / se, df))
    p_upper = float(sps.t.cdf((diff - margin) / se, df))
    return max(p_lower, p_upper)


def tost(comparison, margin: float) -> Equivalence:
    """The equivalence test of one :class:`~nas_cli.report.stats.Comparison` at ``margin``."""
    from scipy import stats as sps

    c = comparison
    p = math.nan if c.undefined or c.n < MIN_SEEDS else tost_p(c.diff, c.se, c.df, margin)
    out = Equivalence(margin, p, n=c.n)
    if not math.isnan(p):
        half = float(sps.t.ppf(1 - ALPHA, c.df)) * c.se
        out.low90, out.high90 = c.diff - half, c.diff + half
    return out


def attach(comparisons: Sequence, margin: float) -> None:
    """Each comparison of one metric gets its ``equivalence``, Holm-adjusted over them."""
    found = [tost(c, margin) for c in comparisons]
    for e, p in zip(found, holm([e.p for e in found])):
        e.p_adj = None if math.isnan(p) else p
    for c, e in zip(comparisons, found):
        c.equivalence = e
