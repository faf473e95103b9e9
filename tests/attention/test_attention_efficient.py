"""The memory-efficient DNAS / HNAS / Sinkhorn paths (nas_cli.attention.efficient)
against the naive reference formula of the same scheme, built from the registry."""
import math

import pytest
import torch

from helpers import build_core, qkv
from nas_cli.attention.dnas import DNAS, Sinkhorn
from nas_cli.attention.efficient import biased_sdpa, dnas_attention, scores_lse
from nas_cli.attention.hnas import HNAS

SCHEMES = ["dnas", "hnas", "sinkhorn"]
# (location, causal, Sq, Sk): encoder = full column sums; cross = decoder cross-attention,
# column step over the query prefix; decoder = causal self-attention. Block size 4 divides
# none of the lengths, so every path has a ragged last block.
SHAPES = [
    ("encoder", False, 11, 11),
    ("encoder", False, 7, 13),
    ("cross", False, 9, 6),
    ("decoder", True, 11, 11),
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many tiny ops: one thread avoids OpenMP oversubscription on shared CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def masks(b, sq, sk, causal):
    """Batch 0 unpadded, batch 1 right-padded, batch 2 left-padded (True = real)."""
    qm = torch.ones(b, sq, dtype=torch.bool)
    km = torch.ones(b, sk, dtype=torch.bool)
    qm[1, -2:] = False
    qm[2, :2] = False
    if causal:  # self-attention: the same positions are queries and keys
        return qm, qm.clone()
    km[1, -3:] = False
    km[2, :1] = False
    return qm, km


def run(core, q, k, v, g, q_mask=None, k_mask=None):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    core.zero_grad()
    out = core(q, k, v, q_mask=q_mask, k_mask=k_mask).out
    (out * g).sum().backward()
    grads = [q.grad, k.grad, v.grad]
    if hasattr(core, "u_logit"):
        grads.append(core.u_logit.grad.clone())
    return out, grads


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("location,causal,sq,sk", SHAPES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_efficient_equals_naive_float32(scheme, location, causal, sq, sk, padded):
    naive = build_core(scheme, heads=3, causal=causal, location=location, impl="naive")
    eff = build_core(scheme, heads=3, causal=causal, location=location, block_size=4)
    assert eff.impl == "efficient" and naive.impl == "naive"
    q, k, v = qkv(b=3, h=3, sq=sq, sk=sk, dtype=torch.float32)
    g = torch.randn(3, 3, sq, 8, generator=torch.Generator().manual_seed(1))
    qm, km = masks(3, sq, sk, causal) if padded else (None, None)
    ref_out, ref_grads = run(naive, q, k, v, g, qm, km)
    out, grads = run(eff, q, k, v, g, qm, km)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(ref_grads) == (4 if scheme == "hnas" else 3)
    for got, want in zip(grads, ref_grads):
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if padded:  # padded queries give zero output, and padded keys get no gradient
        assert (out[1, :, -2:] == 0).all() and (out[2, :, :2] == 0).all()
        assert (grads[2][1, :, -3 if not causal else -2:] == 0).all()


@pytest.mark.parametrize("scheme,causal", [("dnas", True), ("sinkhorn", True), ("dnas", False), ("hnas", True)])
def test_many_blocks_float64(scheme, causal):
    """Many ragged blocks (block 2, length 23: twelve blocks, carries kept every fourth
    block and recomputed in between) agree with the reference to float64 precision."""
    loc = "decoder" if causal else "encoder"
    naive = build_core(scheme, heads=2, causal=causal, location=loc, impl="naive").double()
    eff = build_core(scheme, heads=2, causal=causal, location=loc, block_size=2).double()
    q, k, v = qkv(b=2, h=2, sq=23, sk=23, seed=4)
    g = torch.randn(2, 2, 23, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    qm, km = masks(3, 23, 23, causal)
    ref_out, ref_grads = run(naive, q, k, v, g, qm[1:], km[1:])
    out, grads = run(eff, q, k, v, g, qm[1:], km[1:])
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_prefix_backward_wide_spread_falls_back_exactly():
    """Scores spanning more than the hand-written backward's range take the autograd
    route for that block; the gradient is still the reference one."""
    naive = build_core("dnas", heads=2, causal=True, location="decoder", impl="naive").double()
    eff = build_core("dnas", heads=2, causal=True, location="decoder", block_size=3).double()
    q, k, v = qkv(b=1, h=2, sq=8, sk=8, seed=5)
    q, k = q * 25, k * 25  # |s_ij| in the thousands: prefix normalizers jump by > 600
    g = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref_out, ref_grads = run(naive, q, k, v, g)
    out, grads = run(eff, q, k, v, g)
    torch.testing.assert_close(out, ref_out)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("over_queries", [True, False])
def test_scores_lse_gradcheck(over_queries):
    """The chunked log-sum-exp (column or row) has the exact gradient w.r.t. q, k and both biases."""
    q, k, _ = (t.requires_grad_() for t in qkv(b=1, h=2, sq=5, sk=6, d=4))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 2, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    qm = torch.tensor([[True, True, False, True, True]])
    km = torch.tensor([[True, False, True, True, True, True]])
    f = lambda q, k, a, b: scores_lse(q, k, over_queries=over_queries, a=a, b=b, q_mask=qm, k_mask=km, block=2)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, a, b))
    # and the value is the masked logsumexp written out
    s = q @ k.transpose(-1, -2) / 2.0 - a[:, :, None, :] - b[:, :, :, None]
    s = s.masked_fill(~(qm[:, None, :, None] & km[:, None, None, :]), -math.inf)
    want = torch.logsumexp(s, dim=-2 if over_queries else -1)
    got = f(q, k, a, b)
    real = km[:, None, :] if over_queries else qm[:, None, :]
    torch.testing.assert_close(got[real.expand_as(got)], want[real.expand_as(want)])


def test_biased_sdpa_gradcheck():
    """SDPA with the detached bias plus the chunked bias gradient = exact gradient in c."""
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, sq=5, sk=6, d=4))
    c = torch.randn(1, 2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    km = torch.tensor([[True, True, False, True, True, True]])
    assert torch.autograd.gradcheck(lambda q, k, v, c: biased_sdpa(q, k, v, c, km, block=2), (q, k, v, c))


@pytest.mark.parametrize("causal,prefix", [(False, False), (False, True), (True, True)])
def test_dropout_gradient_is_exact(causal, prefix):
    """With dropout (training) the recomputed blocks redraw the forward's mask: the
    backward is the exact derivative of the (reseeded) forward."""
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, sq=6, sk=6, d=4))
    mask = torch.tensor([[True, True, True, True, False, True]])

    def f(q, k, v):
        torch.manual_seed(5)
        return dnas_attention(q, k, v, mask, mask, causal=causal, prefix=prefix, dropout_p=0.3, block_size=4)

    assert torch.autograd.gradcheck(f, (q, k, v))
    torch.testing.assert_close(f(q, k, v), f(q, k, v))  # reseeding reproduces the mask
    plain = dnas_attention(q, k, v, mask, mask, causal=causal, prefix=prefix, block_size=4)
    assert (f(q, k, v) - plain).abs().max() > 1e-3  # dropout really acts


@pytest.mark.parametrize("scheme,causal", [("dnas", False), ("dnas", True), ("hnas", False), ("sinkhorn", False)])
def test_bf16_autocast_close_to_float32(scheme, causal):
    loc = "decoder" if causal else "encoder"
    core = build_core(scheme, heads=4, causal=causal, location=loc, block_size=24)
    q, k, v = qkv(b=2, h=4, sq=64, sk=64, d=16, dtype=torch.float32)
    g = torch.randn(2, 4, 64, 16, generator=torch.Generator().manual_seed(0))
    ref_out, ref_grads = run(core, q, k, v, g)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = core(qq, kk, vv).out
    assert out.dtype == torch.bfloat16  # like SDPA under autocast
    (out.float() * g).sum().backward()
    # bf16 keeps ~3 significant digits; measured errors are ~1-2% of the largest entry
    assert (out.float() - ref_out).abs().max() < 0.03 * ref_out.abs().max()
    for got, want in zip((qq.grad, kk.grad, vv.grad), ref_grads):
        assert torch.isfinite(got).all()
        assert (got - want).abs().max() < 0.06 * want.abs().max()


def test_impl_option_is_validated():
    for cls, extra in ((DNAS, {}), (Sinkhorn, {"iterations": 2}), (HNAS, {"u_init": 0.2})):
        with pytest.raises(ValueError, match=r"attention\.impl must be one of efficient, naive, flex, triton \(got 'fast'\)"):
            cls(heads=2, impl="fast", **extra)
        assert cls(heads=2, impl="naive", **extra).impl == "naive"
        assert cls(heads=2, **extra).impl == "auto"  # the default, as in conf/attention/*.yaml (one default)


def _peak_bytes(core, q, k, v, g):
    bench = pytest.importorskip("nas_cli.bench.attention")

    def step():
        core(q, k, v).out.backward(g)
        for t in (q, k, v):
            t.grad = None

    try:
        return bench._cpu_peak_bytes(step)
    except AttributeError as err:  # the profiler's allocation records moved in this torch
        pytest.skip(f"torch.profiler allocation records unavailable: {err}")


@pytest.mark.parametrize("scheme,causal", [("dnas", False), ("dnas", True), ("hnas", True), ("sinkhorn", False)])
def test_efficient_path_never_holds_a_full_score_matrix(scheme, causal):
    """Peak CPU allocation of forward + backward (torch.profiler allocation records) at
    S = 1024: the naive path holds several (B, H, S, S) float32 matrices, the efficient
    path less than half of one (a few (B, H, 64, S) tiles plus O(S d) tensors)."""
    s, b, h = 1024, 1, 2
    full = b * h * s * s * 4
    loc = "decoder" if causal else "encoder"
    q, k, v = (t.requires_grad_() for t in qkv(b=b, h=h, sq=s, sk=s, d=16, dtype=torch.float32))
    g = torch.randn(b, h, s, 16)
    naive = _peak_bytes(build_core(scheme, heads=h, causal=causal, location=loc, impl="naive"), q, k, v, g)
    eff = _peak_bytes(build_core(scheme, heads=h, causal=causal, location=loc, block_size=64), q, k, v, g)
    assert naive > 4 * full  # the measurement sees the materialized matrices
    assert eff < 0.5 * full, f"efficient peak {eff / full:.2f} x one score matrix"
