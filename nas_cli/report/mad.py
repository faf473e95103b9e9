"""MAD's score (Poli et al. 2024): per architecture, each MAD task's test score and their mean.

MAD-lab trains every task over a learning-rate x weight-decay grid, keeps the best run per task and
averages the tasks' accuracies into one number per architecture. Here the runs of a sweep over
``task=mad_*`` (``experiment=mad_protocol``) are grouped as nas-report groups them; a tuned sweep's
groups are the values chosen on validation (nas_cli/report/tuning.py; MAD-lab chooses on its test set,
which has no validation split). For each system (scheme, heads and every option that is not the task's)
and seed, the MAD score of that seed is the mean over the tasks of ``test/mad_acc``; the table gives,
per task and for the score, the mean over seeds with a 95% Student-t interval over seeds: how much the
number would move with another set of seeds, which MAD-lab's single-seed score does not say.
"""
from __future__ import annotations

from typing import Sequence

from nas_cli.report.stats import t_interval

METRIC = "test/mad_acc"


def _system(group) -> str:
    """The group's label without the task and without its tuned values (chosen per task)."""
    extra = " ".join(f"{k}={v}" for k, v in {**group.fields, **group.distinct}.items())
    return f"{group.common(lambda r: r.scheme)} h{group.common(lambda r: r.heads)}" + (f" {extra}" if extra else "")


def scores(groups: Sequence) -> dict[str, dict[str, dict[int, float]]]:
    """{system: {task: {seed: test/mad_acc}}} of the groups whose runs report MAD's score."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for g in groups:
        per_seed = {}
        for r in g.runs:
            v = r.value(METRIC)
            if v is not None and r.seed is not None:
                per_seed[int(r.seed)] = float(v)
        if per_seed:
            out.setdefault(_system(g), {})[g.common(lambda r: r.task)] = per_seed
    return out


def _cell(values: Sequence[float]) -> str:
    got = t_interval(values)
    if got is None:
        return "-"
    m, low, high, n = got
    if n < 2:
        return f"{100 * m:.1f}% (n=1)"
    return f"{100 * m:.1f}% [{100 * low:.1f}, {100 * high:.1f}] (n={n})"


def mad_section(groups: Sequence) -> list[tuple]:
    """The MAD table (one row per system), or nothing when no run reports MAD's score."""
    found = scores(groups)
    if not found:
        return []
    tasks = sorted({t for per_task in found.values() for t in per_task})
    head = ["system", *tasks, "MAD score (mean over tasks)", "seeds"]
    rows, records = [], []
    for system, per_task in found.items():
        common = sorted(set.intersection(*(set(per_task.get(t, {})) for t in tasks)))
        per_seed = [sum(per_task[t][s] for t in tasks) / len(tasks) for s in common]
        rows.append([system, *[_cell(list(per_task.get(t, {}).values())) for t in tasks],
                     _cell(per_seed) if common else "- (a task is missing)", ",".join(map(str, common)) or "-"])
        got = t_interval(per_seed)
        means = {t: t_interval(list(per_task.get(t, {}).values())) for t in tasks}
        records.append({"system": system, **{t: m[0] if m else None for t, m in means.items()},
                        "mad_score": got[0] if got else None,
                        "ci_low": got[1] if got and got[3] > 1 else None,
                        "ci_high": got[2] if got and got[3] > 1 else None,
                        "n": len(per_seed), "seeds": common, "tasks": tasks})
    note = (f"MAD's score: each task's test/mad_acc (MAD-lab's class-balanced accuracy) at the chosen values, and "
            f"their mean over the {len(tasks)} task(s) found per seed; [low, high]: 95% t interval over seeds. "
            "MAD's benchmark averages its six tasks" + ("" if len(tasks) >= 6 else
                                                        f"; only {', '.join(tasks)} are here"))
    return [("mad", "MAD score (Poli et al. 2024): per task and averaged, over seeds", head, rows, note, records)]
