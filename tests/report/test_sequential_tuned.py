"""``seed=auto`` with ``tune=[optim.lr]``: at every look each cell takes the candidate with the best mean
validation number over that look's seeds, and the group-sequential test compares the chosen candidates'
test numbers (nas_cli/report/stopping.py ``Chosen``, nas_cli/sweeps/sequential.py). Checked against a
direct computation (numpy's argmax of the validation means, the paired t of the difference less the lift), on run
directories laid out as the sweeper lays them out, and with test numbers that never move the choice."""
import json
from pathlib import Path

import numpy as np
import pytest

from nas_cli.report import stopping as seq
from nas_cli.sweeps.design import Options, cells, grid, job_number, pair_up, parse_baseline
from nas_cli.sweeps.sequential import SequentialSweep

AXES = [("attention", ["unas", "dnas"]), ("optim.lr", ["0.003", "0.001"])]
LOOKS = seq.looks(2, 5)


def _chosen(rng, k=2, n=5, higher=True):
    return seq.Chosen(tuple(tuple(rng.normal(size=n)) for _ in range(k)),
                      tuple(tuple(rng.normal(size=n)) for _ in range(k)), higher)


def test_each_look_compares_the_candidates_the_validation_means_choose_there():
    rng = np.random.default_rng(3)
    for _ in range(20):
        base, system = _chosen(rng), _chosen(rng, higher=True)
        state = seq.decide({"s": ("b", base, system)}, LOOKS)
        for look in state["s"].looks:
            n = look.n
            pick_b = int(np.argmax(np.mean(np.array(base.validation)[:, :n], axis=1)))
            pick_s = int(np.argmax(np.mean(np.array(system.validation)[:, :n], axis=1)))
            d = np.array(system.test[pick_s][:n]) - np.array(base.test[pick_b][:n])
            assert look.mean + look.shift == pytest.approx(d.mean())  # less the choices' lift (test_selection.py)
            assert abs(look.mean) <= abs(d.mean()) and look.shift * d.mean() >= 0  # toward zero, never past it
            assert look.t == pytest.approx(look.mean / (d.std(ddof=1) / np.sqrt(n)))


def test_a_lower_is_better_validation_chooses_its_smallest_mean_and_ties_take_the_first():
    c = seq.Chosen(((3.0, 3.0), (1.0, 2.0), (1.0, 2.0)), ((0.0, 0.0), (1.0, 1.0), (2.0, 2.0)), False)
    assert c.pick(2) == 1 and c.first(2) == (1.0, 1.0)  # 1.5 twice: the first in grid order
    assert seq.Chosen(c.validation, c.test, True).pick(2) == 0
    assert len(seq.Chosen(((1.0, 2.0, 3.0), (1.0,)), ((0.0, 0.0, 0.0), (0.0, 0.0)), True)) == 1


def test_test_numbers_never_move_the_choice():
    rng = np.random.default_rng(5)
    validation = tuple(tuple(rng.normal(size=5)) for _ in range(3))
    picks = set()
    for _ in range(10):
        c = seq.Chosen(validation, tuple(tuple(rng.normal(scale=100, size=5)) for _ in range(3)), True)
        picks.add(tuple(c.pick(n) for n in LOOKS))
    assert len(picks) == 1


def test_cells_pair_by_everything_but_the_tuned_options_and_the_baseline_is_not_tuned():
    from nas_cli.errors import UserError

    configs = grid(AXES, ["task=reverse"])
    made = cells(configs, ["optim.lr"])
    assert [c.label for c in made] == ["attention=unas", "attention=dnas"]
    assert [[configs[i].values["optim.lr"] for i in c.configs] for c in made] == [["0.001", "0.003"]] * 2  # grid order
    assert pair_up(made, ("attention", "unas")) == {1: 0}
    assert parse_baseline(None, list(reversed(AXES)), ["optim.lr"]) == ("attention", "unas")
    with pytest.raises(UserError, match=r"hydra.sweeper.baseline=optim.lr:0.001: optim.lr is tuned"):
        parse_baseline("optim.lr:0.001", AXES, ["optim.lr"])
    with pytest.raises(UserError, match=r"sweep an option besides the tuned ones"):
        parse_baseline(None, AXES[1:], ["optim.lr"])


def _write(root: Path, number: int, label: str, seed: int, val: float, test: float):
    run = root / f"{number}_{label}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "seed": seed, "best_val": {"metric": "val/bleu", "mode": "max", "value": val},
        "test": {"test/bleu": test}}))


def test_the_sweep_reads_its_runs_chooses_per_cell_and_asks_every_candidate_for_the_next_seed(tmp_path):
    rng = np.random.default_rng(8)
    configs = grid(AXES, [])
    val, test = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    for j in range(3):  # seeds 1-3 finished for every configuration
        for c in configs:
            _write(tmp_path, job_number(c.index, j, 4), c.label.replace(" ", "_"), j + 1, val[c.index, j],
                   test[c.index, j])
    sweep = SequentialSweep(Options(max_seeds=5), tmp_path, configs, ("attention", "unas"), "x", ["optim.lr"])
    state = sweep.decide()
    # the same decision from the numbers alone: each cell's candidates in grid order (0.001 first)
    by_cell = {cell.label: seq.Chosen(tuple(tuple(val[i]) for i in cell.configs),
                                      tuple(tuple(test[i]) for i in cell.configs), True) for cell in sweep.cells}
    direct = seq.decide({"attention=dnas": ("attention=unas", by_cell["attention=unas"], by_cell["attention=dnas"])},
                        Options(max_seeds=5).looks)
    assert [(lk.n, lk.mean) for lk in state["attention=dnas"].looks] == \
        [(lk.n, lk.mean) for lk in direct["attention=dnas"].looks]
    if state["attention=dnas"].open:
        assert sorted(sweep.next_jobs(state)) == [(c, 3) for c in range(4)]  # both candidates of both cells
    rec = sweep.records(state)
    assert rec["design"]["tune"] == ["optim.lr"] and "tune=[optim.lr]" in rec["method"]
    (comp,) = rec["comparisons"]
    dnas = [i for i in sweep.cells[1].configs][by_cell["attention=dnas"].pick(3)]
    assert comp["system_chosen"] == f"attention=dnas (optim.lr={configs[dnas].values['optim.lr']}, tuned)"
    assert comp["baseline_chosen"].startswith("attention=unas (optim.lr=")
