"""``nas-report PATH [PATH ...] [--html OUT] [--group-by FIELDS]``: compare finished runs.

Reads every run directory at or below the PATHs (single runs, sweep directories, or a
whole ``outputs/``), prints one rich table and optionally writes a self-contained HTML
report. Runs that differ only by ``seed`` share a row (mean ± std, n runs); directories
without ``summary.json`` are listed as unfinished. Bad input (a missing path, no runs)
prints one line on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import sys
from typing import Sequence

from nas_cli.errors import OneLineParser

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="nas-report", description=__doc__.split("\n\n")[0].split(": ", 1)[-1],
        epilog="examples: nas-report outputs/sweeps/2024-05-01_12-00-00-000000 --html report.html\n"
               "          nas-report outputs --group-by task,scheme,heads",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="run or sweep directories (searched recursively)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report to OUT")
    p.add_argument("--group-by", metavar="FIELDS", default=None,
                   help="comma-separated fields whose equal values share a row: task, scheme, heads, model, "
                        "d_model, steps, source (the PATH a run was found under), placement.<location> or dotted "
                        "config keys (attention.u_init); 'run' = one row per run. Default: runs that differ only by seed share a row")
    p.add_argument("--title", default="nas-report", help="title of the table and the HTML page")
    p.add_argument("--baseline", metavar="SELECTOR",
                   help="compare every other group with the baseline (field=value[,...], e.g. scheme=unas or "
                        "placement.encoder=unas,heads=4); a selector that matches several groups (scheme=unas on a "
                        "grid over heads) compares each group with the baseline at the same values of every other "
                        "field (dnas h8 against unas h8), as seed=auto does: the verdict over seeds (paired t-test "
                        "on each run's number, 95%% CI, Holm-adjusted; none below 2 seeds), and each paired seed's "
                        "two runs compared on the test items as supporting detail")
    p.add_argument("--metrics", metavar="NAMES", help="comma-separated metrics to compare/show: test metrics (bleu, "
                                                       "chrf, exact_match, ppl, rouge1, rouge2, rougeL, or any test "
                                                       "metric a task reports) and the numbers the runs' "
                                                       "diagnostics declare (a wrong name lists them), also as "
                                                       "<name>:<location>; every verdict is a paired t-test over seeds")
    p.add_argument("--format", default="rich", metavar="FMT",
                   help="rich (default), markdown, latex, json (everything), or csv (one tidy table: the comparison "
                        "with --baseline, else the runs; --table picks another)")
    p.add_argument("--table", metavar="NAME", help="the table --format csv writes: runs, comparison, test_set, "
                                                   "sequential or unfinished")
    p.add_argument("--out", metavar="DIR", help="also write every table as its own tidy CSV file, DIR/<table>.csv "
                                                "(numbers in numeric columns: mean, ci_low, ci_high, sd, n; "
                                                "difference, p, p_holm, direction)")
    p.add_argument("--pivot", metavar="FIELD", help="spread the values of FIELD (scheme, heads, task) into columns, "
                                                     "one table cell per metric: mean ± CI (†: differs from the "
                                                     "baseline, p < 0.05 after Holm)")
    p.add_argument("--samples", type=int, default=1000, help="bootstrap resamples of the test items (default 1000; "
                                                              "approximate randomization: up to 10x as many trials)")
    p.add_argument("--detect", metavar="DELTA", help="plan seeds: how many seeds per scheme would detect a true "
                                                     "difference of DELTA (in the metric's units) with 80%% power, "
                                                     "at the spread observed so far; DELTA for every metric, or "
                                                     "metric=DELTA[,...] (bleu=0.5,ppl=0.2)")
    p.add_argument("--wandb", nargs="?", const="offline", choices=("offline", "online"), metavar="MODE",
                   help="also log this comparison as a W&B run (job type report) in the runs' W&B group: every "
                        "table (verdicts, per-seed detail, detectable differences), the figures and the HTML page; "
                        "offline (default: under PATH/nas-report/, for wandb sync) or online (the runs' project "
                        "and entity); running it again replaces that report run")
    p.add_argument("--no-item-tests", action="store_true", help="skip the per-seed comparisons on the test items "
                                                                "(question b); the verdicts over seeds are kept")
    return p


def _fail(msg: str) -> int:
    print(f"nas-report: error: {msg}", file=sys.stderr)
    return 2


class _Fail(Exception):
    """Bad input: one line on stderr, exit 2."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rich.console import Console

    from nas_cli.errors import UserError
    from nas_cli.report.compare import CompareError
    from nas_cli.report.formats import FORMATS
    from nas_cli.report.table import BadField

    try:
        if args.format not in FORMATS:
            raise _Fail(f"--format {args.format}: unknown; use one of {', '.join(FORMATS)}")
        _check_tables(args)
        runs, groups, by = _load(args)
        metrics, verdicts, marked, compared = _compare(args, groups)
        sections = [*_runs_section(args, runs, groups, by, metrics, verdicts, marked),
                    *_verdict_sections(verdicts, compared), *_sequential_sections(args.paths),
                    *_unfinished_section(runs)]
    except (_Fail, BadField, CompareError, UserError, FileNotFoundError) as err:
        return _fail(str(err))
    notes = _notes(groups, compared, verdicts[2] if verdicts else None)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        table = _csv_table(args, sections) if args.format == "csv" else None
        written = _write_out(args.out, sections) if args.out else []
    except (_Fail, OSError) as err:
        return _fail(str(err) if isinstance(err, _Fail) else f"cannot write --out {args.out}: {err.strerror or err}")
    _print(args, sections, notes, console, groups, by, verdicts, table)
    if written:
        (console.print if args.format == "rich" else lambda m: print(m, file=sys.stderr))(
            f"CSV tables: {', '.join(written)}")
    say = console.print if args.format == "rich" else (lambda m: print(m, file=sys.stderr))
    if args.html or args.wandb:
        from nas_cli.report.verdicts import ITEM_NOTE, item_table
        from nas_cli.report.html import render_html

        page = render_html(runs, groups, args.paths, title=args.title, by=by,
                           verdicts=verdicts[:2] if verdicts else None,
                           items=(item_table(compared), ITEM_NOTE) if compared else None, notes=notes)
    if args.html:
        from nas_cli.infra.atomic import atomic_write_text

        try:
            path = atomic_write_text(args.html, page)
        except OSError as err:
            return _fail(f"cannot write {args.html}: {err.strerror or err}")
        say(f"HTML report: {path}")
    if args.wandb:
        from nas_cli.report.wandb_report import log_report

        try:
            where = log_report(sections, notes, page, runs, groups, args.paths[0], args.wandb, args.title)
        except OSError as err:
            return _fail(f"--wandb: cannot write the W&B run under {args.paths[0]}: {err.strerror or err}")
        say(f"W&B report run: {where}" + (f" (upload: wandb sync {where})" if args.wandb == "offline" else ""))
    return 0


def _load(args):
    """The runs under the PATHs and their groups (rows)."""
    from nas_cli.report.collect import find_runs
    from nas_cli.report.table import group_runs

    runs = find_runs(args.paths)
    if not runs:
        raise _Fail(f"no nas-run runs (directories with summary.json or .hydra/config.yaml) under "
                    f"{', '.join(args.paths)}")
    by = None if args.group_by is None else [f.strip() for f in args.group_by.split(",")]
    return runs, group_runs(runs, by), by


def _compare(args, groups):
    """The metrics asked for and, with --baseline, every group against it: (metrics, (verdict
    table, method note, baseline) or None, {(group, metric): significant}, the comparison rows)."""
    from nas_cli.report.compare import CompareError, compare_groups, metrics_for, parse_detect, select_baselines
    from nas_cli.report.verdicts import method_note, verdict_table

    wanted = _wanted(args)
    metrics = metrics_for(groups, wanted) if (args.baseline or wanted) else []
    if args.detect and not args.baseline:
        raise CompareError("--detect plans seeds for a comparison: add --baseline, e.g. --baseline scheme=unas")
    if not args.baseline:
        return metrics, None, {}, []
    baseline = select_baselines(groups, args.baseline)
    detect = parse_detect(args.detect, metrics)
    compared = compare_groups(groups, baseline, metrics, samples=max(10, args.samples),
                              trials=10 * max(10, args.samples), item_tests=not args.no_item_tests, detect=detect)
    verdicts = (verdict_table(compared), method_note(compared), baseline)
    marked = {(id(r.group), r.comparison.metric): r.comparison.direction() != 0 for r in compared}
    return metrics, verdicts, marked, compared


def _wanted(args) -> list[str] | None:
    return [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None


def _test_titles(runs) -> set[str]:
    from tasks.scores import present

    return {m.title for m in present(k for r in runs for k in ((r.summary or {}).get("test") or {}))}


def _runs_section(args, runs, groups, by, metrics, verdicts, marked) -> list[tuple]:
    """The main table: one row per group (only the asked-for test metrics with --metrics; spread
    over one field with --pivot)."""
    from tasks.scores import spec
    from nas_cli.report.formats import group_records, pivot
    from nas_cli.report.table import table_rows

    if not groups:
        return []
    head, rows = table_rows(groups)
    rows = _mark(head, rows, groups, marked, verdicts[2] if verdicts else None)
    if _wanted(args):
        keep_titles = {spec(k).title for k in metrics if k.startswith("test/")}
        metric_titles = _test_titles(runs)
        idx = [i for i, h in enumerate(head) if h not in metric_titles or h in keep_titles]
        head, rows = [head[i] for i in idx], [[r[i] for i in idx] for r in rows]
    caption = _caption(groups, by) + ("; †: differs from the baseline over seeds (p < 0.05, Holm)"
                                      if verdicts else "")
    if args.pivot:
        values = [h for h in head if h in _test_titles(runs)]
        if args.pivot not in head:
            raise _Fail(f"--pivot {args.pivot}: not a column of this table; use one of "
                        f"{', '.join(h for h in head if h in ('task', 'scheme', 'heads', 'config'))}")
        head, rows = pivot(head, rows, args.pivot, values, ["task", "scheme", "heads", "config"])
    return [("runs", args.title, head, rows, caption, group_records(groups))]


def _verdict_sections(verdicts, compared) -> list[tuple]:
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


def _sequential_sections(paths) -> list[tuple]:
    """A seed=auto sweep among the PATHs: its looks and decisions, recomputed from its runs."""
    from nas_cli.sweeps.sequential import recompute, table_rows as sequential_rows

    out = []
    for path in paths:
        rec = recompute(Path(path))
        if rec is not None:
            sh, sr = sequential_rows(rec)
            out.append(("sequential", f"sequential sweep {path} ({rec['metric']}): the decisions so far", sh, sr,
                        rec["method"], rec["comparisons"]))
    return out


def _unfinished_section(runs) -> list[tuple]:
    """Failed and unfinished runs: listed in every format, never dropped silently."""
    from nas_cli.report.table import unfinished_rows

    head, rows = unfinished_rows(runs)
    if not rows:
        return []
    failed = sum(row[1].startswith("failed") for row in rows)
    title = f"runs without results: {failed} failed, {len(rows) - failed} unfinished (no summary.json)"
    return [("unfinished", title, head, rows, "", [dict(zip(head, r)) for r in rows])]


def _check_tables(args) -> None:
    from nas_cli.report.formats import TABLES

    if args.table is not None:
        if args.format != "csv":
            raise _Fail(f"--table {args.table}: picks the table of --format csv; add --format csv "
                        "(or use --out DIR for every table)")
        if args.table not in TABLES:
            raise _Fail(f"--table {args.table}: unknown; use one of {', '.join(TABLES)}")
        if args.table in ("comparison", "test_set") and not args.baseline:
            raise _Fail(f"--table {args.table}: needs a comparison; add --baseline, e.g. --baseline scheme=unas")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise _Fail(f"--out {args.out}: is a file, not a folder; give a folder for the CSV tables")


def _csv_table(args, sections) -> str:
    """--format csv: one table as tidy CSV (the comparison with --baseline, else the runs; --table)."""
    from nas_cli.report.formats import csv_text, tidy

    want = args.table or ("comparison" if args.baseline else "runs")
    found = [s for s in sections if s[0] == want]
    if not found:
        why = {"test_set": "no run has per-item test outputs (test_items.json)",
               "sequential": "no seed=auto sweep among the PATHs", "unfinished": "every run finished"}.get(want, "")
        raise _Fail(f"--table {want}: there is no such table here ({why}); use --table runs")
    key, _, head, rows, _, records = found[0]
    return csv_text(tidy(key, head, rows, records))


def _write_out(folder: str, sections) -> list[str]:
    """--out DIR: each table as DIR/<table>.csv (a second sequential sweep: sequential-2.csv), each
    file written whole or not at all."""
    import os

    from nas_cli.report.formats import csv_text, tidy

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written, seen = [], {}
    for key, _, head, rows, _, records in sections:
        seen[key] = seen.get(key, 0) + 1
        path = out / (f"{key}.csv" if seen[key] == 1 else f"{key}-{seen[key]}.csv")
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(csv_text(tidy(key, head, rows, records)))
        os.replace(tmp, path)
        written.append(str(path))
    return written


def _print(args, sections, notes, console, groups, by, verdicts, table=None) -> None:
    from nas_cli.report.formats import json_document, render
    from nas_cli.report.table import rich_table

    if args.format == "json":
        sys.stdout.write(json_document(args.title, sections, notes, verdicts[2].label if verdicts else None))
        return
    if args.format == "csv":
        sys.stdout.write(table)
        return
    for key, title, head, rows, caption, _ in sections:
        if args.format != "rich":
            sys.stdout.write(render(args.format, title, head, rows, caption) + "\n")
        elif key == "runs" and not args.pivot:
            console.print(rich_table(groups, title, by, rows=(head, rows), caption=caption))
        else:
            console.print(_rich(title, head, rows, caption))
    for line in notes:
        if args.format == "rich":
            console.print(f"note: {line}", highlight=False, soft_wrap=True)
        else:
            sys.stdout.write(f"note: {line}\n")


def _notes(groups, compared, baseline=None) -> list[str]:
    """One line each: systems without a baseline at their settings, verdicts that lean on the
    t-test's assumption, replicates counted once, runs without per-item outputs."""
    from nas_cli.report.table import code_versions_note

    out = []
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
        if baseline is not None and any(g is b for b in baseline.groups) and "scheme" in head:
            row[head.index("scheme")] += " (baseline)"
        out.append(row)
    return out


def _caption(groups, by) -> str:
    grouping = "runs that differ only by seed" if by is None else f"runs with equal {', '.join(by)}"
    return (f"mean ± 95% CI (Student t) over {grouping}; n = 1: no interval" if any(g.n > 1 for g in groups)
            else "one run per row (no interval: n = 1)")


def _rich(title, head, rows, caption):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title), caption=escape(caption), caption_justify="left")
    for h in head:
        t.add_column(escape(h))
    for r in rows:  # cells are text, not markup
        t.add_row(*map(escape, r))
    return t


if __name__ == "__main__":
    raise SystemExit(main())
