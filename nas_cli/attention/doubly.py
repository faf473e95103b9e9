"""Ding et al.'s doubly-normalized attention in log space: the column step over queries (the
encoder form, and the prefix form in which query i's column normalizer sums queries i' <= i only),
its one-query steps for decoding and the state a causal prefill leaves. DNAS, HNAS and Sinkhorn-k
(nas_cli/attention/dnas.py, hnas.py) and the fused paths build on these."""
from __future__ import annotations

import torch

from nas_cli.attention.base import NEG_INF, masked_row_softmax


def column_logsumexp(logits: torch.Tensor, allowed: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Log of the column normalizer of Ding et al.'s first (key-column) step.

    Non-causal: c_j = logsumexp_i s_ij over real queries, shape (B, H, 1, Sk).
    Causal (prefix form): c_ij = logsumexp_{i' <= i} s_i'j, shape (B, H, Sq, Sk), so the
    weight of query i never depends on a later query i' > i.
    Disallowed entries contribute nothing; a column with no allowed entry gives -inf
    (harmless: such entries are masked out of the row step too).
    """
    if allowed is not None:
        logits = logits.masked_fill(~allowed, NEG_INF)
    if causal:
        return prefix_logsumexp(logits, allowed)
    return torch.logsumexp(logits, dim=-2, keepdim=True)


#: largest s_ij - a_j for which :func:`prefix_logsumexp` takes the anchored cumsum form
#: (exp(60) ~ 1e26: sums and their gradients stay far from float32 overflow)
ANCHOR_LIMIT = 60.0


def prefix_logsumexp(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """c_ij = logsumexp_{i' <= i} s_i'j over dim -2 (``logits`` already -inf where not allowed).

    Computed as a_j + log cumsum_i exp(s_ij - a_j) with the anchor a_j = s_{f_j, j}, the
    score of the first allowed query f_j of column j. Every query i that takes part in
    column j has f_j <= i, so the anchor never brings a later query into c_ij, and the
    sum includes exp(0) = 1 (no underflow). The anchor cancels mathematically, so it is
    detached (exact gradients). A cumsum and its backward (a reversed cumsum) are several
    times cheaper than ``torch.logcumsumexp``; if some s_ij - a_j exceeds ANCHOR_LIMIT
    (overflow risk), ``torch.logcumsumexp`` is used instead. Entries before a column's
    first allowed query get a very negative finite value, not -inf (they are masked)."""
    sk = logits.size(-1)
    shape = (*logits.shape[:-2], 1, sk)
    if allowed is None:
        anchor = logits[..., :1, :]
    else:
        first = allowed.to(torch.uint8).argmax(dim=-2, keepdim=True)  # first allowed query per column
        anchor = logits.gather(-2, first.expand(shape))
    anchor = anchor.detach()
    anchor = torch.where(torch.isfinite(anchor), anchor, torch.zeros_like(anchor))  # empty columns
    diff = logits - anchor
    if bool(diff.max() > ANCHOR_LIMIT):
        return torch.logcumsumexp(logits, dim=-2)
    total = torch.cumsum(torch.exp(diff), dim=-2)
    return anchor + torch.log(total.clamp_min(1e-30))


def doubly_normalized_logits(
    logits: torch.Tensor, allowed: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """One column step in log space: s_ij - c_j (Ding et al. Eq. for xi, in logs).

    Entries whose column normalizer is -inf (an empty column) are left at -inf."""
    c = column_logsumexp(logits, allowed, causal)
    out = logits - c
    return torch.nan_to_num(out, nan=NEG_INF, posinf=NEG_INF)


def prefix_normalized_step(s: torch.Tensor, k_mask: torch.Tensor | None, state, iterations: int = 1):
    """Row i of the prefix-normalized (causal) DNAS / Sinkhorn-k weights from the new
    query's scores alone, carrying one running column log-sum-exp per iteration.

    s: (B, H, 1, Sk) scores of the newest query; state: None or a tuple of ``iterations``
    tensors (B, H, 1, Sk_prev), the column normalizers over all earlier queries. Level l's
    normalizer is a running logaddexp over the rows of level l-1 (level 0: the scores), which
    is exactly the prefix log-sum-exp of :func:`column_logsumexp` with ``causal=True``.
    Returns (weights (B, H, 1, Sk), new state)."""
    allowed = None if k_mask is None else k_mask[:, None, None, :]
    log_pi = s if allowed is None else s.masked_fill(~allowed, NEG_INF)
    new_state = []
    for level in range(iterations):
        c = log_pi
        if state is not None:
            prev = state[level]
            prev = torch.nn.functional.pad(prev, (0, s.size(-1) - prev.size(-1)), value=NEG_INF)
            c = torch.logaddexp(prev, log_pi)
        new_state.append(c)
        # -inf - -inf (an empty column) is NaN: keep such entries at -inf, not a finite number
        log_pi = torch.nan_to_num(log_pi - c, nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)  # column step
        if level < iterations - 1:  # row step between iterations (the last one is the softmax)
            log_pi = torch.nan_to_num(log_pi - torch.logsumexp(log_pi, -1, keepdim=True), nan=NEG_INF,
                                      neginf=NEG_INF)
    return masked_row_softmax(log_pi, allowed), tuple(new_state)


def prefix_normalized_state(s: torch.Tensor, allowed: torch.Tensor | None, iterations: int = 1) -> tuple:
    """What :func:`prefix_normalized_step` carries after all the rows of ``s`` (B, H, T, Sk),
    in one vectorized pass instead of T steps: level l's column log-sum-exp over every row of
    level l-1 (level 0: the scores), rows between levels normalized with the prefix
    normalizers, as in the steps. ``allowed``: (B|1, 1, T, Sk) pairs that take part (real
    query, real key, j <= i). Returns a tuple of ``iterations`` (B, H, 1, Sk) tensors."""
    log_pi = s if allowed is None else s.masked_fill(~allowed, NEG_INF)
    seen = None if allowed is None else allowed.any(dim=-2, keepdim=True)  # columns some query took part in
    state = []
    for level in range(iterations):
        c = prefix_logsumexp(log_pi, allowed)  # c_ij over rows i' <= i: row i's normalizer in the steps
        last = c[..., -1:, :]
        state.append(last if seen is None else last.masked_fill(~seen, NEG_INF))  # as the steps: -inf
        log_pi = torch.nan_to_num(log_pi - c, nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)
        if level < iterations - 1:
            log_pi = torch.nan_to_num(log_pi - torch.logsumexp(log_pi, -1, keepdim=True), nan=NEG_INF,
                                      neginf=NEG_INF)
    return tuple(state)
