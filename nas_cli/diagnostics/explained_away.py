"""Explaining-away statistics of attention weights (Ding et al. 2020, Sec. 4 and Fig. 1).

For one layer and head, the attention mass a key receives is
    m_j = sum_i pi_ij            (sum over the sample's real queries i)
and key j is epsilon-explained-away when m_j < epsilon (the paper uses epsilon = 1e-8).
Theorem 2: under DNAS (non-causal, no padding inside the normalization) every key has
m_j >= 1 / Sk, i.e. log m_j >= -log Sk, with Sk the number of real keys of the sample.
UNAS has no such floor: Fig. 1 shows most of its log m_j below -20.

Reported per head: histogram counts of log_e m_j over fixed bins (so histograms from
several batches or runs add up and can be overlaid), the fraction of explained-away keys,
the minimum of log m_j and its margin over -log Sk (>= 0 when Theorem 2's bound holds),
and the attention entropy (mean over real queries of -sum_j p log p).
Only real keys enter the statistics; only real queries enter the column sums.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "DEFAULT_EPS",
    "default_bin_edges",
    "column_log_mass",
    "row_entropy",
    "ExplainedAwayStats",
    "ExplainedAwayAccumulator",
    "explained_away_stats",
]

DEFAULT_EPS = 1e-8  # Ding et al.: epsilon-explained-away with epsilon = 1e-8
#: log of float32's smallest subnormal: what a log mass of -inf (a key whose float32 weights all underflowed to 0)
#: is written as, in JSON and to loggers (neither takes -inf); a null then always means "does not apply"
LOG_FLOAT32_TINY = math.log(float(np.finfo(np.float32).smallest_subnormal))


def log_floor(x) -> float | None:
    """A log quantity for JSON: -inf as :data:`LOG_FLOAT32_TINY`, NaN (nothing measured) as None."""
    x = float(x)
    return None if math.isnan(x) else LOG_FLOAT32_TINY if x == -math.inf else x


#: log-margin below which a key counts as violating m_j >= 1/Sk (float32 weights round)
DEFAULT_BOUND_TOL = 1e-5


def default_bin_edges(lo: float = -50.0, hi: float = 1.0, width: float = 0.5) -> np.ndarray:
    """Fixed bin edges for histograms of log_e m_j: (n_bins + 1,) from ``lo`` to ``hi``.

    Values below ``lo`` (including log 0 = -inf) are counted in the first bin and values
    above ``hi`` in the last, so no key is dropped; the first bin therefore reads "<= lo".
    """
    n = int(round((hi - lo) / width))
    if n < 1:
        raise ValueError(f"need hi > lo and 0 < width <= hi - lo (got lo={lo}, hi={hi}, width={width})")
    return np.linspace(lo, hi, n + 1)


def column_log_mass(
    weights: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    k_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_e sum_i pi_ij over real queries.

    weights (B, H, Sq, Sk) -> (log_mass (B, H, Sk) in ``dtype`` (-inf for zero mass),
    key_real (B, Sk) bool, n_keys (B,) number of real keys per sample).
    Entries of padded keys are meaningless; select them out with ``key_real``.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, Sq, Sk), got shape {tuple(weights.shape)}")
    b, _, _, sk = weights.shape
    w = weights.detach().to(dtype)
    if q_mask is not None:  # padded queries carry no attention mass
        w = w * q_mask[:, None, :, None].to(dtype)
    mass = w.sum(dim=-2)  # (B, H, Sk)
    key_real = (torch.ones(b, sk, dtype=torch.bool, device=w.device) if k_mask is None
                else k_mask.to(torch.bool))
    return torch.log(mass), key_real, key_real.sum(-1)


def row_entropy(
    weights: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    k_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention entropy per query row, -sum_j p log p over real keys (0 log 0 = 0).

    weights (B, H, Sq, Sk) -> (entropy (B, H, Sq), query_real (B, Sq) bool).
    """
    w = weights.detach().to(dtype)
    if k_mask is not None:
        w = w * k_mask[:, None, None, :].to(dtype)
    ent = -torch.special.xlogy(w, w).sum(-1)  # xlogy(0, 0) = 0
    b, _, sq, _ = w.shape
    query_real = (torch.ones(b, sq, dtype=torch.bool, device=w.device) if q_mask is None
                  else q_mask.to(torch.bool))
    return ent, query_real


@dataclass
class ExplainedAwayStats:
    """Per-head explaining-away statistics of one attention layer (H heads).

    counts (H, n_bins): histogram of log_e m_j over real keys, bins ``bin_edges`` (n_bins + 1,).
    n_keys: real keys counted per head (same for every head).
    fraction_explained_away (H,): fraction of keys with m_j < eps.
    min_log_mass (H,): min_j log m_j (-inf when some key got exactly zero mass).
    min_margin (H,): min_j (log m_j + log Sk_sample); >= 0 iff every key satisfies Theorem 2.
    fraction_below_bound (H,): fraction of keys with log m_j < -log Sk - bound_tol.
    entropy (H,): mean over all real query rows of -sum_j p log p.
    sk_min, sk_max: smallest / largest number of real keys in a sample; -log sk_max is the
    bound that holds for every sample (the line drawn on histograms).
    """

    eps: float
    bin_edges: np.ndarray
    counts: np.ndarray
    n_keys: int
    n_explained_away: np.ndarray
    fraction_explained_away: np.ndarray
    min_log_mass: np.ndarray
    min_margin: np.ndarray
    n_below_bound: np.ndarray
    fraction_below_bound: np.ndarray
    entropy: np.ndarray
    n_queries: int
    sk_min: int
    sk_max: int

    @property
    def neg_log_sk(self) -> float:
        """-log Sk for the largest Sk seen: a lower bound valid for every sample under DNAS."""
        return -math.log(self.sk_max) if self.sk_max > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly (lists, floats; a log mass or margin of -inf written as the float32 floor
        :data:`LOG_FLOAT32_TINY`, so that null means only "not applicable")."""
        def clean(a):
            a = np.asarray(a, dtype=float)
            return [None if not np.isfinite(v) else float(v) for v in a.ravel()]

        def logs(a):
            return [log_floor(v) for v in np.asarray(a, dtype=float).ravel()]

        return {
            "eps": self.eps,
            "bin_edges": [float(v) for v in self.bin_edges],
            "counts": np.asarray(self.counts).astype(int).tolist(),
            "n_keys": int(self.n_keys),
            "fraction_explained_away": clean(self.fraction_explained_away),
            "min_log_mass": logs(self.min_log_mass),
            "min_margin": logs(self.min_margin),
            "fraction_below_bound": clean(self.fraction_below_bound),
            "entropy": clean(self.entropy),
            "n_queries": int(self.n_queries),
            "sk_min": int(self.sk_min),
            "sk_max": int(self.sk_max),
            "neg_log_sk": self.neg_log_sk,
        }


class ExplainedAwayAccumulator:
    """Accumulates explaining-away statistics of one layer over validation batches.

    Histograms use fixed ``bin_edges`` so that counts from several batches, layers or runs
    can be summed (``merge``) and overlaid.
    """

    def __init__(self, eps: float = DEFAULT_EPS, bin_edges: np.ndarray | None = None,
                 bound_tol: float = DEFAULT_BOUND_TOL):
        self.eps = float(eps)
        self.log_eps = math.log(self.eps)
        self.bin_edges = default_bin_edges() if bin_edges is None else np.asarray(bin_edges, dtype=float)
        self.bound_tol = float(bound_tol)
        self.reset()

    def reset(self) -> None:
        self.heads: int | None = None
        self.counts: np.ndarray | None = None  # (H, n_bins)
        self.n_keys = 0
        self.n_explained: np.ndarray | None = None  # (H,)
        self.n_below: np.ndarray | None = None  # (H,)
        self.min_log_mass: np.ndarray | None = None  # (H,)
        self.min_margin: np.ndarray | None = None  # (H,)
        self.entropy_sum: np.ndarray | None = None  # (H,)
        self.n_queries = 0
        self.sk_min = None
        self.sk_max = None

    def _init(self, h: int) -> None:
        if self.heads is None:
            self.heads = h
            nb = len(self.bin_edges) - 1
            self.counts = np.zeros((h, nb), dtype=np.int64)
            self.n_explained = np.zeros(h, dtype=np.int64)
            self.n_below = np.zeros(h, dtype=np.int64)
            self.min_log_mass = np.full(h, np.inf)
            self.min_margin = np.full(h, np.inf)
            self.entropy_sum = np.zeros(h)
        elif self.heads != h:
            raise ValueError(f"accumulator holds {self.heads} heads, got weights with {h}")

    def update(self, weights: torch.Tensor, q_mask: torch.Tensor | None = None,
               k_mask: torch.Tensor | None = None, max_elements: int = 1 << 24) -> None:
        """Add one batch of (B, H, Sq, Sk) weights with masks (True = real token), in
        chunks of samples of about ``max_elements`` weights (bounds the float64 copies)."""
        b, h, sq, sk = weights.shape
        chunk = max(1, max_elements // max(h * sq * sk, 1))
        for s in range(0, b, chunk):
            self._update(weights[s : s + chunk],
                         None if q_mask is None else q_mask[s : s + chunk],
                         None if k_mask is None else k_mask[s : s + chunk])

    def _update(self, weights: torch.Tensor, q_mask: torch.Tensor | None, k_mask: torch.Tensor | None) -> None:
        h = weights.shape[1]
        self._init(h)
        log_mass, key_real, n_keys = column_log_mass(weights, q_mask, k_mask)
        # -log Sk per sample, broadcast to keys: (B, 1, Sk)
        log_sk = torch.log(n_keys.to(log_mass.dtype))[:, None, None].expand_as(log_mass)
        sel = key_real[:, None, :].expand_as(log_mass)  # (B, H, Sk)
        # (H, n_real_keys): move heads first, keep only real keys
        lm = log_mass.transpose(0, 1)[sel.transpose(0, 1)].reshape(h, -1).cpu().numpy()
        margin = (log_mass + log_sk).transpose(0, 1)[sel.transpose(0, 1)].reshape(h, -1).cpu().numpy()
        if lm.shape[1] > 0:
            self.n_keys += lm.shape[1]
            self.n_explained += (lm < self.log_eps).sum(1)  # m_j < eps  <=>  log m_j < log eps
            self.n_below += (margin < -self.bound_tol).sum(1)
            self.min_log_mass = np.minimum(self.min_log_mass, lm.min(1))
            self.min_margin = np.minimum(self.min_margin, margin.min(1))
            lo, hi = self.bin_edges[0], self.bin_edges[-1]
            clipped = np.clip(lm, lo, hi)  # -inf and far tails land in the edge bins
            for i in range(h):
                self.counts[i] += np.histogram(clipped[i], bins=self.bin_edges)[0]
            real_sk = n_keys[n_keys > 0]
            if real_sk.numel():
                smin, smax = int(real_sk.min()), int(real_sk.max())
                self.sk_min = smin if self.sk_min is None else min(self.sk_min, smin)
                self.sk_max = smax if self.sk_max is None else max(self.sk_max, smax)
        ent, query_real = row_entropy(weights, q_mask, k_mask)  # (B, H, Sq), (B, Sq)
        qsel = query_real[:, None, :].expand_as(ent)
        ent_h = ent.transpose(0, 1)[qsel.transpose(0, 1)].reshape(h, -1)
        self.entropy_sum += ent_h.sum(1).cpu().numpy()
        self.n_queries += ent_h.shape[1]

    def merge(self, other: "ExplainedAwayAccumulator") -> "ExplainedAwayAccumulator":
        """Add another accumulator's counts into this one (same bins and heads)."""
        if other.heads is None:
            return self
        if not np.array_equal(self.bin_edges, other.bin_edges):
            raise ValueError("cannot merge histograms with different bin edges")
        if self.heads is None:
            self._init(other.heads)
        elif self.heads != other.heads:
            raise ValueError(f"cannot merge {self.heads} heads with {other.heads}")
        self.counts += other.counts
        self.n_keys += other.n_keys
        self.n_explained += other.n_explained
        self.n_below += other.n_below
        self.min_log_mass = np.minimum(self.min_log_mass, other.min_log_mass)
        self.min_margin = np.minimum(self.min_margin, other.min_margin)
        self.entropy_sum += other.entropy_sum
        self.n_queries += other.n_queries
        for name, fn in (("sk_min", min), ("sk_max", max)):
            a, b = getattr(self, name), getattr(other, name)
            setattr(self, name, b if a is None else a if b is None else fn(a, b))
        return self

    def compute(self) -> ExplainedAwayStats:
        if self.heads is None or self.n_keys == 0:
            raise ValueError("ExplainedAwayAccumulator.compute() called before any real key was added")
        nk = self.n_keys
        return ExplainedAwayStats(
            eps=self.eps,
            bin_edges=self.bin_edges.copy(),
            counts=self.counts.copy(),
            n_keys=nk,
            n_explained_away=self.n_explained.copy(),
            fraction_explained_away=self.n_explained / nk,
            min_log_mass=self.min_log_mass.copy(),
            min_margin=self.min_margin.copy(),
            n_below_bound=self.n_below.copy(),
            fraction_below_bound=self.n_below / nk,
            entropy=self.entropy_sum / max(self.n_queries, 1),
            n_queries=self.n_queries,
            sk_min=int(self.sk_min or 0),
            sk_max=int(self.sk_max or 0),
        )


def explained_away_stats(
    weights: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    k_mask: torch.Tensor | None = None,
    eps: float = DEFAULT_EPS,
    bin_edges: np.ndarray | None = None,
) -> ExplainedAwayStats:
    """Statistics of one batch of (B, H, Sq, Sk) weights (see ``ExplainedAwayStats``)."""
    acc = ExplainedAwayAccumulator(eps, bin_edges)
    acc.update(weights, q_mask, k_mask)
    return acc.compute()
