"""One table, five ways out: rich (terminal), markdown, LaTeX (booktabs), CSV, JSON; and the
paper-style pivot (rows = groups' other fields, columns = the values of one field)."""
from __future__ import annotations

import csv
import io
import json
from typing import Sequence

FORMATS = ("rich", "markdown", "latex", "csv", "json")


def render(fmt: str, title: str, head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    if fmt == "markdown":
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        return "\n".join(lines + ([""] + [caption] if caption else [])) + "\n"
    if fmt == "latex":
        def tex(c: str) -> str:
            for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#"),
                         ("±", "$\\pm$"), ("†", "$^\\dagger$"), ("<", "$<$"), (">", "$>$")):
                c = c.replace(a, b)
            return c
        lines = ["\\begin{table}[t]", "\\centering", f"\\caption{{{tex(title)}}}",
                 "\\begin{tabular}{" + "l" * len(head) + "}", "\\toprule", " & ".join(map(tex, head)) + " \\\\",
                 "\\midrule"]
        lines += [" & ".join(map(tex, row)) + " \\\\" for row in rows]
        lines += ["\\bottomrule", "\\end{tabular}"]
        if caption:
            lines.append(f"\\\\[2pt]{{\\footnotesize {tex(caption)}}}")
        return "\n".join(lines + ["\\end{table}"]) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(head)
        w.writerows(rows)
        return buf.getvalue()
    if fmt == "json":
        return json.dumps({"title": title, "caption": caption, "rows": [dict(zip(head, r)) for r in rows]},
                          indent=2) + "\n"
    raise ValueError(fmt)


def pivot(head: Sequence[str], rows: Sequence[Sequence[str]], field: str, values: Sequence[str],
          keep: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Rows keyed by the ``keep`` columns (minus ``field``) x each value column; the values of
    ``field`` become columns. ``values``: the value columns to spread (e.g. ["BLEU"])."""
    if field not in head:
        raise KeyError(field)
    fi = head.index(field)
    ids = [c for c in keep if c in head and c != field]
    columns: list[str] = []
    table: dict[tuple, dict[str, str]] = {}
    for row in rows:
        col = row[fi]
        if col not in columns:
            columns.append(col)
        for v in values:
            key = tuple(row[head.index(c)] for c in ids) + ((v,) if len(values) > 1 else ())
            table.setdefault(key, {})[col] = row[head.index(v)]
    new_head = [*ids, *(["metric"] if len(values) > 1 else []), *columns]
    return new_head, [[*k, *(cells.get(c, "-") for c in columns)] for k, cells in table.items()]
