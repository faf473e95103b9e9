"""Real tiny sweeps with diagnostics on (the default), then ``nas-report`` on them: table,
seed grouping, unfinished runs, bad input, the HTML page in a headless browser, and what
the diagnostics callback put into an offline W&B run (it shares the seed sweep)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from nas_cli.model.choices import CONF_DIR
from nas_cli.infra.wandb_offline import read_run
from helpers import run_command

BIN = Path(sys.executable).parent
NAS_RUN = shutil.which("nas-run") or str(BIN / "nas-run")
NAS_REPORT = shutil.which("nas-report") or str(BIN / "nas-report")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
from nas_cli.model.locations import LOCATIONS
DATA = ("debug=fast", "task.test_size=32")  # the sweep's data (the test split size shapes the others)
JOBS = ["0_reverse_unas-h2", "1_reverse_unas-h4", "2_reverse_dnas-h2", "3_reverse_dnas-h4"]


def _env():
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "250"}
    env.pop("WANDB_MODE", None)
    return env


def run_cmd(exe, *args, cwd, timeout=300):
    return run_command([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """4 jobs (UNAS/DNAS x 2/4 heads), 10 steps, one validation at step 10, CSV logger."""
    tmp = tmp_path_factory.mktemp("sweep")
    proc = run_cmd(NAS_RUN, "-m", *DATA, "trainer.max_steps=10", "attention=unas,dnas", "model.heads=2,4",
                   "logger=csv", f"hydra.sweep.dir={tmp / 'sweep'}", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "sweep"


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory):
    """HNAS, seeds 1 and 2, default logger (W&B offline), no test split: 10 steps,
    validations at steps 5 and 10."""
    tmp = tmp_path_factory.mktemp("seeds")
    proc = run_cmd(NAS_RUN, "-m", "debug=fast", "attention=hnas", "seed=1,2", "run_test=false",
                   "trainer.max_steps=10", "trainer.val_check_interval=5", f"hydra.sweep.dir={tmp / 'seeds'}", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "seeds"


@pytest.fixture(scope="module")
def report(sweep, seed_sweep, tmp_path_factory):
    """``nas-report`` on both sweeps with an HTML page: (completed process, html path)."""
    tmp = tmp_path_factory.mktemp("report")
    html = tmp / "r.html"
    proc = run_cmd(NAS_REPORT, str(sweep), str(seed_sweep), "--html", str(html), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return proc, html


def _validation_batches(n=2):
    """The first n validation batches of the debug job, built from the real config as the run reads
    them (debug=fast's eval_batch_items cuts the task's batches)."""
    from nas_cli.infra.distributed import shard_and_resume

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(DATA))
    task = instantiate(cfg.task, _convert_="all")
    task.setup("fit")
    it = iter(shard_and_resume(task, cfg.seed, cfg.train_batch_items, cfg.eval_batch_items).val_dataloader())
    return [next(it) for _ in range(n)], task.pad_id


def test_sweep_jobs_write_diagnostics_and_dnas_obeys_theorem2(sweep):
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == JOBS
    batches, pad = _validation_batches(2)
    src_real = torch.cat([(b["src"] != pad).sum(1) for b in batches])  # real source tokens per sample
    tgt_real = torch.cat([(b["tgt_in"] != pad).sum(1) for b in batches])
    assert int(src_real.min()) < int(src_real.max())  # the batches are padded: the per-sample case is exercised
    for job in JOBS:
        diag = sweep / job / "diagnostics"
        for name in ["latest.json", "step_10.json", "summary.json",
                     *[f"{kind}_{loc}.png" for kind in ("jsd", "explained_away") for loc in LOCATIONS]]:
            assert (diag / name).is_file(), f"{job}: {name} missing"
        for png in diag.glob("*.png"):
            assert png.read_bytes()[:8] == PNG_MAGIC
        latest = json.loads((diag / "latest.json").read_text())
        assert latest == json.loads((diag / "step_10.json").read_text())
        assert latest["step"] == 10 and latest["samples"] == len(src_real)
        heads = 2 if job.endswith("h2") else 4
        for loc in LOCATIONS:
            layers = latest["locations"][loc]["layers"]
            assert len(layers) == 2
            for e in layers:
                m = np.array(e["jsd"])
                assert m.shape == (heads, heads) and np.allclose(m, m.T) and np.all(np.diag(m) == 0)
                assert np.all(m[~np.eye(heads, dtype=bool)] > 0)  # distinct heads of a random init
                ea = e["explained_away"]
                # every real key of every sample counted once per head: padding is excluded per sample
                keys = src_real if loc in ("encoder", "cross") else tgt_real
                assert ea["n_keys"] == int(keys.sum())
                assert np.array(ea["counts"]).sum(1).tolist() == [ea["n_keys"]] * heads
                assert ea["sk_max"] == int(keys.max()) and ea["sk_min"] == int(keys.min())
        # cross-attention with dot-product scores depends on the decoder state (the blog post "Why Bahdanau's neural attention requires two layers")
        assert min(min(e["step_variation"]) for e in latest["locations"]["cross"]["layers"]) > 1e-3
        if "dnas" in job:  # Ding et al. Theorem 2 (non-causal encoder): every key keeps mass >= 1/Sk
            for e in latest["locations"]["encoder"]["layers"]:
                assert min(e["explained_away"]["min_margin"]) >= -1e-6
                assert e["explained_away"]["fraction_explained_away"] == [0.0] * heads
            assert latest["locations"]["encoder"]["explained_away_frac"] == 0.0
        summary = json.loads((diag / "summary.json").read_text())
        assert summary["validations_analysed"] == 1 and summary["seconds"] > 0
        assert summary["locations"]["encoder"]["jsd_mean"] == pytest.approx(
            np.mean([e["jsd_mean"] for e in latest["locations"]["encoder"]["layers"]]))
        # the scalars reached the CSV logger at the validation step
        header = (sweep / job / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
        for key in ("diag/encoder/jsd_mean", "diag/cross/layer1/explained_away_frac",
                    "diag/decoder/layer0/min_log_mass_margin", "diag/encoder/layer0/entropy/h1"):
            assert key in header, key


def _table(stdout: str) -> tuple[list[str], list[list[str]]]:
    """(column titles, rows of cells) of the first rich table in ``stdout``."""
    lines = stdout.splitlines()
    head = next(l for l in lines if l.startswith("┃"))
    start = lines.index(head)
    rows = []
    for l in lines[start + 1:]:
        if l.startswith("└"):
            break
        if l.startswith("│"):
            rows.append([c.strip() for c in l.strip("│").split("│")])
    return [c.strip() for c in head.strip("┃").split("┃")], rows


def test_report_on_sweep_prints_table_and_writes_html(sweep, report):
    proc, html = report
    cols, rows = _table(proc.stdout)
    plain = [r for r in rows if r[cols.index("scheme")] in ("unas", "dnas")]
    assert len(plain) == 4
    assert sorted((r[1], r[2]) for r in plain) == [("dnas", "2"), ("dnas", "4"), ("unas", "2"), ("unas", "4")]
    for job in JOBS:  # the numbers in the table are the runs' own
        s = json.loads((sweep / job / "summary.json").read_text())
        row = next(r for r in plain if (r[1], r[2]) == (s["scheme"], str(s["heads"])))
        assert row[cols.index("n")] == "1"
        assert row[cols.index("params")] == f"{s['parameters']:,}"
        assert row[cols.index("BLEU")] == f"{s['test']['test/bleu']:.2f}"
        assert row[cols.index("test ppl")] == f"{s['test']['test/ppl']:.3f}"
        diag = json.loads((sweep / job / "diagnostics" / "summary.json").read_text())["locations"]
        assert row[cols.index("JSD")] == f"{np.mean([d['jsd_mean'] for d in diag.values()]):.3f}"
        ea = np.mean([d["explained_away_frac"] for d in diag.values()])
        assert row[cols.index("expl. away")] == f"{100 * ea:.1f}%"
    text = html.read_text()
    assert text.count("<img ") >= 10 and "data:image/png;base64," in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing loaded from outside
    for heading in ("Metric vs number of heads", "Head JSD heat maps", "Explained away", "Learned per head, over training"):
        assert heading in text
    assert 'alt="HNAS u per layer and head (1 = DNAS, 0 = UNAS)"' in text  # the title the scheme declared


def test_report_groups_runs_that_differ_only_by_seed(seed_sweep, report, tmp_path):
    proc, _ = report
    runs = [json.loads(p.read_text()) for p in sorted(seed_sweep.glob("*/summary.json"))]
    assert [r["seed"] for r in runs] == [1, 2]
    cols, rows = _table(proc.stdout)
    hnas = [r for r in rows if r[cols.index("scheme")] == "hnas"]
    assert len(hnas) == 1
    row = hnas[0]
    assert row[cols.index("n")] == "2" and row[cols.index("seeds")] == "1,2"
    # mean ± half-width of the 95% Student-t interval over the two seeds of the diagnostics' JSD
    # (different inits: different values), checked against scipy
    jsd = [np.mean([d["jsd_mean"] for d in json.loads((seed_sweep / j / "diagnostics" / "summary.json")
                                                       .read_text())["locations"].values()])
           for j in sorted(p.name for p in seed_sweep.iterdir() if (p / "summary.json").exists())]
    assert jsd[0] != jsd[1]
    from scipy import stats as st

    low, high = st.t.interval(0.95, len(jsd) - 1, loc=np.mean(jsd), scale=st.sem(jsd))
    assert row[cols.index("JSD")] == f"{np.mean(jsd):.3f} ± {(high - low) / 2:.3f}"
    assert "test ppl" not in cols or row[cols.index("test ppl")] == "-"  # run_test=false

    # one row per run on request; an unfinished run (config, no summary.json) is listed, not fatal
    shutil.copytree(seed_sweep / "0_reverse_hnas-h4" / ".hydra", tmp_path / "killed" / ".hydra")
    proc = run_cmd(NAS_REPORT, str(seed_sweep), str(tmp_path), "--group-by", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cols, rows = _table(proc.stdout)
    assert sorted(r[cols.index("seed")] for r in rows) == ["1", "2"]
    assert "0 failed, 1 unfinished (no summary.json)" in proc.stdout and str(tmp_path / "killed") in proc.stdout
    # the markdown export (what goes into a paper's notes) lists it too: no run is dropped silently
    md = run_cmd(NAS_REPORT, str(seed_sweep), str(tmp_path), "--format", "markdown", cwd=tmp_path)
    assert md.returncode == 0, md.stderr
    assert "**runs without results: 0 failed, 1 unfinished (no summary.json)**" in md.stdout
    assert f"| {tmp_path / 'killed'} | unfinished |" in md.stdout


def test_offline_wandb_history_holds_diagnostics(seed_sweep):
    """The DiagnosticsCallback's W&B side: scalars, histograms, images, u line series."""
    run_dir = seed_sweep / "0_reverse_hnas-h4"
    wb = read_run(run_dir / "wandb")
    latest = json.loads((run_dir / "diagnostics" / "latest.json").read_text())
    assert latest["step"] == 10
    at_10 = {}
    for h in wb["history"]:
        if h.get("trainer/global_step") == 10:
            at_10.update(h)
    enc = latest["locations"]["encoder"]
    assert at_10["diag/encoder/jsd_mean"] == pytest.approx(enc["jsd_mean"])
    assert at_10["diag/encoder/layer1/jsd_mean"] == pytest.approx(enc["layers"][1]["jsd_mean"])
    assert at_10["diag/cross/layer0/entropy/h2"] == pytest.approx(latest["locations"]["cross"]["layers"][0]["entropy"][2])
    assert at_10["diag/decoder/layer1/min_log_mass_margin"] == pytest.approx(
        min(latest["locations"]["decoder"]["layers"][1]["explained_away"]["min_margin"]))
    # the log-mass histogram as a wandb.Histogram on the shared bins, heads summed
    ea = enc["layers"][0]["explained_away"]
    assert at_10["diag/encoder/layer0/log_mass_hist/_type"] == "histogram"
    assert at_10["diag/encoder/layer0/log_mass_hist/bins"] == pytest.approx(ea["bin_edges"])
    assert at_10["diag/encoder/layer0/log_mass_hist/values"] == np.array(ea["counts"]).sum(0).tolist()
    logged = set().union(*map(set, wb["history"]))
    for key in ("diag/encoder/layer0/jsd_mean", "diag/images/jsd_encoder/_type",
                "diag/images/explained_away_cross/_type", "diag/images/u_trajectories/_type",
                "diag/u_lines/encoder_table/_type"):
        assert key in logged, key
    assert any("diag/encoder/jsd_mean" in h and h.get("trainer/global_step") == 5 for h in wb["history"])
    # HNAS's learned u: the start, every log_learned_every (5) steps, and the validations
    s = json.loads((run_dir / "diagnostics" / "summary.json").read_text())
    assert [h["step"] for h in s["learned_history"]] == [0, 5, 10]
    assert np.array(s["learned_history"][0]["values"]["u"]["encoder"]).shape == (2, 4)
    assert (run_dir / "diagnostics" / "u_trajectories.png").is_file()
    # and its mean per location as a nas-report column, declared beside the diagnostics' numbers
    declared = {d["name"]: d for d in s["reported"]}
    assert declared["u_mean"]["title"] == "u (mean)" and declared["u_mean"]["column"]
    assert {"jsd", "explained_away", "min_margin", "entropy", "step_variation"} <= set(declared)
    assert s["locations"]["encoder"]["u_mean"] == pytest.approx(
        np.mean(s["learned_history"][-1]["values"]["u"]["encoder"]))


@pytest.mark.parametrize("make_args,needle", [
    (lambda t: [str(t / "missing")], "no such file or directory"),
    (lambda t: [str(t)], "no nas-run runs"),
])
def test_report_bad_input_one_line_exit_2(tmp_path, make_args, needle):
    proc = run_cmd(NAS_REPORT, *make_args(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_html_report_renders_in_headless_chromium(report, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    html = report[1]
    n_img = html.read_text().count("<img ")
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    shot = tmp_path / "shot.png"
    proc = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,2000", html.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = [l for l in proc.stderr.splitlines() if "Uncaught" in l or ("CONSOLE" in l and "ERROR" in l)]
    assert not errors, errors
    dom = subprocess.run([*common, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the page never needs a horizontal scroll bar at 1400 px
    wide = subprocess.run([*common, "--window-size=1400,1000", "--dump-dom", html.as_uri()], capture_output=True,
                          text=True, timeout=120)
    assert 'data-overflow="no"' in wide.stdout
    # the inline script ran and every embedded figure decoded
    assert f'data-images-ok="{n_img}/{n_img}"' in dom.stdout
    assert f"figures decoded: {n_img} of {n_img}" in dom.stdout
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    assert float(pixels[..., :3].std()) > 0.05  # not a blank page


def test_a_config_read_again_is_read_from_the_file_when_it_changed(tmp_path):
    """Configs are kept per process (a page of many reports reads each run once); a changed file is read anew,
    and a caller's changes to what it got do not reach the next caller."""
    from nas_cli.report.collect import load_run

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    cfg = run / ".hydra" / "config.yaml"
    cfg.write_text("seed: 1\nmodel:\n  heads: 4\n")
    first = load_run(run).config
    assert first == {"seed": 1, "model": {"heads": 4}}
    first["model"]["heads"] = 99
    assert load_run(run).config["model"]["heads"] == 4
    cfg.write_text("seed: 2\nmodel:\n  heads: 8\n")  # same size, new contents
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 1_000_000))
    assert load_run(run).config == {"seed": 2, "model": {"heads": 8}}


def test_report_to_wandb_logs_the_verdict_tables_in_the_sweeps_group_and_replaces_itself(sweep, tmp_path):
    """``nas-report <sweep> --wandb``: an offline W&B run (job type report) in the runs' group whose
    tables, read back from its files, are ``--format json``'s rows; run again, it replaces itself."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    args = (str(copy), "--baseline", "scheme=unas", "--samples", "50")
    for _ in range(2):
        proc = run_cmd(NAS_REPORT, *args, "--wandb", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    folders = sorted((copy / "nas-report" / "wandb").glob("offline-run-*"))
    assert len(folders) == 1, folders  # the second report replaced the first
    assert f"W&B report run: {folders[0]}" in proc.stdout.replace("\n", "")
    doc = json.loads(run_cmd(NAS_REPORT, *args, "--format", "json", cwd=tmp_path).stdout)
    run = read_run(folders[0])
    groups = {json.loads((p / "summary.json").read_text())["group"] for p in copy.iterdir() if (p / "summary.json").is_file()}
    assert run["job_type"] == "report" and [run["group"]] == sorted(groups)
    logged = run["history"][0]
    assert doc["unfinished"]["rows"] == []  # the key is there when every run finished
    for key in ("comparison", "test_set"):
        table = json.loads((folders[0] / "files" / logged[f"report/{key}/path"]).read_text())
        assert [dict(zip(table["columns"], row)) for row in table["data"]] == doc[key]["rows"]
        # the JSON's columns are the rows' keys (each once); the table's headers as shown beside them
        assert doc[key]["columns"] == list(dict.fromkeys(k for row in doc[key]["rows"] for k in row))
        assert doc[key]["headers"] and all(set(row) <= set(doc[key]["columns"]) for row in doc[key]["rows"])
    runs = json.loads((folders[0] / "files" / logged["report/runs/path"]).read_text())
    assert runs["columns"] == doc["runs"]["columns"] and len(runs["data"]) == len(doc["runs"]["rows"])
    assert logged["report/page/_type"] == "html-file" and (folders[0] / "files" / logged["report/page/path"]).is_file()
    assert any(k.startswith("report/figures/") for k in logged)  # metric vs heads (two head counts)
    assert run["summary"]["report/notes"] == "\n".join(doc["notes"])


def test_report_names_the_code_version_and_warns_when_runs_differ(sweep, tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    jobs = sorted(p for p in copy.iterdir() if (p / "summary.json").is_file())
    path = jobs[0] / "summary.json"
    summary = json.loads(path.read_text())
    summary["code"] = {"version": "0.0.9", "commit": "0123456789abcdef", "dirty": False}
    path.write_text(json.dumps(summary))
    proc = run_cmd(NAS_REPORT, str(copy), "--format", "json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert "code" in doc["runs"]["columns"]
    assert {r["code"] for r in doc["runs"]["rows"]} >= {"0.0.9+0123456"}
    assert any(n.startswith("warning: these runs come from 2 versions of nas-run") for n in doc["notes"])


def test_a_re_evaluated_run_is_labelled_in_the_terminal_table(sweep, tmp_path):
    """``nas-eval --beam``'s result is its own row: its label shows in rich's table (the brackets were
    read as markup and vanished, leaving two rows that looked alike)."""
    run = tmp_path / "run"
    shutil.copytree(sweep / JOBS[0], run)
    (run / "eval").mkdir(exist_ok=True)
    summary = json.loads((run / "summary.json").read_text())
    (run / "eval" / "test-beam5.json").write_text(json.dumps({"split": "test", "metrics": summary["test"]}))
    proc = run_cmd(NAS_REPORT, str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "unas [eval:test-beam5]" in proc.stdout
