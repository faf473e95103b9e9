"""Length generalization (``eval_lengths=[256,512,1024,2048]``): after the test at the length a model
trained on, the same weights evaluated on the test split at each of the other lengths.

What a length means is the task's (:meth:`tasks.base.Task.length_loader`): a language model scores
windows of that many tokens (each window's new tokens in the same share as at the trained length,
``LanguageModelTask.length_context``), MQAR and selective copying generate their test sequences at
that length with proportionally more pairs (tokens). The numbers go into summary.json's ``test`` as
``test/<metric>@<length>`` (``test/ppl@1024``), so the result table, nas-report's columns and
verdicts and the W&B summary read them as they read any test metric, and into ``lengths``
(``{"trained": 256, "evaluated": [...]}``), which nas-report's figure of a metric against the length
and the W&B chart read.

Refused before training, in one line: a task with no other length, a length the task cannot make,
learned positions (``model.positions=learned``, GPT-2's table) past ``model.max_len`` (they were
never trained), and ``run_test=false``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig

from nas_cli.errors import UserError
from tasks.scores import split_key


def requested(cfg: DictConfig) -> list[int]:
    """The lengths ``eval_lengths`` asks for, in increasing order, each once ([] when unset)."""
    raw = cfg.get("eval_lengths")
    return sorted({int(v) for v in raw}) if raw else []


def check_eval_lengths(cfg: DictConfig, task) -> None:
    """Refuse, before the run directory is made, an ``eval_lengths`` this run cannot evaluate."""
    raw = cfg.get("eval_lengths")
    if raw is None:
        return
    shown = "[" + ",".join(str(v) for v in raw) + "]" if isinstance(raw, (list, ListConfig)) else str(raw)
    if not isinstance(raw, (list, ListConfig)) or not raw or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in raw):
        raise UserError(f"eval_lengths={shown} must be a list of positive lengths in tokens "
                        "(e.g. eval_lengths=[256,512,1024]), or null for none")
    if task is None:
        return
    if task.trained_length() is None:
        raise UserError(f"eval_lengths={shown}: task '{task.name}' has no evaluation at other lengths (it is defined "
                        "for language models over text windows, task=wikitext2, wikitext103 or subword_lm, and for the "
                        "generated task=mqar, selective_copy and retrieval); leave eval_lengths out")
    if not cfg.get("run_test", True):
        raise UserError(f"eval_lengths={shown} evaluates the test split at each length: it needs run_test=true")
    for length in requested(cfg):
        try:
            task.check_length(length)
        except ValueError as err:
            raise UserError(str(err)) from None
    model = cfg.get("model") or {}
    longest, max_len, trained = max(requested(cfg)), model.get("max_len"), task.trained_length()
    if model.get("positions") == "learned" and isinstance(max_len, int) and longest > min(max_len, trained):
        raise UserError(f"eval_lengths={shown} reaches {longest} tokens, but model.positions=learned trains only the "
                        f"position rows of its training length ({trained} tokens; model.max_len={max_len}): the "
                        f"rows past it are never trained. Evaluate up to {trained}, or train with positions that "
                        "extend (model.positions=rope, sinusoidal, alibi or none)")


def test_at_lengths(trainer, module, task, lengths: list[int], ckpt_path: str | None,
                    split: str = "test") -> dict[str, float]:
    """The metrics of ``split`` at each of ``lengths`` (the tested weights: ``ckpt_path``, or the
    module's own with None), as ``{"test/<metric>@<length>": value}``. Each evaluation is split
    ``test@<length>`` for the progress lines, the loggers' keys and the per-item outputs (the trained
    length's stay ``test``)."""
    out: dict[str, float] = {}
    before = module.test_split
    for length in lengths:
        module.test_split = f"{split}@{length}"
        try:
            metrics = trainer.test(module, dataloaders=task.length_loader(split, length), ckpt_path=ckpt_path,
                                   verbose=False, **({"weights_only": True} if ckpt_path else {}))[0]
        finally:
            module.test_split = before
        prefix = f"{split}@{length}/"
        out.update({f"{split}/{k.removeprefix(prefix)}@{length}": float(v) for k, v in metrics.items()
                    if k.startswith(prefix)})
    return out


def declared_at_lengths(declared: dict[str, list], test: dict[str, Any]) -> dict[str, list]:
    """summary.json's ``metrics`` with each per-length key of ``test`` declared as its metric is
    (title "<title> @<length>", the same better direction and format)."""
    from tasks.scores import declare, spec

    declare(declared)
    out = dict(declared)
    for key in test:
        parts = split_key(key)
        if parts:
            base = spec(parts[0])
            out[key] = [f"{base.title} @{parts[1]}", base.higher_is_better, base.fmt]
    return out


def lengths_record(task, lengths: list[int]) -> dict[str, Any] | None:
    """summary.json's ``lengths``: the trained length and the ones evaluated (None without eval_lengths)."""
    return {"trained": int(task.trained_length()), "evaluated": list(lengths)} if lengths else None


def length_curves(summary: dict) -> dict[str, list[tuple[int, float]]]:
    """{test metric: [(length, value), ...] in increasing length} of a run evaluated at other lengths
    (``eval_lengths``): the trained length's value (``test/<metric>``) and each ``test/<metric>@<length>``."""
    test, trained = summary.get("test") or {}, (summary.get("lengths") or {}).get("trained")
    curves: dict[str, dict[int, float]] = {}
    for key, value in test.items():
        parts = split_key(key)
        if parts:
            curves.setdefault(parts[0], {})[parts[1]] = float(value)
    for base, points in curves.items():
        if trained is not None and base in test:
            points.setdefault(int(trained), float(test[base]))
    return {base: sorted(points.items()) for base, points in curves.items()}


def log_length_charts(logger, summary: dict) -> None:
    """One W&B line chart per test metric against the evaluated length (``lengths/<metric>``), in the
    run's W&B run (none without W&B or without ``eval_lengths``)."""
    from nas_cli.infra.loggers import wandb_run_id

    if not summary.get("lengths") or not logger or not wandb_run_id(logger):
        return
    import wandb

    run = logger.experiment
    for base, points in length_curves(summary).items():
        name = base.removeprefix("test/")
        table = wandb.Table(data=[[length, value] for length, value in points], columns=["length", name])
        run.log({f"lengths/{name}": wandb.plot.line(table, "length", name, title=f"{name} against the length")})


def depth_grid(summary: dict, metric: str, groups) -> tuple[list[int], list[str], np.ndarray] | None:
    """(lengths, group names, values (groups x lengths), NaN where not evaluated) of ``<metric>_<group>`` at the
    trained length and at each evaluated one: a retrieval task's accuracy per needle depth and length."""
    test, trained = summary.get("test") or {}, (summary.get("lengths") or {}).get("trained")
    lengths = sorted({int(trained)} | set((summary.get("lengths") or {}).get("evaluated") or [])) if trained \
        else [None]
    grid = np.full((len(groups), len(lengths)), np.nan)
    for i, g in enumerate(groups):
        for j, n in enumerate(lengths):
            key = f"{metric}_{g}" if n in (None, trained) else f"{metric}_{g}@{n}"
            if key in test:
                grid[i, j] = float(test[key])
    if np.isnan(grid).all():
        return None
    return lengths, list(groups), grid


def draw_heatmap(path, lengths, groups, grid: np.ndarray, title: str, label: str) -> Path:
    """A PNG of ``grid`` (groups x lengths, shares in [0, 1]; NaN: not evaluated) with each cell's percentage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 0.9 + 0.45 * len(groups)))
    image = ax.imshow(100 * grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(groups)), [str(g).removeprefix("depth") + "%" for g in groups])
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{100 * grid[i, j]:.0f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(image, ax=ax, label=label)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_depth_heatmap(run_dir, summary: dict, task, logger=None) -> None:
    """``retrieval_heatmap.png`` in the run directory (and the W&B run): the accuracy per needle depth (rows)
    and length (columns), for a task that scores groups of rows (``Task.group_names``)."""
    if not task.group_names or not task.accuracy_name:
        return
    found = depth_grid(summary, f"test/{task.accuracy_name}", task.group_names)
    if found is None:
        return
    lengths, groups, grid = found
    path = draw_heatmap(Path(run_dir) / "retrieval_heatmap.png", lengths, groups, grid,
                        f"{summary.get('task')}: {summary.get('scheme')}", f"{task.accuracy_name} (%)")
    from nas_cli.infra.loggers import wandb_run_id

    if logger and wandb_run_id(logger):
        import wandb

        logger.experiment.log({"retrieval/heatmap": wandb.Image(str(path))})
