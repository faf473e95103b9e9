"""DNAS and HNAS for short sequences with a hand-derived backward.

The naive formula of :class:`nas_cli.attention.dnas.DNAS` / :class:`nas_cli.attention.hnas.HNAS`
(materialized (Sq x Sk) scores) differentiated by autograd records a dozen small elementwise
ops on (B, H, Sq, Sk) tensors (mask fills, log-sum-exp, nan_to_num, the masked softmax, ...)
and replays each in backward. :class:`_DoublyNormalized` computes the same values from the
scores in a few passes and returns the score gradient in closed form:

    l_ij = s_ij - c_ij,  P = rowsoftmax(l),  G = P * (dP - rowsum(dP * P))   (softmax backward)
    full column sum:  c_j = lse_i s_ij,          ds = G - exp(l) * colsum_i(G)
    prefix form:      c_ij = a_j + log T_ij,     T_ij = sum_{i' <= i} e_i'j,  e_ij = exp(s_ij - a_j),
                      ds = G - e * revcumsum_i(G / T)

(a_j: the detached anchor of :func:`nas_cli.attention.doubly.prefix_logsumexp`, whose clamp and
ANCHOR_LIMIT fallback are kept: when the anchored form would overflow, backward recomputes the
reference formula under autograd). HNAS mixes W = u P_dnas + (1 - u) P_unas; its u gradient is
sum_{b,i} (rowsum(dW * P_dnas) - rowsum(dW * P_unas)) per head. Dropout draws its noise exactly
as ``torch.nn.functional.dropout`` does on CPU (bernoulli_(1 - p) on a tensor like the weights),
so a seeded run draws the same mask as the reference path. Under autocast (bf16-mixed) the
autograd formula runs instead (its ops cast one by one); the backward is not differentiable
again (no double backward).
Values and gradients equal the autograd reference (tests/attention/test_attention_fused.py).
"""
from __future__ import annotations

import math

import torch

from torch.autograd.function import once_differentiable

from nas_cli.attention.base import NEG_INF, full_precision, masked_row_softmax, scaled_scores
from nas_cli.attention.doubly import ANCHOR_LIMIT, doubly_normalized_logits


def _scores_reference(s, allowed, prefix, u):
    dnas = masked_row_softmax(doubly_normalized_logits(s, allowed, prefix), allowed)
    if u is None:
        return dnas
    unas = masked_row_softmax(s, allowed)
    uu = u.to(s.dtype)[None, :, None, None]
    return uu * dnas + (1 - uu) * unas


def _masked(s: torch.Tensor, allowed):
    """The mask (None where every pair is allowed), the scores with -inf where not allowed, and the
    rows that allow no key ((..., Sq, 1), None where every row allows one)."""
    if allowed is not None and bool(allowed.all()):
        allowed = None
    if allowed is None:
        return None, s, None
    row_any = allowed.any(dim=-1, keepdim=True)
    return allowed, s.masked_fill(~allowed, NEG_INF), None if bool(row_any.all()) else ~row_any


def _column_normalized(s: torch.Tensor, sm: torch.Tensor, allowed, prefix: bool):
    """The column step l = s - c and what the backward needs of it: (l, e, T, fallback). The prefix form
    anchors each column at its first allowed score (e = exp(s - a), T its running sum down the column);
    where the anchored form would overflow, the reference formula instead (fallback: True)."""
    e = t = None
    if prefix:
        shape = (*s.shape[:-2], 1, s.size(-1))
        if allowed is None:
            anchor = sm[..., :1, :]
        else:
            first = allowed.to(torch.uint8).argmax(dim=-2, keepdim=True)
            anchor = sm.gather(-2, first.expand(shape))
        anchor = torch.where(torch.isfinite(anchor), anchor, torch.zeros_like(anchor))
        e = sm - anchor
        if bool(e.max() > ANCHOR_LIMIT):
            return doubly_normalized_logits(s, allowed, prefix), None, None, True
        e.exp_()
        t = torch.cumsum(e, dim=-2).clamp_min_(1e-30)
        return sm - torch.log(t).add_(anchor), e, t, False  # s - c, -inf where not allowed
    c = torch.logsumexp(sm, dim=-2, keepdim=True)
    logits = sm - c
    if not bool(torch.isfinite(c).all()):  # an empty column: -inf - -inf
        logits = torch.nan_to_num_(logits, nan=NEG_INF, posinf=NEG_INF)
    return logits, e, t, False


def _row_softmax(logits, row_empty):
    p = torch.softmax(logits, dim=-1)
    if row_empty is not None:  # rows without an allowed key: zeros, not NaN
        p.masked_fill_(row_empty, 0.0)
    return p


def _scores_backward(d_s, q, k, scale):
    """(dq, dk) from the gradient of s = q k^T * scale."""
    return torch.matmul(d_s, k).mul_(scale), torch.matmul(d_s.transpose(-1, -2), q).mul_(scale)


def _dots(a, b):
    """(B, H) sums of a * b over the last two dims, by batched matrix products."""
    n = a.size(-1) * a.size(-2)
    lead = a.shape[:-2]
    out = torch.bmm(a.reshape(-1, 1, n), b.reshape(-1, n, 1))
    return out.view(lead)


class _DoublyNormalized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, u, allowed, prefix, dropout_p, training):
        ctx.scale = 1.0 / math.sqrt(q.size(-1))
        s = torch.matmul(q, k.transpose(-1, -2)).mul_(ctx.scale)  # scaled_scores(q, k)
        allowed, sm, row_empty = _masked(s, allowed)
        logits, e, t, ctx.fallback = _column_normalized(s, sm, allowed, prefix)
        p_d = _row_softmax(logits, row_empty)
        p_u, w = None, p_d
        if u is not None:  # HNAS: W = u P_dnas + (1 - u) P_unas
            p_u = _row_softmax(sm, row_empty)
            uu = u.to(s.dtype)[None, :, None, None]
            w = p_d * uu + p_u * (1 - uu)
        noise = None
        if training and dropout_p > 0.0:  # drawn as torch.nn.functional.dropout draws it on CPU
            noise = torch.empty_like(w).bernoulli_(1 - dropout_p)
            noise.div_(1 - dropout_p)
        dropped = w * noise if noise is not None else w
        out = torch.matmul(dropped, v)
        ctx.prefix, ctx.has_u = prefix, u is not None
        ctx.allowed = allowed
        if ctx.fallback:
            ctx.save_for_backward(q, k, v, u, dropped, noise, s)
        else:
            ctx.save_for_backward(q, k, v, u, dropped, noise, logits, p_d, p_u, e, t)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        if ctx.fallback:
            q, k, v, u, dropped, noise, s = ctx.saved_tensors
            d_v = torch.matmul(dropped.transpose(-1, -2), d_out)
            d_w = torch.matmul(d_out, v.transpose(-1, -2))
            if noise is not None:
                d_w.mul_(noise)
            with torch.enable_grad():
                s_ = s.detach().requires_grad_(True)
                u_ = None if u is None else u.detach().requires_grad_(True)
                w = _scores_reference(s_, ctx.allowed, ctx.prefix, u_)
                inputs = (s_,) if u_ is None else (s_, u_)
                grads = torch.autograd.grad(w, inputs, d_w)
            d_q, d_k = _scores_backward(grads[0], q, k, ctx.scale)
            return d_q, d_k, d_v, (grads[1] if u is not None else None), None, None, None, None
        q, k, v, u, dropped, noise, logits, p_d, p_u, e, t = ctx.saved_tensors
        d_v = torch.matmul(dropped.transpose(-1, -2), d_out)
        d_w = torch.matmul(d_out, v.transpose(-1, -2))
        if noise is not None:
            d_w.mul_(noise)
        d_u = None
        if ctx.has_u:
            uu = u.to(d_w.dtype)[None, :, None, None]
            # d_u[h] = sum_{b,i,j} d_w * (p_d - p_u), as per-(b, h) dot products (no temporary)
            d_u = (_dots(d_w, p_d) - _dots(d_w, p_u)).sum(dim=0).to(u.dtype)
            g_d = torch._softmax_backward_data(d_w, p_d, -1, p_d.dtype).mul_(uu)
            g_u = torch._softmax_backward_data(d_w, p_u, -1, p_u.dtype).mul_(1 - uu)
        else:
            g_d = torch._softmax_backward_data(d_w, p_d, -1, p_d.dtype)  # p_d * (d_w - rowsum(d_w * p_d))
            g_u = None
        # column-normalizer part: the gradient flowing through c
        if ctx.prefix:
            # reversed cumulative sum over queries (as autograd's cumsum backward does)
            r = (g_d / t).flip(-2)
            corr = r.cumsum_(dim=-2).flip(-2).mul_(e)
        else:
            corr = torch.exp(logits).mul_(g_d.sum(dim=-2, keepdim=True))
        d_s = g_d.sub_(corr)
        if g_u is not None:
            d_s.add_(g_u)
        d_q, d_k = _scores_backward(d_s, q, k, ctx.scale)
        return d_q, d_k, d_v, d_u, None, None, None, None


def doubly_normalized_attention(q, k, v, allowed, prefix: bool, u=None, dropout_p: float = 0.0,
                                training: bool = False):
    """dropout(W) @ v for the DNAS weights (``u`` None) or the HNAS mixture with u (H,),
    with the scores s = q k^T / sqrt(d_head) and the boolean ``allowed`` mask of
    :func:`nas_cli.attention.base.allowed_mask`. Same values and gradients as the naive
    autograd formula, fewer passes over (Sq x Sk) tensors."""
    if torch.is_autocast_enabled(q.device.type):  # mixed precision: the autograd formula, cast per op
        w = _scores_reference(full_precision(scaled_scores(q, k)), allowed, prefix, u)
        return torch.matmul(torch.nn.functional.dropout(w, dropout_p, training).to(v.dtype), v)
    return _DoublyNormalized.apply(q, k, v, u, allowed, bool(prefix), float(dropout_p), bool(training))
