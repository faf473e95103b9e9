"""``nas-report --baseline SELECTOR``: every other group against one baseline group.

A selector is ``field=value[,field=value...]`` over the grouping fields of
:func:`~nas_cli.report.table.field_value` (``scheme=unas``, ``placement.encoder=unas,heads=4``);
it must match exactly one group. Two questions, answered separately (:mod:`nas_cli.report.stats`):

(a) **across seeds**, the verdict: each run's own number (the test metrics of summary.json, or a
    number the runs' diagnostics declared, by its name, also as ``<name>:<location>``, or any
    ``diag:<key>[:<location>]``),
    paired by seed, Holm-adjusted over the groups per metric;
(b) **on this test set, per trained model**: for each paired seed, the two runs' per-item test
    outputs (``test_items.json``) compared item by item: supporting detail, never the verdict.
"""
from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nas_cli.diagnostics.notes import SIGNED_NOTE
from nas_cli.infra.rundir import ITEMS_FILE
from nas_cli.report import stats
from nas_cli.report.baselines import (Baselines, CompareError, coordinates, parse_selector,  # noqa: F401
                                      select_baseline, select_baselines)
from nas_cli.report.families import holm, holm_over_buckets, holm_over_evaluations
from nas_cli.report import items as item_stats
from nas_cli.report.collect import Run
from nas_cli.report.table import Group, reported


def is_run_metric(name: str, runs: Sequence[Run]) -> bool:
    """``jsd``, ``jsd:encoder``, ``diag:<key>[:<location>]``: a number each run has once."""
    return name.startswith("diag:") or name.split(":")[0] in reported(runs)


def metric_name(metric: str) -> str:
    """'bleu' for 'test/bleu'; run-level names as they are."""
    return metric.removeprefix("test/")


def metric_title(metric: str, runs: Sequence[Run]) -> str | None:
    """The main table's column for a compared metric (None: not a column there)."""
    from tasks.scores import spec

    if metric.startswith("test/"):
        return spec(metric).title
    declared = reported(runs).get(metric)
    return declared.title if declared is not None and declared.column else None


def load_items(run: Run) -> dict | None:
    path = run.items_path or Path(run.path) / ITEMS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_for(groups: Sequence[Group], wanted: Sequence[str] | None) -> list[str]:
    """The metrics to compare: ``--metrics`` (test metrics as in summary.json, with or without
    ``test/``, and the numbers the runs' diagnostics declared) or every test metric the runs
    report (the table's columns)."""
    runs = [r for g in groups for r in g.runs]
    tested = {k for r in runs for k in ((r.summary or {}).get("test") or {})}
    if wanted:
        names = [w if w.startswith("test/") or is_run_metric(w, runs) else f"test/{w}" for w in wanted]
        unknown = [n for n in names if not is_run_metric(n, runs) and n not in item_stats.METRICS and n not in tested]
        if unknown:
            tests = sorted(m.split("/", 1)[1] for m in tested | set(item_stats.METRICS))
            diagnostics = list(reported(runs))  # the names the runs' diagnostics declared
            close = difflib.get_close_matches(unknown[0].split("/", 1)[1], [*tests, *diagnostics], n=1, cutoff=0.6)
            raise CompareError(f"--metrics {','.join(u.split('/', 1)[1] for u in unknown)}: no run reports it"
                               + (f" (did you mean {close[0]}?)" if close else "")
                               + f"; choose from {', '.join(tests)} (test set)"
                               + (f" or {', '.join(diagnostics)} (attention diagnostics; also <name>:<location> "
                                  "and diag:<key>)" if diagnostics else ""))
        return names
    from tasks.scores import present

    return [m.key for m in present(tested) if m.compared and any(r.value(m.key) is not None for r in runs)]


def higher_is_better(metric: str) -> bool | None:
    """True/False for the test metrics with a better direction; None for the diagnostics."""
    from tasks.scores import spec

    return spec(metric).higher_is_better if metric.startswith("test/") else None


@dataclass
class Row:
    group: Group
    comparison: stats.Comparison
    higher_is_better: bool | None  # None: a number with no better direction (the diagnostics)
    baseline: Group | None = None  # the group it is compared with


def parse_detect(text: str | None, metrics: Sequence[str]) -> dict[str, float]:
    """``--detect 0.5`` (every metric) or ``--detect bleu=1,ppl=0.2``: the differences to plan for."""
    return per_metric("--detect", text, metrics, "a number (0.5) or metric=number[,...] (bleu=1,ppl=0.2)",
                      "a difference to detect must be positive")


def parse_margins(text: str | None, metrics: Sequence[str]) -> dict[str, float]:
    """``--equivalence 0.5`` (every metric) or ``--equivalence bleu=0.5,ppl=2``: {metric: margin}
    (nas_cli/report/equivalence.py tests them)."""
    return per_metric("--equivalence", text, metrics, "a margin (0.5) or metric=margin[,...] (bleu=0.5,ppl=2)",
                      "a margin must be positive (the largest difference that counts as none)",
                      "; add it to --metrics")


def per_metric(option: str, text: str | None, metrics: Sequence[str], expected: str, positive: str,
               hint: str = "") -> dict[str, float]:
    """An option of one positive number for every metric or ``metric=number[,...]``: {metric: number},
    refused in one line naming ``option`` (``expected``: what it takes; ``positive``: why it must be > 0)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise CompareError(f"{option} {text}: expected {expected}")
        if not eq:
            out.update({m: number for m in metrics})
            continue
        key = name if name in metrics or name.startswith("test/") else f"test/{name}"
        if key not in metrics:
            import difflib

            names = [metric_name(m) for m in metrics]
            close = difflib.get_close_matches(metric_name(key), names, n=1, cutoff=0.5)
            mean = f" (did you mean {option} {close[0]}={value}?)" if close else ""
            raise CompareError(f"{option} {name}: not among the compared metrics ({', '.join(names)}){mean}{hint}")
        out[key] = number
    if any(not (d > 0) for d in out.values()):
        raise CompareError(f"{option} {text}: {positive}")
    return out


def compare_groups(groups: Sequence[Group], baseline: Group | Baselines, metrics: Sequence[str],
                   samples: int = item_stats.BOOTSTRAP_SAMPLES, trials: int = item_stats.AR_TRIALS,
                   item_tests: bool = True, detect: dict[str, float] | None = None,
                   equivalence: dict[str, float] | None = None) -> list[Row]:
    """Every other group against ``baseline``, per metric (in the order asked for): the verdict
    over seeds (:func:`~nas_cli.report.stats.compare_seeds`, paired by seed; Welch's t when the
    groups share fewer than 2 seeds), Holm-adjusted over the groups; and, for the test metrics
    with per-item outputs, each paired seed's two runs compared on the test items (question b)."""
    if isinstance(baseline, Group):
        baseline = Baselines([(g, baseline) for g in groups if g is not baseline], [baseline], [], [])
    if not baseline.pairs:
        raise CompareError("--baseline: there is no other group to compare with it")
    involved = [r for g in {id(g): g for pair in baseline.pairs for g in pair}.values() for r in g.runs]
    item_metrics = [m for m in metrics if m in item_stats.METRICS] if item_tests else []
    items = _checked_items(involved, item_metrics) if item_metrics else {}
    cache: dict[tuple[int, str], object] = {}
    rows: list[Row] = []
    for m in metrics:
        found = []
        somewhere = any(_value_or_none(m, r) is not None for r in involved)
        for g, base in baseline.pairs:
            if somewhere and _other_evaluation(m, g, base):
                continue
            why = _undefined(m, g.runs) or _undefined(m, base.runs)
            if why:  # no value by design (a linear kernel's signed weights have no JSD): said, not refused
                nan = math.nan
                c = stats.Comparison(m, [], nan, nan, nan, nan, nan, nan, "none", n_base=base.n, n_sys=g.n,
                                     undefined=why)
                found.append(Row(g, c, higher_is_better(m), base))
                continue
            c = _over_seeds(m, base, g)
            c.detect = (detect or {}).get(m)
            if m in item_metrics:
                c.items = _item_level(m, _pairs(base, g), items, cache, samples, trials)
            found.append(Row(g, c, higher_is_better(m), base))
        rows.extend(holm(found))
        if m in (equivalence or {}):  # TOST at the margin, Holm over the same groups
            from nas_cli.report.equivalence import attach

            attach([r.comparison for r in found], equivalence[m])
    return holm_over_evaluations(holm_over_buckets(rows))


def _other_evaluation(metric: str, group: Group, base: Group) -> bool:
    """A pair that cannot have ``metric`` because it belongs to another evaluation: neither group has a value of
    it at all, or one has none and one group is a nas-eval result (the zero-shot scores of ``eval:lm_eval`` are
    not the trained runs', the trained runs' test perplexity not the zero-shot result's). Not compared. Asked only
    of a metric some run has: one no run has is refused by :func:`_values`, naming a run."""
    absent = [all(_value_or_none(metric, r) is None for r in runs) for runs in (group.runs, base.runs)]
    return all(absent) or (any(absent) and any(r.variant is not None for r in (*group.runs, *base.runs)))


def _value_or_none(metric: str, run: Run) -> float | None:
    try:
        return run.value(metric)
    except KeyError:
        return None


def _undefined(metric: str, runs: Sequence[Run]) -> str | None:
    """Why ``metric`` has no value for any of ``runs`` by design, else None: a diagnostic that the
    runs' schemes' weights do not meet what it needs (a distribution over keys: Tsai et al.'s linear
    kernel and differential attention have negative weights; sigmoid attention's rows do not sum
    to 1), as each run's diagnostics/summary.json records it (``not_applicable``, by location)."""
    if not runs or not is_run_metric(metric, runs):
        return None
    base, _, where = metric_name(metric).partition(":")
    reasons = []
    for run in runs:
        try:
            if run.value(metric) is not None:
                return None
        except KeyError:
            return None
        locs = {loc: v for loc, v in run.diag_locations().items() if not where or loc == where}
        why = [(v.get("not_applicable") or {}).get(base) or (SIGNED_NOTE if v.get("note") == SIGNED_NOTE else None)
               for v in locs.values()]
        if not why or not any(why):
            return None
        reasons.extend(w for w in why if w)
    what = ("attention weights with negative entries" if SIGNED_NOTE in reasons
            else "attention weights whose rows do not sum to 1")
    return f"{metric_name(metric)} is undefined for these runs ({what}, not distributions over keys)"


def _values(metric: str, runs: Sequence[Run]) -> list[float]:
    out = []
    for run in runs:
        try:
            v = run.value(metric)
        except KeyError:
            v = None
        if v is None:
            what = ("attention diagnostics off, or no such location/key" if is_run_metric(metric, runs)
                    else "its task does not report it")
            raise CompareError(f"--metrics {metric_name(metric)}: run {run.path} has no such value ({what}); "
                               "compare runs that have it")
        out.append(v)
    return out


def _over_seeds(metric: str, baseline: Group, group: Group) -> stats.Comparison:
    """Question (a): the runs' own numbers, paired by seed where the groups share 2 or more seeds."""
    pairs = _pairs(baseline, group)
    if len(pairs) >= stats.MIN_SEEDS or (pairs and (baseline.n < 2 or group.n < 2)):
        values = _values(metric, [r for pair in pairs for r in pair])
        c = stats.compare_seeds(metric, values[0::2], values[1::2], [s.seed for _, s in pairs])
    else:
        c = stats.compare_unpaired(metric, _values(metric, baseline.runs), _values(metric, group.runs), group.seeds)
    if baseline.selection is not None or group.selection is not None:  # chosen on these seeds: the winner's curse
        from nas_cli.report.selection import correct

        correct(c, baseline.selection, group.selection)
    return c


def _item_level(metric: str, pairs, items, cache, samples: int, trials: int) -> list[item_stats.ItemComparison]:
    spec = item_stats.METRICS[metric]
    out = []
    for b, s in pairs:
        if items.get(id(b)) is None or items.get(id(s)) is None:
            continue
        got = []
        for run in (b, s):
            key = (id(run), metric)
            if key not in cache:
                try:
                    cache[key] = spec.stats(items[id(run)])
                except (KeyError, TypeError, ValueError):  # no decoded text (e.g. a language model)
                    cache[key] = None
            got.append(cache[key])
        if got[0] is None or got[1] is None or got[0].shape != got[1].shape:
            continue
        out.append(item_stats.compare_items(metric, got[0], got[1], seed=s.seed, samples=samples, trials=trials))
    return out


def _checked_items(involved: Sequence[Run], metrics: Sequence[str]) -> dict[int, dict]:
    """Every run's per-item test outputs (None where a run has none: it gets no test-set
    detail); refused with one line when runs were tested on different test sets."""
    items = {id(r): load_items(r) for r in involved}
    prints: dict = {}  # per evaluation: the trained runs' test set, each nas-eval result's own items
    for r in involved:
        if items[id(r)] is not None:
            prints.setdefault(r.variant, {}).setdefault(items[id(r)].get("refs_sha256"), []).append(str(r.path))
    for found in prints.values():
        if len(found) > 1:
            a, b = list(found.values())[:2]
            raise CompareError(f"runs were tested on different test sets or references: {a[0]} and {b[0]} "
                               "(reference fingerprints differ); compare runs of one test set")
    return items


def without_items(rows: Sequence[Row], groups: Sequence[Group]) -> list[str]:
    """Runs that got no test-set detail (no test_items.json: made before nas-run wrote them, or
    run_test=false)."""
    runs = [r for g in groups for r in g.runs]  # whether the file is there (compare_groups has read them)
    missing = [str(r.path) for r in runs if not (r.items_path or Path(r.path) / ITEMS_FILE).is_file()]
    return missing if any(r.comparison.metric in item_stats.METRICS for r in rows) else []


def _pairs(baseline: Group, group: Group) -> list:
    base_by_seed = {r.seed: r for r in baseline.runs if r.seed is not None}
    return [(base_by_seed[r.seed], r) for r in sorted(group.runs, key=lambda r: r.seed or 0)
            if r.seed in base_by_seed]
