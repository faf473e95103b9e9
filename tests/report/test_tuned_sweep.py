"""A tuned sweep from one command (tune=[optim.lr]), the README's line as written at small sizes: every
scheme at every value of the grid, the sweep's table with the tuned option, continued like every sweep, and
nas-report's choice, tuning table and verdicts under the named protocol."""
from __future__ import annotations

import json

from helpers import nas_run, run_command, script
from test_readme_compare import SMALL, readme_line

SWEEP = [*readme_line("nas-run -m attention=unas,dnas optim.lr=1e-3,3e-3 seed=1,2,3 tune=[optim.lr]")[1:], *SMALL,
         "task=copy_lm"]


def test_a_tuned_sweep_of_two_schemes_two_rates_and_two_seeds(tmp_path):
    sweep = tmp_path / "tuned"
    out = nas_run(*SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "optim.lr=1e-3,3e-3" in out.stderr and "tune=[optim.lr]" in out.stderr  # the sweep's line, as typed
    assert len(list(sweep.glob("*/summary.json"))) == 12
    table = [ln for ln in out.stdout.splitlines() if "copy_lm" in ln]
    assert len(table) == 12 and sum("0.001" in ln for ln in table) == 6 and sum("0.003" in ln for ln in table) == 6
    again = nas_run(*SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and "12 finished job(s) are skipped" in again.stderr

    report = run_command([script("nas-report"), str(sweep), "--baseline", "scheme=unas", "--no-item-tests",
                          "--format", "json"], cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    rows = doc["tuning"]["rows"]
    assert len(rows) == 4 and sorted(r["scheme"] for r in rows if r["chosen"]) == ["dnas", "unas"]
    for scheme in ("unas", "dnas"):  # the chosen rate has the lower mean validation loss of the two
        mine = [r for r in rows if r["scheme"] == scheme]
        best = min(mine, key=lambda r: r["mean_val"])
        assert best["chosen"] and best["validation_metric"] == "val/loss" and best["higher_is_better"] is False
    (row,) = [r for r in doc["comparison"]["rows"] if r["metric"] == "ppl"]
    chosen = {r["scheme"]: r["optim.lr"] for r in rows if r["chosen"]}
    assert row["system"] == f"dnas h4 optim.lr={chosen['dnas']} (tuned)"
    assert "Tuned (same-seed selection): each scheme at its own optim.lr" in doc["comparison"]["caption"]
    # the W&B report run carries the same tuning table
    wb = run_command([script("nas-report"), str(sweep), "--baseline", "scheme=unas", "--no-item-tests", "--wandb"],
                     cwd=tmp_path)
    assert wb.returncode == 0, wb.stderr
    (table,) = sweep.glob("nas-report/wandb/offline-run-*/files/media/table/report/tuning_*.table.json")
    logged = json.loads(table.read_text())
    assert {"cell", "optim.lr", "mean_val", "chosen", "protocol"} <= set(logged["columns"]) and len(logged["data"]) == 4
