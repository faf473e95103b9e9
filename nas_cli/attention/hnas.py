"""HNAS: hybrid normalized attention, Ding et al. 2020.

pi = u * pi_DNAS + (1 - u) * pi_UNAS with one trainable u in [0, 1] per head of this
layer, u = sigmoid(theta). The output mixes the two value averages with the same u,
which equals attending with the mixed weights.

``attention.impl``: as for DNAS (:data:`nas_cli.attention.dnas.PATHS`), every path computing
the DNAS part and the softmax part and mixing them by u: ``efficient`` mixes the memory-efficient
DNAS output of :mod:`nas_cli.attention.efficient` with the fused SDPA (UNAS) output; ``naive``
mixes the materialized weights (the reference); ``auto`` (the default) picks per call. The naive formula without ``need_weights`` runs as
:func:`nas_cli.attention.fused.doubly_normalized_attention` (same values and gradients,
u's included, with a hand-derived backward).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from nas_cli.attention.base import masked_row_softmax, scaled_scores
from nas_cli.attention.doubly import doubly_normalized_logits, prefix_normalized_step
from nas_cli.attention.dnas import DNAS


class HNAS(DNAS):
    """DNAS's dispatch (DNAS.forward) with a mixing weight u per head: each path mixes its DNAS output
    with softmax attention by u (:meth:`mixing`)."""

    name = "hnas"
    learned_titles = {"u": "HNAS u per layer and head (1 = DNAS, 0 = UNAS)"}

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, u_init: float = 0.5,
                 impl: str = "auto", block_size: int | None = None, **kw):
        super().__init__(heads, causal, dropout, impl=impl, block_size=block_size, **kw)
        u_init = float(u_init)
        if not 0.0 <= u_init <= 1.0:
            raise ValueError(f"attention.u_init must be in [0, 1] (got {u_init})")
        # logit of u; u_init 0 or 1 gives -inf / +inf, i.e. a fixed pure scheme
        theta = math.log(u_init) - math.log1p(-u_init) if 0.0 < u_init < 1.0 else (math.inf if u_init == 1.0 else -math.inf)
        self.u_logit = nn.Parameter(torch.full((heads,), theta))
        self.u_init = u_init

    @property
    def u(self) -> torch.Tensor:
        """(H,) mixing weight of DNAS per head."""
        return torch.sigmoid(self.u_logit)

    def weights_from_logits(self, logits, allowed):
        unas = masked_row_softmax(logits, allowed)
        dnas = masked_row_softmax(doubly_normalized_logits(logits, allowed, self.prefix_queries), allowed)
        u = self.u.to(logits.dtype)[None, :, None, None]
        return u * dnas + (1 - u) * unas

    def mixing(self) -> torch.Tensor:
        """u: every path of DNAS's dispatch (nas_cli.attention.dnas.PATHS) mixes its DNAS output with
        softmax attention by it."""
        return self.u

    def step(self, q, k, v, k_mask, state):
        s = scaled_scores(q, k)  # (B, H, 1, Sk)
        dnas, state = prefix_normalized_step(s, k_mask, state, 1)
        unas = masked_row_softmax(s, None if k_mask is None else k_mask[:, None, None, :])
        u = self.u.to(s.dtype)[None, :, None, None]
        return torch.matmul(u * dnas + (1 - u) * unas, v), state

    def learned(self) -> dict[str, torch.Tensor]:
        return {"u": self.u}

    def extra_repr(self) -> str:
        return super().extra_repr() + f", u_init={self.u_init}"
