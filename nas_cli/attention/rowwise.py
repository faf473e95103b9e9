"""Schemes whose weights are not a softmax, computed a block of query rows at a time.

Sigmoid, softpick, stick-breaking and selective attention turn each query's scores into weights
with a formula no fused kernel of PyTorch computes (SDPA computes softmax only). A core here
implements :meth:`RowwiseCore.block_weights`: the weights of query rows ``a .. a + c - 1`` from
their scores against the keys they may see, plus a ``carry`` from the rows before (selective
attention's running column sums; None for the others). The rest is shared:

* with ``need_weights`` or at most ``block_size`` queries, one block: the formula itself;
* otherwise blocks of ``block_size`` queries, each under activation checkpointing while
  training, so no (Sq x Sk) tensor per head is held, and in causal self-attention each block
  against keys ``0 .. a + c - 1`` only (the later keys have weight 0: half the work);
* :meth:`step`, one new query against the cached keys, is the same formula on one row.

All arithmetic on scores is in float32 or wider (:func:`~nas_cli.attention.base.full_precision`).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nas_cli.attention.base import AttentionCore, AttentionOutput, check_option, full_precision, score_bias
from nas_cli.attention.mods import ScoreOptions

#: the default ``block_size``: queries per block when weights are not asked for. Measured (one CPU
#: thread, forward + backward, causal, B=1, H=8, d_head=64, S=1024, sigmoid): 107 ms at 64, 93 ms at
#: 128, 104 ms at 256 (smaller blocks skip more of the causal triangle, larger ones pay less per call)
BLOCK = 128


def below_normal(log_w: torch.Tensor) -> torch.Tensor:
    """Where exp(log_w) would be subnormal (below the dtype's smallest normal number): such weights are
    0 to any precision that matters, and the CPU multiplies subnormals, forward and backward, tens
    of times slower (measured: selective attention's forward + backward at S = 1024, 601 ms with
    them, 222 ms with subnormals flushed)."""
    return log_w < math.log(torch.finfo(log_w.dtype).tiny)


def block_allowed(q_mask, k_mask, causal: bool, a: int, b: int, kend: int, device, strict: bool = False):
    """(B|1, 1, b - a, kend) boolean: query rows a..b-1 against keys 0..kend-1 that take part (real
    query, real key and, if ``causal``, key j <= query i; ``strict``: j < i)."""
    rows = torch.arange(a, b, device=device)[:, None]
    cols = torch.arange(kend, device=device)[None, :]
    allowed = (cols < rows if strict else cols <= rows) if causal else torch.ones(b - a, kend, dtype=torch.bool,
                                                                                   device=device)
    allowed = allowed[None, None]
    if k_mask is not None:
        allowed = allowed & k_mask[:, None, None, :kend]
    if q_mask is not None:
        allowed = allowed & q_mask[:, None, a:b, None]
    return allowed


class RowwiseCore(ScoreOptions, AttentionCore):
    """Base of the schemes of this module: subclasses implement :meth:`block_weights`. ``softcap`` and ``window``
    (nas_cli/attention/mods.py) act on each block's scores and allowed pairs before the formula."""

    supports_step = True
    carries_state = False
    #: the scores in float32 (or wider) even under fp16/bf16 autocast: for a formula whose weights jump at
    #: a score (softpick's relu at s = 0), where half-precision scores move keys across the jump
    wide_scores = False

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, block_size: int = BLOCK,
                 softcap: float | None = None, window: int | None = None):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name)
        check_option("block_size", block_size, isinstance(block_size, int) and block_size >= 1,
                     "be a positive number of queries")
        self.block_size = int(block_size)
        self.score_options(softcap, window)

    def block_weights(self, s: torch.Tensor, allowed: torch.Tensor, a: int, carry):
        """Scores ``s`` (B, H, c, Sk') of query rows a..a+c-1 (float32 or wider; a fresh tensor the
        method may change in place) and the pairs that take part -> (weights (B, H, c, Sk'), the
        carry for the rows after)."""
        raise NotImplementedError

    def initial_carry(self, q: torch.Tensor, sk: int):
        return None

    takes_alibi = True

    def _block(self, a: int, q_mask, k_mask, q, k, v, carry, alibi=None):
        kend = k.size(-2)
        allowed = self.windowed(block_allowed(q_mask, k_mask, self.causal, a, a + q.size(-2), kend, q.device),
                                a, q.size(-2), kend, q.device)
        half = q.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(q.device.type)
        if self.wide_scores and half:
            wide = torch.promote_types(q.dtype, torch.float32)
            with torch.autocast(q.device.type, enabled=False):
                s = torch.matmul(q.to(wide) * (1 / math.sqrt(q.size(-1))), k.to(wide).transpose(-1, -2))
        else:  # scaled on q: one pass over (c x D), not over (c x Sk)
            s = full_precision(torch.matmul(q * (1 / math.sqrt(q.size(-1))), k.transpose(-1, -2)))
        s = self.capped(s)
        if alibi is not None:  # ALiBi (model.positions=alibi): rows a.., keys 0..kend-1
            s = s + score_bias(alibi, q.size(-2), kend, q.device, first=a)
        w, carry = self.block_weights(s, allowed, a, carry)
        dropped = nn.functional.dropout(w, self.dropout, self.training)
        return torch.matmul(dropped.to(v.dtype), v), w, carry

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, alibi=None) -> AttentionOutput:
        sq, sk = q.size(-2), k.size(-2)
        carry = self.initial_carry(q, sk)
        if need_weights or sq <= self.block_size:
            out, w, _ = self._block(0, q_mask, k_mask, q, k, v, carry, alibi)
            return AttentionOutput(out, w if need_weights else None, self.aux())
        outs = []
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        for a in range(0, sq, self.block_size):
            b = min(a + self.block_size, sq)
            kend = b if self.causal else sk
            args = (q[..., a:b, :], k[..., :kend, :], v[..., :kend, :], carry)

            def run(q_, k_, v_, carry_, a=a):
                out_, _, carry_ = self._block(a, q_mask, k_mask, q_, k_, v_, carry_, alibi)
                return out_, carry_

            out, carry = checkpoint(run, *args, use_reentrant=False) if grad else run(*args)
            outs.append(out)
        return AttentionOutput(torch.cat(outs, dim=-2), None, self.aux())

    def step(self, q, k, v, k_mask, state, alibi=None):
        """The newest query against all keys so far: in self-attention it is position Sk - 1."""
        sk = k.size(-2)
        a = sk - 1 if self.causal else 0
        carry = self.initial_carry(q, sk) if state is None else state
        out, _, carry = self._block(a, None, k_mask, q, k, v, carry, alibi)
        return out, (carry if self.carries_state else None)

    def prefill_state(self, q, k, v, q_mask, k_mask):
        """The carry after all rows of a causal prefill, in one pass of :meth:`forward`'s blocks."""
        if not self.carries_state:
            return None
        with torch.no_grad():
            _, _, carry = self._block(0, q_mask, k_mask, q, k, v, self.initial_carry(q, k.size(-2)))
        return carry

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}{self.score_repr()}"
