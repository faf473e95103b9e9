"""summary.json: what a finished run is, what it measured, and how it ran (the file ``nas-report``,
``nas-eval`` and a resumed run read)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig

from nas_cli.attention.learned import learned_scalars, learned_values
from nas_cli.infra.checkpoints import checkpoint_step
from nas_cli.infra.version import code_version
from nas_cli.pipeline.lengths import declared_at_lengths, lengths_record, requested
from nas_cli.pipeline.lit import count_parameters
from nas_cli.pipeline.trainer import environment
from nas_cli.model.memory import kv_cache_bytes_per_token, recurrent_state_bytes, windowed_cache_bytes
from tasks.scores import declaration


def run_summary(cfg: DictConfig, job, trainer: pl.Trainer, ckpt, module, task, tested: dict,
                test: dict, fit_seconds: list[float], train_tokens: float) -> dict[str, Any]:
    """summary.json of the job ``job`` (run.py's decisions: plan, identity, config id, resume), trained
    by ``trainer`` with ``ckpt`` its best checkpoint, ``tested`` the weights the test used."""
    return {
        "task": cfg.task.name,
        "scheme": job.plan.tag,
        "placement": job.plan.names,
        "heads": int(cfg.model.heads),
        "d_model": int(cfg.model.d_model),
        "model": cfg.model.name,
        "parameters": count_parameters(module.model),
        # the decoding cache per generated token: keys and values of every causal self-attention layer
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(module.model),
        # with sliding windows: the growth once every window is full, and what the full windows hold
        "kv_cache_windowed": windowed_cache_bytes(module.model),
        # the recurrent mixers' states per sequence (linear attention, DeltaNet): the same at every length
        "recurrent_state_bytes": recurrent_state_bytes(module.model),
        "seed": int(cfg.seed),
        "config_id": job.config_id,
        "code": code_version(),
        "steps": int(trainer.global_step),
        # training (with validation and checkpoints) over every launch up to the weights kept
        "fit_seconds": sum(fit_seconds),
        "fit_seconds_by_launch": fit_seconds,
        "tokens_per_s": train_tokens / module.train_seconds if module.train_seconds else None,
        "best_checkpoint": tested["checkpoint"],
        "tested": tested,
        "best_val": _best_val(task, ckpt, module),
        "test": {k: float(v) for k, v in test.items()},
        "metrics": declared_at_lengths(declaration(task.metrics), test),
        "lengths": lengths_record(task, requested(cfg)) if cfg.run_test else None,
        "learned": learned_scalars(learned_values(module.model)),
        "weights": declared_weights(module.model),
        "diagnostics": location_diagnostics(Path(job.run_dir)),
        "bleu_signature": task.bleu_signature,
        "bleu_tok_signature": task.bleu_tok_signature,
        "data_timings": task.timings,
        "run_dir": shown_path(job.run_dir),
        "group": job.identity["group"],
        "processes": int(trainer.world_size),
        "environment": environment(trainer, cfg),
        "resumed_from": os.path.relpath(job.resume[0], job.run_dir) if job.resume else None,
        "continued_from_summary": job.kept.name if job.kept else None,
    }


def declared_weights(model) -> dict[str, dict[str, bool | float | None]]:
    """{location: what its scheme declares of its weights} (``nonnegative``, ``rows_sum_to_one``, ``weight_max``:
    the bound of one weight, null for none)."""
    import math

    from nas_cli.attention.base import AttentionCore

    out: dict[str, dict] = {}
    for core in model.modules():
        if isinstance(core, AttentionCore):
            seen = out.setdefault(core.location, {"nonnegative": True, "rows_sum_to_one": True, "weight_max": 1.0})
            seen["nonnegative"] &= bool(core.nonnegative)
            seen["rows_sum_to_one"] &= bool(core.rows_sum_to_one)
            top = max(float(core.weight_max), seen["weight_max"] if seen["weight_max"] is not None else math.inf)
            seen["weight_max"] = None if math.isinf(top) else top
    return out


#: the per-location diagnostics a run's summary.json repeats from diagnostics/summary.json
SUMMARY_DIAGNOSTICS = ("sink_rate", "row_mass", "jsd_mean", "explained_away_frac", "not_applicable", "derived")


def location_diagnostics(run_dir: Path) -> dict[str, dict[str, Any]]:
    """{location: the attention-sink rate, the row mass, head JSD, explained-away share, and which
    diagnostics do not apply (with the reason) or were computed on a derived quantity}, from the
    run's diagnostics/summary.json ({} with diagnostics off)."""
    import json

    path = run_dir / "diagnostics" / "summary.json"
    if not path.is_file():
        return {}
    locations = (json.loads(path.read_text()).get("locations") or {})
    return {loc: {k: v[k] for k in SUMMARY_DIAGNOSTICS if k in v} for loc, v in locations.items()}


def shown_path(path: Path) -> str:
    """A run directory as summary.json records it: relative to the working directory when inside it
    (committed summaries do not name the machine they were made on), else as given."""
    rel = os.path.relpath(Path(path).resolve(), Path.cwd().resolve())
    return str(path) if rel.startswith("..") else rel


def as_float(x):
    return None if x is None else float(x)


def _best_val(task, ckpt, module) -> dict[str, Any]:
    """The best validation: its value, its direction (``mode``: min or max, what a tuned comparison
    chooses by), the optimizer step of its checkpoint, and the step its values were logged at
    (``logged_step``: the W&B history row and metrics.csv row holding it)."""
    step = checkpoint_step(ckpt.best_model_path or None)
    return {"metric": task.monitor, "mode": task.monitor_mode, "value": as_float(ckpt.best_model_score), "step": step,
            "logged_step": module.val_logged_at.get(step) if step is not None else None}
