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
    return p


def _fail(msg: str) -> int:
    print(f"nas-report: error: {msg}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from .collect import find_runs
    from .table import BadField, group_runs, rich_table, unfinished_rows

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
    if groups:
        console.print(rich_table(groups, args.title, by))
    head, rows = unfinished_rows(runs)
    if rows:
        failed = sum(row[1].startswith("failed") for row in rows)
        t = Table(title=f"runs without results: {failed} failed, {len(rows) - failed} unfinished (no summary.json)")
        for h in head:
            t.add_column(h)
        for row in rows:
            t.add_row(*row)
        console.print(t)
    if args.html:
        from .html import write_html

        try:
            path = write_html(args.html, runs, groups, args.paths, title=args.title, by=by)
        except OSError as err:
            return _fail(f"cannot write {args.html}: {err.strerror or err}")
        console.print(f"HTML report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
