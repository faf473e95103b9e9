"""Read-outs of a language model's final states other than "each position's own state".

:class:`LastStateDecoder` is MAD's auto-encoder read-out (athms/mad-lab ``mad/model/auto_encoder.py``,
``global_pool='last'``), which its compression task needs: the whole sequence is decoded from the final
state of the last position alone, position ``t`` from that state plus a sinusoidal embedding of ``t``,
through two LayerNorm -> Linear -> GELU layers, then the model's output layer. Everything the model keeps
of the sequence has to pass through one vector.
"""
from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn

from nas_cli.attention.positions import SinusoidalPositions


class LastStateDecoder(nn.Module):
    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.positions = SinusoidalPositions(d_model, max_len)
        self.layers = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU(),
                                    nn.LayerNorm(d_model), nn.Linear(d_model, d_model), nn.GELU())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d) final states -> (B, T, d): row t decoded from ``h[:, -1]`` and position t."""
        return self.layers(h[:, -1:, :] + self.positions(h.size(1))[None])


READOUTS = MappingProxyType({"last_state": LastStateDecoder})
