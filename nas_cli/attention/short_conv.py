"""The short causal convolution the recurrent mixers' papers put on q, k and v before the mixer (DeltaNet and
Gated DeltaNet as flash-linear-attention's layers build them, Mamba-2's convolution of x, B and C): per channel,
over the last ``kernel`` positions, then SiLU (``attention.conv=<kernel>``; 4 in those papers' configurations).

Each of q, k and v has its own depthwise filter (heads x d_head channels, no bias), initialized as PyTorch's
Conv1d (uniform in +-1/sqrt(kernel)). The sequence form pads kernel - 1 zeros in front (a padded position counts
as zero, so a left-padded sequence is convolved as it is alone); the one-token step keeps the last kernel - 1
inputs of each stream and gives what the sequence form gives at that position.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ShortConv(nn.Module):
    """``widths``: each stream's features per head (default ``d_head`` for each of ``streams``); Mamba-2 with a
    state size other than its head's convolves B and C (the queries and keys) at that size and x at the head's."""

    def __init__(self, heads: int, d_head: int, kernel: int, streams: int = 3, widths=None):
        super().__init__()
        self.widths = [d_head] * streams if widths is None else [int(w) for w in widths]
        self.heads, self.d_head, self.kernel = heads, d_head, kernel
        bound = 1 / math.sqrt(kernel)
        if len(set(self.widths)) == 1:  # one filter bank per stream, stacked
            self.weight = nn.Parameter(torch.empty(len(self.widths), heads * self.widths[0], kernel).uniform_(-bound, bound))
            self.weights = None
        else:
            self.weight = None
            self.weights = nn.ParameterList(nn.Parameter(torch.empty(heads * w, kernel).uniform_(-bound, bound))
                                            for w in self.widths)

    def filters(self, i: int) -> torch.Tensor:
        """Stream i's depthwise filters (heads x width, kernel)."""
        return self.weight[i] if self.weights is None else self.weights[i]

    def sequence(self, tensors, q_mask=None):
        """Each (B, H, T, D) convolved over T (channel h * D + d)."""
        out = []
        for i, x in enumerate(tensors):
            b, h, t, d = x.shape
            if q_mask is not None:
                x = x * q_mask[:, None, :, None].to(x.dtype)
            flat = x.permute(0, 1, 3, 2).reshape(b, h * d, t)
            y = F.conv1d(F.pad(flat, (self.kernel - 1, 0)), self.filters(i)[:, None, :].to(x.dtype), groups=h * d)
            out.append(F.silu(y.reshape(b, h, d, t).permute(0, 1, 3, 2)))
        return out

    def step(self, tensors, kept):
        """The newest position of each stream ((B, H, 1, D_i) each) convolved with the last kernel - 1 inputs
        ``kept`` (per stream (B, H, kernel - 1, D_i); None: zeros, the sequence's start); returns them and the new
        kept."""
        out, now = [], []
        for i, x in enumerate(tensors):
            before = x.new_zeros(*x.shape[:2], self.kernel - 1, x.size(-1)) if kept is None else kept[i].to(x.dtype)
            window = torch.cat([before, x], dim=-2)  # (B, H, K, D_i)
            w = self.filters(i).view(self.heads, x.size(-1), self.kernel).to(x.dtype)
            out.append(F.silu(torch.einsum("bhkd,hdk->bhd", window, w))[..., None, :])
            now.append(window[..., 1:, :])
        return out, tuple(now)

    def numbers(self) -> int:
        """The numbers the step keeps per sequence."""
        return sum(self.heads * w for w in self.widths) * (self.kernel - 1)
