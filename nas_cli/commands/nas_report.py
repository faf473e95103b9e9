"""``nas-report PATH [PATH ...] [--html OUT] [--group-by FIELDS]``: compare finished runs.

Reads every run directory at or below the PATHs (single runs, sweep directories, or a
whole ``outputs/``), prints one rich table and optionally writes a self-contained HTML
report. Runs that differ only by ``seed`` share a row (mean ± std, n runs); directories
without ``summary.json`` are listed as unfinished. Bad input (a missing path, no runs)
prints one line on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
import sys
from typing import Sequence

from nas_cli.errors import OneLineParser, exits

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
    p.add_argument("--format", default="rich", metavar="FMT",
                   help="rich (default), markdown, latex, json (everything), or csv (one tidy table: the comparison "
                        "with --baseline, else the runs; --table picks another)")
    p.add_argument("--table", metavar="NAME", help="the table --format csv writes: runs, tuning, mad, comparison, "
                                                   "test_set, sequential or unfinished")
    p.add_argument("--out", metavar="DIR", help="also write every table as its own tidy CSV file, DIR/<table>.csv "
                                                "(numbers in numeric columns: mean, ci_low, ci_high, sd, n; "
                                                "difference, p, p_holm, direction)")
    p.add_argument("--pivot", metavar="FIELD", help="spread the values of FIELD (scheme, heads, task) into columns, "
                                                     "one table cell per metric: mean ± CI (†: differs from the "
                                                     "baseline, p < 0.05 after Holm)")
    p.add_argument("--wandb", nargs="?", const="offline", choices=("offline", "online"), metavar="MODE",
                   help="also log this comparison as a W&B run (job type report) in the runs' W&B group: every "
                        "table (verdicts, per-seed detail, detectable differences), the figures and the HTML page; "
                        "offline (default: under PATH/nas-report/, for wandb sync) or online (the runs' project "
                        "and entity); running it again replaces that report run")
    _comparison_options(p)
    return p


def _comparison_options(p: argparse.ArgumentParser) -> None:
    """The options of the comparison with a baseline: verdicts, metrics, planning, equivalence, tuning."""
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
    p.add_argument("--samples", type=int, default=1000, help="bootstrap resamples of the test items (default 1000; "
                                                              "approximate randomization: up to 10x as many trials)")
    p.add_argument("--detect", metavar="DELTA", help="plan seeds: how many seeds per scheme would detect a true "
                                                     "difference of DELTA (in the metric's units) with 80%% power, "
                                                     "at the spread observed so far; DELTA for every metric, or "
                                                     "metric=DELTA[,...] (bleu=0.5,ppl=0.2)")
    p.add_argument("--equivalence", metavar="MARGIN", help="also test equivalence (TOST over seeds, Holm): "
                   "'equivalent within ±MARGIN' or 'not shown equivalent' per comparison; MARGIN for every metric, "
                   "or metric=MARGIN[,...] (bleu=0.5,ppl=2), in the metric's units")
    p.add_argument("--tune", metavar="KEYS", help="a tuned comparison: each scheme at its own value of these swept "
                   "options (optim.lr[,...]), chosen per cell by the best mean validation value, the verdicts on the "
                   "test metrics at the chosen values; default: the tune=[...] the sweep ran with")
    p.add_argument("--tuning-seeds", metavar="SEEDS", help="with --tune: these seeds only choose and the other seeds "
                   "give the verdicts (held-apart tuning seeds); default: the sweep's tune_seeds, else the verdict "
                   "seeds also choose (same-seed selection, docs/comparing.md, 'Tuned sweeps')")
    p.add_argument("--no-item-tests", action="store_true", help="skip the per-seed comparisons on the test items "
                                                                "(question b); the verdicts over seeds are kept")


def _fail(msg: str) -> int:
    print(f"nas-report: error: {msg}", file=sys.stderr)
    return 2


class _Fail(Exception):
    """Bad input: one line on stderr, exit 2."""


@dataclass
class _Report:
    """What nas-report found and decided: the runs and their groups, the verdicts, the sections it
    prints and writes, and the notes under them."""

    runs: list
    groups: list
    by: list | None
    verdicts: tuple | None
    compared: list
    sections: list
    notes: list


@exits
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from nas_cli.errors import UserError
    from nas_cli.report.compare import CompareError
    from nas_cli.report.table import BadField

    try:
        report = _build(args)
    except (_Fail, BadField, CompareError, UserError, FileNotFoundError) as err:
        return _fail(str(err))
    return _print(args, report) or _page_outputs(args, report)


def _build(args) -> _Report:
    """Load the runs, choose each tuned cell's values, compare with the baseline, and lay out the sections."""
    from nas_cli.report.formats import FORMATS
    from nas_cli.report.mad import mad_section
    from nas_cli.report.sections import (notes as report_notes, runs_section, tuning_section, unfinished_section,
                                         verdict_sections)

    if args.format not in FORMATS:
        raise _Fail(f"--format {args.format}: unknown; use one of {', '.join(FORMATS)}")
    _check_tables(args)
    runs, groups, by = _load(args)
    tuning = _tune(args, runs, groups, by)
    metrics, verdicts, marked, compared = _compare(args, tuning.groups if tuning else groups, tuning)
    sections = [*runs_section(args, runs, groups, by, metrics, verdicts, marked),
                *tuning_section(tuning, verdicts), *mad_section(tuning.groups if tuning else groups),
                *verdict_sections(verdicts, compared),
                *_sequential_sections(args.paths), *unfinished_section(runs)]
    notes = report_notes(groups, compared, verdicts[2] if verdicts else None, args.paths, tuning)
    return _Report(runs, groups, by, verdicts, compared, sections, notes)


def _say(args, console):
    """Where a line about a written file goes: the terminal's table, or stderr beside a machine format."""
    return console.print if args.format == "rich" else (lambda m: print(m, file=sys.stderr))


def _print(args, report: _Report) -> int:
    """The report in the chosen format on stdout, and --out's CSV files; 0, or 2 when --out cannot be written."""
    from rich.console import Console

    from nas_cli.errors import UserError
    from nas_cli.report.output import csv_table, print_report, write_out

    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        table = csv_table(args, report.sections) if args.format == "csv" else None
        written = write_out(args.out, report.sections) if args.out else []
    except (UserError, OSError) as err:
        return _fail(str(err) if isinstance(err, UserError) else f"cannot write --out {args.out}: {err.strerror or err}")
    print_report(args, report.sections, report.notes, console, report.groups, report.by, report.verdicts, table)
    if written:
        _say(args, console)(f"CSV tables: {', '.join(written)}")
    return 0


def _page_outputs(args, report: _Report) -> int:
    """--html's page and --wandb's report run (the same page in it)."""
    from rich.console import Console

    if not (args.html or args.wandb):
        return 0
    from nas_cli.report.html import render_html
    from nas_cli.report.verdicts import ITEM_NOTE, item_table

    say = _say(args, Console() if sys.stdout.isatty() else Console(width=200))
    verdicts, compared = report.verdicts, report.compared
    tuning = next((sec[1:5] for sec in report.sections if sec[0] == "tuning"), None)
    page = render_html(report.runs, report.groups, args.paths, title=args.title, by=report.by,
                       verdicts=verdicts[:2] if verdicts else None,
                       items=(item_table(compared), ITEM_NOTE) if compared else None, notes=report.notes,
                       tuning=tuning)
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
            where = log_report(report.sections, report.notes, page, report.runs, report.groups, args.paths[0],
                               args.wandb, args.title)
        except OSError as err:
            return _fail(f"--wandb: cannot write the W&B run under {args.paths[0]}: {err.strerror or err}")
        say(f"W&B report run: {where}" + (f" (upload: wandb sync {where})" if args.wandb == "offline" else ""))
    return 0


def _sequential_sections(paths) -> list[tuple]:
    """A seed=auto sweep among the PATHs: its looks and decisions, recomputed from its runs."""
    from nas_cli.sweeps.sequential import recompute
    from nas_cli.sweeps.sequential_view import table_rows as sequential_rows

    out = []
    for path in paths:
        rec = recompute(Path(path))
        if rec is not None:
            sh, sr = sequential_rows(rec)
            out.append(("sequential", f"sequential sweep {path} ({rec['metric']}): the decisions so far", sh, sr,
                        rec["method"], rec["comparisons"]))
    return out


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


def _tune(args, runs, groups, by):
    """--tune (or the sweep's tune=[...]): each cell's chosen values and the groups the verdicts compare;
    None when nothing is tuned."""
    from nas_cli.report import tuning

    keys = [k.strip() for k in args.tune.split(",") if k.strip()] if args.tune else tuning.from_runs(runs)[0]
    seeds = tuning.parse_seeds(args.tuning_seeds) if args.tuning_seeds else tuning.from_runs(runs)[1]
    if args.tuning_seeds and not keys:
        raise _Fail("--tuning-seeds chooses the tuned values of --tune: add --tune, e.g. --tune optim.lr")
    if not keys:
        return None
    if by is not None:
        raise _Fail("--tune chooses among the groups of runs that differ only by seed: leave out --group-by")
    tuned = tuning.tune(groups, keys, seeds)
    if not any(c.chosen for c in tuned.cells):
        held = f" with --tuning-seeds {','.join(map(str, seeds))}" if seeds else ""
        raise _Fail(f"--tune {','.join(keys)}{held}: no cell can choose ({tuned.cells[0].label}: "
                    f"{tuned.cells[0].why_not}); the verdicts need seeds that take no part in the choice")
    return tuned


def _compare(args, groups, tuning=None):
    """The metrics asked for and, with --baseline, every group against it: (metrics, (verdict
    table, method note, baseline) or None, {(group, metric): significant}, the comparison rows).
    A tuned comparison (``tuning``) compares each cell's chosen group; its † marks go to the
    chosen group's row of the runs table, and the method note names the protocol."""
    from nas_cli.report.compare import (CompareError, compare_groups, metrics_for, parse_detect, parse_margins,
                                        select_baselines)
    from nas_cli.report.sections import wanted_metrics
    from nas_cli.report.verdicts import method_note, verdict_table

    wanted = wanted_metrics(args)
    metrics = metrics_for(groups, wanted) if (args.baseline or wanted) else []
    if args.detect and not args.baseline:
        raise CompareError("--detect plans seeds for a comparison: add --baseline, e.g. --baseline scheme=unas")
    if args.equivalence and not args.baseline:
        raise CompareError("--equivalence tests a comparison: add --baseline, e.g. --baseline scheme=unas")
    if not args.baseline:
        return metrics, None, {}, []
    baseline = select_baselines(groups, args.baseline)
    detect = parse_detect(args.detect, metrics)
    margins = parse_margins(args.equivalence, metrics)
    compared = compare_groups(groups, baseline, metrics, samples=max(10, args.samples),
                              trials=10 * max(10, args.samples), item_tests=not args.no_item_tests, detect=detect,
                              equivalence=margins)
    note = method_note(compared) + (f" {tuning.describe()[0].upper()}{tuning.describe()[1:]}." if tuning else "")
    verdicts = (verdict_table(compared), note, baseline)
    marked = {(id(r.group.origin or r.group), r.comparison.metric): r.comparison.direction() != 0 for r in compared}
    return metrics, verdicts, marked, compared


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


if __name__ == "__main__":
    raise SystemExit(main())
