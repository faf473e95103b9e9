"""Errors that are the user's to fix, and the one way every command prints them: one line on
stderr and a non-zero exit (:func:`fail`)."""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn


class UserError(Exception):
    """A configuration or input problem; the message names the option or file and the fix."""


class Refused(UserError):
    """A resume refused before anything ran (another configuration, fewer steps than done): the run
    directory must be left exactly as it was."""


class NonFiniteLoss(UserError):
    """Training produced a NaN or infinite loss."""


class Stopped(Exception):
    """Training stopped on a signal (SIGTERM, SIGUSR1); ``code`` is the exit status, 128 + the signal."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class SignalStop(Exception):
    """A stop signal (SIGTERM/SIGUSR1/SIGUSR2) arrived outside training; ``run.train`` turns it into :class:`Stopped`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


def unwrap(err: Exception) -> str:
    """The first line of the error a user should read: Hydra's InstantiationException wraps
    the real one (a scheme's or task's ValueError) in its ``__cause__``."""
    from hydra.errors import InstantiationException

    while isinstance(err, InstantiationException) and err.__cause__ is not None:
        err = err.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def console():
    """The console for result tables: logs and CI are not terminals, so give tables room
    instead of rich's 80 columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=120)


def print_table(table) -> None:
    """A result table on stdout: the terminal's width on a terminal; written to a file, at least 120
    columns and as wide as the table's cells need, so that no cell is cut short ("234,9...")."""
    from rich.console import Console

    if sys.stdout.isatty():
        Console().print(table)
        return
    need = Console(width=1000).measure(table).maximum
    Console(width=max(120, min(need, 1000))).print(table)


def say(markup: str, log: bool = True) -> None:
    """One line of rich markup on stderr (progress, skipped jobs, how to continue), also in the job's
    log (nas_run.log) when a job is running, unless ``log`` is false (a refusal changes nothing)."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True).print(markup, highlight=False, soft_wrap=True)
    if log:
        record(Text.from_markup(markup).plain)


def record(line: str) -> None:
    """A line for the job's log file (``<run dir>/nas_run.log``, Hydra's job logging), not the terminal:
    handed to the file handlers of the job's logging alone (a resumed run composes from its saved
    config, with Hydra's default logging, whose console handler would print it); nothing outside a job."""
    import logging

    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if files:
        entry = logging.getLogger("nas_run").makeRecord("nas_run", logging.INFO, __file__, 0, line, None, None)
        for handler in files:
            handler.handle(entry)


def record_table(renderable) -> None:
    """A rich table (a job's result) for the job's log file alone, as plain text 120 columns wide."""
    from rich.console import Console

    out = Console(width=120, file=None, record=True, force_terminal=False, no_color=True)
    with out.capture() as captured:
        out.print(renderable)
    for line in captured.get().rstrip("\n").splitlines():
        record(line.rstrip())


class NotPrintedYet:
    """A filter for the job logging's console handler: a record whose logger prints it with a terminal
    handler of its own (submitit's logger, in a SLURM job) is not printed a second time by the root's."""

    def filter(self, entry) -> bool:
        import logging

        logger = logging.getLogger(entry.name)
        while logger is not None and logger is not logging.getLogger():
            if any(type(h) is logging.StreamHandler for h in logger.handlers):
                return False
            if not logger.propagate:
                break
            logger = logger.parent
        return True


class Exit(SystemExit):
    """An outcome that ends the command (a refusal, a failure, a stop): its one line ``<program>: <kind>:
    <message>`` and its exit status. Raised where it is decided (:func:`fail`); said, once, by :func:`exits`,
    the wrapper of every command's ``main`` and of the Hydra job, the one place that ends a process. A
    ``SystemExit``, so that whatever runs a job (Hydra's launchers, a joblib worker, a SLURM job) lets it
    through as it lets ``sys.exit`` through."""

    def __init__(self, message: str, code: int = 2, kind: str = "error", color: str = "red",
                 program: str = "nas-run", log: bool = True):
        super().__init__(code)
        self.message, self.kind, self.color, self.program, self.log = message, kind, color, program, log

    def __reduce__(self):  # a worker process hands it back whole
        return Exit, (self.message, self.code, self.kind, self.color, self.program, self.log)

    def say(self) -> None:
        from rich.markup import escape

        say(f"[bold {self.color}]{self.program}: {self.kind}:[/] {escape(self.message)}", log=self.log)


def fail(message: str, code: int = 2, kind: str = "error", color: str = "red", program: str = "nas-run",
         log: bool = True) -> NoReturn:
    """Raise the :class:`Exit` of ``<program>: <kind>: <message>`` with status ``code`` (``log``: see :func:`say`).
    ``message`` is plain text, shown as written (``pip install "nas-run[ray]"``, not rich markup)."""
    raise Exit(message, code, kind, color, program, log)


def exits(entry: Callable) -> Callable:
    """``entry`` (a command's ``main``, the Hydra job) with its :class:`Exit` said on its line and turned into the
    process's exit status: the one place an outcome is printed and a process ends."""

    @functools.wraps(entry)
    def wrapper(*args, **kwargs):
        try:
            return entry(*args, **kwargs)
        except Exit as outcome:
            outcome.say()
            raise SystemExit(outcome.code) from None

    return wrapper


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line, as :func:`fail` prints every other error: argparse
    printed its whole usage block (up to nine lines) before the error; the usage is at ``--help``.
    Subcommands' parsers are of the same class (argparse makes them with the parent's)."""

    def error(self, message: str):
        fail(f"{message} (see {self.prog} --help)", program=self.prog)


#: loggers whose INFO lines are noise in a command's output (Lightning's device banner and tips);
#: alembic's "setup plugin alembic.autogenerate.*" lines come when Hydra's plugin scan imports
#: optuna's sweeper (optuna imports alembic)
QUIET = ("pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda", "lightning.fabric", "alembic",
         "matplotlib")  # matplotlib: "generated new fontManager" on a machine's first import (torchmetrics imports it)


def quiet_libraries() -> None:
    """The libraries' INFO lines, the deprecation warning Lightning triggers in torch 2.13 and its srun
    hint, off (every command)."""
    import logging
    import warnings

    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # Lightning's hint when an epoch has fewer batches than trainer.log_every_n_steps (a short debug run): nas-run
    # logs the training loss on its own schedule as well, so the hint is noise, once per job of a sweep
    warnings.filterwarnings("ignore", message=r".*is smaller than the logging interval")
    # Lightning's hint on a machine with SLURM's client tools ("The `srun` command is available on your
    # system but is not used"): nas-run's SLURM jobs start through hydra/launcher=slurm, with srun
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system")
