"""Group runs and lay out the comparison table (shared by the terminal and the HTML report).

Grouping: by default runs whose composed configs are equal except for ``seed`` (and the
logging-only keys in ``IGNORED_KEYS``) form one group; each number is then shown as
mean ± the half-width of a 95% Student-t interval over the group's runs (seeds), with ``n``
the number of runs; a group of one run shows its value and ``(n=1)`` where others have
intervals, never a made-up interval.
``group_runs(runs, by=[...])`` groups by chosen fields instead (see ``field_value``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tasks.scores import present
from nas_cli.report.collect import Run

__all__ = ["Group", "group_runs", "field_value", "columns", "table_rows", "rich_table", "unfinished_rows",
           "BadField"]

from nas_cli.infra.config_identity import identity
from nas_cli.model.plan import canonical_config

#: fields read from summary.json / the run itself rather than from the config
RUN_FIELDS = ("task", "scheme", "heads", "seed", "model", "d_model", "steps", "parameters", "source")


class BadField(ValueError):
    """A --group-by field that no run has."""


def field_value(run: Run, name: str) -> Any:
    """Value of a grouping field: a run field (``task``, ``scheme``, ``heads``, ``seed``,
    ``model``, ``d_model``, ``steps``, ``parameters``), ``placement.<location>``, or a dotted
    config key (``attention.u_init``, ``optim.lr``). None when the run does not have it."""
    if name == "task":
        return run.task
    if name == "scheme":
        return run.scheme
    if name == "heads":
        return run.heads
    if name == "seed":
        return run.seed
    if name == "source":
        return run.source
    if name == "variant":
        return run.variant
    if name.startswith("placement."):
        return run.placement.get(name.split(".", 1)[1])
    if name in RUN_FIELDS and run.summary and name in run.summary:
        return run.summary[name]
    return run.flat_config.get(name)


def _default_key(run: Run) -> tuple:
    if run.flat_config:
        return ("config", run.variant, tuple(sorted((k, repr(v)) for k, v in _identity(run).items())))
    s = run.summary or {}  # no .hydra/config.yaml: what summary.json says about the setup
    return ("summary", run.task, run.scheme, tuple(sorted(run.placement.items())), run.heads,
            s.get("model"), s.get("d_model"), s.get("steps"), s.get("parameters"))


@dataclass
class Group:
    """Finished runs shown as one row."""

    runs: list[Run]
    key: tuple
    distinct: dict[str, Any] = field(default_factory=dict)  # config keys that tell apart look-alike rows
    repeats: list = field(default_factory=list)  # (set-aside run, the run it repeats): one replicate, kept once
    fields: dict[str, Any] = field(default_factory=dict)  # --group-by fields other than task, scheme, heads
    tuned: dict[str, Any] = field(default_factory=dict)  # a tuned cell's chosen values (nas_cli.report.tuning)
    origin: Group | None = None  # a tuned cell: the group of its chosen values, on every seed
    selection: Any = None  # a cell chosen on the verdict seeds: its tuning.Cell (nas_cli.report.selection)

    @property
    def n(self) -> int:
        return len(self.runs)

    def values(self, name: str) -> list[float]:
        """The runs' values of ``name`` (:meth:`Run.value`), leaving out runs that have none."""
        return [v for v in (_value(r, name) for r in self.runs) if v is not None]

    def stat(self, name: str) -> tuple[float, float, int] | None:
        """(mean, half-width of the 95% Student-t interval over the runs (0 for one value),
        number of values) or None if no run has it."""
        from nas_cli.report.stats import t_interval

        got = t_interval(self.values(name))
        if got is None:
            return None
        m, low, high, n = got
        return m, (0.0 if n < 2 else (high - low) / 2), n

    def common(self, getter: Callable[[Run], Any]) -> str:
        vals = []
        for r in self.runs:
            v = getter(r)
            if v not in vals:
                vals.append(v)
        return ",".join("-" if v is None else str(v) for v in vals)

    @property
    def series(self) -> str:
        """The scheme plus any config that tells look-alike rows apart (a line in plots over heads)."""
        extra = " ".join(f"{k}={v}" for k, v in self.distinct.items())
        return self.common(lambda r: r.scheme) + (f" {extra}" if extra else "")

    @property
    def label(self) -> str:
        extra = " ".join([*(f"{k}={v}" for k, v in {**self.fields, **self.distinct}.items()),
                          *(f"{k}={v} (tuned)" for k, v in self.tuned.items())])
        variant = self.common(lambda r: r.variant)
        return (f"{self.common(lambda r: r.scheme)} h{self.common(lambda r: r.heads)}" + (f" {extra}" if extra else "")
                + (f" [{variant}]" if variant != "-" else ""))

    @property
    def seeds(self) -> list:
        return sorted({r.seed for r in self.runs if r.seed is not None})


def group_runs(runs: Sequence[Run], by: Sequence[str] | None = None) -> list[Group]:
    """Finished runs -> groups, sorted by task, scheme, heads. ``by=None``: runs that differ
    only by seed; ``by=[]``/``["run"]``: one group per run; else the listed fields."""
    runs = [r for r in runs if r.finished]
    if by is not None:
        by = [b for b in by if b]
        unknown = [b for b in by if b != "run" and all(field_value(r, b) is None for r in runs)]
        if unknown and runs:
            raise BadField(f"--group-by {','.join(unknown)}: no run has this field; use run fields "
                           f"({', '.join(RUN_FIELDS)}), placement.<location> or dotted config keys "
                           "such as attention.u_init")
    groups: dict[tuple, Group] = {}
    for i, r in enumerate(runs):
        if by is None:
            key = _default_key(r)
        elif not by or "run" in by:
            key = ("run", i)
        else:
            key = ("by", tuple(repr(field_value(r, b)) for b in by))
        groups.setdefault(key, Group(runs=[], key=key)).runs.append(r)
    out = sorted(groups.values(), key=lambda g: (g.common(lambda r: r.task), g.common(lambda r: r.scheme),
                                                  g.runs[0].heads or 0, str(g.key)))
    for g in out:  # within a row, a run that repeats another's config and seed is the same replicate
        g.runs, g.repeats = distinct_replicates(g.runs)
        if by:
            g.fields = {b: field_value(g.runs[0], b) for b in by if b not in ("task", "scheme", "heads", "run", "seed")}
    _mark_distinct(out)
    return out


def distinct_replicates(runs: Sequence[Run]) -> tuple[list[Run], list[tuple[Run, Run]]]:
    """Runs that repeat another run's config *and* seed are one replicate, not two seeds: keep the
    first (by path) and return the others as (set-aside run, the run it repeats). Runs without a
    seed are all kept."""
    kept: dict[tuple, Run] = {}
    out, repeats = [], []
    for r in sorted(runs, key=lambda r: str(r.path)):
        if r.seed is None:
            out.append(r)
            continue
        key = (_default_key(r), repr(r.seed))
        if key in kept:
            repeats.append((r, kept[key]))
        else:
            kept[key] = r
            out.append(r)
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(out, key=lambda r: order[id(r)]), repeats


def _identity(run: Run) -> dict[str, Any]:
    """What defines a run's setup: its config minus ``IGNORED_KEYS``, or without a saved
    config the setup fields of summary.json."""
    flat = identity(canonical_config(run.config))
    if flat:
        return {k: (tuple(v) if isinstance(v, list) else v) for k, v in flat.items()}
    s = run.summary or {}
    return {k: s.get(k) for k in ("model", "d_model", "steps") if k in s}


def _mark_distinct(groups: list[Group]) -> None:
    """For rows that would look identical (same task, scheme, heads), name the config keys
    whose values differ between them."""
    clusters: dict[tuple, list[Group]] = {}
    for g in groups:
        ident = (g.common(lambda r: r.task), g.common(lambda r: r.scheme), g.common(lambda r: r.heads))
        clusters.setdefault(ident, []).append(g)
    for members in clusters.values():
        if len(members) < 2:
            continue
        flats = [_identity(g.runs[0]) for g in members]
        keys = sorted(set().union(*flats))
        varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
        for g, f in zip(members, flats):
            g.distinct = {k: f.get(k) for k in varying[:4]}


# ---- columns ----------------------------------------------------------------------------

def _fmt_num(x: float, kind: str) -> str:
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "int":
        return f"{x:,.0f}"
    if kind == "p2":
        return f"{x:.2f}"
    if kind == "p3":
        return f"{x:.3f}"
    return f"{x:.4g}"


def _cell(st: tuple[float, float, int] | None, kind: str, group_n: int) -> str:
    if st is None:
        return "-"
    m, sd, n = st
    if group_n < 2:
        return _fmt_num(m, kind)
    if n < 2:
        return f"{_fmt_num(m, kind)} (n=1)"
    if kind == "pct":
        return f"{100 * m:.1f} ± {100 * sd:.1f}%"
    return f"{_fmt_num(m, kind)} ± {_fmt_num(sd, kind)}"


@dataclass
class Column:
    title: str
    cell: Callable[[Group], str]
    numeric: str | None = None  # report value name behind the column (for plots), if any


def columns(groups: Sequence[Group]) -> list[Column]:
    """The table's columns: identity, size, metrics present in any run, diagnostics, speed."""
    runs = [r for g in groups for r in g.runs]
    grouped = any(g.n > 1 for g in groups)

    def num(title, name, kind):
        return Column(title, lambda g, name=name, kind=kind: _cell(g.stat(name), kind, g.n), name)

    cols = [Column("task", lambda g: g.common(lambda r: r.task)),
            Column("scheme", lambda g: g.common(lambda r: r.scheme)
                   + (f" [{g.common(lambda r: r.variant)}]" if g.common(lambda r: r.variant) != "-" else "")),
            Column("heads", lambda g: g.common(lambda r: r.heads))]
    for name in dict.fromkeys(k for g in groups for k in g.fields):  # --group-by fields beyond task/scheme/heads
        cols.append(Column(name, lambda g, name=name: str(g.fields.get(name, "-"))))
    if any(g.distinct for g in groups):
        cols.append(Column("config", lambda g: " ".join(f"{k}={v}" for k, v in g.distinct.items()) or "-"))
    if grouped:
        cols.append(Column("n", lambda g: str(g.n)))
    cols.append(Column("params", lambda g: _cell(g.stat("parameters"), "int", 1)))
    metrics = {r.best_val_metric for r in runs if r.best_val_metric}
    if len(metrics) <= 1:
        cols.append(num(f"best {next(iter(metrics))}" if metrics else "best val", "best_val", "g"))
    else:  # tasks monitor different metrics: name it in each cell
        cols.append(Column("best val", lambda g: f"{g.common(lambda r: (r.best_val_metric or '?').split('/')[-1])} "
                                                 f"{_cell(g.stat('best_val'), 'g', g.n)}", "best_val"))
    for m in present(k for r in runs for k in ((r.summary or {}).get("test") or {})):
        if m.compared and any(r.value(m.key) is not None for r in runs):  # a task's own metrics too
            cols.append(num(m.title, m.key, m.fmt))
    for name, declared in reported(runs).items():  # the diagnostics' own declarations, marked (diagnostic_mark)
        if declared.column and any(_value(r, name) is not None for r in runs):
            cols.append(Column(declared.title, lambda g, name=name, kind=declared.format:
                               diagnostic_mark(g, name, _cell(g.stat(name), kind, g.n)), name))
    if any(r.tested in ("no validation",) or r.value("steps") == 0 for r in runs):
        cols.append(Column("tested", lambda g: g.common(lambda r: "untrained" if r.value("steps") == 0 else r.tested)))
    cols.append(num("tokens/s", "tokens_per_s", "int"))
    # what decoding keeps (nas_cli/model/heads.py): shown where runs differ in it (GQA, MQA, recurrent mixers)
    if len({_value(r, "kv_cache_bytes_per_token") for r in runs}) > 1 or any(
            _value(r, "recurrent_state_bytes") for r in runs):
        cols.append(num("KV cache B/token", "kv_cache_bytes_per_token", "int"))
        cols.append(num("state B", "recurrent_state_bytes", "int"))
    cols.append(Column("seed" + ("s" if grouped else ""), lambda g: ",".join(map(str, g.seeds)) or "-"))
    if any(r.code != "?" for r in runs):  # which nas-run made them (summary.json's code)
        cols.append(Column("code", lambda g: g.common(lambda r: r.code)))
    return cols


#: the marks of a diagnostic's cell: computed on a derived quantity; undefined for the group's weights
DERIVED_MARK, NOT_APPLICABLE = "‡", "n/a"


def diagnostic_status(group: Group, name: str) -> tuple[str, str] | None:
    """("not applicable" | "derived", why) for a diagnostic of some run of ``group`` (the first found), else None."""
    found = [st for st in (r.diagnostic_status(name) for r in group.runs) if st]
    return next((st for st in found if st[0] == "not applicable"), found[0] if found else None)


def diagnostic_mark(group: Group, name: str, cell: str) -> str:
    """A diagnostic's cell as shown: ``0.123 ‡`` when computed on row-normalized weights, ``n/a`` when undefined
    for the group's weights (null, not 0); the caption says why (:func:`marks_legend`)."""
    status = diagnostic_status(group, name)
    if status is None:
        return cell
    return NOT_APPLICABLE if status[0] == "not applicable" and cell == "-" else f"{cell} {DERIVED_MARK}"


def marks_legend(groups: Sequence[Group]) -> str | None:
    """The caption's words for the marks the table's diagnostics carry, or None without any."""
    kinds = {st[0]: st[1] for g in groups for name in reported([r for r in g.runs])
             for st in [diagnostic_status(g, name)] if st}
    parts = []
    if "derived" in kinds:
        parts.append(f"{DERIVED_MARK}: computed on {kinds['derived']}")
    if "not applicable" in kinds:
        parts.append(f"{NOT_APPLICABLE}: undefined for {kinds['not applicable'].split(':')[0]}")
    return "; ".join(parts) or None


def reported(runs: Sequence[Run]) -> dict:
    """{name: declaration} of every number the runs' diagnostics declared for the report, in order."""
    out: dict = {}
    for r in runs:
        for name, declared in r.reported.items():
            out.setdefault(name, declared)
    return out


def _value(run: Run, name: str):
    try:
        return run.value(name)
    except KeyError:
        return None


def code_versions_note(runs: Sequence[Run]) -> str | None:
    """One line when ``runs`` were made by more than one version of nas-run, else None."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.code] = counts.get(r.code, 0) + 1
    if len(counts) < 2:
        return None
    listed = "; ".join(f"{code}: {n} run{'s' * (n > 1)}" for code, n in sorted(counts.items()))
    return (f"warning: these runs come from {len(counts)} versions of nas-run ({listed}; ?: not recorded): a "
            "difference between them may come from the code, not the setup")


def table_rows(groups: Sequence[Group]) -> tuple[list[str], list[list[str]]]:
    cols = columns(groups)
    return [c.title for c in cols], [[c.cell(g) for c in cols] for g in groups]


def unfinished_rows(runs: Sequence[Run]) -> tuple[list[str], list[list[str]]]:
    """Runs without results: *failed* (stopped on bad input or an error, with the reason) or
    *unfinished* (interrupted or still running; resumable if last.ckpt exists)."""
    head = ["run directory", "status", "task", "scheme", "heads", "seed", "last diagnostics step", "last.ckpt"]
    rows = []
    for r in runs:
        if r.finished:
            continue
        step = (r.latest or {}).get("step")
        status = f"failed: {(r.failure or {}).get('reason', '?')}" if r.status == "failed" else "unfinished"
        rows.append([str(r.path), status, r.task, r.scheme, str(r.heads if r.heads is not None else "-"),
                     str(r.seed if r.seed is not None else "-"), "-" if step is None else str(step),
                     "yes" if (r.path / "checkpoints" / "last.ckpt").is_file() else "no"])
    return head, rows


def rich_table(groups: Sequence[Group], title: str = "nas-report", by: Sequence[str] | None = None,
               rows: tuple[list[str], list[list[str]]] | None = None, caption: str | None = None):
    from rich.markup import escape
    from rich.table import Table

    head, rows = rows or table_rows(groups)
    grouping = "runs that differ only by seed" if by is None else f"runs with equal {', '.join(by)}"
    caption = (f"{caption}; " if caption else (f"mean ± 95% CI (Student t) over {grouping}; "
                                               if any(g.n > 1 for g in groups) else "")) + \
        "JSD: head diversity (mean over locations and layers); expl. away: keys with sum_i pi_ij < eps"
    table = Table(title=title, caption=caption, caption_justify="left")
    for i, h in enumerate(head):
        # the one column that wraps keeps its longest word: squeezed by a wide table, it would vanish and leave
        # look-alike rows (two learning rates of one scheme) without what tells them apart
        words = [w for row in rows for w in str(row[i]).split()] if h == "config" else []
        table.add_column(h, no_wrap=h != "config", min_width=min(30, max(map(len, words + [h]))) if words else None)
    for row in rows:  # cells are text, not markup: '[eval:test-beam5]' must show
        table.add_row(*map(escape, row))
    return table
