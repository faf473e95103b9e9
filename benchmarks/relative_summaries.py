"""One-off migration of committed run summaries: ``run_dir`` relative to the repository and
``wandb_dir`` relative to the run (nas-run writes them so since the code-version change; earlier
summaries named the machine they were made on, e.g. /work/main/...). Idempotent:

    python benchmarks/relative_summaries.py benchmarks/study
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def relative(summary: dict, run_dir: Path) -> dict:
    out = dict(summary)
    if isinstance(out.get("run_dir"), str) and os.path.isabs(out["run_dir"]):
        out["run_dir"] = os.path.relpath(run_dir, ROOT)
    if isinstance(out.get("wandb_dir"), str) and os.path.isabs(out["wandb_dir"]):
        old_run = summary["run_dir"] if os.path.isabs(str(summary.get("run_dir"))) else str(run_dir)
        out["wandb_dir"] = os.path.relpath(out["wandb_dir"], old_run)
    return out


def main(folders: list[str]) -> int:
    changed = 0
    for folder in folders:
        for path in sorted(Path(folder).rglob("summary*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict) or "run_dir" not in data:
                continue
            new = relative(data, path.parent.resolve())
            if new != data:
                path.write_text(json.dumps(new, indent=2))
                changed += 1
    print(f"{changed} summaries rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["benchmarks/study"]))
