"""The tuning protocols' calibration (benchmarks/tuning_calibration.py) at the sizes a test can afford: the
default (same-seed selection) keeps "different" at or below 5% in the three cases at 2, 3 and 5 seeds, by the
formulas and through nas-report's own tuning and verdict; the shared-rate anchor does not."""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import load_benchmark

cal = load_benchmark("tuning_calibration")


def _limit(sweeps: int) -> float:
    return 0.05 + 3 * math.sqrt(0.05 * 0.95 / sweeps)


@pytest.mark.parametrize("case", [1, 2, 3])
def test_the_default_protocol_holds_five_percent(case):
    rng = np.random.default_rng(case)
    for n in (2, 3, 5):
        assert cal.formula_rate(case, "same", n, 8000, rng) <= _limit(8000)
    assert cal.nas_report_rate(case, "same", 3, 400, rng) <= _limit(400)


def test_the_shared_rate_calls_schemes_with_other_best_rates_different():
    rng = np.random.default_rng(7)
    assert cal.formula_rate(2, "shared", 5, 8000, rng) > 0.15
    assert cal.nas_report_rate(2, "shared", 5, 400, rng) > 0.12
