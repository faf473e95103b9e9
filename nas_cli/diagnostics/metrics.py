"""Diagnostics as plug-ins: one object per metric, chosen in ``diagnostics.metrics``.

A metric sees the attention weights of every location and layer on a few validation batches
and turns them into numbers. The callback (:mod:`.callback`) and ``nas-report`` only talk to
this interface, so a new metric is one class (anywhere importable) plus one entry under
``diagnostics.metrics`` in the config, e.g.::

    diagnostics:
      metrics:
        max_weight: {_target_: my_metrics.MaxWeight}

The interface, per analysed validation:

* ``reset()``; ``update(location, layer, weights, q_mask, k_mask)`` for each batch, with the
  layer's (B, H, Sq, Sk) weights and the (B, Sq) / (B, Sk) padding masks (True = real);
* ``compute() -> {(location, layer): {key: value}}``: what the metric adds to that layer's
  results (merged with the other metrics' keys);
* ``layer_json(entry)`` / ``layer_scalars(entry)``: the JSON written to
  ``diagnostics/step_<N>.json`` and the scalars logged per layer (``diag/<loc>/layer<i>/<key>``);
* ``location_scalars(entries)``: the per-location summary (``diagnostics/summary.json``);
  the keys named in ``columns`` are what ``nas-report`` shows as table columns, labelled
  as given, averaged over locations;
* ``figures(results, folder, step)``: optional PNGs (paths returned).

``distributions_only = True`` (the default) means the metric assumes each row of weights is a
probability distribution; layers whose weights have negative entries (a linear kernel) are not
given to it, and their entries say ``signed_weights`` instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from nas_cli.diagnostics.explained_away import DEFAULT_EPS, ExplainedAwayAccumulator
from nas_cli.diagnostics.jsd import JSDAccumulator, mean_pair_jsd

#: why a location's JSD / explained-away read null (diagnostics files; nas-report reads it: nas_cli/report/compare.py)
SIGNED_NOTE = ("attention weights with negative entries (e.g. attention.kernel=linear): JSD and explained-away "
               "assume probability distributions over keys and are undefined (null)")

Key = tuple[str, int]


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


class LayerMetric:
    """Base class of a diagnostic (see the module docstring for the interface)."""

    #: the name in ``diagnostics.metrics`` (set from the config key)
    name: str = "metric"
    #: location-level keys that nas-report shows: {key: (column label, format: "p3" | "pct" | "g")}
    columns: dict[str, tuple[str, str]] = {}
    #: only for weights that are probability distributions over keys
    distributions_only: bool = True
    #: the locations it applies to (None: all)
    locations: tuple[str, ...] | None = None
    #: location-level keys that read None where its numbers are undefined (weights with negative entries)
    null_scalars: tuple[str, ...] = ()

    def __init__(self, **options: Any):
        self.options = options
        self.reset()

    def reset(self) -> None:
        self.acc: dict[Key, Any] = {}

    def wants(self, location: str) -> bool:
        return self.locations is None or location in self.locations

    def update(self, location: str, layer: int, weights: torch.Tensor, q_mask: torch.Tensor | None,
               k_mask: torch.Tensor | None) -> None:
        raise NotImplementedError

    def compute(self) -> dict[Key, dict[str, Any]]:
        raise NotImplementedError

    def layer_json(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {}

    def layer_scalars(self, entry: dict[str, Any]) -> dict[str, float]:
        return {}

    def location_scalars(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def figures(self, results: dict[str, list[dict[str, Any]]], folder: Path, step: int | None) -> list[Path]:
        return []


class HeadJSD(LayerMetric):
    """Head diversity: the H x H Jensen-Shannon divergences between the heads' attention
    distributions and their pair mean (Zheng et al. 2021, CODA)."""

    columns = {"jsd_mean": ("JSD", "p3")}
    null_scalars = ("jsd_mean",)

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

    def layer_scalars(self, entry):
        return {"jsd_mean": entry["jsd_mean"]} if "jsd_mean" in entry else {}

    def location_scalars(self, entries):
        jsd = [e["jsd_mean"] for e in entries if "jsd_mean" in e]
        return {"jsd_mean": finite(np.mean(jsd)), "jsd_mean_per_layer": [finite(v) for v in jsd]} if jsd else {}

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

    columns = {"explained_away_frac": ("expl. away", "pct")}
    null_scalars = ("explained_away_frac", "entropy_mean", "min_margin")

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
                "min_margin": finite(min(margin)), "min_margin_per_layer": [finite(m) for m in margin],
                "neg_log_sk": finite(min(s.neg_log_sk for s in ea))}

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

    columns: dict[str, tuple[str, str]] = {}  # in nas-report's HTML diagnostics table, not its main table
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

    def layer_json(self, entry):
        return {"step_variation": finite_list(entry["step_variation"])} if "step_variation" in entry else {}

    def layer_scalars(self, entry):
        return {"step_variation": float(np.mean(entry["step_variation"]))} if "step_variation" in entry else {}

    def location_scalars(self, entries):
        var = [float(np.mean(e["step_variation"])) for e in entries if "step_variation" in e]
        return {"step_variation": float(np.mean(var)), "step_variation_per_layer": var} if var else {}


#: the metrics a run computes when the config names none (``diagnostics.metrics`` overrides)
DEFAULT_METRICS = {"jsd": HeadJSD, "explained_away": ExplainedAway, "step_variation": StepVariation}


def build_metrics(spec: dict[str, Any] | None, eps: float = DEFAULT_EPS) -> list[LayerMetric]:
    """Metric objects from ``diagnostics.metrics`` ({name: {_target_, options} or null}); a
    null entry switches a metric off. ``eps`` is the default epsilon of explained-away."""
    from hydra.utils import instantiate

    if spec is None:
        spec = {name: {} for name in DEFAULT_METRICS}
    metrics = []
    for name, options in spec.items():
        if options is None:
            continue
        options = dict(options)
        if "_target_" in options:
            metric = instantiate(options, _convert_="all")
        elif name in DEFAULT_METRICS:
            cls = DEFAULT_METRICS[name]
            metric = cls(eps=eps, **options) if cls is ExplainedAway else cls(**options)
        else:
            raise ValueError(f"diagnostics.metrics.{name} has no _target_ (a LayerMetric class to use)")
        if not isinstance(metric, LayerMetric):
            raise ValueError(f"diagnostics.metrics.{name}: {type(metric).__name__} is not a LayerMetric "
                             "(nas_cli.diagnostics.metrics)")
        metric.name = name
        metrics.append(metric)
    return metrics
