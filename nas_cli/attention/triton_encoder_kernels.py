"""Triton kernels of DNAS's encoder form (imported only when they run: importing this imports
Triton). The algorithm and its derivation: :mod:`nas_cli.attention.triton_encoder`.

Per (batch x head), on the allowed pairs (real query, real key):
  s_ij = scale q_i . k_j,  c_j = log sum_i exp(s_ij)   (the column normalizer over all queries)
  z_ij = s_ij - c_j,  p_ij = softmax_j z_ij,  O_i = sum_j p_ij v_j.

``HYBRID`` (HNAS, Ding et al.): the same pass over K and V also gives softmax attention,
P_ij = softmax_j s_ij and O2_i = sum_j P_ij v_j (its own output and LSE2); the caller mixes
u O + (1 - u) O2 per head. The backward then takes u per head (``U``) and both outputs' row terms.

``LOWP``: bf16/fp16 inputs go through ``tl.dot`` in their own dtype (tensor cores) with float32
accumulation; float32 and float64 inputs keep exact (IEEE) products in the work dtype ``DT``.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

NEG = tl.constexpr(-1.0e30)  # a constexpr: compiled Triton refuses a plain global inside a kernel
#: Triton's CPU interpreter multiplies bf16 tiles wrongly in tl.dot (it is numpy underneath, which has
#: no bf16): there the low-precision products are taken in float32 from the same (exactly widened)
#: bf16/fp16 values, which is what the tensor cores compute up to the order of the float32 sums
INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def tile_dot(a, b, DT: tl.constexpr, LOWP: tl.constexpr):
    """a @ b with float32 (or float64) accumulation: tensor cores for bf16/fp16 operands, IEEE otherwise."""
    # one return per function: compiled Triton checks every return statement's type, the untaken
    # branches' of a constexpr if included
    if LOWP:
        if INTERPRETING:
            out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee", out_dtype=tl.float32).to(DT)
        else:
            out = tl.dot(a, b, out_dtype=tl.float32).to(DT)
    else:
        out = tl.dot(a.to(DT), b.to(DT), input_precision="ieee", out_dtype=DT)
    return out


@triton.jit
def tile_load(P, bh, offs_r, offs_c, R, C, DT: tl.constexpr, LOWP: tl.constexpr):
    """A (rows x cols) tile of a (B*H, R, C) tensor, zeros outside; native dtype if LOWP, else DT."""
    x = tl.load(P + bh * R * C + offs_r[:, None] * C + offs_c[None, :],
                mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)
    if not LOWP:
        x = x.to(DT)
    return x


@triton.jit
def tile_store(P, bh, offs_r, offs_c, R, C, x):
    """Write a (rows x cols) tile into a (B*H, R, C) tensor, inside its bounds."""
    tl.store(P + bh * R * C + offs_r[:, None] * C + offs_c[None, :], x,
             mask=(offs_r[:, None] < R) & (offs_c[None, :] < C))


@triton.jit
def _allowed(offs_q, offs_k, b, Sq, Sk, QM, KM, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr):
    """The allowed pairs of a tile: inside both lengths (``EVEN``: the tiles divide both lengths, so every
    pair is; a constant the compiler folds into the selects that use it), real query, real key."""
    if EVEN:
        ok = tl.full((offs_q.shape[0], offs_k.shape[0]), 1, tl.int1)
    else:
        ok = (offs_q[:, None] < Sq) & (offs_k[None, :] < Sk)
    if HAS_QM:
        qm = tl.load(QM + b * Sq + offs_q, mask=offs_q < Sq, other=0)
        ok = ok & (qm[:, None] != 0)
    if HAS_KM:
        km = tl.load(KM + b * Sk + offs_k, mask=offs_k < Sk, other=0)
        ok = ok & (km[None, :] != 0)
    return ok


@triton.jit
def tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM: tl.constexpr,
                HAS_KM: tl.constexpr, DT: tl.constexpr, LOWP: tl.constexpr, EVEN: tl.constexpr):
    """One (BQ x BK) tile: the scores (NEG where not allowed), the allowed mask, the loaded q and k."""
    q = tile_load(Q, bh, offs_q, offs_d, Sq, D, DT, LOWP)
    k = tile_load(K, bh, offs_k, offs_d, Sk, D, DT, LOWP)
    s = tile_dot(q, tl.trans(k), DT, LOWP) * scale
    ok = _allowed(offs_q, offs_k, b, Sq, Sk, QM, KM, HAS_QM, HAS_KM, EVEN)
    return tl.where(ok, s, NEG), ok, q, k


@triton.jit
def softmax_step(m, l, acc, z, ok, V, bh, offs_k, offs_dv, Sk, DV, DT: tl.constexpr, LOWP: tl.constexpr):
    """One key block of FlashAttention's online softmax over z (NEG where not allowed): the running
    row maximum m, sum l and output accumulator acc, updated with this block's values."""
    m_new = tl.maximum(m, tl.max(z, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.where(ok, tl.exp(z - m_new[:, None]), 0.0)
    v = tile_load(V, bh, offs_k, offs_dv, Sk, DV, DT, LOWP)
    return m_new, l * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tile_dot(p.to(v.dtype), v, DT, LOWP)


@triton.jit
def store_rows(OUT, LSE, bh, offs_q, offs_dv, Sq, DV, acc, m, l, has):
    """The finished rows: O = acc / l (zeros for a row with no allowed key) and LSE = m + log l (0 there)."""
    out = tl.where(has[:, None], acc / tl.where(has, l, 1.0)[:, None], 0.0)
    tile_store(OUT, bh, offs_q, offs_dv, Sq, DV, out)
    tl.store(LSE + bh * Sq + offs_q, tl.where(has, m + tl.log(tl.where(has, l, 1.0)), 0.0), mask=offs_q < Sq)


@triton.jit(do_not_specialize=["TUNE"])
def col_kernel(Q, K, QM, KM, RB, C, H, Sq, Sk, D, scale,
               TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
               LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, HAS_RB: tl.constexpr):
    """C[bh, j] = log sum_i exp(s_ij - RB[bh, i]) over the allowed queries (NEG for a column with
    none; RB, a per-query bias, only with ``HAS_RB``: Sinkhorn-k's later column steps): one program
    per (bh, key block), an online log-sum-exp down the query blocks. No V, no output."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    m = tl.full((BK,), NEG, DT)
    l = tl.zeros((BK,), DT)
    for qb in range(0, tl.cdiv(Sq, BQ)):
        offs_q = qb * BQ + tl.arange(0, BQ)
        s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT,
                              LOWP, EVEN)
        if HAS_RB:
            rb = tl.load(RB + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
            s = tl.where(ok, s - rb[:, None], NEG)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.where(ok, tl.exp(s - m_new[None, :]), 0.0), axis=0)
        m = m_new
    tl.store(C + bh * Sk + offs_k, tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), NEG), mask=offs_k < Sk)


@triton.jit(do_not_specialize=["TUNE"])
def row_kernel(Q, K, V, QM, KM, C, OUT, LSE, OUT2, LSE2, H, Sq, Sk, D, DV, scale,
               TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
               LOWP: tl.constexpr,
               BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, HYBRID: tl.constexpr):
    """Output rows of one query block: FlashAttention's online softmax of z = s - c over the key
    blocks; LSE[bh, i] = log sum_j exp(z_ij) is kept for the backward (0 for a row with no key).
    ``HYBRID``: softmax attention over s in the same loop, into OUT2 and LSE2."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    m = tl.full((BQ,), NEG, DT)
    l = tl.zeros((BQ,), DT)
    acc = tl.zeros((BQ, BDV), DT)
    m2 = tl.full((BQ,), NEG, DT)
    l2 = tl.zeros((BQ,), DT)
    acc2 = tl.zeros((BQ, BDV), DT)
    for kb in range(0, tl.cdiv(Sk, BK)):
        offs_k = kb * BK + tl.arange(0, BK)
        s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT,
                              LOWP, EVEN)
        c = tl.load(C + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
        m, l, acc = softmax_step(m, l, acc, tl.where(ok, s - c[None, :], NEG), ok, V, bh, offs_k, offs_dv, Sk, DV,
                                 DT, LOWP)
        if HYBRID:
            m2, l2, acc2 = softmax_step(m2, l2, acc2, s, ok, V, bh, offs_k, offs_dv, Sk, DV, DT, LOWP)
    store_rows(OUT, LSE, bh, offs_q, offs_dv, Sq, DV, acc, m, l, l > 0)
    if HYBRID:
        store_rows(OUT2, LSE2, bh, offs_q, offs_dv, Sq, DV, acc2, m2, l2, l2 > 0)


@triton.jit
def _grad_tile(Q, K, V, QM, KM, C, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, offs_q, offs_k, offs_d, offs_dv, Sq, Sk,
               D, DV, scale, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr, LOWP: tl.constexpr,
               HYBRID: tl.constexpr, EVEN: tl.constexpr):
    """One tile of the backward: p (row weights), pi = exp(s - c) (the column step's weights),
    dz = p (u dO . v - D) (the gradient of z; u = 1 without ``HYBRID``), and the loaded q, k, dO.
    ``HYBRID``: w = u p + (1 - u) P (the weights dV sees) and ds2 = P ((1 - u) dO . v - D2) (the
    softmax part's score gradient, 0 otherwise)."""
    s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT, LOWP,
                              EVEN)
    c = tl.load(C + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
    lse = tl.load(LSE + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
    z = s - c[None, :]
    p = tl.where(ok, tl.exp(z - lse[:, None]), 0.0)
    # pi = exp(z) = p exp(lse_i), one exponential per row instead of one per score: z <= 0 (c_j is the
    # column's log-sum-exp), so lse_i <= log Sk cannot overflow, and where exp(lse_i) underflows pi <= exp(lse_i)
    pi = p * tl.exp(lse)[:, None]
    do = tile_load(DO, bh, offs_q, offs_dv, Sq, DV, DT, LOWP)
    w, dz, ds2 = mixed_grads(s, ok, p, do, V, DELTA, LSE2, DELTA2, u, bh, offs_q, offs_k, offs_dv, Sq, Sk, DV, DT,
                             LOWP, HYBRID)
    return w, pi, dz, ds2, q, k, do


@triton.jit
def mixed_grads(s, ok, p, do, V, DELTA, LSE2, DELTA2, u, bh, offs_q, offs_k, offs_dv, Sq, Sk, DV, DT: tl.constexpr,
                LOWP: tl.constexpr, HYBRID: tl.constexpr):
    """A backward tile's terms from the DNAS weights p (either form): dz = p (u dO . v - D) (u = 1
    without ``HYBRID``); with ``HYBRID`` (HNAS) also the softmax part's score gradient
    ds2 = P ((1 - u) dO . v - D2), P = exp(s - LSE2) (0 otherwise), and the weights dV sees,
    w = u p + (1 - u) P (p otherwise). One dO . V^T serves both parts."""
    v = tile_load(V, bh, offs_k, offs_dv, Sk, DV, DT, LOWP)
    delta = tl.load(DELTA + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
    dpv = tile_dot(do, tl.trans(v), DT, LOWP)
    if HYBRID:
        lse2 = tl.load(LSE2 + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
        delta2 = tl.load(DELTA2 + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
        p2 = tl.where(ok, tl.exp(s - lse2[:, None]), 0.0)
        dz = tl.where(ok, p * (u * dpv - delta[:, None]), 0.0)
        ds2 = tl.where(ok, p2 * ((1.0 - u) * dpv - delta2[:, None]), 0.0)
        w = u * p + (1.0 - u) * p2
    else:
        dz = tl.where(ok, p * (dpv - delta[:, None]), 0.0)
        ds2 = tl.zeros_like(dz)
        w = p
    return w, dz, ds2


@triton.jit
def head_u(U, bh, H, DT: tl.constexpr, HYBRID: tl.constexpr):
    """HNAS's u of this program's head (1.0 without ``HYBRID``)."""
    if HYBRID:
        return tl.load(U + bh % H).to(DT)
    return tl.full((), 1.0, DT)


@triton.jit(do_not_specialize=["TUNE"])
def bwd_kv_kernel(Q, K, V, QM, KM, C, LSE, DO, DELTA, LSE2, DELTA2, U, G, DK, DVv, H, Sq, Sk, D, DV, scale,
                  TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                  LOWP: tl.constexpr,
                  BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, HYBRID: tl.constexpr):
    """dK and dV of one key block (FlashAttention-2's key-block program, no atomics), one pass down the
    query blocks. With ds_ij = dz_ij - pi_ij G_j (the column step's term, G_j = sum_i dz_ij):
    dk_j = scale (sum_i (dz_ij + ds2_ij) q_i - G_j sum_i pi_ij q_i), so G_j, both sums and
    dv_j = sum_i p_ij dO_i accumulate in the same loop (one QK^T, one dO V^T and one exponential per
    score, rather than a first loop for G and a second that recomputes every tile).
    G is kept for the dQ pass."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    nqb = tl.cdiv(Sq, BQ)
    u = head_u(U, bh, H, DT, HYBRID)
    g = tl.zeros((BK,), DT)
    dk = tl.zeros((BK, BD), DT)
    dkc = tl.zeros((BK, BD), DT)
    dv = tl.zeros((BK, BDV), DT)
    for qb in range(0, nqb):
        offs_q = qb * BQ + tl.arange(0, BQ)
        w, pi, dz, ds2, q, k, do = _grad_tile(Q, K, V, QM, KM, C, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, offs_q,
                                              offs_k, offs_d, offs_dv, Sq, Sk, D, DV, scale, HAS_QM, HAS_KM, DT, LOWP,
                                              HYBRID, EVEN)
        g += tl.sum(dz, axis=0)
        dv += tile_dot(tl.trans(w.to(do.dtype)), do, DT, LOWP)
        dk += tile_dot(tl.trans((dz + ds2).to(q.dtype)), q, DT, LOWP)
        dkc += tile_dot(tl.trans(pi.to(q.dtype)), q, DT, LOWP)
    tl.store(G + bh * Sk + offs_k, g, mask=offs_k < Sk)
    tile_store(DK, bh, offs_k, offs_d, Sk, D, (dk - g[:, None] * dkc) * scale)
    tile_store(DVv, bh, offs_k, offs_dv, Sk, DV, dv)


@triton.jit(do_not_specialize=["TUNE"])
def bwd_q_kernel(Q, K, V, QM, KM, C, LSE, DO, DELTA, LSE2, DELTA2, U, G, DQ, H, Sq, Sk, D, DV, scale,
                 TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                 LOWP: tl.constexpr,
                 BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, HYBRID: tl.constexpr):
    """dQ of one query block in its own pass (no atomics): dq_i = scale sum_j (dz_ij - pi_ij G_j + ds2_ij) k_j."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    dq = tl.zeros((BQ, BD), DT)
    u = head_u(U, bh, H, DT, HYBRID)
    for kb in range(0, tl.cdiv(Sk, BK)):
        offs_k = kb * BK + tl.arange(0, BK)
        w, pi, dz, ds2, q, k, do = _grad_tile(Q, K, V, QM, KM, C, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, offs_q,
                                              offs_k, offs_d, offs_dv, Sq, Sk, D, DV, scale, HAS_QM, HAS_KM, DT, LOWP,
                                              HYBRID, EVEN)
        g = tl.load(G + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
        ds = dz - pi * g[None, :] + ds2
        dq += tile_dot(ds.to(k.dtype), k, DT, LOWP)
    tile_store(DQ, bh, offs_q, offs_d, Sq, D, dq * scale)


# ---- log-space helpers (the prefix form's kernels use them)

@triton.jit
def log_add_exp(a, b):
    """log(exp(a) + exp(b)), stable (NEG-safe)."""
    m = tl.maximum(a, b)
    return m + tl.log(tl.exp(a - m) + tl.exp(b - m))


@triton.jit
def fast_log(x, FAST: tl.constexpr):
    """log x. ``FAST`` (bf16/fp16 inputs, float32 work; compiled, not under the interpreter): the special
    function unit's logarithm (``lg2.approx``: absolute error about 1e-7, inputs below float32's smallest
    normal number flushed to 0), a few instructions where ``tl.log`` compiles to libdevice's float32-exact
    polynomial, about twenty. The per-column carries are held by every thread that holds their column, so
    their logarithms repeat across a tile's threads: in the dK/dV pass they were a third of its loop."""
    if FAST:
        if INTERPRETING:
            out = tl.log(x)
        else:
            out = libdevice.fast_logf(x)
    else:
        out = tl.log(x)
    return out


@triton.jit
def log_add_exp_fast(a, b, FAST: tl.constexpr):
    """:func:`log_add_exp` with :func:`fast_log` (its argument is at least 1)."""
    m = tl.maximum(a, b)
    return m + fast_log(tl.exp(a - m) + tl.exp(b - m), FAST)


@triton.jit
def lse_over_rows(x):
    """log sum over the rows of x, per column (NEG for a column of NEG only)."""
    top = tl.max(x, axis=0)
    return top + tl.log(tl.sum(tl.exp(x - top[None, :]), axis=0))
