"""Resume and fault tolerance.

* Which checkpoint a run continues from (:func:`pick_checkpoint`): the newest of
  ``checkpoints/last.ckpt``, ``checkpoints/step<N>.ckpt`` and Lightning's SLURM
  ``hpc_ckpt_<n>.ckpt`` that loads with ``torch.load(weights_only=True)``; an unreadable one is
  reported and the next older one is used.
* What a checkpoint carries besides Lightning's own state (model, optimizer, LR scheduler, loop
  progress, the training loader's position): :class:`FaultTolerance` adds the W&B run id, group
  and job type, a fingerprint of the configuration and the RNG states, all as plain types.
* Stopping cleanly: SIGTERM, SIGUSR1, SIGUSR2, SIGINT (Ctrl-C; a second one stops at once) and
  SIGHUP (a closed terminal; not under ``nohup``) are noted and acted on at the next batch boundary (all processes together): ``last.ckpt`` is
  written, a handler that was there before (Lightning's or submitit's SLURM requeue) is called,
  and training stops with
  :class:`Preempted`. ``last.ckpt`` is also refreshed every ``every`` optimizer steps and after
  every validation, so a SIGKILL costs at most ``every`` steps. :class:`FaultTolerance` alone
  writes ``last.ckpt``: Lightning's ``ModelCheckpoint(save_last=True)`` refreshes it only after a
  validation that improved the best checkpoint.
* A run directory can be copied or moved: :class:`RunCheckpoint` maps the checkpoint paths it
  restores (``best_model_path`` and friends, saved as absolute paths by Lightning) into the
  directory the run is in now.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException

from nas_cli.errors import SignalStop, UserError
from nas_cli.infra.process import PROCESS

#: signals that stop a run cleanly (SIGHUP: the terminal closed, an SSH connection dropped);
#: DataLoader workers ignore them (tasks.base.WorkerInit)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)
#: answered only where the process did not start with them ignored
_KEPT_IF_IGNORED = (signal.SIGINT, signal.SIGHUP)


def stop_signals_here() -> list[int]:
    """The stop signals this process answers: SIGINT and SIGHUP only where they are not ignored.
    A shell script starts its background jobs (``nas-run ... &``) with SIGINT ignored, so that
    Ctrl-C meant for the script leaves them running (Python keeps that too: no KeyboardInterrupt
    then), and ``nohup`` starts a command with SIGHUP ignored, so that it outlives the terminal."""
    return [s for s in STOP_SIGNALS if s not in _KEPT_IF_IGNORED or signal.getsignal(s) != signal.SIG_IGN]
CHAINED = (signal.SIGUSR1, signal.SIGUSR2)  # their earlier handlers requeue SLURM jobs; SIGTERM's only notify


class Preempted(SIGTERMException):
    """Training stopped on a signal after saving ``last.ckpt``."""

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The checkpoints a run could continue from, newest first (best.ckpt is not a latest state)."""
    ckpt_dir = run_dir / "checkpoints"
    found = [*ckpt_dir.glob("last.ckpt"), *ckpt_dir.glob("step*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.stat().st_mtime_ns, reverse=True)


def load_safe(path: Path) -> dict[str, Any]:
    """A checkpoint through the restricted unpickler (tensors and plain containers only); memory-
    mapped, except for files in torch's legacy (non-zip) format, which cannot be."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap can only be used" not in str(err):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def pick_checkpoint(run_dir: Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """Newest readable checkpoint of ``run_dir`` and its nas-run state; None if there is none."""
    found = checkpoint_files(run_dir)
    for path in found:
        try:
            ckpt = load_safe(path)
            if "state_dict" not in ckpt or "loops" not in ckpt:
                raise ValueError("not a full training checkpoint")
        except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign: fall back to an older one
            warn(f"checkpoint {path} is unreadable ({unreadable_reason(err)}); trying an older one")
            continue
        return path, {**fault_tolerance_state(ckpt), "global_step": int(ckpt.get("global_step", 0))}
    if found:
        raise UserError(f"no readable checkpoint in {run_dir} ({len(found)} found; none loads with "
                        "torch.load(weights_only=True)); start the run again in a new directory")
    return None


def fault_tolerance_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    for key, value in ckpt.get("callbacks", {}).items():
        if str(key).startswith(FaultTolerance.__qualname__):
            return value
    return {}


def unreadable_reason(err: BaseException) -> str:
    """Why a checkpoint was not loaded, in a few words (the safe loader's own message is a page)."""
    import pickle

    if isinstance(err, pickle.UnpicklingError) or "weights_only" in str(err) or "Weights only" in str(err):
        return "refused by the safe loader: it holds objects other than tensors and plain containers"
    if isinstance(err, (EOFError, RuntimeError)) and ("zip" in str(err).lower() or "EOF" in str(err)
                                                      or isinstance(err, EOFError)):
        return "truncated or not a checkpoint file"
    text = _first_line(err)
    return text if len(text) <= 160 else text[:157].rsplit(" ", 1)[0] + " ..."


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _override(overrides, key: str) -> str | None:
    for o in overrides or ():
        k, _, v = str(o).lstrip("+~").partition("=")
        if k == key:
            return v
    return None


def check_resumable(run_dir: Path, overrides=()) -> None:
    """``nas-run resume=<dir> [overrides]``: refuse (one line, nothing written) what cannot be
    continued. A finished run is continued only to train it longer (``trainer.max_steps`` above
    the steps it has done)."""
    if not run_dir.is_dir():
        raise UserError(f"resume={run_dir}: no such run directory")
    if not (run_dir / ".hydra" / "config.yaml").is_file():
        raise UserError(f"resume={run_dir}: not a nas-run run directory (no .hydra/config.yaml)")
    if not checkpoint_files(run_dir):
        raise UserError(f"resume={run_dir}: no checkpoint to continue from (checkpoints/last.ckpt); the run "
                        "stopped before its first one: start it again")
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            done = int(json.loads(summary.read_text())["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            done = None
        wanted = _override(overrides, "trainer.max_steps")
        try:
            more = wanted is not None and done is not None and int(wanted) > done
        except ValueError:
            more = False
        if not more:
            raise UserError(f"resume={run_dir}: that run is complete ({done} steps, summary.json); to train it "
                            f"longer pass trainer.max_steps=<more than {done}>"
                            + (f" (got trainer.max_steps={wanted})" if wanted is not None else ""))


def continue_finished(run_dir: Path) -> Path | None:
    """A finished run trained longer: its summary.json is kept as ``summary.step<N>.json``
    (the continued run writes a new summary.json when it finishes). Returns the kept file."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None
    try:
        steps = int(json.loads(summary.read_text()).get("steps", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        steps = 0
    kept = run_dir / f"summary.step{steps}.json"
    os.replace(summary, kept)
    return kept


def config_fingerprint(cfg) -> str:
    """What must not change when a run is continued: model, attention, task name and seed."""
    from omegaconf import OmegaConf

    data = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "attention")}
    data.update(task=str(cfg.task.name), seed=int(cfg.seed))
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rng_states() -> dict[str, Any]:
    """Python, numpy and torch RNG states as types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    out = {"python": [version, list(internal), gauss_next],
           "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
           "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_states(state: dict[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RunCheckpoint(ModelCheckpoint):
    """``best.ckpt`` as Lightning keeps it, but restored paths follow the run directory: a run
    copied or moved elsewhere and resumed tests its own ``best.ckpt``, not the original's."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old, new = state_dict.get("dirpath"), self.dirpath
        if old and new and os.path.normpath(old) != os.path.normpath(new):
            state_dict = relocate_paths(state_dict, old, new)
        super().load_state_dict(state_dict)


def relocate_paths(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """ModelCheckpoint state with every path under ``old`` re-rooted under ``new``."""
    def move(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        rel = os.path.relpath(path, old)
        return path if rel.startswith("..") else os.path.join(new, rel)

    out = dict(state, dirpath=new)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in out:
            out[key] = move(out[key])
    if isinstance(out.get("best_k_models"), dict):
        out["best_k_models"] = {move(k): v for k, v in out["best_k_models"].items()}
    return out


def finish_loggers(trainer, exit_code: int) -> None:
    """Close the W&B run and its service now, while the service still runs: a SLURM requeue or stop
    ends every process of the job at once, and W&B left open then ends in a traceback at exit
    ("Exception ignored in atexit callback ... Connection lost") with its last records unwritten.
    The next launch continues the same W&B run (its id is in the checkpoint)."""
    finished = False
    for logger in getattr(trainer, "loggers", []) or []:
        run = getattr(logger, "_experiment", None)
        if run is None or not hasattr(run, "finish"):
            continue
        finished = True
        try:
            run.finish(exit_code=exit_code)
        except Exception:  # noqa: BLE001 - the service may already be gone (SIGTERM reaches it too): nothing to save
            pass
    if finished:  # and stop W&B's service process itself, so that nothing is left for the exit to tear down
        try:
            import wandb

            wandb.teardown(exit_code)
        except Exception:  # noqa: BLE001
            pass


class FaultTolerance(pl.Callback):
    """Periodic ``last.ckpt``, the extra checkpoint state, and stopping on signals (module docstring).

    identity: stored in every checkpoint (W&B run id, group, job type, config fingerprint)."""

    def __init__(self, last: Path, every: int, identity: dict[str, Any]):
        self.last, self.every, self.identity = Path(last), max(0, int(every)), dict(identity)
        self.pending: int | None = None  # the first stop signal received
        self.stopped: int | None = None
        self._due = False
        self._previous: dict[int, Any] = {}

    # ---- checkpoint contents -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self.identity, "rng": rng_states()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            set_rng_states(state["rng"])

    # ---- periodic last.ckpt --------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every and trainer.global_step % self.every == 0:
            self._due = True  # saved at the next batch start, or by ModelCheckpoint if a validation follows

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            # saved at the next batch start (or at the end of training), after ModelCheckpoint has
            # recorded this validation's best: nothing else refreshes last.ckpt after a validation
            self._due = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        loop = trainer.fit_loop.epoch_loop
        if loop.batch_progress.current.completed % max(1, trainer.accumulate_grad_batches):
            return  # inside a gradient accumulation: act after the optimizer step
        stop = self.pending is not None or trainer.received_sigterm
        if trainer.world_size > 1:  # any process signalled -> all stop at this same batch
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            signum = self.pending or signal.SIGTERM
            self._save(trainer)
            self.stopped = signum
            self._restore_handlers()
            previous = self._previous.get(signum)
            finish_loggers(trainer, 128 + int(signum))  # before a requeue ends the job's processes (W&B's service too)
            if signum in CHAINED and callable(previous) and self.pending is not None:
                try:
                    previous(signum, None)  # e.g. requeue this SLURM job; may exit the process itself
                except SignalStop:
                    pass  # nas-run's own handler outside training (stop_signals): stop as below
            raise Preempted(signum)
        if self._due:
            self._save(trainer)
            self._due = False

    def _save(self, trainer) -> None:
        """Save ``last.ckpt`` as of the end of the previous batch and its validation.

        At a batch start Lightning has already counted the new batch as 'ready' (and the previous
        one as stepped for logging); a checkpoint with those counts would shift the validation
        schedule by one batch on resume. They are saved as they were before the new batch."""
        loop = trainer.fit_loop.epoch_loop
        progress = loop.batch_progress
        shift = progress.current.ready - progress.current.completed  # 1 at a batch start, 0 at the end
        progress.current.ready -= shift
        progress.total.ready -= shift
        loop._batches_that_stepped -= shift
        try:
            trainer.save_checkpoint(self.last, weights_only=False)
        finally:
            progress.current.ready += shift
            progress.total.ready += shift
            loop._batches_that_stepped += shift

    def on_train_end(self, trainer, pl_module):
        self._save(trainer)  # a crash during the test phase resumes straight to testing

    # ---- signals -------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module):
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in stop_signals_here():
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._note)

    def _note(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.pending == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C again while stopping: stop at once (Lightning's own handling)
        # (Ctrl-C after another stop signal is only noted: a joblib sweep's own process passes Ctrl-C on
        # to its workers as SIGTERM, and the terminal's SIGINT may reach a worker after that)
        if self.pending is None:
            self.pending = signum
            PROCESS.training_stop = signum  # for the loggers (infra/loggers.py), which no one hands it to

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._note and handler is not None:
                signal.signal(sig, handler)

    def on_fit_end(self, trainer, pl_module):
        self._restore_handlers()

    def on_exception(self, trainer, pl_module, exception):
        self._restore_handlers()


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While a job runs outside training (startup, the final test), a stop signal ends it at once
    with one line instead of killing it silently (SIGUSR1/2's default). A handler that was there
    before (submitit's SLURM requeue) is called first. Training has its own handlers (FaultTolerance)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in stop_signals_here()}

    def handler(signum, frame):
        before = previous.get(signum)
        if callable(before) and signum in CHAINED:
            before(signum, frame)
        raise SignalStop(signum)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            if before is not None:
                signal.signal(sig, before)
