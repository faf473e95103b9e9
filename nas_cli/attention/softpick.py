"""Softpick, Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive Activations with
Rectified Softmax".

    w_ij = relu(exp(s_ij) - 1) / (sum_j' |exp(s_ij') - 1| + eps)

A key with a negative score gets weight 0 exactly (sparse rows), and a row's weights sum to at
most 1 (``rows_sum_to_one = False``): a query can attend to nothing, which is how softpick
removes attention sinks. Computed stably with m = max(0, max_j s_ij):
exp(s - m) - exp(-m) in place of exp(s) - 1 and eps exp(-m) in place of eps, which is the same
ratio (the paper's reference form). Sums run over the keys a query may see. ``eps``: the
denominator's epsilon (the paper's 1e-6).

The scores are float32 under fp16/bf16 autocast: the weight's derivative jumps at s = 0, and
bf16 scores put keys on the wrong side of it (a gradient error of 18% in the CPU run of
``nas-bench gpu-check``'s bf16 case). Every location (a row depends on its own query only). Blocks of queries:
:mod:`nas_cli.attention.rowwise`.
"""
from __future__ import annotations

import torch

from nas_cli.attention.base import check_option
from nas_cli.attention.rowwise import BLOCK, RowwiseCore


class Softpick(RowwiseCore):
    name = "softpick"
    rows_sum_to_one = False
    wide_scores = True  # relu(exp(s) - 1) jumps at s = 0: bf16 scores moved keys across it (the GPU check)

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, block_size: int = BLOCK,
                 eps: float = 1e-6, **score_options):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name, block_size, **score_options)
        check_option("eps", eps, isinstance(eps, (int, float)) and eps > 0, "be a positive number")
        self.eps = float(eps)

    def block_weights(self, s, allowed, a, carry):
        s = s.masked_fill(~allowed, 0.0)  # exp(0) - 1 = 0: a pair that does not take part adds nothing
        m = s.amax(-1, keepdim=True).clamp_min(0).detach()  # cancels in the ratio
        shifted = (torch.exp(s - m) - torch.exp(-m)) * allowed
        den = shifted.abs().sum(-1, keepdim=True) + self.eps * torch.exp(-m)
        return torch.relu(shifted) / den, carry
