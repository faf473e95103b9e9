"""A CPU sweep fills the machine by default: its jobs run several at a time.

For the models nas-run trains on a CPU, one thread per job is the efficient size
(:data:`~nas_cli.pipeline.trainer.ONE_THREAD_BELOW`), so a sweep that ran its jobs one after
another left all but one core idle. :func:`parallel_default` runs in ``RunGuard.on_multirun_start``,
which Hydra calls with the same config it then builds the sweeper and its launcher from. When
that config left the launcher at Hydra's default (basic: one job at a time), the jobs train on
the CPU with one device each, and more than one job fits, it puts Hydra's joblib launcher in
its place with ``n_jobs`` = the CPUs allowed // one job's threads (at most the jobs, and as many as
the available memory holds), and adds the choice to the
overrides each job is composed from (so every job knows it shares the machine).

Everything the sequential launcher gives stays: Ctrl-C and SIGTERM reach the whole sweep
(:mod:`nas_cli.sweeps.supervision`), the sweep summary, continuing by running the same command
again, per-job seeds and directories. Each job prints progress lines instead of a live bar
(:class:`~nas_cli.pipeline.progress.ProgressLines`): two live bars in one terminal overwrite
each other. A job that takes a whole device (a GPU, DDP) keeps one job at a time. To run the
jobs one after another anyway: ``hydra/launcher=basic`` (or ``NAS_RUN_SWEEP_JOBS=1``).
"""
from __future__ import annotations

import math
import os

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from nas_cli.errors import say
from nas_cli.infra.launchers import spawns_processes

#: at most this many jobs at a time in a sweep that runs in parallel by default (1: one after another)
SWEEP_JOBS_ENV = "NAS_RUN_SWEEP_JOBS"

_SWEEPERS = ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
             "hydra_plugins.nas_run_sequential.sequential_sweeper.SequentialSweeper")


def sweep_size(config: DictConfig) -> int:
    """How many jobs the sweep's overrides make at once: the product of the swept values (seed=auto:
    its first round, ``min_seeds`` seeds of each configuration)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    size = 1
    for o in OverridesParser.create().parse_overrides([str(x) for x in config.hydra.overrides.task]):
        if o.key_or_group == "seed" and str(o.value()) == "auto":
            size *= max(int(config.hydra.sweeper.get("min_seeds", 2)), int(config.hydra.sweeper.get("seeds_per_round", 1)))
        elif o.is_sweep_override():
            size *= len(list(o.sweep_string_iterator()))
    return size


def _launcher_left_default(config: DictConfig) -> bool:
    hc = config.hydra
    chosen = any(str(o).lstrip("+~").startswith(("hydra/launcher=", "hydra.launcher.")) for o in hc.overrides.hydra)
    return not chosen and hc.runtime.choices.get("hydra/launcher") == "basic" and \
        str(hc.sweeper.get("_target_", "")) in _SWEEPERS


def _on_cpu(config: DictConfig) -> bool:
    import torch

    accel = str(config.trainer.get("accelerator", "auto"))
    return (accel == "cpu" or (accel == "auto" and not torch.cuda.is_available())) and \
        not spawns_processes(config.trainer) and str(config.trainer.get("devices", "auto")) in ("1", "auto")


#: a worker process's own memory beside its model's training state (torch, Lightning, the data: the
#: default job's process peaks at 0.6-0.7 GiB)
WORKER_BYTES = 2 ** 30


def _memory_fits(parameters: int) -> float:
    """How many jobs of ``parameters`` parameters this machine's available memory holds at once."""
    from nas_cli.pipeline.checks.sizing import BYTES_PER_PARAM_TRAINING, available_memory

    have = available_memory()
    return have // (WORKER_BYTES + parameters * BYTES_PER_PARAM_TRAINING) if have else math.inf


def parallel_default(config: DictConfig, parameters: int | None) -> int:
    """Put the joblib launcher in place of the default one where it pays (see the module's
    docstring); returns the jobs it runs at a time (1: the sweep stays sequential)."""
    from nas_cli.pipeline.trainer import JOB_THREADS_ENV, choose_threads, cpus_allowed  # torch: only here

    if not _launcher_left_default(config) or not _on_cpu(config):
        return 1
    threads, _ = choose_threads(config, parameters or 0, on_cpu=True)
    cap = os.environ.get(SWEEP_JOBS_ENV, "")
    size = sweep_size(config)
    n_jobs = min(cpus_allowed() // max(1, threads), size, _memory_fits(parameters or 0),
                 int(cap) if cap.isdigit() and int(cap) > 0 else math.inf)
    if n_jobs < 2:
        return 1
    from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf

    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.launcher = OmegaConf.structured(JobLibLauncherConf(n_jobs=int(n_jobs)))
        config.hydra.runtime.choices["hydra/launcher"] = "joblib"
        for override in ("hydra/launcher=joblib", f"hydra.launcher.n_jobs={int(n_jobs)}"):
            config.hydra.overrides.hydra.append(override)  # each job is composed from these
    os.environ[JOB_THREADS_ENV] = str(threads)
    say(f"nas-run: {size} jobs, {int(n_jobs)} side by side on {cpus_allowed()} CPUs ({threads} thread{'s' * (threads > 1)} "
        f"each; hydra/launcher=basic would run them one after another)", log=False)
    return int(n_jobs)


def in_sweep() -> bool:
    """This is a job of a sweep (``nas-run -m``), whatever launches it."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def shares_terminal() -> bool:
    """This is a job of a sweep whose jobs run several at a time in worker processes (Hydra's joblib launcher)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    launcher = HydraConfig.get().launcher
    return "joblib" in str(launcher.get("_target_", "")) and launcher.get("n_jobs") != 1
