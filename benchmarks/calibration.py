"""Calibration and power of nas-report's verdicts, by simulation (no training).

Two systems with **no true difference** are simulated at k = 2, 3, 5 and 10 seeds, per test
item and per seed, with the score model of docs/comparing.md: quality(s, i) = mu + a_s + b_i +
e(s, i) (seed effect a_s, item difficulty b_i, noise e); each seed's test set is scored the way a
run scores it (corpus BLEU from per-sentence n-gram statistics, perplexity from per-item NLL sums,
exact match), and the two groups of runs go through nas-report's own comparison
(``nas_cli.report.compare.compare_groups``, the code behind ``nas-report --baseline``). The
false-positive rate is the share of simulated sweeps with a verdict ("better" or "worse");
with a true effect the same share is the power. Several ratios of seed to item variance are run.
For reference the same seed-level scores go to deepsig's almost stochastic order (ASO) test, at
its documented threshold (violation ratio < 0.5) and the stricter 0.2 its authors recommend.

    python benchmarks/calibration.py            # writes docs/calibration.json and its table in docs/comparing.md
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from nas_cli.bench.markdown import run_and_write, simulation_parser
from nas_cli.report import items as item_stats
from nas_cli.report.collect import Run
from nas_cli.report.compare import compare_groups
from nas_cli.report.table import group_runs

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("test/bleu", "test/ppl", "test/exact_match")
#: seed-effect sd / item-noise sd on the latent quality scale: seed variation dominating, both,
#: and no seed effect at all (only the test items' sampling noise differs between seeds)
RATIOS = {"seed >> item": (0.30, 0.3), "seed ~ item": (0.10, 1.0), "item only": (0.0, 1.0)}
ITEMS = 300


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def simulate(metric: str, k: int, ratio: str, effect: float, sweeps: int, rng: np.random.Generator,
             items: int = ITEMS) -> tuple[np.ndarray, np.ndarray]:
    """Seed-level scores (sweeps, k) of a baseline and a system, each run scored from its own
    simulated test items. ``effect``: the system's shift of the latent quality, in units of the
    seed sd (or of the item noise sd where there is no seed effect)."""
    seed_sd, noise_sd = RATIOS[ratio]
    shift = effect * (seed_sd if seed_sd > 0 else noise_sd)
    difficulty = rng.normal(0, 0.8, size=(sweeps, 1, items))  # b_i: the same test set for both systems
    lengths = rng.integers(5, 26, size=(sweeps, 1, items))
    out = []
    for delta in (0.0, shift):
        a = rng.normal(0, seed_sd, size=(sweeps, k, 1))  # a_s
        e = rng.normal(0, noise_sd, size=(sweeps, k, items))
        quality = delta + a - difficulty + e  # latent: higher is better
        if metric == "test/ppl":
            per_token = 3.0 - 0.5 * quality  # NLL per token
            nll = per_token * lengths
            out.append(np.exp(nll.sum(-1) / (lengths.sum(-1) * np.ones((sweeps, k)))))
        elif metric == "test/exact_match":
            out.append((rng.random((sweeps, k, items)) < _sigmoid(quality - 0.5)).mean(-1))
        else:  # BLEU from per-sentence statistics: n-gram matches with precision falling with n
            p1 = _sigmoid(0.4 + quality)
            stats_ = np.zeros((sweeps, k, items, 10))
            hyp_len = np.maximum(1, lengths + rng.integers(-2, 3, size=(sweeps, k, items)))
            stats_[..., 0], stats_[..., 1] = hyp_len, lengths
            for n in range(4):
                total = np.maximum(hyp_len - n, 0)
                stats_[..., 6 + n] = total
                stats_[..., 2 + n] = rng.binomial(total, p1 ** (n + 1))
            out.append(item_stats.bleu_from_stats(stats_.sum(2)))
    return out[0], out[1]


def _runs(scheme: str, metric: str, scores, seeds) -> list[Run]:
    return [Run(path=Path(f"sim/{scheme}/{s}"), summary={"task": "sim", "scheme": scheme, "heads": 4, "seed": s,
                                                          "test": {metric: float(v)}})
            for s, v in zip(seeds, scores)]


def verdicts(metric: str, base: np.ndarray, system: np.ndarray, paired: bool = True) -> np.ndarray:
    """nas-report's verdict direction (+1 / -1 / 0) for each simulated sweep: the runs go
    through ``compare_groups`` as nas-report groups and compares them. Unpaired: the system's
    seeds are other seeds (k+1 .. 2k), so the groups share none."""
    k = base.shape[1]
    out = np.zeros(len(base), dtype=int)
    for j in range(len(base)):
        runs = _runs("base", metric, base[j], range(1, k + 1))
        runs += _runs("sys", metric, system[j], range(1, k + 1) if paired else range(k + 1, 2 * k + 1))
        groups = group_runs(runs)
        baseline = next(g for g in groups if g.runs[0].scheme == "base")
        (row,) = compare_groups(groups, baseline, [metric], item_tests=False)
        out[j] = row.comparison.direction()
    return out


def aso_rates(base: np.ndarray, system: np.ndarray, seed: int = 0) -> dict[str, float]:
    """deepsig's ASO on each sweep's seed-level scores, one direction (system better): the share
    with violation ratio below 0.5 and below 0.2. (Higher-is-better scores.)"""
    from deepsig import aso

    eps = np.array([aso(list(s), list(b), show_progress=False, seed=seed, num_bootstrap_iterations=200)
                    for b, s in zip(base, system)])
    return {"aso<0.5": float((eps < 0.5).mean()), "aso<0.2": float((eps < 0.2).mean())}


def run(sweeps: int, power_sweeps: int, aso_sweeps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cells = []
    for paired in (True, False):
        for metric in METRICS:
            for ratio in RATIOS:
                for k in (2, 3, 5, 10):
                    base, system = simulate(metric, k, ratio, 0.0, sweeps, rng)
                    d = verdicts(metric, base, system, paired)
                    cell = {"metric": metric.split("/")[1], "paired": paired, "ratio": ratio, "seeds": k,
                            "sweeps": sweeps, "false_positive": float((d != 0).mean()),
                            "called_better": float((d * (1 if metric != "test/ppl" else -1) > 0).mean())}
                    if paired and ratio == "seed >> item":
                        for effect in (0.5, 1.0, 2.0):
                            b, s = simulate(metric, k, ratio, effect, power_sweeps, rng)
                            dd = verdicts(metric, b, s)
                            right = 1 if metric != "test/ppl" else -1  # perplexity falls when quality rises
                            cell[f"power@{effect:g}sd"] = float((dd == right).mean())
                        if metric == "test/bleu" and aso_sweeps:
                            cell.update({f"{key} (A/A)": v for key, v in
                                         aso_rates(base[:aso_sweeps], system[:aso_sweeps]).items()})
                            b, s = simulate(metric, k, ratio, 1.0, aso_sweeps, rng)
                            cell.update({f"{key} @1sd": v for key, v in aso_rates(b, s).items()})
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
    return {"cells": cells}


def table(result: dict) -> str:
    se = math.sqrt(0.05 * 0.95 / result["cells"][0]["sweeps"])
    lines = ["## Calibration of the verdicts (generated)", "",
             f"Generated {result['date']} by `python benchmarks/calibration.py` on {result['machine']} "
             f"({result['seconds']:.0f} s). Share of simulated sweeps with **no true difference** that get a verdict "
             f"(\"better\" or \"worse\") at the nominal 5%, {result['cells'][0]['sweeps']} sweeps per cell (Monte Carlo "
             f"standard error {100 * se:.1f} points); {ITEMS} test items per run. Paired: both schemes ran the same "
             "seeds; unpaired: different seeds (Welch). Ratios: seed effect vs item noise on the latent quality "
             "(*item only*: no seed effect, seeds differ only by the test items' sampling noise).", "",
             "| metric | seeds paired? | variance | 2 seeds | 3 seeds | 5 seeds | 10 seeds |", "|---|---|---|---|---|---|---|"]
    by = {}
    for c in result["cells"]:
        by.setdefault((c["metric"], c["paired"], c["ratio"]), {})[c["seeds"]] = c
    for (metric, paired, ratio), cells in by.items():
        lines.append(f"| {metric} | {'paired' if paired else 'unpaired'} | {ratio} | "
                     + " | ".join(f"{100 * cells[k]['false_positive']:.1f}%" for k in (2, 3, 5, 10)) + " |")
    lines += ["", "Power: the share of sweeps that call the better system better, for a true effect of 0.5, 1 and 2 "
              f"seed standard deviations of one system (paired, seed >> item, {result['power_sweeps']} sweeps per "
              "cell). The paired differences of two independent systems spread sqrt(2) times as much as one "
              "system's seeds, so 1 sd here is about 0.7 sd of the differences: 10 seeds find it about half the "
              "time. In units of the differences' spread, the paired t-test's power is the noncentral t's "
              "(STATISTICS.md: 10 seeds for 80% at 1 sd, 5 seeds at 2 sd; checked by simulation in "
              "tests/report/test_calibration.py; nas-report's `detectable` column and `--detect` use it).", "",
              "| metric | effect | 2 seeds | 3 seeds | 5 seeds | 10 seeds |", "|---|---|---|---|---|---|"]
    for (metric, paired, ratio), cells in by.items():
        if not paired or ratio != "seed >> item":
            continue
        for effect in ("0.5", "1", "2"):
            lines.append(f"| {metric} | {effect} sd | "
                         + " | ".join(f"{100 * cells[k][f'power@{effect}sd']:.0f}%" for k in (2, 3, 5, 10)) + " |")
    aso = [c for c in result["cells"] if "aso<0.5 (A/A)" in c]
    if aso:
        lines += ["", f"deepsig's ASO on the same seed-level BLEU (one direction, \"system better\"; "
                  f"{result['aso_sweeps']} sweeps per cell): ASO at its documented threshold (violation ratio < 0.5) "
                  "and at 0.2, against nas-report's verdict in the same direction.", "",
                  "| seeds | nas-report \"better\", no effect | ASO < 0.5, no effect | ASO < 0.2, no effect | "
                  "nas-report, 1 sd effect | ASO < 0.5, 1 sd | ASO < 0.2, 1 sd |", "|---|---|---|---|---|---|---|"]
        for c in aso:
            lines.append(f"| {c['seeds']} | {100 * c['called_better']:.1f}% | {100 * c['aso<0.5 (A/A)']:.0f}% | "
                         f"{100 * c['aso<0.2 (A/A)']:.0f}% | {100 * c['power@1sd']:.0f}% | {100 * c['aso<0.5 @1sd']:.0f}% | "
                         f"{100 * c['aso<0.2 @1sd']:.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = simulation_parser(__doc__, ROOT / "docs" / "calibration.json", ROOT / "docs" / "comparing.md", 1000, 500,
                          "simulated sweeps per cell with no true effect")
    p.add_argument("--aso-sweeps", type=int, default=200, help="sweeps per cell for deepsig's ASO (0: skip)")
    args = p.parse_args()

    def compute() -> dict:
        return {**run(args.sweeps, args.power_sweeps, args.aso_sweeps), "power_sweeps": args.power_sweeps,
                "aso_sweeps": args.aso_sweeps}

    print(table(run_and_write(args, compute, table, "python benchmarks/calibration.py")))


if __name__ == "__main__":
    main()
