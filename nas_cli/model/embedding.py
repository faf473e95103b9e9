"""The input of nas-run's Transformers: token embeddings and the positions added to them."""
from __future__ import annotations

import math

import torch
from torch import nn

from nas_cli.attention.positions import LearnedPositions, SinusoidalPositions


#: the values of ``model.positions``: added to the input embeddings (sinusoidal, learned), rotary on the
#: queries and keys of self-attention (rope: nas_cli/model/transformer.py's MultiHeadAttention), a per-head
#: linear bias of a causal language model's scores (alibi, Press et al. 2022), or ``none``
#: (the schemes that put position into the attention itself, Tsai et al.)
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "none")


class Embedder(nn.Module):
    """Token embeddings, scaled by sqrt(d_model), plus the input positions ``model.positions`` adds."""

    def __init__(self, vocab, d_model, positions, max_len, dropout, pad_id, embedding=None):
        super().__init__()
        self.tokens = embedding if embedding is not None else nn.Embedding(vocab, d_model, padding_idx=pad_id)
        if embedding is None:
            nn.init.normal_(self.tokens.weight, std=d_model**-0.5)
            with torch.no_grad():
                self.tokens.weight[pad_id].zero_()
        if positions == "sinusoidal":
            self.positions = SinusoidalPositions(d_model, max_len)
        elif positions == "learned":
            self.positions = LearnedPositions(d_model, max_len)
        elif positions in ("none", "rope", "alibi"):  # in the attention: Tsai et al.'s kernels, rotary q and k, ALiBi
            self.positions = None
        else:
            raise ValueError(f"model.positions must be one of {', '.join(POSITIONS)} (got '{positions}')")
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids, offset: int = 0):  # (B, T) -> (B, T, C); positions offset.. offset+T-1
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = x + self.positions(offset + ids.size(1))[offset:]
        return self.dropout(x)
