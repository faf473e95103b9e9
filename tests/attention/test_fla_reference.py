"""The recurrent mixers' chunked form (nas_cli/attention/recurrent.py) against flash-linear-attention's own plain
PyTorch references (fla-core's ``naive`` recurrences, which run on a CPU): linear attention, a decay per head
(simple GLA, Mamba-2's SSD), a decay per key feature (GLA), the delta rule (DeltaNet) and the gated delta rule
(Gated DeltaNet), outputs and final states. The references compute in float32 and scale the queries by
1/sqrt(d_k): the same scaling is applied here, and the tolerance is float32's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nas_cli.attention.recurrent import chunked

pytest.importorskip("fla.ops.gla.naive", reason="fla-core (flash-linear-attention's ops) is not installed")

B, H, T, K, V = 2, 3, 29, 8, 6
TOL = dict(rtol=1e-4, atol=1e-4)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, K, generator=g) for _ in range(2))
    v = torch.randn(B, H, T, V, generator=g)
    return q, F.normalize(k, dim=-1), v, g  # unit keys: the delta rules' state stays bounded, as fla's layers keep it


def _bthk(*xs):  # (B, H, T, ...) -> fla's (B, T, H, ...)
    return [x.transpose(1, 2).contiguous() for x in xs]


def _ours(q, k, v, g=None, beta=None):
    out, state = chunked(q * K ** -0.5, k, v, g, beta, chunk=8)
    return out, state


def test_linear_attention_equals_flas_recurrence():
    from fla.ops.linear_attn.naive import naive_recurrent_linear_attn

    q, k, v, _ = _inputs(0)
    want, state = naive_recurrent_linear_attn(*_bthk(q, k, v), output_final_state=True)
    got, s = _ours(q, k, v)
    torch.testing.assert_close(got, want.transpose(1, 2), **TOL)
    torch.testing.assert_close(s, state, **TOL)


def test_a_decay_per_head_equals_flas_simple_gla():
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    q, k, v, gen = _inputs(1)
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen))  # log a_t < 0
    want, state = naive_recurrent_simple_gla(*_bthk(q, k, v, g))
    got, s = _ours(q, k, v, g=g)
    torch.testing.assert_close(got, want.transpose(1, 2), **TOL)
    torch.testing.assert_close(s, state, **TOL)


def test_a_decay_per_key_feature_equals_flas_gla():
    from fla.ops.gla.naive import naive_recurrent_gla

    q, k, v, gen = _inputs(2)
    gk = F.logsigmoid(torch.randn(B, H, T, K, generator=gen)) / 4
    want, state = naive_recurrent_gla(*_bthk(q, k, v, gk), output_final_state=True)
    got, s = _ours(q, k, v, g=gk)
    torch.testing.assert_close(got, want.transpose(1, 2), **TOL)
    torch.testing.assert_close(s, state, **TOL)


def test_the_delta_rule_equals_flas_recurrence():
    from fla.ops.delta_rule.naive import delta_rule_recurrence

    q, k, v, gen = _inputs(3)
    beta = torch.rand(B, H, T, generator=gen)
    want, state = delta_rule_recurrence(q, k, v, beta)
    got, s = _ours(q, k, v, beta=beta)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(s, state, **TOL)


def test_the_gated_delta_rule_equals_flas_recurrence():
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    q, k, v, gen = _inputs(4)
    beta = torch.rand(B, H, T, generator=gen)
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen))
    want, state = naive_recurrent_gated_delta_rule(*_bthk(q, k, v, beta, g), output_final_state=True)
    got, s = _ours(q, k, v, g=g, beta=beta)
    torch.testing.assert_close(got, want.transpose(1, 2), **TOL)
    torch.testing.assert_close(s, state, **TOL)
