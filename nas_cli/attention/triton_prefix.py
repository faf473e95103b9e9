"""``attention.impl=triton``: prefix-normalized DNAS (decoder self-attention and decoder
cross-attention, where query i's column normalizer sums over queries i' <= i only) as Triton
kernels, never holding an (Sq x Sk) tensor.

**Forward, two passes over the scores** (FlashAttention does one):

1. Column pass, one program per (batch x head, key block), query blocks in order: each key's
   column log-sum-exp over all earlier query blocks is written out as that block's *carry*
   (BQ times fewer numbers than the scores). The queries run in chunks of :data:`CHUNK_Q` rows, so
   the carries exist for one chunk at a time ((CHUNK_Q / BQ) x Sk numbers per head: linear in the
   length); each chunk's column pass starts from the column log-sum-exps of all earlier rows and
   advances them, and the backward, from the last chunk to the first, rebuilds each chunk's
   carries from them and hands its suffix sums and dK/dV to the chunk before.
2. Row pass, one program per (batch x head, query block), key blocks in order: the tile's scores,
   the prefix normalizer c_ij = logaddexp(carry_j, log-sum-exp of s_rj down the rows r <= i of the
   tile), z = s - c, and FlashAttention's online softmax of z over the key blocks. The row's
   log-sum-exp of z is kept (Sq numbers) for the backward.

**The prefix normalizer in linear space**: with a reference per column that depends on no
later row, ref_j = max(carry_j, s_(r0, j)) for the column's first allowed row r0 in the tile,
e_rj = exp(s_rj - ref_j) and S_ij = exp(carry_j - ref_j) + cumsum_{r <= i} e_rj (>= 1), so
c_ij = ref_j + log S_ij: one exponential and one logarithm per score, the sums on the adders
(``tl.cumsum``), where a log-add-exp scan (``tl.associative_scan``) costs about ten transcendentals
per score. A query's value depends on no later query, not even in its rounding (tested: perturbing
the future by 1000x changes no earlier output bit). A pair whose S_ij would pass 1e30 (a later row's
score ~69 above the column's reference within one tile) takes the log-space scan, which runs only
in a tile that has such a pair: exact for any spread (tested with spreads of ~1000). A tile whose keys
all come before its first query (off the diagonal; in cross-attention, every query block after the
first) takes ref_j = carry_j, which already holds the column's first allowed row, and no causal test:
each pass runs those tiles in a loop of its own, compiled without the reduction down the tile's rows
that finds r0 (``simple_from`` in the kernels).

**Backward, FlashAttention-2 style, no atomics**: a key-block pass, per (batch x head, key
block), query blocks from the last to the first:
with dz_ij = p_ij (dO_i . v_j - D_i) (D_i = dO_i . O_i), the gradient of the scores is

    ds_rj = dz_rj - sum_{i >= r} dz_ij exp(s_rj - c_ij)
          = dz_rj - e_rj (sum_{i >= r in the tile} dz_ij / S_ij + A_j),

with exp(s_rj - c_ij) = e_rj / S_ij inside the tile (a reverse ``tl.cumsum``) and the later query
blocks' part carried in log space, LP_j = log sum max(dz_ij, 0) exp(-c_ij) and LN_j the same for the
negative part, A_j = exp(LP_j + ref_j) - exp(LN_j + ref_j) (every later c_ij >= ref_j: no overflow).
The weights are p_ij = (e_ij / S_ij) exp(-lse_i): the backward takes no exponential or logarithm per
score beyond e. A tile with a pair outside the fast path's range, or a row whose lse is below -20
(cross-attention only: in causal self-attention lse_i >= 0), takes the log-space form: LP and LN as
suffix log-sum-exp scans down the tile, every exponent bounded (s_rj <= c_ij for i >= r), so no
spread of the normalizer can overflow (the chunked PyTorch path falls back to autograd for wide
spreads). dK and dV accumulate in the key-block program, which also writes the carries each query
block starts from (the later blocks' LP and LN: Sq / BQ x Sk numbers each); dQ has its own pass, one
program per query block, which recomputes its tiles' ds from them. Every number is written by one
program in a fixed order, so two backward passes give the same bits (``trainer.deterministic=true``
takes the kernels). bf16/fp16 inputs go through ``tl.dot`` in their own dtype (tensor cores) with
float32 accumulation, and the fast path's logarithms go to the special-function unit (``fast_log``:
absolute error about 1e-7); float32 and float64 keep IEEE products and ``tl.log``.

**HNAS** (:func:`prefix_hnas_triton`): u O + (1 - u) O2 per head, O2 softmax attention under the
same mask. The row pass runs a second online softmax, over s, in the same loop (one QK^T, one load
of V per tile); both backward passes add its score gradient ds2_ij = P_ij ((1 - u) dO_i . v_j - D2_i)
to ds after the suffix scans (it has no column term), dV takes u p + (1 - u) P, and u's gradient is
sum dO . (O - O2) per head. Sinkhorn-k (k > 1) in this form would need a prefix scan of every
earlier iterate; it keeps the chunked PyTorch path, which gives the same values. Attention dropout is not fused:
a training call with attention dropout keeps the chunked path too.

Runs on CUDA; on the CPU only under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is first imported), which the tests use at small sizes.
"""
from __future__ import annotations

import os

import torch

#: tile sizes when one of block_q / block_k is given (tl.dot needs at least 16); otherwise
#: :func:`nas_cli.attention.triton_tiles.prefix_tiles` picks them
BLOCK_Q = 32
BLOCK_K = 32
#: rows per chunk of queries (rounded down to a multiple of BQ): the carries are kept for one chunk at a
#: time, (CHUNK_Q / BQ) x Sk numbers per head, so memory grows linearly in the length; a sequence longer
#: than one chunk rebuilds each chunk's carries in the backward (one more QK^T pass over the scores)
CHUNK_Q = 8192


def triton_unavailable(device: torch.device) -> str | None:
    """Why ``impl=triton`` cannot run on ``device`` here (None: it can)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (pip install triton)"
    if device.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return (f"Triton kernels run on CUDA GPUs; this run is on {device.type} (the CPU runs them only under "
            "TRITON_INTERPRET=1, an interpreter for tests)")


def next_pow2(n: int, least: int = 16) -> int:
    p = least
    while p < n:
        p *= 2
    return p


def _launch_setup(q, k, v, q_mask, k_mask, block_q: int, block_k: int):
    bsz, heads, sq, d = q.shape
    sk, dv = k.size(-2), v.size(-1)
    wd = torch.promote_types(q.dtype, torch.float32)
    from nas_cli.attention import triton_prefix_kernels as K

    dt = K.tl.float64 if wd == torch.float64 else K.tl.float32
    lowp = q.dtype in (torch.bfloat16, torch.float16)
    qm = None if q_mask is None else q_mask.to(torch.int8).contiguous()
    km = None if k_mask is None else k_mask.to(torch.int8).contiguous()
    dummy = torch.zeros(1, dtype=torch.int8, device=q.device)
    return dict(bsz=bsz, heads=heads, sq=sq, sk=sk, d=d, dv=dv, wd=wd, dt=dt, K=K, lowp=lowp,
                qm=qm if qm is not None else dummy, km=km if km is not None else dummy,
                has_qm=qm is not None, has_km=km is not None, bd=next_pow2(d), bdv=next_pow2(dv), bq=block_q,
                bk=block_k)


def _launch(tiles) -> dict:
    """The launch options of a tile choice: Triton's defaults where (BQ, BK, warps, stages) leaves them None."""
    return {name: x for name, x in zip(("num_warps", "num_stages"), tiles[2:]) if x is not None}


def _chunks(sq: int, bq: int) -> list[tuple[int, int]]:
    """(first row, query blocks) of each chunk of queries: :data:`CHUNK_Q` rows (a multiple of BQ) each."""
    rows = max(bq, CHUNK_Q // bq * bq)
    return [(q0, -(-min(rows, sq - q0) // bq)) for q0 in range(0, sq, rows)]


def _forward_passes(q, k, v, q_mask, k_mask, causal: bool, hybrid: bool, tiles):
    """The column pass and the row pass with ``tiles`` (BQ, BK, warps, stages), chunk by chunk of queries:
    what the backward needs to rebuild the carries (the one chunk's carries, or each chunk's starting
    column log-sum-exps: S numbers per head and chunk), the output(s) and their row log-sum-exps (two of
    each with ``hybrid``)."""
    st = _launch_setup(q, k, v, q_mask, k_mask, tiles[0], tiles[1])
    K, bh, opts = st["K"], st["bsz"] * st["heads"], _launch(tiles)
    scale = 1.0 / (st["d"] ** 0.5)
    outs = [torch.empty(st["bsz"], st["heads"], st["sq"], st["dv"], dtype=st["wd"], device=q.device)
            for _ in range(2 if hybrid else 1)]
    lses = [torch.empty(st["bsz"], st["heads"], st["sq"], dtype=st["wd"], device=q.device) for _ in outs]
    out2, lse2 = (outs[1], lses[1]) if hybrid else (st["qm"], st["qm"])  # (a dummy without HNAS)
    run = torch.full((bh, st["sk"]), -1.0e30, dtype=st["wd"], device=q.device)
    chunks = _chunks(st["sq"], st["bq"])
    starts = []
    for q0, nqb in chunks:
        if len(chunks) > 1:
            starts.append(run.clone())
        carry = torch.empty(bh, nqb, st["sk"], dtype=st["wd"], device=q.device)
        K.col_carry_kernel[(bh, -(-st["sk"] // st["bk"]))](
            q, k, st["qm"], st["km"], carry, run, st["heads"], st["sq"], st["sk"], st["d"], scale, nqb, q0,
            CAUSAL=causal, HAS_QM=st["has_qm"], HAS_KM=st["has_km"], DT=st["dt"], LOWP=st["lowp"], BQ=st["bq"],
            BK=st["bk"], BD=st["bd"], **opts)
        K.row_kernel[(bh, nqb)](
            q, k, v, st["qm"], st["km"], carry, outs[0], lses[0], out2, lse2, st["heads"], st["sq"], st["sk"],
            st["d"], st["dv"], scale, nqb, q0, CAUSAL=causal, HAS_QM=st["has_qm"], HAS_KM=st["has_km"],
            DT=st["dt"], LOWP=st["lowp"], BQ=st["bq"], BK=st["bk"], BD=st["bd"], BDV=st["bdv"], HYBRID=hybrid,
            **opts)
    return (torch.stack(starts) if starts else carry), outs, lses


def _backward_passes(q, k, v, q_mask, k_mask, causal: bool, u, tiles, carries, outs, lses, g):
    """The key-block pass (dK, dV) and dQ's pass with ``tiles``, chunk by chunk of queries from the last
    (rebuilding each chunk's carries from its starting column log-sum-exps where there are several):
    (dq, dk, dv, du) for the output gradient g."""
    st = _launch_setup(q, k, v, q_mask, k_mask, tiles[0], tiles[1])
    K, bh, hybrid, opts = st["K"], st["bsz"] * st["heads"], u is not None, _launch(tiles)
    scale = 1.0 / (st["d"] ** 0.5)
    deltas, du, uw = mixed_row_terms(g, outs, u, st["wd"], st["qm"])
    second = (lses[1], deltas[1]) if hybrid else (st["qm"], st["qm"])
    g = g.contiguous().to(v.dtype if st["lowp"] else st["wd"])
    dq = torch.empty(q.shape, dtype=st["wd"], device=q.device)
    dk = torch.zeros(k.shape, dtype=st["wd"], device=q.device)
    dv = torch.zeros(v.shape, dtype=st["wd"], device=q.device)
    # the later chunks' suffix carries, advanced by each chunk's key-block pass
    lpr, lnr = (torch.full((bh, st["sk"]), -1.0e30, dtype=st["wd"], device=q.device) for _ in range(2))
    sizes = (st["heads"], st["sq"], st["sk"], st["d"], st["dv"], scale)
    flags = dict(CAUSAL=causal, HAS_QM=st["has_qm"], HAS_KM=st["has_km"], DT=st["dt"], LOWP=st["lowp"],
                 BQ=st["bq"], BK=st["bk"], BD=st["bd"], BDV=st["bdv"], HYBRID=hybrid, **opts)
    chunks = _chunks(st["sq"], st["bq"])
    for index in reversed(range(len(chunks))):
        q0, nqb = chunks[index]
        carry = carries
        if len(chunks) > 1:
            carry = torch.empty(bh, nqb, st["sk"], dtype=st["wd"], device=q.device)
            K.col_carry_kernel[(bh, -(-st["sk"] // st["bk"]))](
                q, k, st["qm"], st["km"], carry, carries[index].clone(), *sizes[:4], scale, nqb, q0,
                CAUSAL=causal, HAS_QM=st["has_qm"], HAS_KM=st["has_km"], DT=st["dt"], LOWP=st["lowp"],
                BQ=st["bq"], BK=st["bk"], BD=st["bd"], **opts)
        # each query block's suffix carries of the later blocks (written by the key-block pass, read by dQ's)
        lpc, lnc = (torch.full((bh, nqb, st["sk"]), -1.0e30, dtype=st["wd"], device=q.device) for _ in range(2))
        args = (q, k, v, st["qm"], st["km"], carry, lses[0], g, deltas[0], *second, uw, lpc, lnc)
        K.bwd_col_kernel[(bh, -(-st["sk"] // st["bk"]))](*args, lpr, lnr, dk, dv, *sizes, nqb, q0, **flags)
        K.bwd_q_kernel[(bh, nqb)](*args, dq, *sizes, nqb, q0, **flags)
    return dq, dk, dv, du


def _tiles_for(q, k, v, q_mask, k_mask, causal: bool, u):
    """The tiles of this call (:func:`nas_cli.attention.triton_tiles.prefix_tiles`): tuned on a GPU once per
    case by running the whole forward and backward with each candidate."""
    from nas_cli.attention import triton_tiles as tt

    key = (str(q.dtype).replace("torch.", ""), f"d{q.size(-1)}/{v.size(-1)}", "causal" if causal else "prefix",
           "qmask" if q_mask is not None else "", "kmask" if k_mask is not None else "",
           "hnas" if u is not None else "dnas", f"bucket{tt.length_bucket(q.size(-2), k.size(-2))}", str(q.device))

    def trial(tiles):
        with torch.no_grad():
            carry, outs, lses = _forward_passes(q, k, v, q_mask, k_mask, causal, u is not None, tiles)
            g = torch.ones(q.shape[:-1] + (v.size(-1),), dtype=v.dtype, device=q.device)
            _backward_passes(q, k, v, q_mask, k_mask, causal, u, tiles, carry, outs, lses, g)

    return tt.prefix_tiles(key, q.dtype in (torch.bfloat16, torch.float16), q.device.type == "cuda", trial)


def mixed_output(outs, u, dtype):
    """The forward's output: the one part, or with ``u`` (HNAS) u O + (1 - u) O2 per head, in ``dtype``."""
    if u is None:
        return outs[0].to(dtype)
    w = u.to(outs[0].dtype)[None, :, None, None]
    return (w * outs[0] + (1 - w) * outs[1]).to(dtype)


def mixed_row_terms(g, outs, u, wd, dummy):
    """The backward's row terms of one part or, with ``u`` (HNAS: u O + (1 - u) O2), of two: each part's
    D_i = dO_i . O_i times its share (B, H, Sq), u's gradient (sum dO . (O - O2) per head; None
    without u) and u in the work dtype (``dummy`` without u). Both forms' kernels use them."""
    gw = g.to(wd)
    rows = [(gw * o).sum(-1) for o in outs]
    if u is None:
        return [rows[0].contiguous()], None, dummy
    w = u.to(wd)[None, :, None]
    deltas = [(w * rows[0]).contiguous(), ((1 - w) * rows[1]).contiguous()]
    return deltas, (rows[0] - rows[1]).sum((0, 2)).to(u.dtype), u.to(wd).contiguous()


class _TritonPrefixDNAS(torch.autograd.Function):
    """Prefix-normalized DNAS; with ``u`` (HNAS, one value per head), u O_DNAS + (1 - u) O_softmax from
    the same passes (softmax attention with the same mask: causal where DNAS is), u's gradient included."""

    @staticmethod
    def forward(ctx, q, k, v, q_mask, k_mask, causal: bool, u, block_q, block_k):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if block_q is None and block_k is None:
            tiles = _tiles_for(q, k, v, q_mask, k_mask, causal, u)
        else:
            tiles = (int(block_q or BLOCK_Q), int(block_k or BLOCK_K), None, None)
        carry, outs, lses = _forward_passes(q, k, v, q_mask, k_mask, causal, u is not None, tiles)
        masks = [m if m is not None else torch.empty(0) for m in (q_mask, k_mask)]
        ctx.save_for_backward(q, k, v, *masks, carry, *outs, *lses, *([u] if u is not None else []))
        ctx.conf = (causal, tiles, q_mask is not None, k_mask is not None, u is not None)
        return mixed_output(outs, u, v.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        causal, tiles, has_qm, has_km, hybrid = ctx.conf
        saved = ctx.saved_tensors
        q, k, v, q_mask, k_mask, carry = saved[:6]
        outs, lses = (saved[6:8], saved[8:10]) if hybrid else (saved[6:7], saved[7:8])
        q_mask, k_mask = (q_mask if has_qm else None), (k_mask if has_km else None)
        dq, dk, dv, du = _backward_passes(q, k, v, q_mask, k_mask, causal, saved[10] if hybrid else None, tiles,
                                          carry, outs, lses, g)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, du, None, None


def prefix_dnas_triton(q, k, v, q_mask=None, k_mask=None, *, causal: bool = False, block_q: int | None = None,
                       block_k: int | None = None) -> torch.Tensor:
    """(B, H, Sq, Dv): prefix-normalized DNAS (``causal``: also j <= i), zeros at padded queries and
    at rows without an allowed key, as :func:`nas_cli.attention.efficient.dnas_attention` with
    ``prefix=True`` gives. q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv); masks (B, S) bool,
    True = real."""
    why = triton_unavailable(q.device)
    if why:
        raise RuntimeError(f"attention.impl=triton: {why}")
    if q.size(-2) == 0 or k.size(-2) == 0:
        return q.new_zeros(*q.shape[:-1], v.size(-1), dtype=v.dtype)
    return _TritonPrefixDNAS.apply(q, k, v, q_mask, k_mask, causal, None, block_q, block_k)


def prefix_hnas_triton(q, k, v, u, q_mask=None, k_mask=None, *, causal: bool = False,
                       block_q: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """(B, H, Sq, Dv): HNAS in the prefix form, u O_DNAS + (1 - u) O_softmax with ``u`` (H,) per head, both
    parts from one pass over K and V (softmax attention with the same mask: causal where ``causal``);
    gradients for q, k, v and u."""
    why = triton_unavailable(q.device)
    if why:
        raise RuntimeError(f"attention.impl=triton: {why}")
    if q.size(-2) == 0 or k.size(-2) == 0:
        return q.new_zeros(*q.shape[:-1], v.size(-1), dtype=v.dtype) + 0 * u.sum()
    return _TritonPrefixDNAS.apply(q, k, v, q_mask, k_mask, causal, u, block_q, block_k)
