"""One training job: composed config -> task, model, logger, trainer -> summary.

Called by the Hydra entry point in :mod:`nas_cli.cli` once per job (also in multirun).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint, RichProgressBar
from pytorch_lightning.plugins.io import TorchCheckpointIO

from .attention import SchemeError
from .errors import UserError
from .lit import NasLitModule
from .registry import placement, scheme_tag


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write checkpoints to a temporary file in the same directory, then rename.

    A run killed mid-save leaves at most a ``*.tmp`` file, never a truncated ``.ckpt``
    that looks complete."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


class PeriodicCheckpoint(pl.Callback):
    """``step<N>.ckpt`` every ``every`` optimizer steps, keeping the newest ``keep``
    (for checkpoint averaging). Saved through the trainer, so writes are atomic."""

    def __init__(self, dirpath: Path, every: int, keep: int):
        self.dirpath, self.every, self.keep = Path(dirpath), every, max(1, keep)
        self._last_saved = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == 0 or step % self.every or step == self._last_saved:
            return
        self._last_saved = step
        trainer.save_checkpoint(self.dirpath / f"step{step}.ckpt")
        if trainer.is_global_zero:
            found = sorted(self.dirpath.glob("step*.ckpt"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else -1)
            for old in found[: -self.keep]:
                old.unlink(missing_ok=True)


def _unwrap(err: Exception) -> str:
    while isinstance(err, InstantiationException) and err.__cause__ is not None:
        err = err.__cause__
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return msg


def build_task(cfg: DictConfig):
    try:
        task = instantiate(cfg.task, _convert_="all")
        task.setup("fit")
        return task
    except UserError:
        raise
    except (ValueError, TypeError, InstantiationException, OSError) as err:
        raise UserError(f"task '{cfg.task.get('name', '?')}': {_unwrap(err)}") from err


def build_module(cfg: DictConfig, task) -> NasLitModule:
    try:
        placement(cfg.attention)
        return NasLitModule(cfg.model, cfg.attention, cfg.optim, task, log_u_every=cfg.log_u_every)
    except (SchemeError, ValueError, InstantiationException) as err:
        raise UserError(_unwrap(err)) from err


def compile_model(module: NasLitModule, setting) -> str | None:
    """``compile=true`` (inductor) or ``compile=<torch.compile backend>``: compile the model's
    forward in place with ``nn.Module.compile``, so parameter names, checkpoints and
    ``nas-eval`` stay as they are. Returns the backend, or None for ``compile=false``."""
    if not setting:  # false / null
        return None
    backend = "inductor" if setting is True else str(setting)
    try:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
    except Exception as err:  # noqa: BLE001 - any import/platform failure is the same user-facing problem
        raise UserError(f"compile={setting}: torch.compile is unavailable here ({_unwrap(err)}); "
                        "run with compile=false") from err
    if backend not in known:
        raise UserError(f"compile={setting}: unknown torch.compile backend; use compile=true (inductor), "
                        f"compile=false, or one of {', '.join(known)}")
    module.model.compile(backend=backend)
    return backend


def _compile_failure(err: BaseException) -> str | None:
    """One line describing a torch.compile failure (None if ``err`` is not one)."""
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    if exc is None or not isinstance(err, exc.TorchDynamoException):
        return None
    inner = getattr(err, "inner_exception", None) or err.__cause__ or err
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"[:300]


def make_logger(cfg: DictConfig, run_dir: Path, group: str, job_type: str):
    kind = cfg.logger.kind
    tags = [f"task:{cfg.task.name}", f"scheme:{scheme_tag(cfg.attention)}", f"heads:{cfg.model.heads}",
            *[f"{loc}:{name}" for loc, name in placement(cfg.attention).items()], *cfg.logger.get("tags", [])]
    if kind == "wandb":
        from pytorch_lightning.loggers import WandbLogger

        mode = cfg.logger.mode
        if mode not in ("offline", "online", "disabled"):
            raise UserError(f"logger.mode must be offline, online or disabled (got '{mode}')")
        logger = WandbLogger(project=cfg.logger.project, entity=cfg.logger.get("entity"), name=run_dir.name,
                             group=group, job_type=job_type, tags=tags[:64], save_dir=str(run_dir),
                             offline=(mode == "offline"), mode=mode, config=public_config(cfg))
        return logger
    if kind == "csv":
        from pytorch_lightning.loggers import CSVLogger

        logger = CSVLogger(save_dir=str(run_dir), name="csv", version="")
        logger.log_hyperparams(public_config(cfg))
        return logger
    if kind == "none":
        return False
    raise UserError(f"logger.kind must be wandb, csv or none (got '{kind}')")


SECRET_WORDS = ("key", "token", "secret", "password")


def public_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config with anything that looks like a secret dropped, plus the
    attention placement spelled out per location."""
    data = OmegaConf.to_container(cfg, resolve=True)

    def scrub(node):
        if isinstance(node, dict):
            return {k: scrub(v) for k, v in node.items() if not any(w in str(k).lower() for w in SECRET_WORDS)}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    data = scrub(data)
    data["scheme"] = scheme_tag(cfg.attention)
    data["attention_placement"] = placement(cfg.attention)
    return data


def count_parameters(module: torch.nn.Module) -> int:
    # tied weights are counted once
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def train(cfg: DictConfig, run_dir: Path, group: str, job_type: str = "train") -> dict[str, Any]:
    """Train and test one job; returns the summary also written to ``run_dir/summary.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    task = build_task(cfg)
    module = build_module(cfg, task)
    compiled = compile_model(module, cfg.get("compile", False))
    logger = make_logger(cfg, run_dir, group, job_type)

    tcfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    ckpt = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best", monitor=task.monitor,
                           mode=task.monitor_mode, save_last=True, save_top_k=1)
    callbacks = [ckpt]
    if cfg.checkpoint.every_n_steps and cfg.checkpoint.every_n_steps > 0:
        callbacks.append(PeriodicCheckpoint(run_dir / "checkpoints", int(cfg.checkpoint.every_n_steps),
                                            int(cfg.checkpoint.keep_last)))
    if cfg.diagnostics.enabled:
        from .diagnostics.callback import DiagnosticsCallback

        opts = {k: v for k, v in OmegaConf.to_container(cfg.diagnostics, resolve=True).items() if k != "enabled"}
        callbacks.append(DiagnosticsCallback(run_dir=run_dir, **opts))
    if cfg.progress_bar:
        callbacks.append(RichProgressBar(leave=True))
    trainer = pl.Trainer(**tcfg, callbacks=callbacks, logger=logger, plugins=[AtomicCheckpointIO()],
                         default_root_dir=str(run_dir), enable_progress_bar=bool(cfg.progress_bar),
                         enable_model_summary=False)
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=task)
    except Exception as err:
        failure = _compile_failure(err) if compiled else None  # compilation happens at the first forward
        if failure:
            raise UserError(f"compile={cfg.compile}: torch.compile ({compiled}) failed on this platform "
                            f"({failure}); run with compile=false") from err
        raise
    fit_seconds = time.perf_counter() - start
    if trainer.interrupted:
        raise UserError(f"run interrupted; partial run left in {run_dir} (no summary.json written)")
    best = ckpt.best_model_path or None
    test = trainer.test(module, datamodule=task, ckpt_path=best, verbose=False)[0] if cfg.run_test else {}
    summary = {
        "task": cfg.task.name,
        "scheme": scheme_tag(cfg.attention),
        "placement": placement(cfg.attention),
        "heads": int(cfg.model.heads),
        "d_model": int(cfg.model.d_model),
        "model": cfg.model.name,
        "parameters": count_parameters(module.model),
        "seed": int(cfg.seed),
        "steps": int(trainer.global_step),
        "fit_seconds": fit_seconds,
        "tokens_per_s": module.train_tokens / module.train_seconds if module.train_seconds else None,
        "best_checkpoint": best,
        "best_val": {"metric": task.monitor, "value": _float(ckpt.best_model_score)},
        "test": {k: float(v) for k, v in test.items()},
        "hnas_u": module.hnas_u(),
        "bleu_signature": getattr(task, "bleu_signature", None),
        "data_timings": getattr(task, "timings", None),
        "run_dir": str(run_dir),
        "group": group,
    }
    if logger:
        if hasattr(logger, "experiment") and cfg.logger.kind == "wandb":
            run = logger.experiment
            for k, v in summary["test"].items():
                run.summary[k] = v
            run.summary["parameters"] = summary["parameters"]
            run.summary["tokens_per_s"] = summary["tokens_per_s"]
            summary["wandb_run_id"] = run.id
            summary["wandb_dir"] = run.dir
            run.finish()
        else:
            logger.finalize("success")
    _atomic_json(run_dir / "summary.json", summary)
    return summary


def _float(x):
    return None if x is None else float(x)


def _atomic_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
