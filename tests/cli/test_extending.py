"""docs/extending.md, done as a user does it: the files it names, in a folder outside the
package, run through the real ``nas-run`` with a few steps."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from datafiles import write_parallel
from helpers import run_command

ROOT = Path(__file__).resolve().parents[2]
NAS_RUN = str(Path(sys.executable).with_name("nas-run"))
NAS_REPORT = str(Path(sys.executable).with_name("nas-report"))
GUIDE = (ROOT / "docs" / "extending.md").read_text()


def _block(after: str, lang: str) -> str:
    """The first fenced ``lang`` block after the line containing ``after`` in the guide."""
    start = GUIDE.index(after)
    match = re.compile(rf"```{lang}\n(.*?)```", re.S).search(GUIDE, start)
    return match.group(1)


def _nas_run(*args, cwd: Path, env_extra: dict | None = None):
    env = {**os.environ, "WANDB_MODE": "offline", **(env_extra or {})}
    if env_extra and "PYTHONPATH" in env_extra and os.environ.get("PYTHONPATH"):  # keep the caller's too
        env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
    return run_command([NAS_RUN, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env,
                          check=False)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


FAST = ["debug=fast", "trainer.max_steps=6", "logger=csv", "progress_bar=false",
        "diagnostics.plots=never"]  # the figures: tests/diagnostics, and the learned value's below


def test_a_new_scheme_is_one_python_file_and_one_yaml(tmp_path):
    (tmp_path / "my_attention.py").write_text(_block("`my_attention.py`", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "uniform.yaml").write_text(_block("`my_conf/attention/uniform.yaml`", "yaml"))
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    env = {"PYTHONPATH": str(tmp_path)}
    everywhere = _nas_run(search, "attention=uniform", *FAST, f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path,
                          env_extra=env)
    assert everywhere.returncode == 0, everywhere.stderr[-3000:]
    assert _summary(tmp_path / "a")["placement"] == {"encoder": "uniform", "decoder": "uniform", "cross": "uniform"}
    cross = _nas_run(search, "attention.cross=uniform", *FAST, f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path,
                     env_extra=env)
    assert cross.returncode == 0, cross.stderr[-3000:]
    summary = _summary(tmp_path / "b")
    assert summary["placement"] == {"encoder": "unas", "decoder": "unas", "cross": "uniform"}
    assert summary["scheme"] == "enc-unas_dec-unas_cross-uniform"
    # the guard-rails reach the user's folder: a typo in the user scheme's name or in one of its
    # options is one line and exit 2, before anything is made
    for typo, words in [("attention=unifrom", "did you mean uniform?"),
                        ("attention._targte_=x", "did you mean attention._target_?")]:
        args = [search, typo] if typo.startswith("attention=") else [search, "attention=uniform", typo]
        bad = _nas_run(*args, *FAST, f"hydra.run.dir={tmp_path / 'typo'}", cwd=tmp_path, env_extra=env)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr[-2000:]
        assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) == 1 and not (tmp_path / "typo").exists()


def test_a_scheme_yaml_without_a_name_is_named_by_its_file_in_a_sweep_and_a_resume(tmp_path):
    """The guide's YAML has no name: a sweep job, composed afresh by Hydra, names the scheme after the file
    (here 'flat', not the class's 'uniform') in its directory, summary and saved config; a resume reads it back."""
    import yaml

    (tmp_path / "my_attention.py").write_text(_block("`my_attention.py`", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    guide_yaml = _block("`my_conf/attention/uniform.yaml`", "yaml")
    assert "name" not in guide_yaml
    (tmp_path / "my_conf" / "attention" / "flat.yaml").write_text(guide_yaml)
    env = {"PYTHONPATH": str(tmp_path)}
    sweep = _nas_run("-m", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "attention=flat",
                     "attention.cross=flat,unas", *FAST, f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path,
                     env_extra=env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    jobs = {p.name: p for p in (tmp_path / "s").iterdir() if p.is_dir()}
    assert sorted(jobs) == ["0_reverse_flat-h4", "1_reverse_enc-flat_dec-flat_cross-unas-h4"]
    mixed = jobs["1_reverse_enc-flat_dec-flat_cross-unas-h4"]
    assert _summary(mixed)["placement"] == {"encoder": "flat", "decoder": "flat", "cross": "unas"}
    saved = yaml.safe_load((mixed / ".hydra" / "config.yaml").read_text())["attention"]
    assert saved["name"] == "flat" and saved["cross"]["name"] == "unas"
    resumed = _nas_run(f"resume={jobs['0_reverse_flat-h4']}", "trainer.max_steps=8", cwd=tmp_path, env_extra=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = _summary(jobs["0_reverse_flat-h4"])
    assert summary["steps"] == 8 and summary["scheme"] == "flat", summary


def test_an_option_a_user_scheme_does_not_have_stops_the_run(tmp_path):
    """A typo in the user scheme's YAML, or +attention.<typo>=, is one line, exit 2, nothing made (not a run
    trained with the default); nas-bench check-scheme refuses the YAML too."""
    (tmp_path / "my_tempered.py").write_text(_block("`my_tempered.py`", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    guide_yaml = _block("`my_conf/attention/tempered.yaml`", "yaml")
    assert "init: 1.0" in guide_yaml
    yaml_file = tmp_path / "my_conf" / "attention" / "tempered.yaml"
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    env = {"PYTHONPATH": str(tmp_path)}
    # each with the run directory given, and with the default one (its name holds the scheme's tag, which Hydra
    # resolves before nas-run's check: that must not turn the refusal into a traceback), and in a sweep
    for yaml_text, extra in ((guide_yaml.replace("init: 1.0", "intit: 2.0"), []),
                             (guide_yaml, ["+attention.intit=2"])):
        yaml_file.write_text(yaml_text)
        for where in ([f"hydra.run.dir={tmp_path / 'typo'}"], [], ["-m", "seed=1,2"]):
            bad = _nas_run(search, "attention=tempered", *extra, *FAST, *where, cwd=tmp_path, env_extra=env)
            assert bad.returncode == 2, bad.stderr[-2000:]
            assert "tempered has no option 'intit' (did you mean attention.init?)" in bad.stderr
            assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) == 1, bad.stderr[-2000:]
            assert not (tmp_path / "typo").exists() and not (tmp_path / "outputs").exists()
    yaml_file.write_text(guide_yaml.replace("init: 1.0", "intit: 2.0"))
    bench = str(Path(NAS_RUN).with_name("nas-bench"))
    checked = run_command([bench, "check-scheme", str(yaml_file)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)
    assert checked.returncode == 2 and "no option 'intit' (did you mean attention.init?)" in checked.stderr
    # the option itself reaches the core: init=2.0 starts every head's temperature at 2
    yaml_file.write_text(guide_yaml.replace("init: 1.0", "init: 2.0"))
    ok = _nas_run(search, "attention=tempered", *FAST, f"hydra.run.dir={tmp_path / 'ok'}", cwd=tmp_path,
                  env_extra=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    import yaml

    saved = yaml.safe_load((tmp_path / "ok" / ".hydra" / "config.yaml").read_text())
    assert saved["attention"]["init"] == 2.0


def test_learned_values_are_logged_on_their_own_schedule(tmp_path):
    """A learned value reaches the loggers every log_learned_every steps, whatever Lightning's
    log_every_n_steps (on steps where both fall, a 3-step run would log none)."""
    import pandas as pd

    run = tmp_path / "run"
    proc = _nas_run("attention=hnas", *FAST, "trainer.max_steps=3", "log_learned_every=1",
                    "trainer.log_every_n_steps=50", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = pd.read_csv(run / "csv" / "metrics.csv")
    logged = metrics.dropna(subset=["u/encoder/L0/mean"])
    assert logged["step"].tolist() == [1, 2, 3]
    assert logged["u/encoder/L0/mean"].between(0, 1).all()


def test_a_user_runs_the_contract_checks_on_their_own_scheme(tmp_path):
    """The guide's `nas-bench check-scheme` on the guide's scheme passes; a scheme
    that ignores the mask (sees the future and the padding) fails, naming the checks."""
    (tmp_path / "my_attention.py").write_text(_block("`my_attention.py`", "python") + (
        "\n\nclass Leaky(Uniform):\n    qk_gradients = True\n\n"
        "    def weights_from_logits(self, logits, allowed):\n        return logits.softmax(-1)\n"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "uniform.yaml").write_text(_block("`my_conf/attention/uniform.yaml`", "yaml"))
    (tmp_path / "my_conf" / "attention" / "leaky.yaml").write_text("name: leaky\n_target_: my_attention.Leaky\n")
    args = _guide_command("through the contract every packaged scheme passes", "nas-bench")
    bench = str(Path(NAS_RUN).with_name("nas-bench"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    ok = run_command([bench, *args], cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert ok.returncode == 0 and "12 of 12 checks passed" in ok.stdout, ok.stdout + ok.stderr[-2000:]
    bad = run_command([bench, "check-scheme", "my_conf/attention/leaky.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, env=env, check=False)
    assert bad.returncode == 1 and "FAILED: the future leaks" in bad.stdout
    assert "failed: padding, padding_causal" in bad.stdout
    missing = run_command([bench, "check-scheme", "my_conf/attention/nope.yaml"], cwd=tmp_path,
                             capture_output=True, text=True, env=env, check=False)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_the_uniform_scheme_of_the_guide_meets_the_contract(tmp_path, monkeypatch):
    """The guide's scheme really is uniform, and declares that q and k get no gradient."""
    import torch

    (tmp_path / "my_attention.py").write_text(_block("`my_attention.py`", "python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_attention import Uniform

    core = Uniform(heads=2, causal=True).double()
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    res = core(q, k, v, need_weights=True)
    expected = torch.tril(torch.ones(5, 5, dtype=torch.float64)) / torch.arange(1, 6, dtype=torch.float64)[:, None]
    torch.testing.assert_close(res.weights[0, 0], expected)  # causal and uniform: 1/(i+1) over keys <= i
    res.out.sum().backward()
    assert not core.qk_gradients and float(q.grad.abs().max()) == 0.0


def test_a_new_translation_corpus_is_one_yaml(tmp_path):
    data = write_parallel(tmp_path / "data", n=(80, 10, 10))
    (tmp_path / "my_conf" / "task").mkdir(parents=True)
    yaml = _block("`my_conf/task/my_pairs.yaml`", "yaml").replace("/data/my_pairs", str(data))
    (tmp_path / "my_conf" / "task" / "my_pairs.yaml").write_text(yaml.replace("vocab_size: 8000", "vocab_size: 120"))
    proc = _nas_run(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "task=my_pairs", "attention=dnas", *FAST,
                    "task.max_tokens=256", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                    env_extra={"NAS_RUN_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(tmp_path / "run")
    assert summary["task"] == "my_pairs" and summary["steps"] == 6
    assert "test/bleu" in summary["test"]


def test_a_new_diagnostic_is_one_python_file_and_one_config_entry(tmp_path):
    """The guide's metric runs as a plug-in from a folder outside the package, kept on by the guide's
    preset; its numbers equal a direct computation on what the run wrote, and nas-report shows its
    column, compares it by its short name and puts it in the HTML page without knowing it."""
    (tmp_path / "my_metrics.py").write_text(_block("`my_metrics.py`", "python"))
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "with_max_weight.yaml").write_text(
        _block("`my_conf/experiment/with_max_weight.yaml`", "yaml"))
    preset = re.search(r"`PYTHONPATH=\. nas-run (hydra\.searchpath=\S+) (experiment=with_max_weight)`", GUIDE)
    entry = re.search(r"'(\+diagnostics\.metrics\.max_weight=[^']+)'", GUIDE).group(1)
    runs = {}
    for seed, how in ((1, [entry]), (2, list(preset.groups()))):  # the command line's entry, then the preset
        runs[seed] = tmp_path / "runs" / f"run{seed}"
        proc = _nas_run(*how, *FAST, "trainer.val_check_interval=6", "trainer.max_epochs=-1", f"seed={seed}",
                        f"hydra.run.dir={runs[seed]}", cwd=tmp_path, env_extra={"PYTHONPATH": "."})
        assert proc.returncode == 0, proc.stderr[-3000:]
    run = runs[1]
    latest = json.loads((run / "diagnostics" / "latest.json").read_text())
    for loc, data in latest["locations"].items():
        per_layer = [e["max_weight"] for e in data["layers"]]
        assert all(0 < v <= 1 for v in per_layer)
        assert data["max_weight"] == pytest.approx(sum(per_layer) / len(per_layer))
        assert "jsd_mean" in data  # the default metrics still run
    summary = json.loads((run / "diagnostics" / "summary.json").read_text())
    assert {"name": "max_weight", "title": "max weight", "format": "p3", "key": None, "over_locations": "mean",
            "column": True} in summary["reported"]
    report = run_command([NAS_REPORT, str(tmp_path / "runs"), "--format", "csv", "--group-by", "seed",
                          "--html", str(tmp_path / "page.html")], timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    import io

    import pandas as pd

    table = pd.read_csv(io.StringIO(report.stdout))  # the runs table, one row per number, its title beside it
    row = table[(table["title"] == "max weight") & (table["seeds"].astype(str) == "1")].iloc[0]
    mean = sum(d["max_weight"] for d in summary["locations"].values()) / len(summary["locations"])
    assert row["metric"] == "max_weight" and row["mean"] == pytest.approx(mean, abs=1e-6)
    page = (tmp_path / "page.html").read_text()
    assert page.count("max weight") >= 2  # the results table and the diagnostics per location
    # compared by its short name, as the built-ins are
    compared = run_command([NAS_REPORT, str(tmp_path / "runs"), "--group-by", "seed", "--baseline", "seed=1",
                            "--metrics", "max_weight", "--format", "csv"], timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    verdicts = pd.read_csv(io.StringIO(compared.stdout))
    assert list(verdicts["metric"]) == ["max_weight"]


def test_a_diagnostic_draws_its_own_section_of_the_html_page(tmp_path):
    """The guide's drawn metric, from a folder outside the package: nas-report --html gives it its own section
    with one figure per location; without its module on PYTHONPATH the page is made without that section."""
    (tmp_path / "my_metrics.py").write_text(_block("`my_metrics.py`", "python"))
    (tmp_path / "my_metrics_page.py").write_text(_block("`my_metrics_page.py`", "python"))
    run_line, report_line = [_guide_command("`my_metrics_page.py`", p) for p in ("nas-run", "nas-report")]
    proc = _nas_run(*run_line, *FAST, f"hydra.run.dir={tmp_path / 'outputs' / 'runs' / 'r'}", cwd=tmp_path,
                    env_extra={"PYTHONPATH": "."})
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": "."}
    page = run_command([str(Path(NAS_RUN).with_name("nas-report")), *report_line], cwd=tmp_path, env=env,
                       capture_output=True, text=True, check=False)
    assert page.returncode == 0, page.stderr[-2000:]
    text = (tmp_path / "report.html").read_text()
    assert "<h2>Largest weight per layer</h2>" in text and "<h2>Head JSD heat maps</h2>" in text
    for loc in ("encoder", "decoder", "cross"):
        assert f'alt="max weight, {loc} attention"' in text
    plain = run_command([str(Path(NAS_RUN).with_name("nas-report")), "outputs/runs", "--html", "plain.html"],
                        cwd=tmp_path, capture_output=True, text=True, check=False,
                        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert plain.returncode == 0, plain.stderr[-2000:]
    other = (tmp_path / "plain.html").read_text()
    assert "Largest weight per layer" not in other and "<h2>Head JSD heat maps</h2>" in other


def _guide_command(after: str, program: str) -> list[str]:
    """The guide's command line for ``program`` in the first bash block after ``after``, as words."""
    import shlex

    line = next(ln for ln in _block(after, "bash").splitlines() if program in ln.split("#")[0])
    words = shlex.split(line.split("#")[0])
    return words[words.index(program) + 1:]


def _report(*args, cwd: Path):
    return run_command([str(Path(NAS_RUN).with_name("nas-report")), *args], capture_output=True, text=True,
                          cwd=cwd, check=False)


def test_the_guides_task_with_its_own_metric(tmp_path):
    """A new task with its own metric is 1 .py + 1 YAML from a folder outside the
    package (the guide's own files and commands), and its declared metric shows in nas-run's
    result table and in nas-report, titled as declared, with a verdict in its better direction."""
    (tmp_path / "my_task.py").write_text(_block("`my_task.py`", "python"))
    (tmp_path / "my_conf" / "task").mkdir(parents=True)
    (tmp_path / "my_conf" / "task" / "add_one.yaml").write_text(_block("`my_conf/task/add_one.yaml`", "yaml"))
    run_args = _guide_command("`my_conf/task/add_one.yaml`", "nas-run")
    assert run_args[0] == "-m" and "task=add_one" in run_args
    proc = _nas_run(*run_args, *FAST, cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "length acc." in proc.stdout  # nas-run's table, titled as the task declared it
    runs = sorted((tmp_path / "add_one").glob("*/summary.json"))
    assert len(runs) == 4
    summary = json.loads(runs[0].read_text())
    assert summary["metrics"] == {"test/length_acc": ["length acc.", True, "p3"]}
    assert 0 <= summary["test"]["test/length_acc"] <= 1
    report_args = _guide_command("`my_conf/task/add_one.yaml`", "nas-report")
    shown = _report(*report_args, cwd=tmp_path)
    assert shown.returncode == 0 and "length acc." in shown.stdout, shown.stderr[-2000:]
    doc = json.loads(_report(*report_args, "--format", "json", "--no-item-tests", cwd=tmp_path).stdout)
    assert "length acc." in doc["runs"]["columns"]
    row = next(r for r in doc["comparison"]["rows"] if r["metric"] == "length_acc")
    values = {json.loads(p.read_text())["seed"]: json.loads(p.read_text())["test"]["test/length_acc"]
              for p in runs if json.loads(p.read_text())["scheme"] == "dnas"}
    assert row["seeds"] == [1, 2] and row["system_mean"] == pytest.approx(sum(values.values()) / 2)
    # a declared better direction: better / worse (never the direction-free higher / lower)
    assert row["verdict"].startswith(("better", "worse", "no significant"))


def test_an_undeclared_metric_still_reaches_the_tables(tmp_path):
    """A number score() returns that the task did not declare still gets a column and a verdict
    over seeds, titled by its key, with no better direction (higher/lower)."""
    (tmp_path / "my_task.py").write_text(
        "from tasks.synthetic import SyntheticSeq2Seq\n\n\n"
        "class DigitSort(SyntheticSeq2Seq):\n"
        "    def score(self, hyps, refs):\n"
        "        out = super().score(hyps, refs)\n"
        "        out['digit_acc'] = sum(h[:1] == r[:1] for h, r in zip(hyps, refs)) / max(len(hyps), 1)\n"
        "        return out\n")
    (tmp_path / "my_conf" / "task").mkdir(parents=True)
    (tmp_path / "my_conf" / "task" / "digits.yaml").write_text(
        "defaults:\n  - sort\n  - _self_\n_target_: my_task.DigitSort\nname: digits\ntrain_size: 640\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    sweep = tmp_path / "sweep"
    proc = _nas_run("-m", search, "task=digits", *FAST, "seed=1,2", "attention=unas,dnas", f"hydra.sweep.dir={sweep}",
                    cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "digit_acc" in proc.stdout  # nas-run's table
    report = _report(str(sweep), "--baseline", "scheme=unas", "--format", "json", "--no-item-tests", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    doc = json.loads(report.stdout)
    assert "digit_acc" in doc["runs"]["columns"]
    row = next(r for r in doc["comparison"]["rows"] if r["metric"] == "digit_acc")
    assert row["seeds"] == [1, 2] and row["verdict"].startswith(("higher", "lower", "no significant"))


def test_a_malformed_metrics_declaration_is_one_line_before_training(tmp_path):
    (tmp_path / "my_task.py").write_text(_block("`my_task.py`", "python").replace(
        '("length acc.", True)', '("length acc.", "up")'))
    (tmp_path / "my_conf" / "task").mkdir(parents=True)
    (tmp_path / "my_conf" / "task" / "add_one.yaml").write_text(_block("`my_conf/task/add_one.yaml`", "yaml"))
    bad = _nas_run(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "task=add_one", *FAST,
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert bad.returncode == 2 and "task metric 'length_acc'" in bad.stderr, bad.stderr[-2000:]
    assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) == 1
    assert not (tmp_path / "run").exists()  # refused by the pre-run check: nothing made


def test_a_user_schemes_learned_value_reaches_wandb_and_nas_report(tmp_path):
    """A learnable per-head value of a user scheme (the guide's temperature) reaches
    W&B, summary.json, the diagnostics and nas-report with no edit to nas-run."""
    from nas_cli.infra.wandb_offline import read_run

    (tmp_path / "my_tempered.py").write_text(_block("`my_tempered.py`", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "tempered.yaml").write_text(
        _block("`my_conf/attention/tempered.yaml`", "yaml"))
    run_args = _guide_command("`my_conf/attention/tempered.yaml`", "nas-run")
    fast = [a for a in FAST if not a.startswith(("logger=", "diagnostics.plots="))]  # W&B, and its figure
    proc = _nas_run(*run_args, *fast, cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = sorted((tmp_path / "tempered").glob("0_*"))[0]
    wb = read_run(run_dir / "wandb")
    logged = set().union(*map(set, wb["history"]))
    assert {"temp/encoder/L0/h0", "temp/decoder/L1/mean", "temp/cross/L0/h3"} <= logged
    first = next(h["temp/encoder/L0/h0"] for h in wb["history"] if "temp/encoder/L0/h0" in h)
    assert first == pytest.approx(1.0, abs=0.05)  # exp(0) at the start
    summary = _summary(run_dir)
    assert summary["learned"]["temp/encoder/L0/h0"] > 0
    diag = json.loads((run_dir / "diagnostics" / "summary.json").read_text())
    assert diag["learned_titles"] == {"temp": "temperature per layer and head"}
    assert (run_dir / "diagnostics" / "temp_trajectories.png").is_file()
    report_args = _guide_command("`my_conf/attention/tempered.yaml`", "nas-report")
    shown = _report(*report_args, cwd=tmp_path)
    assert shown.returncode == 0 and "temp (mean)" in shown.stdout, shown.stderr[-2000:]
    doc = json.loads(_report(*report_args, "--format", "json", "--no-item-tests", cwd=tmp_path).stdout)
    assert "temp (mean)" in doc["runs"]["columns"]
    mean = diag["locations"]["encoder"]["temp_mean"]
    assert mean == pytest.approx(np.mean([v for k, v in summary["learned"].items()
                                          if k.startswith("temp/encoder/") and "/h" in k]))


def test_a_user_language_model_task_is_sized_as_a_language_model(tmp_path, monkeypatch):
    """One test of "is this a language model", the class's kind (not the _target_ ending in
    LanguageModelTask): a user's LM task is sized as a language model, without cross-attention."""
    from helpers import compose_cfg
    from nas_cli.pipeline.checks.config import check_config, is_language_model

    (tmp_path / "my_lm.py").write_text("from tasks.language_model import LanguageModelTask\n\n\n"
                                       "class Corpus(LanguageModelTask):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from datafiles import write_lm

    data = write_lm(tmp_path / "lm")  # the pre-run check reads where the data are
    builtin = compose_cfg("task=wikitext2", f"task.path={data}")
    mine = compose_cfg("task=wikitext2", f"task.path={data}", "task._target_=my_lm.Corpus")
    assert is_language_model(builtin) and is_language_model(mine)
    assert check_config(mine).parameters == check_config(builtin).parameters
    assert not is_language_model(compose_cfg("task=sort"))


def test_the_guides_check_option_gives_one_line_naming_the_option(tmp_path):
    """The guide's scheme with a checked option: a bad value stops nas-run in one line, exit 2, nothing made."""
    (tmp_path / "my_sharp.py").write_text(_block("**A value error in one line.**", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "sharpened.yaml").write_text(
        "name: sharpened\n_target_: my_sharp.Sharpened\npower: 2.0\n")
    proc = _nas_run(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "attention=sharpened", "attention.power=-1",
                    *FAST, cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "attention.power must be a positive number (got -1)" in lines[0], proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_the_guides_table_counts_the_lines_of_its_blocks():
    table = {row[0]: row[1:] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in GUIDE.splitlines() if line.startswith("| a "))}

    def lines(caption: str, lang: str) -> int:
        return sum(1 for ln in _block(caption, lang).splitlines() if ln.strip())

    assert table["a scheme (uniform weights)"][1] == (f"{lines('`my_attention.py`', 'python')} + "
                                                      f"{lines('`my_conf/attention/uniform.yaml`', 'yaml')}")
    assert table["a scheme with an option and a learned value (temperature)"][1] == (
        f"{lines('`my_tempered.py`', 'python')} + {lines('`my_conf/attention/tempered.yaml`', 'yaml')}")
    assert table["a diagnostic with a short name in nas-report"][1] == str(lines("`my_metrics.py`", "python"))
    assert f"a {lines('`my_conf/experiment/with_max_weight.yaml`', 'yaml')}-line preset" in \
        table["a diagnostic with a short name in nas-report"][0]


def test_a_scheme_whose_rows_do_not_sum_to_one_passes_the_contract_and_says_what_its_diagnostics_are(tmp_path):
    """The guide's third walk-through: sigmoid attention from outside the package, declared
    ``rows_sum_to_one = False``, passes every check of nas-bench check-scheme, and its run records
    that head JSD was computed on row-normalized weights."""
    (tmp_path / "my_sigmoid.py").write_text(_block("`my_sigmoid.py`", "python"))
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "my_sigmoid.yaml").write_text(
        _block("`my_conf/attention/my_sigmoid.yaml`", "yaml"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bench = str(Path(sys.executable).with_name("nas-bench"))
    checked = run_command([bench, "check-scheme", "my_conf/attention/my_sigmoid.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert checked.returncode == 0 and "FAILED" not in checked.stdout, checked.stdout + checked.stderr
    assert "rows" in checked.stdout
    run = tmp_path / "r"
    proc = _nas_run(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "attention=my_sigmoid", "task=copy_lm",
                    "debug=fast", f"hydra.run.dir={run}", cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    diag = _summary(run)["diagnostics"]["decoder"]
    assert "row-normalized" in diag["derived"]["jsd"] and 0 <= diag["sink_rate"] <= 1
    assert _summary(run)["weights"]["decoder"]["rows_sum_to_one"] is False


def test_a_scheme_whose_weights_have_no_bound_declares_it_and_passes_the_contract(tmp_path):
    """The guide's ReLU attention without its 1/L scale, from outside the package: declared ``weight_max =
    math.inf`` it passes every check of nas-bench check-scheme; without the declaration the rows check fails
    naming it; its run computes the sink rate on each row's shares of its mass and says so."""
    source = _block("`my_relu.py`", "python")
    (tmp_path / "my_relu.py").write_text(source)
    (tmp_path / "my_conf" / "attention").mkdir(parents=True)
    (tmp_path / "my_conf" / "attention" / "my_relu.yaml").write_text(_block("`my_conf/attention/my_relu.yaml`", "yaml"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bench = str(Path(sys.executable).with_name("nas-bench"))
    checked = run_command([bench, "check-scheme", "my_conf/attention/my_relu.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert checked.returncode == 0 and "FAILED" not in checked.stdout, checked.stdout + checked.stderr
    (tmp_path / "my_relu.py").write_text(source.replace("    weight_max = math.inf", "    pass  #"))
    refused = run_command([bench, "check-scheme", "my_conf/attention/my_relu.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 1 and "a weight above weight_max = 1 (declare" in refused.stdout, refused.stdout
    (tmp_path / "my_relu.py").write_text(source)
    run = tmp_path / "r"
    proc = _nas_run(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "attention=my_relu", "task=copy_lm",
                    "debug=fast", f"hydra.run.dir={run}", cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(run)
    assert summary["weights"]["decoder"]["weight_max"] is None
    assert "shares of its mass" in summary["diagnostics"]["decoder"]["derived"]["sink_rate"]
    assert 0 <= summary["diagnostics"]["decoder"]["sink_rate"] <= 1
