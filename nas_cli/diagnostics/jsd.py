"""Head diversity as Jensen-Shannon divergence between heads (Zheng et al. 2021, CODA).

CODA treats every attention row of head h as a categorical distribution over keys,
p_h(j) = pi^h_{ij}. For two heads i, i' of one layer and one query row,
    M = (p_i + p_i') / 2,   JSD = 1/2 KL(p_i || M) + 1/2 KL(p_i' || M)   (natural log),
so 0 <= JSD <= log 2 per row. The per-sample value sums JSD over the sample's real query
rows; the reported H x H matrix is the average of that over validation samples, and the
scalar is its mean over head pairs i < i' (CODA Table 4 "average JSD", Figs. 2/4).

Padding: padded queries contribute nothing (their rows are excluded, whatever they hold);
padded keys are forced to zero weight (the attention contract already gives them zero).
0 * log 0 is taken as exactly 0, and for identical rows p / M == 1 exactly, so identical
heads give exactly 0.
"""
from __future__ import annotations

import torch

__all__ = ["head_jsd_per_sample", "head_jsd", "mean_pair_jsd", "JSDAccumulator"]


def _masked_weights(weights: torch.Tensor, q_mask: torch.Tensor | None, k_mask: torch.Tensor | None,
                    dtype: torch.dtype) -> torch.Tensor:
    """(B, H, Sq, Sk) weights in ``dtype`` with padded query rows and padded key columns zeroed."""
    w = weights.detach().to(dtype)
    if k_mask is not None:
        w = w * k_mask[:, None, None, :].to(dtype)
    if q_mask is not None:
        w = w * q_mask[:, None, :, None].to(dtype)
    return w


def _row_jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JSD of rows along the last dim; broadcasting shapes, result without the last dim.

    KL(p || m) = sum_j p_j (log p_j - log m_j) over p_j > 0 (0 log 0 = 0); where p_j > 0
    also m_j >= p_j / 2 > 0, so the log is finite. The direct form (not entropy
    differences) avoids cancellation for nearly equal heads.
    """
    m = (p + q) * 0.5
    log_m = torch.log(torch.where(m > 0, m, torch.ones_like(m)))
    kl_p = torch.where(p > 0, p * (torch.log(torch.where(p > 0, p, torch.ones_like(p))) - log_m),
                       torch.zeros_like(p)).sum(-1)
    kl_q = torch.where(q > 0, q * (torch.log(torch.where(q > 0, q, torch.ones_like(q))) - log_m),
                       torch.zeros_like(q)).sum(-1)
    return 0.5 * kl_p + 0.5 * kl_q


def head_jsd_per_sample(
    weights: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    k_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    max_elements: int = 1 << 24,
) -> torch.Tensor:
    """(B, H, Sq, Sk) attention weights -> (B, H, H) JSD matrices, each summed over the
    sample's real query rows (CODA: sum over the n rows of one sample).

    ``q_mask`` (B, Sq), ``k_mask`` (B, Sk): True = real token, None = no padding.
    Computed in ``dtype`` (float64 by default: the diagnostic is cheap next to training).
    Loops over the first head to keep memory at O(B H Sq Sk) instead of O(B H^2 Sq Sk),
    and over chunks of samples so one chunk holds about ``max_elements`` weights.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, Sq, Sk), got shape {tuple(weights.shape)}")
    b, h, sq, sk = weights.shape
    chunk = max(1, max_elements // max(h * sq * sk, 1))
    if b > chunk:  # bound the float64 copies: a few (chunk, H, Sq, Sk) tensors at a time
        return torch.cat([
            head_jsd_per_sample(weights[s : s + chunk],
                                None if q_mask is None else q_mask[s : s + chunk],
                                None if k_mask is None else k_mask[s : s + chunk], dtype, max_elements)
            for s in range(0, b, chunk)
        ])
    w = _masked_weights(weights, q_mask, k_mask, dtype)
    out = torch.zeros(b, h, h, dtype=dtype, device=w.device)
    for i in range(h - 1):
        # rows of head i against heads i+1..H-1: (B, 1, Sq, Sk) vs (B, H-i-1, Sq, Sk)
        per_row = _row_jsd(w[:, i : i + 1], w[:, i + 1 :])  # (B, H-i-1, Sq)
        # padded query rows are all-zero for both heads, so they add exactly 0
        s = per_row.sum(-1)  # (B, H-i-1)
        out[:, i, i + 1 :] = s
        out[:, i + 1 :, i] = s  # JSD is symmetric; the diagonal stays exactly 0
    return out


def head_jsd(
    weights: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    k_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(B, H, Sq, Sk) -> (H, H): per-sample JSD sums averaged over the batch's samples
    that have at least one real query."""
    per_sample = head_jsd_per_sample(weights, q_mask, k_mask, dtype)
    valid = _valid_samples(weights, q_mask)
    n = int(valid.sum())
    if n == 0:
        return torch.zeros(per_sample.shape[1:], dtype=dtype, device=per_sample.device)
    return per_sample[valid].sum(0) / n


def mean_pair_jsd(matrix: torch.Tensor) -> float:
    """Mean of an (H, H) JSD matrix over head pairs i < i' (CODA's "average JSD");
    0.0 for a single head."""
    h = matrix.shape[-1]
    if h < 2:
        return 0.0
    iu = torch.triu_indices(h, h, offset=1, device=matrix.device)
    return float(matrix[iu[0], iu[1]].mean())


def _valid_samples(weights: torch.Tensor, q_mask: torch.Tensor | None) -> torch.Tensor:
    """(B,) bool: samples with at least one real query (only those are averaged)."""
    if q_mask is None:
        return torch.ones(weights.shape[0], dtype=torch.bool, device=weights.device)
    return q_mask.any(dim=-1)


class JSDAccumulator:
    """Average head-JSD matrices over several validation batches of one layer.

    ``update`` adds each sample's (H, H) sum over real query rows; ``compute`` returns
    their mean over all samples seen, i.e. the same number as ``head_jsd`` on the
    concatenated batches.
    """

    def __init__(self, dtype: torch.dtype = torch.float64):
        self.dtype = dtype
        self.reset()

    def reset(self) -> None:
        self.total: torch.Tensor | None = None  # (H, H) sum over samples, on CPU
        self.samples = 0

    def update(self, weights: torch.Tensor, q_mask: torch.Tensor | None = None,
               k_mask: torch.Tensor | None = None) -> None:
        per_sample = head_jsd_per_sample(weights, q_mask, k_mask, self.dtype)
        valid = _valid_samples(weights, q_mask)
        batch_sum = per_sample[valid].sum(0).cpu()
        self.total = batch_sum if self.total is None else self.total + batch_sum
        self.samples += int(valid.sum())

    def compute(self) -> torch.Tensor:
        """(H, H) mean over samples; raises if nothing was added."""
        if self.total is None or self.samples == 0:
            raise ValueError("JSDAccumulator.compute() called before any sample was added")
        return self.total / self.samples

    def mean_pair(self) -> float:
        return mean_pair_jsd(self.compute())
