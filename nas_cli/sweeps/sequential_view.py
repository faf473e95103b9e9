"""What a ``seed=auto`` sweep shows (:mod:`nas_cli.sweeps.sequential`): the method in words, the table of
its comparisons (the sweep's terminal, ``nas-report <sweep dir>``), the figure ``sequential.png`` of each
difference with its sequential interval against the number of seeds, and the line of each look."""
from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nas_cli.report import stopping as seq
from nas_cli.sweeps.design import Options

DECISION_WORDS = MappingProxyType({seq.HIGHER: "higher", seq.LOWER: "lower", seq.EQUIVALENT: "no difference larger than delta",
                  seq.CONTINUE: "continue", seq.UNDECIDED: "undecided"})


def finite_or_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def method_text(o: Options, tuned: list[str] | None = None) -> str:
    looks = ", ".join(map(str, o.looks))
    return (f"Group-sequential paired t-test over seeds: looks at {looks} paired seeds; "
            f"{'O' + chr(39) + 'Brien-Fleming' if o.spending == 'obf' else 'Pocock'}-type alpha spending "
            f"(Lan-DeMets), alpha={o.alpha:g} two-sided, boundaries for the t statistic (exact under normal "
            "seed-level differences); Holm across the comparisons, carried through the looks; the interval is the "
            f"repeated confidence interval at this look (it holds at every look at once)"
            + (f"; a comparison whose interval lies within +-{o.delta:g} ends 'no difference larger than delta'"
               if o.delta is not None else "")
            + (f"; tune=[{','.join(tuned)}]: at every look each configuration takes the value with the best mean "
               "validation number over that look's seeds, and its test numbers are compared, less the two "
               "choices' estimated lift (a bootstrap of the choice over the look's seeds) toward zero" if tuned else "")
            + ".")


def table_rows(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["system", "baseline", "n", "difference", "sequential interval", "|t|", "boundary", "decision"]
    rows = []
    for comp in rec["comparisons"]:
        lk = comp["looks"][-1] if comp["looks"] else None
        if lk is None:
            rows.append([comp["system"], comp["baseline"], "0", "-", "-", "-", "-", "waiting for runs"])
            continue
        low, high = lk["low"], lk["high"]
        interval = "(no interval)" if low is None or high is None else f"[{low:+.3g}, {high:+.3g}]"
        word = DECISION_WORDS.get(comp["decision"], comp["decision"])
        if comp["decision"] == seq.UNDECIDED:
            word = f"undecided at n={lk['n']}"
        elif comp["decision"] == seq.EQUIVALENT:
            word = f"no difference larger than {rec['design']['delta']:g}"
        t = lk["t"]
        rows.append([comp.get("system_chosen", comp["system"]), comp.get("baseline_chosen", comp["baseline"]),
                     str(lk["n"]), f"{lk['mean']:+.4g}", interval,
                     "-" if t is None else f"{abs(t):.2f}", "inf" if lk["boundary"] is None else f"{lk['boundary']:.3g}",
                     word])
    return head, rows


def rich_table(rec: dict[str, Any], title: str):
    from rich.markup import escape
    from rich.table import Table

    head, rows = table_rows(rec)
    rows = [[escape(cell) for cell in row] for row in rows]  # a label or the method may hold [brackets]
    table = Table(title=escape(title), caption=escape(rec["method"]), caption_justify="left")
    widest = min(40, max([len(r[0]) for r in rows] + [6]))
    for h in head:
        table.add_column(h, no_wrap=h not in ("decision", "sequential interval"),
                         min_width=widest if h == "system" else None)
    for r in rows:
        table.add_row(*r)
    return table


def draw(rec: dict[str, Any], path: Path) -> None:
    """Each comparison's mean difference and sequential interval against the number of seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = [c for c in rec["comparisons"] if c["looks"]]
    if not comps:
        return
    fig, axes = plt.subplots(1, len(comps), figsize=(3.6 * len(comps), 3.2), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        ns = [lk["n"] for lk in comp["looks"]]
        means = [lk["mean"] for lk in comp["looks"]]
        lows = [lk["low"] if lk["low"] is not None else float("nan") for lk in comp["looks"]]
        highs = [lk["high"] if lk["high"] is not None else float("nan") for lk in comp["looks"]]
        ax.axhline(0, color="grey", lw=0.8)
        delta = rec["design"].get("delta")
        if delta:
            ax.axhspan(-delta, delta, color="tab:green", alpha=0.12, lw=0)
        ax.plot(ns, means, "o-", color="tab:blue")
        finite = [(n, lo, hi) for n, lo, hi in zip(ns, lows, highs) if math.isfinite(lo) and math.isfinite(hi)]
        # the scale of the last looks (the first ones at 2-3 seeds are orders of magnitude wider):
        # intervals beyond it are drawn to the edge with an arrow
        recent = [abs(v) for _, lo, hi in finite[-1:] for v in (lo, hi)] + [abs(m) for m in means]
        lim = 1.3 * max(recent + [2 * (delta or 0), 1e-9])
        for n, lo, hi in finite:
            ax.plot([n, n], [max(lo, -lim), min(hi, lim)], color="tab:blue", lw=2, alpha=0.6)
            if hi > lim:
                ax.plot([n], [lim], marker="^", color="tab:blue", alpha=0.6)
            if lo < -lim:
                ax.plot([n], [-lim], marker="v", color="tab:blue", alpha=0.6)
        ax.set_ylim(-lim, lim)
        ax.set_xlim(rec["design"]["min_seeds"] - 0.5, rec["design"]["max_seeds"] + 0.5)
        word = (f"no difference > {delta:g}" if comp["decision"] == seq.EQUIVALENT
                else DECISION_WORDS.get(comp["decision"], comp["decision"]))
        ax.set_title(f"{comp['system']}\n- {comp['baseline']}: {word}", fontsize=8)
        ax.set_xlabel("paired seeds")
        ax.set_ylabel(f"difference in {rec['metric']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def look_line(state: dict[str, seq.Comparison], n: int, metric: str) -> str:
    """One look of the sweep in one line: each comparison's decision so far."""
    said = "; ".join(f"{name}: {DECISION_WORDS[c.decision]}" for name, c in sorted(state.items()))
    return f"nas-run: look at n={n} seeds ({metric}): {said}"
