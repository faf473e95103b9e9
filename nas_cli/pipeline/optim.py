"""The optimizer and the learning-rate schedule of a run (``optim.*``, nas_cli/pipeline/sections.py):
Adam or AdamW, and the inverse square root, a cosine, warm-up-stable-decay (WSD) or a constant rate, each
after a linear warm-up."""
from __future__ import annotations

import math

import torch


def inverse_sqrt(warmup: int):
    """Vaswani et al.: linear warm-up to the peak LR, then decay with 1/sqrt(step)."""
    warmup = max(1, int(warmup))

    def factor(step: int) -> float:
        step = step + 1
        return min(step / warmup, math.sqrt(warmup / step))

    return factor


def warmup_cosine(warmup: int, total: int, floor: float):
    """The learning-rate factor of step ``step``: linear warm-up over ``warmup`` steps, then (``total`` > 0) a
    cosine from 1 down to ``floor`` (``optim.min_lr / optim.lr``) at step ``total``, ``floor`` after it; with
    ``total`` = 0 the peak rate after the warm-up (``optim.schedule=constant``)."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if total <= 0:
            return 1.0
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return factor


def warmup_stable_decay(warmup: int, total: int, floor: float, decay: float):
    """WSD (MiniCPM, Hu et al. 2024): linear warm-up, the peak rate until the last ``decay`` share of the
    ``total`` steps, then a linear decay to ``floor`` (``optim.min_lr / optim.lr``) at step ``total``."""
    start = total - max(1, int(round(decay * total)))

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if step < start:
            return 1.0
        done = min(1.0, (step - start) / max(1, total - start))
        return 1.0 - (1.0 - floor) * done

    return factor


def total_steps(trainer) -> int:
    """The optimizer steps a cosine schedule spans: ``trainer.max_steps``, or what the epochs make."""
    if trainer is None:
        return 1
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    return max(1, int(trainer.estimated_stepping_batches))


def configure(parameters, o, trainer) -> dict:
    """Lightning's ``configure_optimizers`` answer for the options ``o`` (OptimOptions): the optimizer
    and a per-step LambdaLR schedule."""
    kind = torch.optim.AdamW if o.optimizer == "adamw" else torch.optim.Adam
    opt = kind(parameters, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    if o.schedule == "inverse_sqrt":
        factor = inverse_sqrt(o.warmup)
    elif o.schedule == "wsd":
        factor = warmup_stable_decay(o.warmup, total_steps(trainer), o.min_lr / o.lr, o.decay_fraction)
    else:
        factor = warmup_cosine(o.warmup, total_steps(trainer) if o.schedule == "cosine" else 0, o.min_lr / o.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
