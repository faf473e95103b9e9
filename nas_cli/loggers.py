"""Loggers, chosen by the ``_target_`` of ``conf/logger/<name>.yaml`` (``logger=wandb|csv|none``).

Each factory takes what every run knows (``run_dir``, ``name``, ``group``, ``job_type``,
``tags``, the public config ``hparams`` and, for a continued run, ``run_id``) plus its own options
from its YAML, and returns a Lightning logger (or ``False`` for none). A new logger is one
function here or anywhere importable, plus one YAML naming it. The runner asks only
:func:`wandb_run_id` whether the logger carries a W&B run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UserError


def wandb(run_dir: Path, name: str, group: str, job_type: str, tags: list[str], hparams: dict[str, Any],
          run_id: str, project: str = "nas-run", entity: str | None = None, mode: str = "offline", **_: Any):
    """Weights & Biases; ``mode=offline`` writes under ``<run dir>/wandb`` for ``wandb sync``."""
    from pytorch_lightning.loggers import WandbLogger

    if mode not in ("offline", "online", "disabled"):
        raise UserError(f"logger.mode must be offline, online or disabled (got '{mode}')")
    logger = WandbLogger(project=project, entity=entity, name=name, group=group, job_type=job_type,
                         tags=tags[:64], save_dir=str(run_dir), offline=(mode == "offline"), mode=mode,
                         config=hparams, id=run_id, resume="allow")
    # Lightning always passes wandb's deprecated `anonymous` setting (None), and wandb then warns at
    # every run that it "has no effect": leave it out, as wandb asks
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    _survive_a_stop(logger)
    return logger


def _survive_a_stop(logger) -> None:
    """A SIGTERM (``scancel``, ``scontrol requeue``) reaches W&B's service process at the same moment as
    the job: the service dies at once, while nas-run only notes the signal and stops at the next
    batch (saving last.ckpt). A metric logged in between found the service gone and the job crashed
    with ``ConnectionResetError`` instead of stopping cleanly. Once a stop signal is pending, W&B's
    connection errors are ignored; the metrics logged before the stop are in the run file already."""
    from .resume import stop_pending

    original = logger.log_metrics

    def log_metrics(metrics, step=None):
        try:
            return original(metrics, step)
        except (ConnectionError, BrokenPipeError, OSError):
            if stop_pending():
                return None
            raise

    logger.log_metrics = log_metrics


def csv(run_dir: Path, hparams: dict[str, Any], **_: Any):
    """``<run dir>/csv/metrics.csv`` and ``hparams.yaml``."""
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(run_dir), name="csv", version="")
    logger.log_hyperparams(hparams)
    return logger


def none(**_: Any):
    return False


def wandb_run_id(logger) -> str | None:
    """The W&B run id of a W&B logger (None for any other)."""
    init = getattr(logger, "_wandb_init", None)
    return init.get("id") if isinstance(init, dict) else None
