"""The supervision of nas-run's own process: what a stop signal does outside a job's handlers.

A job in training handles its own stop signals (``infra.fault_tolerance``: it saves and says how to
resume). This module is for the process around the jobs: a sweep waiting on joblib's workers,
Hydra composing, a single run before training starts. There a signal must not become a
traceback and must not cost the workers' unsaved steps:

* the first SIGTERM / SIGHUP / SIGINT marks the sweep as stopping (no job starts any more),
  passes SIGTERM to each joblib worker and waits until every job a worker trains has saved its
  last checkpoint and released its directory (at most two minutes; a second signal stops at once);
* then the process exits with one line that says how to continue (``128 + signal``; 130 for Ctrl-C).

:func:`started_run` / :func:`started_sweep` are told by Hydra's callbacks what this process
started, so that the line can name it; both, and the signals received, are kept in
:data:`nas_cli.infra.process.PROCESS`, where the handlers find them.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from nas_cli.errors import fail
from nas_cli.infra.process import PROCESS
from nas_cli.infra.rundir import holders

#: in a sweep directory while its joblib sweep stops: a job that starts then leaves at once
STOPPING = ".nas-run-stopping"


class ProcessStop(BaseException):
    """SIGTERM or SIGHUP to nas-run's own process outside a job's handlers (a BaseException, as Ctrl-C's
    KeyboardInterrupt: Hydra turns an Exception into a traceback)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


#: how long a stopping joblib sweep waits for its workers' jobs to save, at most
WAIT_S = 120.0


def started_run(run_dir: Path) -> None:
    """Hydra's callbacks: this process runs the single run in ``run_dir``."""
    PROCESS.run_dir = run_dir


def started_sweep(root: Path) -> None:
    """Hydra's callbacks: this process runs the sweep in ``root``."""
    PROCESS.sweep_dir = root


def supervise(entry: Callable[[], object]) -> None:
    """Call ``entry`` with this process's stop handlers installed; a stop ends it with one line."""
    signal.signal(signal.SIGTERM, _stop)
    for sig in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(sig) != signal.SIG_IGN:  # not under nohup, not a shell script's background job
            signal.signal(sig, _stop)
    try:
        entry()
    except KeyboardInterrupt:  # Ctrl-C in a sweep's own process (joblib's wait, say): one line, not a traceback
        fail(f"interrupted (Ctrl-C){continue_hint()}", 130, kind="stopped", color="yellow")
    except ProcessStop as err:
        fail(f"{signal.Signals(err.signum).name}{continue_hint()}", 128 + err.signum, kind="stopped", color="yellow")
    finally:
        if PROCESS.stops and PROCESS.sweep_dir is not None:
            (PROCESS.sweep_dir / STOPPING).unlink(missing_ok=True)


def continue_hint() -> str:
    """How to continue after a stop reached nas-run's own process (a run in training says it itself)."""
    if PROCESS.sweep_dir is not None:
        return (f"; the same command with hydra.sweep.dir={PROCESS.sweep_dir} continues the sweep "
                f"(finished jobs are skipped, the others resume from their last.ckpt)")
    if PROCESS.run_dir is not None:
        return f"; continue with: nas-run resume={PROCESS.run_dir}"
    return ""


def _stop(signum, frame):
    PROCESS.stops.append(signum)
    if len(PROCESS.stops) == 1:  # a second signal while the jobs save: stop at once
        let_sweep_jobs_save()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise ProcessStop(signum)


def let_sweep_jobs_save(wait_s: float = WAIT_S) -> None:
    """A stop signal reached a joblib sweep's own process. Stopping it ends joblib's worker
    processes at once, losing their jobs' steps since the last periodic checkpoint. So first:
    no job starts any more, each worker gets SIGTERM (after a signal to the whole process
    group they have it already; a second one changes nothing), and this process waits until
    every job a worker trains has saved its last.ckpt and released its directory, at most
    ``wait_s`` seconds."""
    sweep = PROCESS.sweep_dir
    workers = set(joblib_workers()) if sweep is not None else set()
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
        if not holders(sweep) & workers & set(joblib_workers()):
            return
        time.sleep(0.2)


def joblib_workers() -> list[int]:
    """The process ids of this process's joblib (loky) worker processes: the children Linux's
    /proc names as loky workers, and, on every platform (macOS, Windows: no /proc), the workers
    of the executor joblib's loky backend reuses."""
    found = set(loky_executor_workers())
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):  # none where there is no /proc
        try:
            ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
            if ppid == me and b"popen_loky_posix" in (stat.parent / "cmdline").read_bytes():
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    return sorted(found)


def loky_executor_workers() -> list[int]:
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
