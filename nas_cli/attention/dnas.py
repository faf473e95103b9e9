"""DNAS and Sinkhorn-k: doubly normalized attention, Ding et al. 2020.

DNAS normalizes each key column over the queries, then each query row over the keys:
    xi_ij = exp(s_ij) / sum_i' exp(s_i'j);   pi_ij = xi_ij / sum_j' xi_ij'
which, in logs, is ordinary softmax attention with an additive per-key bias -c_j,
c_j = logsumexp_i s_ij (Ding et al. 2020). Sinkhorn-k repeats the (column, row)
pair k times; k = 1 is DNAS.

Causal form (not in the paper): a column normalizer that sums over all queries would
let query i see later queries. Here the column step for query i sums only over the
queries i' <= i (a prefix log-sum-exp), so position i depends on positions <= i only.
For Sinkhorn-k each later iteration uses the same prefix rule on the previous iterate.

Padding is excluded from both steps: padded queries never enter a column sum and
padded keys never enter a row sum.

Implementations (option ``attention.impl``): ``efficient`` runs
:mod:`nas_cli.attention.efficient` when weights are not requested, which never holds an
(Sq x Sk) tensor per head and gives the same values and gradients; ``naive`` always uses
the formula below, which stays the reference and serves ``need_weights=True``; ``auto``
(the default in ``conf/attention/*.yaml``) picks per call, see :func:`auto_uses_naive`.
All three give the same values and gradients. When the naive formula runs without
``need_weights`` (DNAS, i.e. one iteration), it runs as
:func:`nas_cli.attention.fused.doubly_normalized_attention`: the same formula with a
hand-derived backward, several times fewer passes over (Sq x Sk) tensors than autograd.
"""
from __future__ import annotations

import torch

from nas_cli.attention.base import (AttentionCore, AttentionOutput, NEG_INF, allowed_mask, doubly_normalized_logits,
                   masked_row_softmax, prefix_normalized_state, prefix_normalized_step, scaled_scores)
from nas_cli.attention.efficient import dnas_attention
from nas_cli.attention.tiles import check_impl
from nas_cli.attention.fused import doubly_normalized_attention

#: ``impl=auto`` uses the naive formula when max(Sq, Sk) is below this, the efficient path
#: (no (Sq x Sk) tensor per head) from there on. Measured (one CPU thread, forward + backward
#: of one core, B=8, H=8, d_head=64, torch 2.13 CPU): full-column-sum form (encoder) naive
#: 1.0-2.3x faster at S=64-128; prefix form (decoder self- and cross-attention), with the
#: anchored-cumsum prefix log-sum-exp of :func:`nas_cli.attention.base.prefix_logsumexp`,
#: naive 1.7-2.9x faster at S=64, 1.6-2.2x at S=128 and 1.6-2.4x at S=256. Above S=256 the
#: naive form's memory (several (B, H, S, S) tensors kept for backward) is the reason to switch.
AUTO_NAIVE_BELOW = 256


def resolve_impl(impl: str, block_size) -> str:
    """Validated ``attention.impl``; ``auto`` with an explicit ``block_size`` (a setting of
    the efficient path only) means ``efficient``."""
    if impl == "auto":
        return "efficient" if block_size is not None else "auto"
    try:
        return check_impl(impl)
    except ValueError as err:
        raise ValueError(f"{err}, or auto (picks one per sequence length)") from None


def auto_picks_fused(device_type: str, length: int, atomics: bool = True) -> bool:
    """Whether ``impl=auto`` takes a fused path here: FlexAttention for the encoder form, the Triton
    kernels for the prefix form. Only on CUDA, from AUTO_NAIVE_BELOW on, and, for a path whose
    gradients are accumulated with atomics (``atomics``: FlexAttention's), never under
    ``torch.use_deterministic_algorithms`` (``trainer.deterministic=true``); the Triton kernels'
    backward has none. Measured on an H200 (docs/speed.md, bf16, B=8, H=8, d_head=64, forward
    + backward of one core): FlexAttention DNAS 2.9-3.5x faster than the chunked path at S=512-8192,
    the Triton prefix kernels 7.1x at S=512 down to 1.9x at S=8192; below S=256 the naive formula
    stays (not measured against them on a GPU)."""
    return (device_type == "cuda" and length >= AUTO_NAIVE_BELOW
            and not (atomics and torch.are_deterministic_algorithms_enabled()))


def flex_applies(core, q, k, need_weights: bool) -> bool:
    """Whether this call goes through FlexAttention (nas_cli/attention/flex.py): ``impl=flex``,
    or ``impl=auto`` where :func:`auto_picks_fused`, for the encoder form (no prefix
    normalization) without attention dropout in training, where FlexAttention can run it. The
    other cases keep the chunked path, which gives the same values and gradients."""
    from nas_cli.attention.flex import flex_unavailable

    if core.impl not in ("flex", "auto") or core.prefix_queries or need_weights:
        return False
    if core.training and core.dropout > 0:
        return False
    if core.impl == "auto" and not auto_picks_fused(q.device.type, max(q.size(-2), k.size(-2))):
        return False
    return flex_unavailable(q.device, torch.is_grad_enabled() and q.requires_grad) is None


def triton_applies(core, q, k, need_weights: bool) -> bool:
    """Whether this call runs the Triton kernels: ``impl=triton`` in either form of DNAS (the prefix
    form of decoder self- and cross-attention: nas_cli/attention/triton_prefix.py; the encoder form:
    nas_cli/attention/triton_encoder.py, Sinkhorn-k's too; Sinkhorn-k's prefix form keeps the chunked
    path), or ``impl=auto`` where :func:`auto_picks_fused` in the
    prefix form (the encoder form's ``auto`` keeps FlexAttention until the kernels are timed on a
    GPU), without attention dropout in training, where Triton can run (CUDA, or its interpreter for
    ``impl=triton``). Elsewhere ``impl=triton`` runs as ``auto`` (the run says so once, nas_cli/pipeline/checks.py)."""
    if core.impl not in ("triton", "auto") or need_weights:
        return False
    if not core.prefix_queries and core.impl != "triton":
        return False
    if (core.prefix_queries and getattr(core, "iterations", 1) != 1) or (core.training and core.dropout > 0):
        return False
    if core.impl == "auto" and not auto_picks_fused(q.device.type, max(q.size(-2), k.size(-2)), atomics=False):
        return False
    from nas_cli.attention.triton_prefix import triton_unavailable

    return triton_unavailable(q.device) is None


def auto_uses_naive(q: torch.Tensor, k: torch.Tensor, prefix: bool = False, iterations: int = 1) -> bool:
    """``impl=auto``: the naive formula for short sequences (max(Sq, Sk) < AUTO_NAIVE_BELOW),
    where its few large ops beat the chunked passes, in every form (``prefix`` and
    ``iterations`` are kept for callers; the threshold is the same); the efficient path
    otherwise (no (Sq x Sk) tensor per head)."""
    return max(q.size(-2), k.size(-2)) < AUTO_NAIVE_BELOW


def log_row_normalize(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """log softmax over keys, -inf where disallowed and for rows with no allowed key."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, NEG_INF)
    out = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.nan_to_num(out, nan=NEG_INF, posinf=NEG_INF)


class DNAS(AttentionCore):
    name = "dnas"
    #: number of (column, row) normalization pairs; Sinkhorn overrides it
    iterations = 1

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, impl: str = "efficient",
                 block_size: int | None = None, **kw):
        super().__init__(heads, causal, dropout, **kw)
        self.impl = resolve_impl(impl, block_size)
        # query-block height of the efficient path (None: sized from the tile budget)
        self.block_size = None if block_size is None else int(block_size)

    def uses_naive(self, q, k) -> bool:
        if self.impl in ("auto", "flex", "triton"):  # flex / triton where they do not apply: as auto
            return auto_uses_naive(q, k, self.prefix_queries, self.iterations)
        return self.impl == "naive"

    def weights_from_logits(self, logits, allowed):
        # Ding et al. 2020: column step (over queries), then row step (over keys)
        return masked_row_softmax(doubly_normalized_logits(logits, allowed, self.prefix_queries), allowed)

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        """The one dispatch of DNAS, Sinkhorn-k and HNAS: the materialized weights when they are
        asked for, else FlexAttention, the Triton kernels, the naive formula (with a hand-derived
        backward) or the chunked memory-efficient path, whichever applies; the path's method
        (:meth:`_flex`, :meth:`_triton`, :meth:`_naive`, :meth:`_efficient`) does the scheme's
        arithmetic. All paths give the same values and gradients."""
        if need_weights:
            return super().forward(q, k, v, q_mask, k_mask, need_weights)
        if flex_applies(self, q, k, need_weights):
            out = self._flex(q, k, v, q_mask, k_mask)
        elif triton_applies(self, q, k, need_weights):
            out = self._triton(q, k, v, q_mask, k_mask)
        elif self.uses_naive(q, k):
            if self.iterations != 1:  # Sinkhorn-k: the materialized formula
                return super().forward(q, k, v, q_mask, k_mask, need_weights)
            out = self._naive(q, k, v, allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device))
        else:
            out = self._efficient(q, k, v, q_mask, k_mask)
        return AttentionOutput(out, None, self.aux())

    def _flex(self, q, k, v, q_mask, k_mask):
        from nas_cli.attention.flex import dnas_flex

        return dnas_flex(q, k, v, q_mask, k_mask, self.iterations)

    def _triton(self, q, k, v, q_mask, k_mask):
        if not self.prefix_queries:
            from nas_cli.attention.triton_encoder import encoder_dnas_triton

            return encoder_dnas_triton(q, k, v, q_mask, k_mask, iterations=self.iterations)
        from nas_cli.attention.triton_prefix import prefix_dnas_triton

        return prefix_dnas_triton(q, k, v, q_mask, k_mask, causal=self.causal)

    def _naive(self, q, k, v, allowed):
        return doubly_normalized_attention(q, k, v, allowed, self.prefix_queries, dropout_p=self.dropout,
                                           training=self.training)

    def _efficient(self, q, k, v, q_mask, k_mask):
        return dnas_attention(q, k, v, q_mask, k_mask, prefix=self.prefix_queries, causal=self.causal,
                              iterations=self.iterations, dropout_p=self.dropout if self.training else 0.0,
                              block_size=self.block_size)

    @property
    def supports_step(self) -> bool:  # incremental decoding exists for the prefix (decoder) form
        return self.prefix_queries

    def step(self, q, k, v, k_mask, state):
        weights, state = prefix_normalized_step(scaled_scores(q, k), k_mask, state, self.iterations)
        return torch.matmul(weights, v), state

    def prefill_state(self, q, k, v, q_mask, k_mask):
        """The running column log-sum-exp of every iteration after a causal prefill, in one pass."""
        allowed = allowed_mask(q_mask, k_mask, True, q.shape[-2], k.shape[-2], q.device)
        return prefix_normalized_state(scaled_scores(q, k), allowed, self.iterations)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl}"


class Sinkhorn(DNAS):
    """k alternating (column, row) normalizations started from exp(s); k=1 is DNAS."""

    name = "sinkhorn"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, iterations: int = 3, **kw):
        super().__init__(heads, causal, dropout, **kw)
        if int(iterations) < 1:
            raise ValueError(f"attention.iterations must be >= 1 (got {iterations})")
        self.iterations = int(iterations)

    def weights_from_logits(self, logits, allowed):
        log_pi = logits
        for _ in range(self.iterations - 1):
            log_pi = log_row_normalize(doubly_normalized_logits(log_pi, allowed, self.prefix_queries), allowed)
        return masked_row_softmax(doubly_normalized_logits(log_pi, allowed, self.prefix_queries), allowed)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", iterations={self.iterations}"
