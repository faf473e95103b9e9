"""Whole-model properties for every scheme: causality, padding, decoding consistency."""
import pytest
import torch
from omegaconf import OmegaConf

from nas_cli.model.losses import label_smoothed_nll
from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import make_core_factory

SIZES = dict(d_model=32, heads=4, ffn=64, dropout=0.0, max_len=64)


def factory(scheme, heads=4):
    """The scheme everywhere, or, for one defined for causal self-attention only, at the decoder's
    self-attention with UNAS elsewhere (what a user writes: attention=unas attention.decoder=<scheme>)."""
    from hydra.utils import get_class

    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    if get_class(cfg._target_).causal_self_only:
        base = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
        base.decoder = cfg
        cfg = base
    return make_core_factory(cfg, heads)


def positions_for(scheme) -> str:
    """The model's input positions a scheme allows (its declared flag, not its name)."""
    from helpers import build_core

    return "none" if build_core(scheme).requires_no_input_positions else "sinusoidal"


@pytest.mark.parametrize("norm_first,positions", [(True, "sinusoidal"), (False, "sinusoidal"), (True, "rope"),
                                                 (True, "alibi")])
def test_lm_causal_no_leak(scheme, norm_first, positions):
    if positions in ("rope", "alibi") and positions_for(scheme) == "none":
        pytest.skip(f"{scheme} places positions itself (model.positions=none)")
    if positions == "alibi" and not factory(scheme)("decoder", 0, True).takes_alibi:
        pytest.skip(f"{scheme} takes no score bias (refused with model.positions=alibi)")
    torch.manual_seed(0)
    lm = DecoderOnlyLM(20, factory(scheme), decoder_layers=2, norm_first=norm_first,
                       **{**SIZES, "positions": positions if positions in ("rope", "alibi") else positions_for(scheme)}).eval()
    ids = torch.randint(3, 20, (2, 10))
    t = 4
    changed = ids.clone()
    changed[:, t + 1:] = torch.randint(3, 20, (2, 10 - t - 1))
    a, _ = lm(ids)
    b, _ = lm(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])  # the change did reach later positions


def test_seq2seq_decoder_no_leak_and_padding(scheme):
    torch.manual_seed(0)
    m = Seq2SeqTransformer(20, 20, factory(scheme), encoder_layers=2, decoder_layers=2, positions="learned",
                           share_embeddings=True, **SIZES).eval()
    src = torch.randint(3, 20, (1, 7))
    tgt = torch.randint(3, 20, (1, 6))
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(3, 20, (1, 3))
    a, _ = m(src, tgt)
    b, _ = m(src, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=1e-5)
    # padding the source and the target leaves real positions unchanged
    src_p = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1)
    tgt_p = torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], 1)
    c, _ = m(src_p, tgt_p)
    if all(getattr(mod, "nonnegative", True) for mod in m.modules()):
        torch.testing.assert_close(c[:, :6], a, rtol=0, atol=1e-5)
    else:  # signed kernels (linear) amplify float32 rounding of differently shaped matmuls
        torch.testing.assert_close(c[:, :6], a, rtol=0, atol=1e-2)


def test_greedy_decode_matches_teacher_forcing(scheme):
    """Greedy decoding re-runs the prefix, so each emitted token is the argmax of the
    teacher-forced logits on the decoded prefix (true for prefix-normalized schemes)."""
    torch.manual_seed(1)
    m = Seq2SeqTransformer(12, 12, factory(scheme), encoder_layers=1, decoder_layers=2, **SIZES).eval()
    src = torch.randint(3, 12, (3, 5))
    out = m.greedy_decode(src, 1, 2, max_len=6)
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), out[:, :-1]], 1)
    logits, _ = m(src, tgt_in)
    logits[..., [0, 1]] = float("-inf")  # decoding never emits padding or BOS
    live = torch.ones(3, dtype=torch.bool)
    for t in range(out.size(1)):
        assert torch.equal(logits[live, t].argmax(-1), out[live, t])
        live &= out[:, t] != 2


def test_need_weights_returns_every_location():
    m = Seq2SeqTransformer(12, 12, factory("hnas"), encoder_layers=2, decoder_layers=3, **SIZES).eval()
    _, found = m(torch.randint(3, 12, (2, 5)), torch.randint(3, 12, (2, 4)), need_weights=True)
    assert {k: len(v) for k, v in found.items()} == {"encoder": 2, "decoder": 3, "cross": 3}
    assert found["cross"][0].weights.shape == (2, 4, 4, 5)
    assert found["decoder"][0].aux["u"].shape == (4,)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="model.heads=5 must divide model.d_model=32"):
        DecoderOnlyLM(10, factory("unas", 5), decoder_layers=1, **{**SIZES, "heads": 5})


def test_label_smoothed_loss_against_formula():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    loss, nll_sum, n = label_smoothed_nll(logits, target, pad_id=0, smoothing=0.1)
    lp = torch.log_softmax(logits, -1)
    keep = [(0, 0), (0, 1), (1, 0)]
    nll = [-lp[b, t, target[b, t]] for b, t in keep]
    smooth = [-lp[b, t].mean() for b, t in keep]
    ref = sum(0.9 * a + 0.1 * s for a, s in zip(nll, smooth)) / 3
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll_sum, sum(nll))
    assert n == 3


@pytest.mark.parametrize("rope", [False, True], ids=["input_positions", "rope"])
def test_incremental_decoding_equals_full_recompute(scheme, rope):
    """Every scheme of the registry: where the decoder's cores declare ``supports_step``,
    cached keys/values and running column normalizers give the same tokens and scores as
    re-running the decoder on the whole prefix; elsewhere decoding falls back to it. With rotary
    positions the step rotates the new query and key at their own position."""
    from nas_cli.model.decoding import beam_search
    if rope and positions_for(scheme) == "none":
        pytest.skip(f"{scheme} places positions itself (model.positions=none)")
    torch.manual_seed(3)
    m = Seq2SeqTransformer(25, 25, factory(scheme), encoder_layers=1, decoder_layers=2,
                           **{**SIZES, "positions": "rope" if rope else positions_for(scheme)}).eval()
    cores = [layer.self_attn.core for layer in m.decoder] + [layer.cross_attn.core for layer in m.decoder]
    assert m.can_step == all(c.supports_step and not c.uses_prev and not c.input_positions for c in cores)
    src = torch.randint(3, 25, (4, 6))
    src[1, 4:] = 0  # padded source
    fast = m.greedy_decode(src, 1, 2, max_len=9)
    slow = m.greedy_decode(src, 1, 2, max_len=9, incremental=False)
    assert torch.equal(fast, slow)
    if not m.can_step:
        return
    # the step logits equal teacher forcing on the decoded prefix
    memory, memory_mask, _ = m.encode(src)
    cache, prefix = {}, torch.ones(4, 1, dtype=torch.long)
    for t in range(5):
        step_logits = m.decode_step(prefix[:, -1:], memory, memory_mask, cache)
        full, _ = m.decode(prefix, memory, memory_mask)
        torch.testing.assert_close(step_logits, full[:, -1], rtol=1e-5, atol=1e-5)
        prefix = torch.cat([prefix, torch.randint(3, 25, (4, 1))], 1)
    a, sa = beam_search(m, src, 1, 2, 0, beam=3, max_len=9, lenpen=0.6)
    b, sb = beam_search(m, src, 1, 2, 0, beam=3, max_len=9, lenpen=0.6, incremental=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-5)


def test_an_untrained_model_predicts_about_uniformly():
    """At initialization the loss is a little above log V (the logits have variance about 1):
    a wrongly scaled embedding or output layer is far from it."""
    import math

    torch.manual_seed(0)
    vocab = 400
    m = Seq2SeqTransformer(vocab, vocab, factory("unas"), encoder_layers=2, decoder_layers=2,
                           share_embeddings=True, **{**SIZES, "d_model": 64}).eval()
    src, tgt = torch.randint(3, vocab, (32, 12)), torch.randint(3, vocab, (32, 20))
    logits, _ = m(src, tgt)
    loss, _, _ = label_smoothed_nll(logits, torch.roll(tgt, -1, 1), pad_id=0)
    # tied embeddings with std d^-1/2 after a LayerNorm: logits of variance ~1. Jensen: the
    # log-partition is >= log V + the mean logit, so the loss is >= log V up to sampling noise;
    # logits of variance v put it a few v/2 above (a mis-scaled output layer is far outside)
    var = float(logits.var(dim=-1).mean())
    assert 0.5 < var < 2.0
    assert math.log(vocab) - 0.05 < float(loss) < math.log(vocab) + 2 * var

def test_kernel_exp_equals_unas_through_a_whole_model():
    """Tsai et al.: the exponential kernel with the positions summed at the input is standard
    attention. Same weights, same logits, in an encoder-decoder and in a language model."""
    torch.manual_seed(0)
    unas = Seq2SeqTransformer(30, 30, factory("unas"), encoder_layers=2, decoder_layers=2, **SIZES).eval()
    kexp = Seq2SeqTransformer(30, 30, factory("kernel_exp"), encoder_layers=2, decoder_layers=2, **SIZES).eval()
    kexp.load_state_dict(unas.state_dict())
    src, tgt = torch.randint(3, 30, (3, 9)), torch.randint(3, 30, (3, 7))
    src[0, 6:] = 0
    torch.testing.assert_close(kexp(src, tgt)[0], unas(src, tgt)[0], rtol=1e-5, atol=1e-5)
    lm_u = DecoderOnlyLM(30, factory("unas"), decoder_layers=2, **SIZES).eval()
    lm_k = DecoderOnlyLM(30, factory("kernel_exp"), decoder_layers=2, **SIZES).eval()
    lm_k.load_state_dict(lm_u.state_dict())
    torch.testing.assert_close(lm_k(src)[0], lm_u(src)[0], rtol=1e-5, atol=1e-5)


def test_rotary_positions_equal_the_complex_rotation_and_depend_on_distance_only():
    """Rotary positions (Su et al. 2021) against the formula as complex numbers: feature pair
    (x_i, x_{i + D/2}) is z = x_i + i x_{i + D/2}, turned by exp(i p theta_i), theta_i = 10000^(-2i/D);
    and a query at m and a key at n score the same for every common shift of m and n."""
    import math

    from nas_cli.attention.positions import rotate

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 1, 4, 9, 100])
    got = rotate(x, pos)
    for t, p in enumerate(pos.tolist()):
        for i in range(4):
            theta = 10000 ** (-2 * i / 8)
            z = complex(1, 0) * x[..., t, i] + 1j * x[..., t, i + 4]
            turned = z * complex(math.cos(p * theta), math.sin(p * theta))
            torch.testing.assert_close(got[..., t, i], turned.real)
            torch.testing.assert_close(got[..., t, i + 4], turned.imag)
    q, k = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64), torch.randn(2, 2, 6, 8, generator=g,
                                                                                   dtype=torch.float64)
    base = torch.arange(6)
    scores = rotate(q, base) @ rotate(k, base).transpose(-1, -2)
    for shift in (1, 7, 1000):
        moved = rotate(q, base + shift) @ rotate(k, base + shift).transpose(-1, -2)
        torch.testing.assert_close(moved, scores, rtol=1e-9, atol=1e-9)


def test_rope_adds_no_input_positions_and_is_refused_with_a_scheme_that_places_its_own():
    from helpers import compose_cfg
    from nas_cli.errors import UserError
    from nas_cli.pipeline.checks.config import check_attention

    lm = DecoderOnlyLM(20, factory("unas"), decoder_layers=1, **{**SIZES, "positions": "rope"})
    assert lm.embed.positions is None and all(layer.self_attn.rotary for layer in lm.layers)
    s2s = Seq2SeqTransformer(20, 20, factory("unas"), encoder_layers=1, decoder_layers=1, **{**SIZES, "positions": "rope"})
    assert s2s.encoder[0].self_attn.rotary and s2s.decoder[0].self_attn.rotary and not s2s.decoder[0].cross_attn.rotary
    with pytest.raises(UserError, match="add model.positions=none"):
        check_attention(compose_cfg("attention=pe_lookup", "model.positions=rope"))
