"""The comparison against the baseline as tables and records: the verdicts over seeds (question a)
and the per-seed test-set detail (question b) of :mod:`nas_cli.report.compare`, for the terminal,
markdown, LaTeX and HTML (cells as text) and for JSON and CSV (numbers as numbers); the notes on
verdicts that lean on the t-test's assumption; the method in words."""
from __future__ import annotations

import math
import re
from typing import Sequence

from nas_cli.report import stats
from nas_cli.report.compare import Row, metric_name


def _ci(low: float, high: float) -> str:
    return "(no interval)" if math.isnan(low) else f"[{low:+.3g}, {high:+.3g}]"


def _seeds(c: stats.Comparison) -> str:
    if c.paired:
        return ",".join(map(str, c.seeds))
    return f"unpaired: {c.n_sys} vs {c.n_base}"


def _several(rows: Sequence[Row]) -> bool:
    """Rows against more than one baseline group (a selector that matched several): a column names it."""
    return len({id(r.baseline) for r in rows}) > 1


def _system(r: Row, several: bool) -> list[str]:
    return [r.group.label] + ([r.baseline.label] if several else [])


def verdict_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Question (a), one row per system and metric: the verdict over seeds (with the baseline
    group's label beside the system where the systems have different baselines)."""
    planning = any(r.comparison.detect for r in rows)
    equivalence = any(r.comparison.equivalence is not None for r in rows)
    several = _several(rows)
    head = ["system", *(["against"] if several else []), "metric", "seeds", "baseline", "system mean",
            "difference [95% CI]", "p", "p (Holm)", "verdict", "detectable (80%)"] + \
        (["seeds for ±detect"] if planning else []) + (["equivalence (TOST, Holm)"] if equivalence else [])
    out = []
    for r in rows:
        c = r.comparison
        tost = ([c.equivalence.verdict() if c.equivalence is not None else "-"] if equivalence else [])
        if c.undefined:  # no numbers by design: the verdict column says why
            out.append([*_system(r, several), metric_name(c.metric), *["-"] * 6, c.verdict(r.higher_is_better), "-"]
                       + (["-"] if planning else []) + tost)
            continue
        det = c.detectable()
        row = [*_system(r, several), metric_name(c.metric), _seeds(c), _num(c.base_mean), _num(c.sys_mean),
               f"{c.diff:+.3g} " + _ci(c.low, c.high), "-" if math.isnan(c.p) else stats._p(c.p),
               stats._p(c.p_adj) if c.p_adj is not None and not math.isnan(c.p_adj) else "-",
               c.verdict(r.higher_is_better), "-" if math.isnan(det) else f"±{det:.3g}"]
        if planning:
            need = c.needed()
            row.append("-" if c.detect is None else f"±{c.detect:g}: " + ("?" if need is None else str(need)))
        out.append(row + tost)
    return head, out


def verdict_records(rows: Sequence[Row]) -> list[dict]:
    """Question (a) with numbers as numbers (JSON, CSV)."""
    out = []
    for r in rows:
        c = r.comparison
        need = c.needed()
        out.append({"system": r.group.label, "baseline_group": r.baseline.label if r.baseline else None,
                    "metric": metric_name(c.metric), "paired": c.paired,
                    "seeds": c.seeds, "n_baseline": c.n_base, "n_system": c.n_sys,
                    "baseline_mean": _nan(c.base_mean), "system_mean": _nan(c.sys_mean), "difference": _nan(c.diff),
                    "ci_low": _nan(c.low), "ci_high": _nan(c.high), "p": _nan(c.p),
                    "p_holm": _nan(c.p_adj if c.p_adj is not None else math.nan),
                    "direction": c.direction(), "verdict": c.verdict(r.higher_is_better), "test": c.test,
                    "detectable_80": _nan(c.detectable()), "detect": c.detect, "seeds_for_detect": need,
                    "outlier_seed": c.outlier["seed"] if c.outlier else None,
                    "outlier_p": c.outlier["p"] if c.outlier else None,
                    "p_without_outlier": c.without_outlier[1] if c.without_outlier else None,
                    "p_signflip": c.signflip_p, "selection_shift": c.selection_shift,
                    **_equivalence_record(c.equivalence)})
    return out


def _equivalence_record(e) -> dict:
    """--equivalence's fields of a record (absent without it)."""
    if e is None:
        return {}
    return {"equivalence_margin": e.margin, "p_tost": _nan(e.p), "p_tost_holm": _nan(e.p_adj),
            "equivalent": e.equivalent, "equivalence": e.verdict()}


def cautions(rows: Sequence[Row]) -> list[str]:
    """One line per comparison whose verdict leans on the t-test's assumption (an outlying seed;
    from 6 seeds, an exact sign-flip p on the other side of 0.05): see nas_cli.report.robust."""
    out = []
    for r in rows:
        for line in r.comparison.cautions():
            against = f" vs {r.baseline.label}" if r.baseline is not None else ""
            out.append(f"{metric_name(r.comparison.metric)}, {r.group.label}{against}: {line}")
    return out


def item_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Question (b), one row per system, metric and paired seed: the two runs on the test items."""
    several = _several(rows)
    head = ["system", *(["against"] if several else []), "metric", "seed", "baseline", "system",
            "difference [95% CI, items]", "p (items)", "test"]
    out = []
    for r in rows:
        for it in r.comparison.items:
            out.append([*_system(r, several), metric_name(it.metric), str(it.seed), _num(it.base), _num(it.system),
                        f"{it.diff:+.3g} " + _ci(it.low, it.high), stats._p(it.p), it.test])
    return head, out


def item_records(rows: Sequence[Row]) -> list[dict]:
    return [{"system": r.group.label, "baseline_group": r.baseline.label if r.baseline else None,
             "metric": metric_name(it.metric), "seed": it.seed, "baseline": it.base,
             "system_score": it.system, "difference": it.diff, "ci_low": it.low, "ci_high": it.high, "p": it.p,
             "test": it.test, "differing_items": it.differing}
            for r in rows for it in r.comparison.items]


def _nan(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _num(x: float) -> str:
    return f"{x:.4g}"


def _tests_in_words(tests: set[str]) -> str:
    """One metric's tests in one phrase: groups with different numbers of paired seeds differ only
    in the t-test's degrees of freedom ("paired t-test over seeds (1 or 2 df, ...)")."""
    found = [re.fullmatch(r"(.*) \((\d+) df\)", t) for t in sorted(tests)]
    if len(tests) > 1 and all(found) and len({f.group(1) for f in found}) == 1:
        dfs = sorted({int(f.group(2)) for f in found})
        return f"{found[0].group(1)} ({' or '.join(map(str, dfs))} df: one less than the paired seeds)"
    return " / ".join(sorted(tests))


def method_note(rows: Sequence[Row]) -> str:
    """What the verdict table answers, and how."""
    by_metric: dict[str, set[str]] = {}
    for r in rows:
        by_metric.setdefault(metric_name(r.comparison.metric), set()).add(r.comparison.test)
    tests = sorted(f"{m}: {_tests_in_words(t)}" for m, t in by_metric.items())
    small = min((r.comparison.n for r in rows), default=0)
    return ("Across seeds (the verdict): does the system beat the baseline when training is repeated? Unit: the "
            "seed, each run's own number (the table's cell). Paired by seed; difference = mean over paired seeds of "
            "(system - baseline) with a 95% Student-t interval; p-values: " + "; ".join(tests)
            + "; Holm-adjusted over the groups compared with the baseline, per metric"
            + (" (the loss per position bucket: over every bucket and group at once, one family per length)"
               if any(r.comparison.metric.startswith("test/pos_loss_") for r in rows) else "")
            + (" (the zero-shot scores: over every task, metric and group at once, one family)"
               if any(r.comparison.metric.startswith("test/zeroshot/") for r in rows) else "")
            + (" (passkey retrieval: over every length, depth and group at once, one family)"
               if any(r.comparison.metric.startswith("test/passkey/") for r in rows) else "")
            + f". A verdict needs at least "
            f"{stats.MIN_SEEDS} seeds in both groups"
            + ("; below 6 seeds it rests on the t-test's assumption of roughly normal seed-level differences "
               "(no distribution-free test over fewer than 6 seeds can reach p < 0.05)" if small < 6 else "")
            + ". detectable (80%): the smallest true difference this many seeds detect with 80% power at the "
            "observed spread (an estimate from few seeds: treat it as rough)."
            + (" seeds for ±detect: how many paired seeds would detect the --detect difference with 80% power at the "
               "observed spread (the same estimate, planned for the difference you name)."
               if any(getattr(r.comparison, "detect", None) is not None for r in rows) else "")
            + (" equivalence: two one-sided t-tests (TOST) on the same differences, equivalent within ±margin when "
               "both reject at 5% after Holm over the groups (the 90% interval inside the margin); 'not shown "
               "equivalent' is no evidence of a difference."
               if any(r.comparison.equivalence is not None for r in rows) else ""))


ITEM_NOTE = ("On this test set, per trained model (supporting detail, not a verdict over seeds): each paired seed's "
             "two runs compared on the same test items. 95% CI: paired bootstrap over the items; p: approximate "
             "randomization with ties counted (exact when at most 16 items differ) for BLEU, chrF, perplexity and "
             "ROUGE, McNemar's exact test for exact match and zero-shot accuracy. These say whether one trained model beats another on "
             "these sentences, nothing about another seed.")
