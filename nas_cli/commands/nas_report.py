"""``nas-report PATH [PATH ...] [--html OUT] [--group-by FIELDS]``: compare finished runs.

Reads every run directory at or below the PATHs (single runs, sweep directories, or a
whole ``outputs/``), prints one rich table and optionally writes a self-contained HTML
report. Runs that differ only by ``seed`` share a row (mean ± std, n runs); directories
without ``summary.json`` are listed as unfinished. Bad input (a missing path, no runs)
prints one line on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nas-report", description=__doc__.split("\n\n")[0].split(": ", 1)[-1],
        epilog="examples: nas-report outputs/sweeps/2024-05-01_12-00-00-000000 --html report.html\n"
               "          nas-report outputs --group-by task,scheme,heads",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="run or sweep directories (searched recursively)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report to OUT")
    p.add_argument("--group-by", metavar="FIELDS", default=None,
                   help="comma-separated fields whose equal values share a row: task, scheme, heads, model, "
                        "d_model, steps, placement.<location> or dotted config keys (attention.u_init); "
                        "'run' = one row per run. Default: runs that differ only by seed share a row")
    p.add_argument("--title", default="nas-report", help="title of the table and the HTML page")
    p.add_argument("--baseline", metavar="SELECTOR",
                   help="compare every other group with this one (field=value[,...], e.g. scheme=unas or "
                        "placement.encoder=unas,heads=4): difference with 95%% CI, paired significance test on the "
                        "test set, Holm-adjusted, and a verdict")
    p.add_argument("--metrics", metavar="NAMES", help="comma-separated metrics to compare/show: test metrics (bleu, "
                                                       "chrf, exact_match, ppl, rouge1, rouge2, rougeL; paired on the "
                                                       "test set) and attention diagnostics (jsd, explained_away, "
                                                       "min_margin, entropy, step_variation, also as jsd:encoder; "
                                                       "paired t-test over seeds)")
    p.add_argument("--format", default="rich", metavar="FMT", help="rich (default), markdown, latex, csv or json")
    p.add_argument("--pivot", metavar="FIELD", help="spread the values of FIELD (scheme, heads, task) into columns, "
                                                     "one table cell per metric: mean ± CI (†: differs from the "
                                                     "baseline, p < 0.05 after Holm)")
    p.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default 1000; AR trials: 10x)")
    return p


def _fail(msg: str) -> int:
    print(f"nas-report: error: {msg}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rich.console import Console
    from rich.table import Table


    from ..report.collect import TEST_METRICS, find_runs
    from ..report.table import BadField, group_runs, rich_table, unfinished_rows

    try:
        runs = find_runs(args.paths)
    except FileNotFoundError as err:
        return _fail(str(err))
    if not runs:
        return _fail(f"no nas-run runs (directories with summary.json or .hydra/config.yaml) under "
                     f"{', '.join(args.paths)}")
    by = None if args.group_by is None else [f.strip() for f in args.group_by.split(",")]
    try:
        groups = group_runs(runs, by)
    except BadField as err:
        return _fail(str(err))

    console = Console() if sys.stdout.isatty() else Console(width=200)
    from ..report.compare import CompareError, compare_groups, method_note, metrics_for, select_baseline, verdict_table
    from ..report.formats import FORMATS, pivot, render
    from ..report.table import table_rows

    if args.format not in FORMATS:
        return _fail(f"--format {args.format}: unknown; use one of {', '.join(FORMATS)}")
    wanted = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    verdicts, marked = None, {}
    try:
        metrics = metrics_for(groups, wanted) if (args.baseline or wanted) else []
        if args.baseline:
            baseline = select_baseline(groups, args.baseline)
            compared = compare_groups(groups, baseline, metrics, samples=max(10, args.samples),
                                      trials=10 * max(10, args.samples))
            verdicts = (verdict_table(compared, baseline), method_note(compared), baseline)
            marked = {(id(r.group), r.comparison.metric): r.comparison.direction() != 0 for r in compared}
    except CompareError as err:
        return _fail(str(err))

    if groups:
        head, rows = table_rows(groups)
        rows = _mark(head, rows, groups, marked, verdicts[2] if verdicts else None)
        if wanted:
            keep_titles = {t for k, t, _ in TEST_METRICS if k in metrics}
            metric_titles = {t for _, t, _ in TEST_METRICS}
            idx = [i for i, h in enumerate(head) if h not in metric_titles or h in keep_titles]
            head, rows = [head[i] for i in idx], [[r[i] for i in idx] for r in rows]
        caption = _caption(groups, by) + ("; †: differs from the baseline (p < 0.05, Holm)" if verdicts else "")
        if args.pivot:
            values = [h for h in head if h in {t for _, t, _ in TEST_METRICS}]
            if args.pivot not in head:
                return _fail(f"--pivot {args.pivot}: not a column of this table; use one of "
                             f"{', '.join(h for h in head if h in ('task', 'scheme', 'heads', 'config'))}")
            head, rows = pivot(head, rows, args.pivot, values, ["task", "scheme", "heads", "config"])
        if args.format == "rich" and not args.pivot:
            console.print(rich_table(groups, args.title, by, rows=(head, rows), caption=caption))
        elif args.format == "rich":
            console.print(_rich(args.title, head, rows, caption))
        else:
            sys.stdout.write(render(args.format, args.title, head, rows, caption))
    if verdicts:
        (vh, vr), note, baseline = verdicts
        title = f"against the baseline {baseline.label}"
        if args.format == "rich":
            console.print(_rich(title, vh, vr, note))
        else:
            sys.stdout.write(render(args.format, title, vh, vr, note))
    head, rows = unfinished_rows(runs)
    if rows:  # failed and unfinished runs are listed in every format, never dropped silently
        failed = sum(row[1].startswith("failed") for row in rows)
        title = f"runs without results: {failed} failed, {len(rows) - failed} unfinished (no summary.json)"
        if args.format == "rich":
            t = Table(title=title)
            for h in head:
                t.add_column(h)
            for row in rows:
                t.add_row(*row)
            console.print(t)
        else:
            sys.stdout.write(render(args.format, title, head, rows))
    if args.html:
        from ..report.html import write_html

        try:
            path = write_html(args.html, runs, groups, args.paths, title=args.title, by=by,
                              verdicts=verdicts[:2] if verdicts else None)
        except OSError as err:
            return _fail(f"cannot write {args.html}: {err.strerror or err}")
        console.print(f"HTML report: {path}")
    return 0


def _mark(head, rows, groups, marked, baseline):
    """† after the metric cells that differ significantly from the baseline; the baseline's row says so."""
    from ..report.compare import metric_title

    out = []
    for g, row in zip(groups, rows):
        row = list(row)
        for (gid, metric), sig in marked.items():
            if gid == id(g) and sig and metric_title(metric) in head:
                row[head.index(metric_title(metric))] += " †"
        if baseline is not None and g is baseline and "scheme" in head:
            row[head.index("scheme")] += " (baseline)"
        out.append(row)
    return out


def _caption(groups, by) -> str:
    grouping = "runs that differ only by seed" if by is None else f"runs with equal {', '.join(by)}"
    return (f"mean ± 95% CI (Student t) over {grouping}; n = 1: no interval" if any(g.n > 1 for g in groups)
            else "one run per row (no interval: n = 1)")


def _rich(title, head, rows, caption):
    from rich.table import Table

    t = Table(title=title, caption=caption, caption_justify="left")
    for h in head:
        t.add_column(h)
    for r in rows:
        t.add_row(*r)
    return t


if __name__ == "__main__":
    raise SystemExit(main())
