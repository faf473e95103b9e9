"""Stick-breaking attention, Tan et al. 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study" (ICLR 2025).

    beta_ij = sigma(s_ij),   A_ij = beta_ij prod_{j<k<i} (1 - beta_ik)   (keys j < i)

Query i breaks a stick of length 1 from its most recent key backwards: each key takes the
share beta of what the later keys left. The weights need no positions (the order is in the
product), so the paper trains without positional embeddings (``model.positions=none``). What is
left, 1 - sum_j A_ij, goes to the query's own value when ``attend_to_self`` (the paper's
setting, the default): the rows then sum to 1. Without it the remainder is not attended and
the rows sum to at most 1 (``rows_sum_to_one = False``).

Defined for causal self-attention only (the order of keys is the order of the sequence and the
remainder needs the query's own position): ``attention.decoder=stickbreaking``. In logs,
log A_ij = log sigma(s_ij) + sum_{j<k<i} log sigma(-s_ik), the sum a reversed cumulative sum
over the keys (no product of many small numbers). Blocks of queries: :mod:`nas_cli.attention.rowwise`.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from nas_cli.attention.base import check_option
from nas_cli.attention.rowwise import BLOCK, RowwiseCore, below_normal


def stick_breaking_weights(s: torch.Tensor, strict: torch.Tensor) -> torch.Tensor:
    """A_ij from scores s (..., Sq, Sk) over the pairs ``strict`` (j < i, real query and key)."""
    log_beta = F.logsigmoid(s)
    log_rest = (log_beta - s).masked_fill(~strict, 0.0)  # log(1 - sigma(s)) = log sigma(s) - s
    later = torch.flip(torch.cumsum(torch.flip(log_rest, (-1,)), -1), (-1,)) - log_rest  # sum over k > j
    log_w = log_beta + later
    return torch.exp(log_w.masked_fill(~strict | below_normal(log_w), float("-inf")))


class StickBreaking(RowwiseCore):
    name = "stickbreaking"
    causal_self_only = True

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, block_size: int = BLOCK,
                 attend_to_self: bool = True, **score_options):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name, block_size, **score_options)
        check_option("attend_to_self", attend_to_self, isinstance(attend_to_self, bool), "be true or false")
        self.attend_to_self = attend_to_self
        self.rows_sum_to_one = attend_to_self

    def block_weights(self, s, allowed, a, carry):
        rows = torch.arange(a, a + s.size(-2), device=s.device)[:, None]
        cols = torch.arange(s.size(-1), device=s.device)[None, :]
        w = stick_breaking_weights(s, allowed & (cols < rows))
        if self.attend_to_self:  # the remaining stick to the query's own value (real queries only)
            own = (cols == rows) & allowed
            w = w + own * (1 - w.sum(-1, keepdim=True)).clamp_min(0)
        return w, carry
