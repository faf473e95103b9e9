"""One job of ``nas-run``: a single run, or one job of a sweep (Hydra's task function).

It prepares the job's directory (refusals that depend on the launcher, a sweep job's saved configs
redacted, the directory locked), checks the job's values (a single run's ``.hydra/`` is written once
they pass), trains unless a continued sweep finished the job before, and prints its result. What a
failure leaves behind: a refusal leaves the directory as it was; a bad value in a single run leaves
no directory it made, and one it did not make as it was; a failed sweep job is recorded in
``failed.json`` and the sweep goes on (its value NaN); a stop says how to continue.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write

from nas_cli.errors import Refused, Stopped, UserError, fail, print_table, quiet_libraries, record, record_table, say
from nas_cli.infra import ray_train
from nas_cli.infra.redaction import redact
from nas_cli.infra.atomic import atomic_write_text
from nas_cli.infra.rundir import (SAVE_CONFIG_ENV, acquire, as_refusal, clear_failed, continuing, mark_failed, release,
                                  remove_empty_parents)
from nas_cli.model.locations import name_from_choices
from nas_cli.pipeline.launch.callbacks import job_line, summary_table
from nas_cli.infra.launchers import spawns_processes
from nas_cli.sweeps.continuation import SWEEP_CONTINUE_ENV, restore_finished_configs, restore_sweep_record
from nas_cli.sweeps.supervision import STOPPING


def _one_gpu_per_job(cfg: DictConfig, job_num: int) -> None:
    """hydra/launcher=joblib: job i trains on GPU i mod G (nas_cli.infra.launchers.joblib_gpu)."""
    import torch

    from nas_cli.infra.launchers import joblib_gpu

    try:
        chosen = joblib_gpu(job_num, torch.cuda.device_count(), cfg.trainer.get("accelerator", "auto"),
                            cfg.trainer.get("devices", 1))
    except UserError as err:
        fail(str(err))
    if chosen is not None:
        with read_write(cfg):
            cfg.trainer.devices = chosen


def _as_single_run(hc, run_dir: Path) -> None:
    """Lightning starts the other processes of a DDP job by running this command again with
    ``hydra.run.dir`` set to Hydra's run directory. In a sweep, make that command this job alone
    (its own overrides) in this job's directory."""
    sys.argv = [sys.argv[0], *hc.overrides.task]
    with read_write(hc):
        hc.run.dir = str(run_dir)


def run_job(cfg: DictConfig):
    """One job of ``nas-run`` (a single run, or one job of a sweep): prepare its directory, train
    unless a continued sweep finished it before, print its result. Returns what a sweeper
    optimizes (the best validation value; NaN for a failed or refused sweep job)."""
    quiet_libraries()  # again: a joblib worker process runs the job without nas-run's main()
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and (Path(hc.sweep.dir) / STOPPING).exists():  # the sweep is stopping: start nothing new
        return float("nan")
    optuna = "optuna" in str(hc.sweeper.get("_target_", ""))
    group = _prepare_job(cfg, hc, run_dir, multirun, optuna)
    if multirun and (run_dir / "summary.json").is_file() and os.environ.get(SWEEP_CONTINUE_ENV):
        restore_finished_configs(run_dir, hc.output_subdir)
        return _finished_before(run_dir)
    summary = _train_job(cfg, hc, run_dir, group, multirun)
    if not isinstance(summary, dict):  # another process of a multi-process run (None), or a failed sweep job
        return summary
    if multirun:  # the sweep's terminal: one line per job; the job's table goes to its own log
        say(job_line(summary), log=False)
        record_table(summary_table([summary], "nas-run result"))
    else:
        print_table(summary_table([summary], "nas-run result"))
        print(f"run files: {summary['run_dir']}", flush=True)  # lines of their own: never wrapped mid-path
        if summary.get("tested"):  # it may say why an earlier step was tested
            print(summary["tested"]["line"], flush=True)
    if summary.get("wandb_run_id") and str(cfg.logger.get("mode")) == "offline" and not multirun:
        say(f"W&B run {summary['wandb_run_id']} (offline): {run_dir / 'wandb'}; upload it with: wandb sync "
            f"{run_dir / 'wandb'}/offline-run-*")
    record(f"finished: {summary['steps']} steps; best {summary['best_val']['metric']} = {summary['best_val']['value']}; "
           f"test: {json.dumps(summary['test'])}")
    value = summary["best_val"]["value"]
    if optuna and (value is None or math.isnan(value)):  # optuna cannot rank a trial without a value
        fail(f"sweep=optuna: the trial in {run_dir} has no {summary['best_val']['metric']} to optimize (no "
             "validation ran); make it validate at least once (trainer.val_check_interval <= trainer.max_steps)")
    return float("nan") if value is None else float(value)  # what a sweeper (optuna) optimizes


def _prepare_job(cfg: DictConfig, hc, run_dir: Path, multirun: bool, optuna: bool) -> str:
    """Refusals that depend on the launcher, the saved configs redacted, the run directory
    locked for this process. Returns the W&B group."""
    from pytorch_lightning.utilities import rank_zero_only

    from nas_cli.infra.redaction import redact_files

    # the W&B group is written to summary.json, the checkpoints and the W&B run: a secret typed into it
    # (logger.group="api_key=...") is masked there as in .hydra/
    group = redact(str(cfg.logger.get("group") or (Path(hc.sweep.dir).name if multirun else str(cfg.task.name))))
    if multirun:
        if "joblib" in str(hc.launcher.get("_target_", "")) and spawns_processes(cfg.trainer):
            fail("hydra/launcher=joblib runs each job in a worker process that cannot start DDP/FSDP processes; "
                 "use one device per job (trainer.devices=1) or the basic launcher / hydra/launcher=slurm")
        if "joblib" in str(hc.launcher.get("_target_", "")):
            _one_gpu_per_job(cfg, int(hc.job.num))
        _as_single_run(hc, run_dir)
    if optuna:
        _check_validates(cfg.trainer)
    named = name_from_choices(cfg, hc.runtime.choices)  # a sweep job's config is composed afresh, without them
    if rank_zero_only.rank == 0 and hc.output_subdir is not None:
        saved = run_dir / str(hc.output_subdir)
        if named:  # Hydra saved it before the job began: a resumed run reads its schemes' names from there
            atomic_write_text(saved / "config.yaml", OmegaConf.to_yaml(cfg))
        redact_files(saved / "config.yaml", saved / "hydra.yaml", saved / "overrides.yaml",
                     *([Path(hc.sweep.dir) / "multirun.yaml"] if multirun else []))
    if multirun:
        restore_sweep_record(Path(hc.sweep.dir))  # a continued sweep keeps its first launch's record
    try:
        acquire(run_dir)  # a single run took it before Hydra made the directory (RunGuard); a sweep job here
    except UserError as err:  # another process owns it: write nothing there
        fail(str(err))
    return group


def _finished_before(run_dir: Path) -> float:
    """A continued sweep: this job finished in an earlier launch; skipped, its value returned."""
    release(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    say(f"nas-run: {run_dir.name}: finished in an earlier launch of this sweep: skipped")
    value = (summary.get("best_val") or {}).get("value")
    return float("nan") if value is None else float(value)


def _train_job(cfg: DictConfig, hc, run_dir: Path, group: str, multirun: bool):
    """Check and train. A refusal leaves the directory as it was; a failure is recorded in
    failed.json (a sweep goes on with its other jobs: NaN); a stop says how to continue. The one place
    where a job's failure becomes its outcome: a line, failed.json, the exit code."""
    from nas_cli.pipeline.run import train  # heavy imports after Hydra has parsed the command line

    kept = {p: (p.read_bytes() if p.is_file() else None)  # what a refused resume must leave as it was
            for p in (run_dir / ".hydra" / "resumes.yaml", run_dir / "failed.json")}
    log = run_dir / "nas_run.log"  # the job's log, opened by Hydra: a refusal's lines are cut off again
    logged = log.stat().st_size if log.is_file() else None
    checking = True  # a refusal of a value: a single run leaves no directory behind
    try:
        checked = _checked(cfg, hc, run_dir, multirun)
        checking = False
        size = (checked.parameters, checked.exact) if checked.parameters is not None else None
        job_type = "sweep" if multirun else "train"
        if ray_train.on_ray(cfg):  # the same training in each Ray Train worker
            summary = ray_train.fit(train, cfg, run_dir, checked.plan, run_dir, group, job_type=job_type, size=size)
        else:
            summary = train(cfg, checked.plan, run_dir, group, job_type=job_type, size=size, task=checked.task)
    except Refused as err:  # nothing ran: put back what this attempt touched, write nothing
        _put_back(kept, log, logged)
        release(run_dir)
        return _job_error(run_dir, "refused", str(err), multirun)
    except UserError as err:
        if checking and not multirun:  # a bad value: leave nothing behind, and a directory as it was
            if _only_this_invocation(run_dir):
                release(run_dir)
                _remove_empty_run(run_dir)
            else:
                _put_back(kept, log, logged)
                release(run_dir)
            fail(str(err), log=False)
        return _job_error(run_dir, "failed", str(err), multirun, record=True)
    except Stopped as stop:
        release(run_dir)
        fail(str(stop), stop.code, kind="stopped", color="yellow")
    except Exception as err:  # noqa: BLE001 - an unexpected error: a sweep goes on with its other jobs
        if not multirun:
            raise
        reason = error_line(err)
        first = first_error(err)
        if first is not err:  # an error while handling another (Lightning's teardown after a failed start, say)
            reason = f"{error_line(first)} (then, while handling it: {reason})"
        (run_dir / "failed.traceback.txt").write_text(traceback.format_exc())
        return _job_error(run_dir, "failed", reason, multirun, record=True, code=1,
                          why=f"{reason} (traceback in {run_dir / 'failed.traceback.txt'})")
    release(run_dir)
    return summary


def _checked(cfg: DictConfig, hc, run_dir: Path, multirun: bool):
    """The job's checks, once each: its values (check_config: the plan, the model's size, the task ready to
    set up) and Lightning's own refusals (precision, accelerator, unknown options), before any data. A resumed
    run refused here is left as it was; one that passes records its overrides. A single run's saved configs
    are written once they pass (:func:`_save_configs`); its notes are said, a sweep job's recorded (the sweep
    said them once)."""
    from nas_cli.pipeline.checks.config import check_config  # heavy imports after Hydra has parsed the command line
    from nas_cli.pipeline.trainer import check_trainer

    try:
        checked = check_config(cfg)
        check_trainer(cfg)
    except UserError as err:  # a resumed run refused before it ran is left as it was, untouched
        raise as_refusal(err, run_dir) from None
    _save_configs(cfg, run_dir)
    if continuing(run_dir):
        record_resume(run_dir, list(hc.overrides.task))
    clear_failed(run_dir)
    for note in checked.notes:
        if not multirun:
            say(f"nas-run: note: {note}", log=False)
        record(f"note: {note}")
    return checked


def _save_configs(cfg: DictConfig, run_dir: Path) -> None:
    """A single run's ``.hydra/`` (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes them, secrets
    masked), written by the job once its checks pass: nas-run asked Hydra to write none
    (:func:`nas_cli.pipeline.launch.command_line.saved_by_the_job`)."""
    import copy

    from pytorch_lightning.utilities import rank_zero_only

    from nas_cli.infra.redaction import redact_files

    subdir = os.environ.get(SAVE_CONFIG_ENV)
    hydra_cfg = copy.deepcopy(HydraConfig.instance().cfg)
    if not subdir or hydra_cfg.hydra.output_subdir is not None or continuing(run_dir) or rank_zero_only.rank != 0:
        return
    OmegaConf.set_readonly(hydra_cfg, False)  # Hydra's copy is read-only at every level
    with read_write(hydra_cfg.hydra):
        hydra_cfg.hydra.output_subdir = subdir  # where they are, as Hydra would have recorded it
        hydra_cfg.hydra.overrides.hydra = [o for o in hydra_cfg.hydra.overrides.hydra if o != "hydra.output_subdir=null"]
    saved = run_dir / subdir
    for name, node in (("config.yaml", cfg), ("hydra.yaml", hydra_cfg), ("overrides.yaml", hydra_cfg.hydra.overrides.task)):
        atomic_write_text(saved / name, OmegaConf.to_yaml(node))
    redact_files(saved / "config.yaml", saved / "hydra.yaml", saved / "overrides.yaml")


def _put_back(kept: dict, log: Path, logged: int | None) -> None:
    """The files a refused attempt touched, as they were; its log lines cut off again."""
    for path, data in kept.items():
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)
    _cut_log(log, logged)


def _cut_log(log: Path, size: int | None) -> None:
    """The job's log back to ``size`` bytes, as a refused attempt found it; None or 0: removed (Hydra opens the
    log before the job starts, so an empty one is this attempt's)."""
    import logging

    for handler in logging.getLogger().handlers:  # flush what Hydra's file handler still holds
        handler.flush()
    try:
        if not size:
            log.unlink(missing_ok=True)
        elif log.stat().st_size != size:
            os.truncate(log, size)
    except OSError:
        pass


def error_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def first_error(err: BaseException) -> BaseException:
    """The error that started a chain of errors raised while handling one another (the cause a
    user needs: the last one is often only a consequence). An error raised ``from`` another on
    purpose is the one meant to be read: the chain stops there."""
    seen = {id(err)}
    while True:
        nxt = None if err.__cause__ is not None or err.__suppress_context__ else err.__context__
        if nxt is None or id(nxt) in seen:
            return err
        seen.add(id(nxt))
        err = nxt


def _job_error(run_dir: Path, kind: str, reason: str, multirun: bool, record: bool = False, code: int | None = None,
               why: str | None = None) -> float:
    """A refused or failed job: recorded in failed.json (``record``); a sweep's job says so on
    one line and returns NaN (the other jobs still run, the sweep's exit is non-zero); a single
    run exits with the one-line error."""
    if record:
        mark_failed(run_dir, reason, **({"code": code} if code is not None else {}))
        release(run_dir)
    if not multirun:
        fail(reason, log=kind != "refused")  # a refusal leaves the run directory as it was, its log too
    say(f"[bold red]nas-run: job {kind}:[/] {run_dir.name}: {why or reason}", log=kind != "refused")
    return float("nan")


def _check_validates(trainer_cfg) -> None:
    """sweep=optuna optimizes the validation metric: refuse, before training, a trial that
    would end before its first validation."""
    steps, every = trainer_cfg.get("max_steps"), trainer_cfg.get("val_check_interval")
    if (isinstance(steps, int) and steps > 0 and isinstance(every, int) and not isinstance(every, bool)
            and every > steps):
        fail(f"sweep=optuna optimizes the validation metric, but trainer.val_check_interval={every} > "
             f"trainer.max_steps={steps}: no trial would validate; set trainer.val_check_interval <= {steps}")


def record_resume(run_dir: Path, overrides: list[str]) -> None:
    """Append the overrides given with ``resume=`` (secrets masked) to ``.hydra/resumes.yaml``."""
    path = run_dir / ".hydra" / "resumes.yaml"
    try:
        done = yaml.safe_load(path.read_text()) if path.is_file() else []
    except (OSError, yaml.YAMLError):
        done = []
    done = (done if isinstance(done, list) else []) + [
        {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "overrides": [redact(o) for o in overrides]}]
    atomic_write_text(path, yaml.safe_dump(done, sort_keys=False))


#: what a run directory holds before training starts (Hydra's files, the log, the lock)
_BEFORE_TRAINING = frozenset({".hydra", "nas_run.log", ".nas-run.lock", "failed.json"})


def _only_this_invocation(run_dir: Path) -> bool:
    """The run directory holds nothing but what this command wrote before training (a refusal of a
    bad value: README's "stop before anything is made")."""
    try:
        return run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= _BEFORE_TRAINING
    except OSError:
        return False


def _remove_empty_run(run_dir: Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    remove_empty_parents(run_dir)  # outputs/runs/<task>/<scheme>-h<heads>/<time>: the folders made for it
