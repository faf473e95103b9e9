"""ALiBi (model.positions=alibi, Press et al. 2022): the slopes against the paper's closed form, the
bias against its definition (relative positions only), and every scheme that takes it against an
independent route to the same scores: q and k widened by two features whose dot product is the
bias, through the same core without ALiBi (q' . k' / sqrt(d') = q . k / sqrt(d) - m (i - j))."""
import math

import pytest
import torch

from helpers import build_core, compose_cfg
from nas_cli.attention.positions import alibi_bias, alibi_slopes
from nas_cli.errors import UserError

TAKES = ("unas", "gated", "sigmoid", "softpick", "stickbreaking")


def test_slopes_are_press_et_al_s_geometric_sequence():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]  # the paper's 1/2 .. 1/256
    assert alibi_slopes(4).tolist() == [2.0 ** -k for k in (2, 4, 6, 8)]
    # not a power of 2: the 4-head slopes, then every other one of the 8-head slopes
    assert alibi_slopes(6).tolist() == [2.0 ** -k for k in (2, 4, 6, 8, 1, 3)]
    assert torch.allclose(alibi_slopes(16)[:2], torch.tensor([2 ** -0.5, 2 ** -1.0]))


def test_the_bias_is_minus_slope_times_distance_and_depends_on_distance_only():
    slopes = alibi_slopes(4)
    rows, cols = torch.arange(6), torch.arange(6)
    bias = alibi_bias(slopes, rows, cols)
    for h in range(4):
        for i in range(6):
            for j in range(6):
                assert bias[0, h, i, j] == pytest.approx(-slopes[h].item() * (i - j))
    for shift in (1, 100, 5000):
        torch.testing.assert_close(alibi_bias(slopes, rows + shift, cols + shift), bias)


def _widened(q, k, slopes):
    """q', k' with q' . k' / sqrt(D + 2) = q . k / sqrt(D) - m_h (i - j), for queries and keys at 0..S-1."""
    d = q.size(-1)
    wide = math.sqrt(d + 2)
    a = ((d + 2) / d) ** 0.25
    pos = torch.arange(q.size(-2), dtype=q.dtype)
    m = slopes.to(q.dtype)[None, :, None]
    ones = torch.ones_like(q[..., :1])
    q2 = torch.cat([q * a, (-m * pos * wide)[..., None].expand_as(ones), ones], -1)
    k2 = torch.cat([k * a, ones, (m * pos * wide)[..., None].expand_as(ones)], -1)
    return q2, k2


@pytest.mark.parametrize("scheme", TAKES)
@pytest.mark.parametrize("weights", [False, True], ids=["fast", "weights"])
def test_each_scheme_with_alibi_equals_its_scores_plus_the_bias(scheme, weights):
    torch.manual_seed(0)
    heads, s, d = 4, 11, 8
    core = build_core(scheme, heads=heads, causal=True, location="decoder").double().eval()
    if hasattr(core, "block_size"):
        core.block_size = 4  # the fast path in several row blocks
    q, k, v = (torch.randn(2, heads, s, d, dtype=torch.float64) for _ in range(3))
    k_mask = torch.ones(2, s, dtype=torch.bool)
    k_mask[1, 8:] = False  # a padded row
    x = {"x": torch.randn(2, heads, s, core.input_features(d), dtype=torch.float64)} if core.input_features(d) else {}
    slopes = alibi_slopes(heads).double()
    got = core(q, k, v, k_mask=k_mask, q_mask=k_mask, need_weights=weights, alibi=slopes, **x)
    q2, k2 = _widened(q, k, slopes)
    v2 = v
    ref = core(q2, k2, v2, k_mask=k_mask, q_mask=k_mask, need_weights=weights, **x)
    torch.testing.assert_close(got.out, ref.out, rtol=1e-9, atol=1e-9)
    if weights:
        torch.testing.assert_close(got.weights, ref.weights, rtol=1e-9, atol=1e-9)
    # one query at a time (decoding) gives row i of the forward pass
    for i in range(s):
        step_x = {"x": x["x"][..., i:i + 1, :]} if x else {}
        out, _ = core.step(q[..., i:i + 1, :], k[..., :i + 1, :], v[..., :i + 1, :], k_mask[:, :i + 1], None,
                           alibi=slopes, **step_x)
        keep = k_mask[:, i]
        torch.testing.assert_close(out[keep], got.out[..., i:i + 1, :][keep], rtol=1e-9, atol=1e-9)


def test_alibi_is_refused_where_no_score_bias_reaches_and_outside_a_causal_language_model():
    from nas_cli.pipeline.checks.config import check_config

    for scheme in ("dnas", "selective", "differential", "forgetting"):
        overrides = (["attention=unas", f"attention.decoder={scheme}"] if scheme in ("selective", "forgetting")
                     else [f"attention={scheme}"])
        with pytest.raises(UserError, match="takes no score bias, so model.positions=alibi cannot reach it"):
            check_config(compose_cfg("task=copy_lm", "model.positions=alibi", "model.heads=4", *overrides))
    with pytest.raises(UserError, match="model.positions=alibi is defined for a causal language model"):
        check_config(compose_cfg("task=reverse", "model.positions=alibi"))


def test_a_language_model_with_alibi_adds_no_input_positions_and_biases_every_layer():
    from nas_cli.model.plan import make_core_factory
    from nas_cli.model.transformer import DecoderOnlyLM
    from omegaconf import OmegaConf
    from nas_cli.model.choices import CONF_DIR

    lm = DecoderOnlyLM(20, make_core_factory(OmegaConf.load(CONF_DIR / "attention" / "unas.yaml"), 4), d_model=32,
                       heads=4, decoder_layers=2, ffn=64, dropout=0.0, positions="alibi", max_len=16)
    assert lm.embed.positions is None
    assert all(torch.equal(layer.self_attn.alibi, alibi_slopes(4)) for layer in lm.layers)
    assert "alibi" not in lm.state_dict() and not any("alibi" in k for k in lm.state_dict())  # not a parameter
    ids = torch.randint(3, 20, (2, 40))  # past max_len: ALiBi has no table
    assert lm(ids)[0].shape == (2, 40, 20)
