"""Attention diagnostics.

* ``jsd``: head diversity as Jensen-Shannon divergence between heads (Zheng et al. 2021).
* ``explained_away``: attention mass per key, epsilon-explained-away keys, Theorem 2's
  -log Sk floor, attention entropy (Ding et al. 2020).
* ``mode_collapse``: Ding et al. Appendix E toy experiments and closed forms (Eqs. 13/14).
* ``plots``: heat maps, histograms and u trajectories (matplotlib, imported lazily).
* ``collector``: accumulators per (location, layer) fed from the model's attention output.
* ``repro``: the ``nas-repro`` command line.
"""
from nas_cli.diagnostics.collector import AttentionDiagnostics, collect_aux, location_masks
from nas_cli.diagnostics.explained_away import (
    DEFAULT_EPS,
    ExplainedAwayAccumulator,
    ExplainedAwayStats,
    column_log_mass,
    default_bin_edges,
    explained_away_stats,
    row_entropy,
)
from nas_cli.diagnostics.jsd import JSDAccumulator, head_jsd, head_jsd_per_sample, mean_pair_jsd

__all__ = [
    "AttentionDiagnostics",
    "collect_aux",
    "location_masks",
    "DEFAULT_EPS",
    "ExplainedAwayAccumulator",
    "ExplainedAwayStats",
    "column_log_mass",
    "default_bin_edges",
    "explained_away_stats",
    "row_entropy",
    "JSDAccumulator",
    "head_jsd",
    "head_jsd_per_sample",
    "mean_pair_jsd",
]
