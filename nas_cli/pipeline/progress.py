"""What a run shows of its progress: Rich's live bar on a terminal, plain lines elsewhere.

A live bar redraws one line with carriage returns and colour codes: in a file (SLURM's output,
``nohup``, CI) it shows nothing until the run ends, or garbage. Where stdout is not a terminal, and
for the jobs of a sweep that share one terminal, :class:`ProgressLines` prints plain lines instead:

* training, every tenth of its budget or every 5 minutes, whichever comes first: the step of the
  budget, the loss, tokens/s, the time so far and the estimated time left;
* each evaluation (a validation, the test, ``nas-eval``), every tenth of its batches but, after its
  first such line, at most one per :data:`EVAL_MIN_SECONDS` (a short evaluation says one line and
  its end), or every 5 minutes: the batch of the split's batches, the time so far and the time left; a seq2seq
  validation's batches include its decoding;
* each validation's value of the checkpoint metric.

A sweep's job writes its lines to its own log (``<job>/nas_run.log``) alone: the sweep's console keeps what
runs, a line per finished job, the table and the report command.

``progress_bar=false`` turns off the live bar, never the lines: the run shows plain lines instead,
on a terminal too. ``progress_lines=false`` turns the lines off (a run silent until its result).
"""
from __future__ import annotations

import sys
import time

from pytorch_lightning.callbacks import ProgressBar, RichProgressBar

#: the longest a run stays silent in a log (seconds)
EVERY_SECONDS = 300.0
#: the least time between two lines of one evaluation (seconds)
EVAL_MIN_SECONDS = 2.0


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_callback(name: str, monitor: str, sweep_job: bool, program: str = "nas-run", bar: bool = True,
                      lines: bool = True, to_log: bool = False) -> ProgressBar | None:
    """The live bar on a terminal of its own (``bar``); else plain lines (``lines``: a sweep's jobs sharing a
    terminal, stdout not a terminal, or the bar turned off); else None (silent). ``to_log``: a sweep's job, whose
    lines go to its log file alone."""
    if to_log:
        return ProgressLines(name, monitor, program, to_log=True) if lines else None
    if bar and not sweep_job and sys.stdout.isatty():
        return progress_bar()
    return ProgressLines(name, monitor, program) if lines else None


def progress_bar() -> RichProgressBar:
    """Lightning's rich progress bar, its description saying the budget the run has: "Epoch 3/7" under
    an epoch limit, "Epoch 3 (to step 2000)" under a step budget (Lightning wrote "Epoch 3/-2"
    when max_epochs is -1)."""

    class BudgetProgressBar(RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            trainer = self.trainer
            text = f"Epoch {current_epoch}"
            if trainer.max_steps and trainer.max_steps > 0:
                text += f" (to step {trainer.max_steps})"  # set at each epoch's start: no moving count
            elif trainer.max_epochs is not None and trainer.max_epochs > 0:
                text += f"/{trainer.max_epochs - 1}"
            return f"{text:{len(self.validation_description)}}"

    return BudgetProgressBar(leave=True)


class _Pace:
    """When to say the next line: every ``total // 10`` counts or every :data:`EVERY_SECONDS`."""

    def __init__(self, total: int, start: int = 0, min_seconds: float = 0.0):
        self.total, self.start = max(0, int(total)), int(start)
        self.every = max(1, self.total // 10) if self.total else 0
        self.next = self.start + self.every if self.every else None
        self.t0 = self.said = time.monotonic()
        self.min_seconds = float(min_seconds)  # a tenth reached this soon after the last line waits for the next
        self.lines = 0  # the first tenth is always said

    def due(self, done: int) -> bool:
        now = time.monotonic()
        tenth = self.next is not None and done >= self.next and (not self.lines or now - self.said >= self.min_seconds)
        if tenth or now - self.said >= EVERY_SECONDS:
            while self.next is not None and done >= self.next:
                self.next += self.every
            self.said = now
            self.lines += 1
            return True
        return False

    def timing(self, done: int) -> str:
        """The time so far and, with a known total, the time left at this pace."""
        elapsed = time.monotonic() - self.t0
        text = f"{duration(elapsed)} elapsed"
        counted = done - self.start
        if self.total and counted > 0 and done < self.total:
            text += f", about {duration(elapsed / counted * (self.total - done))} left"
        return text


class ProgressLines(ProgressBar):
    """A run's progress as plain lines (module docstring), prefixed by the program and the run
    directory's name."""

    def __init__(self, name: str, monitor: str, program: str = "nas-run", to_log: bool = False):
        super().__init__()
        self.name, self.monitor, self.program, self.to_log = name, monitor, program, to_log
        self._enabled = True
        self._train: _Pace | None = None
        self._eval: _Pace | None = None

    # ProgressBar's interface (Lightning adds no bar of its own beside this one)
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _say(self, text: str) -> None:
        if not (self._enabled and self.trainer.is_global_zero):
            return
        if self.to_log:
            from nas_cli.errors import record

            record(f"{self.program}: {self.name}: {text}")
        else:
            print(f"{self.program}: {self.name}: {text}", flush=True)

    # ---- training ----------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module):
        self._train = _Pace(_budget(trainer), trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pace, step = self._train, trainer.global_step
        if pace is None or not pace.due(step):
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        parts = [f"step {step:,}" + (f" of {pace.total:,}" if pace.total else "")]
        if loss is not None:
            parts.append(f"loss {float(loss):.4g}")
        seconds, tokens = getattr(pl_module, "train_seconds", 0.0), getattr(pl_module, "train_tokens", 0)
        if seconds:
            parts.append(f"{tokens / seconds:,.0f} tokens/s")
        self._say(f"{', '.join(parts)} ({pace.timing(step)})")

    # ---- evaluation --------------------------------------------------------------------
    def _eval_start(self, batches) -> None:
        total = batches[0] if isinstance(batches, (list, tuple)) and batches else batches
        self._eval = _Pace(total if isinstance(total, int) else 0, min_seconds=EVAL_MIN_SECONDS)

    def _eval_batch(self, what: str, batch_idx: int) -> None:
        pace, done = self._eval, batch_idx + 1
        if pace is not None and done < pace.total and pace.due(done):
            self._say(f"{what}: batch {done:,} of {pace.total:,} ({pace.timing(done)})")

    def on_validation_epoch_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._eval_start(trainer.num_val_batches)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._eval_batch(f"validation at step {trainer.global_step:,}", batch_idx)

    def on_validation_end(self, trainer, pl_module):
        value = trainer.callback_metrics.get(self.monitor)
        if not trainer.sanity_checking and value is not None:
            timing = f" ({self._eval.timing(self._eval.total)})" if self._eval else ""
            self._say(f"validation at step {trainer.global_step:,}: {self.monitor} = {float(value):.4g}{timing}")

    def on_test_epoch_start(self, trainer, pl_module):
        self._eval_start(trainer.num_test_batches)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._eval_batch(_split(pl_module), batch_idx)

    def on_test_end(self, trainer, pl_module):
        if self._eval is not None:
            self._say(f"{_split(pl_module)}: {self._eval.total:,} batches ({self._eval.timing(self._eval.total)})")


def _split(pl_module) -> str:
    """What the test hooks score: the test split, or the valid split for ``nas-eval --split valid``."""
    return str(getattr(pl_module, "test_split", "test"))


def _budget(trainer) -> int:
    """The optimizer steps training will take (0 when Lightning cannot tell: an unsized loader)."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - an iterable without a length: no budget to show
        return 0
    return int(total) if total != float("inf") else 0
