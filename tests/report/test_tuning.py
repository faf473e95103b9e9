"""Tuned comparisons (nas-report --tune, a sweep's tune=[...]): each cell's value chosen by the validation
number alone, the verdicts on the test numbers at the chosen values, both protocols, the tuning table in
every format, its warnings and the refusals."""
from __future__ import annotations

import csv
import io
import json

import pytest
import yaml
from helpers import run_command, script

LRS = (0.001, 0.002)


def _write(root, scheme: str, lr: float, seed: int, val: float, test: float, mode: str = "max", tune=("optim.lr",),
           tune_seeds=None):
    d = root / f"{scheme}-{lr}-{seed}"
    (d / ".hydra").mkdir(parents=True)
    config = {"task": {"name": "sim"}, "attention": scheme, "optim": {"lr": lr}, "seed": seed,
              "tune": list(tune) if tune else None, "tune_seeds": tune_seeds}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    metric = "val/bleu" if mode == "max" else "val/loss"
    (d / "summary.json").write_text(json.dumps({
        "task": "sim", "scheme": scheme, "heads": 4, "seed": seed,
        "best_val": {"metric": metric, "mode": mode, "value": val}, "test": {"test/bleu": test}}))


def _grid(root, val, test, seeds=(1, 2, 3), **kw):
    """val / test: {(scheme, lr): [value per seed]}"""
    for (scheme, lr), values in val.items():
        for i, seed in enumerate(seeds):
            _write(root, scheme, lr, seed, values[i], test[(scheme, lr)][i], **kw)


def _report(root, *args):
    out = run_command([script("nas-report"), str(root), "--baseline", "scheme=unas", "--no-item-tests", *args],
                      cwd=root)
    return out


#: validation prefers lr 0.001 for unas and 0.002 for dnas; the test numbers prefer the opposite
VAL = {("unas", 0.001): [30.0, 30.5, 30.2], ("unas", 0.002): [29.0, 29.4, 29.1],
       ("dnas", 0.001): [28.0, 28.6, 28.1], ("dnas", 0.002): [31.0, 31.2, 30.9]}
TEST = {("unas", 0.001): [20.0, 20.4, 20.1], ("unas", 0.002): [40.0, 40.1, 40.5],
        ("dnas", 0.001): [45.0, 45.5, 45.2], ("dnas", 0.002): [21.0, 21.3, 21.1]}


def test_each_cell_chooses_by_validation_and_the_verdict_compares_the_test_numbers_there(tmp_path):
    _grid(tmp_path, VAL, TEST)
    out = _report(tmp_path, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    chosen = {r["scheme"]: r["optim.lr"] for r in doc["tuning"]["rows"] if r["chosen"]}
    assert chosen == {"unas": 0.001, "dnas": 0.002}  # the validation's best, never the test's
    (row,) = doc["comparison"]["rows"]
    assert row["system"] == "dnas h4 optim.lr=0.002 (tuned)"
    assert row["baseline_mean"] == pytest.approx(sum(TEST[("unas", 0.001)]) / 3)
    assert row["system_mean"] == pytest.approx(sum(TEST[("dnas", 0.002)]) / 3)
    assert "Tuned (same-seed selection)" in doc["comparison"]["caption"]
    unas = [r for r in doc["tuning"]["rows"] if r["scheme"] == "unas"]
    assert [r["mean_val"] for r in unas] == pytest.approx([30.2333333, 29.1666667])
    assert unas[0]["margin_to_runner_up"] == pytest.approx(30.2333333 - 29.1666667)
    assert unas[0]["val_seed_2"] == 30.5 and unas[0]["selection_seeds"] == [1, 2, 3]


def test_the_test_numbers_never_change_the_choice(tmp_path):
    """The same validation numbers with any test numbers: the same choice in every cell."""
    import random

    rng = random.Random(0)
    seen = set()
    for trial in range(4):
        root = tmp_path / str(trial)
        test = {k: [rng.uniform(0, 100) for _ in range(3)] for k in TEST}
        _grid(root, VAL, test)
        out = _report(root, "--format", "json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        seen.add(tuple(sorted((r["scheme"], r["optim.lr"]) for r in doc["tuning"]["rows"] if r["chosen"])))
        (row,) = doc["comparison"]["rows"]
        assert row["system_mean"] == pytest.approx(sum(test[("dnas", 0.002)]) / 3)
    assert seen == {(("dnas", 0.002), ("unas", 0.001))}


def test_held_apart_tuning_seeds_choose_and_the_other_seeds_give_the_verdict(tmp_path):
    # seed 1 prefers 0.002 for unas; seeds 2 and 3 (the verdict seeds) prefer 0.001 by far
    val = {**VAL, ("unas", 0.001): [29.0, 35.0, 35.0], ("unas", 0.002): [30.0, 20.0, 20.0]}
    _grid(tmp_path, val, TEST)
    out = _report(tmp_path, "--tuning-seeds", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    chosen = {r["scheme"]: r["optim.lr"] for r in doc["tuning"]["rows"] if r["chosen"]}
    assert chosen["unas"] == 0.002
    assert {r["protocol"] for r in doc["tuning"]["rows"]} == {"held-apart tuning seeds"}
    (row,) = doc["comparison"]["rows"]
    assert row["seeds"] == [2, 3]
    assert row["baseline_mean"] == pytest.approx(sum(TEST[("unas", 0.002)][1:]) / 2)
    assert "tuning seeds 1, which take no part in the verdicts" in doc["comparison"]["caption"]
    # the sweep's own tune_seeds are the default
    root = tmp_path / "launched"
    _grid(root, val, TEST, tune_seeds=[1])
    doc = json.loads(_report(root, "--format", "json").stdout)
    assert doc["comparison"]["rows"][0]["seeds"] == [2, 3]


def test_a_lower_is_better_validation_chooses_the_lowest(tmp_path):
    _grid(tmp_path, VAL, TEST, mode="min")  # the same numbers as a loss: the lowest mean wins
    doc = json.loads(_report(tmp_path, "--format", "json").stdout)
    chosen = {r["scheme"]: r["optim.lr"] for r in doc["tuning"]["rows"] if r["chosen"]}
    assert chosen == {"unas": 0.002, "dnas": 0.001}


def test_warnings_name_an_edge_of_the_grid_and_a_baseline_that_chose_otherwise(tmp_path):
    _grid(tmp_path, VAL, TEST)
    out = _report(tmp_path)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "note: tuning: dnas h4 chose optim.lr=0.002; optim.lr at the highest value of the grid: widen the grid" in text
    assert "note: tuning: dnas h4 chose optim.lr=0.002; its baseline chose optim.lr=0.001" in text
    assert "tuning (same-seed selection): each cell's optim.lr, chosen by validation" in text
    # a 3-value grid whose middle value wins: no edge warning for it
    root = tmp_path / "three"
    val = {("unas", lr): [v, v + 0.1, v] for lr, v in ((0.001, 1.0), (0.002, 3.0), (0.004, 2.0))}
    val.update({("dnas", lr): [v, v + 0.1, v] for lr, v in ((0.001, 1.0), (0.002, 3.0), (0.004, 2.0))})
    _grid(root, val, {k: [1.0, 2.0, 3.0] for k in val})
    text = " ".join(_report(root).stdout.split())
    assert "widen the grid" not in text and "its baseline chose" not in text


def test_the_tuning_table_as_csv_and_markdown(tmp_path):
    _grid(tmp_path, VAL, TEST)
    out = _report(tmp_path, "--format", "csv", "--table", "tuning")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(rows) == 4 and {r["chosen"] for r in rows} == {"True", "False"}
    assert {"cell", "optim.lr", "val_seed_1", "mean_val", "margin_to_runner_up", "at_edge", "protocol"} <= set(rows[0])
    md = _report(tmp_path, "--format", "markdown").stdout
    assert "| cell | optim.lr | val seed 1 | val seed 2 | val seed 3 | mean val | chosen |" in md
    assert _report(tmp_path, "--html", str(tmp_path / "page.html")).returncode == 0
    page = (tmp_path / "page.html").read_text()
    assert "<h2>Tuning (same-seed selection): each cell&#x27;s optim.lr, chosen by validation</h2>" in page
    assert page.index("<h2>Tuning") < page.index("<h2>Across seeds (the verdict)")


@pytest.mark.parametrize("argv, message", [
    (["--tuning-seeds", "1"], "--tuning-seeds chooses the tuned values of --tune: add --tune"),
    (["--tune", "optim.lr", "--group-by", "scheme"], "--tune chooses among the groups of runs that differ only by seed"),
    (["--tune", "optim.lrr"], "--tune optim.lrr: no run has this option in its saved config"),
    (["--tune", "optim.lr", "--tuning-seeds", "x"], "--tuning-seeds x: expected seeds separated by commas"),
])
def test_refusals_are_one_line(tmp_path, argv, message):
    _grid(tmp_path, VAL, TEST, tune=None)
    out = _report(tmp_path, *argv)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_held_apart_seeds_that_leave_no_verdict_seed_are_said(tmp_path):
    _grid(tmp_path, VAL, TEST)
    out = _report(tmp_path, "--tuning-seeds", "1,2,3")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert ("--tune optim.lr with --tuning-seeds 1,2,3: no cell can choose (dnas h4: it has no run at a seed outside "
            "the tuning seeds") in out.stderr


@pytest.mark.parametrize("argv, message", [
    (["attention=unas,dnas", "seed=1,2", "tune=[optim.lr]"],
     "tune=[optim.lr]: optim.lr is not swept over two or more values in this sweep; give it the values to choose "
     "from, e.g. optim.lr=1e-3,2e-3"),
    (["attention=unas,dnas", "optim.lr=1e-3,2e-3", "seed=1,2", "tune=[optim.lr]", "tune_seeds=[5]"],
     "tune_seeds=[5]: seed 5 is not among the sweep's seeds (1,2); list it in seed=... too"),
    (["attention=unas,dnas", "optim.lr=1e-3,2e-3", "seed=1,2", "tune=[optim.lr]", "tune_seeds=[1]"],
     "tune_seeds=[1] leaves fewer than 2 verdict seeds of seed=1,2"),
    (["attention=unas,dnas", "seed=1,2", "tune_seeds=[1]"], "tune_seeds=[1] chooses the values of tuned options: add "
                                                             "tune=[optim.lr]"),
    (["attention=unas,dnas", "optim.lr=1e-3,2e-3", "seed=auto", "tune=[optim.lr]", "tune_seeds=[1]"],
     "tune_seeds=[1] with seed=auto: a sequential sweep chooses each value on the seeds of every look"),
    (["optim.lr=1e-3,2e-3", "seed=auto", "tune=[optim.lr]"],
     "seed=auto with tune=[optim.lr] compares configurations: sweep an option besides the tuned ones"),
    (["attention=unas,dnas", "optim.lr=1e-3,2e-3", "seed=auto", "tune=[optim.lr]", "hydra.sweeper.baseline=optim.lr:1e-3"],
     "hydra.sweeper.baseline=optim.lr:1e-3: optim.lr is tuned (tune=[optim.lr]): each configuration chooses its own "
     "value"),
])
def test_a_tuned_sweep_is_refused_before_anything_is_made(tmp_path, argv, message):
    from helpers import nas_run

    out = nas_run("-m", *argv, "debug=fast", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and not (tmp_path / "sweep").exists()


def test_the_config_column_keeps_its_values_in_a_wide_table():
    # rows of one scheme at two learning rates differ only in the config column, the one column that wraps:
    # squeezed to nothing by a table wider than nas-report's console (200 columns written to a file), it would
    # leave two look-alike rows
    import io

    from rich.console import Console

    from nas_cli.report.table import rich_table

    # the columns and cells of a tuned seed=auto sweep's runs table (reverse, debug=fast)
    head = ["task", "scheme", "heads", "config", "n", "params", "best val/exact_match", "exact match", "BLEU",
            "test ppl", "JSD", "expl. away", "sink rate", "tokens/s", "seeds", "code"]
    rows = [["reverse", "dnas", "4", f"optim.lr={lr}", "3", "234,944", "0 ± 0", "0.0 ± 0.0%", "0.16 ± 0.36",
             "30.981 ± 11.301", "0.043 ± 0.006", "0.0 ± 0.0%", "31.9 ± 6.0%", "3,441 ± 368", "1,2,3",
             "0.1.0+35a2d94.dirty"] for lr in ("0.001", "0.003")]
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(rich_table([], rows=(head, rows)))
    text = console.export_text()
    assert "optim.lr=0.001" in text and "optim.lr=0.003" in text
