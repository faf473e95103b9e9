"""``nas-report --baseline SELECTOR``: every other group against one baseline group.

A selector is ``field=value[,field=value...]`` over the grouping fields of
:func:`~nas_cli.report.table.field_value` (``scheme=unas``, ``placement.encoder=unas,heads=4``);
it must match exactly one group. A test metric's comparison reads the runs' per-item test
outputs (``test_items.json``, written by every run since issue #19); a run-level number (the
attention diagnostics: ``jsd``, ``explained_away``, ``min_margin``, ``entropy``,
``step_variation``, each also as ``<name>:<location>``, or any ``diag:<key>[:<location>]``) is
compared over the paired seeds. Both are computed by :mod:`nas_cli.report.stats`; with several
groups the p-values of each metric are Holm-adjusted.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from . import stats
from .collect import TEST_METRICS, Run
from .table import Group, field_value

ITEMS_FILE = "test_items.json"

#: run-level numbers (nas_cli.report.collect.Run.value names) compared over seeds, and their
#: column titles in the main table (for the † mark)
RUN_METRICS = {"jsd": "JSD", "explained_away": "expl. away", "min_margin": None, "entropy": None,
               "step_variation": None}


def is_run_metric(name: str) -> bool:
    """``jsd``, ``jsd:encoder``, ``diag:<key>[:<location>]``: a number each run has once."""
    return name.startswith("diag:") or name.split(":")[0] in RUN_METRICS


def metric_name(metric: str) -> str:
    """'bleu' for 'test/bleu'; run-level names as they are."""
    return metric.removeprefix("test/")


def metric_title(metric: str) -> str | None:
    """The main table's column for a compared metric (None: not a column there)."""
    from .collect import TEST_METRICS

    return {k: t for k, t, _ in TEST_METRICS}.get(metric) or RUN_METRICS.get(metric)


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
    """The metrics to test: ``--metrics`` (test metrics as in summary.json, with or without
    ``test/``, and run-level diagnostics, see :data:`RUN_METRICS`) or every test metric the runs
    report that nas-report can resample."""
    if wanted:
        names = [w if w.startswith("test/") or is_run_metric(w) else f"test/{w}" for w in wanted]
        unknown = [n for n in names if n not in stats.METRICS and not is_run_metric(n)]
        if unknown:
            raise CompareError(f"--metrics {','.join(unknown)}: no paired test for it; choose from "
                               f"{', '.join(m.split('/')[1] for m in stats.METRICS)} (test set) or "
                               f"{', '.join(RUN_METRICS)} (attention diagnostics, over seeds; also "
                               "<name>:<location> and diag:<key>)")
        return names
    return [m for m, _, _ in TEST_METRICS if m in stats.METRICS
            and any(r.value(m) is not None for g in groups for r in g.runs)]


@dataclass
class Row:
    group: Group
    comparison: stats.Comparison
    higher_is_better: bool | None  # None: a number with no better direction (the diagnostics)


def compare_groups(groups: Sequence[Group], baseline: Group, metrics: Sequence[str],
                   samples: int = stats.BOOTSTRAP_SAMPLES, trials: int = stats.AR_TRIALS) -> list[Row]:
    others = [g for g in groups if g is not baseline]
    if not others:
        raise CompareError("--baseline: there is no other group to compare with it")
    involved = [r for g in [baseline, *others] for r in g.runs]
    test_metrics = [m for m in metrics if not is_run_metric(m)]
    items = _checked_items(involved, test_metrics) if test_metrics else {}
    rows: list[Row] = []
    for m in metrics:  # in the order asked for
        if is_run_metric(m):
            rows.extend(_compare_run_metric(m, baseline, others))
            continue
        spec = stats.METRICS[m]
        found = []
        for g in others:
            pairs = _pairs(baseline, g)
            c = stats.compare(m, [items[id(b)] for b, _ in pairs], [items[id(s)] for _, s in pairs],
                              [s.seed for _, s in pairs], samples=samples, trials=trials)
            found.append(Row(g, c, spec.higher_is_better))
        rows.extend(_holm(found))
    return rows


def _holm(found: list[Row]) -> list[Row]:
    """Holm-adjust one metric's p-values over the groups compared with the baseline."""
    for row, p in zip(found, stats.holm([r.comparison.p for r in found])):
        row.comparison.p_adj = p
    return found


def _checked_items(involved: Sequence[Run], metrics: Sequence[str]) -> dict[int, dict]:
    """Every run's per-item test outputs, refused with one line when missing or from another test set."""
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
                raise CompareError(f"{metric_name(m)}: these runs have no decoded test outputs to test it on: "
                                   f"{', '.join(lacking[:5])}")
    return items


def _pairs(baseline: Group, group: Group) -> list:
    base_by_seed = {r.seed: r for r in baseline.runs}
    pairs = [(base_by_seed[r.seed], r) for r in sorted(group.runs, key=lambda r: r.seed or 0)
             if r.seed in base_by_seed]
    if not pairs:
        raise CompareError(f"{group.label} and the baseline share no seed (baseline seeds "
                           f"{baseline.seeds}, this group {group.seeds}); run both with the same seed=... values")
    return pairs


def _compare_run_metric(metric: str, baseline: Group, others: Sequence[Group]) -> list[Row]:
    found = []
    for g in others:
        pairs = _pairs(baseline, g)
        values = []
        for run in (r for pair in pairs for r in pair):
            try:
                v = run.value(metric)
            except KeyError:
                v = None
            if v is None:
                raise CompareError(f"--metrics {metric}: run {run.path} has no such value (attention diagnostics "
                                   "off, or no such location/key); compare runs that have it")
            values.append(v)
        c = stats.compare_seeds(metric, values[0::2], values[1::2], [s.seed for _, s in pairs])
        found.append(Row(g, c, None))
    return _holm(found)


def verdict_table(rows: Sequence[Row], baseline: Group) -> tuple[list[str], list[list[str]]]:
    head = ["system", "metric", "paired seeds", "baseline", "system mean", "difference [95% CI]", "p",
            "p (Holm)", "verdict"]
    out = []
    for r in rows:
        c = r.comparison
        name = metric_name(c.metric)
        out.append([r.group.label, name, ",".join(map(str, c.seeds)), _num(c.base_mean), _num(c.sys_mean),
                    f"{c.diff:+.3g} " + ("(no interval)" if math.isnan(c.low) else f"[{c.low:+.3g}, {c.high:+.3g}]"),
                    "-" if math.isnan(c.p) else stats._p(c.p),
                    stats._p(c.p_adj) if c.p_adj is not None and not math.isnan(c.p_adj) else "-",
                    c.verdict(r.higher_is_better)])
    return head, out


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
    by_metric: dict[str, set[str]] = {}
    for r in rows:
        by_metric.setdefault(metric_name(r.comparison.metric), set()).add(r.comparison.test)
    tests = sorted(f"{m}: {_tests_in_words(t)}" for m, t in by_metric.items())
    kinds = {is_run_metric(r.comparison.metric) for r in rows}
    ci = []
    if False in kinds:
        ci.append("test metrics: a paired bootstrap that resamples the paired seeds and the test items together")
    if True in kinds:
        ci.append("attention diagnostics (one number per run): a Student-t interval of the paired differences")
    return ("Paired by seed; difference = mean over paired seeds of (system - baseline); 95% CI, "
            + "; ".join(ci) + "; p-values: " + "; ".join(tests)
            + "; Holm-adjusted over the groups compared with the baseline, per metric.")
