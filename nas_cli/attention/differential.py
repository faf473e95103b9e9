"""Differential attention, Ye et al. 2025, "Differential Transformer" (ICLR 2025).

Heads work in pairs (2p, 2p + 1): the pair's two query/key maps give two softmax maps whose
difference weighs the pair's values side by side, V = [v_2p ; v_2p+1] (size 2 d):

    O_p = RMSNorm( (softmax(q_2p k_2p^T / sqrt(d)) - lambda softmax(q_2p+1 k_2p+1^T / sqrt(d))) V ) (1 - lambda_init)
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 l)

with l the layer index counted from 0 (the paper's l - 1 for l in 1..L) and lq1, lk1, lq2, lk2
learned vectors of size d, one set per layer shared by its pairs (the paper's code), RMSNorm per
pair over its 2 d features with a learned scale. O_p's halves are heads 2p and 2p + 1's outputs,
so with ``model.heads=H`` the model has H / 2 differential heads and the projections of an
H-head Transformer: equal parameters, as the paper compares (``model.heads`` must be even).

``lambda_init``: null for the schedule above, or a number for every layer. The weights,
softmax1 - lambda softmax2 (each pair's map given to both its heads), are negative in places and
their rows sum to 1 - lambda (``nonnegative = False``, ``rows_sum_to_one = False``). Every location
(each map is a row softmax). Without ``need_weights`` it is two calls of PyTorch's fused SDPA.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from nas_cli.attention.base import (AttentionCore, AttentionOutput, allowed_mask, check_option, masked_row_softmax,
                                    scaled_scores, sdpa_mask)


def lambda_schedule(layer: int) -> float:
    """lambda_init of layer ``layer`` (counted from 0): 0.8 - 0.6 exp(-0.3 layer)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DifferentialAttention(AttentionCore):
    name = "differential"
    paired_heads = True
    nonnegative = False
    rows_sum_to_one = False
    supports_step = True
    carries_state = False

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, lambda_init: float | None = None,
                 norm_eps: float = 1e-5):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name)
        check_option("lambda_init", lambda_init, lambda_init is None or (isinstance(lambda_init, (int, float))
                                                                          and 0 <= lambda_init < 1),
                     "be null (0.8 - 0.6 exp(-0.3 layer), in [0.2, 0.8)) or a number in [0, 1): every output is "
                     "multiplied by 1 - lambda_init, so 1 trains a model whose attention outputs are 0 and more "
                     "than 1 flips their sign")
        self.lambda_init = lambda_schedule(layer) if lambda_init is None else float(lambda_init)
        self.norm_eps = float(norm_eps)
        self.lambdas = None

    def set_width(self, d_model: int) -> None:
        d = d_model // self.heads
        self.lambdas = nn.Parameter(torch.randn(4, d) * 0.1)  # lq1, lk1, lq2, lk2
        self.norm_weight = nn.Parameter(torch.ones(2 * d))

    def lam(self) -> torch.Tensor:
        lq1, lk1, lq2, lk2 = self.lambdas.to(torch.promote_types(self.lambdas.dtype, torch.float32))
        return torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + self.lambda_init

    def learned(self):
        return {} if self.lambdas is None else {"lambda": self.lam().detach().expand(self.heads)}

    learned_titles = {"lambda": "differential attention's lambda per layer (one per layer, shown per head)"}

    @staticmethod
    def _pairs(t):  # (B, H, T, D) -> first and second maps' (B, H/2, T, D), values side by side (B, H/2, T, 2D)
        return t[:, 0::2], t[:, 1::2], torch.cat([t[:, 0::2], t[:, 1::2]], -1)

    def _finish(self, o, q_mask):
        """RMSNorm over the pair's 2 d features, x (1 - lambda_init), split back into heads."""
        of = o.to(torch.promote_types(o.dtype, torch.float32))
        of = of * torch.rsqrt(of.square().mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight.to(of.dtype)
        of = (of * (1 - self.lambda_init)).to(o.dtype)
        b, p, t, d2 = of.shape
        out = of.view(b, p, t, 2, d2 // 2).permute(0, 1, 3, 2, 4).reshape(b, 2 * p, t, d2 // 2)
        if q_mask is not None:
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return out

    def maps(self, q, k, allowed):
        """The pair's two softmax maps (B, H/2, Sq, Sk) each, in float32 or wider."""
        q1, q2, _ = self._pairs(q)
        k1, k2, _ = self._pairs(k)
        s1 = scaled_scores(q1, k1)
        s2 = scaled_scores(q2, k2)
        wide = torch.promote_types(s1.dtype, torch.float32)
        return masked_row_softmax(s1.to(wide), allowed), masked_row_softmax(s2.to(wide), allowed)

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        lam = self.lam()
        if need_weights:
            _, _, vv = self._pairs(v)
            allowed = allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device)
            a1, a2 = self.maps(q, k, allowed)
            w = a1 - lam * a2
            o = torch.matmul(F.dropout(w, self.dropout, self.training).to(v.dtype), vv)
            return AttentionOutput(self._finish(o, q_mask), w.repeat_interleave(2, dim=1), self.aux())
        mask, is_causal = sdpa_mask(k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        p = self.dropout if self.training else 0.0
        o1, o2 = (F.scaled_dot_product_attention(qm, km, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
                  for qm, km in self._per_head_maps(q, k))
        return AttentionOutput(self._finish_heads(o1 - lam.to(o1.dtype) * o2, q_mask), None, self.aux())

    @staticmethod
    def _per_head_maps(q, k):
        """Each pair's first and second query/key maps given to both its heads, (B, H, T, D) each: SDPA
        then weighs every head's own d values (PyTorch's fused CPU kernel wants one head size for q, k
        and v; the pair's 2 d values in one call run 1.6x slower)."""
        return ((q[:, i::2].repeat_interleave(2, dim=1), k[:, i::2].repeat_interleave(2, dim=1)) for i in (0, 1))

    def _finish_heads(self, o, q_mask):
        """:meth:`_finish` of outputs in head order (B, H, T, D): pair p's two heads side by side."""
        b, h, t, d = o.shape
        pairs = o.view(b, h // 2, 2, t, d).permute(0, 1, 3, 2, 4).reshape(b, h // 2, t, 2 * d)
        return self._finish(pairs, q_mask)

    def step(self, q, k, v, k_mask, state):
        mask = None if k_mask is None else k_mask[:, None, None, :]
        o1, o2 = (F.scaled_dot_product_attention(qm, km, v, attn_mask=mask) for qm, km in self._per_head_maps(q, k))
        return self._finish_heads(o1 - self.lam().to(o1.dtype) * o2, None), None
