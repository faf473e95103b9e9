"""UNAS: standard (row-normalized) softmax attention, Vaswani et al. 2017.

pi_ij = exp(s_ij) / sum_j' exp(s_ij')   (Ding et al. 2020 call this UNAS).

When weights are not requested the fused ``scaled_dot_product_attention`` kernel runs;
the eager formula stays available as the reference and for diagnostics.
"""
from __future__ import annotations

from torch.nn import functional as F

import torch

from nas_cli.attention.base import AttentionCore, AttentionOutput, masked_row_softmax, score_bias, sdpa_mask


def biased_mask(mask: torch.Tensor | None, is_causal: bool, bias: torch.Tensor, dtype) -> torch.Tensor:
    """One float ``attn_mask`` for SDPA: the score bias (ALiBi) where a pair is allowed, the dtype's most
    negative number where ``mask`` (or, with ``is_causal``, j > i) forbids it (finite: a row with no
    allowed key stays a number, as the eager path's)."""
    sq, sk = bias.shape[-2:]
    if is_causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=bias.device).tril(sk - sq)
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, torch.finfo(dtype).min)


class UNAS(AttentionCore):
    name = "unas"

    def weights_from_logits(self, logits, allowed):
        return masked_row_softmax(logits, allowed)

    takes_alibi = True

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, alibi=None) -> AttentionOutput:
        if need_weights:
            return super().forward(q, k, v, q_mask, k_mask, need_weights=True, alibi=alibi)
        mask, is_causal = sdpa_mask(k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        if alibi is not None:
            mask = biased_mask(mask, is_causal, score_bias(alibi, q.size(-2), k.size(-2), q.device), q.dtype)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )
        if q_mask is not None:  # padded queries give zeros, as in the eager path
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out)

    supports_step = True
    carries_state = False  # each step: the query against the keys, nothing carried

    def step(self, q, k, v, k_mask, state, alibi=None):
        mask = None if k_mask is None else k_mask[:, None, None, :]
        if alibi is not None:  # the newest query is position Sk - 1
            mask = biased_mask(mask, False, score_bias(alibi, 1, k.size(-2), q.device), q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
