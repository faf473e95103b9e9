"""``attention.impl=triton`` in DNAS's encoder form (encoder self-attention: every query takes
part in every column normalizer) as Triton kernels, never holding an (Sq x Sk) tensor, with a
deterministic backward.

**Forward, two passes over the scores:**

1. Column pass, one program per (batch x head, key block): an online log-sum-exp of s_ij down the
   query blocks gives c_j (Sk numbers per head). It loads no V and writes no output: about half
   a FlashAttention forward.
2. Row pass, one program per (batch x head, query block): FlashAttention's online softmax of
   z_ij = s_ij - c_j over the key blocks; the row's log-sum-exp of z is kept (Sq numbers).

**Backward, FlashAttention-2 style, no atomics.** With p_ij = exp(z_ij - L_i), D_i = dO_i . O_i,
dz_ij = p_ij (dO_i . v_j - D_i) and the column step's weights pi_ij = exp(s_ij - c_j), the
gradient of the scores is

    ds_ij = dz_ij - pi_ij G_j,   G_j = sum_i' dz_i'j   (dc_j / ds_ij = pi_ij),

so the column term is a column reduction (G), not a scatter. One program per key block goes down
the query blocks once: since dK_j = scale sum_i ds_ij q_i = scale (sum_i dz_ij q_i - G_j sum_i
pi_ij q_i), it accumulates G, both sums and dV_j = sum_i p_ij dO_i in the same loop and combines
them at the end (pi_ij = p_ij exp(L_i): no second exponential per score). dQ has its own pass, one
program per query block: dQ_i = scale sum_j ds_ij k_j, with the G the first pass stored. Every number is
written by one program in a fixed order, so two backward passes give the same bits
(``trainer.deterministic=true`` can use it).

**HNAS** (:func:`encoder_hnas_triton`): u O + (1 - u) O2 per head, with O2 softmax attention. The
row pass runs a second online softmax, over s_ij, in the same loop (one QK^T, one load of V per
tile); the backward adds its score gradient ds2_ij = P_ij ((1 - u) dO_i . v_j - D2_i) to ds in the
same two passes (one dO . v^T per tile), dV takes u p_ij + (1 - u) P_ij, and u's gradient is
sum dO . (O - O2) per head.

**Sinkhorn-k** (``iterations`` = k > 1, :class:`_TritonSinkhorn`; kernels in
``triton_sinkhorn_kernels.py``). Every iterate is exp(s_ij - C_j - B_i), so k column-row pairs are
2k passes that each leave one vector: C^t_j = log sum_i exp(s_ij - B^(t-1)_i) (B^0 = 0; the column
kernel with a per-query bias), B^t_i = log sum_j exp(s_ij - C^t_j) (a row pass without V), the last
row pass the DNAS row kernel with C^k. The backward walks the normalizers' adjoints down the chain,
each one reduction pass: gC^k_j = -sum_i dz_ij, then gB^(t-1)_i = -sum_j gC^t_j exp(s_ij - B^(t-1)_i -
C^t_j) and gC^(t-1)_j = -sum_i gB^(t-1)_i exp(s_ij - C^(t-1)_j - B^(t-1)_i), and ends in the same
dK/dV and dQ passes with ds_ij = dz_ij + sum_t gC^t_j exp(s_ij - B^(t-1)_i - C^t_j) + sum_(t<k) gB^t_i
exp(s_ij - C^t_j - B^t_i): 2k + 1 passes, no atomics, O(k S) memory.

**Precision.** bf16/fp16 inputs go through ``tl.dot`` in their own dtype on the tensor cores with
float32 accumulation (FlashAttention's choice: p, ds and dO rounded to the input dtype before
their products); float32 and float64 inputs keep exact (IEEE) products, for the tests.

Runs on CUDA; on the CPU only under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is first imported), which the tests use at small sizes. Tile sizes: autotuned per GPU,
dtype, head dims and length bucket on CUDA, fixed under the interpreter or when given
(:mod:`nas_cli.attention.triton_tiles`). Where every tile a call may run divides both lengths, the kernels
are compiled without the bounds test (``EVEN``, :func:`nas_cli.attention.triton_tiles.tiles_divide`).
"""
from __future__ import annotations

import torch

from nas_cli.attention.triton_prefix import mixed_output, mixed_row_terms, next_pow2, triton_unavailable
from nas_cli.attention.triton_tiles import BACKWARD, FORWARD, launch, length_bucket, tiles_divide

LOW_PRECISION = (torch.bfloat16, torch.float16)


def _setup(q, k, v, q_mask, k_mask):
    from nas_cli.attention import triton_encoder_kernels as K

    wd = torch.promote_types(q.dtype, torch.float32)
    dummy = torch.zeros(1, dtype=torch.int8, device=q.device)
    return dict(K=K, wd=wd, dt=K.tl.float64 if wd == torch.float64 else K.tl.float32, dummy=dummy,
                lowp=q.dtype in LOW_PRECISION, bsz=q.size(0), heads=q.size(1), sq=q.size(2), sk=k.size(2),
                d=q.size(3), dv=v.size(3), bd=next_pow2(q.size(3)), bdv=next_pow2(v.size(3)),
                qm=dummy if q_mask is None else q_mask.to(torch.int8).contiguous(),
                km=dummy if k_mask is None else k_mask.to(torch.int8).contiguous(),
                has_qm=q_mask is not None, has_km=k_mask is not None, tune=length_bucket(q.size(2), k.size(2)))


def _run(st, kernel, per: str, args, blocks, table=FORWARD, **flags) -> None:
    """``kernel`` over (batch x head, query blocks if ``per`` is "BQ", else key blocks), with the
    given tiles ``blocks`` (block_q, block_k; None: autotuned on a GPU, fixed elsewhere); ``EVEN`` where
    every tile it may run divides both lengths (no bounds test in the kernels)."""
    common = dict(HAS_QM=st["has_qm"], HAS_KM=st["has_km"], DT=st["dt"], LOWP=st["lowp"], BD=st["bd"],
                  EVEN=tiles_divide(st["sq"], st["sk"], table, *blocks))
    launch(kernel, per, st["bsz"] * st["heads"], st["sq"] if per == "BQ" else st["sk"], st["tune"], args,
           {**common, **flags}, table, *blocks)


class _TritonEncoder(torch.autograd.Function):
    """DNAS's encoder form; with ``u`` (HNAS, one value per head), u O_DNAS + (1 - u) O_softmax from
    the same passes, u's gradient included."""

    @staticmethod
    def forward(ctx, q, k, v, q_mask, k_mask, u, block_q, block_k):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        st = _setup(q, k, v, q_mask, k_mask)
        K, bh, scale, blocks = st["K"], st["bsz"] * st["heads"], st["d"] ** -0.5, (block_q, block_k)
        hybrid = u is not None
        col = torch.empty(bh, st["sk"], dtype=st["wd"], device=q.device)
        _run(st, K.col_kernel, "BK", (q, k, st["qm"], st["km"], st["dummy"], col, st["heads"], st["sq"], st["sk"],
                                      st["d"], scale), blocks, HAS_RB=False)
        outs = [torch.empty(st["bsz"], st["heads"], st["sq"], st["dv"], dtype=st["wd"], device=q.device)
                for _ in range(2 if hybrid else 1)]
        lses = [torch.empty(bh, st["sq"], dtype=st["wd"], device=q.device) for _ in outs]
        out2, lse2 = (outs[1], lses[1]) if hybrid else (st["dummy"], st["dummy"])
        _run(st, K.row_kernel, "BQ", (q, k, v, st["qm"], st["km"], col, outs[0], lses[0], out2, lse2, st["heads"],
                                      st["sq"], st["sk"], st["d"], st["dv"], scale), blocks, BDV=st["bdv"],
             HYBRID=hybrid)
        masks = [m if m is not None else torch.empty(0) for m in (q_mask, k_mask)]
        ctx.save_for_backward(q, k, v, *masks, col, *outs, *lses, *([u] if hybrid else []))
        ctx.conf = (block_q, block_k, q_mask is not None, k_mask is not None, hybrid)
        return mixed_output(outs, u, v.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        block_q, block_k, has_qm, has_km, hybrid = ctx.conf
        saved = ctx.saved_tensors
        q, k, v, q_mask, k_mask, col = saved[:6]
        outs, lses = (saved[6:8], saved[8:10]) if hybrid else (saved[6:7], saved[7:8])
        st = _setup(q, k, v, q_mask if has_qm else None, k_mask if has_km else None)
        K, bh, scale = st["K"], st["bsz"] * st["heads"], st["d"] ** -0.5
        deltas, du, uw = mixed_row_terms(g, outs, saved[10] if hybrid else None, st["wd"], st["dummy"])
        g = g.contiguous().to(v.dtype if st["lowp"] else st["wd"])
        colsum = torch.empty(bh, st["sk"], dtype=st["wd"], device=q.device)
        dq = torch.empty(q.shape, dtype=st["wd"], device=q.device)
        dk = torch.empty(k.shape, dtype=st["wd"], device=q.device)
        dv = torch.empty(v.shape, dtype=st["wd"], device=q.device)
        second = (lses[1], deltas[1]) if hybrid else (st["dummy"], st["dummy"])
        args = (q, k, v, st["qm"], st["km"], col, lses[0], g, deltas[0], *second, uw, colsum)
        sizes = (st["heads"], st["sq"], st["sk"], st["d"], st["dv"], scale)
        _run(st, K.bwd_kv_kernel, "BK", (*args, dk, dv, *sizes), (block_q, block_k), BACKWARD, BDV=st["bdv"],
             HYBRID=hybrid)
        _run(st, K.bwd_q_kernel, "BQ", (*args, dq, *sizes), (block_q, block_k), BACKWARD, BDV=st["bdv"],
             HYBRID=hybrid)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, du, None, None


class _TritonSinkhorn(torch.autograd.Function):
    """Sinkhorn-k's encoder form: 2k passes forward, 2k + 1 backward (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, q_mask, k_mask, iterations: int, block_q, block_k):
        from nas_cli.attention import triton_sinkhorn_kernels as SK

        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        st = _setup(q, k, v, q_mask, k_mask)
        K, bh, scale, blocks = st["K"], st["bsz"] * st["heads"], st["d"] ** -0.5, (block_q, block_k)
        cs = torch.empty(iterations, bh, st["sk"], dtype=st["wd"], device=q.device)
        bs = torch.zeros(iterations + 1, bh, st["sq"], dtype=st["wd"], device=q.device)
        out = torch.empty(st["bsz"], st["heads"], st["sq"], st["dv"], dtype=st["wd"], device=q.device)
        shape = (st["heads"], st["sq"], st["sk"], st["d"], scale)
        for t in range(iterations):
            _run(st, K.col_kernel, "BK", (q, k, st["qm"], st["km"], bs[t], cs[t], *shape), blocks, HAS_RB=t > 0)
            if t < iterations - 1:
                _run(st, SK.row_lse_kernel, "BQ", (q, k, st["qm"], st["km"], cs[t], bs[t + 1], *shape), blocks)
        _run(st, K.row_kernel, "BQ", (q, k, v, st["qm"], st["km"], cs[-1], out, bs[-1], st["dummy"], st["dummy"],
                                      st["heads"], st["sq"], st["sk"], st["d"], st["dv"], scale), blocks,
             BDV=st["bdv"], HYBRID=False)
        masks = [m if m is not None else torch.empty(0) for m in (q_mask, k_mask)]
        ctx.save_for_backward(q, k, v, *masks, cs, bs, out)
        ctx.conf = (block_q, block_k, q_mask is not None, k_mask is not None)
        return out.to(v.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        from nas_cli.attention import triton_sinkhorn_kernels as SK

        block_q, block_k, has_qm, has_km = ctx.conf
        q, k, v, q_mask, k_mask, cs, bs, out = ctx.saved_tensors
        st = _setup(q, k, v, q_mask if has_qm else None, k_mask if has_km else None)
        bh, scale, iters = st["bsz"] * st["heads"], st["d"] ** -0.5, cs.size(0)
        delta = (g.to(st["wd"]) * out).sum(-1).contiguous()
        g = g.contiguous().to(v.dtype if st["lowp"] else st["wd"])
        gc, gb = torch.empty_like(cs), torch.zeros_like(bs[:-1])
        blocks = (block_q, block_k)
        shape = (st["heads"], st["sq"], st["sk"], st["d"], scale)
        full = (st["heads"], st["sq"], st["sk"], st["d"], st["dv"], scale, iters, bh * st["sq"], bh * st["sk"])
        _run(st, SK.dz_colsum_kernel, "BK", (q, k, v, st["qm"], st["km"], cs, bs, g, delta, gc[-1], *full), blocks,
             BACKWARD, BDV=st["bdv"])
        for t in range(iters - 1, 0, -1):  # the adjoints down the chain of normalizers
            _run(st, SK.row_reduce_kernel, "BQ", (q, k, st["qm"], st["km"], bs[t], cs[t], gc[t], gb[t], *shape),
                 blocks)
            _run(st, SK.col_reduce_kernel, "BK", (q, k, st["qm"], st["km"], bs[t], cs[t - 1], gb[t], gc[t - 1],
                                                  *shape), blocks)
        dq = torch.empty(q.shape, dtype=st["wd"], device=q.device)
        dk = torch.empty(k.shape, dtype=st["wd"], device=q.device)
        dv = torch.empty(v.shape, dtype=st["wd"], device=q.device)
        args = (q, k, v, st["qm"], st["km"], cs, bs, gc, gb, g, delta)
        _run(st, SK.sink_bwd_kv_kernel, "BK", (*args, dk, dv, *full), blocks, BACKWARD, BDV=st["bdv"])
        _run(st, SK.sink_bwd_q_kernel, "BQ", (*args, dq, *full), blocks, BACKWARD, BDV=st["bdv"])
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def encoder_dnas_triton(q, k, v, q_mask=None, k_mask=None, *, iterations: int = 1, block_q: int | None = None,
                        block_k: int | None = None) -> torch.Tensor:
    """(B, H, Sq, Dv): DNAS in the encoder form (column normalizer over all real queries), zeros at
    padded queries and at rows without a real key, as :func:`nas_cli.attention.efficient.dnas_attention`
    gives with ``prefix=False``; ``iterations`` = k > 1: Sinkhorn-k (k column-row pairs) in 2k passes.
    q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv); masks (B, S) bool, True = real."""
    why = triton_unavailable(q.device)
    if why:
        raise RuntimeError(f"attention.impl=triton: {why}")
    if q.size(-2) == 0 or k.size(-2) == 0:
        return q.new_zeros(*q.shape[:-1], v.size(-1), dtype=v.dtype)
    if int(iterations) > 1:
        return _TritonSinkhorn.apply(q, k, v, q_mask, k_mask, int(iterations), block_q, block_k)
    return _TritonEncoder.apply(q, k, v, q_mask, k_mask, None, block_q, block_k)


def encoder_hnas_triton(q, k, v, u, q_mask=None, k_mask=None, *, block_q: int | None = None,
                        block_k: int | None = None) -> torch.Tensor:
    """(B, H, Sq, Dv): HNAS in the encoder form, u O_DNAS + (1 - u) O_softmax with ``u`` (H,) per head,
    both parts from one pass over K and V (and one backward pass pair); gradients for q, k, v and u."""
    why = triton_unavailable(q.device)
    if why:
        raise RuntimeError(f"attention.impl=triton: {why}")
    if q.size(-2) == 0 or k.size(-2) == 0:
        return q.new_zeros(*q.shape[:-1], v.size(-1), dtype=v.dtype) + 0 * u.sum()
    return _TritonEncoder.apply(q, k, v, q_mask, k_mask, u, block_q, block_k)
