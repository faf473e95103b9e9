"""The checks beside the verdict's t-test (nas_cli/report/robust.py): the outlier flag's
false-flag rate with normal differences and its catch of a planted diverged seed, the exact
sign-flip p against an enumeration of every sign pattern, and both reaching nas-report's notes."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from nas_cli.report import robust, stats
from nas_cli.report.collect import Run
from nas_cli.report.compare import compare_groups
from nas_cli.report.verdicts import cautions, verdict_records
from nas_cli.report.table import group_runs


def test_leave_one_out_t_is_the_prediction_interval_statistic():
    d = np.array([0.4, -0.3, 0.1, 2.9, 0.2])
    t, p = robust.leave_one_out_p(d)
    for i in range(len(d)):  # by hand: d_i against the others' mean and sd, n - 2 df
        rest = np.delete(d, i)
        ref = (d[i] - rest.mean()) / (rest.std(ddof=1) * math.sqrt(1 + 1 / len(rest)))
        assert t[i] == pytest.approx(ref) and p[i] == pytest.approx(2 * st.t.sf(abs(ref), len(d) - 2))


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_outlier_flag_is_calibrated_and_catches_a_diverged_seed(n):
    rng = np.random.default_rng(n)
    clean = rng.normal(size=(4000, n))
    rate = np.mean([robust.outlier_seed(r) is not None for r in clean])
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000), rate  # at most its 5% (Monte Carlo error)
    assert rate >= 0.03  # and not a flag that never fires
    planted = rng.normal(size=(500, n))
    planted[:, 1] += 10.0  # seed 2 diverged
    caught = np.mean([(o := robust.outlier_seed(r)) is not None and o.index == 1 for r in planted])
    assert caught >= {3: 0.1, 5: 0.85, 10: 0.99}[n], caught
    # ties of a discrete metric: the others all equal, nothing to judge a seed against
    assert robust.outlier_seed([0.0, 0.0, 0.3]) is None


def test_signflip_p_is_the_exact_randomization_p():
    rng = np.random.default_rng(0)
    for n in (6, 8, 11):
        d = rng.normal(0.5, 1.0, size=n)
        flips = np.array(list(itertools.product([1, -1], repeat=n)))
        ref = np.mean(np.abs((flips * d).mean(axis=1)) >= abs(d.mean()) - 1e-12)
        assert robust.signflip_p(d) == pytest.approx(ref)
    assert robust.signflip_p(np.ones(6)) == pytest.approx(2 / 64)  # the smallest p at 6 seeds: 2^(1-n)


def _groups(base, system):
    runs = [Run(path=Path(f"sim/{scheme}/{s}"), summary={"task": "sim", "scheme": scheme, "heads": 4, "seed": s,
                                                          "test": {"test/bleu": float(v)}})
            for scheme, vals in (("base", base), ("sys", system)) for s, v in enumerate(vals, 1)]
    groups = group_runs(runs)
    return groups, next(g for g in groups if g.runs[0].scheme == "base")


def test_nas_report_names_an_outlying_seed_and_the_verdict_without_it():
    base = [30.0, 31.0, 30.5, 29.8, 30.2]
    system = [30.1, 31.2, 30.4, 29.9, 38.0]  # seed 5 diverged upwards
    groups, baseline = _groups(base, system)
    (row,) = compare_groups(groups, baseline, ["test/bleu"], item_tests=False)
    (line,) = cautions([row])
    assert "seed 5's difference (+7.8) is an outlier" in line and "normality assumption in doubt" in line
    rest = np.subtract(system, base)[:4]
    p_rest = st.ttest_1samp(rest, 0).pvalue
    assert f"without seed 5: {rest.mean():+.3g}, p={p_rest:.3f}" in line
    # no significant difference with the diverged seed (p > 0.05) nor without it: the same verdict
    assert row.comparison.p > 0.05 and p_rest > 0.05 and line.endswith("the verdict is the same without it")
    rec = verdict_records([row])[0]  # the same numbers in JSON and CSV
    assert rec["outlier_seed"] == 5 and rec["p_without_outlier"] == pytest.approx(p_rest)
    # four seeds agree on +0.1 and the diverged fifth makes the difference "not significant": the verdict
    # (no significant difference) rests on that one seed
    groups2, baseline2 = _groups([0.0] * 5, [0.10, 0.11, 0.09, 0.10, 3.0])
    (row2,) = compare_groups(groups2, baseline2, ["test/bleu"], item_tests=False)
    (line2,) = cautions([row2])
    assert row2.comparison.p > 0.05 and row2.comparison.without_outlier[1] < 0.05
    assert "seed 5's difference (+3) is an outlier" in line2 and line2.endswith("the verdict rests on it")


def test_from_six_seeds_the_sign_flip_p_is_shown_where_it_disagrees():
    # differences all positive but one large: the t-test says no (p > 0.05), the sign flips say yes
    base = [0.0] * 7
    system = [0.1, 0.12, 0.09, 0.11, 0.1, 0.13, 3.0]
    groups, baseline = _groups(base, system)
    (row,) = compare_groups(groups, baseline, ["test/bleu"], item_tests=False)
    c = row.comparison
    assert c.p > 0.05 and c.signflip_p == pytest.approx(2 / 128)
    assert any("exact sign-flip test over the 7 seeds disagrees" in x for x in cautions([row]))
    few = stats.compare_seeds("bleu", [0.0] * 5, [0.1, 0.12, 0.09, 0.11, 3.0], range(5))
    assert few.signflip_p is None  # below 6 seeds it cannot reach 0.05: not computed
