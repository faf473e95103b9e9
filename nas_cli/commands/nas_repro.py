"""``nas-repro``: reproduce paper figures.

    nas-repro mode-collapse --out DIR [--seed 0] [--steps 4] [--radius 0.1]

writes Ding et al. Appendix E figures (Fig. 7 curves, Figs. 8/9 scatter panels for the
Gaussian and the dot-product kernel) as PNGs plus ``mode_collapse.json`` with the numbers:
cluster counts after ``steps`` steps for every case, the max |simulation - closed form|
for Eqs. 13 and 14, and a small seed sweep of the cluster counts. No training.

    nas-repro explained-away --out DIR [--steps 500] [--seed 1] [--heads 4] [--batches 4]
                             [--set KEY=VALUE ...]

trains UNAS and DNAS on the same data with the same seed (in process, ``logger=csv``,
run directories ``DIR/unas`` and ``DIR/dnas``), analyses the encoder self-attention of
``--batches`` validation batches at the end, and writes Ding et al. Fig. 1: the overlaid
histograms of log_e(sum_i pi_ij) over keys (all encoder layers, and one figure per layer)
with the -log Sk line of Theorem 2, plus ``explained_away.json`` with the numbers.
``--set`` passes further Hydra overrides to both runs (e.g. ``--set task=sort``).
"""
from __future__ import annotations

import sys
from typing import Sequence


from nas_cli.errors import OneLineParser, exits
from nas_cli.bench.repro import run_explained_away, run_mode_collapse
from nas_cli.diagnostics import mode_collapse as mc

@exits
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="nas-repro", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("mode-collapse", help="Ding et al. Appendix E: mode collapse under UNAS vs DNAS")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--radius", type=float, default=0.1, help="single-linkage radius for counting clusters")
    p.add_argument("--sweep-seeds", type=int, default=5, help="seeds 0..N-1 for the cluster-count sweep (0: none)")
    p.add_argument("--kernel", choices=mc.KERNELS, action="append",
                   help="kernel(s) to run; default: all of " + ", ".join(mc.KERNELS))
    e = sub.add_parser("explained-away",
                       help="Ding et al. Fig. 1: train UNAS and DNAS, overlay encoder log sum_i pi_ij histograms")
    e.add_argument("--out", required=True, help="output directory (created if missing)")
    e.add_argument("--steps", type=int, default=500, help="training steps of each model")
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--heads", type=int, default=4)
    e.add_argument("--batches", type=int, default=4, help="validation batches analysed at the end")
    e.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Hydra override for both runs (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "explained-away":
        code = _explained_away(args)
        if code:
            return code
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


def _explained_away(args) -> int:
    """``nas-repro explained-away``: train, analyse, print the numbers; 2 for a bad --set."""
    import logging
    import os
    import warnings

    from hydra.errors import HydraException

    from nas_cli.errors import UserError

    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda",
                 "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    try:
        rep = run_explained_away(args.out, steps=args.steps, seed=args.seed, heads=args.heads,
                                 batches=args.batches, overrides=args.overrides)
    except (UserError, ValueError, HydraException) as err:  # a bad --set: Hydra's message, its first line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"nas-repro: error: {first}", file=sys.stderr)
        return 2
    for scheme, r in rep["schemes"].items():
        print(f"{scheme.upper()}: encoder keys explained away (sum_i pi_ij < {r['eps']:g}) "
              f"{100 * r['explained_away_frac']:.2f}%, below -20: {100 * r['fraction_log_mass_below_-20']:.2f}%, "
              f"min margin over -log Sk {r['min_margin']}, {r['best_val']['metric']} {r['best_val']['value']}")
    print(f"wrote {', '.join(rep['files'])} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
