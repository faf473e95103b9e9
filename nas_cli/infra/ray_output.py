"""What a ``trainer=ray_ddp`` run prints of Ray: its workers' lines and Ray Train's, as nas-run's own output.

Two places shape it:

- nas-run's process (:func:`quiet_ray_output`): the lines Ray forwards from its workers and actors, without
  colour codes where stdout is not a terminal, without the lines of Ray's C++ core's log
  (:data:`RAY_CORE_LOG`), and without Ray's note that token authentication is on (said on every start).
- every process Ray starts for the run, Ray Train's controller among them (:func:`quiet_worker`, Ray's
  ``worker_process_setup_hook``, in :func:`runtime_env`): Ray Train's warnings about a call that timed out
  on a busy machine (its autoscaling coordinator's resource request, its placement-group cleaner's state
  query), which Ray calls safe to ignore when transient, as one line each instead of a traceback
  (:class:`OneLineWarning`). The full record stays in Ray's session logs (``/tmp/ray/session_latest/logs``).
"""
from __future__ import annotations

import logging
import os
import re
import sys

#: a line of Ray's C++ core's own log that a worker forwards ("[<time> E <pid> <tid>] core_worker.cc:2465: ..."):
#: notes on Ray's internals (an actor's restart policy) that come in runs that succeed; they stay in Ray's
#: session logs (/tmp/ray/session_latest/logs)
RAY_CORE_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+ [DIWEF] \d+ \d+\] [\w./]+\.(cc|h):\d+:")

#: Ray Train's loggers whose warnings report a call that timed out under load, with the traceback of the timeout
TRANSIENT_WARNING_LOGGERS = (
    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client",
    "ray.train.v2._internal.execution.controller.placement_group_cleaner",
)


class OneLineWarning(logging.Filter):
    """A record with an exception, as one line: its message, then the exception's type and text in brackets.
    The record is kept (never dropped), so the warning is still said; only the traceback goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(err).__name__}: {err})".replace("\n", " ")
            record.args = None
            record.exc_info = record.exc_text = None
        return True


def quiet_worker() -> None:
    """Ray's ``worker_process_setup_hook`` for a run's processes: :class:`OneLineWarning` on the loggers of
    :data:`TRANSIENT_WARNING_LOGGERS`. A logger's own filter outlasts the logging configuration Ray Train
    applies later (``logging.config.dictConfig`` resets a logger's level and handlers, not its filters)."""
    for name in TRANSIENT_WARNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineWarning) for f in logger.filters):
            logger.addFilter(OneLineWarning())


def runtime_env(env_vars: dict[str, str]) -> dict:
    """The runtime_env of a run's Ray job: ``env_vars`` passed on, :func:`quiet_worker` run in each process."""
    return {"env_vars": env_vars, "worker_process_setup_hook": f"{__name__}.{quiet_worker.__name__}"}


def quiet_ray_output() -> None:
    """nas-run's process prints its Ray workers' lines as described in the module docstring."""
    from ray._private import worker as ray_worker

    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # Ray reads it per line
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    shown = ray_worker.print_worker_logs
    if getattr(shown, "nas_run_filter", False):
        return

    def without_core_log(data, print_file, ignore_prefix: bool = False):
        lines = [ln for ln in data.get("lines", []) if not RAY_CORE_LOG.match(ln)]
        if lines:
            shown({**data, "lines": lines}, print_file, ignore_prefix)

    without_core_log.nas_run_filter = True
    ray_worker.print_worker_logs = without_core_log
