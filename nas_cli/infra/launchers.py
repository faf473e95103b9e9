"""The submitit launchers (``hydra/launcher=slurm``), with one change: a job the scheduler ends
(``scancel``, a node failure, an out-of-memory kill) is a failed job of the sweep, not the end
of the sweep.

hydra-submitit-launcher waits for every job with ``job.results()``, which raises submitit's
``UncompletedJobError`` for a job that never returned: the whole ``nas-run -m`` then stopped in
a traceback, with no table, no ``failed.json`` and the other jobs' results never summarized.
Here such a job is written down as failed (``failed.json`` in its run directory with the
scheduler's state, or ``ended_jobs.json`` in the sweep directory when it never started), the
others are waited for as usual, and the sweep's table and exit status say what happened.
Running the same command again finishes the failed job (docs/scaling.md).
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from nas_cli.errors import fail
from nas_cli.infra.rundir import remove_unstarted_sweep

#: the sweep directory's list of jobs that ended before they wrote anything
ENDED_FILE = "ended_jobs.json"


def ended_job(job: Any, err: Exception, idx: int, overrides: Sequence[str], sweep_dir: Path) -> JobReturn:
    """Record a job the scheduler ended and return it as a finished job with no value (as
    nas-run's own failed jobs are), so that Hydra goes on with the others."""
    from nas_cli.infra.rundir import mark_failed

    try:
        state = str(job.state)
    except Exception:  # noqa: BLE001 - the scheduler may no longer know the job
        state = "unknown"
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    reason = f"ended by the scheduler before it finished (job {getattr(job, 'job_id', '?')}, state {state}): {first}"
    started = sorted(p for p in Path(sweep_dir).glob(f"{idx}_*") if p.is_dir())
    if started:
        if not (started[0] / "summary.json").is_file():
            mark_failed(started[0], reason, code=1)
    else:
        path = Path(sweep_dir) / ENDED_FILE
        try:
            known = json.loads(path.read_text()) if path.is_file() else []
        except (OSError, ValueError):
            known = []
        known = [k for k in known if k.get("job") != idx] + [{"job": idx, "overrides": list(overrides),
                                                              "reason": reason}]
        try:
            path.write_text(json.dumps(known, indent=1))
        except OSError:
            pass
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = math.nan
    return ret


def install() -> None:
    """Make hydra-submitit-launcher's launchers (``hydra/launcher=slurm``, ``submitit_local``) wait
    tolerantly: Hydra accepts launchers only from its plugin package, so nas-run wraps the
    plugin's ``launch`` in place (idempotent) instead of shipping a launcher of its own."""
    try:
        from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
    except ImportError:  # the plugin is not installed: nothing to wrap
        return
    base = plugin.BaseSubmititLauncher
    if getattr(base.launch, "_nas_tolerant", False):
        return
    original = base.launch

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit
        from submitit.core.utils import UncompletedJobError

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        submit = submitit.AutoExecutor.map_array

        def map_array(executor, fn, *columns):
            try:
                jobs = submit(executor, fn, *columns)
            except subprocess.CalledProcessError as err:  # sbatch refused (the pre-run check asks sinfo first)
                remove_unstarted_sweep(sweep_dir)
                fail(f"hydra/launcher=slurm: sbatch refused the jobs (exit {err.returncode}, its own message is "
                     "above); nothing was submitted")
            return [_Waited(j, i, o, sweep_dir, UncompletedJobError) for j, i, o in zip(jobs, columns[2], columns[0])]

        submitit.AutoExecutor.map_array = map_array
        try:
            return original(self, job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = submit

    launch._nas_tolerant = True
    base.launch = launch


class _Waited:
    """A submitted job whose ``results()`` turns "ended by the scheduler" into a failed job."""

    def __init__(self, job, idx: int, overrides, sweep_dir: Path, uncompleted: type):
        self.job, self.idx, self.overrides, self.sweep_dir, self.uncompleted = job, idx, overrides, sweep_dir, uncompleted

    def results(self):
        while True:
            try:
                return self.job.results()
            except self.uncompleted as err:
                if not _result_written(self.job) and not _still_queued(self.job):
                    return [ended_job(self.job, err, self.idx, self.overrides, self.sweep_dir)]
                # requeued (scontrol requeue, a preemption, a node failure): submitit's accounting poll saw the
                # old run end between two states; the job is in the queue again, so wait for it
                try:
                    self.job.watcher.clear()
                except Exception:  # noqa: BLE001
                    pass
                import time

                time.sleep(5)


#: squeue states of a job that is not over
_QUEUED = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED",
           "RESIZING", "SIGNALING", "STAGE_OUT"})


def _result_written(job) -> bool:
    """Whether the job wrote its result meanwhile (it finished after submitit's last look)."""
    try:
        return Path(job.paths.result_pickle).exists()
    except Exception:  # noqa: BLE001
        return False


def _still_queued(job, looks: int = 3, pause_s: float = 2.0) -> bool:
    """Whether SLURM still lists the job as waiting or running (a requeued job is). A job counts
    as ended only when squeue answers, ``looks`` times ``pause_s`` apart, without it in a queued
    state: a controller too busy to answer (squeue exits non-zero: "Socket timed out", a loaded
    machine) or a job between two states of a requeue is not an ended job."""
    import shutil
    import subprocess
    import time

    try:
        from submitit.slurm.slurm import SlurmJob
    except ImportError:
        return False
    if not isinstance(job, SlurmJob) or shutil.which("squeue") is None or not getattr(job, "job_id", None):
        return False  # submitit_local's jobs are processes of this machine, not SLURM's
    answered = 0
    for attempt in range(looks * 4):
        if attempt:
            time.sleep(pause_s)
        try:
            proc = subprocess.run(["squeue", "-h", "-j", str(job.job_id), "-o", "%T"], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if any(state.strip() in _QUEUED for state in proc.stdout.splitlines()):
            return True
        # squeue exits non-zero both when the controller does not answer and when it no longer knows the job
        # ("Invalid job id specified"): only the latter is an answer
        if proc.returncode == 0 or "Invalid job id" in proc.stderr:
            answered += 1
            if answered >= looks:
                return False
    return False


def install_optuna() -> None:
    """``sweep=optuna`` launched again into its own sweep directory (with ``hydra.sweeper.storage``
    the study is loaded and continued, ``load_if_exists``): hydra-optuna-sweeper numbers the jobs
    of every launch from 0, so the new trials would land in the earlier trials' directories (and
    a finished one would be skipped with its old value). Its setup is wrapped so that a launch
    numbers its jobs after the ones already in the sweep directory."""
    try:
        from hydra_plugins.hydra_optuna_sweeper import _impl
    except ImportError:
        return
    impl = _impl.OptunaSweeperImpl
    if getattr(impl.setup, "_nas_numbered", False):
        return
    original = impl.setup

    def setup(self, *, hydra_context, task_function, config):
        original(self, hydra_context=hydra_context, task_function=task_function, config=config)
        root = Path(str(config.hydra.sweep.dir))
        taken = [int(p.name.split("_", 1)[0]) for p in root.glob("*_*") if p.is_dir() and p.name.split("_", 1)[0].isdigit()]
        self.job_idx = max(taken) + 1 if taken else 0

    setup._nas_numbered = True
    impl.setup = setup


def spawns_processes(trainer_cfg) -> bool:
    """The trainer starts a process per device (DDP, FSDP, DeepSpeed on more than one device)."""
    strategy = trainer_cfg.get("strategy", "auto")
    name = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy)
    return any(k in name.lower() for k in ("ddp", "fsdp", "deepspeed")) and str(trainer_cfg.get("devices")) != "1"


def joblib_gpu(job_num: int, gpus: int, accelerator: str, devices) -> list[int] | None:
    """``hydra/launcher=joblib`` on a machine with ``gpus`` visible GPUs: the GPU of sweep job
    ``job_num`` (job i gets GPU i mod G), as a Lightning device list, so that parallel jobs spread
    over the GPUs instead of all taking GPU 0. None: nothing to choose (no GPU, or a CPU trainer).
    A job that asks for several devices cannot run in a joblib worker (it would start processes):
    refused with one line."""
    from nas_cli.errors import UserError

    accel = str(accelerator).lower()
    if gpus <= 0 or accel not in ("gpu", "cuda", "auto"):
        return None
    if isinstance(devices, (list, tuple)) or str(devices) not in ("1", "auto"):
        raise UserError(f"hydra/launcher=joblib gives each sweep job one GPU (job i: GPU i mod {gpus}); "
                        f"trainer.devices={devices} needs several: use trainer.devices=1, or hydra/launcher=slurm "
                        "(or the basic launcher) for multi-device jobs")
    return [job_num % gpus]


def in_sweep_job() -> bool:
    """This is a job of a multirun: its start-up lines go to its log, the sweep's terminal gets one line per job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
