"""``nas-report``: compare finished nas-run runs (tables, plots, a self-contained HTML page).

* ``collect``: find run directories and read ``summary.json``, ``.hydra/config.yaml`` and
  ``diagnostics/*.json`` (works whether W&B was online, offline or off).
* ``table``: group runs that differ only by seed into mean +- std rows; the rich table.
* ``html``: the HTML report with embedded PNG figures (no scripts or styles from outside).
* ``cli``: the command line.
"""
from nas_cli.report.collect import Run, find_runs
from nas_cli.report.table import Group, group_runs

__all__ = ["Run", "find_runs", "Group", "group_runs"]
