"""Additive (Bahdanau) attention, with the one-layer variant as a diagnostic.

Two layers (Bahdanau et al. 2015), per head h, on the projected q_i, k_j of size d_head:
    z_ij = w_h^T tanh(W_h [k_j ; q_i] + b_h) = w_h^T tanh(k_j W^k_h + q_i W^q_h + b_h)
One layer:
    z_ij = w_h^T [k_j ; q_i] = k_j . u_h + q_i . r_h
then pi_ij = softmax_j(z_ij) over the allowed keys.

Why the second layer matters (the blog post "Why Bahdanau's neural attention
requires two layers"): with one layer the query term q_i . r_h is the same for every key
j, and softmax is shift invariant, so the weights do not depend on the query at all: in
cross-attention every decoder step attends to the source in exactly the same way.
:func:`step_variation` measures this: 0 for one layer in exact arithmetic (in float32 the row
softmax's rounding leaves about 1e-8, below :data:`ROUND_OFF`), > 0 for two.

Each score depends on one (query, key) pair, so the scheme is causal and works in all
three locations. Cost: the two-layer form holds a (B, H, Sq, Sk, hidden) tensor.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from nas_cli.attention.base import AttentionCore, AttentionOutput, allowed_mask, masked_row_softmax


#: a step variation below this is float32 rounding, not attention that changes over steps: one-layer
#: additive cross-attention measures about 1e-8 (its softmax of k_j . u + q_i . r rounds differently
#: for each query's shift q_i . r), two layers 1e-3 and more after a few updates
ROUND_OFF = 1e-5


class Additive(AttentionCore):
    name = "additive"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, layers: int = 2,
                 hidden: int | None = None, **kw):
        super().__init__(heads, causal, dropout, **kw)
        if int(layers) not in (1, 2):
            raise ValueError(f"attention.layers must be 1 or 2 (got {layers})")
        if hidden is not None and int(hidden) < 1:
            raise ValueError(f"attention.hidden must be >= 1 or null (= d_head) (got {hidden})")
        self.layers = int(layers)
        # one layer: the query's term is the same for every key and cancels in the softmax,
        # so queries get no gradient (the blog post's point)
        self.qk_gradients = self.layers == 2
        self.hidden = None if hidden is None else int(hidden)
        self.d_head: int | None = None

    def set_width(self, d_model: int) -> None:
        """Create the scoring parameters (MultiHeadAttention calls this at construction)."""
        if self.d_head is not None:
            return
        h, d = self.heads, d_model // self.heads
        self.d_head = d
        if self.layers == 1:
            self.u = nn.Parameter(torch.randn(h, d) * d**-0.5)  # key part of w
            self.r = nn.Parameter(torch.randn(h, d) * d**-0.5)  # query part of w (cancels)
            return
        n = self.hidden or d
        self.hidden = n
        self.w_k = nn.Parameter(torch.randn(h, d, n) * d**-0.5)  # W = [W^k ; W^q], per head
        self.w_q = nn.Parameter(torch.randn(h, d, n) * d**-0.5)
        self.b = nn.Parameter(torch.zeros(h, n))
        self.w = nn.Parameter(torch.randn(h, n) * n**-0.5)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """z (B, H, Sq, Sk) from q (B, H, Sq, D) and k (B, H, Sk, D)."""
        if self.d_head is None:  # used on its own: parameters from q's head size
            self.set_width(self.heads * q.size(-1))
            self.to(device=q.device, dtype=q.dtype)
        if self.layers == 1:
            key_term = torch.einsum("bhjd,hd->bhj", k, self.u)[:, :, None, :]  # (B, H, 1, Sk)
            query_term = torch.einsum("bhid,hd->bhi", q, self.r)[..., None]  # (B, H, Sq, 1)
            return key_term + query_term
        kp = torch.einsum("bhjd,hdn->bhjn", k, self.w_k)  # (B, H, Sk, n)
        qp = torch.einsum("bhid,hdn->bhin", q, self.w_q) + self.b[:, None, :]  # (B, H, Sq, n)
        hidden = torch.tanh(qp[:, :, :, None, :] + kp[:, :, None, :, :])  # (B, H, Sq, Sk, n)
        return torch.einsum("bhijn,hn->bhij", hidden, self.w)

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        allowed = allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        w = masked_row_softmax(self.scores(q, k), allowed)
        out = torch.matmul(F.dropout(w, self.dropout, self.training), v)  # (B, H, Sq, D)
        return AttentionOutput(out, w if need_weights else None)

    supports_step = True
    carries_state = False  # each step: the query against the keys, nothing carried

    def step(self, q, k, v, k_mask, state):
        """Incremental decoding: the newest query (B, H, 1, D) against the cached keys so far."""
        allowed = None if k_mask is None else k_mask[:, None, None, :]
        return torch.matmul(masked_row_softmax(self.scores(q, k), allowed), v), None

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layers={self.layers}, hidden={self.hidden}"


def step_variation(weights: torch.Tensor, q_mask: torch.Tensor | None = None) -> torch.Tensor:
    """How much attention over the keys changes across query (decoder) steps.

    weights (B, H, Sq, Sk), q_mask (B, Sq) True for real queries -> (B, H): the largest
    |pi_i - pi_0|_inf over real query steps i. 0 for one-layer additive attention in
    cross-attention (the blog post's diagnostic; below :data:`ROUND_OFF` in float32), > 0 when the
    query matters."""
    diff = (weights - weights[:, :, :1]).abs().amax(-1)  # (B, H, Sq)
    if q_mask is not None:
        diff = diff * q_mask[:, None, :].to(diff.dtype)
    return diff.amax(-1)
