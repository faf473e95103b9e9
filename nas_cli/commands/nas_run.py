"""Entry points only: compose config -> run -> report.

``nas-run`` is a Hydra application; the config folder ships with the package, so it
works from any working directory.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, read_write
from rich.console import Console

from nas_cli.errors import Refused, Stopped, UserError
from nas_cli.choices import CONF_DIR, CONF_PACKAGE
from nas_cli.resolvers import register_resolvers
from nas_cli.infra.rundir import CONTINUE_ENV, continuing
from nas_cli.commands.nas_run_hydra import (STOPPING, SWEEP_CONTINUE_ENV, RunGuard, SweepSummary, _console, _fail,  # noqa: F401
                            _sweep_overrides, restore_finished_configs, setup_overrides, summary_table)


def _spawns_processes(trainer_cfg) -> bool:
    strategy = trainer_cfg.get("strategy", "auto")
    name = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy)
    return any(k in name.lower() for k in ("ddp", "fsdp", "deepspeed")) and str(trainer_cfg.get("devices")) != "1"


def _one_gpu_per_job(cfg: DictConfig, job_num: int) -> None:
    """hydra/launcher=joblib: job i trains on GPU i mod G (nas_cli.infra.launchers.joblib_gpu)."""
    import torch

    from nas_cli.infra.launchers import joblib_gpu

    try:
        chosen = joblib_gpu(job_num, torch.cuda.device_count(), cfg.trainer.get("accelerator", "auto"),
                            cfg.trainer.get("devices", 1))
    except UserError as err:
        _fail(str(err))
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


def _job(cfg: DictConfig):
    """One job of ``nas-run`` (a single run, or one job of a sweep): prepare its directory, train
    unless a continued sweep finished it before, print its result. Returns what a sweeper
    optimizes (the best validation value; NaN for a failed or refused sweep job)."""
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
    _console().print(summary_table([summary], "nas-run result"))
    value = summary["best_val"]["value"]
    if optuna and (value is None or math.isnan(value)):  # optuna cannot rank a trial without a value
        _fail(f"sweep=optuna: the trial in {run_dir} has no {summary['best_val']['metric']} to optimize (no "
              "validation ran); make it validate at least once (trainer.val_check_interval <= trainer.max_steps)")
    return float("nan") if value is None else float(value)  # what a sweeper (optuna) optimizes


def _prepare_job(cfg: DictConfig, hc, run_dir: Path, multirun: bool, optuna: bool) -> str:
    """Refusals that depend on the launcher, the saved configs redacted, the run directory
    locked for this process. Returns the W&B group."""
    from pytorch_lightning.utilities import rank_zero_only

    from nas_cli.infra.redaction import redact, redact_files
    from nas_cli.infra.rundir import acquire

    # the W&B group is written to summary.json, the checkpoints and the W&B run: a secret typed into it
    # (logger.group="api_key=...") is masked there as in .hydra/
    group = redact(str(cfg.logger.get("group") or (Path(hc.sweep.dir).name if multirun else str(cfg.task.name))))
    if multirun:
        if "joblib" in str(hc.launcher.get("_target_", "")) and _spawns_processes(cfg.trainer):
            _fail("hydra/launcher=joblib runs each job in a worker process that cannot start DDP/FSDP processes; "
                  "use one device per job (trainer.devices=1) or the basic launcher / hydra/launcher=slurm")
        if "joblib" in str(hc.launcher.get("_target_", "")):
            _one_gpu_per_job(cfg, int(hc.job.num))
        _as_single_run(hc, run_dir)
    if optuna:
        _check_validates(cfg.trainer)
    if rank_zero_only.rank == 0 and hc.output_subdir is not None:
        saved = run_dir / str(hc.output_subdir)
        redact_files(saved / "config.yaml", saved / "hydra.yaml", saved / "overrides.yaml",
                     *([Path(hc.sweep.dir) / "multirun.yaml"] if multirun else []))
    try:
        acquire(run_dir)  # a single run took it before Hydra wrote anything (RunGuard); a sweep job here
    except UserError as err:  # another process owns it: write nothing there
        _fail(str(err))
    return group


def _finished_before(run_dir: Path) -> float:
    """A continued sweep: this job finished in an earlier launch; skipped, its value returned."""
    from nas_cli.infra.rundir import release

    release(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    Console(stderr=True).print(f"nas-run: {run_dir.name}: finished in an earlier launch of this sweep: skipped",
                               highlight=False, soft_wrap=True)
    value = (summary.get("best_val") or {}).get("value")
    return float("nan") if value is None else float(value)


def _train_job(cfg: DictConfig, hc, run_dir: Path, group: str, multirun: bool):
    """Check and train. A refusal leaves the directory as it was; a failure is recorded in
    failed.json (a sweep goes on with its other jobs: NaN); a stop says how to continue."""
    from nas_cli.checks import check_config
    from nas_cli.run import train  # heavy imports after Hydra has parsed the command line
    from nas_cli.infra.rundir import clear_failed, release
    from nas_cli.trainer import check_trainer

    checking = False
    kept = {p: (p.read_bytes() if p.is_file() else None)  # what a refused resume must leave as it was
            for p in (run_dir / ".hydra" / "resumes.yaml", run_dir / "failed.json")}
    try:
        if continuing(run_dir):
            record_resume(run_dir, list(hc.overrides.task))
        clear_failed(run_dir)
        checking = True  # a refusal of a value: a single run leaves no directory behind
        check_config(cfg)  # again: a sweep's own values (model.heads=four,8) are only known per job
        check_trainer(cfg)  # Lightning's own refusals (precision, accelerator, unknown options), before any data
        checking = False
        summary = train(cfg, run_dir, group, job_type="sweep" if multirun else "train")
    except Refused as err:  # nothing ran: put back what this attempt touched, write nothing
        for path, data in kept.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)
        release(run_dir)
        return _job_error(run_dir, "refused", str(err), multirun)
    except UserError as err:
        if checking and not multirun and _only_this_invocation(run_dir):  # a bad value: leave nothing behind
            release(run_dir)
            _remove_empty_run(run_dir)
            _fail(str(err))
        return _job_error(run_dir, "failed", str(err), multirun, record=True)
    except Stopped as stop:
        release(run_dir)
        _fail(str(stop), stop.code, kind="stopped", color="yellow")
    except Exception as err:  # noqa: BLE001 - an unexpected error: a sweep goes on with its other jobs
        if not multirun:
            raise
        import traceback

        reason = _error_line(err)
        first = _first_error(err)
        if first is not err:  # an error while handling another (Lightning's teardown after a failed start, say)
            reason = f"{_error_line(first)} (then, while handling it: {reason})"
        (run_dir / "failed.traceback.txt").write_text(traceback.format_exc())
        return _job_error(run_dir, "failed", reason, multirun, record=True, code=1,
                          why=f"{reason} (traceback in {run_dir / 'failed.traceback.txt'})")
    release(run_dir)
    return summary


def _error_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _first_error(err: BaseException) -> BaseException:
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
    from nas_cli.infra.rundir import mark_failed, release

    if record:
        mark_failed(run_dir, reason, **({"code": code} if code is not None else {}))
        release(run_dir)
    if not multirun:
        _fail(reason)
    Console(stderr=True).print(f"[bold red]nas-run: job {kind}:[/] {run_dir.name}: {why or reason}", highlight=False,
                               soft_wrap=True)
    return float("nan")


def _check_validates(trainer_cfg) -> None:
    """sweep=optuna optimizes the validation metric: refuse, before training, a trial that
    would end before its first validation."""
    steps, every = trainer_cfg.get("max_steps"), trainer_cfg.get("val_check_interval")
    if (isinstance(steps, int) and steps > 0 and isinstance(every, int) and not isinstance(every, bool)
            and every > steps):
        _fail(f"sweep=optuna optimizes the validation metric, but trainer.val_check_interval={every} > "
              f"trainer.max_steps={steps}: no trial would validate; set trainer.val_check_interval <= {steps}")


@hydra.main(version_base="1.3", config_path=CONF_PACKAGE, config_name="config")
def _hydra_entry(cfg: DictConfig):
    return _job(cfg)


def record_resume(run_dir: Path, overrides: list[str]) -> None:
    """Append the overrides given with ``resume=`` (secrets masked) to ``.hydra/resumes.yaml``."""
    import time

    import yaml

    from nas_cli.infra.redaction import redact
    from nas_cli.infra.rundir import atomic_write_text

    path = run_dir / ".hydra" / "resumes.yaml"
    try:
        done = yaml.safe_load(path.read_text()) if path.is_file() else []
    except (OSError, yaml.YAMLError):
        done = []
    done = (done if isinstance(done, list) else []) + [
        {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "overrides": [redact(o) for o in overrides]}]
    atomic_write_text(path, yaml.safe_dump(done, sort_keys=False))


#: what a run directory holds before training starts (Hydra's files, the log, the lock)
_BEFORE_TRAINING = {".hydra", "nas_run.log", ".nas-run.lock", "failed.json"}


def _only_this_invocation(run_dir: Path) -> bool:
    """The run directory holds nothing but what this command wrote before training (a refusal of a
    bad value: README's "stop before anything is made")."""
    try:
        return run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= _BEFORE_TRAINING
    except OSError:
        return False


def _remove_empty_run(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    parent, stop = run_dir.parent, Path.cwd().resolve()
    for _ in range(4):  # outputs/runs/<task>/<scheme>-h<heads>/<time>: the folders made for it, if now empty
        if parent.resolve() == stop or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()
        parent = parent.parent


def saved_sweep_order(argv: list[str]) -> list[str]:
    """A sweep continued with its overrides typed in another order (``attention=a,b seed=1,2`` for
    ``seed=1,2 attention=a,b``) is the same sweep: the overrides are put back in the order the sweep
    directory recorded, so that its jobs keep their numbers (and directories)."""
    if "-m" not in argv:
        return argv
    sweep = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")), None)
    if not sweep:
        return argv
    saved = _sweep_overrides(Path(sweep.strip("'\"")))
    task = [a for a in argv if a != "-m" and not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    if not saved:
        return argv
    now, before = setup_overrides(task), setup_overrides(saved)  # logging-only keys may differ
    if now == before or sorted(now) != sorted(before):
        return argv
    rest = [a for a in argv if a == "-m" or a not in task]
    return [*rest, *before, *[a for a in task if a not in now]]


def multirun_first(argv: list[str]) -> list[str]:
    """``-m``/``--multirun`` wherever it was typed (``nas-run trainer=ddp hydra/launcher=slurm -m seed=1,2,3``):
    Hydra's parser takes it only before the overrides, so it is moved to the front."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    if not flags:
        return argv
    return ["-m", *[a for a in argv if a not in ("-m", "--multirun")]]


def sequential_argv(argv: list[str]) -> list[str]:
    """``seed=auto`` selects the sequential sweeper (nas_cli/sequential.py): seeds in rounds until every
    comparison is decided. It needs ``-m`` and no other sweeper."""
    if "seed=auto" not in argv:
        return argv
    if not any(a in ("-m", "--multirun") for a in argv):
        raise UserError("seed=auto runs seeds in rounds until every comparison is decided: add -m, e.g. "
                        "nas-run -m attention=unas,dnas seed=auto")
    other = [a for a in argv if a.startswith(("sweep=", "hydra/sweeper=")) and a != "hydra/sweeper=sequential"]
    if other:
        raise UserError(f"seed=auto is the sequential sweeper; it cannot be combined with {other[0]}")
    return argv if "hydra/sweeper=sequential" in argv else [*argv, "hydra/sweeper=sequential"]


def _register_sweeper() -> None:
    """Hydra finds plugins by walking its plugin package, which an editable install's import hook
    hides from it: make the sequential sweeper known either way."""
    if any(a.startswith("hydra/sweeper=sequential") or a == "seed=auto" for a in sys.argv[1:]):
        from hydra.core.plugins import Plugins
        from hydra_plugins.nas_run_sequential.sequential_sweeper import SequentialSweeper

        plugins = Plugins.instance()
        if f"{SequentialSweeper.__module__}.{SequentialSweeper.__name__}" not in plugins.class_name_to_class:
            plugins.register(SequentialSweeper)


def check_output_dirs(argv: list[str]) -> None:
    """``hydra.run.dir=`` / ``hydra.sweep.dir=`` that cannot be created: one line, before Hydra
    (which would print its own traceback). The check creates the directory and removes what it
    created, so nothing is left behind."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key.lstrip("+~") not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in value:
            continue
        if not value.strip().strip("'\"").strip():  # '' would put the run's files in the current directory
            raise UserError(f"{key}='': an empty directory; give the directory for the "
                            f"{'run' if 'run' in key else 'sweep'}'s files (or leave {key} out for the default)")
        path = Path(value.strip("'\"")).expanduser()
        missing = []
        probe = path
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        try:
            path.mkdir(parents=True, exist_ok=True)
            if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(13, "not a writable directory")
        except OSError as err:
            raise UserError(f"{key}={value}: cannot create or write the directory ({err.strerror or err}); "
                            "choose a directory you can write") from None
        finally:
            for made in missing:  # the directories this check created, deepest first
                try:
                    made.rmdir()
                except OSError:
                    break


def resume_argv(argv: list[str]) -> list[str]:
    """``nas-run resume=<run dir> [key=value ...]`` -> Hydra arguments that run that directory's
    saved config again, in that directory (nothing new is created; Hydra writes no new .hydra/).
    Plain ``key=value`` overrides apply on top (e.g. ``trainer.max_steps=...``)."""
    dirs = [a.split("=", 1)[1] for a in argv if a.startswith("resume=")]
    if not dirs:
        return argv
    rest = [a for a in argv if not a.startswith("resume=")]
    if len(dirs) > 1 or any(a in ("-m", "--multirun") for a in rest):
        raise UserError("resume= takes one run directory and cannot be combined with -m")
    from nas_cli.infra.resume import check_resumable

    run_dir = Path(dirs[0]).expanduser().resolve()
    check_resumable(run_dir, rest)
    os.environ[CONTINUE_ENV] = str(run_dir)
    quoted = str(run_dir).replace("\\", "\\\\").replace("'", "\\'")
    return ["--config-path", str(run_dir / ".hydra"), "--config-name", "config", *rest,
            f"hydra.run.dir='{quoted}'", "hydra.output_subdir=null"]


def main() -> None:
    import warnings

    # Lightning's hint on a machine with SLURM's client tools ("The `srun` command is available on your system
    # but is not used"): nas-run's SLURM jobs go through hydra/launcher=slurm, whose jobs submitit starts with srun
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system")
    # ... and in the processes a sweep starts afresh (joblib's workers), which do not inherit the filter
    srun_hint = "ignore:The `srun` command is available on your system"
    if srun_hint not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), srun_hint]))
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_GIT", "true")
    # ... and alembic's "setup plugin alembic.autogenerate.*" lines, logged at INFO when Hydra's plugin scan
    # imports optuna's sweeper (optuna imports alembic) under Hydra's INFO root logger
    for name in ("pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda", "lightning.fabric",
                 "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    register_resolvers()
    try:
        from nas_cli.overrides import check_overrides
        from nas_cli.plan import location_alias

        sys.argv = [sys.argv[0], *multirun_first(sys.argv[1:])]
        sys.argv = [sys.argv[0], *location_alias(sys.argv[1:])]  # attention.decoder=x: see nas_cli/plan.py
        sys.argv = [sys.argv[0], *saved_sweep_order(sys.argv[1:])]
        sys.argv = [sys.argv[0], *sequential_argv(sys.argv[1:])]
        _register_sweeper()
        check_overrides(sys.argv[1:], CONF_DIR)  # typos: one line with the closest name, before Hydra
        check_output_dirs(sys.argv[1:])
        sys.argv = [sys.argv[0], *resume_argv(sys.argv[1:])]
    except UserError as err:
        _fail(str(err))
    import signal

    stops: list[int] = []

    def stop(signum, frame):  # outside a job's own handlers (training, startup, test): a sweep's process
        stops.append(signum)
        if len(stops) == 1:  # a second signal while the jobs save: stop at once
            _let_sweep_jobs_save()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _ProcessStop(signum)

    signal.signal(signal.SIGTERM, stop)
    for sig in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(sig) != signal.SIG_IGN:  # not under nohup, not a shell script's background job
            signal.signal(sig, stop)
    try:
        _hydra_entry()
    except KeyboardInterrupt:  # Ctrl-C in a sweep's own process (joblib's wait, say): one line, not a traceback
        _fail(f"interrupted (Ctrl-C){_continue_hint()}", 130, kind="stopped", color="yellow")
    except _ProcessStop as err:
        _fail(f"{signal.Signals(err.signum).name}{_continue_hint()}", 128 + err.signum, kind="stopped", color="yellow")
    finally:
        from nas_cli.commands.nas_run_hydra import STARTED

        if stops and "sweep" in STARTED:
            (STARTED["sweep"] / STOPPING).unlink(missing_ok=True)


def _joblib_workers() -> list[int]:
    """The process ids of this process's joblib (loky) worker processes: the children Linux's
    /proc names as loky workers, and, on every platform (macOS, Windows: no /proc), the workers
    of the executor joblib's loky backend reuses."""
    found = set(_loky_executor_workers())
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):  # none where there is no /proc
        try:
            ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
            if ppid == me and b"popen_loky_posix" in (stat.parent / "cmdline").read_bytes():
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    return sorted(found)


def _loky_executor_workers() -> list[int]:
    """The live worker processes of joblib's reusable loky executor, if this process started one."""
    module = sys.modules.get("joblib.externals.loky.reusable_executor")  # never imported here for it
    executor = getattr(module, "_executor", None)
    processes = getattr(executor, "_processes", None)
    if not isinstance(processes, dict):
        return []
    try:
        return [proc.pid for proc in list(processes.values()) if proc.is_alive()]
    except (AttributeError, OSError, ValueError):  # a loky whose insides differ, or a closed process
        return []


def _let_sweep_jobs_save(wait_s: float = 120.0) -> None:
    """A stop signal reached a joblib sweep's own process. Stopping it ends joblib's worker
    processes at once, losing their jobs' steps since the last periodic checkpoint. So first:
    no job starts any more, each worker gets SIGTERM (after a signal to the whole process
    group they have it already; a second one changes nothing), and this process waits until
    every job a worker trains has saved its last.ckpt and released its directory, at most
    ``wait_s`` seconds (a second signal stops at once)."""
    import signal
    import time

    from nas_cli.commands.nas_run_hydra import STARTED
    from nas_cli.infra.rundir import holders

    sweep = STARTED.get("sweep")
    workers = set(_joblib_workers()) if sweep is not None else set()
    if not workers:
        return
    try:
        (sweep / STOPPING).touch()
    except OSError:
        pass
    for pid in workers:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if not holders(sweep) & workers & set(_joblib_workers()):
            return
        time.sleep(0.2)


class _ProcessStop(BaseException):
    """SIGTERM or SIGHUP to nas-run's own process outside a job's handlers (a BaseException, as Ctrl-C's
    KeyboardInterrupt: Hydra turns an Exception into a traceback)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


def _continue_hint() -> str:
    """How to continue after Ctrl-C reached nas-run's own process (a run in training says it itself)."""
    from nas_cli.commands.nas_run_hydra import STARTED

    if "sweep" in STARTED:
        return (f"; the same command with hydra.sweep.dir={STARTED['sweep']} continues the sweep "
                f"(finished jobs are skipped, the others resume from their last.ckpt)")
    if "run" in STARTED:
        return f"; continue with: nas-run resume={STARTED['run']}"
    return ""


if __name__ == "__main__":
    main()
