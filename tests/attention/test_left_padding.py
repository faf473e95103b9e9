"""Left padding changes nothing: a causal sequence with pad tokens in front (a batch of prompts in a Hugging
Face model) gives, at its real positions, the outputs of the same sequence without them, in float64, for
every causal scheme computed a block of queries at a time (one block and several) and step by step. Selective
attention's never-masked first key is the sequence's first real key, not column 0."""
from __future__ import annotations

import pytest
import torch
from helpers import build_core

SCHEMES = ("selective", "sigmoid", "softpick", "stickbreaking", "unas")


@pytest.mark.parametrize("block_size", [64, 3])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_left_padding_leaves_the_real_positions_unchanged(scheme, block_size):
    extra = {"block_size": block_size} if scheme != "unas" else {}
    core = build_core(scheme, heads=2, causal=True, location="decoder", **extra).double()
    g = torch.Generator().manual_seed(1)
    b, h, t, d, pad = 2, 2, 9, 4, 3
    q, k, v = (torch.randn(b, h, t, d, generator=g, dtype=torch.float64) for _ in range(3))
    plain = core(q, k, v).out
    noise = [torch.randn(b, h, pad, d, generator=g, dtype=torch.float64) for _ in range(3)]
    qp, kp, vp = (torch.cat([n, x], dim=2) for n, x in zip(noise, (q, k, v)))
    mask = torch.tensor([[False] * pad + [True] * t] * b)
    padded = core(qp, kp, vp, q_mask=mask, k_mask=mask).out[..., pad:, :]
    assert torch.allclose(padded, plain, atol=1e-12, rtol=0), (padded - plain).abs().max()


def test_selective_steps_after_a_left_padded_prefix_equal_its_forward():
    core = build_core("selective", heads=2, causal=True, location="decoder").double()
    g = torch.Generator().manual_seed(2)
    b, h, t, d, pad = 1, 2, 7, 4, 2
    q, k, v = (torch.randn(b, h, pad + t, d, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[False] * pad + [True] * t])
    whole = core(q, k, v, q_mask=mask, k_mask=mask).out
    state = core.prefill_state(q[..., :pad + 3, :], k[..., :pad + 3, :], v[..., :pad + 3, :], mask[:, :pad + 3],
                               mask[:, :pad + 3])
    for i in range(pad + 3, pad + t):
        out, state = core.step(q[..., i:i + 1, :], k[..., :i + 1, :], v[..., :i + 1, :], mask[:, :i + 1], state)
        assert torch.allclose(out, whole[..., i:i + 1, :], atol=1e-12, rtol=0)
