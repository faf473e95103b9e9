"""Errors that are the user's to fix: the CLI prints them as one line and exits non-zero."""


class UserError(Exception):
    """A configuration or input problem; the message names the option or file and the fix."""


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
