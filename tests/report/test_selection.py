"""The winner's-curse correction of same-seed selection (nas_cli/report/selection.py): the optimism equals
Harrell's bootstrap written out over every ordered resample, and nas-report takes it off a tuned verdict's
difference toward zero only, with p from the same standard error; held-apart tuning seeds are not corrected."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import stats
from test_tuning import _grid, _report

from nas_cli.report.selection import optimism, resample_weights


def _brute(val, test, higher):
    """Every ordered resample of the seeds, chosen again on its validation means: mean of (the chosen
    candidate's test mean on the resample - its test mean on every seed)."""
    n = len(val)
    lifts = []
    for idx in itertools.product(range(n), repeat=n):
        means = [sum(val[i][c] for i in idx) / n for c in range(len(val[0]))]
        pick = means.index(max(means) if higher else min(means))
        lifts.append(sum(test[i][pick] for i in idx) / n - sum(row[pick] for row in test) / n)
    return sum(lifts) / len(lifts)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("higher", [True, False])
def test_the_optimism_is_harrells_bootstrap_over_every_resample(n, higher):
    rng = np.random.default_rng(n)
    quality = rng.normal(size=(n, 4))  # shared by a run's validation and test numbers
    val, test = quality + rng.normal(0, 0.3, (n, 4)), quality + rng.normal(0, 0.3, (n, 4))
    assert optimism(val, test, higher) == pytest.approx(_brute(val.tolist(), test.tolist(), higher), abs=1e-12)
    sweeps = np.stack([val, -val, test])
    assert optimism(sweeps, sweeps, higher) == pytest.approx(
        [_brute(v.tolist(), v.tolist(), higher) for v in sweeps], abs=1e-12)


def test_the_resample_weights_are_the_multinomial_probabilities():
    for n in (2, 3, 6, 8):
        counts, weights = resample_weights(n)
        assert weights.sum() == pytest.approx(1.0) and (counts.sum(axis=1) == n).all()
        assert len(counts) == len({tuple(c) for c in counts.tolist()})  # each multiset once
    counts, weights = resample_weights(3)
    assert dict(zip(map(tuple, counts.astype(int).tolist()), weights)) [(1, 1, 1)] == pytest.approx(6 / 27)


#: dnas is flat in the rate (its candidates' validation numbers equal on average) and its chosen candidate's
#: runs came out well in validation and test alike; unas has one clearly best rate
VAL = {("unas", 0.001): [30.0, 30.1, 29.9], ("unas", 0.002): [20.0, 20.1, 19.9],
       ("dnas", 0.001): [31.0, 29.5, 30.3], ("dnas", 0.002): [29.5, 31.0, 29.9]}
TEST = {("unas", 0.001): [30.0, 30.2, 29.9], ("unas", 0.002): [20.1, 20.0, 19.8],
        ("dnas", 0.001): [31.2, 29.9, 30.6], ("dnas", 0.002): [29.4, 30.9, 29.8]}


def _expected_shift():
    def arrays(scheme):
        v = np.array([VAL[(scheme, lr)] for lr in (0.001, 0.002)]).T
        t = np.array([TEST[(scheme, lr)] for lr in (0.001, 0.002)]).T
        return v.tolist(), t.tolist()

    return _brute(*arrays("dnas"), True) - _brute(*arrays("unas"), True)


def test_nas_report_takes_the_lift_off_toward_zero_with_p_from_the_same_standard_error(tmp_path):
    _grid(tmp_path, VAL, TEST)
    out = _report(tmp_path, "--format", "json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["comparison"]["rows"]
    d = np.array(TEST[("dnas", 0.001)]) - np.array(TEST[("unas", 0.001)])
    lift = _expected_shift()
    assert 0 < lift < d.mean()  # the flat scheme's choice lifted it, by less than its lead
    assert row["selection_shift"] == pytest.approx(lift)
    assert row["difference"] == pytest.approx(d.mean() - lift)
    se = d.std(ddof=1) / np.sqrt(3)
    assert row["p"] == pytest.approx(2 * stats.t.sf(abs(d.mean() - lift) / se, 2))
    assert row["p"] > stats.ttest_rel(TEST[("dnas", 0.001)], TEST[("unas", 0.001)]).pvalue
    assert "less the estimated lift of the tuning choice" in row["test"]


def test_a_lift_against_the_difference_or_held_apart_seeds_change_nothing(tmp_path):
    test = dict(TEST)
    test[("dnas", 0.001)] = [29.5, 29.0, 29.4]  # dnas now behind: its lift would only enlarge the gap
    _grid(tmp_path / "behind", VAL, test)
    (row,) = json.loads(_report(tmp_path / "behind", "--format", "json").stdout)["comparison"]["rows"]
    d = np.array(test[("dnas", 0.001)]) - np.array(TEST[("unas", 0.001)])
    assert row["selection_shift"] == 0.0 and row["difference"] == pytest.approx(d.mean())
    assert row["p"] == pytest.approx(stats.ttest_rel(test[("dnas", 0.001)], TEST[("unas", 0.001)]).pvalue)
    seeds = (1, 2, 3, 4)
    val = {k: v + [v[0]] for k, v in VAL.items()}
    held = {k: v + [v[0]] for k, v in TEST.items()}
    _grid(tmp_path / "held", val, held, seeds=seeds)
    (row,) = json.loads(_report(tmp_path / "held", "--format", "json", "--tuning-seeds", "4").stdout)["comparison"]["rows"]
    assert row["selection_shift"] is None


def test_the_shift_never_crosses_zero(tmp_path):
    test = dict(TEST)
    test[("dnas", 0.001)] = [30.9, 29.6, 30.3]  # a lead smaller than the choice's lift
    _grid(tmp_path, VAL, test)
    (row,) = json.loads(_report(tmp_path, "--format", "json").stdout)["comparison"]["rows"]
    d = np.array(test[("dnas", 0.001)]) - np.array(TEST[("unas", 0.001)])
    v = np.array([VAL[("dnas", lr)] for lr in (0.001, 0.002)]).T.tolist()
    t = np.array([test[("dnas", lr)] for lr in (0.001, 0.002)]).T.tolist()
    assert _brute(v, t, True) > d.mean() > 0
    assert row["difference"] == pytest.approx(0.0, abs=1e-12) and row["p"] == pytest.approx(1.0)
    assert row["selection_shift"] == pytest.approx(d.mean()) and row["direction"] == 0


def test_seed_auto_takes_each_looks_lift_off_toward_zero():
    """seed=auto with tune=[...] re-chooses at every look (nas_cli/report/stopping.py's Chosen): each look's mean
    difference is the chosen runs' less the two choices' lift on that look's seeds, written out here."""
    from nas_cli.report import stopping

    def chosen(scheme, test):
        lrs = (0.001, 0.002)
        return stopping.Chosen(tuple(tuple(VAL[(scheme, lr)]) for lr in lrs), tuple(tuple(test[(scheme, lr)]) for lr in lrs),
                               True)

    state = stopping.decide({"dnas": ("unas", chosen("unas", TEST), chosen("dnas", TEST))}, (2, 3), 0.05)
    for look in state["dnas"].looks:
        n = look.n
        d = np.array(TEST[("dnas", 0.001)][:n]) - np.array(TEST[("unas", 0.001)][:n])

        def arrays(scheme):
            return ([[VAL[(scheme, lr)][i] for lr in (0.001, 0.002)] for i in range(n)],
                    [[TEST[(scheme, lr)][i] for lr in (0.001, 0.002)] for i in range(n)])

        lift = _brute(*arrays("dnas"), True) - _brute(*arrays("unas"), True)
        shift = min(lift, d.mean()) if lift > 0 and d.mean() > 0 else 0.0
        assert look.shift == pytest.approx(shift, abs=1e-12)
        assert look.mean == pytest.approx(d.mean() - shift)
