"""One table, five ways out: rich (terminal), markdown, LaTeX (booktabs), CSV, JSON; and the
paper-style pivot (rows = groups' other fields, columns = the values of one field)."""
from __future__ import annotations

import csv
import io
import json
from typing import Sequence

FORMATS = ("rich", "markdown", "latex", "csv", "json")

#: LaTeX's special characters, one at a time (so that no replacement is escaped again)
_TEX = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "$": "\\$", "{": "\\{",
        "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "±": "$\\pm$", "†": "$^\\dagger$",
        "<": "$<$", ">": "$>$"}


def render(fmt: str, title: str, head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    if fmt == "markdown":
        def md(c: str) -> str:
            return str(c).replace("|", "\\|")
        lines = [f"**{title}**", "", "| " + " | ".join(map(md, head)) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(map(md, row)) + " |" for row in rows]
        return "\n".join(lines + ([""] + [caption] if caption else [])) + "\n"
    if fmt == "latex":
        def tex(c: str) -> str:
            return "".join(_TEX.get(ch, ch) for ch in str(c))
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


def csv_sections(sections) -> str:
    """Every table as CSV, one after another: a ``# <key>: <title>`` line, the header and rows,
    then a blank line. The comparison tables carry numbers as numbers (differences, interval
    ends, p, Holm p) besides the verdict; the runs table is the table as shown."""
    buf = io.StringIO()
    w = csv.writer(buf)
    for key, title, head, rows, _, records in sections:
        buf.write(f"# {key}: {title}\n")
        if key in ("comparison", "test_set") and records:
            fields = list(records[0])
            w.writerow(fields)
            w.writerows([[_csv(r[f]) for f in fields] for r in records])
        else:
            w.writerow(head)
            w.writerows(rows)
        buf.write("\n")
    return buf.getvalue()


def _csv(v):
    if isinstance(v, list):
        return ",".join(map(str, v))
    return "" if v is None else v


def json_document(title: str, sections, notes: Sequence[str], baseline: str | None) -> str:
    """Everything nas-report printed, as one JSON document (``json.load`` reads it): the runs
    table (cells as shown, and each group's numbers), the comparison over seeds and the
    test-set detail with numbers as numbers, the runs without results, and the notes."""
    doc = {"title": title, "baseline": baseline, "notes": list(notes)}
    for key, t, head, rows, caption, records in sections:
        entry = {"title": t, "caption": caption, "columns": list(head), "rows": [dict(zip(head, r)) for r in rows]}
        if key == "runs":
            entry["groups"] = records
        elif key in ("comparison", "test_set"):
            entry["rows"] = records
        doc[key] = entry
    return json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"


def group_records(groups) -> list[dict]:
    """Each group's numbers: mean, 95% Student-t interval and n of every metric its runs report."""
    from .collect import TEST_METRICS
    from .stats import t_interval

    names = [k for k, _, _ in TEST_METRICS] + ["best_val", "jsd", "explained_away", "parameters", "tokens_per_s"]
    out = []
    for g in groups:
        metrics = {}
        for name in names:
            try:
                got = t_interval(g.values(name))
            except KeyError:
                got = None
            if got is not None:
                m, low, high, n = got
                metrics[name] = {"mean": m, "ci_low": None if n < 2 else low, "ci_high": None if n < 2 else high,
                                 "n": n}
        out.append({"label": g.label, "task": g.common(lambda r: r.task), "scheme": g.common(lambda r: r.scheme),
                    "heads": g.common(lambda r: r.heads), "n": g.n, "seeds": g.seeds,
                    "runs": [str(r.path) for r in g.runs], "metrics": metrics,
                    "repeats": [{"set_aside": str(d.path), "repeats": str(k.path)} for d, k in g.repeats]})
    return out
