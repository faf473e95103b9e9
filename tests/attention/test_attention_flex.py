"""attention.impl=flex (FlexAttention, encoder form): values against the naive formulas on the
CPU (forward: PyTorch has no CPU backward for it), the dispatch of impl=flex / impl=auto,
and the one-line refusal to train with it where it cannot. Gradients are checked on a GPU
by ``nas-bench gpu-check``; the GPU test here skips without one."""
from __future__ import annotations

import pytest
import torch

from helpers import build_core, compose_cfg, qkv
from nas_cli.attention import dnas as dnas_mod
from nas_cli.attention.flex import dnas_flex, flex_unavailable, hnas_flex

pytest.importorskip("torch.nn.attention.flex_attention")


def _masks(b=2, sq=7, sk=7):
    q_mask = torch.ones(b, sq, dtype=torch.bool)
    k_mask = torch.ones(b, sk, dtype=torch.bool)
    q_mask[1, 5:] = False
    k_mask[1, 4:] = False
    return q_mask, k_mask


@pytest.mark.parametrize("scheme", ["dnas", "sinkhorn", "hnas"])
def test_flex_forward_equals_the_naive_formula(scheme):
    q, k, v = qkv(sq=7, sk=9)
    q_mask, k_mask = _masks(sq=7, sk=9)
    ref_core = build_core(scheme, impl="naive").double()
    ref = ref_core(q, k, v, q_mask=q_mask, k_mask=k_mask, need_weights=True).out
    if scheme == "hnas":
        out = hnas_flex(q, k, v, ref_core.u.detach(), q_mask, k_mask)
    else:
        out = dnas_flex(q, k, v, q_mask, k_mask, iterations=ref_core.iterations)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    assert (out[1, :, 5:] == 0).all()  # padded queries give zero


def test_impl_flex_dispatches_on_the_cpu_for_evaluation_and_falls_back_elsewhere(monkeypatch):
    calls = []
    import nas_cli.attention.flex as flex

    real = flex.dnas_flex
    monkeypatch.setattr(flex, "dnas_flex", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv(sq=6, sk=6)
    enc = build_core("dnas", impl="flex").double()
    with torch.no_grad():
        out = enc(q, k, v).out
    assert calls == [1]
    torch.testing.assert_close(out, build_core("dnas", impl="naive").double()(q, k, v).out)
    # the prefix form (decoder) is not a per-key bias: the chunked path, same values
    dec = build_core("dnas", impl="flex", causal=True, location="decoder").double()
    with torch.no_grad():
        dec(q, k, v)
    assert calls == [1]
    # training on the CPU (gradients): FlexAttention has no CPU backward, the chunked path runs
    qg = q.clone().requires_grad_()
    enc(qg, k, v).out.sum().backward()
    assert calls == [1] and qg.grad is not None


def test_impl_auto_picks_flex_only_on_cuda_from_the_naive_threshold():
    core = build_core("dnas", impl="auto").double()
    q, k, _ = qkv(sq=dnas_mod.AUTO_NAIVE_BELOW, sk=dnas_mod.AUTO_NAIVE_BELOW)
    assert dnas_mod.path_for(core, q, k).name == "efficient"  # CPU: no FlexAttention for training
    assert flex_unavailable("cpu", training=True) is not None
    assert flex_unavailable("cpu", training=False) is None


def test_impl_auto_takes_a_fused_path_only_on_cuda_from_the_threshold_and_never_when_deterministic():
    """impl=auto's choice of FlexAttention (encoder form) and the Triton kernels (prefix form): both
    accumulate gradients with atomics, so a trainer.deterministic run (Lightning turns on
    torch.use_deterministic_algorithms) keeps the chunked path; before, auto took FlexAttention there."""
    n = dnas_mod.AUTO_NAIVE_BELOW
    assert dnas_mod.auto_picks_fused("cuda", n) and not dnas_mod.auto_picks_fused("cuda", n - 1)
    assert not dnas_mod.auto_picks_fused("cpu", 4 * n)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not dnas_mod.auto_picks_fused("cuda", 4 * n)
    finally:
        torch.use_deterministic_algorithms(before)
    # on the CPU (TRITON_INTERPRET=1 in the tests) auto never runs the interpreter's kernels
    core = build_core("dnas", causal=True, location="decoder", impl="auto").double()
    q, k, _ = qkv(sq=n, sk=n)
    assert dnas_mod.path_for(core, q, k).name == "efficient"


def test_training_with_impl_flex_on_the_cpu_is_refused_before_anything_runs():
    from nas_cli.pipeline.checks.config import check_config
    from nas_cli.errors import UserError

    cfg = compose_cfg("attention=dnas", "attention.impl=flex", "trainer.accelerator=cpu")
    with pytest.raises(UserError, match=r"attention.impl=flex \(encoder, decoder, cross\): FlexAttention has no "
                                        r"backward pass on the CPU.*attention.impl=auto"):
        check_config(cfg)
    check_config(compose_cfg("attention=dnas", "attention.impl=auto", "trainer.accelerator=cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA; none here")
def test_flex_gradients_equal_the_naive_formula_on_cuda():
    q, k, v = (t.cuda().float().requires_grad_() for t in qkv(sq=64, sk=80, dtype=torch.float32))
    q_mask, k_mask = (m.cuda() for m in _masks(sq=64, sk=80))
    out = dnas_flex(q, k, v, q_mask, k_mask)
    ref = build_core("dnas", impl="naive").cuda()(q, k, v, q_mask=q_mask, k_mask=k_mask, need_weights=True).out
    g = torch.randn_like(out)
    got = torch.autograd.grad((out * g).sum(), (q, k, v))
    want = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


@pytest.mark.slow  # compiles FlexAttention for seven shapes
def test_flex_survives_a_loop_of_changing_shapes():
    """Calls with changing shapes, the same tensor as keys and values, and score_mod sometimes None
    (a case that can fail inside torch._dynamo with "'NoneType' object is not subscriptable"): every
    shape gives the float64 formula's values, with or without padding, for DNAS, Sinkhorn-3 and HNAS."""
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 7, 9), (3, 5, 6), (1, 130, 77), (3, 140, 140), (2, 16, 33), (4, 11, 11), (3, 140, 61)]
    cores = {s: build_core(s, impl="naive").double() for s in ("dnas", "sinkhorn", "hnas")}
    for i, (b, sq, sk) in enumerate(shapes):
        q, k, v = (torch.randn(b, 4, n, 8, generator=g, dtype=torch.float64) for n in (sq, sk, sk))
        masks = (None, None) if i % 2 else _masks(b, sq, sk) if b > 1 else (None, None)
        for scheme, core in cores.items():
            ref = core(q, k, v, q_mask=masks[0], k_mask=masks[1], need_weights=True).out
            if scheme == "hnas":
                out = hnas_flex(q, k, v, core.u.detach(), *masks)
            else:
                out = dnas_flex(q, k, v, *masks, iterations=core.iterations)
            torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9, msg=f"{scheme} at {b}x{sq}x{sk}")


def test_impl_flex_is_refused_when_deterministic_and_says_once_where_it_falls_back(monkeypatch, capsys):
    """Deterministic training cannot take FlexAttention (atomics in its backward); where it
    can train (CUDA: simulated here by saying it is available), the prefix-normalized locations
    keep the chunked path and the run says so in one note."""
    import nas_cli.attention.flex as flex
    from nas_cli.pipeline.checks.config import check_config
    from nas_cli.errors import UserError

    with pytest.raises(UserError, match=r"attention.impl=flex \(encoder, decoder, cross\) is not deterministic.*"
                                        r"attention.impl=auto"):
        check_config(compose_cfg("attention=dnas", "attention.impl=flex", "trainer.deterministic=true"))
    monkeypatch.setattr(flex, "flex_unavailable", lambda device, training: None)
    notes = check_config(compose_cfg("attention=dnas", "attention.impl=flex")).notes
    assert len(notes) == 1 and notes[0].startswith("attention.impl=flex: decoder, cross attention is prefix-normalized")
    assert capsys.readouterr().err == ""  # said by the check before Hydra starts, not by the check itself
    notes = check_config(compose_cfg("attention=dnas", "attention.impl=flex", "attention.decoder=unas",
                                     "attention.cross=unas")).notes
    assert notes == ()  # the encoder alone: nothing falls back


def test_flex_computes_in_the_autocast_dtype_with_autocast_off_inside():
    # on an H200 (torch 2.11) a compiled FlexAttention call under bf16 autocast computes in float16 (a float16
    # output with fp16's error under bf16-mixed); so the precision is explicit: inputs cast to the autocast
    # dtype, the call itself without autocast. Here: bf16 autocast gives exactly the call on bf16 inputs.
    q, k, v = (t.float() for t in qkv(sq=7, sk=9))
    q_mask, k_mask = _masks(sq=7, sk=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dnas_flex(q, k, v, q_mask, k_mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, dnas_flex(q.bfloat16(), k.bfloat16(), v.bfloat16(), q_mask, k_mask),
                               rtol=0, atol=0)
    assert dnas_flex(q, k, v, q_mask, k_mask).dtype == torch.float32  # no autocast: the inputs' dtype
