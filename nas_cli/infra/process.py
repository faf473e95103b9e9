"""What nas-run's own process is doing, in the one place its signal handlers and its exit can
reach: :data:`PROCESS`, the only module-level mutable object of nas-run (a test lists them).

Everything a run or a job needs is handed to it; only what a signal handler or ``atexit`` must
find without being handed anything is here:

* ``run_dir`` / ``sweep_dir``: what this process started, for the one line a stop prints
  (:mod:`nas_cli.sweeps.supervision`; Hydra's callbacks set them);
* ``stops``: the stop signals nas-run's own handlers received outside training;
* ``training_stop``: the first stop signal noted during training (:mod:`nas_cli.infra.fault_tolerance`),
  so that the loggers ride out the moment W&B's service is already gone;
* ``asked_stop``: a stop asked of this process without a signal: a Ray Train worker of
  ``trainer=ray_ddp``, whose training runs outside the main thread (where no signal handler
  runs), is asked by its job's process (:mod:`nas_cli.infra.ray_train`); training stops at the
  next step as on that signal;
* ``held``: the run and sweep directories whose lock this process holds
  (:mod:`nas_cli.infra.rundir`), released at exit.

Nothing a run computes passes through here: each job checks its own config (:mod:`nas_cli.pipeline.job`).
"""
from __future__ import annotations

from pathlib import Path


class ProcessState:
    """This process's run, sweep, stop signals and held directories (module docstring)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.sweep_dir: Path | None = None
        self.stops: list[int] = []
        self.training_stop: int | None = None
        self.asked_stop: int | None = None
        self.held: set[Path] = set()

    @property
    def stop_pending(self) -> bool:
        """A stop signal arrived during training, which is about to stop (W&B's service may be gone already)."""
        return self.training_stop is not None


#: this process's state (the module docstring says who writes what)
PROCESS = ProcessState()

