"""Wiring helper: per-(location, layer) accumulators fed straight from a model's
``forward(..., need_weights=True)`` output ``{location: [AttentionOutput per layer]}``.

Masks per location (True = real token):
    encoder self-attention: (src_mask, src_mask)
    decoder self-attention: (tgt_mask, tgt_mask)  (the causal structure is in the weights)
    cross-attention:        (tgt_mask, src_mask)
``location_masks`` builds that mapping.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from nas_cli.diagnostics.explained_away import DEFAULT_EPS
from nas_cli.diagnostics.metrics import LayerMetric, build_metrics

__all__ = ["location_masks", "AttentionDiagnostics", "collect_aux"]

Masks = tuple[torch.Tensor | None, torch.Tensor | None]


def location_masks(src_mask: torch.Tensor | None = None, tgt_mask: torch.Tensor | None = None) -> dict[str, Masks]:
    """{location: (q_mask, k_mask)} for encoder, decoder and cross attention."""
    return {"encoder": (src_mask, src_mask), "decoder": (tgt_mask, tgt_mask), "cross": (tgt_mask, src_mask)}


def collect_aux(attn: Mapping[str, Sequence[Any]], name: str) -> dict[str, np.ndarray]:
    """One named value from the ``aux`` of every layer of a forward pass (e.g. a scheme's
    learned per-head value): {location: (layers, ...) array}. Locations whose layers do not all
    carry it are left out."""
    out = {}
    for loc, layers in attn.items():
        us = [res.aux.get(name) for res in layers]
        if us and all(u is not None for u in us):
            out[loc] = np.stack([u.detach().cpu().double().numpy() for u in us])
    return out


class AttentionDiagnostics:
    """Feed every location's and layer's attention weights to the diagnostics plug-ins
    (:mod:`.metrics`; default: head JSD, explained-away and, in cross-attention, step variation)
    over validation batches, and gather their results.

    Usage per validation batch:
        logits, attn = model(src, tgt_in, need_weights=True)
        diag.update(attn, location_masks(src != pad, tgt_in != pad))
    and at the end ``diag.compute()`` (full results) or ``diag.scalars()`` (for a logger).
    """

    def __init__(self, eps: float = DEFAULT_EPS, metrics: Sequence[LayerMetric] | None = None):
        if metrics is None:  # the shipped defaults (conf/config.yaml's diagnostics.metrics)
            metrics = build_metrics(None, eps)
        self.metrics = list(metrics)
        self.eps = eps
        self.reset()

    def reset(self) -> None:
        for m in self.metrics:
            m.reset()
        self.signed: set[tuple[str, int]] = set()  # layers whose weights had negative entries
        self.unnormalized: set[tuple[str, int]] = set()  # layers whose scheme declares rows_sum_to_one = False
        self.unbounded: set[tuple[str, int]] = set()  # layers whose scheme declares weight_max > 1
        self.seen: set[tuple[str, int]] = set()

    @torch.no_grad()
    def update(self, attn: Mapping[str, Sequence[Any]], masks: Mapping[str, Masks]) -> None:
        for loc, layers in attn.items():
            q_mask, k_mask = masks.get(loc, (None, None))
            for i, res in enumerate(layers):
                w = res.weights
                if w is None:
                    raise ValueError(f"{loc} layer {i} returned no weights: call the model with need_weights=True")
                key = (loc, i)
                self.seen.add(key)
                # declared by the scheme (AttentionOutput carries it); a negative weight from a scheme that
                # declares none is still not a distribution
                if not getattr(res, "nonnegative", True) or bool((w < 0).any()):
                    self.signed.add(key)
                if not getattr(res, "rows_sum_to_one", True):
                    self.unnormalized.add(key)
                if getattr(res, "weight_max", 1.0) > 1:
                    self.unbounded.add(key)
                shares: dict[bool, torch.Tensor] = {}  # row shares, of the mass (False) or absolute mass (True)
                for m in self.metrics:
                    if not m.wants(loc) or (m.distributions_only and key in self.signed):
                        continue
                    if m.distributions_only and key in self.unnormalized and not m.row_normalized_ok:
                        continue
                    given = w
                    absolute = m.unit_scale and key in self.signed
                    if absolute or (m.distributions_only and key in self.unnormalized) or \
                            (m.unit_scale and key in self.unbounded):
                        if absolute not in shares:
                            mass = w.abs() if absolute else w
                            shares[absolute] = mass / mass.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
                        given = shares[absolute]
                    m.update(loc, i, given, q_mask, k_mask)

    def compute(self) -> dict[str, list[dict[str, Any]]]:
        """{location: [per layer {key: value} from every metric]}. A layer that produced a
        negative weight gets ``{"signed_weights": True}`` instead of the results of the metrics
        that assume probability distributions (JSD, explained away)."""
        per_metric = [(m, m.compute()) for m in self.metrics]
        out: dict[str, list[dict[str, Any]]] = {}
        for loc, i in sorted(self.seen, key=lambda k: (k[0], k[1])):
            key = (loc, i)
            entry: dict[str, Any] = {"signed_weights": True} if key in self.signed else {}
            if key in self.unnormalized:
                entry["rows_sum_to_one"] = False
            if key in self.unbounded:
                entry["unbounded_weights"] = True
            for m, results in per_metric:
                if key in results and not (key in self.signed and m.distributions_only):
                    entry.update(results[key])
            out.setdefault(loc, []).append(entry)
        return out

    def scalars(self, prefix: str = "diag") -> dict[str, float]:
        """Flat {name: float} for loggers: every metric's per-layer scalars."""
        return flatten_results(self.compute(), prefix, self.metrics)


def flatten_results(results: dict, prefix: str = "diag", metrics: Sequence[LayerMetric] | None = None,
                    per_head_entropy: bool = False) -> dict[str, float]:
    """{location: [per-layer results]} -> flat {prefix/location/layer<i>/key: float} from each
    metric's ``layer_scalars`` (default metrics when none are given)."""
    metrics = metrics if metrics is not None else AttentionDiagnostics().metrics
    flat: dict[str, float] = {}
    for loc, layers in results.items():
        for i, e in enumerate(layers):
            for m in metrics:
                for key, value in m.layer_scalars(e).items():
                    if per_head_entropy or "/h" not in key:
                        flat[f"{prefix}/{loc}/layer{i}/{key}"] = value
    return flat
