"""nas-report's output: the sections printed in the chosen format (rich, markdown, latex, json, csv)
and written as CSV files with --out. ``args`` are nas-report's parsed options."""
from __future__ import annotations

import sys
from pathlib import Path

from nas_cli.errors import UserError


def csv_table(args, sections) -> str:
    """--format csv: one table as tidy CSV (the comparison with --baseline, else the runs; --table)."""
    from nas_cli.report.formats import csv_text, tidy

    want = args.table or ("comparison" if args.baseline else "runs")
    found = [s for s in sections if s[0] == want]
    if not found:
        why = {"test_set": "no run has per-item test outputs (test_items.json)",
               "sequential": "no seed=auto sweep among the PATHs", "unfinished": "every run finished"}.get(want, "")
        raise UserError(f"--table {want}: there is no such table here ({why}); use --table runs")
    key, _, head, rows, _, records = found[0]
    return csv_text(tidy(key, head, rows, records))


def write_out(folder: str, sections) -> list[str]:
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


def print_report(args, sections, notes, console, groups, by, verdicts, table=None) -> None:
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
            _fitted(console, rich_table(groups, title, by, rows=(head, rows), caption=caption))
        else:
            _fitted(console, _rich(title, head, rows, caption))
    for line in notes:
        if args.format == "rich":
            console.print(f"note: {line}", highlight=False, soft_wrap=True)
        else:
            sys.stdout.write(f"note: {line}\n")


def _fitted(console, table) -> None:
    """A table on the console: on a terminal as wide as the terminal; written to a file (not a terminal),
    as wide as its cells need, so that no column is squeezed away and no number is cut ("234,9...")."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.console import Console

    need = Console(width=10_000).measure(table).maximum
    Console(width=max(console.width, need), file=console.file).print(table)


def _rich(title, head, rows, caption):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title), caption=escape(caption), caption_justify="left")
    for h in head:
        t.add_column(escape(h))
    for r in rows:  # cells are text, not markup
        t.add_row(*map(escape, r))
    return t
