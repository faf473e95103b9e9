"""nas-report on zero-shot scores (eval/lm_eval.json from nas-eval --lm-eval or lm_eval.tasks): a verdict over
seeds for every task and metric, Holm-adjusted over all of them at once (checked against Holm's step-down
procedure written out here), and per seed the paired detail on the items: McNemar's exact test for accuracy
(checked against scipy's binomial test on the discordant items)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers import holm_adjusted, run_command, script

TASKS = {"piqa": 0.62, "boolq": 0.55}
N_ITEMS = 200


def _write_run(d, scheme, seed, rng, shift, heads=4):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"attention": scheme, "seed": seed, "model": {
        "heads": heads}, "task": {"name": "subword_lm"}}))
    (d / "summary.json").write_text(json.dumps({"task": "subword_lm", "scheme": scheme, "heads": heads, "seed": seed,
                                                "test": {"test/ppl": 100.0 + seed}}))
    items, metrics, declared = {}, {}, {}
    for task, p in TASKS.items():
        acc = (rng.random(N_ITEMS) < p + shift).astype(float)
        items[task] = {"doc_id": list(range(N_ITEMS)), "acc": acc.tolist()}
        metrics[f"test/zeroshot/{task}/acc"] = float(acc.mean())
        declared[f"test/zeroshot/{task}/acc"] = [f"{task} acc", True, "pct"]
    (d / "eval").mkdir()
    (d / "eval" / "lm_eval.json").write_text(json.dumps({"split": "test", "checkpoints": ["best.ckpt"],
                                                         "metrics": metrics, "declared": declared}))
    (d / "eval" / "lm_eval.items.json").write_text(json.dumps({"split": "test", "refs_sha256": "same-items",
                                                               "zeroshot": items}))
    return items


def test_zero_shot_verdicts_are_one_holm_family_with_mcnemar_per_seed(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(0)
    items = {}
    for scheme, shift in (("unas", 0.0), ("dnas", 0.08), ("hnas", 0.0)):
        for seed in (1, 2, 3):
            items[scheme, seed] = _write_run(tmp_path / f"{scheme}-{seed}", scheme, seed, rng, shift)
    # the baseline as for the trained runs: each nas-eval result is compared with the baseline's result of its kind
    out = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--format", "json"],
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = [r for r in doc["comparison"]["rows"] if r["metric"].startswith("zeroshot/")]
    assert len(rows) == 4  # 2 schemes x 2 tasks, each over 3 seeds
    assert {r["baseline_group"] for r in rows} == {"unas h4 [eval:lm_eval]"} and all(r["seeds"] == [1, 2, 3] for r in rows)
    assert {r["metric"] for r in rows} == {"zeroshot/piqa/acc", "zeroshot/boolq/acc"}
    p = np.array([r["p"] for r in rows])
    assert [r["p_holm"] for r in rows] == pytest.approx(list(holm_adjusted(p)))
    assert "over every task, metric and group at once" in doc["comparison"]["caption"]
    # the paired detail of seed 1, dnas against unas on piqa: McNemar's exact test on the discordant items
    detail = next(d for d in doc["test_set"]["rows"] if d["metric"] == "zeroshot/piqa/acc" and d["seed"] == 1
                  and d["system"].startswith("dnas"))
    assert detail["test"].startswith("McNemar")
    a, b = (np.array(items[s, 1]["piqa"]["acc"]) for s in ("unas", "dnas"))
    only_b, only_a = int(((b == 1) & (a == 0)).sum()), int(((b == 0) & (a == 1)).sum())
    assert detail["p"] == pytest.approx(stats.binomtest(only_b, only_a + only_b, 0.5).pvalue)
    assert detail["difference"] == pytest.approx(b.mean() - a.mean())


def test_in_a_grid_each_zero_shot_row_is_compared_with_the_baselines_row_of_its_cell(tmp_path):
    """A grid over heads: --baseline scheme=unas matches a baseline per number of heads; the zero-shot rows are
    compared with the baseline's zero-shot row at the same heads, the trained rows with the trained baseline."""
    rng = np.random.default_rng(1)
    for scheme, shift in (("unas", 0.0), ("dnas", 0.05)):
        for heads in (2, 4):
            for seed in (1, 2):
                _write_run(tmp_path / f"{scheme}-{heads}-{seed}", scheme, seed, rng, shift, heads=heads)
    out = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--format", "json"],
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["comparison"]["rows"]
    pairs = {(r["system"], r["baseline_group"]) for r in rows}
    assert pairs == {("dnas h2", "unas h2"), ("dnas h4", "unas h4"),
                     ("dnas h2 [eval:lm_eval]", "unas h2 [eval:lm_eval]"),
                     ("dnas h4 [eval:lm_eval]", "unas h4 [eval:lm_eval]")}
    assert {r["metric"] for r in rows if "eval" in r["system"]} == {"zeroshot/piqa/acc", "zeroshot/boolq/acc"}
    assert {r["metric"] for r in rows if "eval" not in r["system"]} == {"ppl"}
