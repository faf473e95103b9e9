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
(the default) picks per call: :data:`PATHS` says which path runs when, why, and where it was measured.
All three give the same values and gradients. When the naive formula runs without
``need_weights`` (DNAS, i.e. one iteration), it runs as
:func:`nas_cli.attention.fused.doubly_normalized_attention`: the same formula with a
hand-derived backward, several times fewer passes over (Sq x Sk) tensors than autograd.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from nas_cli.attention.base import AttentionCore, AttentionOutput, NEG_INF, allowed_mask, masked_row_softmax, scaled_scores
from nas_cli.attention.doubly import doubly_normalized_logits, prefix_normalized_state, prefix_normalized_step
from nas_cli.attention.efficient import dnas_attention, hnas_attention
from nas_cli.attention.tiles import check_impl
from nas_cli.attention.fused import doubly_normalized_attention

#: ``impl=auto`` uses the naive formula when max(Sq, Sk) is below this, the efficient path
#: (no (Sq x Sk) tensor per head) from there on. Measured (one CPU thread, forward + backward
#: of one core, B=8, H=8, d_head=64, torch 2.13 CPU): full-column-sum form (encoder) naive
#: 1.0-2.3x faster at S=64-128; prefix form (decoder self- and cross-attention), with the
#: anchored-cumsum prefix log-sum-exp of :func:`nas_cli.attention.doubly.prefix_logsumexp`,
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
    """Whether ``impl=auto`` takes a fused path here: only on CUDA, from AUTO_NAIVE_BELOW on, and, for a
    path whose gradients are accumulated with atomics (``atomics``: FlexAttention's), never under
    ``torch.use_deterministic_algorithms`` (``trainer.deterministic=true``); the Triton kernels'
    backward has none."""
    return (device_type == "cuda" and length >= AUTO_NAIVE_BELOW
            and not (atomics and torch.are_deterministic_algorithms_enabled()))


@dataclass(frozen=True)
class Call:
    """What decides the path of one call of DNAS, HNAS or Sinkhorn-k: the core's settings and the inputs."""

    impl: str  # naive, efficient, flex, triton or auto (flex and triton where they do not apply: as auto)
    prefix: bool  # prefix-normalized (decoder self- and cross-attention), else the encoder form
    iterations: int  # Sinkhorn-k's k (1: DNAS, HNAS)
    dropout: bool  # attention dropout in training
    need_weights: bool
    device: torch.device
    length: int  # max(Sq, Sk)
    grad: bool  # gradients will be taken

    @classmethod
    def of(cls, core, q, k, need_weights: bool) -> "Call":
        return cls(core.impl, core.prefix_queries, core.iterations, core.training and core.dropout > 0,
                   need_weights, q.device, max(q.size(-2), k.size(-2)), torch.is_grad_enabled() and q.requires_grad)

    @property
    def short(self) -> bool:
        """The naive formula's range: ``impl=naive``, or a length below AUTO_NAIVE_BELOW for the others."""
        return self.impl == "naive" or (self.impl != "efficient" and self.length < AUTO_NAIVE_BELOW)


def _flex_applies(c: Call) -> bool:
    from nas_cli.attention.flex import flex_unavailable

    if c.impl not in ("flex", "auto") or c.prefix or c.dropout:
        return False
    if c.impl == "auto" and not auto_picks_fused(c.device.type, c.length):
        return False
    return flex_unavailable(c.device, c.grad) is None


def _triton_applies(c: Call) -> bool:
    if c.impl not in ("triton", "auto") or (not c.prefix and c.impl != "triton"):
        return False
    if (c.prefix and c.iterations != 1) or c.dropout:
        return False
    if c.impl == "auto" and not auto_picks_fused(c.device.type, c.length, atomics=False):
        return False
    from nas_cli.attention.triton_prefix import triton_unavailable

    return triton_unavailable(c.device) is None


def _run_flex(core, q, k, v, q_mask, k_mask, u):
    from nas_cli.attention.flex import dnas_flex, hnas_flex

    return dnas_flex(q, k, v, q_mask, k_mask, core.iterations) if u is None else hnas_flex(q, k, v, u, q_mask, k_mask)


def _run_triton(core, q, k, v, q_mask, k_mask, u):
    if not core.prefix_queries:
        from nas_cli.attention.triton_encoder import encoder_dnas_triton, encoder_hnas_triton

        return (encoder_dnas_triton(q, k, v, q_mask, k_mask, iterations=core.iterations) if u is None
                else encoder_hnas_triton(q, k, v, u, q_mask, k_mask))
    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    return (prefix_dnas_triton(q, k, v, q_mask, k_mask, causal=core.causal) if u is None
            else prefix_hnas_triton(q, k, v, u, q_mask, k_mask, causal=core.causal))


def _run_naive(core, q, k, v, q_mask, k_mask, u):
    allowed = allowed_mask(q_mask, k_mask, core.causal, q.size(-2), k.size(-2), q.device)
    return doubly_normalized_attention(q, k, v, allowed, core.prefix_queries, u=u, dropout_p=core.dropout,
                                       training=core.training)


def _run_efficient(core, q, k, v, q_mask, k_mask, u):
    dropout = core.dropout if core.training else 0.0
    if u is None:
        return dnas_attention(q, k, v, q_mask, k_mask, prefix=core.prefix_queries, causal=core.causal,
                              iterations=core.iterations, dropout_p=dropout, block_size=core.block_size)
    return hnas_attention(q, k, v, u, q_mask, k_mask, prefix=core.prefix_queries, causal=core.causal,
                          dropout_p=dropout, block_size=core.block_size)


@dataclass(frozen=True)
class Path:
    """One way to compute a call: when it applies, what runs it (None: the materialized weights of
    :meth:`AttentionCore.forward`), why it is there, and where that was measured."""

    name: str
    applies: Callable[[Call], bool]
    run: Callable | None
    why: str
    measured: str


#: the paths in the order they are tried; the first that applies runs the call (all give the same values
#: and gradients). ``impl=flex`` / ``impl=triton`` where their path does not apply run as ``auto``.
PATHS = (
    Path("weights", lambda c: c.need_weights, None, "the weights are asked for (diagnostics): the materialized "
         "formula, the reference", "-"),
    Path("flex", _flex_applies, _run_flex,
         "the encoder form as a per-key bias of FlexAttention (CUDA; no attention dropout in training)",
         "H200, bf16, B=8, H=8, d_head=64, forward + backward: 2.9-3.5x faster than the chunked path at "
         "S=512-8192 (docs/speed.md)"),
    Path("triton", _triton_applies, _run_triton,
         "the Triton kernels: both forms with impl=triton, the prefix form with auto (no atomics: deterministic)",
         "H200, same sizes: the prefix kernels 7.1x faster than the chunked path at S=512, 1.9x at S=8192"),
    Path("materialized", lambda c: c.short and c.iterations != 1, None,
         "Sinkhorn-k on short sequences: the naive formula, materialized (its hand-derived backward is DNAS's)",
         "as naive below"),
    Path("naive", lambda c: c.short, _run_naive,
         "short sequences: a few large ops with a hand-derived backward beat the chunked passes",
         "one CPU thread, B=8, H=8, d_head=64, torch 2.13: 1.0-2.3x faster (encoder form) and 1.6-2.9x "
         "(prefix form) than the chunked path at S=64-256"),
    Path("efficient", lambda c: True, _run_efficient,
         "long sequences: no (Sq x Sk) tensor per head, the memory stays linear in the length",
         "the naive form keeps several (B, H, S, S) tensors for backward above S=256"),
)


def path_for(core, q, k, need_weights: bool = False) -> Path:
    """The path this call of ``core`` (DNAS, HNAS or Sinkhorn-k) takes: the first of :data:`PATHS` that applies."""
    call = Call.of(core, q, k, need_weights)
    return next(path for path in PATHS if path.applies(call))


def log_row_normalize(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """log softmax over keys, -inf where disallowed and for rows with no allowed key."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, NEG_INF)
    out = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.nan_to_num(out, nan=NEG_INF, posinf=NEG_INF)


class DNAS(AttentionCore):
    name = "dnas"
    #: number of (column, row) normalization pairs; Sinkhorn-k sets it
    iterations = 1

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, impl: str = "auto",
                 block_size: int | None = None, **kw):
        super().__init__(heads, causal, dropout, **kw)
        self.impl = resolve_impl(impl, block_size)
        # query-block height of the efficient path (None: sized from the tile budget)
        self.block_size = None if block_size is None else int(block_size)

    def mixing(self) -> torch.Tensor | None:
        """HNAS's per-head weight u of the DNAS part against softmax attention; None: DNAS alone."""
        return None

    def weights_from_logits(self, logits, allowed):
        # Ding et al. 2020: column step (over queries), then row step (over keys)
        return masked_row_softmax(doubly_normalized_logits(logits, allowed, self.prefix_queries), allowed)

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        """The one dispatch of DNAS, Sinkhorn-k and HNAS: the path :func:`path_for` chooses from
        :data:`PATHS`, run with HNAS's u (:meth:`mixing`) where there is one."""
        path = path_for(self, q, k, need_weights)
        if path.run is None:
            return super().forward(q, k, v, q_mask, k_mask, need_weights)
        return AttentionOutput(path.run(self, q, k, v, q_mask, k_mask, self.mixing()), None, self.aux())

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
