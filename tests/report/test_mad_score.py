"""nas-report's MAD score over a tuned MAD-protocol sweep: each task at the value chosen by validation (never
by the test numbers), the mean over tasks per seed, and a 95% t interval over seeds (scipy's), per scheme;
the cells of the tuning table name their task."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy import stats

from helpers import run_command, script

TASKS = ("mad_recall", "mad_compression")


def _write(root, task, scheme, lr, seed, val, test):
    d = root / f"{task}-{scheme}-{lr}-{seed}"
    (d / ".hydra").mkdir(parents=True)
    config = {"task": {"name": task}, "attention": scheme, "optim": {"lr": lr}, "seed": seed, "tune": ["optim.lr"]}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (d / "summary.json").write_text(json.dumps({
        "task": task, "scheme": scheme, "heads": 4, "seed": seed,
        "best_val": {"metric": "val/mad_acc", "mode": "max", "value": val},
        "test": {"test/mad_acc": test}, "metrics": {"test/mad_acc": ["MAD acc.", True, "pct"]}}))


def test_the_mad_score_averages_the_tasks_at_their_chosen_values_per_seed(tmp_path):
    rng = np.random.default_rng(0)
    test = {}
    for task in TASKS:
        for scheme in ("unas", "dnas"):
            for lr in (1e-4, 1e-3):
                for seed in (1, 2, 3):
                    t = float(rng.uniform(0.2, 0.9))
                    test[task, scheme, lr, seed] = t
                    # validation prefers 1e-3 for recall and 1e-4 for compression; the test numbers are random
                    better = (lr == 1e-3) == (task == "mad_recall")
                    _write(tmp_path, task, scheme, lr, seed, 0.5 + 0.3 * better + 0.01 * seed, t)
    out = run_command([script("nas-report"), str(tmp_path), "--format", "json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cells = {r["cell"] for r in doc["tuning"]["rows"]}
    assert cells == {f"{t}: {s} h4" for t in TASKS for s in ("unas", "dnas")}
    rows = {r["system"]: r for r in doc["mad"]["rows"]}
    assert set(rows) == {"unas h4", "dnas h4"}
    chosen = {"mad_recall": 1e-3, "mad_compression": 1e-4}
    for scheme in ("unas", "dnas"):
        per_seed = [np.mean([test[t, scheme, chosen[t], s] for t in TASKS]) for s in (1, 2, 3)]
        half = stats.t.ppf(0.975, 2) * np.std(per_seed, ddof=1) / math.sqrt(3)
        row = rows[f"{scheme} h4"]
        assert row["mad_score"] == pytest.approx(np.mean(per_seed))
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((np.mean(per_seed) - half, np.mean(per_seed) + half))
        for t in TASKS:
            assert row[t] == pytest.approx(np.mean([test[t, scheme, chosen[t], s] for s in (1, 2, 3)]))
    text = run_command([script("nas-report"), str(tmp_path)], cwd=tmp_path)
    assert "MAD score" in text.stdout and "(n=3)" in text.stdout
