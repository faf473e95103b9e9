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
    """Vaswani et al. 2017 fixed sinusoids, added to the scaled token embeddings. A formula: positions
    past the table's ``max_len`` (an evaluation at a longer length, ``eval_lengths``) are computed
    when asked for; nothing of the model depends on ``max_len``."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoids(torch.arange(max_len), d_model), persistent=False)

    def forward(self, length: int) -> torch.Tensor:  # (T, d_model)
        if length > self.table.size(0):
            return sinusoids(torch.arange(length, device=self.table.device), self.d_model).to(self.table.dtype)
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


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, scaling=None) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, RoFormer) of queries or keys x (B, H, T, D) at integer
    ``positions`` (T,): feature pairs (x_i, x_{i + D/2}) turned by the angle p * base^(-2i / D) (the
    half-split pairing of GPT-NeoX and Llama). A query at m and a key at n then score
    q R_m . k R_n = q . k R_{n - m}: only their distance counts. Computed in float32 or wider.
    ``scaling``: a :class:`~nas_cli.model.heads.RopeScaling` (model.rope_scaling), its frequencies and its
    factor on cos and sin instead."""
    d = x.size(-1)
    if d % 2:
        raise ValueError(f"rotary positions need an even head size (d_model / heads), got {d}")
    wide = torch.promote_types(x.dtype, torch.float32)
    if scaling is None:
        inv, gain = base ** (-torch.arange(0, d // 2, device=x.device, dtype=wide) * 2 / d), 1.0
    else:
        inv, gain = scaling.frequencies(d, base)
        inv = inv.to(device=x.device, dtype=wide)
    angle = positions.to(wide)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = torch.cos(angle) * gain, torch.sin(angle) * gain
    x1, x2 = x.to(wide)[..., : d // 2], x.to(wide)[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def alibi_slopes(heads: int) -> torch.Tensor:
    """Press et al. 2022 (ALiBi) head slopes: for n heads, a power of 2, the geometric sequence
    2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the slopes of the largest power of 2 below n,
    then every other slope of twice that many heads (their reference implementation's rule)."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads & (heads - 1) == 0:
        return torch.tensor(power_of_two(heads))
    below = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(below) + power_of_two(2 * below)[0::2][: heads - below])


def alibi_bias(slopes: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """ALiBi's score bias -m_h (i - j) of queries at positions ``rows`` (Sq,) and keys at ``cols`` (Sk,):
    (1, H, Sq, Sk) float32, added to q . k / sqrt(d) before a scheme's weights. Defined for causal
    self-attention (the later keys j > i are masked, their bias is never used)."""
    dist = (rows.to(torch.float32)[:, None] - cols.to(torch.float32)[None, :])
    return -slopes.to(dist.device, torch.float32)[None, :, None, None] * dist[None, None]
