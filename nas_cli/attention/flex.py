"""DNAS / HNAS / Sinkhorn-k with PyTorch FlexAttention (``attention.impl=flex``), encoder form.

Notation of Ding et al. 2020 ("Attention that does not Explain Away"): s_ij = q_i . k_j / sqrt(d_head).

* **DNAS** takes two FlexAttention passes. The first is the column log-sum-exp
  c_j = LSE_i s_ij over real queries. It is the row LSE of the *swapped* problem, with the
  keys as queries and the queries as keys (``return_lse``, which is differentiable). The
  second is attention with ``score_mod`` adding -c_j. Its row softmax is DNAS's row step
  (Ding et al.).
* **Sinkhorn-k** alternates k column and row passes in vector form:
  log pi_ij = s_ij - C_j - R_i, with C_j = LSE_i (s_ij - R_i) (swapped problem, score_mod -R)
  and R_i = LSE_j (s_ij - C_j). The output pass uses bias -C_j, like DNAS.
* **HNAS** mixes the DNAS output with plain softmax attention, per head by u.

Padding is a ``mask_mod``. A query that is padding takes no part in any column sum, and a
key that is padding takes no part in any row. Gradients flow through the LSE and through the
captured bias, so they are exact. FlexAttention's gradients need CUDA (PyTorch has no CPU
backward). On the CPU it runs forward only, which the tests use to check the values.

The prefix form (decoder self- and cross-attention) is not a per-key bias: the normalizer
of query i sums only over queries i' <= i. It keeps the chunked PyTorch path
(:mod:`.efficient_prefix`), and so does every case FlexAttention cannot take.
"""
from __future__ import annotations

from types import MappingProxyType
import functools

import torch

from nas_cli.attention.tiles import no_autocast, sdpa_dtype


def flex_unavailable(device: torch.device | str, training: bool) -> str | None:
    """None when FlexAttention can run this (device, training) case, else the reason.
    (Asked on every forward of a core with impl=auto/flex: the answer is cached.)"""
    return _unavailable(torch.device(device).type, bool(training))


@functools.lru_cache(maxsize=None)
def _unavailable(device_type: str, training: bool) -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"this torch ({torch.__version__}) has no FlexAttention (torch >= 2.5 has)"
    if training and device_type != "cuda":
        return "FlexAttention has no backward pass on the CPU (PyTorch); it trains on CUDA only"
    return None


# Four call forms, each its own function and so its own compiled frame. Dynamo caches compiled code
# per code object and recompiles for each new guard (score_mod's code, return_lse, a mask or none,
# a new length) up to its recompile limit (8), after which it runs the eager flex_attention, which
# materializes every score: one compiled flex_attention shared by all forms reached that limit
# within one benchmark run on an H200 (DNAS at S=4096 then held 27 GiB). Each form here sees two
# lengths at most before its lengths turn symbolic (dynamic=None), and a mask or none.
def _plain(q, k, v, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask)


def _plain_lse(q, k, v, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, return_lse=True)


def _biased(q, k, v, bias, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, qi, kj):
        return score - bias[b, h, kj]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


def _biased_lse(q, k, v, bias, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, qi, kj):
        return score - bias[b, h, kj]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)


_FORMS = MappingProxyType({(False, False): _plain, (False, True): _plain_lse, (True, False): _biased, (True, True): _biased_lse})


@functools.lru_cache(maxsize=None)
def _kernel(device_type: str, biased: bool, lse: bool):
    """The call form, compiled on CUDA (the fused kernel); eager elsewhere (a reference)."""
    fn = _FORMS[biased, lse]
    if device_type == "cuda":
        # dynamic=None: a second length recompiles once with symbolic lengths (dynamic=False compiled
        # every new batch length anew)
        return torch.compile(fn, dynamic=None)
    return fn


def _attend(q, k, v, bias=None, bias_dim: str = "k", allowed=None, lse: bool = False):
    """softmax_j(s_ij - bias) v_j over the keys ``allowed`` admits (B, Sk bool, or None).
    ``bias`` (B, H, n) is indexed by the key (``bias_dim="k"``). Returns the output, and the
    row log-sum-exp (B, H, Sq) of the biased scores when ``lse``."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask

    if v is k or v is q:
        # a dummy (the output is not used) with its own storage: aliased k/v crashed torch._dynamo
        v = v.detach().clone()

    block_mask = None
    if allowed is not None:
        def mask_mod(b, h, qi, kj):
            return allowed[b, kj]

        block_mask = create_block_mask(mask_mod, q.size(0), None, q.size(-2), k.size(-2), device=q.device)
    fn = _kernel(q.device.type, bias is not None, bool(lse))
    # the precision is made explicit: under autocast the inputs are cast to the autocast dtype and the call
    # runs with autocast off. Left to autocast, the compiled call did not follow the autocast dtype (torch
    # 2.11, H200): a graph compiled under one served the other (fp16 computed in bf16; after an fp16 run had
    # filled the compile cache, bf16 computed in float16). The bias (a log-sum-exp) stays float32 (float64
    # for float64 inputs).
    dtype = sdpa_dtype(q)
    with warnings.catch_warnings(), no_autocast(q.device):  # the CPU path warns that it is not compiled
        warnings.simplefilter("ignore")
        q, k, v = (t.to(dtype) for t in (q, k, v))
        if bias is None:
            return fn(q, k, v, block_mask)
        return fn(q, k, v, bias.to(torch.promote_types(dtype, torch.float32)), block_mask)


def column_lse(q, k, q_mask=None, row_bias=None):
    """c_j = LSE_i (s_ij - row_bias_i) over real queries i: (B, H, Sk), as the row LSE of the
    swapped problem (keys as queries, queries as keys). The values are a dummy (the queries)."""
    _, lse = _attend(k, q, q, bias=row_bias, allowed=q_mask, lse=True)
    # flex's LSE is of the scaled scores q.k / sqrt(d), the same s_ij as the naive formula
    return lse


def dnas_flex(q, k, v, q_mask=None, k_mask=None, iterations: int = 1) -> torch.Tensor:
    """Doubly normalized attention (``iterations`` = 1) or Sinkhorn-k, encoder form: (B, H, Sq, Dv)."""
    qf, kf, vf = q, k, v
    col = column_lse(qf, kf, q_mask)  # C for R = 0: DNAS's c_j
    for _ in range(iterations - 1):
        # R_i = LSE_j (s_ij - C_j) over real keys, then C_j = LSE_i (s_ij - R_i) over real queries
        _, row = _attend(qf, kf, kf, bias=col, allowed=k_mask, lse=True)
        col = column_lse(qf, kf, q_mask, row_bias=row)
    col = torch.where(torch.isfinite(col), col, torch.zeros_like(col))  # padded keys: masked below anyway
    out = _attend(qf, kf, vf, bias=col, allowed=k_mask)
    if q_mask is not None:  # outputs at padded queries are zero, as in the other paths
        out = out * q_mask[:, None, :, None].to(out.dtype)
    return out


def softmax_flex(q, k, v, q_mask=None, k_mask=None) -> torch.Tensor:
    out = _attend(q, k, v, allowed=k_mask)
    if q_mask is not None:
        out = out * q_mask[:, None, :, None].to(out.dtype)
    return out


def hnas_flex(q, k, v, u, q_mask=None, k_mask=None) -> torch.Tensor:
    """u_h * DNAS + (1 - u_h) * UNAS per head, u (H,)."""
    dn = dnas_flex(q, k, v, q_mask, k_mask)
    un = softmax_flex(q, k, v, q_mask, k_mask)
    w = u.to(dn.dtype)[None, :, None, None]
    return w * dn + (1 - w) * un
