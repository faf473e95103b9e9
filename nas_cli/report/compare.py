"""``nas-report --baseline SELECTOR``: every other group against one baseline group.

A selector is ``field=value[,field=value...]`` over the grouping fields of
:func:`~nas_cli.report.table.field_value` (``scheme=unas``, ``placement.encoder=unas,heads=4``);
it must match exactly one group. Each comparison reads the runs' per-item test outputs
(``test_items.json``, written by every run since issue #19) and is computed by
:mod:`nas_cli.report.stats`; with several groups the p-values of each metric are Holm-adjusted.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from . import stats
from .collect import TEST_METRICS, Run
from .table import Group, field_value

ITEMS_FILE = "test_items.json"


class CompareError(ValueError):
    """Bad --baseline / --metrics input, or runs that cannot be compared (one line for the user)."""


def parse_selector(text: str) -> dict[str, str]:
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise CompareError(f"--baseline {text!r}: expected field=value[,field=value], e.g. scheme=unas")
        out[key.strip()] = value.strip()
    if not out:
        raise CompareError("--baseline needs field=value, e.g. scheme=unas")
    return out


def _matches(group: Group, selector: dict[str, str]) -> bool:
    return all(all(str(field_value(r, k)) == v for r in group.runs) for k, v in selector.items())


def select_baseline(groups: Sequence[Group], text: str) -> Group:
    selector = parse_selector(text)
    found = [g for g in groups if _matches(g, selector)]
    if len(found) > 1 and "variant" not in selector:  # the trained runs, not their nas-eval results
        found = [g for g in found if all(r.variant is None for r in g.runs)] or found
    if len(found) == 1:
        return found[0]
    labels = "; ".join(g.label for g in groups)
    if not found:
        raise CompareError(f"--baseline {text}: no group matches; the groups are: {labels}")
    raise CompareError(f"--baseline {text}: {len(found)} groups match ({'; '.join(g.label for g in found)}); "
                       "add fields to the selector, e.g. scheme=unas,heads=4")


def load_items(run: Run) -> dict | None:
    path = run.items_path or Path(run.path) / ITEMS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_for(groups: Sequence[Group], wanted: Sequence[str] | None) -> list[str]:
    """The metrics to test: ``--metrics`` (names as in summary.json, with or without ``test/``)
    or every test metric the runs report that nas-report can resample."""
    if wanted:
        names = [w if w.startswith("test/") else f"test/{w}" for w in wanted]
        unknown = [n for n in names if n not in stats.METRICS]
        if unknown:
            raise CompareError(f"--metrics {','.join(unknown)}: no paired test for it; choose from "
                               f"{', '.join(m.split('/')[1] for m in stats.METRICS)}")
        return names
    return [m for m, _, _ in TEST_METRICS if m in stats.METRICS
            and any(r.value(m) is not None for g in groups for r in g.runs)]


@dataclass
class Row:
    group: Group
    comparison: stats.Comparison
    higher_is_better: bool


def compare_groups(groups: Sequence[Group], baseline: Group, metrics: Sequence[str],
                   samples: int = stats.BOOTSTRAP_SAMPLES, trials: int = stats.AR_TRIALS) -> list[Row]:
    others = [g for g in groups if g is not baseline]
    if not others:
        raise CompareError("--baseline: there is no other group to compare with it")
    involved = [r for g in [baseline, *others] for r in g.runs]
    items = {id(r): load_items(r) for r in involved}
    missing = [str(r.path) for r in involved if items[id(r)] is None]
    if missing:
        raise CompareError(f"paired tests need per-item test outputs ({ITEMS_FILE}), which these runs lack (made "
                           f"before nas-run wrote them, or run_test=false): {', '.join(missing[:5])}"
                           + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    prints = {}
    for r in involved:
        prints.setdefault(items[id(r)].get("refs_sha256"), []).append(str(r.path))
    if len(prints) > 1:
        a, b = list(prints.values())[:2]
        raise CompareError(f"runs were tested on different test sets or references: {a[0]} and {b[0]} (reference "
                           "fingerprints differ); compare runs of one test set")
    for m in metrics:
        if stats.needs_text(m) or m == "test/exact_match":
            lacking = [str(r.path) for r in involved if "hyps" not in items[id(r)]]
            if lacking:
                raise CompareError(f"{m.split('/')[1]}: these runs have no decoded test outputs to test it on: "
                                   f"{', '.join(lacking[:5])}")
    rows: list[Row] = []
    for m in metrics:
        spec = stats.METRICS[m]
        found = []
        for g in others:
            base_by_seed = {r.seed: r for r in baseline.runs}
            pairs = [(base_by_seed[r.seed], r) for r in sorted(g.runs, key=lambda r: r.seed or 0)
                     if r.seed in base_by_seed]
            if not pairs:
                raise CompareError(f"{g.label} and the baseline share no seed (baseline seeds "
                                   f"{baseline.seeds}, this group {g.seeds}); run both with the same seed=... values")
            c = stats.compare(m, [items[id(b)] for b, _ in pairs], [items[id(s)] for _, s in pairs],
                              [s.seed for _, s in pairs], samples=samples, trials=trials)
            found.append(Row(g, c, spec.higher_is_better))
        for row, p in zip(found, stats.holm([r.comparison.p for r in found])):
            row.comparison.p_adj = p
        rows.extend(found)
    return rows


def verdict_table(rows: Sequence[Row], baseline: Group) -> tuple[list[str], list[list[str]]]:
    head = ["system", "metric", "paired seeds", "baseline", "system mean", "difference [95% CI]", "p",
            "p (Holm)", "verdict"]
    out = []
    for r in rows:
        c = r.comparison
        name = c.metric.split("/")[1]
        out.append([r.group.label, name, ",".join(map(str, c.seeds)), _num(c.base_mean), _num(c.sys_mean),
                    f"{c.diff:+.3g} [{c.low:+.3g}, {c.high:+.3g}]", stats._p(c.p),
                    stats._p(c.p_adj) if c.p_adj is not None and not math.isnan(c.p_adj) else "-",
                    c.verdict(r.higher_is_better)])
    return head, out


def _num(x: float) -> str:
    return f"{x:.4g}"


def method_note(rows: Sequence[Row]) -> str:
    tests = sorted({f"{r.comparison.metric.split('/')[1]}: {r.comparison.test}" for r in rows})
    return ("Paired by seed; difference = mean over paired seeds of (system - baseline), 95% CI from a paired "
            "bootstrap that resamples the paired seeds and the test items together; p-values: "
            + "; ".join(tests) + "; Holm-adjusted over the groups compared with the baseline, per metric.")
