"""The tuning protocols' calibration (benchmarks/tuning_calibration.py) at the sizes a test can afford: the
default (same-seed selection) keeps "different" at or below 5% in cases 1-3 at 2, 3 and 5 seeds, by the
formulas and through nas-report's own tuning and verdict; the shared-rate anchor does not; case 4 (a flat
scheme against a sharp one) is where the plain choice exceeds 5%, and the default, which takes each choice's
estimated lift off the difference, holds it."""
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


seqcal = load_benchmark("tuning_sequential_calibration")


@pytest.mark.parametrize("case", [1, 2, 3])
def test_seed_auto_rechoosing_at_every_look_holds_five_percent(case):
    # benchmarks/tuning_sequential_calibration.py: seed=auto with tune=[...] at the default design (2..10 seeds)
    rng = np.random.default_rng(10 + case)
    # at the size a test affords (each look's lift is a bootstrap over up to 10 seeds); the committed calibration
    # (docs/tuning_sequential.json, 20,000 sweeps a cell) is held to 5% below
    assert seqcal.formula_rate(case, (2, 10), "every look", 1000, rng) <= _limit(1000)
    assert seqcal.sweeper_rate(case, (2, 10), 800, rng) <= _limit(800)


def test_a_choice_kept_from_the_first_look_is_not_calibrated():
    rng = np.random.default_rng(21)
    assert seqcal.formula_rate(1, (2, 10), "first look, kept", 8000, rng) > 0.09


def test_the_committed_sequential_calibration_holds_in_every_cell():
    import json
    from pathlib import Path

    result = json.loads((Path(__file__).resolve().parents[2] / "docs" / "tuning_sequential.json").read_text())
    every = [c for c in result["cells"] if c["choice"] == "every look"]
    assert len(every) == 12  # four cases x three designs
    assert all(c["rate"] <= _limit(c["sweeps"]) and c["sweeper_rate"] <= _limit(c["sweeper_sweeps"]) for c in every)


def test_a_flat_scheme_against_a_sharp_one_is_where_the_plain_choice_exceeds_five_percent():
    """Case 4 (equal at their best rates, one flat in the rate, one sharply peaked): choosing on the verdict
    seeds favours the flat scheme, the best of several equally good rates (a winner's curse), above 5%
    at 5 seeds; two held-apart tuning seeds hold 5% there (and not in case 1: docs/comparing.md)."""
    rng = np.random.default_rng(31)
    assert cal.formula_rate(4, "plain", 5, 20000, rng) > _limit(20000)
    assert cal.formula_rate(4, "held-2", 3, 8000, rng) <= _limit(8000)


def test_the_default_takes_the_choices_lift_off_and_holds_five_percent_against_a_sharp_scheme():
    """The default (same-seed selection, less each choice's bootstrap optimism: nas_cli/report/selection.py)
    holds 5% in case 4 at 2, 3 and 5 seeds by the formulas, and through nas-report's own tuning and verdict."""
    rng = np.random.default_rng(41)
    for n in (2, 3, 5):
        assert cal.formula_rate(4, "same", n, 8000, rng) <= _limit(8000)
    assert cal.nas_report_rate(4, "same", 5, 400, rng) <= _limit(400)


def test_the_nas_report_command_on_run_directories_gives_the_in_memory_verdicts():
    """The calibration's third path writes each simulated sweep as run directories and reads them with the
    nas-report command: on the same simulated numbers its verdicts are the in-memory path's."""
    assert cal.directory_rate(4, "same", 3, 15, np.random.default_rng(5)) == \
        cal.nas_report_rate(4, "same", 3, 15, np.random.default_rng(5))
    assert cal.directory_rate(4, "held-2", 2, 15, np.random.default_rng(6)) == \
        cal.nas_report_rate(4, "held-2", 2, 15, np.random.default_rng(6))
