"""UNAS: standard (row-normalized) softmax attention, Vaswani et al. 2017.

pi_ij = exp(s_ij) / sum_j' exp(s_ij')   (Ding et al. 2020 call this UNAS).

When weights are not requested the fused ``scaled_dot_product_attention`` kernel runs (a sliding window is
its boolean mask); the eager formula stays available as the reference and for diagnostics, and runs for
soft-capped scores and a sink, which the kernel cannot take (nas_cli/attention/mods.py).
"""
from __future__ import annotations

from torch.nn import functional as F

import torch

from torch import nn

from nas_cli.attention.base import (AttentionCore, AttentionOutput, allowed_mask, full_precision, scaled_scores,
                                    score_bias, sdpa_mask)
from nas_cli.attention.mods import ScoreOptions


def biased_mask(mask: torch.Tensor | None, is_causal: bool, bias: torch.Tensor, dtype) -> torch.Tensor:
    """One float ``attn_mask`` for SDPA: the score bias (ALiBi) where a pair is allowed, the dtype's most
    negative number where ``mask`` (or, with ``is_causal``, j > i) forbids it (finite: a row with no
    allowed key stays a number, as the eager path's)."""
    sq, sk = bias.shape[-2:]
    if is_causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=bias.device).tril(sk - sq)
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, torch.finfo(dtype).min)


class UNAS(ScoreOptions, AttentionCore):
    name = "unas"
    takes_alibi = True

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, softcap: float | None = None,
                 window: int | None = None, sink: str | None = None):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name)
        self.score_options(softcap, window, sink, sinks=True)

    def weights_from_logits(self, logits, allowed):
        return self.sunk_softmax(self.capped(logits), allowed)

    def learned(self):
        return self.sink_values()

    def _eager(self, q, k, v, q_mask, k_mask, need_weights, alibi, first: int | None = None):
        """The formula itself; ``first``: the position of the first query (default: the last sq of the sk keys)."""
        sq, sk = q.size(-2), k.size(-2)
        first = sk - sq if first is None else first
        allowed = self.windowed(allowed_mask(q_mask, k_mask, False, sq, sk, q.device), first, sq, sk, q.device)
        if self.causal:  # query first + i sees keys 0 .. first + i
            later = torch.arange(sk, device=q.device)[None, :] > torch.arange(first, first + sq, device=q.device)[:, None]
            allowed = ~later[None, None] if allowed is None else allowed & ~later
        scores = self.capped(full_precision(scaled_scores(q, k)))
        if alibi is not None:
            scores = scores + score_bias(alibi, sq, sk, q.device, first=first)
        scores, allowed = self.modded(scores, allowed, first)
        weights = self.sunk_softmax(scores, allowed)
        dropped = nn.functional.dropout(weights, self.dropout, self.training)
        return AttentionOutput(torch.matmul(dropped.to(v.dtype), v), weights if need_weights else None, self.aux())

    def modded(self, scores: torch.Tensor, allowed: torch.Tensor | None, first: int):
        """Scores and allowed pairs changed by the scheme's own mods (``attention=flex``'s); here unchanged."""
        return scores, allowed

    def _mask(self, k_mask, first: int, sq: int, sk: int, device):
        """SDPA's (attn_mask, is_causal) for these queries and keys, the window folded into the boolean mask."""
        if self.window is None:
            return sdpa_mask(k_mask, self.causal, sq, sk, device)
        allowed = self.windowed(None, first, sq, sk, device)
        if self.causal:
            allowed = allowed & (torch.arange(sk, device=device)[None, :]
                                 <= torch.arange(first, first + sq, device=device)[:, None])
        return (allowed if k_mask is None else allowed & k_mask[:, None, None, :]), False

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, alibi=None) -> AttentionOutput:
        if need_weights or self.eager_scores:
            return self._eager(q, k, v, q_mask, k_mask, need_weights, alibi)
        sq, sk = q.size(-2), k.size(-2)
        mask, is_causal = self._mask(k_mask, sk - sq, sq, sk, q.device)
        if alibi is not None:
            mask = biased_mask(mask, is_causal, score_bias(alibi, sq, sk, q.device), q.dtype)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )
        if q_mask is not None:  # padded queries give zeros, as in the eager path
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out, None, self.aux())

    supports_step = True
    carries_state = False  # each step: the query against the keys, nothing carried

    def step(self, q, k, v, k_mask, state, alibi=None):
        """The newest query against the cached keys: in self-attention it is the last of them (position Sk - 1)."""
        sk = k.size(-2)
        first = sk - 1 if self.causal else 0
        if self.eager_scores:
            return self._eager(q, k, v, None, k_mask, False, alibi, first=first).out, None
        mask = None if k_mask is None else k_mask[:, None, None, :]
        if self.window is not None:
            mask, _ = self._mask(k_mask, first, 1, sk, q.device)
        if alibi is not None:
            mask = biased_mask(mask, False, score_bias(alibi, 1, sk, q.device), q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None

    def extra_repr(self) -> str:
        return super().extra_repr() + self.score_repr()
