"""Diagnostics defined for any attention weights, a distribution or not: the attention-sink rate
(Gu et al. 2024) and each query's row mass. Both are plug-ins of :mod:`nas_cli.diagnostics.metrics`
(``diagnostics.metrics.sink_rate`` and ``row_mass`` in conf/config.yaml)."""
from __future__ import annotations

import numpy as np
import torch

from nas_cli.diagnostics.metrics import LayerMetric, Reported, finite_list


class _PerHeadMean(LayerMetric):
    """A per-head mean over real queries of one number per query row (``row_value``)."""

    distributions_only = False

    def row_value(self, weights: torch.Tensor) -> torch.Tensor:  # (B, H, Sq, Sk) -> (B, H, Sq)
        raise NotImplementedError

    def update(self, location, layer, weights, q_mask, k_mask):
        per_row = self.row_value(weights.double())
        real = torch.ones(per_row.shape[0], per_row.shape[2], dtype=torch.bool) if q_mask is None else q_mask.cpu()
        per_row = per_row.cpu() * real[:, None, :]
        acc = self.acc.setdefault((location, layer), [0.0, 0])
        acc[0] = acc[0] + per_row.sum(dim=(0, 2)).numpy()
        acc[1] += int(real.sum())

    def head_means(self):
        return {key: np.asarray(total) / n for key, (total, n) in self.acc.items() if n}


class SinkRate(_PerHeadMean):
    """Attention sinks (Gu et al. 2024, "When Attention Sink Emerges in Language Models"): a head is a
    sink head when its mean weight on the first key, over the real queries, exceeds ``threshold``
    (their 0.3). Per layer the 0/1 of each head; per location the share of heads (``sink_rate``).
    Defined for any weights: for weights without a bound of 1 (a scheme's ``weight_max`` > 1) on each row's
    shares of its mass, and for weights with negative entries (differential attention, a linear kernel) on
    each row's shares of its absolute mass, so that 0.3 means the first key's share of what the row
    attends; either is said under ``derived``."""

    reported = (Reported("sink_rate", "sink rate", "pct"),)
    unit_scale = True  # 0.3 of a weight without a bound means nothing: then 0.3 of the row's mass

    def __init__(self, threshold: float = 0.3, **options):
        self.threshold = float(threshold)
        super().__init__(**options)

    def row_value(self, weights):
        return weights[..., 0]

    def compute(self):
        return {key: {"sink_rate": (m > self.threshold).astype(float), "first_key_weight": m}
                for key, m in self.head_means().items()}

    def layer_json(self, entry):
        return {k: finite_list(entry[k]) for k in ("sink_rate", "first_key_weight") if k in entry}


class RowMass(_PerHeadMean):
    """Each query's total weight sum_j w_ij, its mean per head over real queries (``row_mass``): 1 for a
    distribution, the attended share for sigmoid or stick-breaking attention (what they leave
    unattended is 1 minus it), 1 - lambda for differential attention."""

    reported = (Reported("row_mass", "row mass", "p3", column=False),)

    def row_value(self, weights):
        return weights.sum(-1)

    def compute(self):
        return {key: {"row_mass": m} for key, m in self.head_means().items()}
