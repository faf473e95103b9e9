"""Error rates, power and seeds used of the sequential sweep (``seed=auto``), by simulation.

Seed-level scores come from the score model of benchmarks/calibration.py (each run scored from
its own simulated test items: corpus BLEU, perplexity, exact match; three ratios of seed to item
variance). The paired differences of one comparison go through the sweep's own rule
(:func:`nas_cli.report.stopping.outcomes`, the rule of ``decide``) with looks at every seed from
``min_seeds`` = 2 to ``max_seeds`` = 5 or 10:

- no true difference: the share of sweeps that ever declare one (higher or lower);
- a true effect of 0.5, 1 and 2 seed standard deviations: the power, the mean number of paired
  seeds used, and the fixed number of seeds a one-look paired t-test needs for the same power
  (noncentral t at the simulated spread of the differences);
- Holm across comparisons: three systems against one baseline (``decide``), family-wise error;
- AdaStop (``adastop`` on PyPI, Mathieu et al. 2023) on the same scores at equal settings (2 seeds
  per stage x 5 stages, 5 x 2), against nas-run's rule with the same looks.

    python benchmarks/sequential_calibration.py     # docs/sequential.json and its section in docs/comparing.md
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from nas_cli.report import stopping as seq
from nas_cli.bench.markdown import run_and_write, simulation_parser
from nas_cli.report import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import METRICS, RATIOS, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EFFECTS = (0.5, 1.0, 2.0)


def _sign(metric: str) -> int:
    return -1 if metric == "test/ppl" else 1  # perplexity falls when quality rises


def fixed_n_for(power: float, mean: float, sd: float, limit: int = 200) -> int | None:
    """The smallest n whose one-look paired t-test (alpha 0.05) has at least ``power`` at this effect."""
    if sd <= 0 or power <= 0:
        return None
    for n in range(2, limit + 1):
        if stats.power(abs(mean), sd / math.sqrt(n), n - 1) >= power:
            return n
    return None


def cell(metric: str, ratio: str, max_seeds: int, effect: float, sweeps: int, rng, looks=None) -> dict:
    looks = looks or seq.looks(2, max_seeds)
    base, system = simulate(metric, max_seeds, ratio, effect, sweeps, rng)
    d = system - base
    code, stop = seq.outcomes(d, looks)
    out = {"metric": metric.split("/")[1], "ratio": ratio, "max_seeds": max_seeds, "effect_sd": effect,
           "looks": list(looks), "sweeps": sweeps, "declared": float((code != 0).mean()),
           "right": float((code == _sign(metric)).mean()) if effect else None,
           "mean_seeds": float(stop.mean())}
    if effect:
        out["fixed_n_equal_power"] = fixed_n_for(out["right"], float(d.mean()), float(d.std(ddof=1)))
    return out


def holm_family(sweeps: int, max_seeds: int, rng, effects=(0.0, 0.0, 0.0)) -> dict:
    """Three systems against one shared baseline through ``decide``; normal seed-level scores."""
    looks = seq.looks(2, max_seeds)
    false = 0
    for _ in range(sweeps):
        base = rng.normal(size=max_seeds)
        pairs = {f"s{i}": ("b", base, rng.normal(e, 1.0, size=max_seeds)) for i, e in enumerate(effects)}
        state = seq.decide(pairs, looks)
        false += any(state[f"s{i}"].decision in (seq.HIGHER, seq.LOWER) for i, e in enumerate(effects) if e == 0)
    return {"max_seeds": max_seeds, "effects": list(effects), "sweeps": sweeps, "familywise_error": false / sweeps}


def equivalence_cells(sweeps: int, rng) -> list[dict]:
    """``delta``: normal paired differences (sd 1) with a true difference of 0 or exactly delta."""
    out = []
    for max_seeds in (5, 10):
        for delta in (0.5, 1.0, 2.0):
            for theta in (0.0, delta):
                d = rng.normal(theta, 1.0, size=(sweeps, max_seeds))
                code, stop = seq.outcomes(d, seq.looks(2, max_seeds), delta=delta)
                out.append({"max_seeds": max_seeds, "delta_sd": delta, "true_sd": theta, "sweeps": sweeps,
                            "no_difference": float((code == 2).mean()), "declared": float(np.isin(code, (1, -1)).mean()),
                            "undecided": float((code == 0).mean()), "mean_seeds": float(stop.mean())})
    return out


def adastop_cell(metric: str, ratio: str, n: int, stages: int, effect: float, sweeps: int, rng, B: int) -> dict:
    from adastop import MultipleAgentsComparator

    base, system = simulate(metric, n * stages, ratio, effect, sweeps, rng)
    declared = right = 0
    used = []
    for j in range(sweeps):
        comp = MultipleAgentsComparator(n=n, K=stages, B=B, alpha=0.05, seed=j)
        decision = "continue"
        for k in range(stages):
            comp.partial_compare({"base": base[j, :(k + 1) * n], "sys": system[j, :(k + 1) * n]}, verbose=False)
            decision = list(comp.decisions.values())[0]
            if decision != "continue":
                used.append((k + 1) * n)
                break
        else:
            used.append(n * stages)
        if decision in ("larger", "smaller"):
            declared += 1
            # adastop's comparison (0, 1) is base - sys: "smaller" means the system is higher
            right += (decision == "smaller") == (_sign(metric) > 0)
    ours_code, ours_stop = seq.outcomes(system - base, seq.looks(n, n * stages, n))
    return {"metric": metric.split("/")[1], "ratio": ratio, "seeds_per_stage": n, "stages": stages,
            "effect_sd": effect, "sweeps": sweeps, "adastop_declared": declared / sweeps,
            "adastop_right": right / sweeps if effect else None, "adastop_mean_seeds": float(np.mean(used)),
            "ours_declared": float((ours_code != 0).mean()),
            "ours_right": float((ours_code == _sign(metric)).mean()) if effect else None,
            "ours_mean_seeds": float(ours_stop.mean())}


def run(sweeps: int, power_sweeps: int, family_sweeps: int, adastop_sweeps: int, B: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cells = []
    for metric in METRICS:
        for ratio in RATIOS:
            for max_seeds in (5, 10):
                for effect in (0.0, *EFFECTS):
                    if effect and ratio != "seed ~ item":
                        continue
                    c = cell(metric, ratio, max_seeds, effect, sweeps if not effect else power_sweeps, rng)
                    cells.append(c)
                    print(json.dumps(c), flush=True)
    family = [holm_family(family_sweeps, m, rng) for m in (5, 10)]
    family += [holm_family(family_sweeps, m, rng, (2.0, 0.0, 0.0)) for m in (5, 10)]
    for f in family:
        print(json.dumps(f), flush=True)
    equivalence = equivalence_cells(sweeps, rng)
    for e in equivalence:
        print(json.dumps(e), flush=True)
    ada = []
    if adastop_sweeps:
        for n, stages in ((2, 5), (5, 2)):
            for effect in (0.0, 1.0):
                a = adastop_cell("test/bleu", "seed ~ item", n, stages, effect, adastop_sweeps, rng, B)
                ada.append(a)
                print(json.dumps(a), flush=True)
    return {"cells": cells, "family": family, "equivalence": equivalence, "adastop": ada}


def table(result: dict) -> str:
    null = [c for c in result["cells"] if not c["effect_sd"]]
    se = math.sqrt(0.05 * 0.95 / null[0]["sweeps"])
    lines = ["## Sequential sweeps: error rate, power and seeds used (generated)", "",
             f"Generated {result['date']} by `python benchmarks/sequential_calibration.py` on {result['machine']} "
             f"({result['seconds']:.0f} s). One comparison, looks at every seed from 2 to `max_seeds`, "
             "O'Brien-Fleming-type spending, alpha = 0.05; seed-level scores from the score model of the "
             "calibration above (each run scored from its own 300 simulated test items).", "",
             f"**No true difference**: the share of sweeps that ever declare one, {null[0]['sweeps']} sweeps per cell "
             f"(Monte Carlo standard error {100 * se:.1f} points).", "",
             "| metric | variance | max_seeds 5 | max_seeds 10 |", "|---|---|---|---|"]
    by = {}
    for c in null:
        by.setdefault((c["metric"], c["ratio"]), {})[c["max_seeds"]] = c
    for (metric, ratio), cs in by.items():
        lines.append(f"| {metric} | {ratio} | {100 * cs[5]['declared']:.1f}% | {100 * cs[10]['declared']:.1f}% |")
    eff = [c for c in result["cells"] if c["effect_sd"]]
    lines += ["", f"**A true effect** (seed ~ item; {eff[0]['sweeps']} sweeps per cell): power (the right direction "
              "declared), the mean number of paired seeds per comparison until it stopped, and the fixed number of "
              "seeds a one-look paired t-test needs for the same power at the simulated spread.", "",
              "| metric | effect | max_seeds | power | mean seeds used | fixed n, same power |", "|---|---|---|---|---|---|"]
    for c in eff:
        lines.append(f"| {c['metric']} | {c['effect_sd']:g} sd | {c['max_seeds']} | {100 * c['right']:.0f}% | "
                     f"{c['mean_seeds']:.1f} | {c['fixed_n_equal_power'] or '-'} |")
    lines += ["", "**Holm across comparisons** (three systems against one shared baseline, normal seed-level scores, "
              "through the sweep's `decide`): the share of sweeps with a false declaration among the systems with no "
              "true effect.", "", "| max_seeds | true effects | sweeps | family-wise error |", "|---|---|---|---|"]
    for f in result["family"]:
        lines.append(f"| {f['max_seeds']} | {', '.join(f'{e:g}' for e in f['effects'])} | {f['sweeps']} | "
                     f"{100 * f['familywise_error']:.1f}% |")
    if result.get("equivalence"):
        lines += ["", "**With `delta`** (normal paired differences, sd 1; delta and the true difference in that sd): the "
                  "share of sweeps that end *no difference larger than delta*, that declare a difference, or end "
                  "undecided, and the mean seeds used. With a true difference of exactly delta, ending *no difference "
                  "larger than delta* is the error, held at 5%.", "",
                  "| max_seeds | delta | true difference | no difference > delta | declared | undecided | mean seeds |",
                  "|---|---|---|---|---|---|---|"]
        for e in result["equivalence"]:
            lines.append(f"| {e['max_seeds']} | {e['delta_sd']:g} sd | {e['true_sd']:g} sd | "
                         f"{100 * e['no_difference']:.1f}% | {100 * e['declared']:.1f}% | {100 * e['undecided']:.1f}% | "
                         f"{e['mean_seeds']:.1f} |")
    if result["adastop"]:
        lines += ["", f"**AdaStop** (`adastop` {result.get('adastop_version', '?')}, alpha = 0.05, B = "
                  f"{result['B']}) and nas-run's rule with the same looks, on the same simulated BLEU scores "
                  "(seed ~ item):", "",
                  "| seeds per stage x stages | effect | AdaStop declares | nas-run declares | AdaStop mean seeds | "
                  "nas-run mean seeds |", "|---|---|---|---|---|---|"]
        for a in result["adastop"]:
            lines.append(f"| {a['seeds_per_stage']} x {a['stages']} | {a['effect_sd']:g} sd | "
                         f"{100 * a['adastop_declared']:.1f}% | {100 * a['ours_declared']:.1f}% | "
                         f"{a['adastop_mean_seeds']:.1f} | {a['ours_mean_seeds']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = simulation_parser(__doc__, ROOT / "docs" / "sequential.json", ROOT / "docs" / "comparing.md", 2000, 1000,
                          "simulated sweeps per cell with no true effect")
    p.add_argument("--family-sweeps", type=int, default=1000)
    p.add_argument("--adastop-sweeps", type=int, default=300, help="0: skip AdaStop (needs pip install adastop)")
    p.add_argument("--B", type=int, default=2000, help="AdaStop's permutations")
    args = p.parse_args()

    def compute() -> dict:
        result = run(args.sweeps, args.power_sweeps, args.family_sweeps, args.adastop_sweeps, args.B)
        try:
            from importlib.metadata import version

            result["adastop_version"] = version("adastop")
        except Exception:  # noqa: BLE001
            pass
        return {**result, "B": args.B}

    run_and_write(args, compute, table, "python benchmarks/sequential_calibration.py")

if __name__ == "__main__":
    main()
