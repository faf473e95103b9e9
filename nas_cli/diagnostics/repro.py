"""``nas-repro``: reproduce paper figures that need no training.

    nas-repro mode-collapse --out DIR [--seed 0] [--steps 4] [--radius 0.1]

writes Ding et al. Appendix E figures (Fig. 7 curves, Figs. 8/9 scatter panels for the
Gaussian and the dot-product kernel) as PNGs plus ``mode_collapse.json`` with the numbers:
cluster counts after ``steps`` steps for every case, the max |simulation - closed form|
for Eqs. 13 and 14, and a small seed sweep of the cluster counts.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from . import mode_collapse as mc

CASES = {"unbalanced": (500, 50), "balanced": (225, 225)}  # Figs. 6/9 and Fig. 8


def run_mode_collapse(out: str | Path, seed: int = 0, steps: int = 4, radius: float = 0.1,
                      kernels: Sequence[str] = mc.KERNELS, sweep_seeds: int = 5) -> dict:
    """Write the figures and JSON under ``out``; returns the JSON content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    report: dict = {
        "source": "Ding et al. 2020, Appendix E (Figs. 6-9, Eqs. 13-14)",
        "settings": {"seed": seed, "steps": steps, "cluster_radius": radius,
                     "data": "500 (or 225) points ~ N((1.8, 0.7), 0.1 I), 50 (or 225) ~ N((-1, -1), 0.1 I)"},
        "notes": [
            "kernel 'gaussian': weights exp(-|x_i - x_j|^2 / 2) (Eqs. 2/7 with uniform priors); "
            "kernel 'dot': exp(x_i . x_j) (Eqs. 2/7 with the priors of Secs. 2.1/3.1, i.e. dot-product attention).",
            "clusters: single-linkage groups of final positions within cluster_radius; points still moving "
            "between modes appear as extra small clusters (see cluster_sizes and group_mean_distance_per_step).",
        ],
    }

    checks = {k: mc.closed_form_check(kernel=k) for k in kernels}
    report["closed_form"] = {
        "max_abs_err_unas_eq13": max(c["max_abs_err_unas"] for c in checks.values()),
        "max_abs_err_dnas_eq14": max(c["max_abs_err_dnas"] for c in checks.values()),
        "dnas_ge_unas_everywhere": all(r["dnas_sim"] >= r["unas_sim"] - 1e-12
                                       for c in checks.values() for r in c["rows"]),
        "rows": checks[kernels[0]]["rows"],
    }
    r_grid = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
    report["fig7_values"] = {
        str(a): {"r": r_grid, "unas_eq13": mc.unas_distance(r_grid, a).tolist(),
                 "dnas_eq14": mc.dnas_distance(r_grid, a).tolist(), "initial_2a": 2 * a}
        for a in (0.5, 1.0)
    }
    files.append(mc.plot_distance_vs_r(out / "fig7_distance_vs_r.png"))

    cases = {}
    for kernel in kernels:
        for name, (n0, n1) in CASES.items():
            res = mc.simulate_case(n0, n1, seed=seed, steps=steps, kernel=kernel, radius=radius)
            cases[f"{name}_{n0}_{n1}/{kernel}"] = res["summary"]
            fig = "fig9" if name == "unbalanced" else "fig8"
            files.append(mc.plot_scatter_steps(
                res["trajectories"], res["labels"], out / f"{fig}_{name}_{kernel}.png",
                title=f"{n0} red / {n1} blue, {kernel} kernel, seed {seed}"))
    report["cases"] = cases
    report["clusters_after_steps"] = {k: {s: v[s]["clusters"] for s in mc.SCHEMES} for k, v in cases.items()}

    sweep = {}
    for kernel in kernels:
        for name, (n0, n1) in CASES.items():
            per = {s: [] for s in mc.SCHEMES}
            for sd in range(sweep_seeds):
                summ = mc.simulate_case(n0, n1, seed=sd, steps=steps, kernel=kernel, radius=radius,
                                        extra_steps=0, per_step=False)["summary"]
                for s in mc.SCHEMES:
                    per[s].append(summ[s]["clusters"])
            sweep[f"{name}_{n0}_{n1}/{kernel}"] = per
    report["seed_sweep_clusters"] = {"seeds": list(range(sweep_seeds)), **sweep}

    report["files"] = [p.name for p in files] + ["mode_collapse.json"]
    (out / "mode_collapse.json").write_text(json.dumps(report, indent=2, default=_json_default))
    return report


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nas-repro", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("mode-collapse", help="Ding et al. Appendix E: mode collapse under UNAS vs DNAS")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--radius", type=float, default=0.1, help="single-linkage radius for counting clusters")
    p.add_argument("--sweep-seeds", type=int, default=5, help="seeds 0..N-1 for the cluster-count sweep (0: none)")
    p.add_argument("--kernel", choices=mc.KERNELS, action="append",
                   help="kernel(s) to run; default: all of " + ", ".join(mc.KERNELS))
    args = parser.parse_args(argv)
    if args.command == "mode-collapse":
        kernels = tuple(args.kernel) if args.kernel else mc.KERNELS
        rep = run_mode_collapse(args.out, seed=args.seed, steps=args.steps, radius=args.radius, kernels=kernels,
                                sweep_seeds=args.sweep_seeds)
        cf = rep["closed_form"]
        print(f"Eq. 13 max |sim - closed form| = {cf['max_abs_err_unas_eq13']:.3g}; "
              f"Eq. 14: {cf['max_abs_err_dnas_eq14']:.3g}")
        for case, counts in rep["clusters_after_steps"].items():
            per = ", ".join(f"{s.upper()} {n}" for s, n in counts.items())
            print(f"{case}: clusters after {args.steps} steps {per}")
        print(f"wrote {', '.join(rep['files'])} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
