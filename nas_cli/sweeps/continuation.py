"""A sweep launched again into its own directory is the same sweep.

The command that made a sweep directory, repeated (its overrides in any order, with or without
logging-only keys), continues it: its jobs keep their numbers and directories, finished jobs are
skipped with their saved configs kept as they were, unfinished ones resume from their checkpoints.
A sweep of other overrides is refused before anything is written (``pipeline.launch.callbacks.RunGuard``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from nas_cli.infra.config_identity import ignored

#: set when a sweep is launched again into its own directory: finished jobs are skipped
SWEEP_CONTINUE_ENV = "NAS_RUN_SWEEP_CONTINUE"
#: where a continued sweep keeps a finished job's saved configs while Hydra writes the job's again
KEPT_CONFIGS = ".nas-run-kept-configs"
#: the first launch's multirun.yaml while a continued sweep's launch runs (keep_sweep_record)
KEPT_RECORD = ".multirun.first.yaml"


def sweep_overrides(root: Path) -> list[str] | None:
    """The task overrides of the sweep that made ``root`` (its multirun.yaml), None if unknown."""
    try:
        saved = OmegaConf.load(root / "multirun.yaml")
        return [str(o) for o in saved.hydra.overrides.task]
    except Exception:  # noqa: BLE001 - missing or damaged: cannot tell it is the same sweep
        return None


def setup_overrides(overrides: list[str]) -> list[str]:
    """The overrides that define a sweep's setup: those of keys that change only what is logged or
    shown (``progress_bar``, ``logger``, ...: config_identity.IGNORED_KEYS) left out, so that a sweep
    continued without ``progress_bar=false``, or with another logger, is the same sweep."""
    return [o for o in overrides if not ignored(o.split("=", 1)[0].lstrip("+~").split("@", 1)[0])]


def same_sweep(root: Path, overrides: list[str]) -> bool:
    """``overrides`` set up the sweep that made ``root`` (the same sweep, continued)."""
    earlier = sweep_overrides(root)
    return earlier is not None and setup_overrides(earlier) == setup_overrides(overrides)


def saved_sweep_order(argv: list[str]) -> list[str]:
    """A sweep continued with its overrides typed in another order (``attention=a,b seed=1,2`` for
    ``seed=1,2 attention=a,b``) is the same sweep: the overrides are put back in the order the sweep
    directory recorded, so that its jobs keep their numbers (and directories)."""
    if "-m" not in argv:
        return argv
    sweep = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")), None)
    if not sweep:
        return argv
    saved = sweep_overrides(Path(sweep.strip("'\"")))
    task = [a for a in argv if a != "-m" and not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    if not saved:
        return argv
    now, before = setup_overrides(task), setup_overrides(saved)  # logging-only keys may differ
    if now == before or sorted(now) != sorted(before):
        return argv
    rest = [a for a in argv if a == "-m" or a not in task]
    return [*rest, *before, *[a for a in task if a not in now]]


def keep_finished_configs(root: Path, output_subdir) -> None:
    """Before a continued sweep's launcher runs: Hydra writes every job's configs (``.hydra/``) again,
    also those of a job that finished in an earlier launch and is skipped, whose saved configs must
    keep saying what ran (the same overrides typed in another order, a changed preset). Copy them
    aside; :func:`restore_finished_configs` puts them back when the job is skipped. A copy left by
    a killed launch is kept: it holds the originals."""
    if output_subdir is None:
        return
    for summary in root.glob("*/summary.json"):
        saved, kept = summary.parent / str(output_subdir), summary.parent / KEPT_CONFIGS
        if saved.is_dir() and not kept.exists():
            shutil.copytree(saved, kept)


def restore_finished_configs(run_dir: Path, output_subdir) -> None:
    """A skipped job's saved configs back as its finished run wrote them (see keep_finished_configs)."""
    kept = run_dir / KEPT_CONFIGS
    if output_subdir is None or not kept.is_dir():
        return
    saved = run_dir / str(output_subdir)
    for f in kept.iterdir():
        shutil.copy2(f, saved / f.name)
    shutil.rmtree(kept)


def keep_sweep_record(root: Path) -> None:
    """Before a continued sweep's sweeper runs: Hydra writes ``multirun.yaml`` again (this launch's
    working directory, its logging-only overrides), though the sweep is the one the first launch
    recorded. Copy the record aside; :func:`restore_sweep_record` puts it back, so that continuing a
    sweep kept in git (the study's) leaves its files as they were."""
    record, kept = root / "multirun.yaml", root / KEPT_RECORD
    if record.is_file() and not kept.exists():
        shutil.copy2(record, kept)


def restore_sweep_record(root: Path) -> None:
    kept = root / KEPT_RECORD
    if kept.is_file():
        os.replace(kept, root / "multirun.yaml")


def restore_all(root: Path, output_subdir) -> None:
    """At a sweep's end: finished jobs this launch did not reach (a sweeper of its own) get their
    saved configs back, the sweep its first record; nothing is left aside."""
    for kept in root.glob(f"*/{KEPT_CONFIGS}"):
        restore_finished_configs(kept.parent, output_subdir)
    restore_sweep_record(root)
