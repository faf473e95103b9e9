"""Uncertainty for nas-report: two questions, answered separately.

**(a) Across seeds: does the scheme help when training is repeated?** (the verdict)
The unit is the trained model (the seed). Each run's number is the one its table cell shows
(``summary.json``: corpus BLEU, perplexity, ...; or a diagnostic). :func:`compare_seeds`
pairs the runs by seed and gives the mean paired difference, its Student-t interval and the
paired t-test (n - 1 degrees of freedom); :func:`compare_unpaired` is Welch's t for groups that
share fewer than two seeds. A verdict needs at least :data:`MIN_SEEDS` seeds in both groups:
one seed says nothing about seed-to-seed variation. Below 6 seeds no distribution-free test
over seeds can reach p < 0.05 (a sign-flip test's smallest p is 2^(1-n)), so a verdict at
n = 2-5 rests on the t-test's assumption that the seed-level differences are roughly normal.
The verdict calls a difference significant when the Holm-adjusted p (over the groups compared
with one baseline, per metric) is below 0.05. Simulated with no true effect at 2, 3, 5 and 10
seeds its false-positive rate is at most 5% (``tests/report/test_calibration.py``,
``benchmarks/calibration.py``); :func:`power` and :func:`seeds_needed` say what a sweep can detect.

**(b) On this test set, per trained model** (supporting detail, never a verdict over seeds):
:mod:`nas_cli.report.items` (its names are re-exported here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

#: a verdict over seeds needs at least this many seeds in both groups
MIN_SEEDS = 2
#: the power the "detectable difference" is computed at
POWER = 0.8
ALPHA = 0.05


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int] | None:
    """(mean, low, high, n) with a Student-t interval over ``values``; (mean, nan, nan, 1) for one value."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None
    n = len(vals)
    m = sum(vals) / n
    if n < 2:
        return m, math.nan, math.nan, 1
    from scipy import stats

    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return m, m - half, m + half, n


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given; NaN stays NaN)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m = len(order)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


# ---- power: what a number of seeds can detect --------------------------------------------------------
def power(delta: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided t-test at level ``alpha`` for a true difference ``delta`` when the
    estimate's standard error is ``se`` with ``df`` degrees of freedom: the noncentral t's mass
    beyond the critical values (scipy's ``nct``; where it loses its way far in the tail, at 1-2 df,
    the same mass integrated over the chi-distributed spread estimate)."""
    from scipy import stats

    if not (se > 0 and df >= 1):
        return math.nan
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(delta) / se
    got = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    if not (math.isfinite(got) and 0.0 <= got <= 1.0 + 1e-9):
        got = _power_integral(nc, crit, df)
    return min(1.0, max(0.0, got))


def _power_integral(nc: float, crit: float, df: float) -> float:
    from scipy import integrate, stats

    root = math.sqrt(df)

    def mass(s: float) -> float:  # s = estimated sd / true sd, s * sqrt(df) ~ chi(df)
        return (stats.norm.cdf(nc - crit * s) + stats.norm.cdf(-nc - crit * s)) * stats.chi.pdf(s * root, df) * root

    got, _ = integrate.quad(mass, 0, math.inf, limit=200)
    return float(got)


def detectable(se: float, df: float, target: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true difference a two-sided t-test detects with probability ``target``:
    the noncentrality reaching that power at ``df`` (computed once per df) times ``se``."""
    if not (se > 0 and df >= 1):
        return math.nan
    return _noncentrality(float(df), target, alpha) * se


@lru_cache(maxsize=256)
def _noncentrality(df: float, target: float, alpha: float) -> float:
    from scipy import optimize

    hi = 1.0
    while power(hi, 1.0, df, alpha) < target:
        hi *= 2
    return float(optimize.brentq(lambda d: power(d, 1.0, df, alpha) - target, 0.0, hi, xtol=1e-10 * hi))


def seeds_needed(delta: float, sd: float, paired: bool = True, target: float = POWER, alpha: float = ALPHA,
                 sd_other: float | None = None, cap: int = 1000) -> int | None:
    """Seeds (per group) for power ``target`` at a true difference ``delta``: paired, ``sd`` is
    the spread of the paired differences (t-test, n - 1 df); unpaired, the two groups' spreads
    (Welch, equal group sizes). None when more than ``cap`` would be needed or no spread is known."""
    if not (sd > 0) or delta == 0:
        return None
    for n in range(MIN_SEEDS, cap + 1):
        if paired:
            se, df = sd / math.sqrt(n), n - 1
        else:
            s2 = sd_other if sd_other is not None else sd
            se = math.sqrt((sd ** 2 + s2 ** 2) / n)
            df = _welch_df(sd, s2, n, n)
        if power(delta, se, df, alpha) >= target:
            return n
    return None


def _welch_df(s1: float, s2: float, n1: int, n2: int) -> float:
    a, b = s1 ** 2 / n1, s2 ** 2 / n2
    if a + b == 0:
        return float(n1 + n2 - 2)
    return (a + b) ** 2 / (a ** 2 / (n1 - 1) + b ** 2 / (n2 - 1))


# ---- question (a): over seeds ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """One metric of one group against the baseline, over seeds (the verdict)."""

    metric: str
    seeds: list  # the paired seeds (paired), or every seed of the system group (unpaired)
    base_mean: float
    sys_mean: float
    diff: float  # mean over paired seeds of (system - baseline); unpaired: difference of the means
    low: float
    high: float
    p: float
    test: str  # what gave p, in words
    p_adj: float | None = None  # after Holm
    n_base: int = 0
    n_sys: int = 0
    paired: bool = True
    se: float = math.nan  # standard error of ``diff``
    df: float = math.nan
    sd: float = math.nan  # spread of the paired differences (paired) or of the baseline group (unpaired)
    sd_other: float | None = None  # unpaired: the system group's spread
    detect: float | None = None  # a difference the user asked about (--detect)
    items: list = field(default_factory=list)  # question (b): ItemComparison per paired seed
    undefined: str | None = None  # why the metric has no value for these runs by design (then no test)
    outlier: object | None = None  # paired: the seed whose difference is an outlier (nas_cli.report.robust)
    without_outlier: tuple | None = None  # (difference, p) of the paired t-test without that seed
    signflip_p: float | None = None  # paired, from 6 seeds: the exact sign-flip test's p
    equivalence: object | None = None  # --equivalence: the TOST verdict (nas_cli.report.equivalence)
    selection_shift: float | None = None  # tuned on the verdict seeds: the lift taken off diff (report.selection)

    @property
    def n(self) -> int:
        return len(self.seeds) if self.paired else min(self.n_base, self.n_sys)

    @property
    def testable(self) -> bool:
        return not math.isnan(self.p)

    def direction(self, alpha: float = ALPHA) -> int:
        """+1 / -1: the system's number is significantly higher / lower than the baseline's over
        seeds (Holm-adjusted p below ``alpha``); 0: not, or no test (fewer than 2 seeds)."""
        p = self.p_adj if self.p_adj is not None else self.p
        if math.isnan(p) or not (p < alpha and self.diff != 0):
            return 0
        return 1 if self.diff > 0 else -1

    def detectable(self) -> float:
        """The smallest true difference this comparison detects with 80% power at the observed spread."""
        return detectable(self.se, self.df)

    def needed(self, delta: float | None = None) -> int | None:
        """Seeds per group for 80% power at ``delta`` (default: ``--detect``), at the observed spread."""
        delta = self.detect if delta is None else delta
        if delta is None:
            return None
        return seeds_needed(delta, self.sd, self.paired, sd_other=self.sd_other)

    def verdict(self, higher_is_better: bool | None, alpha: float = ALPHA) -> str:
        """'better'/'worse' (or 'higher'/'lower' for a number with no better direction, such as
        head diversity) with p, or 'no significant difference' with n, the interval and p, or
        'no verdict' when a group has fewer than :data:`MIN_SEEDS` seeds."""
        p = self.p_adj if self.p_adj is not None else self.p
        if self.undefined:
            return f"not compared: {self.undefined}"
        if math.isnan(p):
            return (f"no verdict (n={self.n}: a verdict over seeds needs at least {MIN_SEEDS} "
                    f"{'paired ' if self.paired else ''}seeds in both groups)")
        d = self.direction(alpha)
        if d == 0:
            ci = "" if math.isnan(self.low) else f", CI {self.low:+.3g}..{self.high:+.3g}"
            return f"no significant difference (n={self.n}{ci}, {_p(p, 'p')})"
        if higher_is_better is None:
            return f"{'higher' if d > 0 else 'lower'} ({_p(p, 'p')})"
        return f"{'better' if (d > 0) == higher_is_better else 'worse'} ({_p(p, 'p')})"


    def cautions(self) -> list[str]:
        """Where the verdict leans on the t-test's assumption (:mod:`nas_cli.report.robust`): an
        outlying seed, and from 6 seeds an exact sign-flip p on the other side of 0.05."""
        out = []
        if self.outlier:
            o, (diff, p) = self.outlier, self.without_outlier
            with_it = self.p < ALPHA
            without = p < ALPHA and (diff > 0) == (self.diff > 0)
            rests = ("the verdict rests on it" if with_it != without
                     else "the verdict is the same without it")
            out.append(f"seed {o['seed']}'s difference ({o['difference']:+.3g}) is an outlier among the {self.n} "
                       f"seeds (leave-one-out t, Bonferroni {_p(o['p'], 'p')}), which puts the t-test's normality "
                       f"assumption in doubt; without seed {o['seed']}: {diff:+.3g}, {_p(p, 'p')}: {rests}")
        if self.signflip_p is not None and (self.signflip_p < ALPHA) != (self.p < ALPHA):
            out.append(f"the exact sign-flip test over the {self.n} seeds disagrees about significance: "
                       f"{_p(self.signflip_p, 'p')} against the t-test's {_p(self.p, 'p')}")
        return out


def _p(p: float, name: str = "") -> str:
    """'<0.001', '0.123', or four decimals near 0.05 (0.0497 is not shown as 0.050)."""
    text = "<0.001" if p < 0.001 else f"{p:.4f}" if 0.045 <= p < 0.055 else f"{p:.3f}"
    if name:
        return f"{name}{text}" if text.startswith("<") else f"{name}={text}"
    return text


def compare_seeds(metric: str, base: Sequence[float], system: Sequence[float], seeds: Sequence,
                  level: float = 0.95) -> Comparison:
    """Paired over seeds (``base[i]``, ``system[i]`` share ``seeds[i]``): the mean paired
    difference, its Student-t interval and the paired t-test's two-sided p (scipy's
    ``ttest_rel``, n - 1 df). One pair: the difference, no interval, no test. Differences without
    spread (all equal): p = 1 when they are 0, else the exact sign-flip p 2^(1-n), which no
    parametric assumption is needed for (0.5 at 2 seeds: no verdict below 6 seeds). From 3 seeds,
    the checks of :mod:`nas_cli.report.robust` too (an outlying seed; from 6, the sign-flip p)."""
    b, s = np.asarray(base, dtype=np.float64), np.asarray(system, dtype=np.float64)
    c = _paired(metric, b, s, seeds, level)
    if c.n >= 3 and math.isfinite(c.p):
        _robustness(c, b, s, level)
    return c


def _paired(metric: str, b: np.ndarray, s: np.ndarray, seeds: Sequence, level: float) -> Comparison:
    """:func:`compare_seeds` without the robustness checks."""
    from scipy import stats as sps

    d = s - b
    n = len(d)
    test = f"paired t-test over seeds ({n - 1} df)"
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    se, df = (sd / math.sqrt(n), n - 1) if n > 1 else (math.nan, math.nan)
    if n < MIN_SEEDS:
        low = high = p = math.nan
    elif not np.any(d != d[0]):  # equal differences: no spread, the t statistic is undefined
        low = high = float(d[0])
        p = 1.0 if d[0] == 0 else 2.0 ** (1 - n)
        test = ("no difference at any seed" if d[0] == 0
                else f"sign-flip test over seeds (equal differences at all {n} seeds)")
    else:
        import warnings

        _, low, high, _ = t_interval(d.tolist(), level)
        with warnings.catch_warnings():  # nearly equal differences: scipy warns of round-off, the p is still right
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(sps.ttest_rel(s, b).pvalue)
    return Comparison(metric, list(seeds), float(b.mean()), float(s.mean()), float(d.mean()), low, high, p, test,
                      n_base=n, n_sys=n, paired=True, se=se, df=df, sd=sd)


def _robustness(c: Comparison, b: np.ndarray, s: np.ndarray, level: float) -> None:
    """The checks of :mod:`nas_cli.report.robust` on a paired comparison's differences: an
    outlying seed (and the paired test without it), and from 6 seeds the exact sign-flip p."""
    from nas_cli.report import robust

    d = s - b
    found = robust.outlier_seed(d)
    if found is not None:
        c.outlier = {"seed": c.seeds[found.index], "p": found.p, "t": found.t,
                     "difference": float(d[found.index])}
        keep = np.arange(len(d)) != found.index
        rest = _paired(c.metric, b[keep], s[keep], [x for x, k in zip(c.seeds, keep) if k], level)
        c.without_outlier = (rest.diff, rest.p)
    if len(d) >= robust.SIGNFLIP_MIN_SEEDS:
        c.signflip_p = robust.signflip_p(d)


def compare_unpaired(metric: str, base: Sequence[float], system: Sequence[float], seeds: Sequence = (),
                     level: float = 0.95) -> Comparison:
    """Groups that share fewer than 2 seeds: difference of the means, Welch's interval and
    t-test (scipy's ``ttest_ind(equal_var=False)``); no test unless both groups have 2 runs."""
    from scipy import stats as sps

    b, s = np.asarray(base, dtype=np.float64), np.asarray(system, dtype=np.float64)
    nb, ns = len(b), len(s)
    diff = float(s.mean() - b.mean())
    test = "Welch's t-test over seeds (unpaired: the groups share fewer than 2 seeds)"
    c = Comparison(metric, list(seeds), float(b.mean()), float(s.mean()), diff, math.nan, math.nan, math.nan,
                   test, n_base=nb, n_sys=ns, paired=False)
    if nb < MIN_SEEDS or ns < MIN_SEEDS:
        return c
    sb, ss = float(b.std(ddof=1)), float(s.std(ddof=1))
    c.sd, c.sd_other = sb, ss
    c.se = math.sqrt(sb ** 2 / nb + ss ** 2 / ns)
    if c.se == 0:
        c.low = c.high = diff
        c.p = 1.0 if diff == 0 else math.nan  # no spread at all: nothing to test against
        return c
    c.df = _welch_df(sb, ss, nb, ns)
    half = float(sps.t.ppf(0.5 + level / 2, c.df)) * c.se
    c.low, c.high = diff - half, diff + half
    c.p = float(sps.ttest_ind(s, b, equal_var=False).pvalue)
    return c


def trend_over_seeds(metric: str, points: dict, level: float = 0.95) -> tuple[Comparison, dict]:
    """Does a paired difference change with a setting (e.g. CODA - UNAS BLEU against log2(heads))?

    ``points`` maps each seed to its ``[(x, y), ...]``: y the paired difference of that seed at
    setting x. Each seed gets its own least-squares slope of y on x (the seed stays the unit:
    the points of one seed share its data order and initialization, so they are not independent
    replicates), and the slopes are tested against 0 with a one-sample t-test over seeds
    (n - 1 df) and a Student-t interval, exactly as :func:`compare_seeds` tests paired
    differences. A seed with fewer than two distinct x values has no slope and is left out.
    Returns the comparison (``diff`` = the mean slope, per unit of x) and ``{seed: slope}``."""
    slopes = {}
    for seed, pts in points.items():
        x = np.asarray([p[0] for p in pts], dtype=np.float64)
        y = np.asarray([p[1] for p in pts], dtype=np.float64)
        if len(np.unique(x)) < 2:
            continue
        xc = x - x.mean()
        slopes[seed] = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
    seeds = sorted(slopes)
    c = compare_seeds(metric, [0.0] * len(seeds), [slopes[s] for s in seeds], seeds, level)
    c.test = c.test.replace("paired t-test over seeds", "t-test of the per-seed slopes")
    return c, slopes
