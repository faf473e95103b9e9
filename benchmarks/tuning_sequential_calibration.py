"""Calibration of ``seed=auto`` with ``tune=[optim.lr]``, by simulation: how often the sequential sweep calls
two schemes different when, each at its own best learning rate, they are equal.

The model and the four cases are tuning_calibration.py's (a grid of 4 rates; seed, run and evaluation
noise; 1. identical schemes, 2. best rates one grid step apart, 3. identical, one tuned over 8
configurations and the other over 4, 4. equal at their best rates, one flat in the rate and one sharply
peaked). The verdict is the sweep's own: the group-sequential paired t-test
(nas_cli/report/stopping.py, O'Brien-Fleming-type spending, alpha 0.05) at looks min_seeds..max_seeds,
stopping at the first look that decides. Two ways to choose each scheme's rate:

* ``every look`` (what ``seed=auto`` does): at each look, the rate with the best mean validation over that
  look's seeds; the look compares the chosen rates' test numbers, less the two choices' estimated lift
  (nas_cli/report/selection.py) toward zero;
* ``first look, kept``: chosen once at the first look, then kept (a contrast: the choice then no longer
  sees the seeds that decide, as with held-apart tuning seeds).

Each cell is simulated twice: with the formulas vectorized over many sweeps (``rate``), and on fewer sweeps
through the sweeper's own decision (``sweeper_rate``: :class:`nas_cli.report.stopping.Chosen` per scheme and
:func:`nas_cli.report.stopping.decide`, as ``SequentialSweep.decide`` calls them).

    python benchmarks/tuning_sequential_calibration.py   # docs/tuning_sequential.json, its table in docs/comparing.md
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from nas_cli.bench.markdown import run_and_write, simulation_parser
from tuning_calibration import CASES, simulate, _toward_zero
from nas_cli.report import stopping as seq
from nas_cli.report.selection import optimism

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ((2, 5), (2, 10), (3, 10))  # (min_seeds, max_seeds): the default is (2, 10)
CHOICES = ("every look", "first look, kept")
ALPHA = 0.05


def formula_rate(case: int, design: tuple[int, int], choice: str, sweeps: int, rng) -> float:
    """The share of simulated sweeps that end 'higher' or 'lower', by the formulas (vectorized)."""
    looks = seq.looks(*design)
    (val_a, test_a), (val_b, test_b), _ = simulate(case, "same", looks[-1], sweeps, rng)
    c = seq.boundaries(looks, ALPHA, "obf")
    rows = np.arange(sweeps)[:, None]
    open_, called = np.ones(sweeps, bool), np.zeros(sweeps, bool)
    kept = None
    for k, n in enumerate(looks):
        picks = (val_a[:, :n].mean(axis=1).argmax(axis=1), val_b[:, :n].mean(axis=1).argmax(axis=1))
        if choice != "every look":
            kept = picks if kept is None else kept
            picks = kept
        cols = np.arange(n)[None, :]
        d = test_b[rows, cols, picks[1][:, None]] - test_a[rows, cols, picks[0][:, None]]
        mean, se = d.mean(axis=1), d.std(axis=1, ddof=1) / math.sqrt(n)
        if choice == "every look":
            mean = _toward_zero(mean, _lifts(val_b, test_b, n) - _lifts(val_a, test_a, n))
        decided = (mean - c[k] * se > 0) | (mean + c[k] * se < 0)
        called |= open_ & decided
        open_ &= ~decided
    return float(called.mean())


def _lifts(val, test, n: int, block: int = 500) -> np.ndarray:
    """Each sweep's optimism of the choice on its first ``n`` seeds (in blocks of sweeps: memory)."""
    return np.concatenate([optimism(val[i:i + block, :n], test[i:i + block, :n], True)
                           for i in range(0, len(val), block)])


def sweeper_rate(case: int, design: tuple[int, int], sweeps: int, rng) -> float:
    """The same share through the sweeper's own decision, every look re-choosing (``seed=auto``)."""
    looks = seq.looks(*design)
    (val_a, test_a), (val_b, test_b), _ = simulate(case, "same", looks[-1], sweeps, rng)
    called = 0
    for j in range(sweeps):
        a = seq.Chosen(tuple(map(tuple, val_a[j].T)), tuple(map(tuple, test_a[j].T)), True)
        b = seq.Chosen(tuple(map(tuple, val_b[j].T)), tuple(map(tuple, test_b[j].T)), True)
        state = seq.decide({"b": ("a", a, b)}, looks, ALPHA, "obf")
        called += state["b"].decision in (seq.HIGHER, seq.LOWER)
    return called / sweeps


def run(sweeps: int, sweeper_sweeps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cells = []
    for case in CASES:
        for design in DESIGNS:
            for choice in CHOICES:
                cell = {"case": case, "design": list(design), "choice": choice, "sweeps": sweeps,
                        "rate": formula_rate(case, design, choice, sweeps, rng)}
                if choice == "every look":
                    cell.update(sweeper_sweeps=sweeper_sweeps, sweeper_rate=sweeper_rate(case, design, sweeper_sweeps, rng))
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    return {"cells": cells, "alpha": ALPHA, "cases": {str(k): v for k, v in CASES.items()}}


def table(result: dict) -> str:
    first = result["cells"][0]
    se = 2 * math.sqrt(result["alpha"] * (1 - result["alpha"]) / first["sweeps"])
    lines = ["## Tuned sequential sweeps, calibrated (generated)", "",
             f"`{result['command']}` on {result['machine']}, {result['date']}: the model of the table above; the "
             "verdict is `seed=auto`'s group-sequential paired t-test (O'Brien-Fleming-type spending, alpha 0.05), "
             "stopping at the first look that decides. Each cell: the share of sweeps that end *higher* or *lower* "
             f"where the schemes are equal at their own best rate (should be <= 5%; ± {100 * se:.1f} is two standard "
             f"errors of {first['sweeps']:,} sweeps), and in brackets the same through the sweeper's own decision "
             f"on {next(c['sweeper_sweeps'] for c in result['cells'] if 'sweeper_sweeps' in c):,} sweeps. "
             "*every look*: each scheme's rate chosen again at every look on that look's seeds (what `seed=auto` "
             "with `tune=[...]` does); *first look, kept*: chosen at the first look and kept.", "",
             "| case | seeds (looks) | every look (seed=auto) | first look, kept |", "|---|---|---:|---:|"]
    for case, words in result["cases"].items():
        for design in DESIGNS:
            row = {c["choice"]: c for c in result["cells"] if str(c["case"]) == case and tuple(c["design"]) == design}
            every, kept = row["every look"], row["first look, kept"]
            lines.append(f"| {case}. {words} | {design[0]}-{design[1]} | {100 * every['rate']:.1f}% "
                         f"({100 * every['sweeper_rate']:.1f}%) | {100 * kept['rate']:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = simulation_parser(__doc__, ROOT / "docs" / "tuning_sequential.json", ROOT / "docs" / "comparing.md", 20000, 0,
                          "simulated sweeps per cell (formulas)")
    p.add_argument("--sweeper-sweeps", type=int, default=10000,
                   help="simulated sweeps per cell through the sweeper's own decision")
    args = p.parse_args()
    print(table(run_and_write(args, lambda: run(args.sweeps, args.sweeper_sweeps),
                              table, "python benchmarks/tuning_sequential_calibration.py")))


if __name__ == "__main__":
    main()
