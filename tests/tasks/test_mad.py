"""MAD's six tasks train to summaries with MAD's score, MAD's protocol runs as a sweep, and nas-report gives
the MAD score per task and averaged with an interval over seeds (checked against scipy's t interval); the
MAD form of selective copying reports MAD's score beside the per-token accuracy."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import yaml
from scipy import stats

from helpers import nas_run

TASKS = ("mad_recall", "mad_noisy_recall", "mad_fuzzy_recall", "mad_selective_copy", "mad_compression",
         "mad_memorization")


@pytest.mark.slow  # one sweep of 12 small trained runs
def test_mad_protocol_sweep_reports_the_mad_score_with_an_interval_over_seeds(tmp_path):
    """Every MAD task trains in MAD's protocol (a narrow model here, for the test's time), and nas-report's
    MAD score is the mean over tasks per seed with a t interval over seeds; the choice among values of a
    tuned option is tests/report/test_mad_score.py's."""
    sweep = tmp_path / "mad"
    proc = nas_run("-m", "experiment=mad_protocol", f"task={','.join(TASKS)}", "seed=1,2", "debug=fast",
                   "optim.lr=1e-3", "tune=null", "model.d_model=32", "model.heads=4", "model.ffn=64",
                   "task.train_size=256", "task.val_size=64", "task.test_size=64", "model.max_len=256",
                   "logger=csv", f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc, val = {}, {}  # task -> lr -> seed -> test/mad_acc and best val/mad_acc
    for summary in sweep.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        lr = yaml.safe_load((summary.parent / ".hydra" / "config.yaml").read_text())["optim"]["lr"]
        assert s["best_val"]["metric"] == "val/mad_acc" and s["metrics"]["test/mad_acc"][1] is True
        assert 0 <= s["test"]["test/mad_acc"] <= 1
        acc.setdefault(s["task"], {}).setdefault(lr, {})[s["seed"]] = s["test"]["test/mad_acc"]
        val.setdefault(s["task"], {}).setdefault(lr, {})[s["seed"]] = s["best_val"]["value"]
    assert set(acc) == set(TASKS)
    chosen = {t: 1e-3 for t in TASKS}
    report = subprocess.run([sys.executable, "-m", "nas_cli.commands.nas_report", str(sweep), "--format", "json"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    doc = json.loads(report.stdout)
    (row,) = doc["mad"]["rows"]
    per_seed = [np.mean([acc[t][chosen[t]][s] for t in TASKS]) for s in (1, 2)]
    half = stats.t.ppf(0.975, 1) * np.std(per_seed, ddof=1) / math.sqrt(2)
    assert row["mad_score"] == pytest.approx(np.mean(per_seed))
    assert row["ci_low"] == pytest.approx(np.mean(per_seed) - half) and row["n"] == 2
    assert all(row[t] == pytest.approx(np.mean(list(acc[t][chosen[t]].values()))) for t in TASKS)


@pytest.mark.slow  # a trained run (the Mamba form's: tests/tasks/test_recall.py; the presets': test_debug_fast.py)
def test_the_mad_form_of_selective_copying_reports_both_accuracies(tmp_path):
    run = tmp_path / "r"
    proc = nas_run("task=selective_copy", "task.variant=mad", "task.seq_len=64", "task.train_size=512", "debug=fast",
                   "logger=csv", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["test"]["test/mad_acc"] <= 1 and 0 <= summary["test"]["test/copy_acc"] <= 1
    assert summary["best_val"]["metric"] == "val/copy_acc"
