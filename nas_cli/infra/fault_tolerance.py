"""Fault tolerance: ``last.ckpt``, and stopping cleanly on a signal in every phase of a run.

* Stopping cleanly: SIGTERM, SIGUSR1, SIGUSR2, SIGINT (Ctrl-C) and SIGHUP (a closed terminal; not
  under ``nohup``) are noted and acted on at the next batch (all processes together), of training or
  of a validation inside training: ``last.ckpt`` is written, a handler that was there before
  (Lightning's or submitit's SLURM requeue) is called, and the run stops with :class:`Preempted`.

  - During training, ``last.ckpt`` holds the state after the last optimizer step.
  - During a validation, ``last.ckpt`` holds the same training state with that validation owed
    (``validation_owed``: its step): the resumed run runs it again, from its first batch, before it
    trains on (or, at the last step, before its test). A validation's partial sums are never kept.
    With several processes (DDP) the stop waits for the validation's end (see
    :meth:`FaultTolerance.on_validation_batch_start`).
  - Outside training (start-up, the final test, ``nas-eval``) :func:`stop_signals` ends at once.
  - A Ray Train worker (``trainer=ray_ddp``) trains outside its main thread, where no handler runs:
    its job's process asks it through ``PROCESS.asked_stop`` (:mod:`nas_cli.infra.ray_train`),
    which is acted on as the signal it names.

  The same signal a second time, a second or more after the first, stops at once without a checkpoint
  (``timeout``'s second SIGTERM, Ctrl-C pressed again). Another signal while stopping, or the same one
  within :data:`ONE_STOP_SECONDS`, is only noted: one stop often arrives as two, a joblib sweep's
  process passing the signal its process group got on to its workers, which got it too (as SIGTERM
  for the terminal's Ctrl-C).
* ``last.ckpt`` is also refreshed every ``every`` optimizer steps and after every validation, so a
  SIGKILL costs at most ``every`` steps. :class:`FaultTolerance` alone writes ``last.ckpt``:
  Lightning's ``ModelCheckpoint(save_last=True)`` refreshes it only after a validation that improved
  the best checkpoint.
* What a checkpoint carries besides Lightning's own state: the W&B run id, group and job type, a
  fingerprint of the configuration and the RNG states (:mod:`nas_cli.infra.resume` reads them back).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException

from nas_cli.errors import SignalStop
from nas_cli.infra.process import PROCESS
from nas_cli.infra.resume import rng_states, set_rng_states

#: signals that stop a run cleanly (SIGHUP: the terminal closed, an SSH connection dropped);
#: DataLoader workers ignore them (tasks.base.WorkerInit)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)
#: answered only where the process did not start with them ignored
_KEPT_IF_IGNORED = (signal.SIGINT, signal.SIGHUP)
CHAINED = (signal.SIGUSR1, signal.SIGUSR2)  # their earlier handlers requeue SLURM jobs; SIGTERM's only notify
#: a second signal sooner than this after the first is the same stop arriving twice (a signal to a process
#: group that a joblib sweep's process also passes on to its workers), not a request to stop at once
ONE_STOP_SECONDS = 1.0


def stop_signals_here() -> list[int]:
    """The stop signals this process answers: SIGINT and SIGHUP only where they are not ignored.
    A shell script starts its background jobs (``nas-run ... &``) with SIGINT ignored, so that
    Ctrl-C meant for the script leaves them running (Python keeps that too: no KeyboardInterrupt
    then), and ``nohup`` starts a command with SIGHUP ignored, so that it outlives the terminal."""
    return [s for s in STOP_SIGNALS if s not in _KEPT_IF_IGNORED or signal.getsignal(s) != signal.SIG_IGN]


class Preempted(SIGTERMException):
    """Training stopped on a signal after saving ``last.ckpt``; ``phase``: training or validation."""

    def __init__(self, signum: int, phase: str = "training"):
        super().__init__(128 + int(signum))
        self.signum = int(signum)
        self.phase = phase


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
        self.owed: int | None = None  # the step of a validation a stop interrupted (read from the checkpoint)
        self._owing: int | None = None  # set while saving such a checkpoint
        self._noted_at = 0.0  # when the first stop signal came (time.monotonic)
        self._due = False
        self._previous: dict[int, Any] = {}

    # ---- checkpoint contents -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self.identity, "rng": rng_states(), "validation_owed": self._owing}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            set_rng_states(state["rng"])
        self.owed = state.get("validation_owed")

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
        if self._stop_asked(trainer):
            self._save(trainer)
            self._stop(trainer, "training")
        if self._due:
            self._save(trainer)
            self._due = False

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        """A stop during a validation inside training: at its next batch, the training state with the
        validation owed (the resumed run repeats it). Several processes (DDP) hold validation shards
        of different lengths, so they cannot decide together at each batch (a collective would wait
        forever for a process whose shard has ended): there the stop waits for the next training
        batch, where they all decide together."""
        if trainer.sanity_checking or trainer.state.fn != "fit" or trainer.world_size > 1 \
                or not self._stop_asked(trainer):
            return
        self._save_owing(trainer)
        self._stop(trainer, "validation")

    def _stop_asked(self, trainer) -> bool:
        if self.pending is None and PROCESS.asked_stop is not None:  # trainer=ray_ddp's workers: no signal
            self.pending = PROCESS.asked_stop
        stop = self.pending is not None or trainer.received_sigterm
        if trainer.world_size > 1:  # any process signalled -> all stop at this same batch
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        return bool(stop)

    def _stop(self, trainer, phase: str) -> None:
        signum = self.pending or signal.SIGTERM
        self.stopped = signum
        self._restore_handlers()
        previous = self._previous.get(signum)
        finish_loggers(trainer, 128 + int(signum))  # before a requeue ends the job's processes (W&B's service too)
        if signum in CHAINED and callable(previous) and self.pending is not None:
            try:
                previous(signum, None)  # e.g. requeue this SLURM job; may exit the process itself
            except SignalStop:
                pass  # nas-run's own handler outside training (stop_signals): stop as below
        raise Preempted(signum, phase)

    def _save(self, trainer) -> None:
        """Save ``last.ckpt`` as of the end of the previous batch and its validation.

        At a batch start Lightning has already counted the new batch as 'ready' (and the previous
        one as stepped for logging); a checkpoint with those counts would shift the validation
        schedule by one batch on resume. They are saved as they were before the new batch. (During
        a validation nothing of the next batch is counted yet: the shift is 0.)"""
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

    def _save_owing(self, trainer) -> None:
        """``last.ckpt`` during a validation: the training state as at the end of its batch, the
        validation's counts as before it began (Lightning then neither resumes it half-way nor takes
        it for done), and its step as owed (:meth:`on_train_start` of the resumed run runs it)."""
        progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
        fields = ("ready", "started", "processed", "completed")
        kept = [(t, f, getattr(t, f)) for t in (progress.current, progress.total) for f in fields]
        before = progress.total.completed - progress.current.completed  # the earlier validations' batches
        for tracker, base in ((progress.current, 0), (progress.total, before)):
            for f in fields:
                setattr(tracker, f, base)
        self._owing = int(trainer.global_step)
        try:
            self._save(trainer)
        finally:
            self._owing = None
            for tracker, f, value in kept:
                setattr(tracker, f, value)

    def on_train_end(self, trainer, pl_module):
        self._save(trainer)  # a crash during the test phase resumes straight to testing

    # ---- the validation a stop interrupted -----------------------------------------------
    def _validate_owed(self, trainer) -> None:
        """Run the validation the checkpoint resumed from owes, as the training loop runs one (the same
        hooks: the best checkpoint, the diagnostics, the logged values at its step)."""
        owed, self.owed = self.owed, None
        if owed is None or int(owed) != int(trainer.global_step) or not trainer.enable_validation:
            return
        connector, val_loop = trainer._logger_connector, trainer.fit_loop.epoch_loop.val_loop
        first = connector._first_loop_iter
        trainer.validating = True
        val_loop.run()
        trainer.training = True
        connector._first_loop_iter = first
        # Lightning's restart then goes on as from a checkpoint saved after this validation (at a batch's
        # start): a validation run during the restart would end a restarted epoch before its first step
        val_loop._has_run = False

    def on_fit_start(self, trainer, pl_module):
        """A run resumed at its last step with a validation owed: Lightning's training loop, its budget
        reached, returns at once without a hook; the validation runs right after it, still inside
        ``fit`` (the best checkpoint is chosen in fitting only), and last.ckpt no longer owes it."""
        loop = trainer.fit_loop
        run = loop.run

        def run_then_validate_owed():
            run()
            if self.owed is None:
                return
            self._install_handlers()
            self._validate_owed(trainer)
            for ckpt in trainer.checkpoint_callbacks:  # those that save at the epoch's end, as its end would
                if isinstance(ckpt, ModelCheckpoint) and ckpt._should_save_on_train_epoch_end(trainer):
                    ckpt.on_train_epoch_end(trainer, pl_module)
            self._save(trainer)

        loop.run = run_then_validate_owed

    # ---- signals -------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module):
        self._install_handlers()
        self._validate_owed(trainer)

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in stop_signals_here():
            if signal.getsignal(sig) != self._note:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._note)

    def _note(self, signum, frame) -> None:
        if self.pending is None:
            self.pending = signum
            self._noted_at = time.monotonic()
            PROCESS.training_stop = signum  # for the loggers (infra/loggers.py), which no one hands it to
            return
        if signum != self.pending or time.monotonic() - self._noted_at < ONE_STOP_SECONDS:
            return  # one stop arriving twice (module docstring): only noted
        raise SignalStop(signum)  # the same signal again, later: stop at once

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._note and handler is not None:
                signal.signal(sig, handler)

    def on_fit_end(self, trainer, pl_module):
        self._restore_handlers()
        trainer.fit_loop.__dict__.pop("run", None)  # the wrapper of on_fit_start

    def on_exception(self, trainer, pl_module, exception):
        self._restore_handlers()


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While a job runs outside training (startup, the final test, ``nas-eval``), a stop signal ends
    it at once with one line instead of killing it silently (SIGUSR1/2's default). A handler that was
    there before (submitit's SLURM requeue) is called first. Training has its own handlers
    (:class:`FaultTolerance`)."""
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
