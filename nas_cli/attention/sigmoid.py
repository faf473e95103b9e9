"""Sigmoid attention, Ramapuram et al. 2025, "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention" (ICLR 2025).

    w_ij = sigma(s_ij + b),   b = -log n   (n: the keys query i may see)

Each weight is its own sigmoid: no normalization over the keys, so a row holds any mass in
(0, n) and the weights are not a distribution (``rows_sum_to_one = False``). With b = -log n the
weights start near 1/n, as softmax's do, which the paper finds needed for stable training.

What n counts. The paper writes n for the sequence length, and the authors' code (apple/ml-sigmoid-
attention, FlashSigmoid) adds one scalar b = -log n for every row, n the training sequence length. The
default here counts n per query instead: the keys that query may see (a causal row i sees i + 1 keys;
padded keys are not counted), so that every row starts near a total weight of 1, the first row of a
causal model included, and a longer evaluation sequence changes no row's bias. ``bias_n``: the
authors' scalar form, b = -log(bias_n) for every row (``attention.bias_n=256`` for a 256-token training
length); ``bias``: any fixed b.

Every location: a row depends on its own query only, so decoder self- and cross-attention are
causal-safe. Computed a block of queries at a time (:mod:`nas_cli.attention.rowwise`).
"""
from __future__ import annotations

import math

import torch

from nas_cli.attention.base import check_option
from nas_cli.attention.rowwise import BLOCK, RowwiseCore


class SigmoidAttention(RowwiseCore):
    name = "sigmoid"
    rows_sum_to_one = False

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, block_size: int = BLOCK,
                 bias: float | None = None, bias_n: int | None = None, **score_options):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name, block_size, **score_options)
        check_option("bias", bias, bias is None or isinstance(bias, (int, float)),
                     "be null (-log n, n the keys a query sees) or a number")
        check_option("bias_n", bias_n, bias_n is None or (isinstance(bias_n, int) and bias_n >= 1),
                     "be null (n counted per query) or a positive whole number of keys (b = -log bias_n)")
        if bias is not None and bias_n is not None:
            raise ValueError("attention.bias and attention.bias_n both set the bias: set one (bias_n=N gives "
                             "b = -log N for every row)")
        self.bias = None if bias is None else float(bias)
        if bias_n is not None:
            self.bias = -math.log(bias_n)

    def block_weights(self, s, allowed, a, carry):
        if self.bias is None:
            n = allowed.sum(-1, keepdim=True).clamp_min(1).to(s.dtype)  # keys each query may see
            b = -torch.log(n)
        else:
            b = self.bias
        return torch.sigmoid(s.add_(b).masked_fill_(~allowed, float("-inf"))), carry  # sigma(-inf) = 0
