"""Two checks on the paired seed-level differences behind a verdict, beside the paired t-test.

The verdict over seeds (:func:`nas_cli.report.stats.compare_seeds`) is a paired t-test, and at
2-5 seeds it rests on the differences being roughly normal: simulated with no true difference it
holds its 5% under normal and heavy-tailed symmetric differences, but not under *skewed* ones
(one seed that diverges; benchmarks/assumptions.py, docs/comparing.md). Two numbers say when a
verdict leans on that assumption:

- :func:`outlier_seed`: the leave-one-out (externally studentized) test. For each seed i,
  ``t_i = (d_i - mean of the others) / (sd of the others * sqrt(1 + 1/(n-1)))``, which under
  independent normal differences follows Student's t with n - 2 df exactly (d_i against the
  prediction interval of the other n - 1). A seed is flagged when its Bonferroni-adjusted
  two-sided p (n x p_i) is below :data:`OUTLIER_ALPHA`, so with normal differences at most
  5% of comparisons are flagged (the measured rates are in docs/comparing.md). Needs 3 seeds;
  at 3 only a difference far outside the other two is flagged, and never one beside others that
  are all equal (ties of a discrete metric: no spread to judge it against).
- :func:`signflip_p`: the exact sign-flip (randomization) test of the mean paired difference,
  scipy's ``permutation_test`` over all 2^n sign assignments, which needs no normality. Its
  smallest p is 2^(1-n), so it can reach 0.05 only from 6 seeds on; nas-report shows it where
  it disagrees with the t-test about significance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: a seed's difference is an outlier when n x its leave-one-out p is below this
OUTLIER_ALPHA = 0.05
#: the exact sign-flip p is computed (and shown where it disagrees) from this many paired seeds
SIGNFLIP_MIN_SEEDS = 6
#: above this many seeds the sign-flip p is estimated from random flips instead of all 2^n
SIGNFLIP_EXACT_MAX = 16


@dataclass
class Outlier:
    index: int  # position in the differences given
    p: float  # Bonferroni-adjusted (n x the leave-one-out p, at most 1)
    t: float


def leave_one_out_p(d: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Each difference's leave-one-out t statistic and two-sided p (Student t, n - 2 df)."""
    from scipy.stats import t as student

    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    if n < 3:
        raise ValueError("the leave-one-out test needs at least 3 differences")
    rest_sum = x.sum() - x
    rest_mean = rest_sum / (n - 1)
    rest_ss = (x ** 2).sum() - x ** 2 - (n - 1) * rest_mean ** 2
    rest_sd = np.sqrt(np.maximum(rest_ss, 0.0) / (n - 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (x - rest_mean) / (rest_sd * math.sqrt(1 + 1 / (n - 1)))
    t = np.where(rest_sd > 0, t, 0.0)  # the others all equal: no spread to judge a seed against
    return t, 2 * student.sf(np.abs(t), n - 2)


def outlier_seed(d: Sequence[float], alpha: float = OUTLIER_ALPHA) -> Outlier | None:
    """The seed whose difference lies outside the others' (see the module), or None."""
    if len(d) < 3:
        return None
    t, p = leave_one_out_p(d)
    i = int(np.argmin(p))
    adjusted = min(1.0, float(p[i]) * len(d))
    return Outlier(i, adjusted, float(t[i])) if adjusted < alpha else None


def signflip_p(d: Sequence[float], exact_max: int = SIGNFLIP_EXACT_MAX, resamples: int = 100_000,
               seed: int = 0) -> float:
    """Two-sided p of the sign-flip test of mean(d) = 0: exact over all 2^n flips up to
    ``exact_max`` differences (scipy's ``permutation_test``), else from ``resamples`` random flips."""
    from scipy.stats import permutation_test

    x = np.asarray(d, dtype=np.float64)
    res = permutation_test((x,), np.mean, permutation_type="samples", alternative="two-sided",
                           n_resamples=np.inf if len(x) <= exact_max else resamples,
                           rng=np.random.default_rng(seed))
    return float(min(1.0, res.pvalue))
