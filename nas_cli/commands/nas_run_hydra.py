"""nas-run's Hydra callbacks and its result table: :class:`RunGuard` checks the composed options
and owns the run or sweep directory before Hydra writes anything (and continues a sweep started
before); :class:`SweepSummary` prints one table for a whole sweep; :func:`summary_table` is the
table of one run or many. Named by ``hydra.callbacks`` in conf/config.yaml."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write
from rich.console import Console
from rich.table import Table

from nas_cli.errors import UserError
from nas_cli.infra.rundir import continuing


def _fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def summary_table(summaries: list[dict], title: str, failed: list[tuple[Path, dict]] = ()) -> Table:
    lines = [f"run files: {s['run_dir']}" for s in summaries]
    lines += [f"failed: {d}: {f.get('reason', '?')}" for d, f in failed]
    lines += [s["tested"]["line"] for s in summaries if len(summaries) == 1 and s.get("tested")]
    table = Table(title=title, caption="\n".join(lines), caption_justify="left")
    # each task's own test metrics: the columns that some run of this table has
    from nas_cli.metrics import declare, present

    for s in summaries:
        declare(s.get("metrics"))
    metrics = [(m.key, m.title, "%" if m.fmt == "pct" else 3 if m.fmt == "p3" else 2)  # a task's own metrics too
               for m in present(k for s in summaries for k in s.get("test", {}))]
    sweep = len(summaries) + len(failed) > 1  # a sweep's rows: the seed tells apart the seeds of one config
    for col in ("task", "scheme", "heads", *(["seed"] if sweep else []), "params", *[head for _, head, _ in metrics],
                "tokens/s"):
        table.add_column(col, no_wrap=True)
    for s in summaries:
        test = s.get("test", {})
        cells = []
        for key, _, digits in metrics:
            v = test.get(key)
            cells.append("-" if v is None else f"{100 * v:.1f}%" if digits == "%" else _fmt(v, digits))
        table.add_row(s["task"], s["scheme"], str(s["heads"]), *([str(s.get("seed", "-"))] if sweep else []),
                      _fmt(s["parameters"]), *cells, _fmt(s.get("tokens_per_s"), 0))
    for d, _ in failed:
        table.add_row(d.name, "[bold red]failed[/]", *["-"] * (len(metrics) + 3 + sweep))
    return table


def _console() -> Console:
    # logs and CI are not terminals: give tables room instead of rich's 80 columns
    return Console() if sys.stdout.isatty() else Console(width=120)


class SweepSummary(Callback):
    """Hydra callback: after a multirun, print one table comparing every job, failed jobs
    included (with their one-line reason); exit non-zero if any job failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from nas_cli.infra.rundir import read_failed, release

        root = Path(config.hydra.sweep.dir)
        rows = [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]
        failed = [(p.parent, read_failed(p.parent)) for p in sorted(root.glob("*/failed.json"))]
        failed = [(d, f) for d, f in failed if f and not (d / "summary.json").is_file()]
        failed += _ended_before_start(root)
        for kept in root.glob(f"*/{KEPT_CONFIGS}"):  # a finished job this launch did not reach (a sweeper of
            restore_finished_configs(kept.parent, config.hydra.output_subdir)  # its own): nothing left aside
        release(root)
        if rows:
            rows.sort(key=lambda s: (s["task"], s["scheme"], s["heads"]))
        if rows or failed:
            _console().print(summary_table(rows, f"nas-run sweep {root}", failed))
        if failed:
            _fail(f"{len(failed)} of {len(rows) + len(failed)} jobs failed (marked 'failed' above, reasons in "
                  f"their failed.json)", code=1)


def _ended_before_start(root: Path) -> list[tuple[Path, dict]]:
    """Jobs the scheduler ended before they made a run directory (nas_cli.infra.launchers), unless a later
    launch of the sweep finished them."""
    from nas_cli.infra.launchers import ENDED_FILE

    try:
        ended = json.loads((root / ENDED_FILE).read_text()) if (root / ENDED_FILE).is_file() else []
    except (OSError, ValueError):
        return []
    return [(root / f"job {e.get('job')}", {"reason": e.get("reason", "?")}) for e in ended
            if not any((d / "summary.json").is_file() for d in root.glob(f"{e.get('job')}_*"))]


def _fail(message: str, code: int = 2, kind: str = "error", color: str = "red"):
    Console(stderr=True).print(f"[bold {color}]nas-run: {kind}:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)


#: set when a sweep is launched again into its own directory: finished jobs are skipped
SWEEP_CONTINUE_ENV = "NAS_RUN_SWEEP_CONTINUE"


def _sweep_overrides(root: Path) -> list[str] | None:
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
    from nas_cli.infra.config_identity import ignored

    return [o for o in overrides if not ignored(o.split("=", 1)[0].lstrip("+~").split("@", 1)[0])]


#: where a continued sweep keeps a finished job's saved configs while Hydra writes the job's again
KEPT_CONFIGS = ".nas-run-kept-configs"


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


#: the run or sweep directory this process started ("run" / "sweep"), for a stop's one line
STARTED: dict[str, Path] = {}
#: in a sweep directory while its joblib sweep stops: a job that starts then leaves at once (nas_run.main)
STOPPING = ".nas-run-stopping"


class RunGuard(Callback):
    """Hydra callback, before Hydra writes anything: check the composed options (one line per
    problem), never start in a directory that holds a finished run or sweep, and own the
    directory (a lock: a second process in the same directory is refused)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from nas_cli.checks import check_config
        from nas_cli.infra.rundir import acquire

        run_dir = Path(str(config.hydra.run.dir))
        STARTED["run"] = run_dir
        try:
            check_config(config)
            if (run_dir / "summary.json").is_file() and not continuing(run_dir):
                raise UserError(f"{run_dir} already holds a finished run (summary.json); nothing was overwritten: "
                                "choose another hydra.run.dir, or train it longer with nas-run resume=<dir> "
                                "trainer.max_steps=<more>")
            acquire(run_dir)
        except UserError as err:
            _fail(str(err))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from nas_cli.checks import check_config, check_launcher
        from nas_cli.infra.rundir import acquire

        root = Path(str(config.hydra.sweep.dir))
        STARTED["sweep"] = root  # what a stop of this process names (nas_run.main)
        from nas_cli.infra.launchers import install, install_optuna

        install()  # hydra/launcher=slurm: a job the scheduler ends fails alone (after Hydra loaded its plugins)
        install_optuna()  # sweep=optuna launched again: new trials in new job directories
        try:
            check_launcher(config)
            checked = config
            if str(config.get("seed")) == "auto":  # seed=auto: the sequential sweeper gives each job its seed
                checked = config.copy()
                with read_write(checked):
                    checked.seed = 1
            check_config(checked)
            if any(root.glob("*/summary.json")) or any(root.glob("*/checkpoints")):
                earlier = _sweep_overrides(root)
                now = [str(o) for o in config.hydra.overrides.task]
                if earlier is None or setup_overrides(earlier) != setup_overrides(now):
                    raise UserError(f"{root} holds a sweep of other overrides ({' '.join(earlier or ['?'])}); "
                                    "nothing was overwritten: choose another hydra.sweep.dir, or repeat that sweep's "
                                    "exact command to continue it")
                acquire(root, "sweep")  # first: a sweep still running there is refused before anything is said
                os.environ[SWEEP_CONTINUE_ENV] = str(root.resolve())
                if "optuna" not in str(config.hydra.sweeper.get("_target_", "")):  # Optuna: new trials, new dirs
                    keep_finished_configs(root, config.hydra.output_subdir)
                done = len(list(root.glob("*/summary.json")))
                Console(stderr=True).print(f"[bold yellow]nas-run: continuing the sweep in {root}:[/] {done} finished "
                                           "job(s) are skipped, unfinished ones resume from their checkpoints",
                                           highlight=False, soft_wrap=True)
            acquire(root, "sweep")
            (root / STOPPING).unlink(missing_ok=True)  # left by a stop this sweep's process did not outlive
            if not (root / "multirun.yaml").is_file():  # what a later launch is compared with (Hydra's basic
                OmegaConf.save(config, root / "multirun.yaml")  # sweeper writes it too; Optuna's does not)
        except UserError as err:
            _fail(str(err))
