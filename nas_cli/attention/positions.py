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


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, RoFormer) of queries or keys x (B, H, T, D) at integer
    ``positions`` (T,): feature pairs (x_i, x_{i + D/2}) turned by the angle p * base^(-2i / D) (the
    half-split pairing of GPT-NeoX and Llama). A query at m and a key at n then score
    q R_m . k R_n = q . k R_{n - m}: only their distance counts. Computed in float32 or wider."""
    d = x.size(-1)
    if d % 2:
        raise ValueError(f"rotary positions need an even head size (d_model / heads), got {d}")
    wide = torch.promote_types(x.dtype, torch.float32)
    inv = base ** (-torch.arange(0, d // 2, device=x.device, dtype=wide) * 2 / d)
    angle = positions.to(wide)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x.to(wide)[..., : d // 2], x.to(wide)[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
