"""Each scheme against an independent formula (plain PyTorch, written out here)."""
import math

import pytest
import torch
from torch.nn import functional as F

from helpers import build_core, qkv


def plain_scores(q, k):
    return torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.size(-1))


def two_step_dnas(s, mask=None):
    """Ding et al.: xi = exp(s) / column sums over queries; pi = xi / row sums over keys."""
    e = torch.exp(s - s.amax(dim=(-1, -2), keepdim=True))
    if mask is not None:
        e = e * mask
    xi = e / e.sum(-2, keepdim=True)
    xi = torch.nan_to_num(xi)
    return xi / xi.sum(-1, keepdim=True)


def causal_dnas_reference(s):
    """Row i of causal DNAS = row i of DNAS on the (causally masked) prefix s[:i+1, :i+1]."""
    n = s.size(-1)
    out = torch.zeros_like(s)
    for i in range(n):
        sub = s[..., : i + 1, : i + 1]
        mask = torch.ones(i + 1, i + 1, dtype=s.dtype).tril()
        out[..., i, : i + 1] = two_step_dnas(sub, mask)[..., i, :]
    return out


def test_unas_equals_sdpa_and_softmax_formula():
    core = build_core("unas").double()
    q, k, v = qkv(sk=9)
    ref_w = torch.softmax(plain_scores(q, k), -1)
    res = core(q, k, v, need_weights=True)
    torch.testing.assert_close(res.weights, ref_w)
    torch.testing.assert_close(res.out, ref_w @ v)
    torch.testing.assert_close(core(q, k, v).out, F.scaled_dot_product_attention(q, k, v))


def test_unas_causal_equals_sdpa_is_causal():
    core = build_core("unas", causal=True).double()
    q, k, v = qkv()
    torch.testing.assert_close(core(q, k, v).out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(core(q, k, v, need_weights=True).out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_dnas_equals_two_step_formula():
    core = build_core("dnas").double()
    q, k, v = qkv(sq=5, sk=9)
    ref = two_step_dnas(plain_scores(q, k))
    res = core(q, k, v, need_weights=True)
    torch.testing.assert_close(res.weights, ref)
    torch.testing.assert_close(res.out, ref @ v)


def test_dnas_padding_equals_truncated_formula():
    core = build_core("dnas", location="encoder").double()  # not autoregressive: full column sums
    q, k, v = qkv(b=1, sq=6, sk=8)
    qm = torch.tensor([[True] * 4 + [False] * 2])
    km = torch.tensor([[True] * 5 + [False] * 3])
    res = core(q, k, v, q_mask=qm, k_mask=km, need_weights=True)
    ref = two_step_dnas(plain_scores(q[:, :, :4], k[:, :, :5]))
    torch.testing.assert_close(res.weights[:, :, :4, :5], ref)


def test_cross_dnas_is_prefix_normalized_over_queries():
    """Decoder cross-attention: the column step for target query i sums over i' <= i only."""
    core = build_core("dnas", location="cross").double()
    q, k, v = qkv(sq=5, sk=7)
    s = plain_scores(q, k)
    ref = torch.stack([two_step_dnas(s[..., : i + 1, :])[..., i, :] for i in range(5)], dim=-2)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, ref)


def test_causal_dnas_is_prefix_normalized():
    core = build_core("dnas", causal=True, location="decoder").double()
    q, k, v = qkv(sq=7, sk=7)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, causal_dnas_reference(plain_scores(q, k)))


@pytest.mark.parametrize("sq,sk", [(9, 9), (20, 5), (4, 12)])
def test_theorem_2_columns_at_least_one_over_sk(sq, sk):
    """Ding et al. Theorem 2: every key column of DNAS sums to >= 1/Sk (non-causal, unmasked)."""
    core = build_core("dnas").double()
    q, k, v = qkv(sq=sq, sk=sk, seed=3)
    w = core(q * 4, k * 4, v, need_weights=True).weights  # sharp scores: UNAS would explain keys away
    assert (w.sum(-2) >= 1.0 / sk - 1e-12).all()
    if sq <= sk:
        u = build_core("unas").double()(q * 4, k * 4, v, need_weights=True).weights
        assert (u.sum(-2) < 1.0 / sk).any()  # the contrast the theorem is about


def test_hnas_endpoints():
    q, k, v = qkv()
    for causal in (False, True):
        unas = build_core("unas", causal=causal).double()(q, k, v, need_weights=True)
        dnas = build_core("dnas", causal=causal).double()(q, k, v, need_weights=True)
        for u, ref in ((0.0, unas), (1.0, dnas)):
            core = build_core("hnas", causal=causal).double()
            with torch.no_grad():
                core.u_logit.fill_(math.inf if u else -math.inf)
            res = core(q, k, v, need_weights=True)
            torch.testing.assert_close(res.weights, ref.weights)
            torch.testing.assert_close(res.out, ref.out)


def test_hnas_mixture_and_u_init():
    core = build_core("hnas").double()
    q, k, v = qkv()
    u = core.u.double()[None, :, None, None]
    s = plain_scores(q, k)
    ref = u * two_step_dnas(s) + (1 - u) * torch.softmax(s, -1)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, ref)
    from nas_cli.attention.hnas import HNAS
    assert torch.allclose(HNAS(heads=3, u_init=0.1).u, torch.full((3,), 0.1))
    with pytest.raises(ValueError, match="u_init"):
        HNAS(heads=3, u_init=1.5)


def test_sinkhorn_one_iteration_is_dnas():
    q, k, v = qkv(sq=6, sk=8)
    for causal in (False, True):
        a = build_core("sinkhorn", causal=causal, iterations=1).double()
        b = build_core("dnas", causal=causal).double()
        if causal:
            q, k, v = qkv(sq=8, sk=8)
        torch.testing.assert_close(a(q, k, v, need_weights=True).weights, b(q, k, v, need_weights=True).weights)


def test_sinkhorn_many_iterations_doubly_stochastic():
    core = build_core("sinkhorn", iterations=200).double()
    q, k, v = qkv(sq=10, sk=10)
    w = core(q, k, v, need_weights=True).weights
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-3, rtol=0)
    torch.testing.assert_close(w.sum(-2), torch.ones_like(w.sum(-2)), atol=1e-3, rtol=0)
    few = build_core("sinkhorn", iterations=1).double()(q, k, v, need_weights=True).weights
    assert (few.sum(-2) - 1).abs().max() > 1e-2  # one step is not enough: the test can fail


# ---------------------------------------------------------------- the anchored prefix log-sum-exp


@pytest.mark.parametrize("scale", [1.0, 200.0])  # 200: some s_ij - a_j > ANCHOR_LIMIT -> logcumsumexp branch
@pytest.mark.parametrize("form", ["causal", "prefix_padded", "none"])
def test_prefix_logsumexp_equals_torch_logcumsumexp(form, scale):
    """c_ij = logsumexp_{i' <= i} s_i'j: the anchored cumsum equals torch.logcumsumexp (an
    independent implementation) in value and gradient on every allowed entry."""
    from nas_cli.attention.base import NEG_INF, allowed_mask
    from nas_cli.attention.doubly import prefix_logsumexp

    torch.manual_seed(3)
    b, h, sq, sk = 2, 3, 7, 6
    s = (scale * torch.randn(b, h, sq, sk, dtype=torch.float64)).requires_grad_()
    q_mask = k_mask = None
    if form == "prefix_padded":
        q_mask = torch.tensor([[True] * sq, [True] * 4 + [False] * 3])
        k_mask = torch.tensor([[True] * sk, [True] * 5 + [False]])
    allowed = allowed_mask(q_mask, k_mask, form == "causal", sq, sk, s.device)
    keep = torch.ones(b, h, sq, sk, dtype=torch.bool) if allowed is None else allowed.expand(b, h, sq, sk)
    masked = s if allowed is None else s.masked_fill(~allowed, NEG_INF)
    ours = prefix_logsumexp(masked, allowed)
    ref = torch.logcumsumexp(masked, dim=-2)
    torch.testing.assert_close(ours[keep], ref[keep], rtol=1e-12, atol=1e-12)
    w = torch.randn(b, h, sq, sk, dtype=torch.float64)
    g_ours, = torch.autograd.grad((ours[keep] * w[keep]).sum(), s, retain_graph=True)
    g_ref, = torch.autograd.grad((ref[keep] * w[keep]).sum(), s)
    assert torch.isfinite(g_ours).all()
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)
    # row i's normalizer never changes when later queries change (the anchor is an earlier score)
    later = s.detach().clone()
    later[:, :, 4:] += 50.0
    m2 = later if allowed is None else later.masked_fill(~allowed, NEG_INF)
    again = prefix_logsumexp(m2, allowed)
    torch.testing.assert_close(again[:, :, :4][keep[:, :, :4]], ours.detach()[:, :, :4][keep[:, :, :4]])
