"""The short-sequence DNAS/HNAS path with a hand-derived backward (nas_cli.attention.fused)
equals the autograd reference: values and gradients of q, k, v (and HNAS's u), with padding,
causal and prefix (cross-attention) masks, dropout, and the anchored-form fallback."""
import pytest
import torch

from nas_cli.attention.base import allowed_mask, scaled_scores
from nas_cli.attention.fused import _scores_reference, doubly_normalized_attention

FORMS = [("encoder", False, False), ("decoder", True, True), ("cross", False, True)]


def _inputs(b, h, sq, sk, d, padded, dtype=torch.float32, spread=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, h, sq, d, generator=g, dtype=dtype) * spread).requires_grad_(True)
    k = torch.randn(b, h, sk, d, generator=g, dtype=dtype).requires_grad_(True)
    v = torch.randn(b, h, sk, d, generator=g, dtype=dtype).requires_grad_(True)
    q_mask = k_mask = None
    if padded:
        q_mask = torch.ones(b, sq, dtype=torch.bool)
        k_mask = torch.ones(b, sk, dtype=torch.bool)
        q_mask[0, sq - 3:] = False
        k_mask[-1, sk - 2:] = False
        k_mask[0, 0] = False  # a column empty in every row, first query's row partly masked
    return q, k, v, q_mask, k_mask


def _both(form, hnas, padded, sq=9, sk=9, dtype=torch.float32, spread=1.0, dropout=0.0):
    _, causal, prefix = form
    if causal:
        sk = sq
    q, k, v, q_mask, k_mask = _inputs(2, 3, sq, sk, 5, padded, dtype, spread)
    u = torch.tensor([0.2, 0.5, 0.9], dtype=dtype).requires_grad_(True) if hnas else None
    allowed = allowed_mask(q_mask, k_mask, causal, sq, sk, q.device)
    d_out = torch.randn(2, 3, sq, 5, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    for fused in (True, False):
        torch.manual_seed(7)
        s = scaled_scores(q, k)
        if fused:
            out = doubly_normalized_attention(q, k, v, allowed, prefix, u=u, dropout_p=dropout, training=dropout > 0)
        else:
            w = torch.nn.functional.dropout(_scores_reference(s, allowed, prefix, u), dropout, dropout > 0)
            out = torch.matmul(w, v)
        inputs = (q, k, v) if u is None else (q, k, v, u)
        results.append((out, torch.autograd.grad(out, inputs, d_out)))
    return results


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("hnas", [False, True], ids=["dnas", "hnas"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["nodrop", "dropout"])
def test_fused_equals_reference_float32(form, hnas, padded, dropout):
    sq, sk = (9, 9) if form[1] else (9, 7)
    (out_f, grads_f), (out_r, grads_r) = _both(form, hnas, padded, sq, sk, dropout=dropout)
    assert torch.isfinite(out_f).all()
    assert (out_f - out_r).abs().max() <= 1e-5
    for gf, gr in zip(grads_f, grads_r):
        assert torch.isfinite(gf).all()
        assert (gf - gr).abs().max() <= 1e-5


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("hnas", [False, True], ids=["dnas", "hnas"])
def test_fused_gradcheck_float64(form, hnas):
    _, causal, prefix = form
    q, k, v, q_mask, k_mask = _inputs(1, 2, 5, 5, 3, True, torch.float64)
    allowed = allowed_mask(q_mask, k_mask, causal, 5, 5, q.device)
    u = torch.tensor([0.3, 0.7], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, u):
        return doubly_normalized_attention(q, k, v, allowed, prefix, u=u if hnas else None)

    assert torch.autograd.gradcheck(f, (q, k, v, u))


@pytest.mark.parametrize("form", FORMS[1:], ids=[f[0] for f in FORMS[1:]])
def test_fused_wide_spread_falls_back_exactly(form):
    """Scores spread past ANCHOR_LIMIT: the logcumsumexp reference form, same gradients."""
    (out_f, grads_f), (out_r, grads_r) = _both(form, True, True, spread=40.0)
    assert (out_f - out_r).abs().max() <= 1e-5
    for gf, gr in zip(grads_f, grads_r):
        assert (gf - gr).abs().max() <= 1e-4 * max(1.0, gr.abs().max().item())


@pytest.mark.parametrize("form", FORMS[1:], ids=[f[0] for f in FORMS[1:]])
def test_fused_prefix_is_causal_over_queries(form):
    """Output row i and the gradient reaching query i' < i ignore every later query."""
    _, causal, prefix = form
    q, k, v, _, _ = _inputs(1, 2, 8, 8, 4, False)
    allowed = allowed_mask(None, None, causal, 8, 8, q.device)
    u = torch.tensor([0.4, 0.6])
    out = doubly_normalized_attention(q, k, v, allowed, prefix, u=u)
    q2 = q.detach().clone()
    q2[:, :, 5:] += 3.0
    out2 = doubly_normalized_attention(q2, k, v, allowed, prefix, u=u)
    assert torch.allclose(out[:, :, :5], out2[:, :, :5], atol=1e-6)
    (g,) = torch.autograd.grad(out[:, :, 3].sum(), q)
    assert g[:, :, 4:].abs().max() == 0


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_core_short_path_under_bf16_autocast(scheme, causal):
    """Under autocast the short-sequence path takes the autograd formula (bf16 out, finite grads)."""
    from nas_cli.attention.dnas import DNAS
    from nas_cli.attention.hnas import HNAS
    core = {"dnas": DNAS, "hnas": HNAS}[scheme](2, causal=causal, impl="auto")
    q, k, v, q_mask, k_mask = _inputs(2, 2, 8, 8, 4, True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = core(q, k, v, q_mask, k_mask).out
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
