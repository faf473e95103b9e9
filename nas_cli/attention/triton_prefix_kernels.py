"""Triton kernels of prefix-normalized DNAS (imported only when ``attention.impl=triton`` runs:
importing it imports Triton). The algorithm and its derivation: :mod:`nas_cli.attention.triton_prefix`.

Per (batch x head):
  s_rj = scale q_r . k_j on the allowed pairs (real query, real key, j <= r if causal), NEG elsewhere;
  c_ij = log sum_{r <= i} exp(s_rj)           (the prefix column normalizer)
  z_ij = s_ij - c_ij,  p_ij = softmax_j z_ij,  O_i = sum_j p_ij v_j.

``HYBRID`` (HNAS): the row pass also runs softmax attention over the same tiles, P_ij = softmax_j s_ij
(causal where the DNAS part is) into OUT2 and LSE2, and the backward passes add its score gradient
and take dV from u p + (1 - u) P, as the encoder form's kernels do.
"""
from __future__ import annotations

import triton
import triton.language as tl

from nas_cli.attention.triton_encoder_kernels import (fast_log, head_u, log_add_exp, log_add_exp_fast, lse_over_rows,
                                                      mixed_grads, softmax_step, store_rows, tile_dot, tile_load,
                                                      tile_store)

NEG = tl.constexpr(-1.0e30)  # a constexpr: compiled Triton refuses a plain global inside a kernel (the interpreter accepts it)
#: the largest prefix sum (relative to its column's reference) the linear-space fast path accepts: below
#: it no term overflows, and in the backward a later block's part, exp(ref_j - c_ij), lost below float32's
#: smallest normal number weighs at most HUGE * 1.2e-38 ~ 1e-8 of its dz
HUGE = tl.constexpr(1.0e30)
#: the lowest row log-sum-exp (of z) for which the backward takes p = (e / S) exp(-lse): e / S lost below
#: float32's smallest normal number then weighs at most 1.2e-38 * e^20 ~ 6e-30
LSE_FLOOR = tl.constexpr(-20.0)
#: float32's smallest normal number: the fast logarithm flushes smaller inputs to zero
TINY = tl.constexpr(1.1754944e-38)


@triton.jit
def _allowed(offs_q, offs_k, b, Sq, Sk, QM, KM, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr,
             CAUSAL: tl.constexpr, SIMPLE: tl.constexpr = False):
    """The allowed pairs of a tile: inside both lengths, real query, real key, and (``CAUSAL``) key <= query;
    a ``SIMPLE`` tile (:func:`simple_from`) has every key before its first query, so no causal test."""
    ok = (offs_q[:, None] < Sq) & (offs_k[None, :] < Sk)
    if HAS_QM:
        qm = tl.load(QM + b * Sq + offs_q, mask=offs_q < Sq, other=0)
        ok = ok & (qm[:, None] != 0)
    if HAS_KM:
        km = tl.load(KM + b * Sk + offs_k, mask=offs_k < Sk, other=0)
        ok = ok & (km[None, :] != 0)
    if CAUSAL:
        if not SIMPLE:
            ok = ok & (offs_k[None, :] <= offs_q[:, None])
    return ok


@triton.jit
def simple_from(row0, kb_end, CAUSAL: tl.constexpr, BK: tl.constexpr):
    """For the tiles of query rows from ``row0`` on: the key blocks before this one (at most ``kb_end``) are
    *simple*. Every key of a simple tile comes before the tile's first query (causal: key block kb ends
    before row0; cross-attention: any key block once row0 > 0), so each key's carry (its column
    log-sum-exp over the earlier rows) already holds its first allowed row's score: the tile needs neither
    the causal test nor a reference from its own rows (:func:`_prefix_sums`)."""
    if CAUSAL:
        n = tl.minimum(row0 // BK, kb_end)
    else:
        n = tl.where(row0 > 0, kb_end, 0)
    return n


@triton.jit
def _tile(Q, K, bh, offs_q, offs_k, offs_d, Sq, Sk, D, scale, DT: tl.constexpr, LOWP: tl.constexpr):
    """scale q k^T for one (BQ x BK) tile: IEEE products in the work dtype, or for bf16/fp16 inputs
    the tensor cores' products with float32 accumulation."""
    q = tile_load(Q, bh, offs_q, offs_d, Sq, D, DT, LOWP)
    k = tile_load(K, bh, offs_k, offs_d, Sk, D, DT, LOWP)
    return tile_dot(q, tl.trans(k), DT, LOWP) * scale, q, k


@triton.jit
def _prefix_sums(s, ok, carry, SIMPLE: tl.constexpr):
    """The linear-space sums behind one tile's prefix normalizer, c_ij = log(exp(carry_j) + sum_{r <= i in
    the tile} exp(s_rj)) = ref_j + log S_ij, with a reference per column, ref_j = max(carry_j, s_(r0, j))
    for the column's first allowed row r0 in the tile: e_rj = exp(s_rj - ref_j) and S_ij =
    exp(carry_j - ref_j) + cumsum_{r <= i} e_rj (>= 1 on every allowed pair). One exponential per score,
    the sums on the adders. ref_j and S_ij depend only on the rows r <= i, so a query's value never
    depends on a later query's, not even in its rounding. A pair whose S_ij passes HUGE (a later row's
    score ~69 above ref_j) is *bad*: its c needs the log-space scan (:func:`_prefix_c`). Returns ref, e,
    S (1 off the allowed pairs), the bad pairs and their count. A ``SIMPLE`` tile (:func:`simple_from`)
    takes ref_j = carry_j: every key's first allowed row is in an earlier block, so no reduction down the
    tile's rows is needed for it (where a key has no earlier allowed row after all, carry_j = NEG and every
    pair of its column is bad: exact, by the log-space scan)."""
    if SIMPLE:
        ref = carry
    else:
        rows = tl.arange(0, s.shape[0])[:, None]
        first = tl.min(tl.where(ok, rows, s.shape[0]), axis=0)  # s.shape[0] (= BQ): the column has none
        s0 = tl.sum(tl.where(ok & (rows == first[None, :]), s, 0.0), axis=0)
        ref = tl.where(first < s.shape[0], tl.maximum(carry, s0), carry)
    e = tl.exp(tl.minimum(tl.where(ok, s - ref[None, :], NEG), 70.0))  # e^70 > HUGE: such a pair is bad
    base = tl.where(carry > NEG * 0.5, tl.exp(carry - ref), 0.0)
    S = tl.cumsum(e, 0) + base[None, :]
    bad = ok & ~(S <= HUGE)  # also where S overflowed
    return ref, e, tl.where(ok, S, 1.0), bad, tl.max(bad.to(tl.int32))


@triton.jit
def _prefix_c(s, carry, ref, S, bad, n_bad, FAST: tl.constexpr):
    """c_ij = ref_j + log S_ij (one logarithm per score, :func:`fast_log`; S_ij >= 1); the bad pairs, in a
    tile that has any, from the log-space scan instead (``tl.associative_scan`` of log-add-exp down the
    rows: about ten transcendentals per score, exact for any spread)."""
    c = ref[None, :] + fast_log(S, FAST)
    if n_bad > 0:
        c = tl.where(bad, log_add_exp(carry[None, :], tl.associative_scan(s, 0, log_add_exp)), c)
    return c


@triton.jit
def _prefix_tile(Q, K, QM, KM, CARRY, bh, b, qb, offs_q, offs_k, offs_d, H, Sq, Sk, D, scale, NQB,
                 CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
                 LOWP: tl.constexpr, SIMPLE: tl.constexpr):
    """One (query block x key block) tile: the scores s (NEG where not allowed), the allowed mask, the
    loaded q and k, the tile's carry (each key's log-sum-exp over the earlier query blocks) and its
    :func:`_prefix_sums`."""
    s, q, k = _tile(Q, K, bh, offs_q, offs_k, offs_d, Sq, Sk, D, scale, DT, LOWP)
    ok = _allowed(offs_q, offs_k, b, Sq, Sk, QM, KM, HAS_QM, HAS_KM, CAUSAL, SIMPLE)
    s = tl.where(ok, s, NEG)
    carry = tl.load(CARRY + (bh * NQB + qb) * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    ref, e, S, bad, n_bad = _prefix_sums(s, ok, carry, SIMPLE)
    return s, ok, q, k, carry, ref, e, S, bad, n_bad


@triton.jit
def col_carry_kernel(Q, K, QM, KM, CARRY, RUN, H, Sq, Sk, D, scale, NQB, Q0,
                     CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
                     LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """CARRY[bh, qb, j] = log sum_{r < Q0 + qb * BQ} exp(s_rj) for the NQB query blocks of one chunk of
    queries that starts at row Q0: each key's column log-sum-exp over all earlier rows (NEG where there
    is none), from RUN[bh, j] (the same over the rows before Q0), which the program then advances past
    the chunk's rows. One program per (bh, key block); query blocks in order."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    carry = tl.load(RUN + bh * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    first = 0
    if CAUSAL:  # query blocks that end before this key block see none of its keys
        first = tl.minimum(tl.maximum(kb * BK - Q0, 0) // BQ, NQB)
    for qb in range(0, first):
        tl.store(CARRY + (bh * NQB + qb) * Sk + offs_k, carry, mask=offs_k < Sk)
    for qb in range(first, NQB):
        tl.store(CARRY + (bh * NQB + qb) * Sk + offs_k, carry, mask=offs_k < Sk)
        offs_q = Q0 + qb * BQ + tl.arange(0, BQ)
        s, q, k = _tile(Q, K, bh, offs_q, offs_k, offs_d, Sq, Sk, D, scale, DT, LOWP)
        ok = _allowed(offs_q, offs_k, b, Sq, Sk, QM, KM, HAS_QM, HAS_KM, CAUSAL)
        s = tl.where(ok, s, NEG)
        top = tl.max(s, axis=0)
        col = top + fast_log(tl.sum(tl.exp(s - top[None, :]), axis=0), LOWP)
        carry = log_add_exp_fast(carry, col, LOWP)
    tl.store(RUN + bh * Sk + offs_k, carry, mask=offs_k < Sk)


@triton.jit
def _row_step(m, l, acc, m2, l2, acc2, seen, kb, Q, K, V, QM, KM, CARRY, bh, b, qb, offs_q, offs_d, offs_dv, H, Sq, Sk,
              D, DV, scale, NQB, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
              LOWP: tl.constexpr, BK: tl.constexpr, HYBRID: tl.constexpr, SIMPLE: tl.constexpr):
    """Key block kb of the row pass: the tile's prefix normalizer c, then one step of the online softmax of
    z = s - c (and, ``HYBRID``, of s); ``SIMPLE``: a tile of :func:`simple_from`."""
    offs_k = kb * BK + tl.arange(0, BK)
    s, ok, q, k, carry, ref, e, S, bad, n_bad = _prefix_tile(Q, K, QM, KM, CARRY, bh, b, qb, offs_q, offs_k, offs_d,
                                                             H, Sq, Sk, D, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT,
                                                             LOWP, SIMPLE)
    c = _prefix_c(s, carry, ref, S, bad, n_bad, LOWP)
    m, l, acc = softmax_step(m, l, acc, tl.where(ok, s - c, NEG), ok, V, bh, offs_k, offs_dv, Sk, DV, DT, LOWP)
    if HYBRID:
        m2, l2, acc2 = softmax_step(m2, l2, acc2, s, ok, V, bh, offs_k, offs_dv, Sk, DV, DT, LOWP)
    seen = tl.maximum(seen, tl.max(ok.to(tl.int32), axis=1))
    return m, l, acc, m2, l2, acc2, seen


@triton.jit
def row_kernel(Q, K, V, QM, KM, CARRY, OUT, LSE, OUT2, LSE2, H, Sq, Sk, D, DV, scale, NQB, Q0,
               CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
               LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               HYBRID: tl.constexpr):
    """Output rows of one query block: per key block, the prefix normalizer c from the carry and a
    log-sum-exp scan down the rows, then an online softmax of z = s - c over the key blocks.
    ``HYBRID``: softmax attention over s in the same loop, into OUT2 and LSE2. Query block qb of the
    chunk that starts at row Q0."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = Q0 + qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    m = tl.full((BQ,), NEG, DT)
    l = tl.zeros((BQ,), DT)
    acc = tl.zeros((BQ, BDV), DT)
    m2 = tl.full((BQ,), NEG, DT)
    l2 = tl.zeros((BQ,), DT)
    acc2 = tl.zeros((BQ, BDV), DT)
    seen = tl.zeros((BQ,), tl.int32)
    n_keys = Sk
    if CAUSAL:
        n_keys = tl.minimum(Sk, Q0 + (qb + 1) * BQ)
    n_kb = tl.cdiv(n_keys, BK)
    n_simple = simple_from(Q0 + qb * BQ, n_kb, CAUSAL, BK)
    for kb in range(0, n_simple):  # the key blocks before the tile's first query, then the rest
        m, l, acc, m2, l2, acc2, seen = _row_step(m, l, acc, m2, l2, acc2, seen, kb, Q, K, V, QM, KM, CARRY, bh, b, qb,
                                                  offs_q, offs_d, offs_dv, H, Sq, Sk, D, DV, scale, NQB, CAUSAL,
                                                  HAS_QM, HAS_KM, DT, LOWP, BK, HYBRID, True)
    for kb in range(n_simple, n_kb):
        m, l, acc, m2, l2, acc2, seen = _row_step(m, l, acc, m2, l2, acc2, seen, kb, Q, K, V, QM, KM, CARRY, bh, b, qb,
                                                  offs_q, offs_d, offs_dv, H, Sq, Sk, D, DV, scale, NQB, CAUSAL,
                                                  HAS_QM, HAS_KM, DT, LOWP, BK, HYBRID, False)
    store_rows(OUT, LSE, bh, offs_q, offs_dv, Sq, DV, acc, m, l, seen > 0)
    if HYBRID:
        store_rows(OUT2, LSE2, bh, offs_q, offs_dv, Sq, DV, acc2, m2, l2, seen > 0)


@triton.jit
def _bwd_tile(Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, qb, offs_q, offs_k, offs_d, offs_dv,
              H, Sq, Sk, D, DV, scale, NQB, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr,
              DT: tl.constexpr, LOWP: tl.constexpr, HYBRID: tl.constexpr, SIMPLE: tl.constexpr):
    """One tile of the backward (``SIMPLE``: a tile of :func:`simple_from`): s, the allowed mask, c (where the
    suffix sums need it), the prefix sums, whether the tile has no bad pair, the weights dV sees (p; HNAS:
    u p + (1 - u) P), dz_ij = p_ij (u dO_i . v_j - D_i) (u = 1 without ``HYBRID``), the softmax part's score gradient
    ds2_ij = P_ij ((1 - u) dO_i . v_j - D2_i) (0 without ``HYBRID``), and the loaded q, k, dO."""
    s, ok, q, k, carry, ref, e, S, bad, n_bad = _prefix_tile(Q, K, QM, KM, CARRY, bh, b, qb, offs_q, offs_k, offs_d,
                                                             H, Sq, Sk, D, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT,
                                                             LOWP, SIMPLE)
    lse = tl.load(LSE + bh * Sq + offs_q, mask=offs_q < Sq, other=0.0)
    if (n_bad == 0) & (tl.min(lse) > LSE_FLOOR):
        # p_ij = exp(s_ij - c_ij - lse_i) = (e_ij / S_ij) exp(-lse_i): no transcendental per score. A
        # row's lse is >= 0 in causal self-attention (its diagonal z_ii = 0); below LSE_FLOOR, exp(-lse)
        # could lift an e / S that underflowed into a weight that matters, so such a tile takes the logarithm
        c = s  # not read: this tile's suffix sums take the fast path too
        p = e / S * tl.exp(-lse)[:, None]
    else:
        c = _prefix_c(s, carry, ref, S, bad, n_bad, LOWP)
        p = tl.exp(tl.where(ok, s - c - lse[:, None], NEG))
    do = tile_load(DO, bh, offs_q, offs_dv, Sq, DV, DT, LOWP)
    w, dz, ds2 = mixed_grads(s, ok, p, do, V, DELTA, LSE2, DELTA2, u, bh, offs_q, offs_k, offs_dv, Sq, Sk, DV, DT,
                             LOWP, HYBRID)
    return s, ok, c, ref, e, S, n_bad == 0, w, dz, ds2, q, k, do


@triton.jit
def _ds(s, ok, c, ref, e, S, fast, dz, lp_carry, ln_carry, FAST: tl.constexpr):
    """ds_rj = dz_rj - sum_{i >= r} dz_ij exp(s_rj - c_ij) over this tile's rows and the later query
    blocks (whose part comes as the carries LP_j = log sum max(dz_ij, 0) exp(-c_ij), LN_j the same for
    the negative part); also this tile's own part of the carries, per column.

    Fast path (the tile has no bad pair, :func:`_prefix_sums`): exp(s_rj - c_ij) = e_rj / S_ij, so the sum is
    e_rj (reverse-cumsum_{i >= r} dz_ij / S_ij + A_j) with the carries as A_j = exp(LP_j + ref_j) -
    exp(LN_j + ref_j) (every c_ij of a later block is >= ref_j: no overflow): no transcendental per score.
    Otherwise the suffix log-sum-exp scans of the positive and negative parts of dz_ij exp(-c_ij),
    with every exponent bounded (s_rj <= c_ij for i >= r)."""
    if fast:
        r = dz / S
        a = tl.exp(lp_carry + ref) - tl.exp(ln_carry + ref)
        ds = tl.where(ok, dz - e * (tl.cumsum(r, 0, reverse=True) + a[None, :]), 0.0)
        pos = tl.sum(tl.where(r > 0, r, 0.0), axis=0)
        neg = tl.sum(tl.where(r < 0, -r, 0.0), axis=0)
        floor = TINY if FAST else 0.0  # the fast logarithm flushes a subnormal sum to 0 (then log 0 = -inf)
        lp_own = tl.where(pos > floor, fast_log(tl.where(pos > floor, pos, 1.0), FAST) - ref, NEG)
        ln_own = tl.where(neg > floor, fast_log(tl.where(neg > floor, neg, 1.0), FAST) - ref, NEG)
    else:
        lp = tl.where(dz > 0, tl.log(tl.where(dz > 0, dz, 1.0)) - c, NEG)
        ln = tl.where(dz < 0, tl.log(tl.where(dz < 0, -dz, 1.0)) - c, NEG)
        lp_s = log_add_exp(tl.associative_scan(lp, 0, log_add_exp, reverse=True), lp_carry[None, :])
        ln_s = log_add_exp(tl.associative_scan(ln, 0, log_add_exp, reverse=True), ln_carry[None, :])
        ds = tl.where(ok, dz - tl.exp(s + lp_s) + tl.exp(s + ln_s), 0.0)
        lp_own = lse_over_rows(lp)
        ln_own = lse_over_rows(ln)
    return ds, lp_own, ln_own


@triton.jit
def _col_step(dk, dv, lp_carry, ln_carry, qb, Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b,
              offs_k, offs_d, offs_dv, H, Sq, Sk, D, DV, scale, NQB, Q0, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr,
              HAS_KM: tl.constexpr, DT: tl.constexpr, LOWP: tl.constexpr, BQ: tl.constexpr, HYBRID: tl.constexpr,
              SIMPLE: tl.constexpr):
    """Query block qb of the key-block pass: write the carries it starts from, then add its tile's dK and dV
    and advance the carries; ``SIMPLE``: a tile of :func:`simple_from`."""
    offs_q = Q0 + qb * BQ + tl.arange(0, BQ)
    tl.store(LPC + (bh * NQB + qb) * Sk + offs_k, lp_carry, mask=offs_k < Sk)
    tl.store(LNC + (bh * NQB + qb) * Sk + offs_k, ln_carry, mask=offs_k < Sk)
    s, ok, c, ref, e, S, fast, w, dz, ds2, q, k, do = _bwd_tile(
        Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, qb, offs_q, offs_k, offs_d, offs_dv, H, Sq,
        Sk, D, DV, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, HYBRID, SIMPLE)
    ds, lp_own, ln_own = _ds(s, ok, c, ref, e, S, fast, dz, lp_carry, ln_carry, LOWP)
    ds += ds2
    dv += tile_dot(tl.trans(w.to(do.dtype)), do, DT, LOWP)
    dk += tile_dot(tl.trans(ds.to(q.dtype)), q, DT, LOWP) * scale
    return dk, dv, log_add_exp_fast(lp_carry, lp_own, LOWP), log_add_exp_fast(ln_carry, ln_own, LOWP)


@triton.jit
def bwd_col_kernel(Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, U, LPC, LNC, LPR, LNR, DK, DVv, H, Sq,
                   Sk, D, DV, scale, NQB, Q0, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
                   LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                   HYBRID: tl.constexpr):
    """dK and dV, one program per (bh, key block), query blocks from the last to the first:
      dz_ij = p_ij (dO_i . v_j - D_i),  D_i = dO_i . O_i
      ds_rj = dz_rj - sum_{i >= r} dz_ij exp(s_rj - c_ij)
            = dz_rj - exp(s_rj + LP_rj) + exp(s_rj + LN_rj),
      LP_rj = log sum_{i >= r} max(dz_ij, 0) exp(-c_ij)  (LN: the negative part),
    suffix log-sum-exp scans carried up the query blocks; every exponent is bounded, since
    s_rj <= c_ij for i >= r. The carries each query block starts from (the later blocks' part) are
    written to LPC/LNC for the dQ pass (:func:`bwd_q_kernel`): no atomics. ``HYBRID``: ds2 (the
    softmax part's score gradient, no column term) is added to ds, and dV takes u p + (1 - u) P.
    Chunks of queries (the NQB blocks from row Q0) run from the last to the first: the carries start
    from LPR/LNR (the later chunks' part), which the program advances, and dK and dV are added to
    what the later chunks left in DK and DVv (float32 or float64, zeros before the last chunk)."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    kb = tl.program_id(1)
    b = bh // H
    offs_k = kb * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    dk = tl.zeros((BK, BD), DT)
    dv = tl.zeros((BK, BDV), DT)
    lp_carry = tl.load(LPR + bh * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    ln_carry = tl.load(LNR + bh * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    u = head_u(U, bh, H, DT, HYBRID)
    first = 0
    if CAUSAL:
        first = tl.minimum(tl.maximum(kb * BK - Q0, 0) // BQ, NQB)
    # the query blocks whose tiles are simple (simple_from): causal, those that start after this key block
    if CAUSAL:
        simple = tl.minimum(tl.maximum(tl.cdiv(tl.maximum((kb + 1) * BK - Q0, 0), BQ), first), NQB)
    else:
        simple = tl.where(Q0 > 0, 0, tl.minimum(1, NQB))
    for it in range(0, NQB - simple):  # from the last query block down: the simple tiles, then the rest
        dk, dv, lp_carry, ln_carry = _col_step(dk, dv, lp_carry, ln_carry, NQB - 1 - it, Q, K, V, QM, KM, CARRY, LSE,
                                               DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b, offs_k, offs_d, offs_dv, H,
                                               Sq, Sk, D, DV, scale, NQB, Q0, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, BQ,
                                               HYBRID, True)
    for it in range(NQB - simple, NQB - first):
        dk, dv, lp_carry, ln_carry = _col_step(dk, dv, lp_carry, ln_carry, NQB - 1 - it, Q, K, V, QM, KM, CARRY, LSE,
                                               DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b, offs_k, offs_d, offs_dv, H,
                                               Sq, Sk, D, DV, scale, NQB, Q0, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, BQ,
                                               HYBRID, False)
    tl.store(LPR + bh * Sk + offs_k, lp_carry, mask=offs_k < Sk)
    tl.store(LNR + bh * Sk + offs_k, ln_carry, mask=offs_k < Sk)
    tile_store(DK, bh, offs_k, offs_d, Sk, D, dk + tile_load(DK, bh, offs_k, offs_d, Sk, D, DT, False))
    tile_store(DVv, bh, offs_k, offs_dv, Sk, DV, dv + tile_load(DVv, bh, offs_k, offs_dv, Sk, DV, DT, False))


@triton.jit
def _q_step(dq, kb, Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b, qb, offs_q, offs_d,
            offs_dv, H, Sq, Sk, D, DV, scale, NQB, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr,
            DT: tl.constexpr, LOWP: tl.constexpr, BK: tl.constexpr, HYBRID: tl.constexpr, SIMPLE: tl.constexpr):
    """Key block kb of the dQ pass: the tile's ds from its own suffix sums and the later blocks' carries,
    dq += ds k; ``SIMPLE``: a tile of :func:`simple_from`."""
    offs_k = kb * BK + tl.arange(0, BK)
    s, ok, c, ref, e, S, fast, w, dz, ds2, q, k, do = _bwd_tile(
        Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, bh, b, qb, offs_q, offs_k, offs_d, offs_dv, H, Sq,
        Sk, D, DV, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, HYBRID, SIMPLE)
    lp_carry = tl.load(LPC + (bh * NQB + qb) * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    ln_carry = tl.load(LNC + (bh * NQB + qb) * Sk + offs_k, mask=offs_k < Sk, other=NEG)
    ds, lp_own, ln_own = _ds(s, ok, c, ref, e, S, fast, dz, lp_carry, ln_carry, LOWP)
    return dq + tile_dot((ds + ds2).to(k.dtype), k, DT, LOWP)


@triton.jit
def bwd_q_kernel(Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, U, LPC, LNC, DQ, H, Sq, Sk, D, DV, scale,
                 NQB, Q0, CAUSAL: tl.constexpr, HAS_QM: tl.constexpr, HAS_KM: tl.constexpr, DT: tl.constexpr,
                 LOWP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                 HYBRID: tl.constexpr):
    """dQ of one query block in its own pass (FlashAttention-2's query-block program): per key block
    the tile's ds from its own suffix scans and the later blocks' carries (LPC, LNC), dq += ds k.
    Query block qb of the chunk that starts at row Q0."""
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B x H x S x D may pass 2^31 elements
    qb = tl.program_id(1)
    b = bh // H
    offs_q = Q0 + qb * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    dq = tl.zeros((BQ, BD), DT)
    u = head_u(U, bh, H, DT, HYBRID)
    n_keys = Sk
    if CAUSAL:
        n_keys = tl.minimum(Sk, Q0 + (qb + 1) * BQ)
    n_kb = tl.cdiv(n_keys, BK)
    n_simple = simple_from(Q0 + qb * BQ, n_kb, CAUSAL, BK)
    for kb in range(0, n_simple):  # the key blocks before the tile's first query, then the rest
        dq = _q_step(dq, kb, Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b, qb, offs_q,
                     offs_d, offs_dv, H, Sq, Sk, D, DV, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, BK, HYBRID, True)
    for kb in range(n_simple, n_kb):
        dq = _q_step(dq, kb, Q, K, V, QM, KM, CARRY, LSE, DO, DELTA, LSE2, DELTA2, u, LPC, LNC, bh, b, qb, offs_q,
                     offs_d, offs_dv, H, Sq, Sk, D, DV, scale, NQB, CAUSAL, HAS_QM, HAS_KM, DT, LOWP, BK, HYBRID, False)
    tile_store(DQ, bh, offs_q, offs_d, Sq, D, dq * scale)
