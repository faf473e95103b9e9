"""Tuned comparisons: each scheme at its own value of the tuned options (``tune=[optim.lr]``).

A tuned sweep runs every value of the tuned options for every scheme. Here the runs of one *cell*
(groups equal in everything but the tuned options: task, scheme, heads, every other swept option)
are *candidates*; each cell chooses the candidate with the best mean **validation** value
(``best_val``, the checkpoint monitor's best: the task's ``val/bleu``, ``val/loss``, ...) over the
*selection seeds*, and the verdicts compare the chosen candidates on the **test** metrics. A
test-set number never takes part in the choice.

Protocols (``tune_seeds``): ``same seeds`` (default: the verdict seeds also choose, and the verdicts take
each choice's estimated lift off, :mod:`nas_cli.report.selection`; calibrated in
benchmarks/tuning_calibration.py, docs/tuning.json) or ``held-apart seeds`` (the listed seeds only
choose; the verdicts use the other seeds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from nas_cli.errors import UserError
from nas_cli.report.table import Group, _mark_distinct

#: words for the two protocols, as the verdicts name them
SAME, HELD = "same-seed selection", "held-apart tuning seeds"


@dataclass
class Candidate:
    """One value (or combination of values) of the tuned options in a cell."""

    values: dict[str, Any]
    group: Group
    val: dict[int, float]  # selection seed -> that run's best validation value
    mean: float | None = None


@dataclass
class Cell:
    """One cell's choice: its candidates, the chosen one, the margin to the runner-up, and warnings."""

    label: str
    candidates: list[Candidate]
    metric: str
    higher: bool
    seeds: list[int]  # the selection seeds (common to every candidate)
    chosen: Candidate | None = None
    margin: float | None = None
    edges: list[str] = field(default_factory=list)  # tuned options whose chosen value is an end of the grid
    why_not: str | None = None  # no choice: why

    @property
    def grid(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for c in self.candidates:
            for k, v in c.values.items():
                if v not in out.setdefault(k, []):
                    out[k].append(v)
        return {k: sorted(v, key=grid_order) for k, v in out.items()}


@dataclass
class Tuning:
    """What ``--tune`` did: the cells, and the groups the verdicts compare (one per cell: the chosen
    candidate, on the verdict seeds; groups outside any tuned grid as they are)."""

    keys: list[str]
    tuning_seeds: list[int]
    cells: list[Cell]
    groups: list[Group]

    @property
    def protocol(self) -> str:
        return HELD if self.tuning_seeds else SAME

    def describe(self) -> str:
        """The protocol in one sentence (the verdicts' note names it)."""
        keys = ", ".join(self.keys)
        metrics = sorted({c.metric for c in self.cells})
        by = f"the mean best {' / '.join(metrics) or 'validation'}"
        if self.tuning_seeds:
            over = (f"over the tuning seeds {','.join(map(str, self.tuning_seeds))}, which take no part in the "
                    "verdicts")
        else:
            over = "over the verdict seeds"
        lift = "" if self.tuning_seeds else (", less each choice's estimated lift (a bootstrap of the choice over "
                                              "the seeds), toward zero")
        return (f"tuned ({self.protocol}): each scheme at its own {keys}, chosen per cell by {by} {over}; "
                f"the verdicts compare the test metrics at the chosen values{lift}")


def grid_order(v):
    """The sort key of a tuned option's value: numbers by size, then the rest by name."""
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _literal(text: str):
    """A config value from the repr kept in a group's key (the key holds reprs)."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def higher_is_better(group: Group) -> bool:
    """The direction of the runs' validation metric: summary.json's ``best_val.mode`` where recorded,
    else from its name (a loss or perplexity is lower-is-better)."""
    for r in group.runs:
        mode = ((r.summary or {}).get("best_val") or {}).get("mode")
        if mode in ("min", "max"):
            return mode == "max"
    return validation_higher(None, group.runs[0].best_val_metric)


def validation_higher(mode: str | None, metric: str | None) -> bool:
    """Whether a higher validation value is better: ``mode`` (summary.json's ``best_val.mode``) where
    recorded, else from the metric's name (a loss or perplexity is lower-is-better)."""
    if mode in ("min", "max"):
        return mode == "max"
    return not any(w in str(metric or "") for w in ("loss", "ppl", "perplexity"))


def tune(groups: Sequence[Group], keys: Sequence[str], tuning_seeds: Sequence[int] = ()) -> Tuning:
    """Choose, in each cell, the value of ``keys`` with the best mean validation over the selection
    seeds (``tuning_seeds``, else the verdict seeds). Groups without a saved config, or whose runs
    lack a tuned key, are compared as they are."""
    keys = list(dict.fromkeys(keys))
    tuning_seeds = sorted(set(int(s) for s in tuning_seeds))
    cells: dict[tuple, list[tuple[dict, Group]]] = {}
    untouched: list[Group] = []
    for g in groups:
        if not g.key or g.key[0] != "config":
            untouched.append(g)
            continue
        ident = dict(g.key[2])
        if not all(k in ident for k in keys):
            untouched.append(g)
            continue
        rest = tuple((k, v) for k, v in g.key[2] if k not in keys)
        cells.setdefault((g.key[1], rest), []).append(({k: _literal(ident[k]) for k in keys}, g))
    if not cells:
        seen = sorted({k for g in groups if g.key and g.key[0] == "config" for k, _ in g.key[2]})
        hint = f"; the runs' options include {', '.join(k for k in seen if k.startswith('optim.'))}" if seen else ""
        raise UserError(f"--tune {','.join(keys)}: no run has this option in its saved config (a dotted config key "
                        f"such as optim.lr){hint}")
    out_cells, chosen_groups = [], []
    tasks = {g.common(lambda r: r.task) for members in cells.values() for _, g in members}
    for (variant, rest), members in cells.items():
        cell = _choose(members, tuning_seeds)
        if len(tasks) > 1:  # a sweep over tasks (MAD's protocol): a cell is named with its task
            cell.label = f"{members[0][1].common(lambda r: r.task)}: {cell.label}"
        out_cells.append(cell)
        if cell.chosen is not None:
            chosen_groups.append(_as_chosen(cell, ("config", variant, rest), tuning_seeds))
    _mark_distinct(chosen_groups)
    for g in chosen_groups:
        g.distinct = {k: v for k, v in g.distinct.items() if k not in keys}
    ordered = sorted(chosen_groups + untouched, key=lambda g: (g.common(lambda r: r.task), g.common(lambda r: r.scheme),
                                                               g.runs[0].heads or 0, str(g.key)))
    return Tuning(keys, tuning_seeds, out_cells, ordered)


def _choose(members: list[tuple[dict, Group]], tuning_seeds: list[int]) -> Cell:
    members.sort(key=lambda m: tuple(grid_order(m[0][k]) for k in sorted(m[0])))
    higher = higher_is_better(members[0][1])
    metric = str(members[0][1].runs[0].best_val_metric or "best validation")
    candidates = []
    for values, g in members:
        val = {}
        for r in g.runs:
            v = r.value("best_val")
            if r.seed is not None and v is not None and (not tuning_seeds or r.seed in tuning_seeds):
                val[int(r.seed)] = float(v)
        candidates.append(Candidate(values, g, val))
    common = sorted(set.intersection(*(set(c.val) for c in candidates))) if candidates else []
    label = _cell_label(members[0][1], list(members[0][0]))
    cell = Cell(label, candidates, metric, higher, common)
    if not common:
        where = f"tuning seeds {','.join(map(str, tuning_seeds))}" if tuning_seeds else "a seed"
        cell.why_not = f"its values share no {where} with a best validation value"
        return cell
    for c in candidates:
        c.mean = sum(c.val[s] for s in common) / len(common)
    ranked = sorted(candidates, key=lambda c: -c.mean if higher else c.mean)
    cell.chosen = ranked[0]
    cell.margin = abs(ranked[0].mean - ranked[1].mean) if len(ranked) > 1 else None
    for k, values in cell.grid.items():  # (a lowest value of 0, a weight decay's, has nothing below it)
        at_low = cell.chosen.values[k] == values[0] and grid_order(values[0]) != (0, 0.0, "")
        if len(values) > 1 and (at_low or cell.chosen.values[k] == values[-1]):
            cell.edges.append(k)
    if tuning_seeds:
        verdict = [r for r in cell.chosen.group.runs if r.seed not in tuning_seeds]
        if not verdict:
            cell.why_not = "it has no run at a seed outside the tuning seeds (nothing left for a verdict)"
            cell.chosen = None
    return cell


def _cell_label(group: Group, keys: list[str]) -> str:
    label = group.label
    for k in keys:  # the group's own look-alike keys may name the tuned option: the cell is without it
        label = " ".join(w for w in label.split() if not w.startswith(f"{k}="))
    return label


def _as_chosen(cell: Cell, key: tuple, tuning_seeds: list[int]) -> Group:
    g = cell.chosen.group
    runs = [r for r in g.runs if r.seed not in tuning_seeds] if tuning_seeds else list(g.runs)
    return Group(runs=runs, key=key, repeats=list(g.repeats), fields=dict(g.fields),
                 tuned={k: v for k, v in cell.chosen.values.items()}, origin=g,
                 selection=None if tuning_seeds else cell)


def parse_seeds(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(s) for s in str(text).replace("[", "").replace("]", "").split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--tuning-seeds {text}: expected seeds separated by commas, e.g. --tuning-seeds 101,102")


def from_runs(runs) -> tuple[list[str], list[int]]:
    """The tuned options and held-apart seeds the runs were launched with (``tune=``, ``tune_seeds=``)."""
    keys: list[str] = []
    seeds: set[int] = set()
    for r in runs:
        raw = (r.config or {}).get("tune") or []
        for k in [raw] if isinstance(raw, str) else raw:
            if str(k) not in keys:
                keys.append(str(k))
        raw = (r.config or {}).get("tune_seeds") or []
        seeds.update(int(s) for s in ([raw] if isinstance(raw, (int, str)) else raw))
    return keys, sorted(seeds)


def _num(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


def table(tuning: Tuning, baseline_of: dict[int, Group] | None = None) -> tuple[list[str], list[list[str]], list[dict]]:
    """The tuning table: one row per candidate (its validation value per selection seed, the mean, the
    chosen one marked with the margin to the runner-up and its warnings), and the same as records."""
    seeds = sorted({s for c in tuning.cells for s in c.seeds})
    head = ["cell", *tuning.keys, *[f"val seed {s}" for s in seeds], "mean val", "chosen", "margin to runner-up",
            "warning"]
    rows, records = [], []
    for cell in tuning.cells:
        for cand in cell.candidates:
            is_chosen = cell.chosen is cand
            warn = warnings(cell, baseline_of) if is_chosen else []
            if cell.why_not and cand is cell.candidates[0]:
                warn = [f"no choice: {cell.why_not}"]
            rows.append([cell.label, *[str(cand.values[k]) for k in tuning.keys],
                         *[_num(cand.val.get(s)) if s in cell.seeds else "-" for s in seeds], _num(cand.mean),
                         "chosen" if is_chosen else "", _num(cell.margin) if is_chosen else "", "; ".join(warn)])
            records.append({"cell": cell.label, "task": cand.group.common(lambda r: r.task),
                            "scheme": cand.group.common(lambda r: r.scheme),
                            "heads": cand.group.common(lambda r: r.heads),
                            **{k: cand.values[k] for k in tuning.keys},
                            "validation_metric": cell.metric, "higher_is_better": cell.higher,
                            "selection_seeds": list(cell.seeds),
                            **{f"val_seed_{s}": cand.val.get(s) if s in cell.seeds else None for s in seeds},
                            "mean_val": cand.mean, "chosen": is_chosen,
                            "margin_to_runner_up": cell.margin if is_chosen else None,
                            "at_edge": list(cell.edges) if is_chosen else [],
                            "protocol": tuning.protocol, "warning": "; ".join(warn)})
    return head, rows, records


def warnings(cell: Cell, baseline_of: dict[int, Group] | None = None) -> list[str]:
    """The chosen value's warnings: at an edge of the grid; another value than its baseline's."""
    out = [f"{k} at the {'lowest' if cell.chosen.values[k] == cell.grid[k][0] else 'highest'} value of the "
           f"grid: widen the grid" for k in cell.edges]
    if cell.margin == 0:
        out.append("a tie with the runner-up: the first value of the grid is taken")
    base = (baseline_of or {}).get(id(cell.chosen.group))
    if base is not None and base.tuned and base.tuned != cell.chosen.values:
        theirs = ", ".join(f"{k}={v}" for k, v in base.tuned.items())
        out.append(f"its baseline chose {theirs}")
    return out


def notes(tuning: Tuning, baseline_of: dict[int, Group] | None = None) -> list[str]:
    """One line per warning: choices at an edge of the grid, cells without a choice, and comparisons
    whose two schemes chose different values."""
    out = []
    for cell in tuning.cells:
        if cell.why_not:
            out.append(f"tuning: {cell.label} is not compared: {cell.why_not}")
            continue
        for w in warnings(cell, baseline_of):
            out.append(f"tuning: {cell.label} chose {_values(cell.chosen.values)}; {w}")
    return out


def _values(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())
