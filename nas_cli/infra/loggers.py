"""Loggers, chosen by the ``_target_`` of ``conf/logger/<name>.yaml`` (``logger=wandb|csv|none``).

Each factory takes what every run knows (``run_dir``, ``name``, ``group``, ``job_type``,
``tags``, the public config ``hparams`` and, for a continued run, ``run_id``) plus its own options
from its YAML, and returns a Lightning logger (or ``False`` for none). A new logger is one
function here or anywhere importable, plus one YAML naming it. The runner asks only
:func:`wandb_run_id` whether the logger carries a W&B run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pytorch_lightning.utilities import rank_zero_only

from nas_cli.errors import UserError


def wandb(run_dir: Path, name: str, group: str, job_type: str, tags: list[str], hparams: dict[str, Any],
          run_id: str, project: str = "nas-run", entity: str | None = None, mode: str = "offline", **_: Any):
    """Weights & Biases; ``mode=offline`` writes under ``<run dir>/wandb`` for ``wandb sync``."""
    from pytorch_lightning.loggers import WandbLogger

    if mode not in ("offline", "online", "disabled"):
        raise UserError(f"logger.mode must be offline, online or disabled (got '{mode}')")
    elsewhere = os.environ.get("WANDB_DIR")
    if elsewhere and Path(elsewhere).expanduser().resolve() != Path(run_dir).resolve() and rank_zero_only.rank == 0:
        print(f"nas-run: note: WANDB_DIR={elsewhere} is not used: a run's W&B files go in {Path(run_dir) / 'wandb'}, "
              "where its resume, nas-report and wandb sync find them", file=sys.stderr)
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
    from nas_cli.infra.process import PROCESS

    original = logger.log_metrics

    def log_metrics(metrics, step=None):
        try:
            return original(metrics, step)
        except (ConnectionError, BrokenPipeError, OSError):
            if PROCESS.stop_pending:
                return None
            raise

    logger.log_metrics = log_metrics


def csv(run_dir: Path, hparams: dict[str, Any], **_: Any):
    """``<run dir>/csv/metrics.csv`` and ``hparams.yaml``. A resumed run continues its
    metrics.csv (see :func:`_continuing_csv_logger`)."""
    logger = _continuing_csv_logger()(save_dir=str(run_dir), name="csv", version="")
    logger.log_hyperparams(hparams)
    return logger


def _continuing_csv_logger():
    """Lightning's CSVLogger with a writer that continues an existing metrics.csv instead of
    deleting it (Lightning's writer removes it, with a warning, when its folder is not empty: a
    resumed run lost every row logged before the stop). The rows already there are kept up to the
    first step the resumed run logs; rows from that step on (logged after the checkpoint the run
    resumed from, and logged again now) are replaced, so no step is there twice."""
    import csv as csv_module
    import os

    from lightning_fabric.loggers.logger import rank_zero_experiment
    from pytorch_lightning.loggers import CSVLogger
    from pytorch_lightning.loggers.csv_logs import ExperimentWriter

    from nas_cli.infra.atomic import atomic_write

    class ContinuingWriter(ExperimentWriter):
        def __init__(self, log_dir: str) -> None:
            self._kept: list[dict] = []
            super().__init__(log_dir)
            if os.path.isfile(self.metrics_file_path):
                with open(self.metrics_file_path, newline="") as f:
                    reader = csv_module.DictReader(f)
                    self._kept = list(reader)
                    self.metrics_keys = list(reader.fieldnames or [])

        def _check_log_dir_exists(self) -> None:  # keep what is there (Lightning deletes metrics.csv)
            pass

        def save(self) -> None:
            if self._kept and self.metrics:
                first = min(int(m["step"]) for m in self.metrics)
                keep = [r for r in self._kept if not r.get("step") or int(float(r["step"])) < first]
                if len(keep) < len(self._kept):
                    def write(tmp: Path) -> None:
                        with open(tmp, "w", newline="") as f:
                            writer = csv_module.DictWriter(f, fieldnames=self.metrics_keys)
                            writer.writeheader()
                            writer.writerows(keep)

                    atomic_write(self.metrics_file_path, write)
                self._kept = []
            super().save()

    class ContinuingCSVLogger(CSVLogger):
        @property
        @rank_zero_experiment
        def experiment(self):
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = ContinuingWriter(log_dir=self.log_dir)
            return self._experiment

    return ContinuingCSVLogger


def none(**_: Any):
    return False


def wandb_run_id(logger) -> str | None:
    """The W&B run id of a W&B logger (None for any other)."""
    init = getattr(logger, "_wandb_init", None)
    return init.get("id") if isinstance(init, dict) else None


def make_logger(cfg, plan, run_dir: Path, group: str, job_type: str, run_id: str | None, cfg_id: str,
                extra: dict[str, Any] | None = None):
    """The logger of ``cfg.logger`` (its ``_target_``, a factory of this module) for one job with
    the attention ``plan``. ``run_id``: the W&B run to continue (resume); ``cfg_id``: the job's
    config_id; ``extra``: what the job adds to the logged config (parameters, code version)."""
    from hydra.utils import get_method
    from omegaconf import OmegaConf

    from nas_cli.errors import unwrap as _unwrap

    tags = [f"task:{cfg.task.name}", f"scheme:{plan.tag}", f"heads:{cfg.model.heads}", f"cfg:{cfg_id}",
            *plan.wandb_tags,
            *cfg.logger.get("tags", [])]
    options = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items() if k not in ("tags", "group")}
    if "_target_" not in options:
        raise UserError("the logger config has no _target_; choose logger=wandb, csv or none")
    target = options.pop("_target_")
    try:  # called, not instantiate()d: the public config it receives holds _target_ keys of its own
        factory = get_method(target)
    except Exception as err:  # noqa: BLE001 - not importable: name it
        raise UserError(f"logger._target_={target} cannot be imported ({_unwrap(err)})") from None
    return factory(run_dir=run_dir, name=run_dir.name, group=group, job_type=job_type, tags=tags,
                   hparams={**public_config(cfg, plan, cfg_id), **(extra or {})}, run_id=run_id or _new_run_id(), **options)


def _new_run_id() -> str:
    """A W&B run id chosen here (not by W&B), so checkpoints can carry it from the first step."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


#: name parts that mark a config key as a secret (``logger.api_key``, ``access_token``, ``password``)
def public_config(cfg, plan, cfg_id: str) -> dict[str, Any]:
    """The resolved config with anything that looks like a secret dropped, plus the job's
    attention ``plan`` (an :class:`~nas_cli.model.plan.AttentionPlan`) spelled out per location
    the model has."""
    from omegaconf import OmegaConf

    from nas_cli.infra.redaction import redact

    data = redact(OmegaConf.to_container(cfg, resolve=True))
    data["config_id"] = cfg_id
    data["scheme"] = plan.tag
    data["attention_placement"] = plan.names
    return data


def finish_logger(logger, summary: dict, job_dir: Path) -> None:
    """The test numbers into the W&B run's summary (and its id and folder into ours), then close it."""
    if not logger:
        return
    if wandb_run_id(logger):
        run = logger.experiment
        for k, v in summary["test"].items():
            run.summary[k] = v
        run.summary["parameters"] = summary["parameters"]
        run.summary["tokens_per_s"] = summary["tokens_per_s"]
        best = summary["best_val"]
        if best["value"] is not None:  # W&B's summary keeps a metric's last value; the best one beside it
            run.summary[f"best/{best['metric']}"] = best["value"]
            # the history row holding that value (Lightning's step count: the validation after optimizer step N
            # is logged at N - 1 within a launch); summary.json's best_val.step is N, the checkpoint's step
            run.summary["best/step"] = best.get("logged_step")
            run.summary["best/optimizer_step"] = best["step"]
        summary["wandb_run_id"] = run.id
        summary["wandb_dir"] = os.path.relpath(run.dir, job_dir)
        run.finish()
    else:
        logger.finalize("success")

