"""``seed=auto``: a real sequential sweep of tiny models through the joblib launcher,
killed between rounds and continued by the same command; failed jobs are retried and never
counted; bad options get one line."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from scipy import stats as sps

from helpers import NAS_RUN, nas_run, run_command, script, start_command
from nas_cli.report import stopping as seq

# the runs' diagnostics figures are left out (tests/diagnostics draws them); the sweep's own figure is not
SWEEP = ("-m", "attention=unas,dnas", "seed=auto", "debug=fast", "progress_bar=false", "diagnostics.plots=never",
         "hydra.sweeper.max_seeds=3", "hydra.sweeper.metric=ppl", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")


def _summaries(root):
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))}


def test_sequential_sweep_continues_after_a_kill_and_runs_no_seed_twice(tmp_path):
    root = tmp_path / "seq"
    env = {**os.environ, "NO_COLOR": "1"}
    proc = start_command([NAS_RUN, *SWEEP, f"hydra.sweep.dir={root}"], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed (with its workers) once the first look is written, before the sweep can finish
        deadline = time.time() + 240
        while time.time() < deadline and not (root / "sequential.json").is_file() and proc.poll() is None:
            time.sleep(0.2)
        assert (root / "sequential.json").is_file(), "the first round never finished"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = json.loads((root / "sequential.json").read_text())
    assert [c["looks"][-1]["n"] for c in first["comparisons"]] == [2]
    assert {s["seed"] for s in _summaries(root).values()} >= {1, 2}

    again = nas_run(*SWEEP, f"hydra.sweep.dir={root}", cwd=tmp_path, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing the sweep" in again.stderr
    done = _summaries(root)
    runs = [(s["scheme"], s["seed"]) for s in done.values()]
    assert len(runs) == len(set(runs)), runs  # no seed ran twice
    state = json.loads((root / "sequential.json").read_text())
    (comp,) = state["comparisons"]
    assert comp["system"] == "attention=dnas" and comp["baseline"] == "attention=unas"
    n = comp["looks"][-1]["n"]
    assert comp["decision"] in ("higher", "lower", "undecided") and n in (2, 3)
    assert sorted(runs) == sorted((s, k) for s in ("unas", "dnas") for k in range(1, n + 1))
    # the decision, recomputed from the runs' perplexities with scipy and the design's boundaries
    ppl = {(s["scheme"], s["seed"]): s["test"]["test/ppl"] for s in done.values()}
    d = np.array([ppl[("dnas", k)] - ppl[("unas", k)] for k in range(1, n + 1)])
    t = float(sps.ttest_1samp(d, 0.0).statistic)
    c = seq.boundaries(seq.looks(2, 3), 0.05, "obf")[n - 2]
    assert comp["looks"][-1]["mean"] == np.float64(d.mean())
    assert (abs(t) >= c) == (comp["decision"] in ("higher", "lower"))
    assert (root / "sequential.png").is_file()
    # nas-report on the sweep shows the same decision and names the method
    rep = run_command([script("nas-report"), str(root)], capture_output=True, text=True,
                         env={**env, "COLUMNS": "200"})
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "Group-sequential paired t-test" in rep.stdout and "attention=dnas" in rep.stdout
    # ... and as a tidy CSV: one row per look, numbers in numeric columns
    import pandas as pd

    tables = tmp_path / "tables"
    out = run_command([script("nas-report"), str(root), "--out", str(tables)],
                      capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    looks = pd.read_csv(tables / "sequential.csv")
    assert looks["n"].tolist() == [lk["n"] for lk in comp["looks"]] and set(looks["final_decision"]) == {comp["decision"]}
    assert pd.api.types.is_numeric_dtype(looks["mean"]) and looks["mean"].iloc[-1] == pytest.approx(d.mean())
    # another sequential sweep into the same directory: refused, nothing touched
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    other = nas_run(*[a if a != "attention=unas,dnas" else "attention=unas,hnas" for a in SWEEP],
                    f"hydra.sweep.dir={root}", cwd=tmp_path)
    assert other.returncode == 2 and "holds a sweep of other overrides" in other.stderr
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before


def test_a_failing_job_is_retried_then_stops_the_sweep_and_is_never_a_seed(tmp_path):
    # model.heads=3 does not divide the tiny model's width: that job fails at every attempt
    proc = nas_run("-m", "model.heads=4,3", "seed=auto", "debug=fast", "progress_bar=false", "diagnostics.plots=never",
                   "trainer.max_steps=4", "run_test=true", "hydra.sweep.dir=out", cwd=tmp_path, timeout=400)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "job(s) of this round failed: running them again" in proc.stderr
    assert "the sequential sweep stopped" in proc.stderr and "model.heads=3" in proc.stderr
    state = json.loads((tmp_path / "out" / "sequential.json").read_text())
    assert all(not c["looks"] for c in state["comparisons"])  # nothing was decided from a failed job


def test_bad_sequential_options_get_one_line(tmp_path):
    for args, words in [(("seed=auto", "attention=unas,dnas"), "add -m"),
                        (("-m", "seed=auto"), "sweep at least one option"),
                        (("-m", "seed=auto", "attention=unas,dnas", "hydra.sweeper.min_seeds=1"), "min_seeds=1"),
                        (("-m", "seed=auto", "attention=unas,dnas", "hydra.sweeper.baseline=attention:hnas"),
                         "hnas is not among"),
                        (("-m", "seed=auto", "attention=unas,dnas", "sweep=optuna"), "cannot be combined"),
                        (("-m", "seed=1,2", "attention=unas,dnas", "hydra/sweeper=sequential"), "write seed=auto")]:
        proc = nas_run(*args, "hydra.sweep.dir=bad", cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr[-1500:])
        assert words in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr[-1500:])
        assert not (tmp_path / "bad").exists(), args  # nothing left behind


def test_a_tuned_sequential_sweep_chooses_each_schemes_rate_at_every_look(tmp_path):
    # seed=auto with tune=[optim.lr]: every rate of every scheme gets each round's seed; the look compares
    # the test numbers of the rate each scheme's validation numbers choose on that look's seeds
    root = tmp_path / "tuned"
    proc = nas_run("-m", "attention=unas,dnas", "optim.lr=1e-3,3e-3", "seed=auto", "tune=[optim.lr]", "debug=fast",
                   "progress_bar=false", "diagnostics.plots=never", "logger=csv", "hydra.sweeper.max_seeds=3",
                   "hydra.sweeper.metric=ppl", f"hydra.sweep.dir={root}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((root / "sequential.json").read_text())
    assert state["design"]["tune"] == ["optim.lr"]
    (comp,) = state["comparisons"]
    assert (comp["system"], comp["baseline"]) == ("attention=dnas", "attention=unas")
    n = comp["looks"][-1]["n"]
    done = list(_summaries(root).values())
    assert sorted((s["scheme"], s["seed"]) for s in done) == sorted(
        (s, k) for s in ("unas", "dnas") for k in range(1, n + 1) for _ in range(2))  # both rates at every seed
    runs = {}
    for path in root.glob("*/summary.json"):
        s, overrides = json.loads(path.read_text()), (path.parent / ".hydra" / "overrides.yaml").read_text()
        runs[(s["scheme"], "0.001" if "optim.lr=0.001" in overrides else "0.003", s["seed"])] = s
    chosen = {}
    sign = 1 if done[0]["best_val"]["mode"] == "min" else -1
    for scheme in ("unas", "dnas"):  # the rate with the best mean validation value over the n seeds (a tie: 0.001)
        mean = {r: np.mean([runs[(scheme, r, k)]["best_val"]["value"] for k in range(1, n + 1)])
                for r in ("0.001", "0.003")}
        chosen[scheme] = min(mean, key=lambda r: (sign * mean[r], r != "0.001"))
    assert comp["system_chosen"] == f"attention=dnas (optim.lr={chosen['dnas']}, tuned)"
    assert comp["baseline_chosen"] == f"attention=unas (optim.lr={chosen['unas']}, tuned)"
    d = [runs[("dnas", chosen["dnas"], k)]["test"]["test/ppl"] - runs[("unas", chosen["unas"], k)]["test"]["test/ppl"]
         for k in range(1, n + 1)]
    assert comp["looks"][-1]["mean"] == pytest.approx(float(np.mean(d)))
    assert f"optim.lr={chosen['dnas']}, tuned" in proc.stdout + proc.stderr
