"""``attention.impl=triton`` (issues #30, #48): the Triton kernels of DNAS, the prefix form
(decoder self- and cross-attention) and the encoder form, run on the CPU by Triton's interpreter
(TRITON_INTERPRET=1) at small sizes, against the float64 reference formula (the naive path of the
DNAS core), values and q/k/v gradients; causality (perturbing the future changes nothing, exactly);
the encoder form's deterministic backward and its bf16/fp16 error against SDPA's own; HNAS's mix
with u's gradient; the dispatch and its refusals."""
import os
import sys

import pytest
import torch

triton = pytest.importorskip("triton", reason="pip install triton (the [test] extra has it)")

from helpers import build_core, compose_cfg, run_command  # noqa: E402
from nas_cli.attention.base import AttentionCore  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Triton's CPU interpreter: tests/conftest.py sets TRITON_INTERPRET=1 before anything imports Triton."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET=1 must be set before Triton is imported (tests/conftest.py does)")


def _inputs(b, h, sq, sk, d, dv, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, s, w, generator=g, dtype=torch.float64) * 1.5).to(dtype).requires_grad_()
            for s, w in ((sq, d), (sk, d), (sk, dv))]


def _grad_err(got, want) -> float:
    """The largest of the q/k/v gradients' max |error| relative to each reference's largest entry."""
    return max(((a.double() - w).abs().max() / w.abs().max()).item() for a, w in zip(got, want))


def _masks(b, sq, sk, causal):
    qm = torch.ones(b, sq, dtype=torch.bool)
    qm[0, -3:] = False
    km = qm.clone() if causal else torch.ones(b, sk, dtype=torch.bool)
    if not causal:
        km[-1, -5:] = False
    return qm, km


def _reference(q, k, v, qm, km, causal):
    """The naive formula of the DNAS core (float64), the package's reference for every path."""
    core = build_core("dnas", heads=q.size(1), causal=causal, location="decoder" if causal else "cross",
                      impl="naive").double()
    return AttentionCore.forward(core, q, k, v, qm, km).out


@pytest.mark.parametrize("case", [
    # (B, H, Sq, Sk, D, Dv, causal, padded, block_q, block_k): lengths not multiples of the blocks
    (2, 2, 37, 37, 8, 8, True, False, 16, 16),
    (1, 2, 45, 45, 16, 12, True, True, 32, 16),
    (2, 1, 29, 51, 8, 8, False, True, 16, 32),   # cross-attention: prefix over the queries, all keys
    (1, 1, 70, 70, 12, 4, True, True, 32, 32),
])
def test_values_and_gradients_equal_the_float64_reference(case):
    from nas_cli.attention.triton_prefix import prefix_dnas_triton

    b, h, sq, sk, d, dv, causal, padded, bq, bk = case
    q, k, v = _inputs(b, h, sq, sk, d, dv, seed=sq)
    qm, km = _masks(b, sq, sk, causal) if padded else (None, None)
    out = prefix_dnas_triton(q, k, v, qm, km, causal=causal, block_q=bq, block_k=bk)
    ref = _reference(q, k, v, qm, km, causal)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=0, atol=1e-11)
    if padded:  # padded queries give exactly 0
        assert out[0, :, -3:].abs().max() == 0


@pytest.mark.parametrize("causal", [True, False])
def test_prefix_tiles_past_the_diagonal_take_the_carry_as_reference_and_stay_exact(causal, monkeypatch):
    """A tile whose keys all come before its first query (every tile off the diagonal in causal attention,
    every query block after the first in cross-attention) needs no causal test and takes each key's carry
    as its reference (no reduction down the tile's rows). Where a real key has no real query
    before the tile (queries padded on the left, the key mask apart), its carry is empty and the column
    takes the exact log-space path. Values and q/k/v gradients equal the float64 formula. (Taking the
    carry where the tile holds a key's first real row is exact too, by that same path, only slower; the
    causal test skipped on a diagonal tile lets a query see the future: test_the_future_changes_nothing.)"""
    import nas_cli.attention.triton_prefix as tp

    b, h, sq, sk, bq, bk = 2, 2, 64, 64 if causal else 50, 16, 16
    q, k, v = _inputs(b, h, sq, sk, 8, 8, seed=7)
    qm, km = torch.ones(b, sq, dtype=torch.bool), torch.ones(b, sk, dtype=torch.bool)
    qm[0, :40] = False  # 40 padded queries first: two whole query blocks and half of a third
    km[1, -5:] = False
    out = tp.prefix_dnas_triton(q, k, v, qm, km, causal=causal, block_q=bq, block_k=bk)
    ref = _reference(q, k, v, qm, km, causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    for a, w in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, w, rtol=0, atol=1e-11)
    assert out[0, :, :40].abs().max() == 0


@pytest.mark.parametrize("causal, low_row", [(True, False), (False, False), (False, True)])
def test_prefix_kernels_stay_exact_where_a_tile_spreads_beyond_the_linear_fast_path(causal, low_row, monkeypatch):
    """The prefix normalizer's fast path sums exp(s - ref) in linear space (one exponential and one
    logarithm per score instead of a log-add-exp scan); a pair whose prefix sum would leave that range (a
    later row's score ~1000 above the column's reference, past float64's exp) takes the log-space scan.
    ``low_row``: an earlier query outscores the later ones by 1700 or more on every key (cross-attention),
    so the later rows' log-sum-exps are below -1700 and their backward weights take the logarithm, not
    e / S exp(-lse). Values and q/k/v gradients still equal the float64 formula, and the same input with
    the guard switched off is wrong: the fallbacks are what these inputs exercise."""
    import triton.language as tl

    from nas_cli.attention import triton_prefix_kernels as kernels
    from nas_cli.attention.triton_prefix import prefix_dnas_triton

    q, k, v = _inputs(1, 2, 45, 45, 8, 8, seed=11)
    with torch.no_grad():
        if low_row:  # every key aligned with query 10, which outscores the later rows by ~1000
            k[..., 0] = k[..., 0].abs() + 1.0
            q[:, :, 10] = 0.0
            q[:, :, 10, 0] = 5000.0
        else:
            q[:, :, 21] *= 1000.0  # one query row in the second block of 16: its tile mixes both paths
            q[:, :, 40] *= -700.0
    qm, km = _masks(1, 45, 45, causal)

    def run():
        out = prefix_dnas_triton(q, k, v, qm, km, causal=causal, block_q=16, block_k=16)
        return out, torch.autograd.grad(out, (q, k, v), g)

    ref = _reference(q, k, v, qm, km, causal)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=ref.dtype)
    want = torch.autograd.grad(ref, (q, k, v), g)
    out, got = run()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-12, atol=1e-10 * w.abs().max().item())
    if low_row:  # the weights from e / S exp(-lse) in every tile: 0 * inf
        monkeypatch.setattr(kernels, "LSE_FLOOR", tl.constexpr(-1.0e30))
        with pytest.warns(RuntimeWarning):  # exp(-lse) overflows, 0 * inf
            _, wrong = run()
        assert not all(torch.allclose(a, w, atol=1e-3) for a, w in zip(wrong, want))
    else:
        monkeypatch.setattr(kernels, "HUGE", tl.constexpr(float("inf")))
        wrong, _ = run()
        assert not torch.allclose(wrong, ref, atol=1e-3)


@pytest.mark.parametrize("scheme, causal", [("dnas", True), ("hnas", False)])
def test_prefix_kernels_in_chunks_of_queries_equal_the_float64_formula(scheme, causal, monkeypatch):
    """Long sequences run in chunks of queries (memory linear in the length): the carries of one
    chunk at a time, each chunk starting from the column log-sum-exps of the rows before it, and the
    backward rebuilding each chunk's carries, from the last chunk to the first. With chunks of 32 rows (2
    blocks of 16; lengths that are not multiples of either, padding): values and q/k/v (and u)
    gradients equal the one-chunk kernels' to rounding (and DNAS's the float64 formula to 1e-12 / 1e-11);
    two backward passes give the same bits."""
    from nas_cli.attention import triton_prefix
    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    q, k, v = _inputs(2, 2, 45, 45 if causal else 29, 8, 8, seed=7)
    qm, km = _masks(2, 45, k.size(-2), causal)
    u = torch.tensor([0.35, 0.7], dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 2, 45, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    leaves = (q, k, v, u) if scheme == "hnas" else (q, k, v)

    def forward():
        if scheme == "hnas":
            return prefix_hnas_triton(q, k, v, u, qm, km, causal=causal, block_q=16, block_k=16)
        return prefix_dnas_triton(q, k, v, qm, km, causal=causal, block_q=16, block_k=16)

    whole = forward()
    whole_grads = torch.autograd.grad(whole, leaves, g)
    monkeypatch.setattr(triton_prefix, "CHUNK_Q", 32)
    assert triton_prefix._chunks(45, 16) == [(0, 2), (32, 1)]
    out = forward()
    grads, again = (torch.autograd.grad(out, leaves, g, retain_graph=True) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(grads, again))
    torch.testing.assert_close(out, whole, rtol=0, atol=1e-13)
    for a, b in zip(grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    if scheme == "dnas":
        ref = _reference(q, k, v, qm, km, causal)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        for a, w in zip(grads, torch.autograd.grad(ref, (q, k, v), g)):
            torch.testing.assert_close(a, w, rtol=0, atol=1e-11)


def test_float32_within_documented_tolerance():
    from nas_cli.attention.triton_prefix import prefix_dnas_triton

    q, k, v = _inputs(1, 2, 40, 40, 16, 16, seed=3, dtype=torch.float32)
    out = prefix_dnas_triton(q, k, v, causal=True)
    g = torch.ones_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _reference(q64, k64, v64, None, None, True)
    want = torch.autograd.grad(ref, (q64, k64, v64), g.double())
    assert (out.double() - ref).abs().max() < 1e-5
    for a, w in zip(got, want):
        assert (a.double() - w).abs().max() < 1e-4 * max(1.0, w.abs().max().item())


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_the_future_changes_nothing(scheme):
    """Causality, exactly: perturbing every position after t changes no output at or before t, for DNAS's
    prefix kernels and for HNAS's (both parts from the same passes)."""
    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    u = torch.tensor([0.3, 0.7], dtype=torch.float64)

    def run(*x):
        if scheme == "hnas":
            return prefix_hnas_triton(*x, u, causal=True, block_q=16, block_k=16)
        return prefix_dnas_triton(*x, causal=True, block_q=16, block_k=16)

    q, k, v = (t.detach() for t in _inputs(1, 2, 48, 48, 8, 8, seed=5))
    base = run(q, k, v)
    # perturb every position after `cut` (within and across blocks); x1000: the later rows' scores leave the
    # prefix normalizer's linear fast path, and their tile takes the log-space scan for those pairs alone
    for cut, size in ((7, 3.0), (16, 3.0), (31, 3.0), (7, 1000.0), (20, 1000.0)):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for t in (q2, k2, v2):
            t[:, :, cut + 1:] += torch.randn_like(t[:, :, cut + 1:]) * size
        out = run(q2, k2, v2)
        assert torch.equal(out[:, :, :cut + 1], base[:, :, :cut + 1])
        assert not torch.equal(out[:, :, cut + 1:], base[:, :, cut + 1:])


def test_dnas_and_hnas_cores_dispatch_to_triton_with_the_same_values():
    torch.manual_seed(0)  # one tile (the multi-tile lengths are the other tests'): the interpreter's scans are slow
    q, k, v = _inputs(2, 4, 21, 21, 8, 8, seed=9)
    qm, km = _masks(2, 21, 21, True)
    for scheme in ("dnas", "hnas"):
        tri = build_core(scheme, heads=4, causal=True, location="decoder", impl="triton").double()
        ref = build_core(scheme, heads=4, causal=True, location="decoder", impl="naive").double()
        if scheme == "hnas":
            with torch.no_grad():
                tri.u_logit.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=torch.float64))
                ref.u_logit.copy_(tri.u_logit)
        tri.eval(), ref.eval()
        import nas_cli.attention.triton_prefix as tp

        calls, name = [], f"prefix_{scheme}_triton"  # HNAS: both parts from the same passes
        real = getattr(tp, name)
        setattr(tp, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
        try:
            out = tri(q, k, v, qm, km).out
        finally:
            setattr(tp, name, real)
        assert calls, f"{scheme}: impl=triton did not run the kernels"
        want = ref(q, k, v, qm, km).out
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
        if scheme == "hnas":  # u's gradient through the mix
            gu = torch.autograd.grad(out.sum(), tri.u_logit)[0]
            gw = torch.autograd.grad(want.sum(), ref.u_logit)[0]
            torch.testing.assert_close(gu, gw, rtol=1e-10, atol=1e-12)
        # the encoder form (full column sums) runs its own kernels, same values
        enc = build_core(scheme, heads=4, causal=False, location="encoder", impl="triton").double().eval()
        enc_ref = build_core(scheme, heads=4, causal=False, location="encoder", impl="naive").double().eval()
        if scheme == "hnas":
            with torch.no_grad():
                enc.u_logit.copy_(torch.tensor([1.5, -0.5, 0.0, -2.0], dtype=torch.float64))
                enc_ref.u_logit.copy_(enc.u_logit)
        import nas_cli.attention.triton_encoder as te

        kernel = f"encoder_{scheme}_triton"  # HNAS: both parts from the same passes
        calls, real_enc = [], getattr(te, kernel)
        setattr(te, kernel, lambda *a, **kw: calls.append(1) or real_enc(*a, **kw))
        try:
            got = enc(q, k, v, qm, qm).out
        finally:
            setattr(te, kernel, real_enc)
        assert calls, f"{scheme}: impl=triton did not run the encoder kernels"
        want = enc_ref(q, k, v, qm, qm).out
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        if scheme == "hnas":
            gu = torch.autograd.grad(got.sum(), enc.u_logit)[0]
            gw = torch.autograd.grad(want.sum(), enc_ref.u_logit)[0]
            torch.testing.assert_close(gu, gw, rtol=1e-10, atol=1e-12)


def test_impl_triton_refused_with_one_line_where_it_cannot_run(tmp_path):
    # without CUDA and without the interpreter: refused before anything is made
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    nas_run = os.path.join(os.path.dirname(sys.executable), "nas-run")
    for extra, words in [((), "Triton kernels run on CUDA GPUs"),
                         (("trainer.deterministic=true",), "Triton kernels run on CUDA GPUs")]:
        proc = run_command([nas_run, "attention=dnas", "attention.impl=triton", "debug=fast", *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-1500:]
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "outputs").exists()
    # where it can run (the interpreter here), a malformed prefix-tile setting is refused before the run
    proc = run_command([nas_run, "attention=dnas", "attention.impl=triton", "debug=fast"], cwd=tmp_path,
                       env={**os.environ, "NAS_TRITON_PREFIX_TILES": "64"}, capture_output=True, text=True,
                       timeout=120)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert proc.stderr.strip().splitlines()[-1].startswith("nas-run: error: NAS_TRITON_PREFIX_TILES='64'")
    assert "Traceback" not in proc.stderr and not (tmp_path / "outputs").exists()


def test_impl_triton_for_every_location_passes_the_checks_and_names_the_chunked_ones(capsys, monkeypatch):
    """Found on an H200: ``attention=dnas attention.impl=triton`` (every location, the encoder too)
    crashed in the pre-run check (an AttributeError) instead of saying which locations keep the
    chunked path; only the decoder-level spelling had been run. The check returns the note; the check
    before Hydra says it and the job's check records it in the run's log (said once)."""
    from nas_cli.pipeline.checks.config import check_config

    def notes(*overrides):
        return check_config(compose_cfg(*overrides, "trainer.accelerator=cpu")).notes

    assert notes("attention=dnas", "attention.impl=triton") == ()  # every location runs kernels, the encoder too
    said = notes("attention=sinkhorn", "attention.impl=triton")
    assert len(said) == 1 and "Sinkhorn-k at decoder, cross (prefix-normalized) uses the chunked" in said[0]
    assert notes("attention.encoder=sinkhorn", "attention.encoder.impl=triton") == ()  # kernels: no note
    assert capsys.readouterr().err == ""  # the check itself prints nothing
    # no atomics in either form's backward: trainer.deterministic=true takes them
    check_config(compose_cfg("attention=dnas", "attention.impl=triton", "trainer.deterministic=true",
                             "trainer.accelerator=cpu"))
    from nas_cli.attention.dnas import auto_picks_fused

    torch.use_deterministic_algorithms(True)
    try:  # impl=auto under determinism: the Triton kernels still (on CUDA), FlexAttention not
        assert auto_picks_fused("cuda", 4096, atomics=False) and not auto_picks_fused("cuda", 4096)
    finally:
        torch.use_deterministic_algorithms(False)


# ---- the encoder form ----------------------------------------------------------------
def _encoder_reference(q, k, v, qm, km):
    core = build_core("dnas", heads=q.size(1), causal=False, location="encoder", impl="naive").double()
    return AttentionCore.forward(core, q, k, v, qm, km).out


@pytest.mark.parametrize("case", [
    # (B, H, Sq, Sk, D, Dv, padded, block_q, block_k): lengths not multiples of the blocks, then multiples
    # (the kernels' EVEN case: no bounds test), with padding and without
    (2, 2, 37, 45, 16, 19, True, 32, 32),
    (1, 3, 33, 33, 8, 8, False, 16, 16),
    (2, 1, 64, 20, 24, 24, True, 16, 32),
    (2, 2, 64, 32, 16, 12, True, 32, 16),
    (1, 2, 32, 64, 8, 8, False, 16, 32),
])
def test_encoder_kernels_equal_the_float64_reference(case, monkeypatch):
    import nas_cli.attention.triton_encoder as te

    b, h, sq, sk, d, dv, padded, bq, bk = case
    q, k, v = _inputs(b, h, sq, sk, d, dv, seed=sq + sk)
    qm = km = None
    if padded:
        qm, km = torch.ones(b, sq, dtype=torch.bool), torch.ones(b, sk, dtype=torch.bool)
        qm[0, -5:] = False
        km[-1, -7:] = False
    even, real = [], te.launch
    monkeypatch.setattr(te, "launch", lambda *a, **kw: even.append(a[6]["EVEN"]) or real(*a, **kw))
    out = te.encoder_dnas_triton(q, k, v, qm, km, block_q=bq, block_k=bk)
    want = _encoder_reference(q, k, v, qm, km)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    for got, ref in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-11)
    assert even == [sq % bq == 0 and sk % bk == 0] * 4  # the forward's two passes and the backward's two


@pytest.mark.parametrize("case", [
    # (B, H, Sq, Sk, D, Dv, padded, block_q, block_k): lengths not multiples of the blocks
    (2, 3, 37, 45, 16, 19, True, 32, 16),
    (1, 2, 20, 33, 8, 8, False, 16, 16),
    (1, 2, 32, 48, 8, 8, True, 16, 16),   # multiples of the blocks (EVEN), padded
])
def test_hnas_encoder_kernels_equal_the_float64_formula(case):
    """HNAS's encoder form from one pass: u O_DNAS + (1 - u) O_softmax per head, values
    and the gradients of q, k, v and u, against Ding et al.'s formula written out in float64."""
    from nas_cli.attention.base import masked_row_softmax
    from nas_cli.attention.doubly import doubly_normalized_logits
    from nas_cli.attention.triton_encoder import encoder_hnas_triton

    b, h, sq, sk, d, dv, padded, bq, bk = case
    q, k, v = _inputs(b, h, sq, sk, d, dv, seed=sq * sk)
    qm, km = torch.ones(b, sq, dtype=torch.bool), torch.ones(b, sk, dtype=torch.bool)
    if padded:
        qm[0, -5:] = False
        km[-1, -7:] = False
    u = torch.linspace(0.1, 0.9, h, dtype=torch.float64).requires_grad_()
    allowed = qm[:, None, :, None] & km[:, None, None, :]
    s = q @ k.transpose(-1, -2) / d ** 0.5
    dn = masked_row_softmax(doubly_normalized_logits(s, allowed, False), allowed)
    w = u[None, :, None, None]
    want = ((w * dn + (1 - w) * masked_row_softmax(s, allowed)) @ v) * qm[:, None, :, None]
    got = encoder_hnas_triton(q, k, v, u, qm if padded else None, km if padded else None, block_q=bq, block_k=bk)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g = torch.randn_like(want)
    for a, r in zip(torch.autograd.grad(got, (q, k, v, u), g), torch.autograd.grad(want, (q, k, v, u), g)):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", [
    # (B, H, Sq, Sk, D, Dv, causal, block_q, block_k): lengths not multiples of the blocks, padded
    (2, 3, 37, 37, 16, 12, True, 16, 32),
    (2, 2, 29, 45, 8, 8, False, 32, 16),   # cross-attention: prefix over the queries, all keys
])
def test_hnas_prefix_kernels_equal_the_float64_formula(case):
    """HNAS's prefix form from one pass: u O_DNAS + (1 - u) O_softmax per head with the
    prefix column normalizer, softmax attention under the same mask (causal where DNAS is); values
    and the gradients of q, k, v and u against the formula written out in float64."""
    from nas_cli.attention.base import masked_row_softmax
    from nas_cli.attention.doubly import doubly_normalized_logits
    from nas_cli.attention.triton_prefix import prefix_hnas_triton

    b, h, sq, sk, d, dv, causal, bq, bk = case
    q, k, v = _inputs(b, h, sq, sk, d, dv, seed=sq + 3 * sk)
    qm, km = _masks(b, sq, sk, causal)
    u = torch.linspace(0.15, 0.85, h, dtype=torch.float64).requires_grad_()
    allowed = qm[:, None, :, None] & km[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(sq, sk, dtype=torch.bool).tril()
    s = q @ k.transpose(-1, -2) / d ** 0.5
    dn = masked_row_softmax(doubly_normalized_logits(s, allowed, True), allowed)
    w = u[None, :, None, None]
    want = ((w * dn + (1 - w) * masked_row_softmax(s, allowed)) @ v) * qm[:, None, :, None]
    got = prefix_hnas_triton(q, k, v, u, qm, km, causal=causal, block_q=bq, block_k=bk)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g = torch.randn_like(want)
    for a, r in zip(torch.autograd.grad(got, (q, k, v, u), g), torch.autograd.grad(want, (q, k, v, u), g)):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", [
    # (B, H, Sq, Sk, D, Dv, iterations, padded, block_q, block_k): lengths not multiples of the blocks
    (2, 2, 37, 45, 16, 19, 3, True, 32, 16),
    (1, 2, 20, 33, 8, 8, 2, False, 16, 16),
    (1, 2, 32, 48, 8, 8, 2, True, 16, 16),   # multiples of the blocks (EVEN), padded
])
def test_sinkhorn_encoder_kernels_equal_the_float64_reference(case):
    """Sinkhorn-k's encoder form as 2k fused passes: values and q/k/v gradients against the
    naive Sinkhorn core (k materialized column-row normalizations, autograd's backward) in float64,
    and the core dispatches to them with impl=triton."""
    from nas_cli.attention.triton_encoder import encoder_dnas_triton

    b, h, sq, sk, d, dv, iters, padded, bq, bk = case
    q, k, v = _inputs(b, h, sq, sk, d, dv, seed=sq + iters)
    qm = km = None
    if padded:
        qm, km = torch.ones(b, sq, dtype=torch.bool), torch.ones(b, sk, dtype=torch.bool)
        qm[0, -5:] = False
        km[-1, -7:] = False
    ref = build_core("sinkhorn", heads=h, causal=False, location="encoder", impl="naive", iterations=iters).double()
    want = AttentionCore.forward(ref, q, k, v, qm, km).out
    got = encoder_dnas_triton(q, k, v, qm, km, iterations=iters, block_q=bq, block_k=bk)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g = torch.randn_like(want)
    for a, r in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-11)
    import nas_cli.attention.triton_encoder as te

    tri = build_core("sinkhorn", heads=h, causal=False, location="encoder", impl="triton", iterations=iters).double()
    calls, real = [], te._TritonSinkhorn.apply
    te._TritonSinkhorn.apply = lambda *a: calls.append(a[5]) or real(*a)
    try:
        out = tri(q, k, v, qm, km).out
    finally:
        te._TritonSinkhorn.apply = real
    assert calls == [iters]
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme", ["dnas", "hnas", "sinkhorn"])
def test_encoder_backward_is_deterministic_and_low_precision_is_within_sdpas_own_error(scheme):
    """Two backward passes give the same bits (no atomics: trainer.deterministic can use it); float32 within
    1e-5 of float64 (gradients 1e-4, relative); bf16 and fp16 (tensor-core products, float32 accumulation)
    within 2x the error SDPA's softmax attention makes in the same dtype on the same inputs, values and
    q/k/v gradients. HNAS: u = 0.3 and 0.8 per head; Sinkhorn-3 against its naive core."""
    import torch.nn.functional as F

    from nas_cli.attention.triton_encoder import encoder_dnas_triton, encoder_hnas_triton

    q, k, v = _inputs(2, 2, 40, 40, 32, 32, seed=5)
    qm = torch.ones(2, 40, dtype=torch.bool)
    qm[0, -5:] = False
    u = torch.tensor([0.3, 0.8])
    want = _encoder_reference(q, k, v, qm, qm)
    if scheme == "sinkhorn":
        want = AttentionCore.forward(build_core("sinkhorn", heads=2, location="encoder", impl="naive", iterations=3)
                                     .double(), q, k, v, qm, qm).out
    if scheme == "hnas":
        w = u.double()[None, :, None, None]
        sm = F.scaled_dot_product_attention(q, k, v, attn_mask=qm[:, None, None, :]) * qm[:, None, :, None]
        want = w * want + (1 - w) * sm

    want_grads = torch.autograd.grad(want, (q, k, v), torch.ones_like(want))

    def sdpa_grads(dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*x)
        return torch.autograd.grad(out, x, torch.ones_like(out))

    def kernel(*x):
        if scheme == "hnas":
            return encoder_hnas_triton(*x, u, qm, qm)
        return encoder_dnas_triton(*x, qm, qm, iterations=3 if scheme == "sinkhorn" else 1)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = kernel(*x)
        assert out.dtype == dtype
        grads = [torch.autograd.grad(out, x, torch.ones_like(out), retain_graph=True) for _ in range(2)]
        assert all(torch.equal(a, b) for a, b in zip(*grads)), dtype
        err = (out.double() - want).abs().max().item()
        if dtype == torch.float32:
            assert err < 1e-5 and _grad_err(grads[0], want_grads) < 1e-4, err
            continue
        with torch.no_grad():
            sdpa = (F.scaled_dot_product_attention(*(t.to(dtype) for t in (q, k, v))).double()
                    - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
        assert err <= 2 * sdpa, (dtype, err, sdpa)
        gerr, sdpa_gerr = _grad_err(grads[0], want_grads), _grad_err(sdpa_grads(dtype), sdpa_grads(torch.float64))
        assert gerr <= 2 * sdpa_gerr, (dtype, gerr, sdpa_gerr)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_prefix_backward_is_deterministic_and_low_precision_is_within_sdpas_own_error(scheme):
    """The prefix form's dQ has its own pass: two backward passes give the same bits;
    bf16/fp16 (tensor-core products) within 2x the error causal SDPA makes in the same dtype, values and
    q/k/v gradients. HNAS: u = 0.3 and 0.8 per head, both parts from the same passes."""
    import torch.nn.functional as F

    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    q, k, v = _inputs(1, 2, 24, 24, 16, 16, seed=6)
    want = _reference(q, k, v, None, None, True)
    u = torch.tensor([0.3, 0.8])
    if scheme == "hnas":
        w = u.double()[None, :, None, None]
        want = w * want + (1 - w) * F.scaled_dot_product_attention(q, k, v, is_causal=True)

    want_grads = torch.autograd.grad(want, (q, k, v), torch.ones_like(want))

    def sdpa_grads(dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*x, is_causal=True)
        return torch.autograd.grad(out, x, torch.ones_like(out))

    def kernel(*x):
        if scheme == "hnas":
            return prefix_hnas_triton(*x, u, causal=True, block_q=16, block_k=16)
        return prefix_dnas_triton(*x, causal=True, block_q=16, block_k=16)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = kernel(*x)
        grads = [torch.autograd.grad(out, x, torch.ones_like(out), retain_graph=True) for _ in range(2)]
        assert all(torch.equal(a, b) for a, b in zip(*grads)), dtype
        err = (out.double() - want).abs().max().item()
        if dtype == torch.float32:
            assert err < 1e-5 and _grad_err(grads[0], want_grads) < 1e-4, err
            continue
        with torch.no_grad():
            sdpa = (F.scaled_dot_product_attention(*(t.to(dtype) for t in (q, k, v)), is_causal=True).double()
                    - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item()
        assert err <= 2 * sdpa, (dtype, err, sdpa)
        gerr, sdpa_gerr = _grad_err(grads[0], want_grads), _grad_err(sdpa_grads(dtype), sdpa_grads(torch.float64))
        assert gerr <= 2 * sdpa_gerr, (dtype, gerr, sdpa_gerr)


def test_autotuned_tiles_give_the_same_values_and_can_be_fixed(monkeypatch):
    """On a GPU the encoder kernels' tiles are autotuned (Triton's autotuner over the candidates of
    nas_cli/attention/triton_tiles.py). Here the autotuner runs under the interpreter with a
    CPU timer in place of the GPU's: every kernel of DNAS and Sinkhorn-2 picks a candidate of its
    table, and the values and gradients equal the float64 reference; NAS_TRITON_TILES=fixed turns it off.
    Each compile-time case and length bucket has its own key."""
    import time

    from nas_cli.attention import triton_encoder_kernels as K
    from nas_cli.attention import triton_tiles as tt
    from nas_cli.attention.triton_encoder import encoder_dnas_triton

    def cpu_timer(fn, quantiles=None):
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return [ms] * len(quantiles) if quantiles else ms

    monkeypatch.setattr(tt, "BENCH", cpu_timer)
    assert tt.autotuning()
    q, k, v = _inputs(1, 2, 40, 40, 16, 16, seed=11)
    qm = torch.ones(1, 40, dtype=torch.bool)
    qm[0, -6:] = False
    for iters in (1, 2):
        ref = build_core("sinkhorn", heads=2, location="encoder", impl="naive", iterations=iters).double()
        want = AttentionCore.forward(ref, q, k, v, qm, qm).out
        got = encoder_dnas_triton(q, k, v, qm, qm, iterations=iters)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        g = torch.randn_like(want)
        for a, r in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
            torch.testing.assert_close(a, r, rtol=0, atol=1e-11)
    for kernel, table in ((K.col_kernel, tt.FORWARD), (K.row_kernel, tt.FORWARD), (K.bwd_kv_kernel, tt.BACKWARD),
                          (K.bwd_q_kernel, tt.BACKWARD)):
        best = tt.chosen(kernel, table)
        assert best is not None and (best["BQ"], best["BK"], best["num_warps"], best["num_stages"]) in table
    assert tt.tuning_key(0, {"HAS_QM": True}) != tt.tuning_key(0, {"HAS_QM": False}) != tt.tuning_key(1, {})
    # EVEN (no bounds test) only where every candidate tile of the table divides both lengths
    assert tt.tiles_divide(256, 128, tt.FORWARD) and tt.tiles_divide(128, 128, tt.BACKWARD)
    assert not tt.tiles_divide(256, 64, tt.FORWARD) and not tt.tiles_divide(64, 128, tt.BACKWARD)
    assert tt.tiles_divide(64, 32, tt.FORWARD, 32, 32) and not tt.tiles_divide(64, 32, tt.FORWARD, 32, 64)
    torch.use_deterministic_algorithms(True)
    try:  # trainer.deterministic: tiles chosen by timing could differ between runs, so fixed ones
        assert not tt.autotuning()
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setenv("NAS_TRITON_TILES", "fixed")
    assert not tt.autotuning()
    assert tt.length_bucket(100, 2047) == 0 and tt.length_bucket(2048, 10) == 1 and tt.length_bucket(9000, 1) == 2


def test_prefix_tiles_are_tuned_jointly_for_all_passes_and_can_be_set(monkeypatch):
    """The prefix form's four passes share one BQ (the carry's layout), so on a GPU its tiles are tuned
    jointly: each candidate runs the whole forward and backward once and the fastest is kept per
    case. Here with a CPU timer under the interpreter: DNAS and HNAS keep a candidate of the table, one per
    case, and the values and gradients equal the float64 reference with those tiles;
    NAS_TRITON_PREFIX_TILES sets them, and a malformed value is refused in one line that names it."""
    import time

    from nas_cli.attention import triton_tiles as tt
    from nas_cli.attention.triton_prefix import prefix_dnas_triton, prefix_hnas_triton

    timed = []

    def cpu_timer(fn, quantiles=None):
        t0 = time.perf_counter()
        fn()
        timed.append(1)
        return (time.perf_counter() - t0) * 1e3

    monkeypatch.setattr(tt, "BENCH", cpu_timer)
    monkeypatch.setattr(tt, "PREFIX", ((16, 32, 4, 2), (32, 16, 4, 2)))
    monkeypatch.setattr(tt, "_PREFIX_KEPT", {})
    q, k, v = _inputs(1, 2, 37, 37, 8, 8, seed=4)
    qm, km = _masks(1, 37, 37, True)
    u = torch.tensor([0.25, 0.6], dtype=torch.float64, requires_grad=True)
    g = torch.randn(1, 2, 37, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    ref = _reference(q, k, v, qm, km, True)
    got = prefix_dnas_triton(q, k, v, qm, km, causal=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    for a, w in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, w, rtol=0, atol=1e-11)
    assert len(timed) == 2  # each candidate once
    prefix_dnas_triton(q, k, v, qm, km, causal=True)
    assert len(timed) == 2  # the same case: kept
    hnas = prefix_hnas_triton(q, k, v, u, qm, km, causal=True)
    assert len(timed) == 4  # HNAS is a case of its own
    kept = tt.prefix_chosen()
    assert len(kept) == 2 and all((t["BQ"], t["BK"], t["num_warps"], t["num_stages"]) in tt.PREFIX
                                  for t in kept.values())
    assert torch.isfinite(hnas).all()

    monkeypatch.setenv("NAS_TRITON_PREFIX_TILES", "16x16")
    assert tt.prefix_tiles(("other",), False, False, None) == (16, 16, None, None)
    torch.testing.assert_close(prefix_dnas_triton(q, k, v, qm, km, causal=True), ref, rtol=0, atol=1e-12)
    monkeypatch.setenv("NAS_TRITON_PREFIX_TILES", "48x16")
    with pytest.raises(ValueError, match="NAS_TRITON_PREFIX_TILES='48x16'"):
        prefix_dnas_triton(q, k, v, qm, km, causal=True)
    monkeypatch.delenv("NAS_TRITON_PREFIX_TILES")
    monkeypatch.setattr(tt, "BENCH", None)  # the interpreter without a timer: fixed tiles
    assert tt.prefix_tiles(("new",), True, False, None) == (tt.FIXED_Q, tt.FIXED_K, None, None)
    torch.use_deterministic_algorithms(True)
    try:  # deterministic runs on CUDA: the fixed low-precision tiles, never a timed choice
        assert tt.prefix_tiles(("new",), True, True, None) == tt.PREFIX_FIXED_LOWP
    finally:
        torch.use_deterministic_algorithms(False)
