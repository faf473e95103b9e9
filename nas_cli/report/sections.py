"""nas-report's sections: the tables it prints and writes (runs, verdicts over seeds, the test-set
detail, a seed=auto sweep's decisions, runs without results), each as ``(key, title, head, rows,
caption, records)``, and the notes printed under them. ``args`` are nas-report's parsed options."""
from __future__ import annotations

from typing import Sequence

from nas_cli.errors import UserError


def wanted_metrics(args) -> list[str] | None:
    """--metrics as a list of names; None: every metric."""
    return [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None


def _test_titles(runs) -> set[str]:
    from tasks.scores import present

    return {m.title for m in present(k for r in runs for k in ((r.summary or {}).get("test") or {}))}


def runs_section(args, runs, groups, by, metrics, verdicts, marked) -> list[tuple]:
    """The main table: one row per group (only the asked-for test metrics with --metrics; spread
    over one field with --pivot)."""
    from tasks.scores import spec
    from nas_cli.report.formats import group_records, pivot
    from nas_cli.report.table import marks_legend, table_rows

    if not groups:
        return []
    head, rows = table_rows(groups)
    rows = _mark(head, rows, groups, marked, verdicts[2] if verdicts else None)
    if wanted_metrics(args):
        keep_titles = {spec(k).title for k in metrics if k.startswith("test/")}
        metric_titles = _test_titles(runs)
        idx = [i for i, h in enumerate(head) if h not in metric_titles or h in keep_titles]
        head, rows = [head[i] for i in idx], [[r[i] for i in idx] for r in rows]
    legend = marks_legend(groups)  # diagnostics computed on a derived quantity, or undefined for the weights
    caption = _caption(groups, by) + ("; †: differs from the baseline over seeds (p < 0.05, Holm)"
                                      if verdicts else "") + (f"; {legend}" if legend else "")
    if args.pivot:
        values = [h for h in head if h in _test_titles(runs)]
        if args.pivot not in head:
            raise UserError(f"--pivot {args.pivot}: not a column of this table; use one of "
                        f"{', '.join(h for h in head if h in ('task', 'scheme', 'heads', 'config'))}")
        head, rows = pivot(head, rows, args.pivot, values, ["task", "scheme", "heads", "config"])
    return [("runs", args.title, head, rows, caption, group_records(groups))]


def tuning_section(tuning, verdicts) -> list[tuple]:
    """A tuned comparison's choices: every cell's grid with its validation values per seed, the chosen
    value, the margin to the runner-up and the warnings (nas_cli.report.tuning)."""
    from nas_cli.report.tuning import table

    if tuning is None:
        return []
    head, rows, records = table(tuning, baseline_of(verdicts[2] if verdicts else None))
    title = f"tuning ({tuning.protocol}): each cell's {', '.join(tuning.keys)}, chosen by validation"
    return [("tuning", title, head, rows, tuning.describe(), records)]


def baseline_of(baseline) -> dict:
    """{id of a tuned system's chosen group: its baseline group} (the tuning warnings)."""
    if baseline is None:
        return {}
    return {id(system.origin): base for system, base in baseline.pairs if system.origin is not None}


def verdict_sections(verdicts, compared) -> list[tuple]:
    """The verdicts over seeds and, as supporting detail, each paired seed's test-set comparison."""
    from nas_cli.report.verdicts import ITEM_NOTE, item_records, item_table, verdict_records

    if not verdicts:
        return []
    (vh, vr), note, baseline = verdicts
    out = [("comparison", f"across seeds (the verdict): against the baseline {baseline.label}", vh, vr,
            note, verdict_records(compared))]
    ih, ir = item_table(compared)
    if ir:
        out.append(("test_set", f"on this test set, per trained model (supporting detail): against "
                    f"{baseline.label}", ih, ir, ITEM_NOTE, item_records(compared)))
    return out


def unfinished_section(runs) -> list[tuple]:
    """Failed and unfinished runs: listed in every format, never dropped silently."""
    from nas_cli.report.table import unfinished_rows

    head, rows = unfinished_rows(runs)
    if not rows:
        return []
    failed = sum(row[1].startswith("failed") for row in rows)
    title = f"runs without results: {failed} failed, {len(rows) - failed} unfinished (no summary.json)"
    return [("unfinished", title, head, rows, "", [dict(zip(head, r)) for r in rows])]


def notes(groups, compared, baseline=None, paths: Sequence[str] = (), tuning=None) -> list[str]:
    """One line each: PATHs given twice (or one inside another), systems without a baseline at their
    settings, verdicts that lean on the t-test's assumption, replicates counted once, runs without
    per-item outputs, a tuned comparison's warnings."""
    from nas_cli.report.collect import overlapping_paths
    from nas_cli.report.table import code_versions_note

    out = []
    for path, earlier, how in overlapping_paths(paths):
        out.append({"same": f"{path} is given twice (the same folder as {earlier}): its runs are counted once",
                    "inside": f"{path} lies inside {earlier}, given before it: its runs are counted once, "
                              f"under {earlier}",
                    "contains": f"{path} contains {earlier}, given before it: the runs of {earlier} are counted "
                                f"once, under {earlier}"}[how])
    versions = code_versions_note([r for g in groups for r in g.runs])
    if versions:
        out.append(versions)
    if baseline is not None and baseline.unmatched:
        out.append(f"no baseline at the same {', '.join(baseline.matched_on)} for "
                   f"{'; '.join(g.label for g in baseline.unmatched)}: not compared")
    if compared:
        from nas_cli.report.verdicts import cautions

        out += cautions(compared)
    repeats = [pair for g in groups for pair in g.repeats]
    if repeats:
        listed = "; ".join(f"{dup.path} repeats {kept.path}" for dup, kept in repeats[:3])
        more = f" and {len(repeats) - 3} more" if len(repeats) > 3 else ""
        out.append(f"{len(repeats)} run(s) repeat the config and seed of another run and are counted once, as one "
                   f"seed ({listed}{more})")
    if compared:
        from nas_cli.report.compare import without_items

        missing = without_items(compared, groups)
        if missing:
            out.append(f"{len(missing)} run(s) have no per-item test outputs (test_items.json), so no test-set detail: "
                       f"{', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    if tuning is not None:
        from nas_cli.report.tuning import notes as tuning_notes

        out += tuning_notes(tuning, baseline_of(baseline))
    return out


def _mark(head, rows, groups, marked, baseline):
    """† after the metric cells that differ significantly from the baseline; the baselines' rows say so."""
    from nas_cli.report.compare import metric_title

    runs = [r for g in groups for r in g.runs]
    out = []
    for g, row in zip(groups, rows):
        row = list(row)
        for (gid, metric), sig in marked.items():
            title = metric_title(metric, runs)
            if gid == id(g) and sig and title in head:
                row[head.index(title)] += " †"
        if baseline is not None and any(g is b or g is b.origin for b in baseline.groups) and "scheme" in head:
            row[head.index("scheme")] += " (baseline)"
        out.append(row)
    return out


def _caption(groups, by) -> str:
    grouping = "runs that differ only by seed" if by is None else f"runs with equal {', '.join(by)}"
    return (f"mean ± 95% CI (Student t) over {grouping}; n = 1: no interval" if any(g.n > 1 for g in groups)
            else "one run per row (no interval: n = 1)")
