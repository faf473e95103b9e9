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
    def __init__(self, heads: int, d_head: int, kernel: int, streams: int = 3):
        super().__init__()
        self.heads, self.d_head, self.kernel = heads, d_head, kernel
        bound = 1 / math.sqrt(kernel)
        self.weight = nn.Parameter(torch.empty(streams, heads * d_head, kernel).uniform_(-bound, bound))

    def sequence(self, tensors, q_mask=None):
        """Each (B, H, T, D) convolved over T (channel h * D + d)."""
        out = []
        for i, x in enumerate(tensors):
            b, h, t, d = x.shape
            if q_mask is not None:
                x = x * q_mask[:, None, :, None].to(x.dtype)
            flat = x.permute(0, 1, 3, 2).reshape(b, h * d, t)
            y = F.conv1d(F.pad(flat, (self.kernel - 1, 0)), self.weight[i][:, None, :].to(x.dtype), groups=h * d)
            out.append(F.silu(y.reshape(b, h, d, t).permute(0, 1, 3, 2)))
        return out

    def step(self, tensors, kept: torch.Tensor | None):
        """The newest position of each stream ((B, H, 1, D) each) convolved with the last kernel - 1 inputs
        ``kept`` (B, streams, H, kernel - 1, D; None: zeros, the sequence's start); returns them and the new kept."""
        new = torch.stack(tensors, 1)  # (B, S, H, 1, D)
        if kept is None:
            kept = new.new_zeros(*new.shape[:3], self.kernel - 1, new.size(-1))
        window = torch.cat([kept.to(new.dtype), new], dim=-2)  # (B, S, H, K, D)
        w = self.weight.view(-1, self.heads, self.d_head, self.kernel).to(new.dtype)
        y = F.silu(torch.einsum("bshkd,shdk->bshd", window, w))[..., None, :]
        return [y[:, i] for i in range(y.size(1))], window[..., 1:, :]

    def numbers(self) -> int:
        """The numbers the step keeps per sequence."""
        return self.weight.size(0) * self.heads * self.d_head * (self.kernel - 1)
