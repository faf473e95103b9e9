"""Equivalence verdicts (nas-report --equivalence): TOST against scipy's one-sided t-tests, its error
at the margin by simulation at the seeds users have, Holm over the groups, and the command's output
and refusals on run directories."""
import json
import math

import numpy as np
import pytest
from scipy import stats

from helpers import run_command, script
from nas_cli.report.compare import CompareError, parse_margins
from nas_cli.report.equivalence import tost, tost_p
from nas_cli.report.stats import compare_seeds


@pytest.mark.parametrize("seed", range(5))
def test_tost_is_the_larger_of_two_one_sided_paired_t_tests(seed):
    """An independent reference: scipy's one-sample t-tests of the paired differences against -margin
    (alternative greater) and +margin (alternative less)."""
    rng = np.random.default_rng(seed)
    n, margin = 3 + seed, 0.4
    base = rng.normal(30, 0.5, n)
    system = base + rng.normal(0.1, 0.3, n)
    d = system - base
    ref = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
              stats.ttest_1samp(d, margin, alternative="less").pvalue)
    c = compare_seeds("test/bleu", base, system, list(range(n)))
    e = tost(c, margin)
    assert e.p == pytest.approx(ref, rel=1e-10)
    # the same decision as the 90% interval inside (-margin, +margin)
    lo, hi = stats.t.interval(0.90, n - 1, loc=d.mean(), scale=stats.sem(d))
    assert e.low90 == pytest.approx(lo) and e.high90 == pytest.approx(hi)
    assert (e.p < 0.05) == (-margin < lo and hi < margin)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_true_difference_at_the_margin_is_called_equivalent_in_at_most_5_percent(n):
    """Calibration at the seeds users have: 4,000 simulated paired experiments with the true difference
    exactly at +margin or -margin; TOST's error must not exceed 5% beyond simulation error."""
    rng = np.random.default_rng(n)
    margin, sd, sims = 0.5, 0.4, 4000
    hits = 0
    for i in range(sims):
        sign = 1 if i % 2 else -1
        d = rng.normal(sign * margin, sd, n)
        p = tost_p(float(d.mean()), float(d.std(ddof=1) / math.sqrt(n)), n - 1, margin)
        hits += p < 0.05
    rate = hits / sims
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / sims)
    assert rate > 0.02  # the test is not trivially conservative: at the margin it is exact (5%)


def test_no_spread_or_one_seed_gives_no_verdict_and_margins_are_checked():
    c = compare_seeds("test/bleu", [30.0, 31.0], [30.5, 31.5], [1, 2])  # equal differences: no spread
    assert math.isnan(tost(c, 1.0).p) and "no equivalence verdict" in tost(c, 1.0).verdict()
    assert parse_margins("bleu=0.5", ["test/bleu", "test/ppl"]) == {"test/bleu": 0.5}
    assert parse_margins("2", ["test/bleu", "test/ppl"]) == {"test/bleu": 2.0, "test/ppl": 2.0}
    with pytest.raises(CompareError, match="a margin must be positive"):
        parse_margins("bleu=-1", ["test/bleu"])
    with pytest.raises(CompareError, match="--equivalence chrf: not among the compared metrics"):
        parse_margins("chrf=1", ["test/bleu"])


def _runs(root, values: dict):
    for scheme, vs in values.items():
        for seed, v in enumerate(vs, 1):
            d = root / f"{scheme}-{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"task": "sim", "scheme": scheme, "heads": 4, "seed": seed,
                                                        "test": {"test/bleu": v}}))


def test_nas_report_gives_each_comparison_its_equivalence_verdict_with_holm(tmp_path):
    _runs(tmp_path, {"unas": [30.0, 31.0, 29.5, 30.4], "sigmoid": [30.1, 30.9, 29.7, 30.3],
                     "dnas": [31.5, 32.8, 31.0, 32.1]})
    out = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--equivalence", "bleu=0.5",
                       "--format", "json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["system"].split()[0]: r for r in json.loads(out.stdout)["comparison"]["rows"]}
    assert rows["sigmoid"]["equivalent"] is True and rows["sigmoid"]["equivalence"].startswith("equivalent within ±0.5")
    assert rows["dnas"]["equivalent"] is False and rows["dnas"]["equivalence"].startswith("not shown equivalent")
    ps = [rows[s]["p_tost"] for s in ("sigmoid", "dnas")]
    small, large = sorted(ps)
    assert rows["sigmoid"]["p_tost_holm"] == pytest.approx(min(1.0, 2 * small) if rows["sigmoid"]["p_tost"] == small
                                                           else max(2 * small, large))
    text = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--equivalence", "bleu=0.5",
                        "--format", "markdown"], cwd=tmp_path)
    assert "equivalence (TOST, Holm)" in text.stdout and "two one-sided t-tests (TOST)" in text.stdout
    for argv, message in ((["--equivalence", "0.5"], "--equivalence tests a comparison: add --baseline"),
                          (["--baseline", "scheme=unas", "--equivalence", "bleu=x"], "expected a margin")):
        bad = run_command([script("nas-report"), str(tmp_path), *argv], cwd=tmp_path)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
