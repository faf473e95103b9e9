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

from .explained_away import DEFAULT_EPS, ExplainedAwayAccumulator
from .jsd import JSDAccumulator, mean_pair_jsd

__all__ = ["location_masks", "AttentionDiagnostics", "collect_u"]

Masks = tuple[torch.Tensor | None, torch.Tensor | None]


def location_masks(src_mask: torch.Tensor | None = None, tgt_mask: torch.Tensor | None = None) -> dict[str, Masks]:
    """{location: (q_mask, k_mask)} for encoder, decoder and cross attention."""
    return {"encoder": (src_mask, src_mask), "decoder": (tgt_mask, tgt_mask), "cross": (tgt_mask, src_mask)}


def collect_u(attn: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """HNAS mixing weights from the ``aux`` of every layer: {location: u (layers, heads)}.
    Locations whose layers carry no ``u`` are left out."""
    out = {}
    for loc, layers in attn.items():
        us = [res.aux.get("u") for res in layers]
        if us and all(u is not None for u in us):
            out[loc] = np.stack([u.detach().cpu().double().numpy() for u in us])
    return out


class AttentionDiagnostics:
    """Accumulate head-JSD (CODA) and explaining-away statistics (Ding et al.) over
    validation batches for every location and layer.

    Usage per validation batch:
        logits, attn = model(src, tgt_in, need_weights=True)
        diag.update(attn, location_masks(src != pad, tgt_in != pad))
    and at the end ``diag.compute()`` (full results) or ``diag.scalars()`` (for a logger).
    """

    def __init__(self, eps: float = DEFAULT_EPS, bin_edges: np.ndarray | None = None,
                 jsd: bool = True, explained_away: bool = True):
        self.eps = eps
        self.bin_edges = bin_edges
        self.do_jsd = jsd
        self.do_ea = explained_away
        self.reset()

    def reset(self) -> None:
        self.jsd: dict[tuple[str, int], JSDAccumulator] = {}
        self.ea: dict[tuple[str, int], ExplainedAwayAccumulator] = {}
        self.signed: set[tuple[str, int]] = set()  # layers whose weights had negative entries

    @torch.no_grad()
    def update(self, attn: Mapping[str, Sequence[Any]], masks: Mapping[str, Masks]) -> None:
        for loc, layers in attn.items():
            q_mask, k_mask = masks.get(loc, (None, None))
            for i, res in enumerate(layers):
                w = res.weights
                if w is None:
                    raise ValueError(f"{loc} layer {i} returned no weights: call the model with need_weights=True")
                key = (loc, i)
                if bool((w < 0).any()):  # e.g. a linear kernel: not a distribution over keys
                    self.signed.add(key)
                if self.do_jsd:
                    self.jsd.setdefault(key, JSDAccumulator()).update(w, q_mask, k_mask)
                if self.do_ea:
                    acc = self.ea.setdefault(key, ExplainedAwayAccumulator(self.eps, self.bin_edges))
                    acc.update(w, q_mask, k_mask)

    def compute(self) -> dict[str, list[dict[str, Any]]]:
        """{location: [per layer {"jsd": (H, H) tensor, "jsd_mean": float,
        "explained_away": ExplainedAwayStats}]} (keys present for what was enabled). JSD and
        explained-away assume probability distributions over keys: a layer that produced a
        negative weight gets only {"signed_weights": True}."""
        keys = sorted(set(self.jsd) | set(self.ea), key=lambda k: (k[0], k[1]))
        out: dict[str, list[dict[str, Any]]] = {}
        for loc, i in keys:
            entry: dict[str, Any] = {}
            if (loc, i) in self.signed:  # not distributions: report that, not meaningless numbers
                out.setdefault(loc, []).append({"signed_weights": True})
                continue
            if (loc, i) in self.jsd:
                m = self.jsd[(loc, i)].compute()
                entry["jsd"] = m
                entry["jsd_mean"] = mean_pair_jsd(m)
            if (loc, i) in self.ea:
                entry["explained_away"] = self.ea[(loc, i)].compute()
            out.setdefault(loc, []).append(entry)
        return out

    def scalars(self, prefix: str = "diag") -> dict[str, float]:
        """Flat {name: float} for loggers: per location and layer the mean head JSD, the
        explained-away fraction, the minimum margin over -log Sk and the mean entropy
        (each averaged over heads; the margin is the minimum over heads)."""
        return flatten_results(self.compute(), prefix)


def flatten_results(results: dict, prefix: str = "diag", per_head_entropy: bool = False) -> dict[str, float]:
    """{location: [per-layer results]} (AttentionDiagnostics.compute) -> flat {name: float}:
    mean head JSD, explained-away fraction, minimum margin over -log Sk, mean entropy
    (and, if asked, the entropy of every head)."""
    flat: dict[str, float] = {}
    for loc, layers in results.items():
        for i, e in enumerate(layers):
            base = f"{prefix}/{loc}/layer{i}"
            if "jsd_mean" in e:
                flat[f"{base}/jsd_mean"] = e["jsd_mean"]
            if "explained_away" in e:
                s = e["explained_away"]
                flat[f"{base}/explained_away_frac"] = float(np.mean(s.fraction_explained_away))
                flat[f"{base}/min_log_mass_margin"] = float(np.min(s.min_margin))
                flat[f"{base}/entropy"] = float(np.mean(s.entropy))
                if per_head_entropy:
                    for h, v in enumerate(np.asarray(s.entropy).tolist()):
                        flat[f"{base}/entropy/h{h}"] = float(v)
    return flat
