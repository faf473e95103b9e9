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

**(b) On this test set, per trained model: is this model better than that one on these
sentences?** (supporting detail, never a verdict over seeds)
:func:`compare_items` compares two runs of one seed on their per-item test outputs:

- BLEU, chrF, perplexity, ROUGE: paired approximate randomization with ties counted,
  p = (1 + #{|d*| >= |d|}) / (R + 1); exact (every swap pattern enumerated) when at most
  :data:`EXACT_MAX` items differ, else R random swap patterns, stopping early (Besag and
  Clifford 1991) once :data:`SEQUENTIAL_H` patterns were at least as extreme;
- exact match: McNemar's exact test (binomial test on the discordant items);
- an interval: the paired bootstrap over test items (percentile, 95%).

Every resample is a sum of per-item sufficient statistics (sacreBLEU's for BLEU and chrF, the
NLL sum and token count for perplexity), extracted once per run and resampled as a matrix
product; the corpus score of a sum is computed the way sacreBLEU computes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

#: default numbers of resamples
BOOTSTRAP_SAMPLES = 1000
AR_TRIALS = 10000
SEED = 12345
#: a verdict over seeds needs at least this many seeds in both groups
MIN_SEEDS = 2
#: approximate randomization enumerates every swap pattern when at most this many items differ
EXACT_MAX = 16
#: ... and otherwise stops once this many random patterns were at least as extreme
SEQUENTIAL_H = 50
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
    parametric assumption is needed for (0.5 at 2 seeds: no verdict below 6 seeds)."""
    from scipy import stats as sps

    b, s = np.asarray(base, dtype=np.float64), np.asarray(system, dtype=np.float64)
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


# ---- per-item statistics and corpus scores -------------------------------------------------------------
@dataclass
class Metric:
    """How one test metric is computed from per-item statistics of one run."""

    name: str  # summary key, e.g. test/bleu
    higher_is_better: bool
    stats: Callable[[dict], np.ndarray]  # items -> (n_items, k) statistics
    score: Callable[[np.ndarray], float]  # summed statistics (k,) -> corpus score (the reference)
    vscore: Callable[[np.ndarray], np.ndarray]  # (..., k) summed statistics -> (...) scores, vectorized
    test: str  # "ar" | "mcnemar"
    integer: bool = True  # statistics are counts (exact in float32 sums)


def _sacre(kind: str):
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(force=True) if kind == "bleu" else CHRF()  # force: the text is scored as the run scored it


#: sacreBLEU metrics with their references' n-grams cached, by (kind, the references' fingerprint):
#: every run of a sweep is scored against the same references, which are processed once
_WITH_REFS: dict[tuple[str, str], object] = {}


def _sacre_stats(kind: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        import hashlib

        refs = items["refs"]
        key = (kind, hashlib.sha256("\n".join(refs).encode()).hexdigest())
        metric = _WITH_REFS.get(key)
        if metric is None:
            metric = _sacre(kind)
            metric._ref_cache = metric._cache_references([refs])
            _WITH_REFS.clear()  # one test set at a time (nas-report refuses a mix)
            _WITH_REFS[key] = metric
        return np.asarray(metric._extract_corpus_statistics(items["hyps"], None), dtype=np.float64)
    return stats


def _sacre_score(kind: str) -> Callable[[np.ndarray], float]:
    metric = _sacre(kind)
    return lambda total: float(metric._compute_score_from_stats(list(total)).score)


def bleu_from_stats(s: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (default: exp smoothing, 4-grams) of summed statistics
    ``[sys_len, ref_len, correct_1..4, total_1..4]`` along the last axis, vectorized."""
    s = np.asarray(s, dtype=np.float64)
    sys_len, ref_len = s[..., 0], s[..., 1]
    correct, total = s[..., 2:6], s[..., 6:10]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        zero = correct == 0
        smooth = 2.0 ** np.cumsum(zero, axis=-1)  # exp smoothing: 2, 4, 8 ... over the orders without matches
        prec = np.where(zero, 100.0 / (smooth * total), 100.0 * correct / total)
        logs = np.log(prec)
        mean_log = (((logs[..., 0] + logs[..., 1]) + logs[..., 2]) + logs[..., 3]) / 4
        score = bp * np.exp(mean_log)
    dead = (total == 0).any(-1) | ~(correct > 0).any(-1)  # sacreBLEU: no matches or an order without n-grams
    return np.where(dead, 0.0, score)


def chrf_from_stats(s: np.ndarray, order: int = 6, beta: int = 2) -> np.ndarray:
    """sacreBLEU's chrF (character 6-grams, beta 2, effective-order averaging) of summed statistics
    ``[hyp, ref, match] x order`` along the last axis, vectorized."""
    s = np.asarray(s, dtype=np.float64)
    hyp, ref, match = s[..., 0::3][..., :order], s[..., 1::3][..., :order], s[..., 2::3][..., :order]
    factor = beta ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(hyp > 0, match / hyp, 1e-16)
        rec = np.where(ref > 0, match / ref, 1e-16)
        eff = (hyp > 0) & (ref > 0)
        count = eff.sum(-1)
        avg_p = np.where(count > 0, (prec * eff).sum(-1) / np.maximum(count, 1), 0.0)
        avg_r = np.where(count > 0, (rec * eff).sum(-1) / np.maximum(count, 1), 0.0)
        score = 100 * (1 + factor) * avg_p * avg_r / (factor * avg_p + avg_r)
    return np.where(avg_p + avg_r > 0, score, 0.0)


def _rouge_stats(key: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer([key], use_stemmer=True)
        f = [scorer.score(r, h)[key].fmeasure * 100 for h, r in zip(items["hyps"], items["refs"])]
        return np.stack([np.asarray(f), np.ones(len(f))], axis=1)
    return stats


def _mean_score(total: np.ndarray) -> float:
    return float(total[0] / max(total[1], 1))


def _vmean(total: np.ndarray) -> np.ndarray:
    return total[..., 0] / np.maximum(total[..., 1], 1)


def _vppl(total: np.ndarray) -> np.ndarray:
    return np.exp(np.minimum(total[..., 0] / np.maximum(total[..., 1], 1), 50))


METRICS: dict[str, Metric] = {
    "test/bleu": Metric("test/bleu", True, _sacre_stats("bleu"), _sacre_score("bleu"), bleu_from_stats, "ar"),
    "test/chrf": Metric("test/chrf", True, _sacre_stats("chrf"), _sacre_score("chrf"), chrf_from_stats, "ar"),
    "test/exact_match": Metric("test/exact_match", True,
                               lambda it: np.stack([np.asarray(it["exact"], float), np.ones(len(it["exact"]))], 1),
                               _mean_score, _vmean, "mcnemar"),
    "test/ppl": Metric("test/ppl", False,
                       lambda it: np.stack([np.asarray(it["nll"], float), np.asarray(it["tokens"], float)], 1),
                       lambda t: float(math.exp(min(t[0] / max(t[1], 1), 50))), _vppl, "ar", integer=False),
    **{f"test/{k}": Metric(f"test/{k}", True, _rouge_stats(k), _mean_score, _vmean, "ar", integer=False)
       for k in ("rouge1", "rouge2", "rougeL")},
}


def needs_text(metric: str) -> bool:
    return metric in ("test/bleu", "test/chrf") or metric.startswith("test/rouge")


# ---- question (b): one seed's two models on the test set ----------------------------------------------
@dataclass
class ItemComparison:
    """Two runs of one seed compared on their test items (not a verdict over seeds)."""

    metric: str
    seed: object
    base: float
    system: float
    diff: float
    low: float  # paired bootstrap over the items
    high: float
    p: float
    test: str
    differing: int = 0  # items whose statistics differ between the two runs


def _chunks(total: int, size: int):
    done = 0
    while done < total:
        yield min(size, total - done)
        done += size


def ar_test(vscore: Callable[[np.ndarray], np.ndarray], base: np.ndarray, system: np.ndarray, trials: int,
            rng: np.random.Generator, exact_max: int = EXACT_MAX, h: int = SEQUENTIAL_H,
            dtype=np.float64) -> tuple[float, str, int]:
    """Paired approximate randomization, ties counted: (p, how, differing items). Each trial
    swaps each item's two statistics rows with probability 1/2 and recomputes the difference of
    corpus scores; p counts the trials with |d*| >= |d| (within round-off). Items with equal rows
    cannot change anything and are left out. At most ``exact_max`` differing items: every one of
    the 2^k swap patterns (the exact permutation p). Otherwise ``trials`` random patterns,
    p = (1 + count) / (trials + 1), stopping at the ``h``-th pattern at least as extreme
    (Besag-Clifford: p = h / patterns drawn), which is as valid and much faster when p is large."""
    base = np.asarray(base, dtype=np.float64)
    system = np.asarray(system, dtype=np.float64)
    sb, ss = base.sum(0), system.sum(0)
    observed = float(vscore(ss) - vscore(sb))
    delta = base - system  # swapping item i moves delta[i] into the system's sum and out of the baseline's
    keep = np.any(delta != 0, axis=1)
    delta = delta[keep]
    k = int(keep.sum())
    if k == 0:
        return 1.0, "no item differs", 0
    tol = 1e-9 * max(1.0, abs(observed))

    def extreme(masks: np.ndarray) -> np.ndarray:
        moved = masks.astype(dtype) @ delta.astype(dtype)
        d = vscore(ss + moved) - vscore(sb - moved)
        return np.abs(d) >= abs(observed) - tol

    if k <= exact_max:
        patterns = ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1).astype(np.float64)
        count = int(extreme(patterns).sum())
        return count / 2 ** k, f"exact permutation test ({k} differing items, all {2 ** k} swap patterns)", k
    count = drawn = 0
    for size in _chunks(trials, 1000):
        masks = rng.integers(0, 2, size=(size, k), dtype=np.int8)
        hits = extreme(masks)
        cum = np.cumsum(hits)
        if count + cum[-1] >= h:  # the h-th extreme pattern is in this chunk
            at = int(np.searchsorted(cum, h - count)) + 1
            return h / (drawn + at), (f"approximate randomization, ties counted (stopped after {h} of "
                                      f"{drawn + at} patterns at least as extreme)"), k
        count += int(cum[-1])
        drawn += size
    return (count + 1) / (drawn + 1), f"approximate randomization, ties counted ({drawn} trials)", k


def bootstrap_interval(vscore: Callable[[np.ndarray], np.ndarray], base: np.ndarray, system: np.ndarray,
                       samples: int, rng: np.random.Generator, level: float = 0.95,
                       dtype=np.float64) -> tuple[float, float]:
    """Percentile interval of score(system) - score(baseline) over ``samples`` resamples of the
    items (the same items for both: paired), as count vectors times the statistics matrices."""
    n = base.shape[0]
    both = np.concatenate([system, base], axis=1).astype(dtype)
    kdim = system.shape[1]
    out = []
    for size in _chunks(samples, 250):
        idx = rng.integers(0, n, size=(size, n))
        flat = (idx + (np.arange(size) * n)[:, None]).ravel()
        counts = np.bincount(flat, minlength=size * n).reshape(size, n).astype(dtype)
        sums = counts @ both
        out.append(vscore(sums[:, :kdim].astype(np.float64)) - vscore(sums[:, kdim:].astype(np.float64)))
    boot = np.concatenate(out)
    a = (1 - level) / 2 * 100
    low, high = np.percentile(boot, [a, 100 - a])
    return float(low), float(high)


def compare_items(metric: str, base_stats: np.ndarray, system_stats: np.ndarray, seed=None,
                  samples: int = BOOTSTRAP_SAMPLES, trials: int = AR_TRIALS, rng_seed: int = SEED,
                  base_items: dict | None = None, system_items: dict | None = None) -> ItemComparison:
    """Two runs of one seed on the same test items, from their per-item statistics
    (``Metric.stats``): the corpus scores as sacreBLEU computes them, the difference, a paired
    bootstrap interval over the items, and the item-level p (AR with ties, or McNemar)."""
    spec = METRICS[metric]
    import zlib

    # a stable stream per seed (str hashes change between processes: the same report must repeat)
    rng = np.random.default_rng([rng_seed, zlib.crc32(str(seed).encode())])
    b, s = spec.score(base_stats.sum(0)), spec.score(system_stats.sum(0))
    dtype = np.float32 if spec.integer and max(base_stats.sum(0).max(), system_stats.sum(0).max()) < 2 ** 23 \
        else np.float64
    low, high = bootstrap_interval(spec.vscore, base_stats, system_stats, samples, rng, dtype=dtype)
    if spec.test == "mcnemar":
        p, differing = _mcnemar(base_stats[:, 0], system_stats[:, 0])
        test = "McNemar exact test (discordant items)"
    else:
        p, test, differing = ar_test(spec.vscore, base_stats, system_stats, trials, rng, dtype=dtype)
    return ItemComparison(metric, seed, b, s, s - b, low, high, float(p), test, differing)


def _mcnemar(base: np.ndarray, system: np.ndarray) -> tuple[float, int]:
    from scipy import stats

    only_s, only_b = int(((system == 1) & (base == 0)).sum()), int(((system == 0) & (base == 1)).sum())
    if only_s + only_b == 0:
        return 1.0, 0
    return float(stats.binomtest(only_s, only_s + only_b, 0.5).pvalue), only_s + only_b
