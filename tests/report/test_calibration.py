"""nas-report's verdict holds the 5% it claims at the numbers of seeds researchers run.

Simulated sweeps with no true difference (per-item test outputs per seed, with a seed effect and
item difficulty, scored as runs score them) go through nas-report's own comparison; the share
called "better" or "worse" must stay within 5% plus Monte Carlo error at k = 2, 3, 5 and 10 seeds,
for BLEU, perplexity and exact match, paired and unpaired. With a true effect, the verdict finds
it as often as the noncentral t says (the power that ``--detect`` plans with). The full grid,
with deepsig's ASO beside it, is ``benchmarks/calibration.py`` (docs/comparing.md)."""
import math

import numpy as np
import pytest

from helpers import load_benchmark
from nas_cli.report import stats

SWEEPS = 400
#: one-sided bound: 5% plus three Monte Carlo standard errors (the seeds are fixed: no flakiness)
BOUND = 0.05 + 3 * math.sqrt(0.05 * 0.95 / SWEEPS)


def _calibration():
    return load_benchmark("calibration")


@pytest.mark.parametrize("metric", ["test/bleu", "test/ppl", "test/exact_match"])
def test_no_true_difference_gets_a_verdict_at_most_5_percent(metric):
    cal = _calibration()
    rng = np.random.default_rng({"test/bleu": 1, "test/ppl": 2, "test/exact_match": 3}[metric])
    rates = {}
    for ratio in cal.RATIOS:
        for k in (2, 3, 5, 10):
            base, system = cal.simulate(metric, k, ratio, 0.0, SWEEPS, rng, items=100)
            rates[(ratio, k)] = float((cal.verdicts(metric, base, system) != 0).mean())
    assert all(r <= BOUND for r in rates.values()), rates
    pooled = np.mean(list(rates.values()))
    assert pooled <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / (SWEEPS * len(rates))), pooled
    # ... and not by refusing to decide: a real effect is found (2 seed sd, 10 seeds)
    base, system = cal.simulate(metric, 10, "seed >> item", 2.0, 200, rng, items=100)
    right = -1 if metric == "test/ppl" else 1
    assert (cal.verdicts(metric, base, system) == right).mean() > 0.5


def test_unpaired_seeds_welch_is_calibrated_too():
    cal = _calibration()
    rng = np.random.default_rng(4)
    for k in (2, 3, 5):
        base, system = cal.simulate("test/bleu", k, "seed >> item", 0.0, SWEEPS, rng, items=100)
        rate = float((cal.verdicts("test/bleu", base, system, paired=False) != 0).mean())
        assert rate <= BOUND, (k, rate)


@pytest.mark.parametrize("n,delta", [(3, 2.0), (5, 1.0), (10, 1.0)])
def test_power_of_the_verdict_is_the_noncentral_t(n, delta):
    """Normal seed-level differences with sd 1 and mean ``delta``: the share of verdicts equals
    stats.power (noncentral t, n - 1 df), the figure --detect and 'detectable' rest on."""
    cal = _calibration()
    rng = np.random.default_rng(n)
    sweeps = 1500
    base = rng.normal(30, 1, size=(sweeps, n))
    system = base + rng.normal(delta, 1, size=(sweeps, n))
    found = float((cal.verdicts("test/bleu", base, system) == 1).mean())
    expected = stats.power(delta, 1 / math.sqrt(n), n - 1)
    assert found == pytest.approx(expected, abs=3 * math.sqrt(expected * (1 - expected) / sweeps) + 0.01)
