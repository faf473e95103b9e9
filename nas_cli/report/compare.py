"""``nas-report --baseline SELECTOR``: every other group against one baseline group.

A selector is ``field=value[,field=value...]`` over the grouping fields of
:func:`~nas_cli.report.table.field_value` (``scheme=unas``, ``placement.encoder=unas,heads=4``);
it must match exactly one group. Two questions, answered separately (:mod:`nas_cli.report.stats`):

(a) **across seeds**, the verdict: each run's own number (the test metrics of summary.json, or a
    run-level diagnostic: ``jsd``, ``explained_away``, ``min_margin``, ``entropy``,
    ``step_variation``, each also as ``<name>:<location>``, or any ``diag:<key>[:<location>]``),
    paired by seed, Holm-adjusted over the groups per metric;
(b) **on this test set, per trained model**: for each paired seed, the two runs' per-item test
    outputs (``test_items.json``) compared item by item: supporting detail, never the verdict.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..diagnostics.metrics import SIGNED_NOTE
from . import stats
from .collect import Run
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
    from ..metrics import spec

    return spec(metric).title if metric.startswith("test/") else RUN_METRICS.get(metric)


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


@dataclass
class Baselines:
    """What ``--baseline SELECTOR`` chose: each system group with its baseline group. A selector
    that matches one group: every other group against it. One that matches several (``scheme=unas``
    on a grid over heads): each group against the baseline at the same values of every field on
    which the baselines differ (``matched_on``, e.g. model.heads), which is the pairing of
    ``seed=auto`` (nas_cli.sequential_design.pair_up)."""

    pairs: list[tuple[Group, Group]]  # (system, its baseline)
    groups: list[Group]  # the baseline groups
    matched_on: list[str]
    unmatched: list[Group]  # systems with no baseline at their values of matched_on

    @property
    def label(self) -> str:
        if len(self.groups) == 1:
            return self.groups[0].label
        return f"{' / '.join(g.label for g in self.groups)} (each at the same {', '.join(self.matched_on)})"


def coordinates(group: Group) -> dict[str, str]:
    """The values that place a group in a grid: the run fields, its --group-by fields and, for the
    default grouping, every config key of its setup."""
    run = group.runs[0]
    out = {"task": run.task, "scheme": run.scheme, "heads": run.heads,
           **{f"placement.{k}": v for k, v in run.placement.items()}, **group.fields}
    if group.key and group.key[0] == "config":
        out.update(dict(group.key[2]))
    return {k: repr(v) for k, v in out.items()}


def select_baselines(groups: Sequence[Group], text: str) -> Baselines:
    """The baseline group(s) of ``text`` and each other group's own (see :class:`Baselines`)."""
    selector = parse_selector(text)
    found = [g for g in groups if _matches(g, selector)]
    if len(found) > 1 and "variant" not in selector:  # the trained runs, not their nas-eval results
        found = [g for g in found if all(r.variant is None for r in g.runs)] or found
    if not found:
        labels = "; ".join(g.label for g in groups)
        raise CompareError(f"--baseline {text}: no group matches; the groups are: {labels}")
    others = [g for g in groups if all(g is not b for b in found)]
    if len(found) == 1:
        return Baselines([(g, found[0]) for g in others], found, [], [])
    coords = {id(g): coordinates(g) for g in groups}
    keys = [*dict.fromkeys(k for b in found for k in coords[id(b)] if k not in selector)]
    varying, partitions = [], set()
    for k in keys:  # run fields first: 'heads', not also the config key 'model.heads' that says the same
        values = [coords[id(b)].get(k) for b in found]
        partition = tuple(values.index(v) for v in values)
        if len(set(values)) > 1 and partition not in partitions:
            varying.append(k)
            partitions.add(partition)
    index: dict[tuple, Group] = {}
    for b in found:
        key = tuple(coords[id(b)].get(k) for k in varying)
        if key in index:
            raise CompareError(f"--baseline {text}: {index[key].label} and {b.label} match it with the same "
                               "settings; add fields to the selector (e.g. scheme=unas,model=tiny) or --group-by")
        index[key] = b
    pairs, unmatched = [], []
    for g in others:
        b = index.get(tuple(coords[id(g)].get(k) for k in varying))
        (pairs.append((g, b)) if b is not None else unmatched.append(g))
    if not pairs:
        raise CompareError(f"--baseline {text}: no other group shares a baseline's {', '.join(varying)}; the "
                           f"baselines are {'; '.join(b.label for b in found)}")
    return Baselines(pairs, found, varying, unmatched)


def select_baseline(groups: Sequence[Group], text: str) -> Group:
    """The one group ``text`` selects (refused, naming them, when it selects several)."""
    chosen = select_baselines(groups, text)
    if len(chosen.groups) > 1:
        raise CompareError(f"--baseline {text}: {len(chosen.groups)} groups match "
                           f"({'; '.join(g.label for g in chosen.groups)}); add fields to the selector, "
                           "e.g. scheme=unas,heads=4")
    return chosen.groups[0]


def load_items(run: Run) -> dict | None:
    path = run.items_path or Path(run.path) / ITEMS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def metrics_for(groups: Sequence[Group], wanted: Sequence[str] | None) -> list[str]:
    """The metrics to compare: ``--metrics`` (test metrics as in summary.json, with or without
    ``test/``, and run-level diagnostics, see :data:`RUN_METRICS`) or every test metric the runs
    report (the table's columns)."""
    runs = [r for g in groups for r in g.runs]
    reported = {k for r in runs for k in ((r.summary or {}).get("test") or {})}
    if wanted:
        names = [w if w.startswith("test/") or is_run_metric(w) else f"test/{w}" for w in wanted]
        unknown = [n for n in names if not is_run_metric(n) and n not in stats.METRICS and n not in reported]
        if unknown:
            tests = sorted(m.split("/", 1)[1] for m in reported | set(stats.METRICS))
            close = difflib.get_close_matches(unknown[0].split("/", 1)[1], [*tests, *RUN_METRICS], n=1, cutoff=0.6)
            raise CompareError(f"--metrics {','.join(u.split('/', 1)[1] for u in unknown)}: no run reports it"
                               + (f" (did you mean {close[0]}?)" if close else "")
                               + f"; choose from {', '.join(tests)} (test set) or {', '.join(RUN_METRICS)} "
                               "(attention diagnostics; also <name>:<location> and diag:<key>)")
        return names
    from ..metrics import present

    return [m.key for m in present(reported) if m.compared and any(r.value(m.key) is not None for r in runs)]


def higher_is_better(metric: str) -> bool | None:
    """True/False for the test metrics with a better direction; None for the diagnostics."""
    from ..metrics import spec

    return spec(metric).higher_is_better if metric.startswith("test/") else None


@dataclass
class Row:
    group: Group
    comparison: stats.Comparison
    higher_is_better: bool | None  # None: a number with no better direction (the diagnostics)
    baseline: Group | None = None  # the group it is compared with


def parse_detect(text: str | None, metrics: Sequence[str]) -> dict[str, float]:
    """``--detect 0.5`` (every metric) or ``--detect bleu=1,ppl=0.2``: the differences to plan for."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = part.rpartition("=")
        try:
            delta = float(value)
        except ValueError:
            raise CompareError(f"--detect {text}: expected a number (0.5) or metric=number[,...] (bleu=1,ppl=0.2)")
        if not eq:
            out.update({m: delta for m in metrics})
            continue
        key = name if name.startswith("test/") or is_run_metric(name) else f"test/{name}"
        if key not in metrics:
            raise CompareError(f"--detect {name}: not among the compared metrics "
                               f"({', '.join(metric_name(m) for m in metrics)})")
        out[key] = delta
    if any(not (d > 0) for d in out.values()):
        raise CompareError(f"--detect {text}: a difference to detect must be positive")
    return out


def compare_groups(groups: Sequence[Group], baseline: Group | Baselines, metrics: Sequence[str],
                   samples: int = stats.BOOTSTRAP_SAMPLES, trials: int = stats.AR_TRIALS,
                   item_tests: bool = True, detect: dict[str, float] | None = None) -> list[Row]:
    """Every other group against ``baseline``, per metric (in the order asked for): the verdict
    over seeds (:func:`~nas_cli.report.stats.compare_seeds`, paired by seed; Welch's t when the
    groups share fewer than 2 seeds), Holm-adjusted over the groups; and, for the test metrics
    with per-item outputs, each paired seed's two runs compared on the test items (question b)."""
    if isinstance(baseline, Group):
        baseline = Baselines([(g, baseline) for g in groups if g is not baseline], [baseline], [], [])
    if not baseline.pairs:
        raise CompareError("--baseline: there is no other group to compare with it")
    involved = [r for g in {id(g): g for pair in baseline.pairs for g in pair}.values() for r in g.runs]
    item_metrics = [m for m in metrics if m in stats.METRICS] if item_tests else []
    items = _checked_items(involved, item_metrics) if item_metrics else {}
    cache: dict[tuple[int, str], object] = {}
    rows: list[Row] = []
    for m in metrics:
        found = []
        for g, base in baseline.pairs:
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
        rows.extend(_holm(found))
    return rows


def _undefined(metric: str, runs: Sequence[Run]) -> str | None:
    """Why ``metric`` has no value for any of ``runs`` by design, else None: a head-diversity or
    column-mass diagnostic of runs whose attention weights have negative entries (Tsai et al.'s
    linear kernel), which is not a distribution over keys."""
    if not runs or not is_run_metric(metric):
        return None
    for run in runs:
        try:
            if run.value(metric) is not None:
                return None
        except KeyError:
            return None
        if not any(loc.get("note") == SIGNED_NOTE for loc in run.diag_locations().values()):
            return None
    return (f"{metric_name(metric)} is undefined for these runs (attention weights with negative entries, "
            "not distributions over keys)")


def _values(metric: str, runs: Sequence[Run]) -> list[float]:
    out = []
    for run in runs:
        try:
            v = run.value(metric)
        except KeyError:
            v = None
        if v is None:
            what = ("attention diagnostics off, or no such location/key" if is_run_metric(metric)
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
        return stats.compare_seeds(metric, values[0::2], values[1::2], [s.seed for _, s in pairs])
    return stats.compare_unpaired(metric, _values(metric, baseline.runs), _values(metric, group.runs),
                                  group.seeds)


def _item_level(metric: str, pairs, items, cache, samples: int, trials: int) -> list[stats.ItemComparison]:
    spec = stats.METRICS[metric]
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
        out.append(stats.compare_items(metric, got[0], got[1], seed=s.seed, samples=samples, trials=trials))
    return out


def _holm(found: list[Row]) -> list[Row]:
    """Holm-adjust one metric's p-values over the groups compared with the baseline."""
    for row, p in zip(found, stats.holm([r.comparison.p for r in found])):
        row.comparison.p_adj = p
    return found


def _checked_items(involved: Sequence[Run], metrics: Sequence[str]) -> dict[int, dict]:
    """Every run's per-item test outputs (None where a run has none: it gets no test-set
    detail); refused with one line when runs were tested on different test sets."""
    items = {id(r): load_items(r) for r in involved}
    prints = {}
    for r in involved:
        if items[id(r)] is not None:
            prints.setdefault(items[id(r)].get("refs_sha256"), []).append(str(r.path))
    if len(prints) > 1:
        a, b = list(prints.values())[:2]
        raise CompareError(f"runs were tested on different test sets or references: {a[0]} and {b[0]} (reference "
                           "fingerprints differ); compare runs of one test set")
    return items


def without_items(rows: Sequence[Row], groups: Sequence[Group]) -> list[str]:
    """Runs that got no test-set detail (no test_items.json: made before nas-run wrote them, or
    run_test=false)."""
    runs = [r for g in groups for r in g.runs]  # whether the file is there (compare_groups has read them)
    missing = [str(r.path) for r in runs if not (r.items_path or Path(r.path) / ITEMS_FILE).is_file()]
    return missing if any(r.comparison.metric in stats.METRICS for r in rows) else []


def _pairs(baseline: Group, group: Group) -> list:
    base_by_seed = {r.seed: r for r in baseline.runs if r.seed is not None}
    return [(base_by_seed[r.seed], r) for r in sorted(group.runs, key=lambda r: r.seed or 0)
            if r.seed in base_by_seed]


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


def verdict_table(rows: Sequence[Row], baseline: Group | Baselines | None = None) -> tuple[list[str], list[list[str]]]:
    """Question (a), one row per system and metric: the verdict over seeds (with the baseline
    group's label beside the system where the systems have different baselines)."""
    planning = any(r.comparison.detect for r in rows)
    several = _several(rows)
    head = ["system", *(["against"] if several else []), "metric", "seeds", "baseline", "system mean",
            "difference [95% CI]", "p", "p (Holm)", "verdict", "detectable (80%)"] + (["seeds for ±detect"] if planning else [])
    out = []
    for r in rows:
        c = r.comparison
        if c.undefined:  # no numbers by design: the verdict column says why
            out.append([*_system(r, several), metric_name(c.metric), *["-"] * 6, c.verdict(r.higher_is_better), "-"]
                       + (["-"] if planning else []))
            continue
        det = c.detectable()
        row = [*_system(r, several), metric_name(c.metric), _seeds(c), _num(c.base_mean), _num(c.sys_mean),
               f"{c.diff:+.3g} " + _ci(c.low, c.high), "-" if math.isnan(c.p) else stats._p(c.p),
               stats._p(c.p_adj) if c.p_adj is not None and not math.isnan(c.p_adj) else "-",
               c.verdict(r.higher_is_better), "-" if math.isnan(det) else f"±{det:.3g}"]
        if planning:
            need = c.needed()
            row.append("-" if c.detect is None else f"±{c.detect:g}: " + ("?" if need is None else str(need)))
        out.append(row)
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
                    "p_signflip": c.signflip_p})
    return out


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
            + f"; Holm-adjusted over the groups compared with the baseline, per metric. A verdict needs at least "
            f"{stats.MIN_SEEDS} seeds in both groups"
            + ("; below 6 seeds it rests on the t-test's assumption of roughly normal seed-level differences "
               "(no distribution-free test over fewer than 6 seeds can reach p < 0.05)" if small < 6 else "")
            + ". detectable (80%): the smallest true difference this many seeds detect with 80% power at the "
            "observed spread (an estimate from few seeds: treat it as rough).")


ITEM_NOTE = ("On this test set, per trained model (supporting detail, not a verdict over seeds): each paired seed's "
             "two runs compared on the same test items. 95% CI: paired bootstrap over the items; p: approximate "
             "randomization with ties counted (exact when at most 16 items differ) for BLEU, chrF, perplexity and "
             "ROUGE, McNemar's exact test for exact match. These say whether one trained model beats another on "
             "these sentences, nothing about another seed.")
