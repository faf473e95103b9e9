"""One table, five ways out: rich (terminal), markdown, LaTeX (booktabs), CSV (one tidy table per
file), JSON; and the paper-style pivot (rows = groups' other fields, columns = the values of one field)."""
from __future__ import annotations

from types import MappingProxyType
import csv
import io
import json
from typing import Sequence

FORMATS = ("rich", "markdown", "latex", "csv", "json")

#: LaTeX's special characters, one at a time (so that no replacement is escaped again)
_TEX = MappingProxyType({"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "$": "\\$", "{": "\\{",
        "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "±": "$\\pm$", "†": "$^\\dagger$",
        "<": "$<$", ">": "$>$"})


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


#: the tables nas-report can write as CSV (``--table``), in the order --out writes them
TABLES = ("runs", "tuning", "mad", "comparison", "test_set", "sequential", "unfinished")


def tidy(key: str, head: Sequence[str], rows: Sequence[Sequence[str]], records) -> list[dict]:
    """One table as tidy records, every number in its own column: the runs table one row per
    group and metric (mean, ci_low, ci_high, sd, n); the comparison and test-set tables one row per
    system and metric (difference, ci_low, ci_high, p, p_holm, direction, ...); lists as
    comma-joined text (the seeds)."""
    if key == "runs":
        out = []
        for g in records:
            ident = {k: v for k, v in g.items() if k not in ("n", "seeds", "runs", "metrics", "repeats")}
            ident.update(n_runs=g["n"], seeds=g["seeds"])
            for name, m in g["metrics"].items():
                out.append({**ident, "metric": name, **m})
        return [{k: _cell(v) for k, v in r.items()} for r in out]
    if key == "sequential":  # one row per comparison and look (a comparison waiting for runs: one row)
        return [{"system": c["system"], "baseline": c["baseline"], "final_decision": c["decision"],
                 **{("decision_at_look" if k == "decision" else k): _cell(v) for k, v in lk.items()}}
                for c in records for lk in (c.get("looks") or [{}])]
    if records and all(isinstance(r, dict) for r in records):
        return [{k: _cell(v) for k, v in r.items() if not isinstance(v, dict)} for r in records]
    return [dict(zip(head, r)) for r in rows]


def csv_text(records: Sequence[dict]) -> str:
    """Records as one CSV table: a header of every key (in first-seen order), one row each."""
    fields = _keys(records)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
    w.writeheader()
    w.writerows(records)
    return buf.getvalue()


def _cell(v):
    if isinstance(v, (list, tuple)):
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
        elif key in ("comparison", "test_set", "tuning", "mad"):  # numbers as numbers: the rows are the records, their keys the columns
            entry.update(headers=list(head), rows=records, columns=_keys(records))
        doc[key] = entry
    # always there, so that a script can read it without a check: empty when every run finished
    doc.setdefault("unfinished", {"title": "runs without results: none", "caption": "", "columns": [], "rows": []})
    return json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"


def _keys(records: Sequence[dict]) -> list[str]:
    """Every key of ``records``, in first-seen order (each row's keys are among them)."""
    keys: list[str] = []
    for r in records:
        keys += [k for k in r if k not in keys]
    return keys


def group_records(groups) -> list[dict]:
    """Each group's numbers: mean, 95% Student-t interval, sd and n of every number its runs
    report (the table's numeric columns, a task's own metrics and diagnostic plug-ins included),
    each with the column title it has in the table."""
    import numpy as np

    from nas_cli.report.collect import TEST_METRICS
    from nas_cli.report.stats import t_interval
    from nas_cli.report.table import columns, diagnostic_status, reported

    declared = reported([r for g in groups for r in g.runs])  # every number the diagnostics declared
    titles = {**{name: d.title for name, d in declared.items()}, **{c.numeric: c.title for c in columns(groups) if c.numeric}}
    names = [*dict.fromkeys([*titles, *(k for k, _, _ in TEST_METRICS), "best_val", "parameters", "tokens_per_s"])]
    out = []
    for g in groups:
        metrics = {}
        for name in names:
            try:
                got = t_interval(g.values(name))
            except KeyError:
                got = None
            status = diagnostic_status(g, name) if name in declared else None
            if got is None and status:  # undefined for these weights: said, with why, not left out
                metrics[name] = {"title": titles.get(name, name), "mean": None, "ci_low": None, "ci_high": None,
                                 "sd": None, "n": 0, "not_applicable": status[1]}
            if got is not None:
                m, low, high, n = got
                vals = [float(v) for v in g.values(name) if np.isfinite(float(v))]
                metrics[name] = {"title": titles.get(name, name), "mean": m, "ci_low": None if n < 2 else low,
                                 "ci_high": None if n < 2 else high,
                                 "sd": float(np.std(vals, ddof=1)) if n > 1 else None, "n": n}
                if status:  # computed on a derived quantity (or undefined at some location): which
                    metrics[name]["derived" if status[0] == "derived" else "not_applicable"] = status[1]
        out.append({"label": g.label, "task": g.common(lambda r: r.task), "scheme": g.common(lambda r: r.scheme),
                    "heads": g.common(lambda r: r.heads), **{str(k): v for k, v in g.fields.items()},
                    "config": " ".join(f"{k}={v}" for k, v in g.distinct.items()), "n": g.n, "seeds": g.seeds,
                    "runs": [str(r.path) for r in g.runs], "metrics": metrics,
                    "repeats": [{"set_aside": str(d.path), "repeats": str(k.path)} for d, k in g.repeats]})
    return out
