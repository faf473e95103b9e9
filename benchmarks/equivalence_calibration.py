"""Calibration and power of nas-report's equivalence verdicts (``--equivalence``), by simulation.

Seed-level scores of a baseline and a system are simulated at n = 2, 3, 5 and 10 paired seeds:
score(seed s) = mu + a_s + e (seed effect a_s shared by the pair, sd 0.3; each run's own noise e, sd
0.3; metric units), the system shifted by a true difference delta. Each simulated sweep's runs go
through nas-report's own comparison (``compare_groups`` with ``equivalence=``, the code behind
``nas-report --baseline ... --equivalence``), two systems against one baseline, so Holm over the groups
is part of what is measured. "Called equivalent" is the share of sweeps with that verdict:

* at a true difference exactly at the margin (+margin and -margin) it is the false-equivalence rate,
  which TOST keeps at or below 5%;
* at a true difference of 0 it is the power (how often equality is shown when it holds).

    python benchmarks/equivalence_calibration.py   # writes docs/equivalence.json and its table in docs/comparing.md
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from nas_cli.bench.markdown import run_and_write, simulation_parser
from nas_cli.report.collect import Run
from nas_cli.report.compare import compare_groups
from nas_cli.report.table import group_runs

ROOT = Path(__file__).resolve().parent.parent
SEED_SD, RUN_SD = 0.3, 0.3
METRIC = "test/bleu"
#: margins in units of the paired difference's sd (sqrt(2) x RUN_SD = 0.42): 1 and 2 sd
MARGINS = (0.5, 1.0)


def _runs(scheme: str, scores, seeds) -> list[Run]:
    return [Run(path=Path(f"sim/{scheme}/{s}"), summary={"task": "sim", "scheme": scheme, "heads": 4, "seed": s,
                                                          "test": {METRIC: float(v)}})
            for s, v in zip(seeds, scores)]


def simulate(n: int, delta: float, sweeps: int, rng: np.random.Generator):
    """(baseline, system A, system B) seed-level scores, each (sweeps, n): A shifted by ``delta``, B by 0."""
    shared = rng.normal(0, SEED_SD, size=(sweeps, n))
    base = 30 + shared + rng.normal(0, RUN_SD, size=(sweeps, n))
    a = 30 + delta + shared + rng.normal(0, RUN_SD, size=(sweeps, n))
    b = 30 + shared + rng.normal(0, RUN_SD, size=(sweeps, n))
    return base, a, b


def equivalent(base, a, b, margin: float) -> np.ndarray:
    """Whether nas-report calls system A equivalent to the baseline, per sweep (B compared beside it)."""
    n = base.shape[1]
    out = np.zeros(len(base), dtype=bool)
    for j in range(len(base)):
        runs = _runs("base", base[j], range(1, n + 1)) + _runs("a", a[j], range(1, n + 1)) + \
            _runs("b", b[j], range(1, n + 1))
        groups = group_runs(runs)
        baseline = next(g for g in groups if g.runs[0].scheme == "base")
        rows = compare_groups(groups, baseline, [METRIC], item_tests=False, equivalence={METRIC: margin})
        (row,) = [r for r in rows if r.group.runs[0].scheme == "a"]
        out[j] = row.comparison.equivalence.equivalent
    return out


def run(sweeps: int, power_sweeps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cells = []
    for margin in MARGINS:
        for n in (2, 3, 5, 10):
            cell = {"margin": margin, "seeds": n, "sweeps": sweeps, "power_sweeps": power_sweeps}
            at = [equivalent(*simulate(n, sign * margin, sweeps, rng), margin) for sign in (1, -1)]
            cell["equivalent_at_margin"] = float(np.concatenate(at).mean())
            cell["equivalent_at_margin_se"] = float(math.sqrt(max(cell["equivalent_at_margin"] * (
                1 - cell["equivalent_at_margin"]), 1e-12) / (2 * sweeps)))
            for frac in (0.0, 0.5):
                cell[f"equivalent_at_{frac:g}_margin"] = float(
                    equivalent(*simulate(n, frac * margin, power_sweeps, rng), margin).mean())
            cells.append(cell)
            print(json.dumps(cell), flush=True)
    return {"cells": cells, "seed_sd": SEED_SD, "run_sd": RUN_SD}


def table(result: dict) -> str:
    lines = ["## Equivalence verdicts, calibrated (generated)", "",
             f"`{result['command']}` on {result['machine']}, {result['date']}: paired seeds, seed sd "
             f"{result['seed_sd']}, run sd {result['run_sd']} (so the paired difference's sd is "
             f"{math.sqrt(2) * result['run_sd']:.2f}), two systems against one baseline (Holm over both). "
             "'at the margin': the true difference is exactly +margin or -margin, where calling it equivalent is "
             "the error TOST keeps at or below 5% (± two standard errors of the simulation); '0' and 'margin/2': the power. The Holm step over two systems makes the error at small n smaller than 5%.", "",
             "| margin | seeds | called equivalent at the margin (error, <= 5%) | at margin/2 | at 0 (power) |",
             "|---:|---:|---:|---:|---:|"]
    for c in result["cells"]:
        lines.append(f"| ±{c['margin']:g} | {c['seeds']} | {100 * c['equivalent_at_margin']:.1f}% "
                     f"(± {200 * c['equivalent_at_margin_se']:.1f}) | {100 * c['equivalent_at_0.5_margin']:.0f}% | "
                     f"{100 * c['equivalent_at_0_margin']:.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = simulation_parser(__doc__, ROOT / "docs" / "equivalence.json", ROOT / "docs" / "comparing.md", 2000, 1000,
                          "simulated sweeps per cell at each margin")
    args = p.parse_args()
    print(table(run_and_write(args, lambda: run(args.sweeps, args.power_sweeps),
                              table, "python benchmarks/equivalence_calibration.py")))


if __name__ == "__main__":
    main()
