"""Diagnostics as plug-ins: one object per metric, chosen in ``diagnostics.metrics``.

A metric sees the attention weights of every location and layer on a few validation batches
and turns them into numbers. The callback (:mod:`.callback`) and ``nas-report`` only talk to
this interface, so a new metric is one class (anywhere importable) plus one entry under
``diagnostics.metrics`` in the config, e.g.::

    diagnostics:
      metrics:
        max_weight: {_target_: my_metrics.MaxWeight}

What a metric declares, in its class:

* ``reported``: the numbers ``nas-report`` shows and compares (:class:`Reported`: the name of
  ``--metrics <name>``, the column title and format, how a run's locations make one number);
  the run writes the declarations into ``diagnostics/summary.json``, and the report, its HTML
  page and W&B's report run read them from there: nothing else lists a diagnostic.
* ``distributions_only`` (default True): the metric assumes each row of weights is a probability
  distribution. What a scheme declares of its weights (``nonnegative``, ``rows_sum_to_one``:
  nas_cli/attention/base.py, carried by each AttentionOutput) decides what it is given: weights
  with negative entries (a linear kernel, differential attention) are not given to it, its
  reported numbers read None there, and the location says why (``not_applicable``, by reported
  name, and the words of :mod:`.notes`); nonnegative weights whose rows do not sum to 1 (sigmoid,
  softpick, stick-breaking without attend-to-self) are given row-normalized, w_ij / sum_j' w_ij',
  when the metric sets ``row_normalized_ok`` (the location then lists it under ``derived``), and
  are not applicable otherwise.

What it does, per analysed validation: ``reset()`` empties ``self.acc`` (its state per
(location, layer)); ``update(location, layer, weights, q_mask, k_mask)`` sees each batch's
(B, H, Sq, Sk) weights of a layer with the (B, Sq) / (B, Sk) padding masks (True = real);
``compute() -> {(location, layer): {key: value}}`` gives what it adds to that layer's results.
The rest has defaults built from ``reported`` (override them for more): ``layer_json`` (the
reported keys into ``diagnostics/step_<N>.json``), ``layer_scalars`` (their mean over heads,
logged as ``diag/<loc>/layer<i>/<key>``), ``location_scalars`` (over layers, mean or min as
declared, into ``diagnostics/summary.json``) and ``figures(results, folder, step)`` (none).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from nas_cli.diagnostics.explained_away import DEFAULT_EPS, ExplainedAwayAccumulator, log_floor
from nas_cli.diagnostics.jsd import JSDAccumulator, mean_pair_jsd

Key = tuple[str, int]

#: rows of a report's JSD heat maps per location; further rows are left out
MAX_HEATMAP_ROWS = 16


def finite(x) -> float | None:
    """float, with NaN and +-inf as None (JSON has neither)."""
    x = float(x)
    return x if np.isfinite(x) else None


def finite_list(a) -> Any:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().double().numpy()
    a = np.asarray(a, dtype=float)
    if a.ndim == 0:
        return finite(a)
    return [finite_list(x) if a.ndim > 1 else finite(x) for x in a]


def mean_or_none(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else float(np.mean(values))


class Reported(NamedTuple):
    """A number of a diagnostic that ``nas-report`` shows and compares over seeds."""

    #: ``nas-report --metrics <name>`` (``<name>:<location>`` for one location)
    name: str
    #: the column title (main table and the HTML page's diagnostics table)
    title: str
    #: how a value is printed: "p3" (3 decimals), "pct" (a share, as %), "g" (3 significant digits)
    format: str = "p3"
    #: the location-level key in diagnostics/summary.json (None: the name)
    key: str | None = None
    #: how a run's locations (and a location's layers) make one number: "mean" or "min"
    over_locations: str = "mean"
    #: a column of the main table (False: the HTML page's diagnostics table only)
    column: bool = True

    @property
    def field(self) -> str:
        return self.key or self.name

    def combine(self, values: list[float]) -> float:
        return float(min(values)) if self.over_locations == "min" else float(np.mean(values))


class FigureRow(NamedTuple):
    """One row of ``nas-report --html`` (runs that differ only by seed), as a diagnostic's page
    figures see it: ``runs`` holds each run's layer entries at one location, as in
    ``diagnostics/latest.json`` (what :meth:`LayerMetric.layer_json` wrote)."""

    task: str
    heads: int | None
    label: str  # the row's label in the page's tables
    series: str  # what the row compares (the scheme), for overlays
    runs: list[list[dict[str, Any]]]


class LayerMetric:
    """Base class of a diagnostic (see the module docstring for the interface)."""

    #: the name in ``diagnostics.metrics`` (set from the config key)
    name: str = "metric"
    #: what nas-report shows and compares (see :class:`Reported`)
    reported: tuple[Reported, ...] = ()
    #: only for weights that are probability distributions over keys
    distributions_only: bool = True
    #: a distribution metric that is defined on row-normalized weights when a scheme's nonnegative
    #: rows do not sum to 1 (the share of a query's attended mass); False: not applicable there
    row_normalized_ok: bool = False
    #: reads a weight on an absolute scale (the sink rate's threshold): where a scheme declares weights without a
    #: bound of 1 (``weight_max`` > 1, ReLU attention without its scale) it is given each row's shares of its
    #: mass, w_ij / sum_j' w_ij'; where weights have negative entries (differential attention, a linear
    #: kernel), each row's shares of its absolute mass, |w_ij| / sum_j' |w_ij'|; the location lists either
    #: under ``derived``
    unit_scale: bool = False
    #: the locations it applies to (None: all)
    locations: tuple[str, ...] | None = None

    def __init__(self, **options: Any):
        self.options = options
        self.reset()

    def reset(self) -> None:
        """Empty the state: ``self.acc``, {(location, layer): whatever ``update`` accumulates}."""
        self.acc: dict[Key, Any] = {}

    def wants(self, location: str) -> bool:
        return self.locations is None or location in self.locations

    def update(self, location: str, layer: int, weights: torch.Tensor, q_mask: torch.Tensor | None,
               k_mask: torch.Tensor | None) -> None:
        raise NotImplementedError

    def compute(self) -> dict[Key, dict[str, Any]]:
        raise NotImplementedError

    def layer_json(self, entry: dict[str, Any]) -> dict[str, Any]:
        """What goes into diagnostics/step_<N>.json for one layer: the reported keys' values."""
        return {r.field: finite_list(entry[r.field]) for r in self.reported if r.field in entry}

    def layer_scalars(self, entry: dict[str, Any]) -> dict[str, float]:
        """What is logged for one layer: each reported key's mean over heads."""
        return {r.field: float(np.mean(entry[r.field])) for r in self.reported if r.field in entry}

    def location_scalars(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """One location's numbers (diagnostics/summary.json): each reported key over the layers, and per layer."""
        out: dict[str, Any] = {}
        for r in self.reported:
            per_layer = [float(np.mean(e[r.field])) for e in entries if r.field in e]
            if per_layer:
                out.update({r.field: finite(r.combine(per_layer)), f"{r.field}_per_layer": [finite(v) for v in per_layer]})
        return out

    def figures(self, results: dict[str, list[dict[str, Any]]], folder: Path, step: int | None) -> list[Path]:
        return []

    #: the HTML page's section for :meth:`report_figures`: (heading, a note under it, or "")
    report_section: tuple[str, str] | None = None

    @classmethod
    def report_figures(cls, rows: list[FigureRow], location: str) -> list[tuple[str, bytes]]:
        """The HTML page's figures of one location over the report's rows: [(caption, PNG)]."""
        return []


class HeadJSD(LayerMetric):
    """Head diversity: the H x H Jensen-Shannon divergences between the heads' attention
    distributions and their pair mean (Zheng et al. 2021, CODA)."""

    reported = (Reported("jsd", "JSD", "p3", key="jsd_mean"),)
    row_normalized_ok = True

    def update(self, location, layer, weights, q_mask, k_mask):
        self.acc.setdefault((location, layer), JSDAccumulator()).update(weights, q_mask, k_mask)

    def compute(self):
        out = {}
        for key, acc in self.acc.items():
            m = acc.compute()
            out[key] = {"jsd": m, "jsd_mean": mean_pair_jsd(m)}
        return out

    def layer_json(self, entry):
        return {"jsd": finite_list(entry["jsd"]), "jsd_mean": entry["jsd_mean"]} if "jsd" in entry else {}

    report_section = ("Head JSD heat maps", "")

    @classmethod
    def report_figures(cls, rows, location):
        """All rows' JSD matrices side by side, each layer's the mean over the row's runs (CODA Figs. 2/4)."""
        from nas_cli.diagnostics.figures import heatmap_grid

        panels = []
        for row in rows:
            runs = [r for r in row.runs if r and all("jsd" in e for e in r)]
            mats = []
            for i in range(min((len(r) for r in runs), default=0)):
                ms = [np.asarray(r[i]["jsd"], dtype=float) for r in runs]
                if not all(m.shape == ms[0].shape for m in ms):
                    break
                mats.append(np.mean(ms, axis=0))
            if mats:
                panels.append((f"{row.task} {row.label}", mats))
        if not panels:
            return []
        title = f"head JSD, {location} attention (rows: runs, columns: layers)"
        return [(f"{location} attention", heatmap_grid(panels[:MAX_HEATMAP_ROWS], title))]

    def figures(self, results, folder, step):
        from nas_cli.diagnostics.figures import plot_jsd_heatmaps

        files = []
        for loc, layers in results.items():
            mats = [e["jsd"] for e in layers if "jsd" in e]
            if mats:
                files.append(plot_jsd_heatmaps(mats, folder / f"jsd_{loc}.png",
                                               suptitle=f"head JSD, {loc} attention, step {step}"))
        return files


class ExplainedAway(LayerMetric):
    """Ding et al. 2020: the attention mass sum_i pi_ij each key receives (histogram of its
    log), the share of epsilon-explained-away keys, the margin over Theorem 2's -log Sk floor,
    and the entropy of the rows."""

    reported = (Reported("explained_away", "expl. away", "pct", key="explained_away_frac"),
                Reported("min_margin", "min margin over -log Sk", "g", over_locations="min", column=False),
                Reported("entropy", "entropy", "p3", key="entropy_mean", column=False))

    row_normalized_ok = True

    def __init__(self, eps: float = DEFAULT_EPS, bin_edges=None, **options):
        self.eps, self.bin_edges = float(eps), bin_edges
        super().__init__(**options)

    def update(self, location, layer, weights, q_mask, k_mask):
        acc = self.acc.setdefault((location, layer), ExplainedAwayAccumulator(self.eps, self.bin_edges))
        acc.update(weights, q_mask, k_mask)

    def compute(self):
        return {key: {"explained_away": acc.compute()} for key, acc in self.acc.items()}

    def layer_json(self, entry):
        s = entry.get("explained_away")
        return {} if s is None else {"explained_away": s.to_dict(), "entropy": finite_list(s.entropy)}

    def layer_scalars(self, entry):
        s = entry.get("explained_away")
        if s is None:
            return {}
        return {"explained_away_frac": float(np.mean(s.fraction_explained_away)),
                "min_log_mass_margin": float(np.min(s.min_margin)), "entropy": float(np.mean(s.entropy)),
                **{f"entropy/h{h}": float(v) for h, v in enumerate(np.asarray(s.entropy).tolist())}}

    def location_scalars(self, entries):
        ea = [e["explained_away"] for e in entries if "explained_away" in e]
        if not ea:
            return {}
        frac = [finite(np.mean(s.fraction_explained_away)) for s in ea]
        ent = [finite(np.mean(s.entropy)) for s in ea]
        margin = [float(np.min(s.min_margin)) for s in ea]
        return {"explained_away_frac": mean_or_none(frac), "explained_away_frac_per_layer": frac,
                "entropy_mean": mean_or_none(ent), "entropy_per_layer": ent,
                "min_margin": log_floor(min(margin)), "min_margin_per_layer": [log_floor(m) for m in margin],
                "neg_log_sk": finite(min(s.neg_log_sk for s in ea))}

    report_section = ("Explained away: log sum_i pi_ij per key",
                      "Ding et al. 2020 Fig. 1: under DNAS every key keeps mass &gt;= 1/Sk (dashed line, non-causal "
                      "encoder); under UNAS keys can be explained away.")

    @classmethod
    def report_figures(cls, rows, location):
        """Per task and number of heads, the rows' histograms of log sum_i pi_ij overlaid (counts summed
        over layers, heads and seeds), with Theorem 2's -log Sk line."""
        from nas_cli.diagnostics.figures import log_mass_overlay

        panels: dict[tuple, dict[str, np.ndarray]] = {}
        edges_of: dict[tuple, np.ndarray] = {}
        sk_max: dict[tuple, int] = {}
        for row in rows:
            key, total = (row.task, row.heads), None
            for ea in (e.get("explained_away") for run in row.runs for e in run):
                edges = np.asarray((ea or {}).get("bin_edges", []), dtype=float)
                if not ea or (key in edges_of and not np.array_equal(edges_of[key], edges)):
                    continue  # no histogram, or other bins: cannot be overlaid
                edges_of.setdefault(key, edges)
                counts = np.asarray(ea["counts"], dtype=float).sum(0)
                total = counts if total is None else total + counts
                sk_max[key] = max(sk_max.get(key, 0), int(ea.get("sk_max") or 0))
            if total is not None:
                panels.setdefault(key, {})[row.series] = total
        out = []
        for (task, heads), hists in sorted(panels.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            neg = -math.log(sk_max[(task, heads)]) if sk_max.get((task, heads)) else None
            title = f"{task}, {location} attention, {heads} heads"
            out.append((title, log_mass_overlay(hists, edges_of[(task, heads)], neg, title)))
        return out

    def figures(self, results, folder, step):
        from nas_cli.diagnostics.figures import plot_log_mass_histograms

        files = []
        for loc, layers in results.items():
            hists = {f"layer {i}": e["explained_away"] for i, e in enumerate(layers) if "explained_away" in e}
            if hists:
                files.append(plot_log_mass_histograms(hists, folder / f"explained_away_{loc}.png",
                                                      title=f"{loc} attention: log sum_i pi_ij per key, step {step}"))
        return files

    def wandb_histograms(self, results) -> dict[str, Any]:
        """W&B histograms of log sum_i pi_ij per location and layer (heads summed)."""
        import wandb

        data = {}
        for loc, layers in results.items():
            for i, e in enumerate(layers):
                s = e.get("explained_away")
                if s is not None:
                    data[f"diag/{loc}/layer{i}/log_mass_hist"] = wandb.Histogram(
                        np_histogram=(np.asarray(s.counts).sum(0).tolist(), np.asarray(s.bin_edges).tolist()))
        return data


class StepVariation(LayerMetric):
    """Cross-attention: per head the largest change max_j |pi_ij - pi_0j| of the attention over
    the source across the real decoder steps i, averaged over samples. 0 when the attention
    ignores the decoder state, as one-layer additive attention provably does (the blog post "Why Bahdanau's neural attention requires two layers")."""

    reported = (Reported("step_variation", "step variation", "p3", column=False),)  # the HTML page's table
    locations = ("cross",)
    distributions_only = False

    def update(self, location, layer, weights, q_mask, k_mask):
        from nas_cli.attention.additive import step_variation

        var = step_variation(weights.double(), q_mask)  # (B, H)
        valid = q_mask.any(-1) if q_mask is not None else torch.ones(var.size(0), dtype=torch.bool)
        acc = self.acc.setdefault((location, layer), [0.0, 0])
        acc[0] = acc[0] + var[valid].sum(0).cpu().numpy()
        acc[1] += int(valid.sum())

    def compute(self):
        return {key: {"step_variation": np.asarray(total) / n} for key, (total, n) in self.acc.items() if n}


def default_spec(eps: float = DEFAULT_EPS) -> dict[str, Any]:
    """The diagnostics a run computes unless told otherwise: ``diagnostics.metrics`` of the shipped
    conf/config.yaml (the one list), with explained-away's epsilon ``eps``."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    config = OmegaConf.load(files("nas_cli.conf") / "config.yaml")
    config.diagnostics.eps = float(eps)
    return OmegaConf.to_container(config.diagnostics.metrics, resolve=True)


def build_metrics(spec: dict[str, Any] | None, eps: float = DEFAULT_EPS) -> list[LayerMetric]:
    """Metric objects from ``diagnostics.metrics`` ({name: {_target_, options} or null}; None: the
    defaults of :func:`default_spec`); a null entry switches a metric off."""
    from hydra.utils import instantiate

    metrics = []
    for name, options in (default_spec(eps) if spec is None else spec).items():
        if options is None:
            continue
        if "_target_" not in options:
            raise ValueError(f"diagnostics.metrics.{name} has no _target_ (a LayerMetric class to use)")
        metric = instantiate(dict(options), _convert_="all")
        if not isinstance(metric, LayerMetric):
            raise ValueError(f"diagnostics.metrics.{name}: {type(metric).__name__} is not a LayerMetric "
                             "(nas_cli.diagnostics.metrics)")
        metric.name = name
        metrics.append(metric)
    return metrics
