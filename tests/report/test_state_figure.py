"""Zoology's figure of recall against state size (nas_cli/report/html.py ``metric_vs_state``): the x of each run is
what decoding holds at the trained length, recomputed here from the summary's own byte counts, for attention, a
recurrent mixer and a hybrid of both; nas-report's HTML page draws the figure over the committed MQAR study runs."""
from __future__ import annotations

import json

import pytest
from datafiles import ROOT
from helpers import run_command, nas_run

from nas_cli.report.collect import find_runs
from nas_cli.report.html import state_bytes


@pytest.mark.slow  # trained runs
@pytest.mark.parametrize("args", [
    ["attention=unas"],
    ["attention=gated_deltanet"],
    ["attention=unas", "attention.per_layer=[{scheme:deltanet},null]"],
])
def test_state_bytes_add_the_recurrent_states_to_the_cache_at_the_trained_length(tmp_path, args):
    run = tmp_path / "run"
    proc = nas_run("task=mqar", "debug=fast", "model.positions=rope", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    (found,) = find_runs([str(run)])
    length = found.flat_config["task.seq_len"]
    kv, recurrent = summary["kv_cache_bytes_per_token"], summary["recurrent_state_bytes"] or 0
    assert state_bytes(found) == kv * length + recurrent
    if args[0] == "attention=gated_deltanet":
        assert kv == 0 and recurrent > 0  # a recurrent mixer: its state, the same at every length
    if len(args) > 1:
        assert kv > 0 and recurrent > 0  # a hybrid: one layer of each


@pytest.mark.slow  # the report over 24 of the study's trained runs, with its figures
def test_the_html_page_draws_recall_against_state_over_the_mqar_study(tmp_path):
    sweeps = [str(ROOT / "benchmarks" / "study" / name) for name in ("mqar64_rope", "mqar128_rope")]
    page = tmp_path / "report.html"
    proc = run_command(["nas-report", *sweeps, "--html", str(page), "--format", "json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = page.read_text()
    assert "<h2>Metric vs state size</h2>" in html and 'alt="mqar metric vs state size"' in html
    runs = [r for r in find_runs(sweeps) if r.finished]
    # runs written before the summary counted the cache: 2 x d_model x layers float32 numbers per position
    assert {state_bytes(r) for r in runs} == {2 * r.flat_config["model.d_model"] * r.flat_config["model.decoder_layers"]
                                              * 4 * r.flat_config["task.seq_len"] for r in runs}
