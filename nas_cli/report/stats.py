"""Uncertainty for nas-report: intervals over seeds, paired tests on the test set, Holm.

* **Over seeds** (:func:`t_interval`): the mean of a group's runs with a 95% Student-t interval,
  mean ± t(0.975, n-1) · s / sqrt(n). With 2-5 seeds a bootstrap over seeds has too few distinct
  resamples to be trusted, the t interval is the standard choice; with n = 1 there is no interval.
* **Against a baseline, on the test set** (:func:`compare`): runs are paired by seed (seeds
  both groups have). The difference is the mean over paired seeds of (system − baseline). Its 95%
  interval comes from a *hierarchical paired bootstrap*: each of ``samples`` draws resamples the
  paired seeds and the test items (the same items for both systems and every seed) and recomputes
  each corpus-level metric from per-item statistics (BLEU and chrF from sacreBLEU's sufficient
  statistics, perplexity from per-item NLL sums and token counts, ROUGE and exact match as means
  over items). Its p-value:

  - BLEU, chrF: sacreBLEU's paired approximate randomization (``sacrebleu.significance.PairedTest``,
    10,000 trials) on the paired seeds' test sets concatenated (items = seed × sentence); sacreBLEU's
    paired bootstrap (1,000) is reported beside it;
  - exact match: McNemar's exact test (binomial test on the discordant items, pooled over seeds);
  - perplexity, ROUGE: the paired bootstrap above, two-sided (twice the smaller tail beyond 0).

  Identical outputs give p = 1 (sacreBLEU would report 1/(trials+1) for a zero difference).
* **Against a baseline, over seeds** (:func:`compare_seeds`): for numbers a run has once, not per
  test item (head JSD, explained-away share, the log-mass margin: the attention diagnostics), the
  paired differences over seeds get a Student-t interval and a paired t-test (scipy's
  ``ttest_rel``, n - 1 degrees of freedom); one paired seed gives the difference and no test.
* :func:`holm`: Holm's step-down adjustment when several groups are compared with one baseline.

The verdict calls a difference significant only when the (Holm-adjusted) p-value is below 0.05
**and** the 95% interval excludes 0: the paired tests on pooled test items treat every
(seed, item) pair as independent, while the interval also resamples the seeds, so requiring both
keeps seed-to-seed variation from being mistaken for an effect.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

#: default numbers of resamples (as sacreBLEU's defaults)
BOOTSTRAP_SAMPLES = 1000
AR_TRIALS = 10000
SEED = 12345


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


# ---- per-item statistics and corpus scores ---------------------------------------------------------
@dataclass
class Metric:
    """How one test metric is computed from per-item statistics of one run."""

    name: str  # summary key, e.g. test/bleu
    higher_is_better: bool
    stats: Callable[[dict], np.ndarray]  # items -> (n_items, k) statistics
    score: Callable[[np.ndarray], float]  # summed statistics (k,) -> corpus score
    test: str  # "ar" | "mcnemar" | "bootstrap"


def _sacre(kind: str):
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU() if kind == "bleu" else CHRF()


def _sacre_stats(kind: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        metric = _sacre(kind)
        return np.asarray(metric._extract_corpus_statistics(items["hyps"], [items["refs"]]), dtype=np.float64)
    return stats


def _sacre_score(kind: str) -> Callable[[np.ndarray], float]:
    metric = _sacre(kind)
    return lambda total: float(metric._compute_score_from_stats(list(total)).score)


def _rouge_stats(key: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer([key], use_stemmer=True)
        f = [scorer.score(r, h)[key].fmeasure * 100 for h, r in zip(items["hyps"], items["refs"])]
        return np.stack([np.asarray(f), np.ones(len(f))], axis=1)
    return stats


def _mean_score(total: np.ndarray) -> float:
    return float(total[0] / max(total[1], 1))


METRICS: dict[str, Metric] = {
    "test/bleu": Metric("test/bleu", True, _sacre_stats("bleu"), _sacre_score("bleu"), "ar"),
    "test/chrf": Metric("test/chrf", True, _sacre_stats("chrf"), _sacre_score("chrf"), "ar"),
    "test/exact_match": Metric("test/exact_match", True,
                               lambda it: np.stack([np.asarray(it["exact"], float), np.ones(len(it["exact"]))], 1),
                               _mean_score, "mcnemar"),
    "test/ppl": Metric("test/ppl", False,
                       lambda it: np.stack([np.asarray(it["nll"], float), np.asarray(it["tokens"], float)], 1),
                       lambda t: float(math.exp(min(t[0] / max(t[1], 1), 50))), "bootstrap"),
    **{f"test/{k}": Metric(f"test/{k}", True, _rouge_stats(k), _mean_score, "bootstrap")
       for k in ("rouge1", "rouge2", "rougeL")},
}


def needs_text(metric: str) -> bool:
    return metric in ("test/bleu", "test/chrf") or metric.startswith("test/rouge")


@dataclass
class Comparison:
    metric: str
    seeds: list[int]  # paired seeds
    base_mean: float
    sys_mean: float
    diff: float  # mean over paired seeds of (system - baseline)
    low: float
    high: float
    p: float
    test: str  # what gave p, in words
    p_bs: float | None = None  # sacreBLEU's paired bootstrap p (BLEU/chrF)
    p_adj: float | None = None  # after Holm

    def direction(self, alpha: float = 0.05) -> int:
        """+1 / -1: the system's number is significantly higher / lower than the baseline's; 0: not
        (or no test). Significant only if the (Holm-adjusted) p says so AND the interval, which also
        resamples the seeds, excludes 0: a test-set p-value alone ignores seed-to-seed variation."""
        p = self.p_adj if self.p_adj is not None else self.p
        if math.isnan(p) or not (p < alpha and self.diff != 0 and (self.low > 0 or self.high < 0)):
            return 0
        return 1 if self.diff > 0 else -1

    def verdict(self, higher_is_better: bool | None, alpha: float = 0.05) -> str:
        """'better'/'worse' (or 'higher'/'lower' for a number with no better direction, such as
        head diversity) with p, or 'no significant difference' with n, the interval and p."""
        p = self.p_adj if self.p_adj is not None else self.p
        n = len(self.seeds)
        if math.isnan(p):
            return f"no test (n={n}: a test over seeds needs at least 2 paired seeds)"
        d = self.direction(alpha)
        if d == 0:
            return f"no significant difference (n={n}, CI {self.low:+.3g}..{self.high:+.3g}, {_p(p, 'p')})"
        if higher_is_better is None:
            return f"{'higher' if d > 0 else 'lower'} ({_p(p, 'p')})"
        return f"{'better' if (d > 0) == higher_is_better else 'worse'} ({_p(p, 'p')})"


def _p(p: float, name: str = "") -> str:
    if name:
        return f"{name}<0.001" if p < 0.001 else f"{name}={p:.3f}"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def compare(metric: str, base: Sequence[dict], system: Sequence[dict], seeds: Sequence[int],
            samples: int = BOOTSTRAP_SAMPLES, trials: int = AR_TRIALS, seed: int = SEED) -> Comparison:
    """Compare paired runs' per-item test outputs (``base[i]`` and ``system[i]`` share ``seeds[i]``)."""
    spec = METRICS[metric]
    b_stats = [spec.stats(it) for it in base]
    s_stats = [spec.stats(it) for it in system]
    b_scores = [spec.score(st.sum(0)) for st in b_stats]
    s_scores = [spec.score(st.sum(0)) for st in s_stats]
    diffs = [s - b for s, b in zip(s_scores, b_scores)]
    diff = float(np.mean(diffs))

    rng = np.random.default_rng(seed)
    k, n_items = len(seeds), b_stats[0].shape[0]
    boot = np.empty(samples)
    for t in range(samples):
        pick = rng.integers(0, k, size=k)  # seeds, with replacement
        idx = rng.integers(0, n_items, size=n_items)  # test items, the same for both systems
        boot[t] = np.mean([spec.score(s_stats[j][idx].sum(0)) - spec.score(b_stats[j][idx].sum(0)) for j in pick])
    low, high = (float(x) for x in np.percentile(boot, [2.5, 97.5]))

    identical = all(_same(a, b, metric) for a, b in zip(base, system))
    p_bs = None
    if identical:
        p, test = 1.0, "identical outputs"
    elif spec.test == "ar":
        p, p_bs = _sacrebleu_tests(metric, base, system, trials, samples)
        test = f"sacreBLEU paired approximate randomization ({trials} trials)"
    elif spec.test == "mcnemar":
        p = _mcnemar(base, system)
        test = "McNemar exact test (discordant items, pooled over seeds)"
    else:
        p = float(min(1.0, 2 * min((boot <= 0).mean(), (boot >= 0).mean())))
        p = max(p, 1.0 / (samples + 1))
        test = f"paired bootstrap over seeds and test items ({samples} resamples)"
    return Comparison(metric, list(seeds), float(np.mean(b_scores)), float(np.mean(s_scores)), diff, low, high,
                      float(p), test, p_bs)


def _same(a: dict, b: dict, metric: str) -> bool:
    if needs_text(metric) or metric == "test/exact_match":
        return a.get("hyps") == b.get("hyps")
    return a.get("nll") == b.get("nll")


def _mcnemar(base: Sequence[dict], system: Sequence[dict]) -> float:
    from scipy import stats

    b = np.concatenate([np.asarray(it["exact"], int) for it in base])
    s = np.concatenate([np.asarray(it["exact"], int) for it in system])
    only_s, only_b = int(((s == 1) & (b == 0)).sum()), int(((s == 0) & (b == 1)).sum())
    if only_s + only_b == 0:
        return 1.0
    return float(stats.binomtest(only_s, only_s + only_b, 0.5).pvalue)


def _sacrebleu_tests(metric: str, base: Sequence[dict], system: Sequence[dict], trials: int, samples: int):
    """sacreBLEU's own paired tests on the paired seeds' outputs concatenated: (p AR, p bootstrap)."""
    from sacrebleu.significance import PairedTest

    refs = [r for it in base for r in it["refs"]]
    named = [("baseline", [h for it in base for h in it["hyps"]]), ("system", [h for it in system for h in it["hyps"]])]
    out = []
    for test_type, n in (("ar", trials), ("bs", samples)):
        name = "BLEU" if metric == "test/bleu" else "chrF"
        _, scores = PairedTest(named, {name: _sacre(metric.split("/")[1])}, [refs], test_type=test_type,
                               n_samples=n)()
        out.append(float(scores[name][1].p_value))
    return out[0], out[1]


def compare_seeds(metric: str, base: Sequence[float], system: Sequence[float], seeds: Sequence[int],
                  level: float = 0.95) -> Comparison:
    """Compare a run-level number over paired seeds (``base[i]``, ``system[i]`` share ``seeds[i]``):
    the mean paired difference, its Student-t interval and the paired t-test's two-sided p
    (NaN interval and p with one pair; p = 1 when every difference is 0)."""
    from scipy import stats as sps

    b, s = np.asarray(base, dtype=np.float64), np.asarray(system, dtype=np.float64)
    d = s - b
    test = f"paired t-test over seeds ({len(d) - 1} df)"
    if len(d) < 2:
        low = high = p = math.nan
    elif not np.any(d != d[0]):  # equal differences: no spread, the t statistic is undefined
        low = high = float(d[0])
        p = 1.0 if d[0] == 0 else 0.0
    else:
        _, low, high, _ = t_interval(d.tolist(), level)
        p = float(sps.ttest_rel(s, b).pvalue)
    return Comparison(metric, list(seeds), float(b.mean()), float(s.mean()), float(d.mean()), low, high, p, test)
