"""nas-run's Hydra callbacks and its result table: :class:`RunGuard` checks the composed options
and owns the run or sweep directory before Hydra writes anything (and continues a sweep started
before); :class:`SweepSummary` prints one table for a whole sweep; :func:`summary_table` is the
table of one run or many. Named by ``hydra.callbacks`` in conf/config.yaml."""
from __future__ import annotations

import json
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write
from rich.table import Table

from nas_cli.errors import UserError, fail, print_table, say
from nas_cli.infra.launchers import ENDED_FILE, install, install_optuna
from nas_cli.infra.rundir import acquire, continuing, read_failed, release
from nas_cli.sweeps.design import tuned_options
from nas_cli.model.locations import name_from_choices
from nas_cli.sweeps.continuation import (SWEEP_CONTINUE_ENV, keep_finished_configs, keep_sweep_record, restore_all,
                                         same_sweep, sweep_overrides)
from nas_cli.sweeps.supervision import STOPPING, started_run, started_sweep
from tasks.scores import declare, present


def _fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _metric_columns(summaries: list[dict]) -> list[tuple[str, str, object]]:
    """(key, title, digits or "%") of each task's own test metrics that some summary has."""
    for s in summaries:  # each task's own test metrics: the columns that some run of this table has
        declare(s.get("metrics"))
    return [(m.key, m.title, "%" if m.fmt == "pct" else 3 if m.fmt == "p3" else 2)
            for m in present(k for s in summaries for k in s.get("test", {}))]


def _cell(value, digits) -> str:
    return "-" if value is None else f"{100 * value:.1f}%" if digits == "%" else _fmt(value, digits)


def job_line(summary: dict) -> str:
    """A finished sweep job in one line: its folder, its test metrics and how long it trained."""
    test = summary.get("test", {})
    metrics = ", ".join(f"{title} {_cell(test.get(key), digits)}" for key, title, digits in _metric_columns([summary]))
    metrics = metrics or "not tested (run_test=false)"
    return f"done: {summary['run_dir']}: {metrics} ({summary.get('fit_seconds', 0):.0f} s)"


def compare_command(root: Path, summaries: list[dict]) -> str:
    """The nas-report command that compares a sweep's runs: against UNAS when it ran, else the first scheme."""
    schemes = sorted({s["scheme"] for s in summaries})
    if len(schemes) < 2:
        return f"nas-report {root}"
    base = "unas" if "unas" in schemes else schemes[0]
    return f"nas-report {root} --baseline scheme={base}"


def summary_table(summaries: list[dict], title: str, failed: list[tuple[Path, dict]] = (),
                  options: dict[str, list[str]] | None = None) -> Table:
    """The result table; ``options``: a column per option whose values tell rows apart (a tuned sweep's
    tuned options), one value per summary."""
    options = options or {}
    lines = [f"failed: {d}: {f.get('reason', '?')}" for d, f in failed]  # the run files: a line of their own
    table = Table(title=title, caption="\n".join(lines), caption_justify="left")
    metrics = _metric_columns(summaries)
    sweep = len(summaries) + len(failed) > 1  # a sweep's rows: the seed tells apart the seeds of one config
    for col in ("task", "scheme", "heads", *options, *(["seed"] if sweep else []), "params",
                *[head for _, head, _ in metrics], "tokens/s"):
        table.add_column(col, no_wrap=True)
    for i, s in enumerate(summaries):
        test = s.get("test", {})
        cells = [_cell(test.get(key), digits) for key, _, digits in metrics]
        table.add_row(s["task"], s["scheme"], str(s["heads"]), *[values[i] for values in options.values()],
                      *([str(s.get("seed", "-"))] if sweep else []), _fmt(s["parameters"]), *cells,
                      _fmt(s.get("tokens_per_s"), 0))
    for d, _ in failed:
        table.add_row(d.name, "[bold red]failed[/]", *["-"] * (len(metrics) + 3 + sweep + len(options)))
    return table


def _option_values(root: Path, summaries: list[dict], keys: list[str]) -> dict[str, list[str]]:
    """Each job's value of each of ``keys``, from its saved config (``-`` where it cannot be read)."""
    out: dict[str, list[str]] = {k: [] for k in keys}
    for s in summaries:
        try:
            cfg = OmegaConf.load(root / Path(s["run_dir"]).name / ".hydra" / "config.yaml")
        except (OSError, ValueError):
            cfg = None
        for k in keys:
            value = OmegaConf.select(cfg, k, default=None) if cfg is not None else None
            out[k].append("-" if value is None else str(value))
    return out


class SweepSummary(Callback):
    """Hydra callback: after a multirun, print one table comparing every job, failed jobs
    included (with their one-line reason); exit non-zero if any job failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        rows = [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]
        failed = [(p.parent, read_failed(p.parent)) for p in sorted(root.glob("*/failed.json"))]
        failed = [(d, f) for d, f in failed if f and not (d / "summary.json").is_file()]
        failed += _ended_before_start(root)
        restore_all(root, config.hydra.output_subdir)
        release(root)
        tuned = tuned_options(config.get("tune"))
        if rows:
            rows.sort(key=lambda s: (s["task"], s["scheme"], s["heads"], *_option_values(root, [s], tuned).values(),
                                     s.get("seed") or 0))
        if rows or failed:
            print_table(summary_table(rows, f"nas-run sweep {root}", failed, _option_values(root, rows, tuned)))
            # a line of its own, never wrapped: the sweep's folder (a folder per job in it) and how to compare them
            print(f"run files: {root}/ (one folder per job); compare them: {compare_command(root, rows)}", flush=True)
        if failed:
            fail(f"{len(failed)} of {len(rows) + len(failed)} jobs failed (marked 'failed' above, reasons in "
                 f"their failed.json)", code=1)


def _ended_before_start(root: Path) -> list[tuple[Path, dict]]:
    """Jobs the scheduler ended before they made a run directory (nas_cli.infra.launchers), unless a later
    launch of the sweep finished them."""
    try:
        ended = json.loads((root / ENDED_FILE).read_text()) if (root / ENDED_FILE).is_file() else []
    except (OSError, ValueError):
        return []
    return [(root / f"job {e.get('job')}", {"reason": e.get("reason", "?")}) for e in ended
            if not any((d / "summary.json").is_file() for d in root.glob(f"{e.get('job')}_*"))]


class RunGuard(Callback):
    """Hydra callback, before Hydra makes the run's directory: own it (a lock: a second process in the same
    directory is refused), never in a directory that holds a finished run; and for a sweep, the checks that
    concern the sweep as a whole. A single run's own values are checked by its job
    (:func:`nas_cli.pipeline.job.run_job`), before anything is saved there."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        name_from_choices(config, config.hydra.runtime.choices)  # the config the job runs and saves
        run_dir = Path(str(config.hydra.run.dir))
        started_run(run_dir)
        try:
            if (run_dir / "summary.json").is_file() and not continuing(run_dir):
                raise UserError(f"{run_dir} already holds a finished run (summary.json); nothing was overwritten: "
                                "choose another hydra.run.dir, or train it longer with nas-run resume=<dir> "
                                "trainer.max_steps=<more>")
            acquire(run_dir)
        except UserError as err:
            fail(str(err))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from nas_cli.pipeline.checks.config import check_config
        from nas_cli.pipeline.launch.sweep_checks import check_launcher, check_tune, first_job
        from nas_cli.pipeline.launch.sweep_launcher import parallel_default

        name_from_choices(config, config.hydra.runtime.choices)  # for the check's words; each job names its own
        root = Path(str(config.hydra.sweep.dir))
        started_sweep(root)  # what a stop of this process names
        install()  # hydra/launcher=slurm: a job the scheduler ends fails alone (after Hydra loaded its plugins)
        install_optuna()  # sweep=optuna launched again: new trials in new job directories
        try:
            check_launcher(config)
            check_tune(config)
            first = first_job(config)  # the sweep's default values of what it sweeps may not be any job's
            name_from_choices(first, first.hydra.runtime.choices)
            checked = check_config(_with_a_seed(first))
            _say_notes(checked)
            parallel_default(config, checked.parameters)  # on the CPU: the jobs several at a time
            if any(root.glob("*/summary.json")) or any(root.glob("*/checkpoints")):
                _continue_sweep(root, config)
            acquire(root, "sweep")
            (root / STOPPING).unlink(missing_ok=True)  # left by a stop this sweep's process did not outlive
            if not (root / "multirun.yaml").is_file():  # what a later launch is compared with (Hydra's basic
                OmegaConf.save(config, root / "multirun.yaml")  # sweeper writes it too; Optuna's does not)
        except UserError as err:
            fail(str(err))
        _say_jobs(config, root)  # once every refusal is past


#: Hydra's launchers' own lines on the terminal (their job list, one line per job as each starts, and
#: joblib's settings): nas-run says what runs in one line, each job's overrides are in its folder
LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher", "hydra_plugins.hydra_joblib_launcher._core",
                    "hydra_plugins.hydra_joblib_launcher.joblib_launcher")


def _say_jobs(config: DictConfig, root: Path) -> None:
    """The sweep's jobs in one line: what varies, and what each job adds."""
    import logging

    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides([str(x) for x in config.hydra.overrides.task])
    swept = [o.input_line for o in overrides if o.is_sweep_override() or str(o.value()) == "auto"]
    fixed = [o.input_line for o in overrides if o.input_line not in swept]
    from rich.markup import escape

    line = f"nas-run: sweep {root}: {' x '.join(swept) or 'one job'}" + (f" (each job: {' '.join(fixed)})" if fixed else "")
    say(escape(line), log=False)  # values such as tune=[optim.lr] are text, not markup
    say(escape(f"nas-run: each job's progress is in its own log: {root}/<job>/nas_run.log"), log=False)
    for name in LAUNCHER_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _say_notes(checked) -> None:
    """The pre-run check's notes, once, before Hydra starts (each job records them in its log)."""
    for note in checked.notes:
        say(f"nas-run: note: {note}", log=False)


def _with_a_seed(config: DictConfig) -> DictConfig:
    """seed=auto: the sequential sweeper gives each job its seed; the check sees the first."""
    if str(config.get("seed")) != "auto":
        return config
    checked = config.copy()
    with read_write(checked):
        checked.seed = 1
    return checked


def _continue_sweep(root: Path, config: DictConfig) -> None:
    """A sweep directory that holds finished or started jobs: the same sweep continues (finished
    jobs skipped, their saved configs kept); another sweep's overrides are refused."""
    now = [str(o) for o in config.hydra.overrides.task]
    if not same_sweep(root, now):
        before = sweep_overrides(root) or []
        added, missing = [o for o in now if o not in before], [o for o in before if o not in now]
        what = "; ".join(part for part in (f"this command adds {' '.join(added)}" if added else "",
                                           f"leaves out {' '.join(missing)}" if missing else "") if part)
        raise UserError(f"{root} holds a sweep of other overrides ({' '.join(before or ['?'])}"
                        f"{': ' + what if before and what else ''}); nothing was overwritten: choose another "
                        "hydra.sweep.dir, or repeat that sweep's exact command to continue it")
    acquire(root, "sweep")  # first: a sweep still running there is refused before anything is said
    os.environ[SWEEP_CONTINUE_ENV] = str(root.resolve())
    if "optuna" not in str(config.hydra.sweeper.get("_target_", "")):  # Optuna: new trials, new dirs
        keep_finished_configs(root, config.hydra.output_subdir)
    keep_sweep_record(root)
    done = len(list(root.glob("*/summary.json")))
    say(f"[bold yellow]nas-run: continuing the sweep in {root}:[/] {done} finished job(s) are skipped, "
        "unfinished ones resume from their checkpoints")
