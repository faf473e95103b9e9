"""Forgetting attention (FoX), Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate" (ICLR 2025).

    w_ij = softmax_j(s_ij + sum_{l=j+1..i} log f_l),   f_t = sigma(w_h . x_t + b_h)   (keys j <= i)

Each head has a forget gate f_t in (0, 1), a projection of the layer's input at position t
(``input_features`` = 1: the model builds it beside q, k and v). The bias down-weights keys by
how much was forgotten since them; the paper uses no positional embedding
(``model.positions=none``). Defined for causal self-attention only: ``attention.decoder=forgetting``.

With c_t = sum_{l<=t} log f_l the bias is c_i - c_j; c_i is the same for the whole row and
cancels in the softmax, so the logits are s_ij - c_j: ordinary causal softmax attention on
queries and keys with one more feature, q' = [q, sqrt(d)], k' = [k, -c] at the same scale
1/sqrt(d). That runs as PyTorch's fused ``scaled_dot_product_attention`` (no (Sq x Sk) tensor per
head); the formula itself serves ``need_weights``. The gate and c are float32 under fp16/bf16
autocast. A padded position forgets nothing (log f = 0). :meth:`step` carries c of the keys so far.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from nas_cli.attention.base import (AttentionCore, AttentionOutput, allowed_mask, masked_row_softmax, scaled_scores,
                                    sdpa_mask)


def log_forget(x: torch.Tensor, q_mask: torch.Tensor | None) -> torch.Tensor:
    """log f_t (B, H, T) from the gate projection x (B, H, T, 1); 0 at padded positions."""
    logf = F.logsigmoid(x[..., 0].to(torch.promote_types(x.dtype, torch.float32)))
    return logf if q_mask is None else logf.masked_fill(~q_mask[:, None, :], 0.0)


def _augmented_sdpa(q, k, v, c_keys, mask, is_causal: bool, dropout: float):
    """softmax_j(q.k_j / sqrt(d) - c_j) v over the allowed keys, by SDPA on one more feature (the
    values get a zero feature too: PyTorch's fused CPU kernel wants one head size for q, k and v,
    and takes 3x longer without it)."""
    d = q.size(-1)
    dtype = torch.promote_types(q.dtype, torch.float32)
    ones = torch.full((*q.shape[:-1], 1), math.sqrt(d), dtype=dtype, device=q.device)
    q2 = torch.cat([q.to(dtype), ones], -1)
    k2 = torch.cat([k.to(dtype), -c_keys[..., None].to(dtype)], -1)
    v2 = F.pad(v.to(dtype), (0, 1))
    with torch.autocast(q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, dropout_p=dropout,
                                             is_causal=is_causal, scale=1 / math.sqrt(d))
    return out[..., :d].to(v.dtype)


class ForgettingAttention(AttentionCore):
    name = "forgetting"
    causal_self_only = True
    supports_step = True
    carries_state = True

    def input_features(self, d_head: int) -> int:
        return 1

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, x=None) -> AttentionOutput:
        if x is None:
            raise ValueError("forgetting attention needs the forget-gate projection x (the model's x_proj)")
        c = torch.cumsum(log_forget(x, q_mask), dim=-1)  # (B, H, T)
        if need_weights:
            allowed = allowed_mask(q_mask, k_mask, True, q.size(-2), k.size(-2), q.device)
            wide = torch.promote_types(q.dtype, torch.float32)
            logits = scaled_scores(q.to(wide), k.to(wide)) + c[..., :, None] - c[..., None, :]
            weights = masked_row_softmax(logits, allowed)
            dropped = F.dropout(weights, self.dropout, self.training)
            return AttentionOutput(torch.matmul(dropped.to(v.dtype), v), weights, self.aux())
        mask, is_causal = sdpa_mask(k_mask, True, q.size(-2), k.size(-2), q.device)
        out = _augmented_sdpa(q, k, v, c, mask, is_causal, self.dropout if self.training else 0.0)
        if q_mask is not None:
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out, None, self.aux())

    def step(self, q, k, v, k_mask, state, x=None):
        """state: c of the keys so far (B, H, Sk - 1); the new query is position Sk - 1."""
        logf = log_forget(x, None)  # (B, H, 1)
        c = logf if state is None else torch.cat([state, state[..., -1:] + logf], -1)
        mask = None if k_mask is None else k_mask[:, None, None, :]
        return _augmented_sdpa(q, k, v, c, mask, False, 0.0), c
