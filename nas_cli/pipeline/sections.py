"""Where each of nas-run's options is declared: its type and range, in one annotation each.

An option's type and range are the annotation of the parameter that takes it
(nas_cli/infra/options.py: ``PositiveInt``, ``Fraction``, ``Annotated[int, Check(...)]``):

- ``model.*``: the constructors of nas-run's Transformer (nas_cli/model/transformer.py);
- ``task.*``: the constructor of the task's class (``task._target_``), as for a scheme's options
  and a diagnostic plug-in's;
- ``diagnostics.*``: the constructor of the diagnostics callback;
- the run's own sections, which no single constructor takes whole, as the dataclasses below; the
  code that uses one builds it from the config (``OptimOptions.of(cfg.optim)``).

The pre-flight (nas_cli/pipeline/checks/config.py) reads these annotations through :func:`sections`, so a
range changes in one place. The defaults stay in the YAML (conf/config.yaml), the one place a user
reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any

from omegaconf import DictConfig, OmegaConf

from nas_cli.infra.options import Check, Count, Fraction, NonNegativeNumber, PositiveInt, PositiveNumber

Seed = Annotated[int, Check(lambda v: 0 <= v <= 2 ** 32 - 1, "an integer from 0 to 4294967295 (the seed range of "
                            "NumPy and Lightning)")]
Threads = Annotated[int, Check(lambda v: v > 0, "a positive integer (CPU threads)")]
Steps = Annotated[int, Check(lambda v: v == -1 or v > 0, "a positive number of optimizer steps, or -1 for no step "
                             "limit (0 would train nothing)", "1000")]
Epochs = Annotated[int, Check(lambda v: v == -1 or v > 0, "a positive number of epochs, or -1 for no epoch limit "
                              "(0 would train nothing)", "8")]
Interval = Annotated[float, Check(lambda v: (isinstance(v, int) and v > 0) or 0 < v <= 1, "a positive number of "
                                  "steps, a fraction of an epoch in (0, 1],", "100")]


class _Section:
    @classmethod
    def of(cls, node: DictConfig | dict) -> Any:
        """The section as the config gives it (conf/config.yaml holds the defaults; keys the class does
        not declare are not read)."""
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


@dataclass(frozen=True)
class RunOptions(_Section):
    """The top-level keys nas-run reads itself (conf/config.yaml)."""

    seed: Seed
    threads: Threads | None
    train_batch_items: PositiveInt | None
    eval_batch_items: PositiveInt | None
    train_tokens: PositiveInt | None = None


#: ``optim.optimizer``: Adam (weight decay added to the gradient, as torch.optim.Adam does) or AdamW (decoupled)
Optimizer = Annotated[str, Check(lambda v: v in ("adam", "adamw"), "adam or adamw", "adamw")]
#: ``optim.schedule``: the inverse square root after a linear warm-up (Vaswani et al.), a linear warm-up then a
#: cosine decay to ``optim.min_lr`` at the last step, warm-up-stable-decay (the peak rate, then a linear decay
#: over the last ``optim.decay_fraction`` of the steps), or a linear warm-up then the peak rate throughout
Schedule = Annotated[str, Check(lambda v: v in ("inverse_sqrt", "cosine", "wsd", "constant"),
                                "inverse_sqrt, cosine, wsd or constant", "cosine")]
DecayShare = Annotated[float, Check(lambda v: 0 < v <= 1, "a share of the steps in (0, 1]", "0.2")]


@dataclass(frozen=True)
class OptimOptions(_Section):
    """``optim.*``: the optimizer and the learning-rate schedule (nas_cli/pipeline/lit.py)."""

    lr: PositiveNumber
    warmup: Count
    label_smoothing: Fraction
    weight_decay: NonNegativeNumber
    betas: tuple
    eps: PositiveNumber
    optimizer: Optimizer = "adam"
    schedule: Schedule = "inverse_sqrt"
    min_lr: NonNegativeNumber = 0.0
    decay_fraction: DecayShare = 0.2


@dataclass(frozen=True)
class CheckpointOptions(_Section):
    """``checkpoint.*``: periodic ``step<N>.ckpt`` files and the refresh of ``last.ckpt`` (nas_cli/pipeline/run.py)."""

    every_n_steps: Count | None
    keep_last: PositiveInt
    last_every_n_steps: Count | None


@dataclass(frozen=True)
class TrainerLimits(_Section):
    """What nas-run requires of Lightning's Trainer arguments beyond the types Lightning declares:
    a step or epoch limit of 0 trains nothing, a validation interval must be reachable."""

    max_steps: Steps
    max_epochs: Epochs | None
    accumulate_grad_batches: PositiveInt
    val_check_interval: Interval | None


def sections(cfg: DictConfig) -> list[tuple[str, type]]:
    """(config prefix, the class whose constructor's annotations declare that section's options) for
    ``cfg``; a task or plug-in class that cannot be imported is left out (its refusal is
    :func:`~nas_cli.pipeline.checks.config.check_declared`'s)."""
    from nas_cli.diagnostics.callback import DiagnosticsCallback
    from nas_cli.infra.options import import_target
    from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer

    out = [("", RunOptions), ("optim", OptimOptions), ("checkpoint", CheckpointOptions), ("trainer", TrainerLimits),
           ("model", Seq2SeqTransformer), ("model", DecoderOnlyLM), ("diagnostics", DiagnosticsCallback)]
    targets = [("task", (cfg.get("task") or {}).get("_target_"))] if "task" in cfg else []
    metrics = (cfg.get("diagnostics") or {}).get("metrics") or {}
    targets += [(f"diagnostics.metrics.{k}", (v or {}).get("_target_")) for k, v in metrics.items()]
    for prefix, target in targets:
        try:
            out.append((prefix, import_target(str(target or ""))))
        except (ImportError, AttributeError, ValueError):
            continue
    return out
