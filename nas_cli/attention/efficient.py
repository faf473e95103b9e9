"""Memory-efficient DNAS, HNAS and Sinkhorn-k (Ding et al. 2020, "Attention that does
not Explain Away"), exact in value and gradient, without a (Sq x Sk) tensor per head.

Notation of Ding et al. 2020 ("Attention that does not Explain Away"): s_ij = q_i . k_j / sqrt(d_head).

* **DNAS** is ordinary softmax attention with an additive per-key bias -c_j,
  c_j = logsumexp_i s_ij (over real queries). ``c`` comes from a chunked pass over
  query blocks (:class:`_ScoresLSE`), the output from the fused
  ``scaled_dot_product_attention`` (SDPA) with the bias as a broadcast float mask
  ``(B, H, 1, Sk)``.
* **Sinkhorn-k** keeps the iterate in vector form: for allowed pairs
  log pi_ij = s_ij - C_j - R_i, with the column and row normalizers
  C_j = logsumexp_i (s_ij - R_i) and R_i = logsumexp_j (s_ij - C_j) alternated k times
  (R starts at 0, so the first C is DNAS's c). Each is one chunked pass; the final row
  step is SDPA's own softmax, so the output is SDPA with bias -C_j.
* **HNAS** mixes the DNAS output above with the UNAS (plain SDPA) output.
* **Prefix form** (decoder self-attention, ``causal``; decoder cross-attention,
  ``prefix``): the column normalizer of query i sums only over queries i' <= i, so it is
  a matrix c_ij, not a per-key bias. It is computed query block by query block: for a
  block, the prefix log-sum-exp is logaddexp(carry_j, in-block logcumsumexp), where the
  carry (one vector per key and Sinkhorn stage) is the log-sum-exp over all earlier
  rows. Each block only needs its own (block x Sk) tile (:class:`~nas_cli.attention.efficient_prefix._PrefixAttention`).
  Backward walks the blocks in reverse and recomputes each tile; for DNAS with a
  hand-written backward (:func:`_dnas_prefix_block_grad`, about four tiles), for
  Sinkhorn-k with k > 1 (one carry per stage) with autograd on the block (about
  eighteen tiles). Incoming carries are kept only every ~sqrt(#blocks) blocks and
  recomputed in between, so they cost O(sqrt(Sq / block) x Sk), not O(Sq / block x Sk).
* **Dropout** in training (``dropout_p > 0``): SDPA's dropout mask is internal, and the
  gradient with respect to the bias needs it, so the non-prefix case then computes the
  output block by block under ``torch.utils.checkpoint`` (which replays the RNG) with the
  bias from the chunked pass; the prefix path draws each block's mask from a seeded
  generator, so its recomputation in backward draws the same mask. Same distribution
  as the naive path's dropout on the weights, different random numbers.

Why SDPA gets a *detached* bias: a float mask that requires grad makes PyTorch fall back
to the math kernel (a full (B, H, Sq, Sk) tensor; measured on CPU) or, on CUDA, to a
kernel that writes a full-size bias gradient. Instead, :class:`_KeyBiasGrad` supplies
dL/dc_j = -sum_i p_ij (dO_i . v_j - dO_i . O_i) by a chunked recomputation, and
:class:`_ScoresLSE` passes it on to q and k (dc_j/ds_ij = softmax over i of s_ij).

Padding is excluded from both normalizations exactly as in the naive path
(:mod:`nas_cli.attention.dnas`): padded queries never enter a column sum, padded keys
never enter a row sum, and outputs at padded queries are zero.

Memory: every chunked pass holds a few (B, H, block, Sk) tiles at a time; the block
height is ``block_size`` or, by default, chosen so a tile holds about
``TILE_ELEMENTS`` numbers. Tile arithmetic runs in float32 (float64 for float64 inputs)
with autocast switched off, so bf16 autocast changes only what SDPA itself does.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from nas_cli.attention.efficient_prefix import prefix_attention
from nas_cli.attention.tiles import (NEG, no_autocast, sdpa_dtype, tile_mask, work_dtype,
                    auto_block)


def _scores_tile(qw, kw, a, b, q_mask, k_mask, i0, i1, scale):
    """(B, H, i1-i0, Sk) tile of s_ij - a_j - b_i for query rows i0..i1-1, NEG where a
    pair is excluded (padding). qw, kw in the work dtype; a (B, H, Sk), b (B, H, Sq)."""
    s = torch.matmul(qw[:, :, i0:i1], kw.transpose(-1, -2)).mul_(scale)
    if a is not None:
        s.sub_(a[:, :, None, :])
    if b is not None:
        s.sub_(b[:, :, i0:i1, None])
    m = tile_mask(None if q_mask is None else q_mask[:, i0:i1], k_mask, i0, kw.size(-2), False, i1 - i0, s.device)
    if m is not None:
        s.masked_fill_(~m, NEG)
    return s


class _ScoresLSE(torch.autograd.Function):
    """Chunked log-sum-exp of x_ij = s_ij - a_j - b_i over the allowed pairs.

    over_queries=True: column normalizer, out_j = logsumexp_i x_ij, shape (B, H, Sk).
    over_queries=False: row normalizer, out_i = logsumexp_j x_ij, shape (B, H, Sq).
    An empty set (no allowed pair) gives 0; such an entry is never used by an allowed pair.

    Forward and backward walk query blocks, holding one (B, H, block, Sk) tile:
    d out / d x_ij = exp(x_ij - out) (a softmax over the reduced index), so
    dL/dx_ij = g * exp(x_ij - out), and grad_q, grad_k, grad_a, grad_b accumulate per block.
    """

    @staticmethod
    def forward(ctx, q, k, a, b, q_mask, k_mask, over_queries: bool, block: int):
        with no_autocast(q.device):
            wd = work_dtype(q)
            qw, kw = q.to(wd), k.to(wd)
            bsz, heads, sq, d = q.shape
            scale = 1.0 / math.sqrt(d)
            if over_queries:
                out = q.new_full((bsz, heads, k.size(-2)), NEG, dtype=wd)
            else:
                out = q.new_empty((bsz, heads, sq), dtype=wd)
            for i0 in range(0, sq, block):
                i1 = min(sq, i0 + block)
                s = _scores_tile(qw, kw, a, b, q_mask, k_mask, i0, i1, scale)
                if over_queries:
                    out = torch.logaddexp(out, torch.logsumexp(s, dim=-2))
                else:
                    out[:, :, i0:i1] = torch.logsumexp(s, dim=-1)
                del s
            # an empty set sums NEG's only; any allowed pair lifts it far above NEG / 2
            out = torch.where(out > NEG / 2, out, torch.zeros((), dtype=wd, device=out.device))
        ctx.save_for_backward(q, k, a, b, q_mask, k_mask, out)
        ctx.over_queries, ctx.block = over_queries, block
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, k, a, b, q_mask, k_mask, out = ctx.saved_tensors
        over, block = ctx.over_queries, ctx.block
        need_q, need_k, need_a, need_b = ctx.needs_input_grad[:4]
        with no_autocast(q.device):
            wd = out.dtype
            qw, kw, g = q.to(wd), k.to(wd), g.to(wd)
            sq, d = q.size(-2), q.size(-1)
            scale = 1.0 / math.sqrt(d)
            gq = torch.zeros_like(qw) if need_q else None
            gk = torch.zeros_like(kw) if need_k else None
            ga = torch.zeros(out.shape[:2] + (k.size(-2),), dtype=wd, device=q.device) if need_a else None
            gb = torch.zeros(out.shape[:2] + (sq,), dtype=wd, device=q.device) if need_b else None
            for i0 in range(0, sq, block):
                i1 = min(sq, i0 + block)
                # x -> exp(x - out) * g, in place: dL/dx on the tile; excluded pairs give 0
                p = _scores_tile(qw, kw, a, b, q_mask, k_mask, i0, i1, scale)
                if over:
                    p.sub_(out[:, :, None, :]).exp_().mul_(g[:, :, None, :])
                else:
                    p.sub_(out[:, :, i0:i1, None]).exp_().mul_(g[:, :, i0:i1, None])
                if need_q:
                    gq[:, :, i0:i1] = torch.matmul(p, kw).mul_(scale)
                if need_k:
                    gk.add_(torch.matmul(p.transpose(-1, -2), qw[:, :, i0:i1]), alpha=scale)
                if need_a:  # x = s - a - b
                    ga.sub_(p.sum(-2))
                if need_b:
                    gb[:, :, i0:i1] = -p.sum(-1)
                del p
        return (
            gq.to(q.dtype) if need_q else None,
            gk.to(k.dtype) if need_k else None,
            ga.to(a.dtype) if need_a else None,
            gb.to(b.dtype) if need_b else None,
            None, None, None, None,
        )


def scores_lse(q, k, *, over_queries: bool, a=None, b=None, q_mask=None, k_mask=None, block: int | None = None):
    """Chunked logsumexp of s_ij - a_j - b_i over queries (-> (B, H, Sk)) or keys
    (-> (B, H, Sq)), padding excluded, exact gradients to q, k, a, b."""
    if block is None:
        block = auto_block(q.size(-2), k.size(-2), q.size(0) * q.size(1))
    return _ScoresLSE.apply(q, k, a, b, q_mask, k_mask, over_queries, int(block))


class _KeyBiasGrad(torch.autograd.Function):
    """Identity on the SDPA output O = softmax_j(s_ij - c_j) V, whose backward adds the
    gradient with respect to the per-key bias c that SDPA (given a detached bias) does
    not compute:  dL/dc_j = -sum_i p_ij (dP_ij - D_i),  dP_ij = dO_i . v_j,  D_i = dO_i . O_i
    (the softmax backward, summed over queries). One chunked pass over query blocks."""

    @staticmethod
    def forward(ctx, out, c, q, k, v, k_mask, block: int):
        ctx.save_for_backward(out, c, q, k, v, k_mask)
        ctx.block = block
        return out.view_as(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        out, c, q, k, v, k_mask = ctx.saved_tensors
        with no_autocast(q.device):
            wd = c.dtype
            qw, kw, vw, gw = q.to(wd), k.to(wd), v.to(wd), g.to(wd)
            sq = q.size(-2)
            scale = 1.0 / math.sqrt(q.size(-1))
            big_d = (gw * out.to(wd)).sum(-1)  # (B, H, Sq): D_i = dO_i . O_i
            gc = torch.zeros_like(c)
            for i0 in range(0, sq, ctx.block):
                i1 = min(sq, i0 + ctx.block)
                s = _scores_tile(qw, kw, c, None, None, k_mask, i0, i1, scale)  # (B, H, bq, Sk)
                p = torch.softmax(s, dim=-1)
                del s
                dp = torch.matmul(gw[:, :, i0:i1], vw.transpose(-1, -2))  # (B, H, bq, Sk)
                dp.sub_(big_d[:, :, i0:i1, None]).mul_(p)  # dL/d(logit_ij)
                gc.sub_(dp.sum(-2))
                del p, dp
        return g, gc, None, None, None, None, None


def _keep_rows(q_mask, k_mask, causal: bool, sq: int, device) -> torch.Tensor | None:
    """(B, 1, Sq, 1) bool: query rows with at least one allowed key (padded queries and
    rows without a real key give zeros, as in the naive path). None if all are kept."""
    keep = None
    if q_mask is not None:
        keep = q_mask[:, None, :, None]
    if k_mask is not None:
        if causal:  # row i has a key iff some real key j <= i
            any_key = k_mask.cumsum(-1) > 0  # (B, Sk)
            if sq > any_key.size(-1):  # rows past the last key see every key
                any_key = torch.cat([any_key, any_key[:, -1:].expand(-1, sq - any_key.size(-1))], -1)
            any_key = any_key[:, None, :sq, None]
        else:
            any_key = k_mask.any(-1)[:, None, None, None]
        keep = any_key if keep is None else keep & any_key
    return keep


def biased_sdpa(q, k, v, c, k_mask=None, block: int | None = None) -> torch.Tensor:
    """out_i = sum_j softmax_j(s_ij - c_j) v_j over real keys, via SDPA with the float
    bias -c as a (B, H, 1, Sk) mask; exact gradients to q, k, v and c.

    q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv), c (B, H, Sk) -> (B, H, Sq, Dv).
    Rows without a real key are not zeroed here (the caller masks them)."""
    if block is None:
        block = auto_block(q.size(-2), k.size(-2), q.size(0) * q.size(1))
    cd = c.detach()
    real = None if k_mask is None else k_mask[:, None, :]  # (B, 1, Sk)
    # centring c per (batch, head) does not change the softmax; it keeps the bias small,
    # which matters when SDPA runs in bf16 (relative rounding of the bias)
    if real is None:
        centre = cd.mean(-1, keepdim=True)
    else:
        n = real.sum(-1, keepdim=True).clamp_min(1)
        centre = torch.where(real, cd, torch.zeros_like(cd)).sum(-1, keepdim=True) / n
    bias = centre - cd
    if real is not None:
        # -inf for padded keys; a row with no real key at all gets a harmless 0 bias
        # (finite output, zeroed by the caller) instead of NaN
        bias = bias.masked_fill(~real & real.any(-1, keepdim=True), float("-inf"))
    bias = bias[:, :, None, :].to(q.dtype)  # (B, H, 1, Sk); SDPA wants the query dtype
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return _KeyBiasGrad.apply(out, c, q, k, v, k_mask, int(block))


def sdpa_attention(q, k, v, q_mask=None, k_mask=None, causal: bool = False, dropout_p: float = 0.0):
    """UNAS through SDPA with the conventions of the attention cores (padded queries and
    rows without a real key give zeros)."""
    sq, sk = q.size(-2), k.size(-2)
    mask, is_causal = None, False
    if k_mask is not None:
        mask = k_mask[:, None, None, :]  # (B, 1, 1, Sk), True = attend
        if causal:
            mask = mask & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        # a row with no real key would be NaN: let it attend anywhere, zero it below
        mask = mask | ~mask.any(-1, keepdim=True)
    elif causal:
        is_causal = True
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    keep = _keep_rows(q_mask, k_mask, causal, sq, q.device)
    return out if keep is None else out * keep.to(out.dtype)


def _biased_block(q_blk, k, v, c, qm_blk, k_mask, dropout_p: float):
    """Output rows of one query block: dropout(softmax_j(s_ij - c_j)) V, padding
    excluded. q_blk (B, H, bq, D), c (B, H, Sk) -> (B, H, bq, Dv) in the work dtype."""
    with no_autocast(q_blk.device):
        wd = c.dtype
        s = _scores_tile(q_blk.to(wd), k.to(wd), c, None, qm_blk, k_mask, 0, q_blk.size(-2),
                         1.0 / math.sqrt(q_blk.size(-1)))
        p = torch.softmax(s, dim=-1)
        if dropout_p > 0:
            p = F.dropout(p, dropout_p, True)
        return torch.matmul(p, v.to(wd))


def _run_block(fn, *args):
    """Call fn, checkpointed (recomputed in backward, tile not stored) when grads flow."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)
    return fn(*args)


def dnas_attention(q, k, v, q_mask=None, k_mask=None, *, prefix: bool = False, causal: bool = False,
                   iterations: int = 1, dropout_p: float = 0.0, block_size: int | None = None) -> torch.Tensor:
    """Doubly normalized attention (Ding et al. 2020): iterations=1 is DNAS, k > 1 is
    Sinkhorn-k, exactly as :mod:`nas_cli.attention.dnas` defines them.

    q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv); q_mask (B, Sq), k_mask (B, Sk)
    bool, True = real. ``causal``: key j <= query i (implies ``prefix``); ``prefix``: the
    column step of query i sums over queries i' <= i only. ``dropout_p`` > 0 applies
    dropout to the attention weights (pass 0 in eval). Returns (B, H, Sq, Dv), zeros at
    padded queries and at rows without an allowed key.
    """
    prefix = prefix or causal
    bsz, heads, sq, _ = q.shape
    sk = k.size(-2)
    out_dtype = sdpa_dtype(q)
    if sq == 0 or sk == 0:  # nothing to attend: zeros, as the naive path gives
        return q.new_zeros(bsz, heads, sq, v.size(-1), dtype=out_dtype)
    if prefix:
        block = block_size or auto_block(sq, sk, bsz * heads)
        out = prefix_attention(q, k, v, q_mask, k_mask, causal, iterations, dropout_p, int(block))
    else:
        block = block_size or auto_block(sq, sk, bsz * heads)
        row_norm = None  # R_i of the previous Sinkhorn stage, (B, H, Sq)
        for t in range(iterations):
            col_norm = scores_lse(q, k, over_queries=True, b=row_norm, q_mask=q_mask, k_mask=k_mask, block=block)
            if t < iterations - 1:
                row_norm = scores_lse(q, k, over_queries=False, a=col_norm, q_mask=q_mask, k_mask=k_mask,
                                      block=block)
        if dropout_p > 0:
            outs = [
                _run_block(_biased_block, q[:, :, i0:i0 + block], k, v, col_norm,
                           None if q_mask is None else q_mask[:, i0:i0 + block], k_mask, dropout_p)
                for i0 in range(0, sq, block)
            ]
            out = torch.cat(outs, dim=-2)
        else:
            out = biased_sdpa(q, k, v, col_norm, k_mask, block)
    out = out.to(out_dtype)
    keep = _keep_rows(q_mask, k_mask, causal, sq, q.device)
    return out if keep is None else out * keep.to(out.dtype)


def hnas_attention(q, k, v, u, q_mask=None, k_mask=None, *, prefix: bool = False, causal: bool = False,
                   dropout_p: float = 0.0, block_size: int | None = None) -> torch.Tensor:
    """HNAS (Ding et al. 2020): u_h * out_DNAS + (1 - u_h) * out_UNAS, both memory
    efficient; u (H,). Mixing outputs equals attending with the mixed weights (without
    dropout; with dropout the two parts draw independent masks, also unbiased)."""
    dn = dnas_attention(q, k, v, q_mask, k_mask, prefix=prefix, causal=causal, dropout_p=dropout_p,
                        block_size=block_size)
    un = sdpa_attention(q, k, v, q_mask, k_mask, causal=causal, dropout_p=dropout_p)
    w = u.to(dn.dtype)[None, :, None, None]
    return w * dn + (1 - w) * un.to(dn.dtype)
