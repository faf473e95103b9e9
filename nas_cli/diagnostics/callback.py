"""Attention diagnostics during validation: a Lightning callback.

Added by :func:`nas_cli.pipeline.run.train` when ``diagnostics.enabled`` is true (the default).
At each analysed validation (every ``every_n_validations``-th, sanity checks skipped) the
first ``batches`` validation batches are run through the model a second time with
``need_weights=True`` (eval mode, no gradients): training keeps the fused SDPA path and
only these few batches pay for explicit weights. The weights feed
:class:`~nas_cli.diagnostics.AttentionDiagnostics` with the padding masks
(seq2seq: ``src != pad`` for the encoder and as keys of cross-attention, ``tgt_in != pad``
for the decoder; LM: ``ids != pad``).

Outputs, under ``<run dir>/diagnostics/``:

* ``step_<N>.json`` and ``latest.json`` (atomic: temp file + rename) per analysed
  validation: per location and layer the H x H head-JSD matrix and its pair mean
  (Zheng et al. 2021), the explaining-away statistics (Ding et al. 2020: histogram of
  log sum_i pi_ij, explained-away fraction, minimum margin over -log Sk, entropy per head)
  and, under ``learned``, every per-head value the schemes learn
  (:meth:`~nas_cli.attention.base.AttentionCore.learned`) per layer and head.
* at the end of fit: ``jsd_<location>.png``, ``explained_away_<location>.png``,
  ``<name>_trajectories.png`` per learned value (recorded at every validation and every
  ``log_learned_every`` training steps) and ``summary.json`` (the per-location scalars, among
  them ``<name>_mean`` per learned value; ``reported``: the numbers ``nas-report`` shows and
  compares, as the metrics declare them; the learned values' history and the time the
  diagnostics took).

Cross-attention also gets the *step variation* (the blog post "Why Bahdanau's neural
attention requires two layers"): per head the largest change max_j |pi_ij - pi_0j| over the
real decoder steps i, averaged over samples. It is 0 when the attention over the source
ignores the decoder state, as one-layer additive attention provably does
(``nas_cli.attention.additive.step_variation``).

Logged to every Lightning logger at ``trainer.global_step``: scalars ``diag/<location>/...``
(per layer, per head entropy, and the mean over layers). A W&B logger also gets a
``wandb.Histogram`` of log sum_i pi_ij per location and layer at every analysed
validation and, at the end of fit, the PNGs as ``wandb.Image`` and each learned value's
trajectories as line series (``diag/<name>_lines/<location>``). With ``logger=none`` only the files are written.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn

from nas_cli.infra.atomic import atomic_write_json
from nas_cli.attention.learned import learned_titles, learned_values
from nas_cli.diagnostics.collector import AttentionDiagnostics, flatten_results, location_masks
from nas_cli.diagnostics.explained_away import DEFAULT_EPS, LOG_FLOAT32_TINY
from nas_cli.diagnostics.locations import location_scalars, reported_numbers
from nas_cli.diagnostics.metrics import build_metrics
from nas_cli.diagnostics.metrics import finite as _finite
from nas_cli.diagnostics.metrics import finite_list as _finite_list
from nas_cli.infra.options import PositiveInt

__all__ = ["DiagnosticsCallback", "write_json_atomic"]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file next to ``path``, then rename (readers never see half a file)."""
    atomic_write_json(path, _finite_tree(data), indent=1, default=_json_default, allow_nan=False)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (np.ndarray, torch.Tensor)):
        return _finite_list(o)
    raise TypeError(f"not JSON serializable: {type(o)}")


def _finite_tree(data: Any) -> Any:
    """Non-finite floats anywhere in dicts/lists -> None (JSON has no NaN or infinities)."""
    if isinstance(data, float):
        return _finite(data)
    if isinstance(data, dict):
        return {k: _finite_tree(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_tree(v) for v in data]
    return data




class DiagnosticsCallback(pl.Callback):
    """Head-JSD and explaining-away diagnostics on a few validation batches (module docstring).

    run_dir: the job's run directory (files go to ``run_dir/diagnostics``).
    batches: validation batches analysed per analysed validation.
    every_n_validations: analyse the 1st, (n+1)-th, (2n+1)-th ... validation.
    eps: epsilon of "epsilon-explained-away" (Ding et al.: 1e-8).
    plots: "end" (PNGs at the end of fit, default), "every" (also after every analysed
        validation) or "never".
    Several processes (DDP): only global rank 0 analyses, on the first ``batches`` batches of the
    whole validation split (not of its own share), so the numbers equal a single-process run's.
    """

    def __init__(self, run_dir: str | Path, batches: PositiveInt = 2, every_n_validations: PositiveInt = 1,
                 eps: float = DEFAULT_EPS, plots: str = "end", metrics: dict[str, Any] | None = None):
        super().__init__()
        if int(batches) < 1 or int(every_n_validations) < 1:
            raise ValueError("diagnostics.batches and diagnostics.every_n_validations must be >= 1 "
                             f"(got {batches}, {every_n_validations})")
        if plots not in ("end", "every", "never"):
            raise ValueError(f"diagnostics.plots must be end, every or never (got '{plots}')")
        self.dir = Path(run_dir) / "diagnostics"
        self.batches = int(batches)
        self.every = int(every_n_validations)
        self.eps = float(eps)
        self.plots = plots
        self.metrics = build_metrics(metrics, self.eps)  # diagnostics.metrics: the plug-ins (metrics.py)
        self.diag = AttentionDiagnostics(metrics=self.metrics)
        self._validations = 0
        self._analysed = 0
        self._disabled = False
        self._active = False
        self._samples = 0
        self.seconds = 0.0  # wall time spent here in all (recompute, statistics, files, plots)
        self.seconds_end = 0.0  # of which at the end of fit (plots, W&B images): once per run
        self.last: dict[str, Any] | None = None  # results of the last analysed validation
        self.last_step: int | None = None
        #: what the schemes learn per head (AttentionCore.learned), over training:
        #: [(step, {name: {location: (layers, heads)}})]
        self.learned_history: list[tuple[int, dict[str, dict[str, np.ndarray]]]] = []
        self.learned_titles: dict[str, str] = {}

    # ---- hooks -----------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        self.learned_titles = learned_titles(pl_module.model)
        if self.learned_titles:
            self._record_learned(0, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.learned_titles and trainer.global_step % pl_module.log_learned_every == 0:
            self._record_learned(trainer.global_step, pl_module)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            self._active = False
            return
        # several processes (DDP): rank 0 alone analyses (at the epoch end, on the whole split's batches)
        self._active = self._validations % self.every == 0 and trainer.is_global_zero
        self._validations += 1
        self.diag.reset()
        self._samples = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.world_size > 1 or not self._active or batch_idx >= self.batches or dataloader_idx != 0:
            return
        self._try_analyse(pl_module, batch)

    def _try_analyse(self, pl_module, batch) -> None:
        if self._disabled:
            return
        t0 = time.perf_counter()
        try:
            self._analyse_batch(pl_module, batch)
        except ValueError as err:  # e.g. a scheme that returns no weights: diagnose nothing, train on
            self._disabled = True
            self._active = False
            rank_zero_warn(f"attention diagnostics switched off for this run: {err}")
        self.seconds += time.perf_counter() - t0

    def _analyse_whole_split(self, trainer, pl_module) -> None:
        """DDP: the first ``batches`` batches of the unsharded validation split (as one process sees it)."""
        from lightning_fabric.utilities.apply_func import move_data_to_device

        from nas_cli.infra.distributed import ShardedData

        data = trainer.datamodule
        make = data.unsharded_val_dataloader if isinstance(data, ShardedData) else pl_module.task.val_dataloader
        for i, batch in enumerate(make()):
            if i >= self.batches or not self._active:
                break
            self._try_analyse(pl_module, move_data_to_device(batch, pl_module.device))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._active and trainer.world_size > 1:
            self._analyse_whole_split(trainer, pl_module)
        if not self._active or not self.diag.seen:
            return
        t0 = time.perf_counter()
        step = int(trainer.global_step)
        results = self.diag.compute()
        self.last, self.last_step = results, step
        self._analysed += 1
        if self.learned_titles:
            self._record_learned(step, pl_module)
        scalars = self._scalars(results)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
            if _is_wandb(logger):
                self._wandb_histograms(logger, results, step)
        if trainer.is_global_zero:
            data = self._step_json(results, step, pl_module)
            write_json_atomic(self.dir / f"step_{step}.json", data)
            write_json_atomic(self.dir / "latest.json", data)
            if self.plots == "every":
                self._write_plots(results)
        self.seconds += time.perf_counter() - t0

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        if self.last is None and (self.dir / "summary.json").is_file():
            return  # resumed after training had ended (e.g. killed during the test): keep what that fit wrote
        t0 = time.perf_counter()
        if self.learned_titles:
            self._record_learned(int(trainer.global_step), pl_module)
        files = self._write_plots(self.last) if self.plots != "never" and self.last is not None else []
        if self.plots != "never" and len(self.learned_history) > 1:
            files += [self._plot_learned(name) for name in self.learned_titles]
        for logger in trainer.loggers:
            if _is_wandb(logger):
                self._wandb_end(logger, files, int(trainer.global_step))
        self.seconds_end = time.perf_counter() - t0
        self.seconds += self.seconds_end
        summary = {
            "step": self.last_step,
            "validations_seen": self._validations,
            "validations_analysed": self._analysed,
            "batches": self.batches,
            "eps": self.eps,
            "seconds": self.seconds,
            "seconds_validations": self.seconds - self.seconds_end,
            "seconds_end": self.seconds_end,
            "locations": self._summary_locations(),
            # what nas-report shows and compares, declared by the metrics and by the schemes'
            # learned values (their mean per location)
            "reported": [r._asdict() for r in reported_numbers(self.metrics, self.learned_titles)],
            "learned_titles": self.learned_titles,
            "learned_history": [{"step": s, "values": _learned_json(v)} for s, v in self.learned_history],
            "files": sorted(p.name for p in files),
        }
        write_json_atomic(self.dir / "summary.json", summary)

    # ---- work ------------------------------------------------------------------------
    @torch.no_grad()
    def _analyse_batch(self, pl_module, batch) -> None:
        model = pl_module.model
        pad = pl_module.task.pad_id
        was_training = model.training
        model.eval()
        try:
            if "ids" in batch:  # decoder-only LM: causal self-attention only
                ids = batch["ids"]
                _, attn = model(ids, need_weights=True, hidden=True)  # the weights: no vocabulary rows
                rows = model.attention_rows(ids) if hasattr(model, "attention_rows") else ids  # documents' rows
                mask = rows != pad
                masks = {"decoder": (mask, mask)}
                self._samples += ids.size(0)
            else:
                src, tgt_in = batch["src"], batch["tgt_in"]
                _, attn = model(src, tgt_in, need_weights=True, hidden=True)
                masks = location_masks(src != pad, tgt_in != pad)
                self._samples += src.size(0)
            self.diag.update(attn, masks)
        finally:
            model.train(was_training)

    def _record_learned(self, step: int, pl_module) -> None:
        values = learned_values(pl_module.model)
        if not self.learned_history or self.learned_history[-1][0] != step:
            self.learned_history.append((step, values))
        else:
            self.learned_history[-1] = (step, values)

    def _summary_locations(self) -> dict[str, dict[str, Any]]:
        """Per-location scalars of the last analysed validation, and the mean of each learned
        value at the end (``<name>_mean``)."""
        locs = {loc: location_scalars(layers, self.metrics) for loc, layers in (self.last or {}).items()}
        last = self.learned_history[-1][1] if self.learned_history else {}
        for name, per_loc in last.items():
            for loc, arr in per_loc.items():
                locs.setdefault(loc, {})[f"{name}_mean"] = float(np.nanmean(arr))
        return locs

    def _scalars(self, results) -> dict[str, float]:
        flat = flatten_results(results, "diag", self.metrics, per_head_entropy=True)
        for loc, layers in results.items():
            for key, value in location_scalars(layers, self.metrics).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "layers":
                    flat[f"diag/{loc}/{key}"] = value
        # loggers cannot all take -inf (a key whose float32 weights all underflowed to 0): log the
        # float32 floor log(smallest subnormal) instead; NaN (weights that are not probabilities,
        # e.g. a linear kernel's negative ones) is left out
        return {k: (v if math.isfinite(v) else LOG_FLOAT32_TINY) for k, v in flat.items()
                if not math.isnan(v) and v != math.inf}

    def _step_json(self, results, step: int, pl_module) -> dict[str, Any]:
        locs = {}
        for loc, layers in results.items():
            entries = []
            for e in layers:
                entry: dict[str, Any] = {"signed_weights": True} if e.get("signed_weights") else {}
                if e.get("rows_sum_to_one") is False:
                    entry["rows_sum_to_one"] = False
                if e.get("unbounded_weights"):
                    entry["unbounded_weights"] = True
                for m in self.metrics:
                    entry.update(m.layer_json(e))
                entries.append(entry)
            scalars = location_scalars(layers, self.metrics)
            locs[loc] = {"layers": entries, **{k: v for k, v in scalars.items() if k != "layers"}}
        return {"step": step, "validation": self._validations, "batches": self.batches, "samples": self._samples,
                "eps": self.eps, "locations": locs, "learned": _learned_json(learned_values(pl_module.model))}

    def _write_plots(self, results) -> list[Path]:
        return [path for m in self.metrics for path in m.figures(results, self.dir, self.last_step)]

    def _plot_learned(self, name: str) -> Path:
        from nas_cli.diagnostics.figures import plot_trajectories

        last = self.learned_history[-1][1].get(name, {})
        locs = list(last)
        names = [f"{loc} L{l}" for loc in locs for l in range(last[loc].shape[0])]
        hist = [(s, np.concatenate([v[name][loc] for loc in locs])) for s, v in self.learned_history
                if list(v.get(name, {})) == locs and all(v[name][loc].shape == last[loc].shape for loc in locs)]
        return plot_trajectories(hist, self.dir / f"{name}_trajectories.png", layer_names=names,
                                 title=self.learned_titles[name], name=name)

    # ---- W&B extras ----------------------------------------------------------------------
    def _wandb_histograms(self, logger, results, step: int) -> None:
        data = {}
        for m in self.metrics:  # metrics with W&B histograms of their own (explained away)
            if hasattr(m, "wandb_histograms"):
                data.update(m.wandb_histograms(results))
        if data:
            logger.log_metrics(data, step=step)

    def _wandb_end(self, logger, files: list[Path], step: int) -> None:
        import wandb

        data: dict[str, Any] = {}
        for path in files:
            data[f"diag/images/{path.stem}"] = wandb.Image(str(path), caption=path.stem)
        steps = [s for s, _ in self.learned_history]
        for name in self.learned_titles:
            last = self.learned_history[-1][1].get(name, {}) if self.learned_history else {}
            for loc, final in last.items():
                rows = [v[name][loc] for _, v in self.learned_history
                        if loc in v.get(name, {}) and v[name][loc].shape == final.shape]
                if len(rows) != len(steps):
                    continue
                arr = np.stack(rows)  # (T, L, H)
                ys = [arr[:, l, h].tolist() for l in range(final.shape[0]) for h in range(final.shape[1])]
                keys = [f"L{l}/h{h}" for l in range(final.shape[0]) for h in range(final.shape[1])]
                data[f"diag/{name}_lines/{loc}"] = wandb.plot.line_series(
                    xs=steps, ys=ys, keys=keys, title=f"{name}, {loc}", xname="step")
        if data:
            logger.log_metrics(data, step=step)
        self._wandb_applicability(logger)

    def _wandb_applicability(self, logger) -> None:
        """Into the W&B run's summary, per location: each diagnostic that does not apply to the scheme's
        weights, with the reason (``diag/<loc>/<name>/not_applicable``), and each computed on a derived
        quantity (``diag/<loc>/<name>/computed_on``): a chart never shows such a number unexplained."""
        summary = logger.experiment.summary
        for loc, layers in (self.last or {}).items():
            scalars = location_scalars(layers, self.metrics)
            for name, why in (scalars.get("not_applicable") or {}).items():
                summary[f"diag/{loc}/{name}/not_applicable"] = why
            for name, what in (scalars.get("derived") or {}).items():
                summary[f"diag/{loc}/{name}/computed_on"] = what


def _learned_json(values: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, list]]:
    return {name: {loc: _finite_list(a) for loc, a in per_loc.items()} for name, per_loc in values.items()}


def _is_wandb(logger) -> bool:
    return type(logger).__name__ == "WandbLogger"
