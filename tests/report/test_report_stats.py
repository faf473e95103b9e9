"""The statistics behind nas-report's comparisons, checked against independent
references (scipy, sacreBLEU's own PairedTest, a hand-computed Holm example), and the
comparison end to end: a real sweep, then ``nas-report --baseline ... --format latex --pivot``."""
import io
import csv
import json
import sys
import math
import random
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from nas_cli.report import stats
from nas_cli.report import items as item_stats
from helpers import NAS_RUN, nas_run, run_command

NAS_REPORT = str(Path(NAS_RUN).with_name("nas-report"))
WORDS = "the a cat dog sat on mat ran far home big small red blue".split()


def test_t_interval_matches_scipy():
    vals = [31.2, 32.9, 30.4]
    m, low, high, n = stats.t_interval(vals)
    ref = st.t.interval(0.95, len(vals) - 1, loc=np.mean(vals), scale=st.sem(vals))
    assert n == 3 and m == pytest.approx(np.mean(vals)) and (low, high) == pytest.approx(ref)
    one = stats.t_interval([5.0])
    assert one[0] == 5.0 and math.isnan(one[1]) and one[3] == 1  # no made-up interval for n = 1


def test_run_level_numbers_compared_over_seeds_as_scipys_paired_t_test():
    # head JSD of a baseline and a system at three seeds: scipy's ttest_rel is the reference
    base, system = [3.86, 3.71, 4.02], [4.94, 4.60, 5.31]
    c = stats.compare_seeds("jsd", base, system, [1, 2, 3])
    ref = st.ttest_rel(system, base)
    low, high = ref.confidence_interval(0.95)
    assert c.p == pytest.approx(ref.pvalue) and (c.low, c.high) == pytest.approx((low, high))
    assert c.diff == pytest.approx(np.mean(np.subtract(system, base))) and c.seeds == [1, 2, 3]
    assert c.verdict(None).startswith("higher (p=") and "2 df" in c.test
    # no better direction: a lower number is "lower", not "worse"; noise is not a difference
    assert stats.compare_seeds("jsd", system, base, [1, 2, 3]).verdict(None).startswith("lower")
    noisy = stats.compare_seeds("jsd", [3.0, 4.0, 5.0], [3.5, 3.6, 5.2], [1, 2, 3])
    assert noisy.p == pytest.approx(st.ttest_rel([3.5, 3.6, 5.2], [3.0, 4.0, 5.0]).pvalue)
    assert noisy.verdict(None).startswith("no significant difference (n=3")
    # one pair: the difference, and no made-up interval, test or verdict; equal runs: p = 1
    one = stats.compare_seeds("jsd", [3.0], [4.0], [1])
    assert one.diff == 1.0 and math.isnan(one.low) and math.isnan(one.p)
    assert one.verdict(None).startswith("no verdict (n=1") and one.direction() == 0
    assert stats.compare_seeds("jsd", [3.0, 4.0], [3.0, 4.0], [1, 2]).p == 1.0
    # the same difference at every seed: no spread for a t statistic; the exact sign-flip p, 2^(1-n)
    flat = stats.compare_seeds("bleu", [30.0, 31.0, 32.0], [31.0, 32.0, 33.0], [1, 2, 3])
    assert flat.p == 0.25 and flat.direction() == 0 and "sign-flip" in flat.test
    assert stats.compare_seeds("bleu", [30.0] * 6, [31.0] * 6, range(6)).p == pytest.approx(1 / 32)


def test_unpaired_groups_get_welchs_t_test():
    base, system = [31.0, 32.5, 30.2], [33.1, 34.0, 32.2, 33.5]
    c = stats.compare_unpaired("test/bleu", base, system, [4, 5, 6, 7])
    ref = st.ttest_ind(system, base, equal_var=False)
    assert c.p == pytest.approx(ref.pvalue) and not c.paired
    low, high = ref.confidence_interval(0.95)
    assert (c.low, c.high) == pytest.approx((low, high)) and c.diff == pytest.approx(np.mean(system) - np.mean(base))
    assert math.isnan(stats.compare_unpaired("test/bleu", [30.0], system).p)  # one seed: no verdict


def test_power_and_seeds_needed_against_statistics_md():
    """STATISTICS.md: paired t over n seeds, effect delta in sd units: 80% power needs n = 10 at
    delta = 1 and n = 5 at delta = 2; 4 seeds give 0.76 at delta = 2."""
    assert stats.seeds_needed(1.0, 1.0) == 10 and stats.seeds_needed(2.0, 1.0) == 5
    assert stats.power(2.0, 1 / math.sqrt(4), 3) == pytest.approx(0.76, abs=0.01)
    # the detectable difference is where the power reaches 80%
    d = stats.detectable(0.5, 4)
    assert stats.power(d, 0.5, 4) == pytest.approx(0.8, abs=1e-6)
    c = stats.compare_seeds("test/bleu", [30.0, 31.0, 32.0, 30.5], [30.4, 31.9, 32.1, 31.5], [1, 2, 3, 4])
    sd = np.std(np.subtract([30.4, 31.9, 32.1, 31.5], [30.0, 31.0, 32.0, 30.5]), ddof=1)
    assert c.detectable() == pytest.approx(stats.detectable(sd / 2, 3))
    assert c.needed(1.0) == stats.seeds_needed(1.0, sd)


def test_holm_against_a_hand_computed_example():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone: 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5]) == [0.5] and stats.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])


def _sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def _noisy(refs, keep, seed):
    """Each reference word kept with probability ``keep``, else replaced."""
    rng = random.Random(seed)
    return [" ".join(w if rng.random() < keep else rng.choice(WORDS) for w in r.split()) for r in refs]


def _items(hyps, refs, nll=None, tokens=None):
    n = len(refs)
    return {"hyps": hyps, "refs": refs, "exact": [int(h == r) for h, r in zip(hyps, refs)],
            "nll": nll if nll is not None else [1.0] * n, "tokens": tokens if tokens is not None else [1] * n}


def _cmp(metric, base, system, **kw):
    spec = item_stats.METRICS[metric]
    return item_stats.compare_items(metric, spec.stats(base), spec.stats(system), **kw)


@pytest.mark.parametrize("kind", ["bleu", "chrf"])
def test_vectorized_corpus_scores_equal_sacrebleus(kind):
    """Every resample is scored from summed statistics by a vectorized formula: it equals
    sacreBLEU's own score of the same sentences (random subsets, empty and short hypotheses too)."""
    from sacrebleu.metrics import BLEU, CHRF

    refs = _sentences(200, 5) + ["a", "the cat"]
    hyps = [" ".join(h.split()[:random.Random(i).randint(0, 9)]) for i, h in enumerate(_noisy(refs, 0.6, 6))]
    spec = item_stats.METRICS[f"test/{kind}"]
    per_item = spec.stats(_items(hyps, refs))
    rng = np.random.default_rng(0)
    metric = BLEU() if kind == "bleu" else CHRF()
    for _ in range(40):
        pick = rng.choice(len(refs), size=int(rng.integers(1, 25)), replace=False)
        ref_score = metric.corpus_score([hyps[i] for i in pick], [[refs[i] for i in pick]]).score
        assert float(spec.vscore(per_item[pick].sum(0))) == pytest.approx(ref_score, abs=1e-9)
    assert spec.score(per_item.sum(0)) == metric.corpus_score(hyps, [refs]).score  # the point estimate: exact


def test_approximate_randomization_counts_ties_and_is_exact_for_few_differing_items():
    """5 of 500 sentences changed, all for the better: the exact permutation p is 2/32 = 0.0625
    (only the all-swapped pattern is as extreme the other way); counting only strictly larger
    shuffles, as sacreBLEU does, gives about 1e-4."""
    refs = _sentences(500, 7)
    base = _noisy(refs, 0.6, 8)
    system = list(base)
    for i in range(5):
        system[i] = refs[i]
    c = _cmp("test/bleu", _items(base, refs), _items(system, refs), samples=200)
    assert c.p == pytest.approx(2 / 32) and c.differing == 5 and "exact permutation" in c.test
    # enumeration is the reference for the random path: 12 differing sentences, p by both ways
    system = [refs[i] if i < 9 else (_noisy([refs[i]], 0.3, i)[0] if i < 12 else b) for i, b in enumerate(base)]
    b_st, s_st = (item_stats.METRICS["test/bleu"].stats(_items(x, refs)) for x in (base, system))
    exact, how, k = item_stats.ar_test(item_stats.bleu_from_stats, b_st, s_st, 0, np.random.default_rng(0))
    assert k == 12 and "exact" in how
    mc, how, _ = item_stats.ar_test(item_stats.bleu_from_stats, b_st, s_st, 20000, np.random.default_rng(1), exact_max=0,
                               h=10 ** 9)
    assert "20000 trials" in how and mc == pytest.approx(exact, abs=3 * math.sqrt(exact * (1 - exact) / 20000) + 1e-4)


def test_random_approximate_randomization_agrees_with_sacrebleus_when_no_ties():
    """With many differing sentences ties are rare: the p-value is sacreBLEU's paired AR's, up to
    Monte Carlo error (sacreBLEU's own implementation is the reference)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    refs = _sentences(150, 0)
    base, system = _noisy(refs, 0.6, 1), _noisy(refs, 0.66, 2)
    c = _cmp("test/bleu", _items(base, refs), _items(system, refs), samples=300, trials=4000)
    _, scores = PairedTest([("baseline", base), ("system", system)], {"BLEU": BLEU()}, [refs], test_type="ar",
                           n_samples=4000)()
    ref = scores["BLEU"][1].p_value
    assert 0.001 < ref < 0.3
    assert c.p == pytest.approx(ref, abs=4 * math.sqrt(ref * (1 - ref) / 4000) + 0.005)
    assert c.diff == pytest.approx(BLEU().corpus_score(system, [refs]).score - BLEU().corpus_score(base, [refs]).score)
    assert c.low < c.diff < c.high


def test_identical_systems_no_difference_and_a_system_better_everywhere_is_significant():
    refs = _sentences(80, 3)
    hyps = _noisy(refs, 0.7, 4)
    nll = [float(len(r.split())) for r in refs]
    tokens = [len(r.split()) for r in refs]
    same = _items(hyps, refs, nll, tokens)
    for metric in ("test/bleu", "test/exact_match", "test/ppl", "test/rouge1"):
        c = _cmp(metric, same, same, samples=200, trials=500)
        assert c.p == 1.0 and c.low <= 0 <= c.high, metric
    better = _items(refs, refs, [x * 0.5 for x in nll], tokens)  # exact everywhere, half the NLL everywhere
    for metric in ("test/bleu", "test/exact_match", "test/ppl", "test/rouge1"):
        c = _cmp(metric, same, better, samples=200, trials=2000)
        assert c.p < 0.01, metric
        assert (c.diff < 0) if metric == "test/ppl" else (c.diff > 0), metric


def test_perplexity_interval_agrees_with_scipy_bootstrap():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 30, size=200)
    nll_a = tokens * rng.normal(4.0, 0.5, size=200)
    nll_b = tokens * rng.normal(3.9, 0.5, size=200)
    a = {"nll": nll_a.tolist(), "tokens": tokens.tolist()}
    b = {"nll": nll_b.tolist(), "tokens": tokens.tolist()}
    c = _cmp("test/ppl", a, b, samples=4000)

    def diff(na, nb, t, axis=-1):
        return np.exp(nb.sum(axis) / t.sum(axis)) - np.exp(na.sum(axis) / t.sum(axis))

    ref = st.bootstrap((nll_a, nll_b, tokens.astype(float)), diff, paired=True, vectorized=True,
                       n_resamples=4000, method="percentile", random_state=1).confidence_interval
    assert c.diff == pytest.approx(diff(nll_a, nll_b, tokens.astype(float)))
    assert c.low == pytest.approx(ref.low, abs=0.1 * (ref.high - ref.low))
    assert c.high == pytest.approx(ref.high, abs=0.1 * (ref.high - ref.low))


def test_exact_match_uses_mcnemar_on_discordant_items():
    refs = [f"s{i}" for i in range(50)]
    base = refs[:20] + ["x"] * 30  # 20 right
    system = refs[:10] + ["x"] * 10 + refs[20:35] + ["x"] * 15  # 25 right: 15 only system, 10 only baseline
    c = _cmp("test/exact_match", _items(base, refs), _items(system, refs), samples=100)
    assert c.p == pytest.approx(st.binomtest(15, 25, 0.5).pvalue) and c.differing == 25


# ---- end to end: a real sweep, then the report -----------------------------------------------------
@pytest.fixture(scope="module")
def compare_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    sweep = root / "sweep"
    proc = nas_run("-m", "task=sort", "attention=unas,dnas", "seed=1,2", "trainer.max_steps=40",
                   "trainer.val_check_interval=20", "task.train_size=2000", "task.test_size=200",
                   "progress_bar=false", "logger=csv", "diagnostics.plots=never",  # figures: tests/diagnostics
                   f"hydra.sweep.dir={sweep}", cwd=root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


def report(*args, cwd):
    return run_command([NAS_REPORT, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_every_run_keeps_its_per_item_test_outputs(compare_sweep):
    ids = {}
    for job in sorted(p for p in compare_sweep.iterdir() if (p / "summary.json").exists()):
        s = json.loads((job / "summary.json").read_text())
        ids.setdefault(s["scheme"], set()).add(s["config_id"])
        items = json.loads((job / "test_items.json").read_text())
        test = json.loads((job / "summary.json").read_text())["test"]
        assert items["n"] == len(items["hyps"]) == len(items["exact"]) == 200
        assert sum(items["exact"]) / items["n"] == pytest.approx(test["test/exact_match"])
        assert sum(items["nll"]) / sum(items["tokens"]) == pytest.approx(test["test/loss"], rel=1e-5)
        # nas-report's corpus BLEU from the items is the run's own number (raw text here), exactly to the
        # float32 in which Lightning logs it
        bleu = item_stats.METRICS["test/bleu"]
        assert np.float32(bleu.score(bleu.stats(items).sum(0))) == np.float32(test["test/bleu"])
    # one config id per configuration, whatever the seed (W&B groups seeds by it)
    assert len(ids["unas"]) == len(ids["dnas"]) == 1 and ids["unas"] != ids["dnas"]


def test_report_against_a_baseline_as_latex_markdown_csv_and_json(compare_sweep, tmp_path):
    latex = report(compare_sweep, "--baseline", "scheme=unas", "--format", "latex", "--pivot", "scheme",
                   "--samples", "200", cwd=tmp_path)
    assert latex.returncode == 0, latex.stderr
    assert "\\begin{tabular}" in latex.stdout and "unas (baseline)" in latex.stdout and "$\\pm$" in latex.stdout
    assert "against the baseline unas h4" in latex.stdout and "Holm" in latex.stdout
    # one JSON document, numbers as numbers
    js = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--samples", "200", cwd=tmp_path)
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    verdicts = doc["comparison"]["rows"]
    assert {v["metric"] for v in verdicts} >= {"exact_match", "bleu", "ppl"} and doc["baseline"] == "unas h4"
    assert all(v["seeds"] == [1, 2] and v["paired"] for v in verdicts)
    assert all(v["verdict"].startswith(("better", "worse", "no significant difference")) for v in verdicts)
    assert all(isinstance(v["p"], float) and isinstance(v["difference"], float) for v in verdicts)
    # the verdict is the paired t-test over the runs' own numbers (summary.json), never pooled items
    per_run = {}
    for job in (p for p in compare_sweep.iterdir() if (p / "summary.json").exists()):
        s = json.loads((job / "summary.json").read_text())
        per_run[(s["scheme"], s["seed"])] = s["test"]["test/ppl"]
    ppl = next(v for v in verdicts if v["metric"] == "ppl")
    base, system = [per_run[("unas", k)] for k in (1, 2)], [per_run[("dnas", k)] for k in (1, 2)]
    ref = st.ttest_rel(system, base)
    assert ppl["p"] == pytest.approx(ref.pvalue) and ppl["p_holm"] == pytest.approx(ref.pvalue)
    assert (ppl["ci_low"], ppl["ci_high"]) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    # the test-set detail: one row per metric and paired seed, labelled as such
    detail = doc["test_set"]["rows"]
    assert {(d["metric"], d["seed"]) for d in detail} >= {("bleu", 1), ("bleu", 2), ("ppl", 1), ("ppl", 2)}
    assert "not a verdict over seeds" in doc["test_set"]["caption"]
    md = report(compare_sweep, "--baseline", "scheme=unas", "--format", "markdown", "--metrics", "ppl",
                "--samples", "100", "--html", tmp_path / "r.html", cwd=tmp_path)
    page = (tmp_path / "r.html").read_text()  # the HTML report says which question each table answers
    assert "Across seeds (the verdict)" in page and "On this test set, per trained model" in page
    assert md.returncode == 0 and "| dnas h4 | ppl |" in md.stdout and "BLEU" not in md.stdout.split("**across")[0]
    assert "**on this test set, per trained model" in md.stdout
    # CSV: one tidy table that pandas reads, numbers in numeric columns, equal to the JSON's
    import pandas as pd

    csv_out = report(compare_sweep, "--baseline", "scheme=unas", "--format", "csv", "--metrics", "ppl",
                     "--samples", "100", cwd=tmp_path)
    assert csv_out.returncode == 0, csv_out.stderr
    cmp_csv = pd.read_csv(io.StringIO(csv_out.stdout))
    assert len(cmp_csv) == 1 and cmp_csv.loc[0, "system"] == "dnas h4" and cmp_csv.loc[0, "metric"] == "ppl"
    for col in ("difference", "ci_low", "ci_high", "p", "p_holm", "direction", "n_system"):
        assert pd.api.types.is_numeric_dtype(cmp_csv[col]), col
        assert cmp_csv.loc[0, col] == pytest.approx(ppl[col] if col != "n_system" else ppl["n_system"]), col
    assert cmp_csv.loc[0, "p"] == pytest.approx(ref.pvalue) and cmp_csv.loc[0, "seeds"] == "1,2"
    # --out: every table its own file; the runs table one row per group and metric
    out = report(compare_sweep, "--baseline", "scheme=unas", "--out", tmp_path / "tables", "--samples", "100",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {f.name for f in (tmp_path / "tables").iterdir()} == {"runs.csv", "comparison.csv", "test_set.csv"}
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    for col in ("mean", "ci_low", "ci_high", "sd", "n"):
        assert pd.api.types.is_numeric_dtype(runs[col]), col
    row = runs[(runs["scheme"] == "dnas") & (runs["metric"] == "test/ppl")].iloc[0]
    group = next(g for g in doc["runs"]["groups"] if g["scheme"] == "dnas")
    assert row["mean"] == pytest.approx(group["metrics"]["test/ppl"]["mean"]) and row["n"] == 2
    assert row["sd"] == pytest.approx(np.std(system, ddof=1))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(st.t.interval(0.95, 1, np.mean(system), st.sem(system)))
    detail = pd.read_csv(tmp_path / "tables" / "test_set.csv")
    assert pd.api.types.is_numeric_dtype(detail["p"]) and set(detail["seed"]) == {1, 2}
    runs_only = report(compare_sweep, "--format", "csv", cwd=tmp_path)  # no --baseline: the runs table
    assert runs_only.returncode == 0 and set(pd.read_csv(io.StringIO(runs_only.stdout))["scheme"]) == {"unas", "dnas"}
    for bad, says in ((["--format", "csv", "--table", "comparison"], "--table comparison: needs a comparison"),
                      (["--table", "runs"], "--table runs: picks the table of --format csv"),
                      (["--format", "csv", "--table", "nope"], "--table nope: unknown"),
                      (["--out", tmp_path / "r.html"], "is a file, not a folder")):
        proc = report(compare_sweep, *bad, cwd=tmp_path)
        assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_report_plans_seeds_with_detect(compare_sweep, tmp_path):
    proc = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--metrics", "ppl",
                  "--detect", "ppl=0.5", "--no-item-tests", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    row = doc["comparison"]["rows"][0]
    assert "test_set" not in doc and row["detect"] == 0.5
    per_run = {}
    for job in (p for p in compare_sweep.iterdir() if (p / "summary.json").exists()):
        s = json.loads((job / "summary.json").read_text())
        per_run[(s["scheme"], s["seed"])] = s["test"]["test/ppl"]
    sd = np.std([per_run[("dnas", k)] - per_run[("unas", k)] for k in (1, 2)], ddof=1)
    assert row["seeds_for_detect"] == stats.seeds_needed(0.5, sd)
    assert row["detectable_80"] == pytest.approx(stats.detectable(sd / math.sqrt(2), 1))
    for bad, needle in ((["--detect", "bleu=x"], "--detect bleu=x: expected a number"),
                        (["--detect", "meteor=1"], "--detect meteor: not among the compared metrics"),
                        (["--detect", "-1"], "must be positive")):
        proc = report(compare_sweep, "--baseline", "scheme=unas", "--metrics", "ppl", *bad, cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, bad


def test_report_compares_attention_diagnostics_over_seeds(compare_sweep, tmp_path):
    proc = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--samples", "50",
                  "--metrics", "bleu,jsd,min_margin:encoder", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {v["metric"]: v for v in doc["comparison"]["rows"]}
    assert [v["metric"] for v in doc["comparison"]["rows"]] == ["bleu", "jsd", "min_margin:encoder"]  # as asked
    # the numbers compared are the runs' own diagnostics, read here from their files
    per_run = {}
    for job in (p for p in compare_sweep.iterdir() if (p / "summary.json").exists()):
        s = json.loads((job / "summary.json").read_text())
        locs = json.loads((job / "diagnostics" / "summary.json").read_text())["locations"]
        per_run[(s["scheme"], s["seed"])] = (np.mean([v["jsd_mean"] for v in locs.values()]),
                                             locs["encoder"]["min_margin"])
    for k, metric in enumerate(("jsd", "min_margin:encoder")):
        base = [per_run[("unas", seed)][k] for seed in (1, 2)]
        system = [per_run[("dnas", seed)][k] for seed in (1, 2)]
        row = rows[metric]
        assert row["seeds"] == [1, 2] and row["system_mean"] == pytest.approx(np.mean(system), rel=1e-6)
        ref = st.ttest_rel(system, base)
        assert row["p"] == pytest.approx(ref.pvalue)
        assert row["verdict"].startswith(("higher", "lower", "no significant difference (n=2"))
    assert "paired t-test over seeds (1 df)" in doc["comparison"]["caption"]
    # a location the runs do not have: one line naming the run
    bad = report(compare_sweep, "--baseline", "scheme=unas", "--metrics", "jsd:nowhere", cwd=tmp_path)
    assert bad.returncode == 2 and "--metrics jsd:nowhere: run" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_report_comparison_bad_input_one_line(compare_sweep, tmp_path):
    bad = report(compare_sweep, "--baseline", "scheme=nope", cwd=tmp_path)
    assert bad.returncode == 2 and "no group matches; the groups are: dnas h4; unas h4" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    for args, needle in ((["--format", "docx"], "--format docx: unknown"),
                         (["--pivot", "colour"], "--pivot colour: not a column"),
                         (["--baseline", "scheme=unas", "--metrics", "meteor"], "--metrics meteor: no run reports it; "),
                         (["--baseline", "scheme=unas", "--metrics", "bleu,blue"],
                          "--metrics blue: no run reports it (did you mean bleu?); choose from bleu, "),
                         (["--baseline", "scheme=unas", "--metrics", "step_varation"], "(did you mean step_variation?)"),
                         (["--detect", "1"], "--detect plans seeds for a comparison: add --baseline")):
        proc = report(compare_sweep, *args, cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, args
    # a run without per-item outputs (made before they existed) keeps its verdict, without test-set detail
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    jobs = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())
    (jobs[0] / "test_items.json").unlink()
    proc = report(copy, "--baseline", "scheme=unas", "--format", "json", "--samples", "50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert any(jobs[0].name in n and "no per-item test outputs" in n for n in doc["notes"])
    seeds_with_detail = {d["seed"] for d in doc["test_set"]["rows"]}
    gone = json.loads((jobs[1] / "summary.json").read_text())["seed"]  # jobs[0]'s partner seed
    assert len(seeds_with_detail) == 1 and doc["comparison"]["rows"][0]["seeds"] == [1, 2]
    # a run on another test set: refused
    shutil.copy(jobs[1] / "test_items.json", jobs[0] / "test_items.json")
    items = json.loads((jobs[1] / "test_items.json").read_text())
    items["refs_sha256"] = "0" * 64
    (jobs[1] / "test_items.json").write_text(json.dumps(items))
    proc = report(copy, "--baseline", "scheme=unas", cwd=tmp_path)
    assert proc.returncode == 2 and "different test sets" in proc.stderr
    assert gone in (1, 2)


def test_replicates_are_one_seed(compare_sweep, tmp_path):
    """A run that repeats a config and a seed is the same replicate: counted once, with a note."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    job = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())[0]
    shutil.copytree(job, copy / "again")
    proc = report(copy, "--baseline", "scheme=unas", "--format", "json", "--metrics", "ppl", "--no-item-tests",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [g["n"] for g in doc["runs"]["groups"]] == [2, 2]
    assert any("repeat the config and seed of another run and are counted once" in n for n in doc["notes"])
    assert doc["comparison"]["rows"][0]["seeds"] == [1, 2]


def test_a_sweep_given_twice_or_inside_another_path_is_counted_once_with_a_note(compare_sweep, tmp_path):
    """The same directory twice (also by another spelling), a PATH inside an earlier one, a PATH holding an
    earlier one: every run once, the seeds as they are, and a note naming the PATH."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    job = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())[0]
    once = json.loads(report("copy", "--format", "json", "--metrics", "ppl", cwd=tmp_path).stdout)
    for paths, said in ((["copy", "copy"], "copy is given twice (the same folder as copy)"),
                        (["copy", "./copy/"], "./copy/ is given twice (the same folder as copy)"),
                        (["copy", str(job)], f"{job} lies inside copy, given before it"),
                        ([f"copy/{job.name}", "copy"], f"copy contains copy/{job.name}, given before it")):
        proc = report(*paths, "--format", "json", "--metrics", "ppl", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert [g["n"] for g in doc["runs"]["groups"]] == [g["n"] for g in once["runs"]["groups"]], paths
        assert [n for n in doc["notes"] if said in n and "counted once" in n], (paths, doc["notes"])
    assert not [n for n in once["notes"] if "counted once" in n]


def test_nas_eval_results_are_rows_of_their_own_and_can_be_compared(compare_sweep, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    job = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())[0]
    ev = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(job), "--name", "again"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert (job / "eval" / "again.items.json").is_file()
    proc = report(copy, "--baseline", "scheme=unas", "--format", "json", "--metrics", "exact_match,bleu",
                  "--samples", "50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert any("[eval:again]" in r["scheme"] for r in doc["runs"]["rows"])
    again = [v for v in doc["comparison"]["rows"] if "[eval:again]" in v["system"]]
    # one evaluated run: no verdict over seeds; on the test set, identical outputs: p = 1
    assert len(again) == 2 and all(v["verdict"].startswith("no verdict (n=1") for v in again)
    detail = [d for d in doc["test_set"]["rows"] if "[eval:again]" in d["system"]]
    assert detail and all(d["p"] == 1.0 and d["difference"] == 0 for d in detail)


def _study_report():
    from helpers import load_benchmark

    return load_benchmark("study_report")


def _study_common():
    from helpers import load_benchmark

    return load_benchmark("study_common")


def test_study_heads_trend_names_the_seeds_a_sweep_under_way_lacks():
    """The heads trend is tested over the seeds' slopes while the sweep runs; the claims row says which
    seeds lack which numbers of heads, so a mid-sweep verdict reads as one."""
    mod = _study_common()
    assert mod.heads_missing({1: [4, 8, 16, 32], 2: [4, 8, 16, 32]}) == ""
    assert mod.heads_missing({1: [4, 8, 16, 32], 2: [4, 8, 16], 3: [4]}) == "s2 without 32 heads, s3 without 8/16/32 heads"
    # and the row gives no verdict until the sweep is complete
    assert mod.heads_verdict("yes", "") == "yes"
    assert mod.heads_verdict("yes", "s3 without 32 heads") == \
        "not decided yet: the sweep is under way (on the runs so far: yes)"


def test_a_claims_row_gives_no_verdict_while_a_sweep_it_reads_lacks_seeds():
    """Every claims row that reads a sweep (Zheng et al.'s orders, diversity and quality, Sinkhorn, the
    kernels, additive attention) says 'not decided yet' while a scheme has fewer than 3 finished seeds:
    with CODA-CS and RealFormer at 1 seed the page printed 'not the whole order' as a verdict."""
    from types import SimpleNamespace

    mod = _study_common()
    three, one = SimpleNamespace(runs=[1, 2, 3]), SimpleNamespace(runs=[1])
    assert mod.under_way("yes", {"CODA": three, "UNAS": three}) == "yes"
    assert mod.under_way("no", {"CODA": three, "CODA-CS": one, "RealFormer": one}) == \
        "not decided yet: the sweep is under way (CODA-CS 1 of 3 seeds, RealFormer 1 of 3 seeds; on the runs so far: no)"


def test_the_additive_claim_reads_float32_rounding_as_flat():
    """The blog post's one-layer additive attention is flat over decoding steps in exact arithmetic;
    a trained one-layer run measures about 1e-8 (float32 rounding of the row softmax, a real
    4-run sweep here gave 1.66e-08), which is flat, not 'a run that varies'. Two layers must be
    above that in every run and significantly more than one layer."""
    from nas_cli.attention.additive import ROUND_OFF

    study_claims = sys.modules[_study_report().claims_section.__module__]
    one, two = [1.7e-8, 1.6e-8, 1.8e-8], [0.21, 0.18, 0.25]
    more = stats.compare_seeds("step_variation", one, two, [1, 2, 3])
    assert study_claims.step_verdict(one, two, more).startswith("yes: every one-layer run below 1e-05")
    assert study_claims.step_verdict([1.7e-8, 2 * ROUND_OFF, 1.8e-8], two, more) == "no: a one-layer run varies by 2e-05"
    flat2 = [2e-8, 1.5e-8, 0.3]
    assert study_claims.step_verdict(one, flat2, stats.compare_seeds("step_variation", one, flat2, [1, 2, 3])) \
        .startswith("only half: one layer stays flat")
    assert study_claims.step_verdict([None, 1e-8], two, more) == "no step variation recorded for one layer"
    single = stats.compare_seeds("step_variation", [5e-8], [0.84], [1])  # one seed: no test
    assert study_claims.step_verdict([5e-8], [0.84], single) == \
        "one layer below 1e-05 and two layers varying in every run; no test below 2 seeds"


def test_study_ordering_claim_holds_only_if_every_link_does():
    """An ordering claim (CODA > CODA-CS > RealFormer > Transformer) is decided link by link with
    the paired t-test over seeds; one link not significant, or reversed, and the order does not hold."""
    mod = _study_common()
    up = stats.compare_seeds("jsd", [3.8, 3.7, 3.9], [4.9, 4.7, 5.1], [1, 2, 3])  # clearly higher
    flat = stats.compare_seeds("jsd", [3.8, 3.7, 3.9], [3.7, 3.9, 3.8], [1, 2, 3])  # noise
    holds, words = mod.chain([("A", "B", up), ("B", "C", up)])
    assert holds and words.startswith("A > B: yes (+1.10 [")
    holds, words = mod.chain([("A", "B", up), ("B", "C", flat)])
    assert not holds and "B > C: not significant" in words
    # a link the data reverse: the claimed winner is clearly lower
    down = stats.compare_seeds("jsd", [4.9, 4.7, 5.1], [3.8, 3.7, 3.9], [1, 2, 3])
    assert down.direction() == -1
    holds, words = mod.chain([("A", "B", up), ("B", "C", down)])
    assert not holds and "B > C: no, reversed (-1.10" in words
    holds, words = mod.chain([("A", "B", up), ("B", "C", None)])
    assert not holds and "B > C: not run" in words


def test_a_scheme_that_never_trained_is_named_with_its_reason_in_an_ordering(tmp_path):
    """Tsai et al.'s linear kernel "does not converge": where every seed of a scheme stopped with a
    recorded failure (failed.json), the ordering's link to it holds and says why; a scheme with a
    finished run, or none at all, is not called untrainable."""
    sweep = tmp_path / "sweep"
    proc = nas_run("-m", "task=sort", "attention=kernel_linear", "seed=1,2", "optim.lr=1e30", "trainer.max_steps=5",
                   "task.train_size=500", "task.test_size=50", "logger=csv", "progress_bar=false",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode != 0 and len(list(sweep.glob("*/failed.json"))) == 2, proc.stderr[-2000:]
    mod = _study_common()
    why = mod.did_not_train(str(sweep), "kernel_linear")
    assert why is not None and why.startswith("2 of 2 seeds stopped: attention kernel 'linear' (encoder layer 0) produced non-finite")
    up = stats.compare_seeds("bleu", [30.0, 31.0, 29.5], [33.0, 34.0, 33.2], [1, 2, 3])
    holds, words = mod.chain([("exp", "poly", up), ("poly", "linear", why)])
    assert holds and "poly > linear: yes (linear did not train: 2 of 2 seeds stopped: attention kernel" in words
    holds, _ = mod.chain([("exp", "poly", None), ("poly", "linear", why)])
    assert not holds
    assert mod.did_not_train(str(sweep), "unas") is None and mod.did_not_train(str(tmp_path / "none"), "x") is None


def test_study_claims_table_reads_nas_reports_comparison(compare_sweep, tmp_path):
    """benchmarks/study_report.py (docs/study.md's generated claims table) decides each claim from
    nas-report's own comparison: the DNAS row carries nas-report's difference and Holm p."""
    mod = _study_report()
    text = mod.claims_section(str(compare_sweep), None)
    dnas = next(line for line in text.splitlines() if line.startswith('| DNAS "achieves better generation'))
    proc = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--metrics", "bleu",
                  "--no-item-tests", cwd=tmp_path)
    verdict = json.loads(proc.stdout)["comparison"]["rows"][0]
    p = verdict["p_holm"]
    assert f"{verdict['difference']:+.2f} [" in dnas and f"p(Holm){'<0.001' if p < 0.001 else f'={p:.3f}'}" in dnas
    expected = ("not shown here: no significant difference" if verdict["verdict"].startswith("no significant")
                else "yes: DNAS better here" if verdict["verdict"].startswith("better") else "no: DNAS worse here")
    assert expected in dnas
    # schemes the sweep did not run are said to be not run, never left blank
    assert "| CODA beats the Transformer (Zheng et al.) | +1.1 BLEU on IWSLT14 de-en (35.6 vs 34.5) | not run |" in text
    assert all(cell.strip() for line in text.splitlines() if line.startswith("| ") for cell in line.split(" | "))


def test_method_note_names_each_metrics_test_once():
    """Groups with different numbers of paired seeds get t-tests with different degrees of
    freedom: the note says the test once per metric, with the degrees of freedom it used."""
    from nas_cli.report.verdicts import _tests_in_words

    assert _tests_in_words({"paired t-test over seeds (1 df)", "paired t-test over seeds (2 df)"}) == (
        "paired t-test over seeds (1 or 2 df: one less than the paired seeds)")
    assert _tests_in_words({"paired t-test over seeds (2 df)"}) == "paired t-test over seeds (2 df)"
    assert _tests_in_words({"b test", "a test"}) == "a test / b test"


def test_a_corrupt_summary_is_named_not_called_unfinished(compare_sweep, tmp_path):
    """A summary.json that is not JSON is reported as corrupt, with its path."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    job = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())[0]
    (job / "summary.json").write_text('{"task": "sort", "tes')
    proc = report(copy, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["unfinished"]["rows"]
    assert len(rows) == 1 and rows[0]["status"].startswith("failed: corrupt summary.json")
    assert str(job / "summary.json") in rows[0]["status"]


STUDY = Path(__file__).resolve().parents[2] / "benchmarks" / "study"


@pytest.mark.skipif(not (STUDY / "sort").is_dir(), reason="the committed sort sweep (benchmarks/aa_check.py) is absent")
def test_the_3_seed_sort_sweep_gets_the_verdicts_of_a_paired_t_test_over_seeds(tmp_path):
    """On this real sweep the verdict is scipy's paired t-test over the runs' own numbers, Holm over the
    two schemes, nothing else (a test that pooled items instead calls 6 of 6 comparisons 'better')."""
    proc = report(STUDY / "sort", "--baseline", "scheme=unas", "--metrics", "exact_match,bleu,ppl", "--format",
                  "json", "--no-item-tests", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["comparison"]["rows"]
    values = {}
    for s in (json.loads(p.read_text()) for p in (STUDY / "sort").glob("*/summary.json")):
        for m in ("exact_match", "bleu", "ppl"):
            values.setdefault((s["scheme"], m), {})[s["seed"]] = s["test"][f"test/{m}"]
    for m in ("exact_match", "bleu", "ppl"):
        ps = {sys: st.ttest_rel([values[(sys, m)][k] for k in (1, 2, 3)], [values[("unas", m)][k] for k in (1, 2, 3)])
              for sys in ("dnas", "hnas")}
        holm = dict(zip(ps, stats.holm([r.pvalue for r in ps.values()])))
        for r in (r for r in rows if r["metric"] == m):
            sys = r["system"].split()[0]
            assert r["p"] == pytest.approx(ps[sys].pvalue) and r["p_holm"] == pytest.approx(holm[sys])
            expected = 0 if holm[sys] >= 0.05 else int(np.sign(ps[sys].statistic))
            assert r["direction"] == expected


@pytest.mark.skipif(not (STUDY / "sort_aa").is_dir(), reason="the committed A/A runs (benchmarks/aa_check.py) are absent")
def test_a_a_on_trained_runs_gets_no_verdict(tmp_path):
    """One configuration at seeds 1-3 and 4-6, two sweep directories: no metric may differ."""
    first, second = STUDY / "sort_aa" / "first", STUDY / "sort_aa" / "second"
    proc = report(first, second, "--group-by", "source", "--baseline", f"source={first}", "--format", "json",
                  "--metrics", "exact_match,bleu,ppl,jsd", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["comparison"]["rows"]
    assert len(rows) == 4 and all(r["direction"] == 0 and not r["paired"] for r in rows)
    assert all(r["verdict"].startswith("no significant difference (n=3") for r in rows)


@pytest.mark.slow  # a six-run sweep through nas-report
def test_a_metric_undefined_by_design_is_not_compared_and_the_rest_is(tmp_path):
    # linear-kernel runs (Tsai et al.: signed weights) have no head JSD by design: that group's JSD row says why
    # it is not compared, and every other row is compared (the study page needs them); a metric missing for
    # another reason is refused with one line
    sweep = tmp_path / "sw"
    proc = nas_run("-m", "debug=fast", "progress_bar=false", "logger=csv", "attention=unas,kernel_linear,sigmoid",
                   "seed=1,2", "trainer.max_steps=6", "diagnostics.plots=never", f"hydra.sweep.dir={sweep}",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = report(sweep, "--baseline", "scheme=unas", "--metrics", "jsd,ppl", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {(r["system"], r["metric"]): r for r in json.loads(out.stdout)["comparison"]["rows"]}
    linear = rows[("kernel_linear h4", "jsd")]
    assert linear["verdict"].startswith("not compared: jsd is undefined for these runs") and linear["p"] is None
    assert rows[("sigmoid h4", "jsd")]["p"] is not None  # the other scheme is compared as before
    # every table marks the diagnostics computed on a derived quantity and those undefined, and says why
    text = report(sweep, "--baseline", "scheme=unas", "--no-item-tests", cwd=tmp_path).stdout
    table = {line.split("│")[2].strip(): line for line in text.splitlines() if line.count("│") > 5}
    assert "n/a" in table["kernel_linear"] and "‡" in table["sigmoid"] and "‡" not in table["unas (baseline)"]
    assert "‡: computed on row-normalized weights" in " ".join(text.split())
    assert "n/a: undefined for attention weights with negative entries" in " ".join(text.split())
    groups = {g["scheme"]: g["metrics"] for g in json.loads(out.stdout)["runs"]["groups"]}
    assert groups["sigmoid"]["jsd"]["derived"].startswith("row-normalized weights") and groups["sigmoid"]["jsd"]["n"] == 2
    assert groups["kernel_linear"]["jsd"]["mean"] is None and "negative entries" in groups["kernel_linear"]["jsd"]["not_applicable"]
    assert "derived" not in groups["unas"]["jsd"]
    csv_rows = list(csv.DictReader(io.StringIO(report(sweep, "--format", "csv", cwd=tmp_path).stdout)))
    assert {(r["scheme"], r["metric"]): r for r in csv_rows}[("sigmoid", "jsd")]["derived"].startswith("row-normalized")
    assert rows[("kernel_linear h4", "ppl")]["p"] is not None  # and the linear kernel on what it does have
    bad = report(sweep, "--baseline", "scheme=unas", "--metrics", "jsd:nowhere", cwd=tmp_path)
    assert bad.returncode != 0 and "has no such value" in bad.stderr and "Traceback" not in bad.stderr
