"""The sequential test behind ``seed=auto`` (nas_cli/report/stopping.py), checked without training:
its boundaries spend what they promise, its error rate holds under optional stopping at 2..5 and
2..10 seeds on the calibration's simulated seed-level scores, its power and seeds used are what an
independent computation gives, and Holm across comparisons keeps the family-wise rate."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from helpers import load_benchmark
from nas_cli.report import stopping as seq
from nas_cli.report import stats

calibration = load_benchmark("calibration")
SWEEPS = 300


def _limit(p: float, n: int) -> float:
    return p + 3 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("design", [(2, 5), (2, 10), (3, 10)])
@pytest.mark.parametrize("spending", seq.SPENDING)
def test_boundaries_spend_alpha_on_fresh_paths(design, spending):
    # a stream other than the one the boundaries were simulated with, and the t statistics computed
    # by scipy, not by the module: the chance of ever crossing is alpha, and each look spends its share
    looks = seq.looks(*design)
    c = np.array(seq.boundaries(looks, 0.05, spending))
    x = np.random.default_rng(99).standard_normal((60_000, looks[-1]))
    t = np.stack([np.abs(sps.ttest_1samp(x[:, :n], 0.0, axis=1).statistic) for n in looks], axis=1)
    crossed = (t >= c).any(axis=1).mean()
    assert abs(crossed - 0.05) < 3 * math.sqrt(0.05 * 0.95 / len(x)) + 0.001
    first = np.argmax(t >= c, axis=1)[(t >= c).any(axis=1)]
    spent = np.cumsum(np.bincount(first, minlength=len(looks))) / len(x)
    planned = [seq.spent(n / looks[-1], 0.05, spending) for n in looks]
    assert np.all(np.abs(spent - planned) < 4 * np.sqrt(np.maximum(planned, 1e-4) / len(x)) + 0.001)
    # O'Brien-Fleming shape: almost nothing at the first look, the last boundary near the fixed-n one
    if spending == "obf":
        assert c[0] > 10 and c[-1] < 1.35 * seq.fixed_n_boundary(looks[-1], 0.05)


def test_the_vectorized_rule_is_the_sweeps_rule():
    rng = np.random.default_rng(3)
    looks = seq.looks(2, 8)
    d = rng.normal(0.7, 1, size=(150, 8))
    d[:40] = np.round(d[:40])  # a metric with few values: equal differences, zero spread
    for delta in (None, 0.5):
        code, stop = seq.outcomes(d, looks, 0.05, "obf", delta)
        for i in range(len(d)):
            got = seq.decide({"s": ("b", np.zeros(8), d[i])}, looks, 0.05, "obf", delta)["s"]
            assert (seq.CODES[got.decision], got.n) == (code[i], stop[i])


@pytest.mark.slow  # a calibration simulation
@pytest.mark.parametrize("max_seeds", [5, 10])
def test_no_true_difference_is_declared_at_most_alpha_of_the_time(max_seeds):
    # the calibration's score model (benchmarks/calibration.py): each run scored from its own test items;
    # BLEU, perplexity and exact match; seed variation dominating, comparable, or absent
    rng = np.random.default_rng(max_seeds)
    looks = seq.looks(2, max_seeds)
    total = declared = 0
    for metric in calibration.METRICS:
        for ratio in calibration.RATIOS:
            base, system = calibration.simulate(metric, max_seeds, ratio, 0.0, SWEEPS, rng)
            code, stop = seq.outcomes(system - base, looks)
            rate = float((code != 0).mean())
            assert rate <= _limit(0.05, SWEEPS), (metric, ratio, rate)
            total += SWEEPS
            declared += int((code != 0).sum())
            assert stop.max() <= max_seeds
    assert declared / total <= _limit(0.05, total)
    assert declared / total >= 0.05 - 4 * math.sqrt(0.05 * 0.95 / total)  # and not far below: the alpha is used


def _reference_power(d: np.ndarray, looks, c) -> tuple[float, float]:
    """The same rule written out plainly with scipy, one sweep at a time: power and mean seeds."""
    right, used = 0, []
    for row in d:
        for k, n in enumerate(looks):
            t = sps.ttest_1samp(row[:n], 0.0).statistic
            if abs(t) >= c[k]:
                right += t > 0
                used.append(n)
                break
        else:
            used.append(looks[-1])
    return right / len(d), float(np.mean(used))


@pytest.mark.slow  # a power simulation
@pytest.mark.parametrize("effect", [0.5, 1.0, 2.0])
def test_power_and_seeds_used_against_a_fixed_n_design(effect):
    rng = np.random.default_rng(int(effect * 10))
    looks = seq.looks(2, 10)
    base, system = calibration.simulate("test/bleu", 10, "seed ~ item", effect, SWEEPS, rng)
    d = system - base
    code, stop = seq.outcomes(d, looks)
    power, mean_seeds = float((code == 1).mean()), float(stop.mean())
    ref_power, ref_seeds = _reference_power(d, looks, seq.boundaries(looks, 0.05, "obf"))
    assert power == pytest.approx(ref_power) and mean_seeds == pytest.approx(ref_seeds)
    # the price of the looks is small: against one look at 10 seeds (noncentral t at the simulated spread)
    fixed10 = stats.power(abs(d.mean()), d.std(ddof=1) / math.sqrt(10), 9)
    assert power >= fixed10 - 0.08 - 3 * math.sqrt(0.25 / SWEEPS)
    if effect == 2.0:  # a large effect stops early: fewer seeds than the fixed design of the same power
        bench = load_benchmark("sequential_calibration")
        fixed = bench.fixed_n_for(power, float(d.mean()), float(d.std(ddof=1)))
        assert fixed is not None and mean_seeds < fixed


def test_holm_keeps_the_familywise_rate_with_a_shared_baseline():
    bench = load_benchmark("sequential_calibration")
    rng = np.random.default_rng(5)
    for effects in ((0.0, 0.0, 0.0), (3.0, 0.0, 0.0)):
        got = bench.holm_family(200, 5, rng, effects)
        assert got["familywise_error"] <= _limit(0.05, 200), got
    # a real effect is declared, and its rejection raises the others' share (alpha/2 instead of alpha/3)
    state = seq.decide({"a": ("b", [0, 0, 0, 0, 0], [5, 6, 5.5, 6.2, 5.8]),
                        "c": ("b", [0, 0, 0, 0, 0], [0.1, -0.2, 0.3, 0.0, -0.1])}, seq.looks(2, 5))
    assert state["a"].decision == seq.HIGHER and state["c"].last.alpha == pytest.approx(0.05)


def test_equivalence_and_undecided():
    looks = seq.looks(2, 4)
    tight = [0.01, -0.02, 0.015, -0.01]
    state = seq.decide({"s": ("b", [0, 0, 0, 0], tight)}, looks, delta=0.5)
    assert state["s"].decision == seq.EQUIVALENT
    state = seq.decide({"s": ("b", [0, 0, 0, 0], tight)}, looks)  # no delta: it can only end undecided
    assert state["s"].decision == seq.UNDECIDED and state["s"].n == 4
    state = seq.decide({"s": ("b", [0, 0, 0], tight[:3])}, looks)  # seed 4 has not run: go on
    assert state["s"].decision == seq.CONTINUE and state["s"].n == 3
    # differences all exactly 0 (a metric at its ceiling, or two configurations that compute the same thing)
    # bound nothing: no "no difference" from zero spread
    state = seq.decide({"s": ("b", [1.0] * 4, [1.0] * 4)}, looks, delta=0.5)
    assert state["s"].decision == seq.UNDECIDED
    with pytest.raises(ValueError):
        seq.looks(1, 5)


def test_ending_no_difference_when_the_true_difference_is_delta_is_rare():
    # the equivalence stop's error: a true difference of exactly delta called "no difference larger than delta"
    d = np.random.default_rng(11).normal(1.0, 1.0, size=(4000, 10))
    code, _ = seq.outcomes(d, seq.looks(2, 10), delta=1.0)
    assert (code == seq.CODES[seq.EQUIVALENT]).mean() <= _limit(0.05, 4000)


def test_the_committed_real_sweeps_recompute_to_their_documented_decisions():
    # docs/comparing.md "A sequential sweep on a real task": the decisions are recomputed from the run
    # directories in benchmarks/study/sequential_sort, as `nas-report <sweep dir>` does
    from pathlib import Path

    from nas_cli.sweeps.sequential import recompute

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "study" / "sequential_sort"
    real, aa = recompute(root / "real"), recompute(root / "aa")
    (r,), (a,) = real["comparisons"], aa["comparisons"]
    assert (r["decision"], r["looks"][-1]["n"]) == (seq.LOWER, 6)
    assert (a["decision"], a["looks"][-1]["n"]) == (seq.EQUIVALENT, 3)
    # the last look by hand: the paired t statistic against the design's boundary at n = 6
    d = []
    for seed in range(1, 7):
        v = {c["label"]: __import__("json").loads((root / "real" / c["runs"][str(seed)] / "summary.json").read_text())
             ["test"]["test/ppl"] for c in real["configs"]}
        d.append(v["attention=dnas"] - v["attention=unas"])
    t = sps.ttest_1samp(d, 0.0).statistic
    assert t == pytest.approx(r["looks"][-1]["t"]) and abs(t) >= seq.boundaries(seq.looks(2, 10), 0.05)[4]
