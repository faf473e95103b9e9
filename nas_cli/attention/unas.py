"""UNAS: standard (row-normalized) softmax attention, Vaswani et al. 2017.

pi_ij = exp(s_ij) / sum_j' exp(s_ij')   (Ding et al. 2020 call this UNAS).

When weights are not requested the fused ``scaled_dot_product_attention`` kernel runs;
the eager formula stays available as the reference and for diagnostics.
"""
from __future__ import annotations

from torch.nn import functional as F

from nas_cli.attention.base import AttentionCore, AttentionOutput, masked_row_softmax, sdpa_mask


class UNAS(AttentionCore):
    name = "unas"

    def weights_from_logits(self, logits, allowed):
        return masked_row_softmax(logits, allowed)

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        if need_weights:
            return super().forward(q, k, v, q_mask, k_mask, need_weights=True)
        mask, is_causal = sdpa_mask(k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )
        if q_mask is not None:  # padded queries give zeros, as in the eager path
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out)

    supports_step = True
    carries_state = False  # each step: the query against the keys, nothing carried

    def step(self, q, k, v, k_mask, state):
        mask = None if k_mask is None else k_mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
