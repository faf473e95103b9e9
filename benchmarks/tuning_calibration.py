"""Calibration of tuned comparisons (``tune=[optim.lr]``, ``nas-report --tune``), by simulation: how often
each protocol calls two schemes different when, each at its own best learning rate, they are equal.

The model (metric units, higher is better): a grid of 4 learning rates r = 0..3; scheme s at rate r scores
mu_s(r) = -CURVATURE x (r - r*_s)^2 (one grid step off its best rate r*_s costs CURVATURE), plus a seed
effect (sd 0.3, shared by every run of that seed: the data order and initialization), plus the run's own
noise (sd 0.3, shared by its validation and test numbers: the trained model), plus the noise of each
evaluation (sd 0.1, validation and test apart). Three cases, each with "different" as the false verdict:

1. identical schemes (r* = 1 for both);
2. schemes equal at their own best rate whose best rates differ by one grid step (r* = 1 and 2);
3. identical schemes where one is tuned over more configurations (8: the 4 rates x a second option
   with no effect) than the other (4);
4. a scheme flat in the learning rate (every rate as good) against one sharply peaked at its best rate
   (one grid step off costs SHARP), equal at their best rates: picking the best of several equally good
   rates on validation numbers that share each run's quality with its test numbers favours the flat
   scheme (a winner's curse that more seeds do not remove).

Protocols (the verdict: a two-sided paired t-test at 5% on the test numbers, over the verdict seeds):

* ``shared``: the rate the baseline chose (on the verdict seeds) for both schemes (the untuned anchor);
* ``plain``: each scheme at its own rate, chosen on the verdict seeds, the verdict on the chosen runs' numbers
  as they are;
* ``same``: the same choice, the verdict's difference moved toward zero by the two choices' estimated lift
  (:mod:`nas_cli.report.selection`; ``nas-report --tune``'s default);
* ``held-1`` / ``held-2`` / ``held-3``: each scheme's rate chosen on 1, 2 or 3 separate tuning seeds
  (``tune_seeds=``), the verdict on the others.

Each cell is simulated twice: with the formulas above vectorized over many sweeps (``rate``), and on
fewer sweeps through nas-report's own code (``nas_report_rate``): every simulated sweep's runs (a summary
and a saved config each) grouped, tuned (:func:`nas_cli.report.tuning.tune`) and compared
(``compare_groups``) as ``nas-report --tune optim.lr --baseline scheme=a`` does. Case 4 is also run a
third way (``directory_rate``): each simulated sweep written as run directories (``summary.json`` and
``.hydra/config.yaml`` per run) and read by the ``nas-report`` command itself (its ``main``, ``--format
json``), as a user runs it.

    python benchmarks/tuning_calibration.py   # writes docs/tuning.json and its table in docs/comparing.md
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from nas_cli.bench.markdown import run_and_write, simulation_parser
from nas_cli.report.selection import optimism

ROOT = Path(__file__).resolve().parent.parent
RATES = (1e-4, 3e-4, 1e-3, 3e-3)  # the grid's values (only their order matters)
SEED_SD, RUN_SD, EVAL_SD = 0.3, 0.3, 0.1
CURVATURE = 0.25
CURVATURES = (0.1, 0.25, 0.5)  # the sensitivity of the default protocol to how sharply the rate matters
SEEDS = (2, 3, 5)
PROTOCOLS = ("shared", "plain", "same", "held-1", "held-2", "held-3")
CASES = {1: "identical schemes", 2: "best rates one grid step apart",
         3: "identical, one tuned over 8 configurations, the other over 4",
         4: "equal at their best rates, one flat in the rate, the other sharply peaked"}
SHARP = 1.0  # case 4: one grid step off the sharp scheme's best rate costs this much
ALPHA = 0.05


def _setup(case: int):
    """(best rate of a, of b; configurations of a, of b) of a case."""
    return 1, (2 if case == 2 else 1), len(RATES), (2 * len(RATES) if case == 3 else len(RATES))


def _curvatures(case: int, curvature: float) -> tuple[float, float]:
    """The cost of one grid step off the best rate for scheme a and for scheme b (case 4: flat and sharp)."""
    return (0.0, SHARP) if case == 4 else (curvature, curvature)


def simulate(case: int, protocol: str, n: int, sweeps: int, rng: np.random.Generator, curvature: float = CURVATURE):
    """Validation and test numbers of every run of ``sweeps`` simulated sweeps: for each scheme, arrays
    (sweeps, seeds, configurations); the first ``tuning`` seeds are the held-apart tuning seeds."""
    best_a, best_b, k_a, k_b = _setup(case)
    cost_a, cost_b = _curvatures(case, curvature)
    tuning = int(protocol.split("-")[1]) if protocol.startswith("held") else 0
    seeds = n + tuning
    seed_effect = rng.normal(0, SEED_SD, (sweeps, seeds))

    def runs(k: int, best: int, cost: float):
        rate = np.arange(k) % len(RATES)
        model = -cost * (rate - best) ** 2 + seed_effect[:, :, None] + rng.normal(0, RUN_SD, (sweeps, seeds, k))
        return model + rng.normal(0, EVAL_SD, model.shape), model + rng.normal(0, EVAL_SD, model.shape)

    return runs(k_a, best_a, cost_a), runs(k_b, best_b, cost_b), tuning


def _choose(val: np.ndarray, seeds: slice) -> np.ndarray:
    return val[:, seeds].mean(axis=1).argmax(axis=1)


def _toward_zero(mean: np.ndarray, lift: np.ndarray) -> np.ndarray:
    """The difference less the lift where the lift points its way, never past zero."""
    same_way = np.sign(mean) == np.sign(lift)
    return np.where(same_way, np.sign(mean) * np.maximum(np.abs(mean) - np.abs(lift), 0.0), mean)


def formula_rate(case: int, protocol: str, n: int, sweeps: int, rng, curvature: float = CURVATURE) -> float:
    """The share of simulated sweeps called different, by the formulas (vectorized)."""
    (val_a, test_a), (val_b, test_b), tuning = simulate(case, protocol, n, sweeps, rng, curvature)
    choose_on = slice(0, tuning) if tuning else slice(tuning, None)
    pick_a = _choose(val_a, choose_on)
    pick_b = pick_a % len(RATES) if protocol == "shared" else _choose(val_b, choose_on)
    rows = np.arange(sweeps)[:, None]
    cols = np.arange(tuning, tuning + n)[None, :]
    diff = test_b[rows, cols, pick_b[:, None]] - test_a[rows, cols, pick_a[:, None]]
    mean = diff.mean(axis=1)
    if protocol == "same":  # the winner's-curse correction of nas_cli.report.selection, vectorized
        mean = _toward_zero(mean, optimism(val_b, test_b, True) - optimism(val_a, test_a, True))
    t = mean / (diff.std(axis=1, ddof=1) / math.sqrt(n))
    p = 2 * stats.t.sf(np.abs(t), n - 1)
    return float((p < ALPHA).mean())


def _runs(scheme: str, val, test, k: int, sweep: int, seeds) -> list:
    from nas_cli.report.collect import Run

    out = []
    for i, seed in enumerate(seeds):
        for c in range(k):
            lr, extra = RATES[c % len(RATES)], c // len(RATES)
            config = {"attention": scheme, "optim": {"lr": lr}, "extra": extra, "seed": seed}
            summary = {"task": "sim", "scheme": scheme, "heads": 4, "seed": seed,
                       "best_val": {"metric": "val/score", "mode": "max", "value": float(val[sweep, i, c])},
                       "test": {"test/bleu": float(test[sweep, i, c])}}
            out.append(Run(path=Path(f"sim/{scheme}/{seed}/{c}"), summary=summary, config=config))
    return out


def nas_report_rate(case: int, protocol: str, n: int, sweeps: int, rng) -> float:
    """The share of simulated sweeps called different by nas-report's own grouping, tuning and verdict."""
    from nas_cli.report.compare import compare_groups, select_baselines
    from nas_cli.report.table import group_runs
    from nas_cli.report.tuning import tune

    (val_a, test_a), (val_b, test_b), tuning = simulate(case, protocol, n, sweeps, rng)
    _, _, k_a, k_b = _setup(case)
    seeds = list(range(1, tuning + n + 1))
    called = 0
    for j in range(sweeps):
        runs = _runs("a", val_a, test_a, k_a, j, seeds) + _runs("b", val_b, test_b, k_b, j, seeds)
        groups = group_runs(runs)
        if protocol == "shared":  # the baseline's choice for both: b's groups at a's chosen rate
            chosen = tune([g for g in groups if g.runs[0].scheme == "a"], ["optim.lr", "extra"])
            lr = chosen.cells[0].chosen.values["optim.lr"]
            groups = chosen.groups + [g for g in groups if g.runs[0].scheme == "b"
                                      and dict(g.key[2])["optim.lr"] == repr(lr) and dict(g.key[2])["extra"] == "0"]
            for g in groups:
                g.key = ("config", None, tuple((k, v) for k, v in g.key[2] if k not in ("optim.lr", "extra")))
        else:
            groups = tune(groups, ["optim.lr", "extra"], seeds[:tuning]).groups
            for g in groups if protocol == "plain" else ():
                g.selection = None
        rows = compare_groups(groups, select_baselines(groups, "scheme=a"), ["test/bleu"], item_tests=False)
        called += rows[0].comparison.direction() != 0
    return called / sweeps


def directory_rate(case: int, protocol: str, n: int, sweeps: int, rng) -> float | None:
    """The share of simulated sweeps called different by the ``nas-report`` command reading run directories
    (``--baseline scheme=a --tune optim.lr[,extra] [--tuning-seeds ...] --format json``); None for the
    shared and plain protocols, which are no options of nas-report's."""
    import contextlib
    import io
    import tempfile

    import yaml

    from nas_cli.commands.nas_report import main as nas_report

    if protocol in ("shared", "plain"):
        return None
    (val_a, test_a), (val_b, test_b), tuning = simulate(case, protocol, n, sweeps, rng)
    _, _, k_a, k_b = _setup(case)
    seeds = list(range(1, tuning + n + 1))
    called = 0
    for j in range(sweeps):
        with tempfile.TemporaryDirectory() as tmp:
            for run in _runs("a", val_a, test_a, k_a, j, seeds) + _runs("b", val_b, test_b, k_b, j, seeds):
                d = Path(tmp) / str(run.path)
                (d / ".hydra").mkdir(parents=True)
                (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(run.config))
                (d / "summary.json").write_text(json.dumps(run.summary))
            args = [tmp, "--baseline", "scheme=a", "--tune", "optim.lr,extra", "--no-item-tests", "--metrics", "bleu",
                    "--format", "json"]
            if tuning:
                args += ["--tuning-seeds", ",".join(map(str, seeds[:tuning]))]
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = nas_report(args)
            if code != 0:
                raise RuntimeError(f"nas-report exited {code} on a simulated sweep")
            (row,) = json.loads(out.getvalue())["comparison"]["rows"]
            called += row["direction"] != 0
    return called / sweeps


def run(sweeps: int, report_sweeps: int, seed: int = 0, directory_sweeps: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    cells = []
    for case in CASES:
        for protocol in PROTOCOLS:
            for n in SEEDS:
                cell = {"case": case, "protocol": protocol, "seeds": n, "sweeps": sweeps,
                        "rate": formula_rate(case, protocol, n, sweeps, rng), "report_sweeps": report_sweeps,
                        "nas_report_rate": nas_report_rate(case, protocol, n, report_sweeps, rng)}
                cell["sensitivity"] = {f"{c:g}": formula_rate(case, protocol, n, sweeps, rng, c) for c in CURVATURES}
                if case == 4 and directory_sweeps:
                    cell["directory_sweeps"] = directory_sweeps
                    cell["directory_rate"] = directory_rate(case, protocol, n, directory_sweeps, rng)
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    return {"cells": cells, "seed_sd": SEED_SD, "run_sd": RUN_SD, "eval_sd": EVAL_SD, "curvature": CURVATURE,
            "sharp": SHARP,
            "rates": list(RATES), "alpha": ALPHA, "cases": {str(k): v for k, v in CASES.items()}}


def _se(p: float, sweeps: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / sweeps)


def _directory_sweeps(result: dict) -> int:
    return max((c.get("directory_sweeps") or 0 for c in result["cells"]), default=0)


def table(result: dict) -> str:
    se = 2 * _se(result["alpha"], result["cells"][0]["sweeps"])
    lines = ["## Tuned comparisons, calibrated (generated)", "",
             f"`{result['command']}` on {result['machine']}, {result['date']}: a grid of {len(result['rates'])} "
             f"learning rates, one grid step off a scheme's best rate costs {result['curvature']:g} (metric units), "
             f"seed sd {result['seed_sd']}, run sd {result['run_sd']}, evaluation sd {result['eval_sd']}; the verdict "
             "a paired t-test at 5% over the verdict seeds. Each cell: the share of sweeps called different where "
             f"the schemes are equal at their own best rate (should be <= 5%; ± {100 * se:.1f} is two standard "
             f"errors of {result['cells'][0]['sweeps']:,} sweeps), and in brackets the same through nas-report's "
             f"own grouping, tuning and verdict on {result['cells'][0]['report_sweeps']:,} simulated sweeps (runs "
             "built in memory); for case 4 also, after it, the same through the `nas-report` command reading "
             f"{_directory_sweeps(result):,} simulated sweeps written as run directories. Case 4's sharp scheme "
             f"loses {result.get('sharp', SHARP):g} one grid step off its best rate, the flat one nothing. "
             "Protocols: shared = the baseline's chosen rate for both; plain = each scheme's rate "
             "chosen on the verdict seeds, the chosen runs' numbers as they are; same = that choice with the "
             "estimated lift of each choice taken off the difference, toward zero (the default); held-k = chosen "
             "on k separate tuning seeds.", "",
             "| case | protocol | 2 seeds | 3 seeds | 5 seeds |", "|---|---|---:|---:|---:|"]
    for case, words in result["cases"].items():
        for protocol in PROTOCOLS:
            row = [c for c in result["cells"] if str(c["case"]) == case and c["protocol"] == protocol]
            cells = " | ".join(f"{100 * c['rate']:.1f}% ({100 * c['nas_report_rate']:.1f}%)"
                               + (f" [{100 * c['directory_rate']:.1f}%]" if c.get("directory_rate") is not None else "")
                               for c in row)
            lines.append(f"| {case}. {words} | {protocol}{' (default)' if protocol == 'same' else ''} | {cells} |")
    lines += ["", f"How sharply the rate matters (the default protocol, same; one step off the best rate costs "
              f"{', '.join(str(c) for c in CURVATURES)}):", "",
              "| case | seeds | " + " | ".join(f"cost {c:g}" for c in CURVATURES) + " |",
              "|---|---:|" + "---:|" * len(CURVATURES)]
    for c in result["cells"]:
        if c["protocol"] == "same":
            lines.append(f"| {c['case']} | {c['seeds']} | " +
                         " | ".join(f"{100 * c['sensitivity'][f'{k:g}']:.1f}%" for k in CURVATURES) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = simulation_parser(__doc__, ROOT / "docs" / "tuning.json", ROOT / "docs" / "comparing.md", 20000, 400,
                          "simulated sweeps per cell (formulas)")
    p.add_argument("--report-sweeps", type=int, default=400, help="simulated sweeps per cell through nas-report's code")
    p.add_argument("--directory-sweeps", type=int, default=100,
                   help="case 4: simulated sweeps per cell written as run directories and read by the nas-report command")
    args = p.parse_args()
    print(table(run_and_write(args, lambda: run(args.sweeps, args.report_sweeps, directory_sweeps=args.directory_sweeps),
                              table, " ".join(["python benchmarks/tuning_calibration.py", *sys.argv[1:]]))))


if __name__ == "__main__":
    main()
