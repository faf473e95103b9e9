"""Contract tests every scheme in conf/attention/ gets for free."""
import pytest
import torch

from helpers import build_core, qkv


@pytest.mark.parametrize("causal", [False, True])
def test_shapes_and_rows_sum_to_one(scheme, causal):
    core = build_core(scheme, causal=causal).double()
    q, k, v = qkv(sq=6, sk=6)
    res = core(q, k, v, need_weights=True)
    assert res.out.shape == (2, 4, 6, 8)
    assert res.weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))
    if core.nonnegative:  # declared flag: e.g. the linear kernel can be negative
        assert (res.weights >= 0).all()
    # the path without weights (a fused kernel where one exists) gives the same output
    torch.testing.assert_close(core(q, k, v).out, res.out)


def test_cross_shapes(scheme):
    core = build_core(scheme, location="cross").double()
    q, k, v = qkv(sq=3, sk=9)
    res = core(q, k, v, need_weights=True)
    assert res.out.shape == (2, 4, 3, 8) and res.weights.shape == (2, 4, 3, 9)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 4, 3, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_reach_q_k_v(scheme, causal):
    core = build_core(scheme, causal=causal).double()
    q, k, v = (t.requires_grad_() for t in qkv())
    core(q, k, v).out.square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert v.grad.abs().sum() > 0
    if core.qk_gradients:
        assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    else:  # declared: the weights ignore the queries (e.g. one-layer additive attention)
        assert q.grad.abs().max() < 1e-12 * v.grad.abs().max()


@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(scheme, causal):
    """Appending padded positions leaves every real position's output unchanged."""
    core = build_core(scheme, causal=causal).double()
    q, k, v = qkv(b=1, sq=5, sk=5)
    ref = core(q, k, v, need_weights=True)
    junk_q, junk_k, junk_v = qkv(b=1, sq=3, sk=3, seed=7)
    qp, kp, vp = (torch.cat([a, 100 * j], dim=2) for a, j in ((q, junk_q), (k, junk_k), (v, junk_v)))
    mask = torch.tensor([[True] * 5 + [False] * 3])
    for need in (True, False):
        res = core(qp, kp, vp, q_mask=mask, k_mask=mask, need_weights=need)
        torch.testing.assert_close(res.out[:, :, :5], ref.out)
        assert torch.isfinite(res.out).all()
        if need:
            torch.testing.assert_close(res.weights[:, :, :5, :5], ref.weights)
            assert (res.weights[:, :, :, 5:] == 0).all()


def test_cross_padding_invariance(scheme):
    """Cross-attention: padded source keys and padded target queries are both excluded."""
    core = build_core(scheme, location="cross").double()
    q, k, v = qkv(b=1, sq=4, sk=6)
    ref = core(q, k, v).out
    jq, jk, jv = qkv(b=1, sq=2, sk=3, seed=3)
    res = core(torch.cat([q, jq * 50], 2), torch.cat([k, jk * 50], 2), torch.cat([v, jv], 2),
               q_mask=torch.tensor([[True] * 4 + [False] * 2]), k_mask=torch.tensor([[True] * 6 + [False] * 3]))
    torch.testing.assert_close(res.out[:, :, :4], ref)


@pytest.mark.parametrize("t", [0, 3, 6])
def test_causal_no_leak(scheme, t):
    """Changing queries, keys and values after position t leaves outputs at <= t unchanged."""
    core = build_core(scheme, causal=True, location="decoder").double()
    q, k, v = qkv(sq=8, sk=8)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    g = torch.Generator().manual_seed(1)
    for a in (q2, k2, v2):
        a[:, :, t + 1:] = torch.randn(a[:, :, t + 1:].shape, generator=g, dtype=a.dtype) * 10
    for need in (True, False):
        a, b = core(q, k, v, need_weights=need), core(q2, k2, v2, need_weights=need)
        torch.testing.assert_close(a.out[:, :, : t + 1], b.out[:, :, : t + 1], rtol=0, atol=1e-12)
        if need:
            assert (a.weights[..., : t + 1, t + 1:] == 0).all()


def test_cross_attention_no_leak_over_queries(scheme):
    """In a decoder, cross-attention queries are target positions: changing later
    queries must not change earlier outputs (DNAS's column step sums over queries)."""
    core = build_core(scheme, location="cross").double()
    q, k, v = qkv(sq=6, sk=9)
    q2 = q.clone()
    q2[:, :, 3:] = q2[:, :, 3:] * -5 + 1
    for need in (True, False):
        a, b = core(q, k, v, need_weights=need).out, core(q2, k, v, need_weights=need).out
        torch.testing.assert_close(a[:, :, :3], b[:, :, :3], rtol=0, atol=1e-12)
