"""Triton kernels of Sinkhorn-k's encoder form (imported only when they run: importing this imports
Triton). The algorithm and its derivation: :mod:`nas_cli.attention.triton_encoder` (Sinkhorn-k).

Every iterate of Sinkhorn-k is exp(s_ij - C_j - B_i) for a per-key vector C and a per-query vector B,
so the kernels pass vectors, never an (Sq x Sk) tensor. The stacks, per (batch x head):
  CS[t] (t = 0..k-1): the column log-sum-exp of step t + 1, C_j = log sum_i exp(s_ij - BS[t]_i);
  BS[t] (t = 0..k):   BS[0] = 0, BS[t] = log sum_j exp(s_ij - CS[t-1]_j) (the row step after it).
A stack is one (k or k+1, B*H, S) tensor; ``T`` strides from one step to the next.

The forward's column passes are :func:`triton_encoder_kernels.col_kernel` with the per-query bias
BS[t]; its row passes are :func:`row_lse_kernel` (no V) and, the last, the DNAS row kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

from nas_cli.attention.triton_encoder_kernels import NEG, mixed_grads, tile_dot, tile_load, tile_store, tile_scores


@triton.jit(do_not_specialize=["TUNE"])
def row_lse_kernel(Q, K, QM, KM, C, B, H, Sq, Sk, D, scale,
                   TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                   LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """B[bh, i] = log sum_j exp(s_ij - C[bh, j]) over the allowed keys (0 for a row with none, as the
    DNAS row kernel keeps it): one program per (bh, query block). No V, no output."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    m = tl.full((BQ,), NEG, DT)
    l = tl.zeros((BQ,), DT)
    for kb in range(0, tl.cdiv(Sk, BK)):
        offs_k = kb * BK + tl.arange(0, BK)
        s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT,
                                  LOWP, EVEN)
        c = tl.load(C + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
        z = tl.where(ok, s - c[None, :], NEG)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.where(ok, tl.exp(z - m_new[:, None]), 0.0), axis=1)
        m = m_new
    tl.store(B + bh * Sq + offs_q, tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), 0.0), mask=offs_q < Sq)


@triton.jit
def _biased(s, ok, RB, CB, bh, offs_q, offs_k, Sq, Sk):
    """exp(s_ij - RB_i - CB_j) on the allowed pairs, 0 elsewhere (RB, CB: one step's row and column
    vectors; the result is at most 1, a normalized iterate)."""
    rb = tl.load(RB + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
    cb = tl.load(CB + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
    return tl.where(ok, tl.exp(s - rb[:, None] - cb[None, :]), 0.0)


@triton.jit(do_not_specialize=["TUNE"])
def row_reduce_kernel(Q, K, QM, KM, RB, CB, W, OUT, H, Sq, Sk, D, scale,
                      TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                      LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """OUT[bh, i] = -sum_j W[bh, j] exp(s_ij - RB_i - CB_j): a column normalizer's adjoint W carried to
    the row vector of the step before it. One program per (bh, query block)."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    acc = tl.zeros((BQ,), DT)
    for kb in range(0, tl.cdiv(Sk, BK)):
        offs_k = kb * BK + tl.arange(0, BK)
        s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT,
                                  LOWP, EVEN)
        w = tl.load(W + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
        acc += tl.sum(_biased(s, ok, RB, CB, bh, offs_q, offs_k, Sq, Sk) * w[None, :], axis=1)
    tl.store(OUT + bh * Sq + offs_q, -acc, mask=offs_q < Sq)


@triton.jit(do_not_specialize=["TUNE"])
def col_reduce_kernel(Q, K, QM, KM, RB, CB, W, OUT, H, Sq, Sk, D, scale,
                      TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                      LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """OUT[bh, j] = -sum_i W[bh, i] exp(s_ij - RB_i - CB_j): a row normalizer's adjoint W carried to the
    column vector of the step before it. One program per (bh, key block)."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    acc = tl.zeros((BK,), DT)
    for qb in range(0, tl.cdiv(Sq, BQ)):
        offs_q = qb * BQ + tl.arange(0, BQ)
        s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT,
                                  LOWP, EVEN)
        w = tl.load(W + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
        acc += tl.sum(_biased(s, ok, RB, CB, bh, offs_q, offs_k, Sq, Sk) * w[:, None], axis=0)
    tl.store(OUT + bh * Sk + offs_k, -acc, mask=offs_k < Sk)


@triton.jit
def _sink_tile(Q, K, V, QM, KM, CS, BS, GC, GB, DO, DELTA, bh, b, offs_q, offs_k, offs_d, offs_dv, Sq, Sk, D, DV,
               scale, ITERS, T_Q, T_K, WITH_CHAIN: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr,
               DT: tl.constexpr, LOWP: tl.constexpr, EVEN: tl.constexpr):
    """One tile of the backward: p = exp(s - C^(k) - B^(k)) (the output's weights), dz = p (dO . v - D)
    and, with ``WITH_CHAIN``, the score gradient ds = dz + sum_t GC[t]_j exp(s - BS[t]_i - CS[t]_j)
    + sum_{t >= 1} GB[t]_i exp(s - BS[t]_i - CS[t-1]_j) (every normalizer's term; else ds = dz)."""
    s, ok, q, k = tile_scores(Q, K, QM, KM, bh, b, offs_q, offs_k, offs_d, Sq, Sk, D, scale, HAS_QM, HAS_KM, DT, LOWP,
                              EVEN)
    last_c = CS + (ITERS - 1) * T_K
    p = _biased(s, ok, BS + ITERS * T_Q, last_c, bh, offs_q, offs_k, Sq, Sk)
    do = tile_load(DO, bh, offs_q, offs_dv, Sq, DV, DT, LOWP)
    p, dz, ds = mixed_grads(s, ok, p, do, V, DELTA, DELTA, DELTA, 1.0, bh, offs_q, offs_k, offs_dv, Sq, Sk, DV, DT,
                            LOWP, False)
    ds = dz
    if WITH_CHAIN:
        for t in range(0, ITERS):
            gc = tl.load(GC + t * T_K + bh * Sk + offs_k, mask=offs_k < Sk, other=0.0)
            ds += _biased(s, ok, BS + t * T_Q, CS + t * T_K, bh, offs_q, offs_k, Sq, Sk) * gc[None, :]
            if t > 0:
                gb = tl.load(GB + t * T_Q + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
                ds += _biased(s, ok, BS + t * T_Q, CS + (t - 1) * T_K, bh, offs_q, offs_k, Sq, Sk) * gb[:, None]
    return p, dz, ds, q, k, do


@triton.jit(do_not_specialize=["TUNE"])
def dz_colsum_kernel(Q, K, V, QM, KM, CS, BS, DO, DELTA, OUT, H, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K,
                     TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                     LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """OUT[bh, j] = -sum_i dz_ij: the last column normalizer's adjoint, where the chain starts."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    acc = tl.zeros((BK,), DT)
    for qb in range(0, tl.cdiv(Sq, BQ)):
        offs_q = qb * BQ + tl.arange(0, BQ)
        p, dz, ds, q, k, do = _sink_tile(Q, K, V, QM, KM, CS, BS, CS, BS, DO, DELTA, bh, b, offs_q, offs_k, offs_d,
                                         offs_dv, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K, False, HAS_QM, HAS_KM, DT,
                                         LOWP, EVEN)
        acc += tl.sum(dz, axis=0)
    tl.store(OUT + bh * Sk + offs_k, -acc, mask=offs_k < Sk)


@triton.jit(do_not_specialize=["TUNE"])
def sink_bwd_kv_kernel(Q, K, V, QM, KM, CS, BS, GC, GB, DO, DELTA, DK, DVv, H, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K,
                       TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                       LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """dK and dV of one key block, no atomics: dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p_ij dO_i."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    dk = tl.zeros((BK, BD), DT)
    dv = tl.zeros((BK, BDV), DT)
    for qb in range(0, tl.cdiv(Sq, BQ)):
        offs_q = qb * BQ + tl.arange(0, BQ)
        p, dz, ds, q, k, do = _sink_tile(Q, K, V, QM, KM, CS, BS, GC, GB, DO, DELTA, bh, b, offs_q, offs_k, offs_d,
                                         offs_dv, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K, True, HAS_QM, HAS_KM, DT,
                                         LOWP, EVEN)
        dv += tile_dot(tl.trans(p.to(do.dtype)), do, DT, LOWP)
        dk += tile_dot(tl.trans(ds.to(q.dtype)), q, DT, LOWP)
    tile_store(DK, bh, offs_k, offs_d, Sk, D, dk * scale)
    tile_store(DVv, bh, offs_k, offs_dv, Sk, DV, dv)


@triton.jit(do_not_specialize=["TUNE"])
def sink_bwd_q_kernel(Q, K, V, QM, KM, CS, BS, GC, GB, DO, DELTA, DQ, H, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K,
                      TUNE, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, EVEN: tl.constexpr, DT: tl.constexpr,
                      LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """dQ of one query block in its own pass: dq_i = scale sum_j ds_ij k_j."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    dq = tl.zeros((BQ, BD), DT)
    for kb in range(0, tl.cdiv(Sk, BK)):
        offs_k = kb * BK + tl.arange(0, BK)
        p, dz, ds, q, k, do = _sink_tile(Q, K, V, QM, KM, CS, BS, GC, GB, DO, DELTA, bh, b, offs_q, offs_k, offs_d,
                                         offs_dv, Sq, Sk, D, DV, scale, ITERS, T_Q, T_K, True, HAS_QM, HAS_KM, DT,
                                         LOWP, EVEN)
        dq += tile_dot(ds.to(k.dtype), k, DT, LOWP)
    tile_store(DQ, bh, offs_q, offs_d, Sq, D, dq * scale)
