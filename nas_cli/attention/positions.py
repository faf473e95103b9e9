"""Position encodings: Vaswani et al.'s sinusoids (absolute and relative) and a learned table.

A module of its own because both the model (input positions) and attention cores that place
positions themselves (Tsai et al.'s kernels, nas_cli/attention/kernel.py) use the sinusoids.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Vaswani et al. 2017 sinusoids of arbitrary (also negative, i.e. relative) positions:
    (N,) integer or float positions -> (N, d_model) float32, [sin, cos] interleaved."""
    pos = positions.to(torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=pos.device)
                    * (-math.log(10000.0) / d_model))
    table = torch.zeros(pos.size(0), d_model, device=pos.device)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d_model // 2])
    return table


class SinusoidalPositions(nn.Module):
    """Vaswani et al. 2017 fixed sinusoids, added to the scaled token embeddings."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.register_buffer("table", sinusoids(torch.arange(max_len), d_model), persistent=False)

    def forward(self, length: int) -> torch.Tensor:  # (T, d_model)
        if length > self.table.size(0):
            raise ValueError(f"sequence of length {length} exceeds model.max_len={self.table.size(0)}")
        return self.table[:length]


class LearnedPositions(nn.Module):
    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=d_model**-0.5)

    def forward(self, length: int) -> torch.Tensor:
        if length > self.table.num_embeddings:
            raise ValueError(f"sequence of length {length} exceeds model.max_len={self.table.num_embeddings}")
        return self.table.weight[:length]
