"""Gated attention, Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity,
Sparsity, and Attention-Sink-Free" (NeurIPS 2025).

    o_i = softmax_j(s_ij) v_j  *  sigma(x_i W_g)      (``placement: sdpa``, the paper's G1, the default)
    v_j' = v_j * sigma(x_j W_g), then softmax attention (``placement: value``, the paper's G2)

A head-specific sigmoid gate, a projection of the layer's (query-side) input that the model
builds beside q, k and v (``input_features``), multiplies each head's attention output
(``granularity: elementwise``, one gate per feature, the paper's best; ``headwise``: one per
head). The weights are softmax's (a distribution); the gate acts on the output. The paper
reports a lower loss, no attention sink and stable training at larger learning rates.

Every location for ``placement: sdpa`` (the gate of query i comes from position i's input).
``placement: value`` gates the values at their own positions, which in cross-attention are the
source's, not the layer input's: it is defined for self-attention only (encoder and decoder).
Softmax runs as PyTorch's fused SDPA (UNAS's path); :meth:`step` with ``placement: value``
carries the gated values so far (the last ``window`` of them with a sliding window). UNAS's ``softcap``,
``window`` and ``sink`` (nas_cli/attention/mods.py) apply to the softmax inside.
"""
from __future__ import annotations

import torch

from nas_cli.attention.base import SchemeError, check_choice
from nas_cli.attention.unas import UNAS

PLACEMENTS = ("sdpa", "value")
GRANULARITIES = ("elementwise", "headwise")


class GatedAttention(UNAS):
    name = "gated"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, placement: str = "sdpa",
                 granularity: str = "elementwise", **score_options):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name, **score_options)
        check_choice("placement", placement, PLACEMENTS)
        check_choice("granularity", granularity, GRANULARITIES)
        if placement == "value" and location == "cross":
            raise SchemeError(f"attention scheme '{self.name}' with placement=value gates values at their own "
                              "positions, which in cross-attention are the source's: use placement=sdpa there "
                              f"(attention.cross={self.name} attention.cross.placement=sdpa) or another scheme for "
                              "attention.cross (attention.cross=unas)")
        self.placement, self.granularity = placement, granularity
        self.carries_state = placement == "value"

    def input_features(self, d_head: int) -> int:
        return d_head if self.granularity == "elementwise" else 1

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, x=None, alibi=None):
        if x is None:
            raise ValueError("gated attention needs the gate projection x (the model's x_proj)")
        gate = torch.sigmoid(x)
        if self.placement == "value":
            res = super().forward(q, k, v * gate.to(v.dtype), q_mask, k_mask, need_weights, alibi=alibi)
        else:
            res = super().forward(q, k, v, q_mask, k_mask, need_weights, alibi=alibi)
            res.out = res.out * gate.to(res.out.dtype)
        return res

    def step(self, q, k, v, k_mask, state, x=None, alibi=None):
        gate = torch.sigmoid(x).to(v.dtype)
        if self.placement == "value":  # state: the values so far, each gated at its own position
            gated = v[..., -1:, :] * gate
            state = gated if state is None else torch.cat([state, gated], -2)[..., -k.size(-2):, :]
            out, _ = super().step(q, k, state, k_mask, None, alibi=alibi)
            return out, state
        out, _ = super().step(q, k, v, k_mask, None, alibi=alibi)
        return out * gate, None
