"""Issue #19: the statistics behind nas-report's comparisons, checked against independent
references (scipy, sacreBLEU's own PairedTest, a hand-computed Holm example), and the
comparison end to end: a real sweep, then ``nas-report --baseline ... --format latex --pivot``."""
import json
import math
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from nas_cli.report import stats
from helpers import NAS_RUN, nas_run

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
    # one pair: the difference, and no made-up interval or test; equal runs: p = 1
    one = stats.compare_seeds("jsd", [3.0], [4.0], [1])
    assert one.diff == 1.0 and math.isnan(one.low) and math.isnan(one.p)
    assert one.verdict(None).startswith("no test (n=1")
    assert stats.compare_seeds("jsd", [3.0, 4.0], [3.0, 4.0], [1, 2]).p == 1.0


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


def test_bleu_p_value_is_sacrebleus_paired_test_on_the_same_strings():
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    refs = _sentences(120, 0)
    base, system = _noisy(refs, 0.6, 1), _noisy(refs, 0.75, 2)
    c = stats.compare("test/bleu", [_items(base, refs)], [_items(system, refs)], [1], samples=300, trials=2000)
    for test_type, n, got in (("ar", 2000, c.p), ("bs", 300, c.p_bs)):
        _, scores = PairedTest([("baseline", base), ("system", system)], {"BLEU": BLEU()}, [refs],
                               test_type=test_type, n_samples=n)()
        assert got == pytest.approx(scores["BLEU"][1].p_value)
    # the difference is corpus BLEU's, and the bootstrap interval contains it
    assert c.diff == pytest.approx(BLEU().corpus_score(system, [refs]).score - BLEU().corpus_score(base, [refs]).score)
    assert c.low < c.diff < c.high and c.p < 0.01 and c.verdict(True).startswith("better")


def test_identical_systems_no_difference_and_a_system_better_everywhere_is_significant():
    refs = _sentences(80, 3)
    hyps = _noisy(refs, 0.7, 4)
    nll = [float(len(r.split())) for r in refs]
    tokens = [len(r.split()) for r in refs]
    same = _items(hyps, refs, nll, tokens)
    for metric in ("test/bleu", "test/exact_match", "test/ppl", "test/rouge1"):
        c = stats.compare(metric, [same, same], [same, same], [1, 2], samples=200, trials=500)
        assert c.p > 0.5 and c.low <= 0 <= c.high, metric
        assert c.verdict(True).startswith("no significant difference (n=2")
    better = _items(refs, refs, [x * 0.5 for x in nll], tokens)  # exact everywhere, half the NLL everywhere
    for metric, higher in (("test/bleu", True), ("test/exact_match", True), ("test/ppl", False), ("test/rouge1", True)):
        c = stats.compare(metric, [same], [better], [1], samples=200, trials=500)
        assert c.p < 0.01, metric
        assert c.verdict(higher).startswith("better"), metric


def test_perplexity_interval_agrees_with_scipy_bootstrap():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 30, size=200)
    nll_a = tokens * rng.normal(4.0, 0.5, size=200)
    nll_b = tokens * rng.normal(3.9, 0.5, size=200)
    a = {"nll": nll_a.tolist(), "tokens": tokens.tolist()}
    b = {"nll": nll_b.tolist(), "tokens": tokens.tolist()}
    c = stats.compare("test/ppl", [a], [b], [1], samples=4000)

    def diff(na, nb, t, axis=-1):
        return np.exp(nb.sum(axis) / t.sum(axis)) - np.exp(na.sum(axis) / t.sum(axis))

    ref = st.bootstrap((nll_a, nll_b, tokens.astype(float)), diff, paired=True, vectorized=True,
                       n_resamples=4000, method="percentile", random_state=1).confidence_interval
    assert c.diff == pytest.approx(diff(nll_a, nll_b, tokens.astype(float)))
    assert c.low == pytest.approx(ref.low, abs=0.25 * (ref.high - ref.low))
    assert c.high == pytest.approx(ref.high, abs=0.25 * (ref.high - ref.low))


def test_exact_match_uses_mcnemar_on_discordant_items():
    refs = [f"s{i}" for i in range(50)]
    base = refs[:20] + ["x"] * 30  # 20 right
    system = refs[:10] + ["x"] * 10 + refs[20:35] + ["x"] * 15  # 25 right: 15 only system, 10 only baseline
    c = stats.compare("test/exact_match", [_items(base, refs)], [_items(system, refs)], [1], samples=100)
    assert c.p == pytest.approx(st.binomtest(15, 25, 0.5).pvalue)


# ---- end to end: a real sweep, then the report -----------------------------------------------------
@pytest.fixture(scope="module")
def compare_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    sweep = root / "sweep"
    proc = nas_run("-m", "task=sort", "attention=unas,dnas", "seed=1,2", "trainer.max_steps=40",
                   "trainer.val_check_interval=20", "task.train_size=2000", "task.test_size=200",
                   "progress_bar=false", "logger=csv",
                   f"hydra.sweep.dir={sweep}", cwd=root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


def report(*args, cwd):
    return subprocess.run([NAS_REPORT, *map(str, args)], capture_output=True, text=True, cwd=cwd)


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
    # one config id per configuration, whatever the seed (W&B groups seeds by it)
    assert len(ids["unas"]) == len(ids["dnas"]) == 1 and ids["unas"] != ids["dnas"]


def test_report_against_a_baseline_as_latex_markdown_and_json(compare_sweep, tmp_path):
    latex = report(compare_sweep, "--baseline", "scheme=unas", "--format", "latex", "--pivot", "scheme",
                   "--samples", "200", cwd=tmp_path)
    assert latex.returncode == 0, latex.stderr
    assert "\\begin{tabular}" in latex.stdout and "unas (baseline)" in latex.stdout and "$\\pm$" in latex.stdout
    assert "against the baseline unas h4" in latex.stdout and "Holm" in latex.stdout
    js = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--samples", "200", cwd=tmp_path)
    assert js.returncode == 0, js.stderr
    tables = [json.loads(t) for t in js.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    verdicts = tables[1]["rows"]
    assert {v["metric"] for v in verdicts} >= {"exact_match", "bleu", "ppl"}
    assert all(v["paired seeds"] == "1,2" for v in verdicts)
    assert all(v["verdict"].startswith(("better", "worse", "no significant difference")) for v in verdicts)
    md = report(compare_sweep, "--baseline", "scheme=unas", "--format", "markdown", "--metrics", "ppl",
                "--samples", "100", cwd=tmp_path)
    assert md.returncode == 0 and "| dnas h4 | ppl |" in md.stdout and "BLEU" not in md.stdout.split("**against")[0]


def test_report_compares_attention_diagnostics_over_seeds(compare_sweep, tmp_path):
    proc = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--samples", "50",
                  "--metrics", "bleu,jsd,min_margin:encoder", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tables = [json.loads(t) for t in proc.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    rows = {v["metric"]: v for v in tables[1]["rows"]}
    assert [v["metric"] for v in tables[1]["rows"]] == ["bleu", "jsd", "min_margin:encoder"]  # the order asked for
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
        assert row["paired seeds"] == "1,2" and float(row["system mean"]) == pytest.approx(np.mean(system), rel=1e-3)
        ref = st.ttest_rel(system, base)
        assert row["p"] == ("<0.001" if ref.pvalue < 0.001 else f"{ref.pvalue:.3f}")
        assert row["verdict"].startswith(("higher", "lower", "no significant difference (n=2"))
    assert "paired t-test over seeds (1 df)" in tables[1]["caption"]
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
                         (["--baseline", "scheme=unas", "--metrics", "meteor"], "--metrics test/meteor: no paired test")):
        proc = report(compare_sweep, *args, cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, args
    # a run without per-item outputs (made before they existed), and a run on another test set
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    jobs = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())
    (jobs[0] / "test_items.json").unlink()
    proc = report(copy, "--baseline", "scheme=unas", cwd=tmp_path)
    assert proc.returncode == 2 and "lack" in proc.stderr and jobs[0].name in proc.stderr
    shutil.copy(jobs[1] / "test_items.json", jobs[0] / "test_items.json")
    items = json.loads((jobs[1] / "test_items.json").read_text())
    items["refs_sha256"] = "0" * 64
    (jobs[1] / "test_items.json").write_text(json.dumps(items))
    proc = report(copy, "--baseline", "scheme=unas", cwd=tmp_path)
    assert proc.returncode == 2 and "different test sets" in proc.stderr


def test_nas_eval_results_are_rows_of_their_own_and_can_be_compared(compare_sweep, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(compare_sweep, copy)
    job = sorted(p for p in copy.iterdir() if (p / "summary.json").exists())[0]
    ev = subprocess.run([str(Path(NAS_RUN).with_name("nas-eval")), str(job), "--name", "again"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert (job / "eval" / "again.items.json").is_file()
    proc = report(copy, "--baseline", "scheme=unas", "--format", "json", "--metrics", "exact_match",
                  "--samples", "50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    main, verdicts = [json.loads(t) for t in proc.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    assert any("[eval:again]" in r["scheme"] for r in main["rows"])
    again = [v for v in verdicts["rows"] if "[eval:again]" in v["system"]]
    # the same checkpoint evaluated again: identical outputs, no difference
    assert len(again) == 1 and again[0]["verdict"].startswith("no significant difference") and again[0]["p"] == "1.000"


def _study_report():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "study_report.py"
    spec = importlib.util.spec_from_file_location("study_report", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_study_ordering_claim_holds_only_if_every_link_does():
    """An ordering claim (CODA > CODA-CS > RealFormer > Transformer) is decided link by link with
    the paired t-test over seeds; one link not significant, or reversed, and the order does not hold."""
    mod = _study_report()
    up = stats.compare_seeds("jsd", [3.8, 3.7, 3.9], [4.9, 4.7, 5.1], [1, 2, 3])  # clearly higher
    flat = stats.compare_seeds("jsd", [3.8, 3.7, 3.9], [3.7, 3.9, 3.8], [1, 2, 3])  # noise
    holds, words = mod.chain([("A", "B", up), ("B", "C", up)])
    assert holds and words.startswith("A > B: yes (+1.10 [")
    holds, words = mod.chain([("A", "B", up), ("B", "C", flat)])
    assert not holds and "B > C: not significant" in words
    # a link read the other way round: the baseline is the claimed winner
    down = mod._flip(up)
    assert (down.diff, down.low, down.high) == pytest.approx((-up.diff, -up.high, -up.low)) and down.direction() == -1
    holds, words = mod.chain([("A", "B", up), ("B", "C", down)])
    assert not holds and "B > C: no, reversed (-1.10" in words
    holds, words = mod.chain([("A", "B", up), ("B", "C", None)])
    assert not holds and "B > C: not run" in words


def test_study_claims_table_reads_nas_reports_comparison(compare_sweep, tmp_path):
    """benchmarks/study_report.py (docs/study.md's generated claims table) decides each claim from
    nas-report's own comparison: the DNAS row carries nas-report's difference and Holm p."""
    mod = _study_report()
    text = mod.claims_section(str(compare_sweep), None)
    dnas = next(line for line in text.splitlines() if line.startswith("| DNAS is on par"))
    proc = report(compare_sweep, "--baseline", "scheme=unas", "--format", "json", "--metrics", "bleu",
                  "--samples", "1000", cwd=tmp_path)
    verdict = [json.loads(t) for t in proc.stdout.replace("}\n{", "}\n\x00{").split("\x00")][1]["rows"][0]
    diff = float(verdict["difference [95% CI]"].split()[0])
    assert f"{diff:+.2f} [" in dnas and f"p(Holm)={verdict['p (Holm)']}" in dnas
    expected = ("consistent: no significant difference" if verdict["verdict"].startswith("no significant")
                else "yes, and DNAS better" if verdict["verdict"].startswith("better") else "no: DNAS worse")
    assert expected in dnas
    # schemes the sweep did not run are said to be not run, never left blank
    assert "| CODA beats the Transformer (Zheng et al.) | +1.1 BLEU on IWSLT14 de-en (35.6 vs 34.5) | not run |" in text


def test_method_note_names_each_metrics_test_once():
    """Groups with different numbers of paired seeds get t-tests with different degrees of
    freedom: the note says the test once per metric, with the degrees of freedom it used."""
    from nas_cli.report.compare import _tests_in_words

    assert _tests_in_words({"paired t-test over seeds (1 df)", "paired t-test over seeds (2 df)"}) == (
        "paired t-test over seeds (1 or 2 df: one less than the paired seeds)")
    assert _tests_in_words({"paired t-test over seeds (2 df)"}) == "paired t-test over seeds (2 df)"
    assert _tests_in_words({"b test", "a test"}) == "a test / b test"
