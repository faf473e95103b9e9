"""Parity and formula tests for the schemes: Tsai et al.'s kernel smoothers
(nas_cli/attention/kernel.py), CODA and its ablations (coda.py), additive attention
(additive.py), and one small multirun of every new scheme through the real CLI."""
import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

from helpers import build_core, qkv
from nas_cli.attention import AttentionOutput
from nas_cli.attention.additive import step_variation
from nas_cli.attention.kernel import KernelDiverged, KernelSmoother
from nas_cli.errors import NonFiniteLoss, UserError
from nas_cli.model.transformer import MultiHeadAttention, Seq2SeqTransformer
from nas_cli.attention.positions import sinusoids
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import AttentionPlan, make_core_factory

NEW_SCHEMES = ["kernel_exp", "kernel_linear", "kernel_poly", "kernel_rbf", "coda", "coda_cs", "realformer",
               "additive", "additive_1layer"]
PE_SCHEMES = ["pe_lookup", "pe_product_xl", "pe_product_symmetric"]  # position in the kernel: model.positions=none
SIZES = dict(d_model=32, heads=4, ffn=64, dropout=0.0, max_len=64)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster, and much faster on a shared, loaded CPU
    (parallel regions of two threads wait for each other). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def scores(q, k):
    return torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.size(-1))


def factory(scheme, heads=4, **options):
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    for key, val in options.items():
        cfg[key] = val
    return make_core_factory(cfg, heads)


def masks():
    qm = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])
    km = torch.tensor([[True] * 4 + [False] * 3, [True] * 6 + [False]])
    return qm, km


# ---- Tsai et al.: kernels ------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_exp_kernel_direct_sum_is_exactly_unas(causal):
    kern, unas = build_core("kernel_exp", causal=causal).double(), build_core("unas", causal=causal).double()
    q, k, v = qkv()
    qm, km = masks()
    for kw in ({}, {"q_mask": qm, "k_mask": km}):
        for need in (True, False):
            a, b = kern(q, k, v, need_weights=need, **kw), unas(q, k, v, need_weights=need, **kw)
            assert torch.equal(a.out, b.out)
            if need:
                assert torch.equal(a.weights, b.weights)
    # and as a whole model: same parameters, same logits
    torch.manual_seed(0)
    m1 = Seq2SeqTransformer(20, 20, factory("kernel_exp"), encoder_layers=1, decoder_layers=1, **SIZES).eval()
    torch.manual_seed(0)
    m2 = Seq2SeqTransformer(20, 20, factory("unas"), encoder_layers=1, decoder_layers=1, **SIZES).eval()
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
    assert torch.equal(m1(src, tgt)[0], m2(src, tgt)[0])


def test_polynomial_and_rbf_against_plain_formulas():
    q, k, v = qkv(sq=6, sk=7)
    qm, km = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]), torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    d = q.size(-1)
    for degree in (2, 3):
        core = build_core("kernel_poly", degree=degree).double()
        res = core(q, k, v, q_mask=qm, k_mask=km, need_weights=True)
        for b, (nq, nk) in enumerate(((6, 7), (4, 5))):
            kern = (q[b, :, :nq] @ k[b, :, :nk].transpose(-1, -2) / math.sqrt(d)) ** degree
            torch.testing.assert_close(res.weights[b, :, :nq, :nk], kern / kern.sum(-1, keepdim=True))
        assert core.nonnegative == (degree % 2 == 0)
    core = build_core("kernel_rbf").double()
    res = core(q, k, v, q_mask=qm, k_mask=km, need_weights=True)
    for b, (nq, nk) in enumerate(((6, 7), (4, 5))):
        dist2 = ((q[b, :, :nq, None, :] - k[b, :, None, :nk, :]) ** 2).sum(-1)  # ||q_i - k_j||^2
        kern = torch.exp(-dist2 / math.sqrt(d))
        torch.testing.assert_close(res.weights[b, :, :nq, :nk], kern / kern.sum(-1, keepdim=True))
        torch.testing.assert_close(res.out[b, :, :nq], res.weights[b, :, :nq, :nk] @ v[b, :, :nk])
    # the fused path (SDPA with scale 2/sqrt(d) and a per-key bias) gives the same output
    assert core.fused  # exp kernel without positions: the fused SDPA path
    torch.testing.assert_close(core(q, k, v, q_mask=qm, k_mask=km).out, res.out)


def test_linear_kernel_is_signed_and_stops_clearly_when_its_normalizer_vanishes():
    core = build_core("kernel_linear").double()
    q, k, v = qkv(sq=4, sk=6)
    w = core(q, k, v, need_weights=True).weights
    kern = q @ k.transpose(-1, -2)
    torch.testing.assert_close(w, kern / kern.sum(-1, keepdim=True))
    assert (w < 0).any() and not core.nonnegative  # negative weights: not a kernel smoother any more
    # keys a and -a: sum_j <q, k_j> = 0 for every query, the smoother divides by zero
    a = torch.randn(1, 4, 1, 8, dtype=torch.float64)
    with pytest.raises(KernelDiverged, match=r"attention kernel 'linear' .*normalizer .* reached 0.*Tsai") as err:
        core(q[:1], torch.cat([a, -a], 2), v[:1, :, :2])
    assert isinstance(err.value, NonFiniteLoss) and isinstance(err.value, UserError)  # CLI: one line, exit 2


@pytest.mark.parametrize("kernel", ["exp", "linear", "polynomial", "rbf"])
def test_symmetric_kernels_tie_projections_and_give_symmetric_scores(kernel):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    found = {}
    for symmetric in (True, False):
        core = factory("kernel_exp", kernel=kernel, symmetric=symmetric)("encoder", 0, False)
        mha = MultiHeadAttention(32, 4, core).double()
        q, k, _ = mha.project(x, x)
        s = core.feature_logits(q, k) if core.log_kernel else core.feature_kernel(q, k)  # before masking
        found[symmetric] = (s, sum(p.numel() for p in mha.parameters()))
        assert (mha.k_proj is None) == symmetric
    torch.testing.assert_close(found[True][0], found[True][0].transpose(-1, -2), rtol=0, atol=1e-12)
    assert not torch.allclose(found[False][0], found[False][0].transpose(-1, -2))
    assert found[False][1] - found[True][1] == 32 * 32 + 32  # one projection fewer


def test_product_symmetric_scores_are_symmetric_and_save_a_third_of_the_xl_parameters():
    torch.manual_seed(0)
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    sym = MultiHeadAttention(32, 4, factory("pe_product_symmetric")("encoder", 0, False)).double()
    q, k, _ = sym.project(x, x)
    pos = torch.arange(6)
    log_k = sym.core.feature_logits(q, k) + sym.core.positional_logits(q, pos, pos)
    torch.testing.assert_close(log_k, log_k.transpose(-1, -2), rtol=0, atol=1e-12)
    xl = MultiHeadAttention(32, 4, factory("pe_product_xl")("encoder", 0, False))
    n_sym = sym.q_proj.weight.numel() + sym.core.w_t.weight.numel()  # W_F, W_T
    n_xl = xl.q_proj.weight.numel() + xl.k_proj.weight.numel() + xl.core.w_r.weight.numel()  # W_Q, W_K, W_R
    assert n_sym / n_xl == pytest.approx(2 / 3)


@pytest.mark.parametrize("scheme", ["pe_product_xl", "pe_product_symmetric", "pe_lookup"])
def test_product_kernels_factorize(scheme):
    """k(x_q, x_k) = k_F(f_q, f_k) * k_T(...): changing positions multiplies each weight by a
    factor that does not depend on the key features (so their ratio across two key sets
    is a per-row constant), and relative schemes do not see a common shift of positions."""
    core = build_core(scheme, max_distance=3).double()
    q, k, _ = qkv(sq=5, sk=7)
    _, k2, _ = qkv(sq=5, sk=7, seed=5)
    p1q, p1k = torch.arange(5), torch.arange(7)
    p2q, p2k = torch.tensor([0, 4, 9, 1, 2]), torch.tensor([3, 3, 0, 8, 6, 1, 2])

    def log_w(keys, pq, pk):
        return core.kernel_weights(q, keys, None, pq, pk).log()

    d1 = log_w(k, p2q, p2k) - log_w(k, p1q, p1k)
    d2 = log_w(k2, p2q, p2k) - log_w(k2, p1q, p1k)
    diff = d1 - d2
    torch.testing.assert_close(diff, diff.mean(-1, keepdim=True).expand_as(diff))  # per-row constant
    assert (d1 - d1.mean(-1, keepdim=True)).abs().max() > 1e-3  # positions do change the weights
    shifted = core.kernel_weights(q, k, None, p1q + 11, p1k + 11)
    same = torch.allclose(shifted, core.kernel_weights(q, k, None, p1q, p1k))
    assert same == (scheme != "pe_product_symmetric")  # Eq. 9 uses absolute sinusoids


def test_product_symmetric_against_eq_9():
    core = build_core("pe_product_symmetric", causal=True, location="decoder").double()
    q, k, v = qkv(sq=6, sk=6)
    t = sinusoids(torch.arange(6), 32).double()  # (T, d_model)
    tw = (t @ core.w_t.weight.T).view(6, 4, 8).transpose(0, 1)  # t W_T per head: (H, T, D)
    log_k = scores(q, k) + (tw @ tw.transpose(-1, -2))[None] / math.sqrt(8)
    ref = torch.softmax(log_k.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf), -1)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, ref)


def test_product_xl_against_eq_5():
    core = build_core("pe_product_xl").double()
    q, k, v = qkv(sq=4, sk=6)
    ref = torch.empty(2, 4, 4, 6, dtype=torch.float64)
    for i in range(4):
        for j in range(6):
            r = sinusoids(torch.tensor([i - j]), 32).double() @ core.w_r.weight.T  # r_{i-j} W_R: (1, d_model)
            c = r.view(4, 8)  # per head
            ref[:, :, i, j] = (q[:, :, i] * c[None]).sum(-1) / math.sqrt(8)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, torch.softmax(scores(q, k) + ref, -1))


def test_lookup_table_and_clipping_zero_is_the_exponential_kernel():
    q, k, v = qkv(sq=5, sk=8)
    core = build_core("pe_lookup", max_distance=2).double()
    a = core.rel_table  # (2K + 1, D)
    ref = torch.empty(2, 4, 5, 8, dtype=torch.float64)
    for i in range(5):
        for j in range(8):
            ref[:, :, i, j] = (q[:, :, i] * a[max(-2, min(2, i - j)) + 2]).sum(-1) / math.sqrt(8)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, torch.softmax(scores(q, k) + ref, -1))
    zero = build_core("pe_lookup", max_distance=0).double()
    assert zero.rel_table.shape == (1, 8)
    exp = build_core("kernel_exp").double()
    torch.testing.assert_close(zero(q, k, v, need_weights=True).weights, exp(q, k, v, need_weights=True).weights)
    assert not torch.allclose(core(q, k, v).out, exp(q, k, v).out)


def test_value_and_input_position_hooks():
    torch.manual_seed(0)
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    t5, t7 = sinusoids(torch.arange(5), 32), sinusoids(torch.arange(7), 32)
    for value_pe in (True, False):
        mha = MultiHeadAttention(32, 4, factory("pe_product_xl", value_pe=value_pe)("cross", 0, False))
        q, k, v = mha.project(x, mem)
        torch.testing.assert_close(v, mha._split(mha.v_proj(mem + t7 if value_pe else mem)))  # Eq. 7 / Eq. 8
        torch.testing.assert_close(k, mha._split(mha.k_proj(mem)))  # position stays out of the features
    mha = MultiHeadAttention(32, 4, factory("kernel_exp", positions="direct_sum_layer", value_pe=False)("cross", 0, False))
    q, k, v = mha.project(x, mem)
    torch.testing.assert_close(q, mha._split(mha.q_proj(x + t5)))
    torch.testing.assert_close(k, mha._split(mha.k_proj(mem + t7)))
    torch.testing.assert_close(v, mha._split(mha.v_proj(mem)))
    with pytest.raises(ValueError, match="attention.value_pe"):
        KernelSmoother(4, value_pe=True)  # direct_sum: the input already carries t


# ---- CODA, CODA-CS, RealFormer ------------------------------------------------------------

def test_realformer_without_previous_logits_is_unas_and_adds_them_otherwise():
    q, k, v = qkv()
    qm, km = masks()
    for causal in (False, True):
        rf, unas = build_core("realformer", causal=causal).double(), build_core("unas", causal=causal).double()
        ref = unas(q, k, v, q_mask=qm, k_mask=km, need_weights=True)
        first = rf(q, k, v, q_mask=qm, k_mask=km, need_weights=True)  # first layer: prev=None
        assert torch.equal(first.weights, ref.weights) and torch.equal(first.out, ref.out)
        zeros = AttentionOutput(v, None, {"logits": torch.zeros(2, 4, 7, 7, dtype=torch.float64)})
        torch.testing.assert_close(rf(q, k, v, q_mask=qm, k_mask=km, prev=zeros).out, ref.out)
        prev = AttentionOutput(v, None, {"logits": torch.randn(2, 4, 7, 7, dtype=torch.float64)})
        res = rf(q, k, v, q_mask=qm, k_mask=km, need_weights=True, prev=prev)
        allowed = qm[:, None, :, None] & km[:, None, None, :] & (torch.ones(7, 7).tril().bool() if causal else True)
        ref2 = torch.softmax((scores(q, k) + prev.aux["logits"]).masked_fill(~allowed, -math.inf), -1)
        ref2 = torch.nan_to_num(ref2)  # padded queries: no allowed key, weight 0
        torch.testing.assert_close(res.weights, ref2)


def test_coda_mean_is_scores_plus_residual_head_mixing_mlp():
    core = build_core("coda").double()
    q, k, v = qkv()
    z_prev = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    prev = AttentionOutput(v, None, {"logits": z_prev})
    lin1, lin2 = core.mixer.mlp[0], core.mixer.mlp[2]
    assert lin1.in_features == 4 and lin1.out_features == 16 and lin2.out_features == 4  # H -> alpha H -> H
    zt = z_prev.permute(0, 2, 3, 1)  # heads last
    mixed = F.linear(F.leaky_relu(F.linear(zt, lin1.weight, lin1.bias), 0.2), lin2.weight, lin2.bias)
    mu = scores(q, k) + z_prev + mixed.permute(0, 3, 1, 2)  # Zheng et al. Eq. 4, sigma(z) = z + MLP(z)
    res = core(q, k, v, need_weights=True, prev=prev)
    torch.testing.assert_close(res.aux["logits"], mu)
    torch.testing.assert_close(res.weights, torch.softmax(mu, -1))
    released = build_core("coda", mlp_layers=3)
    assert [m.out_features for m in released.mixer.mlp if isinstance(m, torch.nn.Linear)] == [16, 16, 4]


def test_coda_eval_deterministic_training_samples_and_zeroed_mlp_is_unas_or_realformer():
    core = build_core("coda").double()
    q, k, v = qkv()
    qm, km = masks()
    z_prev = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    prev = AttentionOutput(v, None, {"logits": z_prev})
    a, b = core(q, k, v, q_mask=qm, k_mask=km, prev=prev), core(q, k, v, q_mask=qm, k_mask=km, prev=prev)
    assert torch.equal(a.out, b.out)  # eval: the mean, no noise
    core.train()
    torch.manual_seed(3)
    s1 = core(q, k, v, q_mask=qm, k_mask=km, prev=prev)
    torch.manual_seed(3)
    eps = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(s1.aux["logits"], a.aux["logits"] + eps)  # reparameterized z = mu + eps
    assert not torch.equal(core(q, k, v, prev=prev).out, core(q, k, v, prev=prev).out)
    core.eval()
    with torch.no_grad():
        core.mixer.last.weight.zero_()
        core.mixer.last.bias.zero_()
    unas = build_core("unas").double()(q, k, v, q_mask=qm, k_mask=km)
    zeros = AttentionOutput(v, None, {"logits": torch.zeros_like(z_prev)})
    torch.testing.assert_close(core(q, k, v, q_mask=qm, k_mask=km, prev=zeros).out, unas.out)
    torch.testing.assert_close(core(q, k, v, q_mask=qm, k_mask=km).out, unas.out)  # first layer
    rf = build_core("realformer").double()(q, k, v, q_mask=qm, k_mask=km, prev=prev)
    torch.testing.assert_close(core(q, k, v, q_mask=qm, k_mask=km, prev=prev).out, rf.out)


def test_coda_cs_samples_without_cascade():
    core = build_core("coda_cs").double()
    assert not core.uses_prev and core.mixer is None
    q, k, v = qkv()
    unas = build_core("unas").double()(q, k, v)
    torch.testing.assert_close(core(q, k, v).out, unas.out)  # eval: the mean = standard attention
    core.train()
    torch.manual_seed(0)
    z = core(q, k, v).aux["logits"]
    torch.manual_seed(0)
    torch.testing.assert_close(z, scores(q, k) + torch.randn_like(z))


def test_coda_cascades_run_per_location_with_raw_finite_logits():
    """Layer 1's logits = its own scores + sigma(layer 0's logits at the same location), for
    encoder self-, decoder self- and cross-attention; padding never reaches the cascade as -inf."""
    torch.manual_seed(0)
    m = Seq2SeqTransformer(20, 20, factory("coda"), encoder_layers=2, decoder_layers=2, **SIZES).eval()
    seen = {}
    mods = {"encoder": m.encoder[1].self_attn, "decoder": m.decoder[1].self_attn, "cross": m.decoder[1].cross_attn}
    hooks = [mha.register_forward_hook(lambda mod, args, out, loc=loc: seen.__setitem__(loc, args))
             for loc, mha in mods.items()]
    src = torch.tensor([[5, 6, 7, 8, 9, 0, 0], [4, 5, 6, 7, 8, 9, 10]])
    tgt = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    _, found = m(src, tgt)
    for h in hooks:
        h.remove()
    for loc, mha in mods.items():
        x_q, x_kv = seen[loc][:2]
        q, k, _ = mha.project(x_q, x_kv)
        z0, z1 = found[loc][0].aux["logits"], found[loc][1].aux["logits"]
        assert torch.isfinite(z0).all() and torch.isfinite(z1).all()
        torch.testing.assert_close(z1, scores(q, k) + mha.core.mixer(z0))


def test_coda_extra_parameters_below_a_tenth_of_a_percent_of_transformer_base():
    base = OmegaConf.load(CONF_DIR / "model" / "base.yaml")
    sizes = dict(d_model=base.d_model, heads=base.heads, encoder_layers=base.encoder_layers,
                 decoder_layers=base.decoder_layers, ffn=base.ffn, dropout=base.dropout, max_len=base.max_len,
                 share_embeddings=base.share_embeddings, positions=base.positions, norm_first=base.norm_first)

    def count(scheme, **options):
        with torch.device("meta"):  # sizes only: no memory, no init cost
            model = Seq2SeqTransformer(32000, 32000, factory(scheme, base.heads, **options), **sizes)
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    n_unas = count("unas")
    for options in ({}, {"mlp_layers": 3}):
        extra = count("coda", **options) - n_unas
        per_module = (2 * 4 * 8 * 8 + 4 * 8 + 8) if not options else (8 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8)
        assert extra == 18 * per_module  # 6 encoder self + 6 decoder self + 6 cross
        print(f"CODA {options or 'paper 2-layer'}: {extra} extra parameters on {n_unas} "
              f"({100 * extra / n_unas:.4f}%)")
        assert extra / n_unas < 1e-3


# ---- additive attention --------------------------------------------------------------------

def test_additive_two_layer_score_is_w_tanh_of_concatenation():
    core = build_core("additive").double()
    q, k, v = qkv(sq=3, sk=5)
    w_cat = torch.cat([core.w_k, core.w_q], dim=1)  # (H, 2D, n): W acting on [k_j ; q_i]
    ref = torch.empty(2, 4, 3, 5, dtype=torch.float64)
    for i in range(3):
        for j in range(5):
            kq = torch.cat([k[:, :, j], q[:, :, i]], -1)  # (B, H, 2D)
            ref[:, :, i, j] = (torch.tanh(torch.einsum("bhc,hcn->bhn", kq, w_cat) + core.b) * core.w).sum(-1)
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, torch.softmax(ref, -1))


def test_one_layer_additive_cross_attention_is_the_same_at_every_decoder_step():
    """Blog post ("Why Bahdanau's neural attention requires two layers"): with one layer the weights over source positions do not
    depend on the decoder state; with two layers they do."""
    torch.manual_seed(0)
    src = torch.randint(3, 20, (2, 7))
    tgt_a, tgt_b = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 6))
    for scheme, constant in (("additive_1layer", True), ("additive", False)):
        cfg = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
        cfg.cross = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")  # as attention.cross=<scheme> composes it
        m = Seq2SeqTransformer(20, 20, make_core_factory(cfg, 4), encoder_layers=1, decoder_layers=2, **SIZES).eval()
        wa = [r.weights for r in m(src, tgt_a, need_weights=True)[1]["cross"]]
        wb = [r.weights for r in m(src, tgt_b, need_weights=True)[1]["cross"]]
        for a, b in zip(wa, wb):
            if constant:
                assert step_variation(a).max() < 1e-6
                torch.testing.assert_close(a, b)  # any decoder states: the same weights
            else:
                assert step_variation(a).min() > 1e-3
                assert not torch.allclose(a, b)


# ---- incremental decoding -------------------------------------------------------------------

def test_incremental_decoding_of_the_new_schemes():
    """Schemes whose scores depend on one (query, key) pair and no position step with cached
    keys/values and decode exactly as the full recompute; the others fall back to it."""
    steps = {"kernel_exp": True, "kernel_rbf": True, "kernel_poly": True, "kernel_linear": True, "additive": True,
             "additive_1layer": True, "pe_lookup": False, "pe_product_xl": False, "pe_product_symmetric": False,
             "coda": False, "coda_cs": False, "realformer": False}
    src = torch.randint(3, 25, (3, 6), generator=torch.Generator().manual_seed(0))
    src[1, 4:] = 0  # padded source
    for scheme, can_step in steps.items():
        torch.manual_seed(3)
        m = Seq2SeqTransformer(25, 25, factory(scheme), encoder_layers=1, decoder_layers=2, **SIZES).eval()
        assert m.can_step == can_step, scheme
        if scheme in ("kernel_rbf", "kernel_poly", "additive"):  # the step paths: softmax, raw kernel, additive
            assert torch.equal(m.greedy_decode(src, 1, 2, max_len=5),
                               m.greedy_decode(src, 1, 2, max_len=5, incremental=False)), scheme
            memory, memory_mask, _ = m.encode(src)
            prefix = torch.tensor([[1, 5, 6, 7]] * 3)
            full, _ = m.decode(prefix, memory, memory_mask)
            cache = {}
            for t in range(4):
                step = m.decode_step(prefix[:, t: t + 1], memory, memory_mask, cache)
                torch.testing.assert_close(step, full[:, t], rtol=1e-5, atol=1e-5)


# ---- every new scheme through the command line -------------------------------------------

SMALL = ["debug=fast", "diagnostics.plots=never", "trainer.max_steps=4", "run_test=false", "task.train_size=64",
         "task.val_size=16", "task.test_size=16", "task.batch_size=8"]  # the figures: tests/diagnostics


@pytest.mark.slow  # a multirun sweep of every scheme
def test_every_new_scheme_runs_in_a_multirun(tmp_path, monkeypatch):
    from helpers import nas_run

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs' tiny models: see one_thread()
    # every scheme of the registry; Hydra's basic sweeper takes products only, so the schemes
    # that declare they place positions themselves (model.positions=none) run in a second multirun
    from nas_cli.model.choices import available

    schemes = available("attention")
    causal_only = [s for s in schemes if build_core(s).causal_self_only]  # at the decoder, UNAS elsewhere
    own = [s for s in schemes if build_core(s).requires_no_input_positions]
    plain = [s for s in schemes if s not in own and s not in causal_only]
    assert set(PE_SCHEMES) <= set(own) and set(NEW_SCHEMES) <= set(plain)  # the flag says what the names say
    for name, key, extra, schemes in (("plain", "attention", [], plain), ("pe", "attention", ["model.positions=none"], own),
                                      ("decoder", "attention.decoder", [], causal_only)):
        sweep = tmp_path / name
        proc = nas_run("-m", *SMALL, "logger=csv", *extra, f"{key}={','.join(schemes)}",
                       f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
        tags = sorted(schemes) if key == "attention" else sorted(f"enc-unas_dec-{s}_cross-unas" for s in schemes)
        assert sorted(s["scheme"] for s in summaries) == tags
        assert all(s["steps"] == 4 for s in summaries)


def test_linear_kernel_divergence_stops_the_run_with_the_reason(tmp_path):
    """A diverging linear-kernel run stops with KernelDiverged (a UserError: the CLI prints it
    as one line and exits 2, see test_cli) naming the kernel, and writes no summary.json."""
    from hydra import compose, initialize_config_dir

    from nas_cli.pipeline.run import train

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*SMALL, "logger=none", "attention=kernel_linear", "optim.lr=inf"])
    with pytest.raises(KernelDiverged, match=r"attention kernel 'linear' \(encoder layer 0\).*Tsai"):
        train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    assert not (tmp_path / "summary.json").exists()
