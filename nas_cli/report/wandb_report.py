"""``nas-report --wandb``: the comparison as a W&B run of its own, beside the runs it compares.

W&B's grouping shows means and spreads; the verdicts over seeds, the per-seed test-set detail and
the detectable differences are nas-report's. This logs them into the runs' W&B group as a run
with job type ``report``: one W&B table per nas-report table (the rows ``--format json`` writes,
numbers as numbers), the metric-vs-heads figures, the HTML page, and the notes. Offline by
default, as the runs are (``<first PATH>/nas-report/wandb/``, uploaded with ``wandb sync``);
``--wandb online`` logs to the runs' project and entity. The run's id follows from the project,
entity and group, so running the report again replaces it: offline, the earlier folder is
removed; online, the earlier run is deleted through W&B's API first (where that fails the new
report resumes the same run and its tables replace the summary's).
"""
from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path
from typing import Any, Sequence

#: the folder under the first PATH where an offline report run is written
FOLDER = "nas-report"


def _common(values: Sequence[Any], default: Any) -> Any:
    found = {v for v in values if v}
    return next(iter(found)) if len(found) == 1 else default


def destination(runs, first_path: str) -> dict[str, Any]:
    """project, entity and group of the report run: the runs' own when they agree (else the
    default project and the first PATH's folder name as the group)."""
    def logger_key(r, key):
        return ((r.config or {}).get("logger") or {}).get(key)

    finished = [r for r in runs if r.finished]
    return {"project": _common([logger_key(r, "project") for r in finished], "nas-run"),
            "entity": _common([logger_key(r, "entity") for r in finished], None),
            "group": _common([(r.summary or {}).get("group") for r in finished], Path(first_path).resolve().name)}


def report_id(where: dict[str, Any]) -> str:
    key = f"{where['entity']}/{where['project']}/{where['group']}"
    return "report" + hashlib.sha256(key.encode()).hexdigest()[:10]


def table_records(key: str, head, rows, records) -> tuple[list[str], list[list[Any]]]:
    """A nas-report table as W&B table columns and rows: the comparison and test-set tables are
    their records (``--format json``'s rows: numbers as numbers), the others their cells as shown."""
    if key in ("comparison", "test_set", "tuning") and records:
        columns: list[str] = []
        for r in records:
            columns += [k for k in r if k not in columns and not isinstance(r[k], dict)]
        return columns, [[_value(r.get(c)) for c in columns] for r in records]
    return list(head), [list(map(str, r)) for r in rows]


def _value(v):
    if isinstance(v, tuple):
        return list(v)
    return v


def _forget_earlier(save_dir: Path, run_id: str, where: dict[str, Any], mode: str) -> None:
    for folder in (save_dir / "wandb").glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(folder, ignore_errors=True)
    if mode != "online":
        return
    try:  # replace, not add: the earlier report run goes (best effort: the new one resumes it otherwise)
        import wandb

        api = wandb.Api(timeout=20)
        path = "/".join(p for p in (where["entity"] or api.default_entity, where["project"], run_id) if p)
        api.run(path).delete()
    except Exception:  # noqa: BLE001 - no earlier run, no network or no right to delete
        pass


def log_report(sections, notes: Sequence[str], page: str, runs, groups, first_path: str, mode: str,
               title: str) -> Path:
    """Log the report run; returns its folder (offline) or the save directory (online)."""
    import os

    os.environ.setdefault("WANDB_SILENT", "true")  # its own banner says what nas-report's one line says
    import wandb
    from PIL import Image

    from nas_cli.report.html import metric_vs_heads

    where = destination(runs, first_path)
    save_dir = Path(first_path) / FOLDER
    save_dir.mkdir(parents=True, exist_ok=True)
    run_id = report_id(where)
    _forget_earlier(save_dir, run_id, where, mode)
    run = wandb.init(project=where["project"], entity=where["entity"], group=where["group"], job_type="report",
                     id=run_id, name=f"nas-report {where['group']}", dir=str(save_dir), mode=mode, resume="allow",
                     config={"title": title, "paths": [str(p) for p in {str(r.source) for r in runs if r.source}],
                             "runs": len([r for r in runs if r.finished])}, tags=["nas-report"])
    logged: dict[str, Any] = {}
    for key, table_title, head, rows, _, records in sections:
        columns, data = table_records(key, head, rows, records)
        logged[f"report/{key}"] = wandb.Table(columns=columns, data=data, allow_mixed_types=True)
    for task in sorted({g.common(lambda r: r.task) for g in groups}):
        png = metric_vs_heads(groups, task)
        if png:
            logged[f"report/figures/{task}_vs_heads"] = wandb.Image(Image.open(io.BytesIO(png)), caption=task)
    logged["report/page"] = wandb.Html(page)
    run.log(logged)
    run.summary["report/notes"] = "\n".join(notes)
    folder = Path(run.dir).parent
    run.finish()
    return folder if mode == "offline" else save_dir
