"""Who owns a run directory, and what a run directory says about itself.

* **One owner.** :func:`acquire` takes ``<dir>/.nas-run.lock`` (created exclusively; it holds the
  owner's PID, host and SLURM job id) before nas-run writes anything else there. A second process
  is refused with one line naming the holder. A lock whose process is gone (same host, PID not
  alive) or that was taken by the same SLURM job (a requeued job) is taken over. Only global rank
  0 of a multi-process run takes it (the other ranks are its own processes).
* **Failed runs say so.** :func:`mark_failed` writes ``failed.json`` (the one-line reason, the time)
  when a job stops on bad input or an error, so ``nas-report`` lists it as *failed*, not as an
  interrupted run. A later successful run in the same directory removes it.
* :func:`atomic_write_text` / :func:`atomic_write_json`: temp file with a per-process name in the
  same directory, then rename; readers never see half a file and two writers never share a temp.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from nas_cli.errors import Refused, UserError

from nas_cli.infra.atomic import atomic_write_json, process_alive
from nas_cli.infra.process import PROCESS

#: set by ``nas-run resume=<dir>``: that directory may hold a finished run (to be trained longer)
CONTINUE_ENV = "NAS_RUN_CONTINUE"
#: a single run's saved-config folder (``.hydra``), which the job writes once its checks pass: nas-run asks Hydra to
#: write none before the job (``hydra.output_subdir=null``), so that a refused value leaves nothing behind
SAVE_CONFIG_ENV = "NAS_RUN_SAVE_CONFIG"
LOCK_NAME = ".nas-run.lock"
FAILED_NAME = "failed.json"
#: a run's per-item test outputs (hypotheses, references, per-item NLL): written by nas_cli/pipeline/run.py, read by the report
ITEMS_FILE = "test_items.json"


def continuing(run_dir: Path) -> bool:
    """Was this process started by ``nas-run resume=<run_dir>``?"""
    target = os.environ.get(CONTINUE_ENV)
    return bool(target) and Path(target).resolve() == Path(run_dir).resolve()


def as_refusal(err: UserError, run_dir: Path) -> UserError:
    """A bad value found before a continued run changed anything: :class:`Refused` (the run is left as it was);
    any other run's bad value as it is."""
    return Refused(str(err)) if continuing(run_dir) and not isinstance(err, Refused) else err


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _stale(holder: dict[str, Any]) -> bool:
    me = _me()
    if holder.get("slurm_job_id") and holder.get("slurm_job_id") == me["slurm_job_id"]:
        return True  # this SLURM job requeued: its earlier process is gone
    if holder.get("host") == me["host"]:
        try:
            return not process_alive(int(holder.get("pid")))
        except (TypeError, ValueError):
            return True
    return False  # another host: cannot tell, assume it is running


def held_elsewhere(run_dir: Path) -> dict[str, Any] | None:
    """The holder of ``run_dir``'s lock when it is another live process (None: free, stale, or ours)."""
    holder = _read(Path(run_dir) / LOCK_NAME)
    if not holder or (holder.get("pid") == os.getpid() and holder.get("host") == _me()["host"]) or _stale(holder):
        return None
    return holder


def is_rank_zero() -> bool:
    from pytorch_lightning.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def acquire(run_dir: Path, what: str = "run") -> None:
    """Own ``run_dir`` for this process (idempotent); raise UserError if another process does."""
    run_dir = Path(run_dir).resolve()
    if run_dir in PROCESS.held or not is_rank_zero():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_NAME
    for _ in range(200):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(lock)
            if holder.get("pid") == os.getpid() and holder.get("host") == _me()["host"]:
                break
            if holder and not _stale(holder):
                raise UserError(f"{run_dir} is in use by another nas-run {what} (PID {holder.get('pid')} on "
                                f"{holder.get('host')}, since {holder.get('since')}); wait for it, choose another "
                                f"directory, or delete {lock} if that process is gone") from None
            if not _take_over(lock, holder):  # another process is taking it over, or just wrote it
                time.sleep(0.05)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(_me(), f)
        break
    else:
        raise UserError(f"cannot take the lock {lock}; delete it if no nas-run uses {run_dir}")
    PROCESS.held.add(run_dir)


#: a lock file with no readable holder younger than this may be one another process is writing
FRESH_SECONDS = 5.0


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _take_over(lock: Path, holder: dict[str, Any]) -> bool:
    """Remove a stale (or unreadable and old) lock, one process at a time: whoever creates the
    ``.takeover`` guard first removes the lock, and only if it still holds the holder judged stale
    (not a fresh lock another taker made meanwhile). Returns whether this process may try again
    to create the lock now."""
    if not holder and _age(lock) < FRESH_SECONDS:  # maybe being written right now: not stale yet
        return False
    guard = lock.with_name(lock.name + ".takeover")
    try:
        gfd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if _age(guard) > 30:  # a taker that died while holding the guard
            guard.unlink(missing_ok=True)
        return False
    try:
        now = _read(lock)
        if now == holder and (holder or _age(lock) >= FRESH_SECONDS):
            lock.unlink(missing_ok=True)
        return True
    finally:
        os.close(gfd)
        guard.unlink(missing_ok=True)


def release(run_dir: Path) -> None:
    run_dir = Path(run_dir).resolve()
    if run_dir not in PROCESS.held:
        return
    PROCESS.held.discard(run_dir)
    lock = run_dir / LOCK_NAME
    if _read(lock).get("pid") == os.getpid():
        lock.unlink(missing_ok=True)


@atexit.register
def _release_all() -> None:
    for d in list(PROCESS.held):
        release(d)


def holders(root: Path) -> set:
    """The process ids holding the run directories directly under ``root`` (a sweep's jobs)."""
    return {_read(lock).get("pid") for lock in Path(root).glob(f"*/{LOCK_NAME}")}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def mark_failed(run_dir: Path, reason: str, code: int = 2) -> None:
    """Write ``failed.json`` with the one-line reason; best effort: on a full disk (the usual reason a
    run fails there) the reason is still printed, and the failure is not made worse by a traceback."""
    if not is_rank_zero() or not Path(run_dir).is_dir():
        return
    try:
        atomic_write_json(Path(run_dir) / FAILED_NAME, {"reason": reason, "exit_code": code,
                                                       "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    except OSError:
        pass


def clear_failed(run_dir: Path) -> None:
    if is_rank_zero():
        (Path(run_dir) / FAILED_NAME).unlink(missing_ok=True)


def read_failed(run_dir: Path) -> dict[str, Any] | None:
    data = _read(Path(run_dir) / FAILED_NAME)
    return data or None


def remove_unstarted_sweep(root: Path) -> None:
    """A sweep stopped before its first job (refused, or its jobs never submitted): its directory
    holds only what the start wrote (the lock, multirun.yaml, submitit's folder) and is removed, so
    nothing is left behind. A directory holding anything else is kept."""
    import shutil

    try:
        if root.is_dir() and {p.name for p in root.iterdir()} <= {"multirun.yaml", LOCK_NAME, ".submitit"}:
            shutil.rmtree(root)
            remove_empty_parents(root)
    except OSError:
        pass


def remove_empty_parents(path: Path, levels: int = 4) -> None:
    """The folders made for ``path`` (``outputs/sweeps/``, ``outputs/runs/<task>/<scheme>-h<heads>/``)
    once empty, up to the working directory."""
    parent, stop = Path(path).parent, Path.cwd().resolve()
    for _ in range(levels):
        if parent.resolve() == stop or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()
        parent = parent.parent
