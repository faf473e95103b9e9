"""Today's baselines from the command line, as a user runs them: each scheme trains a decoder-only
language model to its summary, with the attention-sink rate and the row mass per location and
every diagnostic that does not apply marked so (summary.json, W&B, nas-report); a scheme defined
for causal self-attention only is refused elsewhere in one line and runs at attention.decoder."""
import csv
import json
import os

import pytest

from helpers import nas_run, run_command, script
from nas_cli.infra.wandb_offline import read_run

SCHEMES = ["sigmoid", "differential", "gated", "forgetting", "stickbreaking", "softpick", "selective"]


def summary(run):
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_trains_a_language_model_with_its_sink_rate(scheme, tmp_path):
    run = tmp_path / "r"
    proc = nas_run(f"attention={scheme}", "task=copy_lm", "debug=fast", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = summary(run)
    assert s["scheme"] == scheme and s["steps"] == 20
    diag = s["diagnostics"]["decoder"]
    assert 0 <= diag["sink_rate"] <= 1 and diag["row_mass"] is not None
    declared = s["weights"]["decoder"]
    if scheme == "differential":  # negative weights: the distribution diagnostics do not apply, said why
        assert declared == {"nonnegative": False, "rows_sum_to_one": False, "weight_max": 1.0}
        assert diag["jsd_mean"] is None and "negative entries" in diag["not_applicable"]["jsd"]
        w = read_run(run)["summary"]
        assert "negative entries" in w["diag/decoder/jsd/not_applicable"]
    elif scheme in ("sigmoid", "softpick"):  # nonnegative rows of any mass: JSD of the row-normalized weights
        assert declared == {"nonnegative": True, "rows_sum_to_one": False, "weight_max": 1.0}
        assert diag["jsd_mean"] is not None and "row-normalized" in diag["derived"]["jsd"]
        assert "not_applicable" not in diag
    else:
        assert declared == {"nonnegative": True, "rows_sum_to_one": True, "weight_max": 1.0}
        assert diag["jsd_mean"] is not None and "derived" not in diag and "not_applicable" not in diag
        assert abs(diag["row_mass"] - 1) < 1e-4


@pytest.mark.parametrize("scheme", ["forgetting", "selective", "stickbreaking"])
def test_a_causal_only_scheme_on_translation_is_one_line_naming_the_decoder_form(scheme, tmp_path):
    proc = nas_run(f"attention={scheme}", "debug=fast", cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"attention.decoder={scheme}" in lines[0] and "causal self-attention only" in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_a_causal_only_scheme_runs_at_the_decoder_of_a_translation_model(tmp_path):
    run = tmp_path / "r"
    proc = nas_run("attention.decoder=forgetting", "debug=fast", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary(run)["placement"] == {"encoder": "unas", "decoder": "forgetting", "cross": "unas"}


def test_paired_heads_refuse_an_odd_number_in_one_line(tmp_path):
    proc = nas_run("attention=differential", "model.heads=1", "task=copy_lm", "debug=fast", cwd=tmp_path)
    assert proc.returncode == 2 and "model.heads=1 must be even" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow  # a four-run sweep through nas-report
def test_nas_report_compares_sink_rates_and_names_what_does_not_apply(tmp_path):
    sweep = tmp_path / "sweep"
    proc = nas_run("-m", "attention=unas,differential", "task=copy_lm", "debug=fast", "seed=1,2",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = run_command([script("nas-report"), str(sweep), "--baseline", "scheme=unas", "--metrics", "sink_rate,jsd"],
                      cwd=tmp_path, env={**os.environ, "COLUMNS": "250"})
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "sink rate" in rep.stdout and "differential h4 │ sink_rate" in rep.stdout
    tables = tmp_path / "tables"
    run_command([script("nas-report"), str(sweep), "--baseline", "scheme=unas", "--metrics", "sink_rate,jsd",
                 "--out", str(tables)], cwd=tmp_path, check=True)
    rows = {r["metric"]: r for r in csv.DictReader((tables / "comparison.csv").open())}
    assert rows["jsd"]["verdict"].startswith("not compared: jsd is undefined for these runs (attention weights "
                                             "with negative entries")
    assert rows["sink_rate"]["seeds"] == "1,2" and rows["sink_rate"]["paired"] == "True"
