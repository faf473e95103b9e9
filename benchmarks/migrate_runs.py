"""Migrate committed run directories (``benchmarks/study``) to the layout nas-run writes now, once,
so that the code reads one layout. Idempotent:

    python benchmarks/migrate_runs.py benchmarks/study

* ``summary.json``: ``run_dir`` relative to the repository and ``wandb_dir`` relative to the run
  (earlier summaries named the machine they were made on, e.g. /work/main/...);
* ``diagnostics/summary.json``: the numbers the diagnostics declare for nas-report (``reported``,
  from the shipped default diagnostics, which made these runs) in place of the earlier
  ``columns``, and HNAS's ``u_history`` as the generic ``learned_history``;
* ``.hydra/config.yaml`` and ``multirun.yaml``: without ``log_u_every``, HNAS's own logging
  schedule, which ``log_learned_every`` (every scheme's learned values) replaced; it changed only
  what was logged, so the runs stay the same setup (config_id ignores the logging keys);
* ``.hydra/hydra.yaml`` and ``multirun.yaml``: the run-directory tag's resolver with the task and
  the model beside the attention node (``${nas.tag:${attention},${task._target_},${model}}``: the
  tag names the locations the model has), as conf/config.yaml writes it.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the title HNAS gives its learned u (nas_cli/attention/hnas.py), for runs that recorded u_history
U_TITLE = "HNAS u per layer and head (1 = DNAS, 0 = UNAS)"


def relative(summary: dict, run_dir: Path) -> dict:
    out = dict(summary)
    if isinstance(out.get("run_dir"), str) and os.path.isabs(out["run_dir"]):
        out["run_dir"] = os.path.relpath(run_dir, ROOT)
    if isinstance(out.get("wandb_dir"), str) and os.path.isabs(out["wandb_dir"]):
        old_run = summary["run_dir"] if os.path.isabs(str(summary.get("run_dir"))) else str(run_dir)
        out["wandb_dir"] = os.path.relpath(out["wandb_dir"], old_run)
    return out


def declared(diagnostics: dict) -> dict:
    from nas_cli.diagnostics.locations import reported_numbers
    from nas_cli.diagnostics.metrics import build_metrics

    out = dict(diagnostics)
    if "u_history" in out:
        out["learned_history"] = [{"step": h["step"], "values": {"u": h["u"]}} for h in out.pop("u_history")]
        out["learned_titles"] = {"u": U_TITLE}
    if "reported" not in out:
        out.pop("columns", None)
        learned = list(out.get("learned_titles") or {})
        out["reported"] = [r._asdict() for r in reported_numbers(build_metrics(None, out.get("eps", 1e-8)), learned)]
    return out


#: top-level config keys nas-run no longer has, removed from the saved configs
RETIRED = ("log_u_every",)


#: the run-directory tag as saved before, and as nas-run writes it now
OLD_TAG, TAG = "${nas.tag:${attention}}", "${nas.tag:${attention},${task._target_},${model}}"


def without_retired(text: str) -> str:
    """A saved config's text without the top-level lines of :data:`RETIRED`, and with today's tag
    resolver (nothing else touched)."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith(tuple(f"{k}:" for k in RETIRED))).replace(OLD_TAG, TAG)


def main(folders: list[str]) -> int:
    changed = 0
    for folder in folders:
        for path in sorted([*Path(folder).rglob("config.yaml"), *Path(folder).rglob("hydra.yaml"),
                            *Path(folder).rglob("multirun.yaml")]):
            text = path.read_text()
            if without_retired(text) != text:
                path.write_text(without_retired(text))
                changed += 1
        for path in sorted(Path(folder).rglob("summary*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            if path.parent.name == "diagnostics" and "locations" in data:
                new = declared(data)
            elif "run_dir" in data:
                new = relative(data, path.parent.resolve())
            else:
                continue
            if new != data:
                path.write_text(json.dumps(new, indent=2))
                changed += 1
    print(f"{changed} files rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["benchmarks/study"]))
