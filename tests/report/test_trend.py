"""The trend test over seeds (docs/study.md's heads claim: does CODA's advantage over UNAS grow
with the number of heads?): per-seed least-squares slopes, tested over seeds.

Checked against scipy (``linregress`` per seed, ``ttest_1samp`` over the slopes) and calibrated:
simulated with no true trend at 2, 3 and 5 seeds, it calls a trend in 5% of sweeps, where a
regression that pools every run as if independent calls one far more often."""
import math

import numpy as np
import pytest
from scipy import stats

from nas_cli.report.stats import trend_over_seeds

HEADS = np.log2([4, 8, 16, 32])


def test_slopes_interval_and_p_match_scipy():
    points = {1: [(2, 0.1), (3, 0.5), (4, 0.4), (5, 1.2)],
              2: [(2, -0.3), (3, 0.2), (4, 0.6), (5, 0.7)],
              3: [(2, 0.0), (3, 0.1), (4, 0.9), (5, 0.8)]}
    c, slopes = trend_over_seeds("bleu", points)
    ref = {s: stats.linregress(*zip(*pts)).slope for s, pts in points.items()}
    assert slopes == pytest.approx(ref, rel=1e-12)
    vals = list(ref.values())
    assert c.diff == pytest.approx(np.mean(vals))
    assert c.p == pytest.approx(stats.ttest_1samp(vals, 0.0).pvalue, rel=1e-9)
    low, high = stats.t.interval(0.95, 2, loc=np.mean(vals), scale=stats.sem(vals))
    assert (c.low, c.high) == pytest.approx((low, high), rel=1e-9)
    assert c.seeds == [1, 2, 3] and c.test == "t-test of the per-seed slopes (2 df)"


def test_a_seed_with_one_setting_has_no_slope_and_one_slope_no_test():
    c, slopes = trend_over_seeds("bleu", {1: [(2, 0.1), (3, 0.5)], 2: [(2, 0.4)]})
    assert list(slopes) == [1] and slopes[1] == pytest.approx(0.4)
    assert math.isnan(c.p) and c.n == 1 and not c.testable


@pytest.mark.slow  # a calibration simulation
@pytest.mark.parametrize("n", [2, 3, 5])
def test_no_true_trend_is_called_one_in_5_percent_of_sweeps(n):
    """Null: each seed has its own level and its own slope around a mean slope of 0, plus noise
    at each number of heads. The seed-level test keeps its 5%; one regression over all 4n runs
    with a level per seed (as if the runs were independent given their seed's level) does not."""
    rng = np.random.default_rng(20261125 + n)
    sims, ours, pooled = 3000, 0, 0
    for _ in range(sims):
        level = rng.normal(0, 1.0, n)
        slope = rng.normal(0, 0.3, n)
        y = level[:, None] + slope[:, None] * HEADS[None, :] + rng.normal(0, 0.2, (n, len(HEADS)))
        c, _ = trend_over_seeds("bleu", {s: list(zip(HEADS, y[s])) for s in range(n)})
        ours += c.p < 0.05
        pooled += _pooled_p(y) < 0.05
    se = math.sqrt(0.05 * 0.95 / sims)
    assert abs(ours / sims - 0.05) < 3.5 * se
    assert pooled / sims > 0.10


def _pooled_p(y: np.ndarray) -> float:
    """Least squares with one intercept per seed and one common slope, its residual df."""
    n, m = y.shape
    xc, yc = HEADS - HEADS.mean(), y - y.mean(1, keepdims=True)
    b = (yc * xc).sum() / (n * (xc * xc).sum())
    df = n * m - n - 1
    se = math.sqrt(((yc - b * xc) ** 2).sum() / df / (n * (xc * xc).sum()))
    return 2 * stats.t.sf(abs(b / se), df)


def test_a_true_trend_is_found():
    rng = np.random.default_rng(7)
    y = 0.5 * HEADS[None, :] + rng.normal(0, 0.1, (3, 4))
    c, _ = trend_over_seeds("bleu", {s: list(zip(HEADS, y[s])) for s in range(3)})
    assert c.direction() == 1 and c.low > 0.3 and c.high < 0.7
