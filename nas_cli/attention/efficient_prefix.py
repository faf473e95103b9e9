"""The prefix (causal) form of memory-efficient DNAS / Sinkhorn-k: decoder self-attention
(``causal``) and decoder cross-attention (``prefix``), where the column normalizer of query
i sums only over queries i' <= i, so it is a matrix c_ij rather than a per-key bias.

Query blocks are processed in order with one carry per key and Sinkhorn stage (the log-sum-
exp over all earlier rows); backward walks the blocks in reverse and recomputes each tile
(see :mod:`nas_cli.attention.efficient` for the whole design and the non-prefix form; the
tile helpers both use are in :mod:`nas_cli.attention.tiles`).
"""
from __future__ import annotations

from types import MappingProxyType
import math

import torch
from torch.nn import functional as F

from nas_cli.attention.tiles import NEG, no_autocast, tile_mask, work_dtype

def _seeded_dropout(p: torch.Tensor, dropout_p: float, seed: int) -> torch.Tensor:
    """Dropout whose mask is a function of ``seed`` alone, so a block recomputed in
    backward (in any order) draws exactly the mask of its forward pass."""
    gen = torch.Generator(device=p.device)
    gen.manual_seed(seed)
    keep = torch.rand(p.shape, generator=gen, device=p.device, dtype=p.dtype) >= dropout_p
    return p * keep / (1.0 - dropout_p)


def _prefix_block(q_blk, k, v, qm_blk, k_mask, i0: int, causal: bool, iterations: int, dropout_p: float,
                  seed: int, need_out: bool, *carries):
    """Output rows i0..i0+bq-1 of prefix-normalized Sinkhorn-k (k = 1: DNAS).

    q_blk (B, H, bq, D); k, v (B, H, n, .) the keys this block may see (n = i0 + bq when
    causal, else all Sk); carries[t] (B, H, m <= n) = log-sum-exp over all earlier query
    rows of the stage-t iterate, per key (keys >= m: no earlier row, i.e. NEG).
    Returns (out (B, H, bq, Dv) or None if not need_out, *carries through the end of this
    block (B, H, n)).

    Per stage t (L_0 = s): c_ij = logaddexp(carry_j, logcumsumexp_{i' <= i in block} L_i'j)
    is the prefix column normalizer of dnas.py's naive path; L <- L - c, then (except in
    the last stage) the row step L <- L - logsumexp_j L. Output: softmax_j L.
    Tiles are (B, H, bq, n); in-place steps only where autograd does not need the input.
    """
    with no_autocast(q_blk.device):
        wd = work_dtype(q_blk)
        bq, n = q_blk.size(-2), k.size(-2)
        s = torch.matmul(q_blk.to(wd), k.to(wd).transpose(-1, -2)).mul_(1.0 / math.sqrt(q_blk.size(-1)))
        excluded = tile_mask(qm_blk, k_mask, i0, n, causal, bq, s.device)  # (B|1, 1, bq, n)
        if excluded is not None:
            excluded = ~excluded
            s = s.masked_fill_(excluded, NEG)
        big_l, new = s, []
        for t in range(iterations):
            carry = carries[t]
            if carry.size(-1) < n:
                carry = F.pad(carry, (0, n - carry.size(-1)), value=NEG)
            c = torch.logaddexp(torch.logcumsumexp(big_l, dim=-2), carry[:, :, None, :])
            new.append(c[:, :, -1, :].clone())  # a view would keep the whole tile c alive
            if t == iterations - 1 and not need_out:
                break
            big_l = big_l - c
            del c
            if excluded is not None:
                big_l.masked_fill_(excluded, NEG)
            if t < iterations - 1:
                big_l = big_l - torch.logsumexp(big_l, dim=-1, keepdim=True)
                if excluded is not None:
                    big_l.masked_fill_(excluded, NEG)
        if not need_out:
            return (None, *new)
        p = torch.softmax(big_l, dim=-1)
        if dropout_p > 0:
            p = _seeded_dropout(p, dropout_p, seed)
        return (torch.matmul(p, v.to(wd)), *new)



#: largest spread (in log units) of the prefix normalizer within a block that the
#: hand-written backward below handles in linear space; wider blocks use autograd
_SPREAD = MappingProxyType({torch.float32: 60.0, torch.float64: 600.0})


def _value_grads(p, gw, vw, dropout_p: float, seed: int):
    """For O = dropout(p) V and dO = ``gw``: dV, D_i = dO_i . O_i and dP (the dropout mask of
    ``seed`` drawn again, as a scale on dP)."""
    if dropout_p > 0:
        pd = _seeded_dropout(p, dropout_p, seed)
        dv = torch.matmul(pd.transpose(-1, -2), gw)  # (B, H, n, Dv)
        big_d = (gw * torch.matmul(pd, vw)).sum(-1, keepdim=True)  # (B, H, bq, 1)
        del pd
        gen = torch.Generator(device=p.device)
        gen.manual_seed(seed)
        keep = torch.rand(p.shape, generator=gen, device=p.device, dtype=p.dtype) >= dropout_p
        return dv, big_d, torch.matmul(gw, vw.transpose(-1, -2)).mul_(keep).mul_(1.0 / (1.0 - dropout_p))
    dv = torch.matmul(p.transpose(-1, -2), gw)
    big_d = (gw * torch.matmul(p, vw)).sum(-1, keepdim=True)
    return dv, big_d, torch.matmul(gw, vw.transpose(-1, -2))


def _dnas_prefix_block_grad(q_blk, k, v, qm_blk, k_mask, i0: int, causal: bool, dropout_p: float, seed: int,
                            carry, g_blk, g_next):
    """Hand-written backward of one prefix-DNAS block (_prefix_block with iterations=1).

    Holds at most four (B, H, bq, n) tiles (autograd on the same block holds about twelve).
    With L = s (NEG where excluded), c_ij = log(exp(carry_j) + sum_{r<=i} exp(L_rj)),
    z = L - c, p = softmax_j z, O = dropout(p) V:
      dz_ij = p_ij (dP_ij - D_i),  dP_ij = dO_i . v_j (times the dropout mask),  D_i = dO_i . O_i
      dc_ij = -dz_ij (+ g_next_j on the block's last row, whose c is the outgoing carry)
      dL_rj = dz_rj + sum_{i>=r} dc_ij exp(L_rj - c_ij),  dcarry_j = sum_i dc_ij exp(carry_j - c_ij).
    c is nondecreasing down a column, so with M_j = c_{last, j} = max_i c_ij the suffix sum
    is exp(L_rj - M_j) * sum_{i>=r} dc_ij exp(M_j - c_ij), every factor bounded as long as
    M_j - c_ij stays below _SPREAD; the suffix sum is a triangular matmul. Returns
    (dq_blk, dk, dv, dcarry) in the work dtype, or None when the spread is too wide.
    """
    wd = work_dtype(q_blk)
    bq, n, m = q_blk.size(-2), k.size(-2), carry.size(-1)
    scale = 1.0 / math.sqrt(q_blk.size(-1))
    qw, kw, vw, gw = q_blk.to(wd), k.to(wd), v.to(wd), g_blk.to(wd)
    s = torch.matmul(qw, kw.transpose(-1, -2)).mul_(scale)  # (B, H, bq, n)
    excluded = tile_mask(qm_blk, k_mask, i0, n, causal, bq, s.device)
    if excluded is not None:
        excluded = ~excluded
        s.masked_fill_(excluded, NEG)
    carry = F.pad(carry, (0, n - m), value=NEG) if m < n else carry  # (B, H, n)
    c = torch.logaddexp(torch.logcumsumexp(s, dim=-2), carry[:, :, None, :])  # (B, H, bq, n)
    big_m = c[:, :, -1, :].clone()  # (B, H, n)
    p = s - c
    if excluded is not None:
        p.masked_fill_(excluded, NEG)
    p = torch.softmax(p, dim=-1)
    dv, big_d, dz = _value_grads(p, gw, vw, dropout_p, seed)
    dz.sub_(big_d).mul_(p)  # dL/dz, zero where excluded (p = 0 there)
    del p
    # c -> M - c (zero where excluded: dc is 0 there, and NEG-sized values would overflow)
    c.neg_().add_(big_m[:, :, None, :])
    if excluded is not None:
        c.masked_fill_(excluded, 0.0)
        c[:, :, -1, :] = 0.0  # the last row is M itself (also where that query is padded)
    if c.numel() and c.max() > _SPREAD.get(wd, 60.0):
        return None
    w = c.exp_().mul_(dz).neg_()  # dc_ij exp(M_j - c_ij), dc = -dz ...
    if g_next is not None:
        w[:, :, -1, :] += g_next  # ... + the outgoing carry's gradient on the last row (exp(0) = 1)
    tri = torch.ones(bq, bq, dtype=wd, device=s.device).triu_()  # tri[r, i] = 1 for i >= r
    suffix = torch.matmul(tri, w)  # (B, H, bq, n): sum_{i >= r} w_ij
    del w, c
    dcarry = (carry - big_m).exp_().mul_(suffix[:, :, 0, :])[..., :m]
    ds = s.sub_(big_m[:, :, None, :]).exp_().mul_(suffix).add_(dz)  # dL/ds (s is dead now)
    del suffix, dz
    if excluded is not None:
        ds.masked_fill_(excluded, 0.0)
    dq_blk = torch.matmul(ds, kw).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), qw).mul_(scale)
    return dq_blk, dk, dv, dcarry


class _PrefixAttention(torch.autograd.Function):
    """Prefix-normalized Sinkhorn-k / DNAS over query blocks with exact gradients.

    Forward runs the blocks in order, carrying one (B, H, n) log-sum-exp vector per stage.
    Backward runs them in reverse; each block is recomputed and differentiated (w.r.t. its
    q rows, the k, v it sees and its incoming carries, given the gradient of its outputs
    and outgoing carries), so only one block's tiles exist at a time: by
    :func:`_dnas_prefix_block_grad` for DNAS, by autograd on :func:`_prefix_block` for
    Sinkhorn-k (k > 1) and for DNAS blocks whose normalizer spread is too wide. The incoming carries are not all stored (that would be (Sq / block) x Sk per head):
    only those at the start of every ``seg``-th block, seg ~ sqrt(number of blocks); a
    segment's other carries are recomputed (a cheaper forward without outputs) just
    before the segment is differentiated.
    """

    @staticmethod
    def forward(ctx, q, k, v, q_mask, k_mask, causal: bool, iterations: int, dropout_p: float, block: int,
                seed: int):
        bsz, heads, sq, _ = q.shape
        wd = work_dtype(q)
        starts = list(range(0, sq, block))
        seg = max(1, math.isqrt(len(starts) - 1) + 1)
        carries = [q.new_full((bsz, heads, 0), NEG, dtype=wd) for _ in range(iterations)]
        kept, outs = [], []
        for b in range(len(starts)):
            if b % seg == 0:
                kept.extend(carries)
            res = _PrefixAttention._block(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, block, seed, b,
                                          carries, need_out=True)
            outs.append(res[0])
            carries = list(res[1:])
        ctx.save_for_backward(q, k, v, q_mask, k_mask, *kept)
        ctx.conf = (causal, iterations, dropout_p, block, seed, seg, len(starts))
        return torch.cat(outs, dim=-2).to(v.dtype)

    @staticmethod
    def _block(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, block, seed, b, carries, need_out):
        sq, sk = q.size(-2), k.size(-2)
        i0 = b * block
        i1 = min(sq, i0 + block)
        n = min(sk, i1) if causal else sk  # keys j > i1 - 1 are invisible to a causal block
        return _prefix_block(q[:, :, i0:i1], k[:, :, :n], v[:, :, :n],
                             None if q_mask is None else q_mask[:, i0:i1],
                             None if k_mask is None else k_mask[:, :n],
                             i0, causal, iterations, dropout_p, seed + b, need_out, *carries)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        with no_autocast(g.device):  # tile arithmetic stays in the work dtype
            return _PrefixAttention._backward(ctx, g)

    @staticmethod
    def _backward(ctx, g):
        q, k, v, q_mask, k_mask, *kept = ctx.saved_tensors
        causal, iterations, dropout_p, block, seed, seg, nblocks = ctx.conf
        wd = work_dtype(q)
        dq = torch.zeros(q.shape, dtype=wd, device=q.device)
        dk = torch.zeros(k.shape, dtype=wd, device=k.device)
        dv = torch.zeros(v.shape, dtype=wd, device=v.device)
        sk = k.size(-2)
        g_carries = None  # gradient w.r.t. the carries leaving the block being differentiated
        for s0 in reversed(range(0, nblocks, seg)):
            blocks = list(range(s0, min(nblocks, s0 + seg)))
            carries_in = [kept[(s0 // seg) * iterations:(s0 // seg + 1) * iterations]]
            with torch.no_grad():  # rebuild the incoming carries of the segment's blocks
                for b in blocks[:-1]:
                    res = _PrefixAttention._block(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, block,
                                                  seed, b, carries_in[-1], need_out=False)
                    carries_in.append(list(res[1:]))
            for b in reversed(blocks):
                i0, i1 = b * block, min(q.size(-2), (b + 1) * block)
                n = min(sk, i1) if causal else sk
                fast = None
                if iterations == 1:
                    with torch.no_grad():
                        fast = _dnas_prefix_block_grad(
                            q[:, :, i0:i1], k[:, :, :n], v[:, :, :n], None if q_mask is None else q_mask[:, i0:i1],
                            None if k_mask is None else k_mask[:, :n], i0, causal, dropout_p, seed + b,
                            carries_in[b - s0][0], g[:, :, i0:i1], None if g_carries is None else g_carries[0])
                if fast is not None:
                    dq[:, :, i0:i1] += fast[0]
                    dk[:, :, :n] += fast[1]
                    dv[:, :, :n] += fast[2]
                    g_carries = [fast[3]]
                    del fast
                    continue
                with torch.enable_grad():
                    qb = q[:, :, i0:i1].detach().requires_grad_()
                    kb = k[:, :, :n].detach().requires_grad_()
                    vb = v[:, :, :n].detach().requires_grad_()
                    cb = [c.detach().requires_grad_() for c in carries_in[b - s0]]
                    res = _prefix_block(qb, kb, vb, None if q_mask is None else q_mask[:, i0:i1],
                                        None if k_mask is None else k_mask[:, :n], i0, causal, iterations,
                                        dropout_p, seed + b, True, *cb)
                    outs, grads = [res[0]], [g[:, :, i0:i1].to(res[0].dtype)]
                    if g_carries is not None:  # the last block's carries feed nothing
                        outs += list(res[1:])
                        grads += g_carries
                    got = torch.autograd.grad(outs, [qb, kb, vb, *cb], grads, allow_unused=True)
                del res, outs
                dq[:, :, i0:i1] += got[0]
                dk[:, :, :n] += got[1]
                dv[:, :, :n] += got[2]
                g_carries = [torch.zeros_like(c) if gc is None else gc for c, gc in zip(cb, got[3:])]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def prefix_attention(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, block):
    """(B, H, Sq, Dv) output of the prefix form; see _PrefixAttention."""
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    return _PrefixAttention.apply(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, block, seed)
