"""Today's baselines against plain float64 transcriptions of their papers' equations.

Each reference below is written from the equation in the scheme's docstring, one query row at a
time with Python loops over keys, sharing no code with nas_cli/attention/. Checked: weights and
outputs with padding and in the causal form; the blocked path (more queries than block_size)
against the formula, gradients included; the one-query step against the full forward.
"""
import math

import pytest
import torch
from omegaconf import OmegaConf

from nas_cli.attention.base import SchemeError
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import make_core_factory

D = 8


def core_of(scheme, causal=True, location="decoder", heads=4, layer=0, **options):
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    for k, v in options.items():
        cfg[k] = v
    core = make_core_factory(cfg, heads)(location, layer, causal)
    core.set_width(heads * D)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in core.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return core.double().eval()


def data(b=2, h=4, t=7, sk=None, seed=0, n=0):
    g = torch.Generator().manual_seed(seed)
    sk = sk or t
    q = torch.randn(b, h, t, D, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(b, h, sk, D, generator=g, dtype=torch.float64) * 1.5
    v = torch.randn(b, h, sk, D, generator=g, dtype=torch.float64)
    x = torch.randn(b, h, t, n, generator=g, dtype=torch.float64) if n else None
    return q, k, v, x


def score(q, k, b, h, i, j):
    return float((q[b, h, i] * k[b, h, j]).sum()) / math.sqrt(q.size(-1))


def sees(i, j, causal, mask, b):
    return (j <= i or not causal) and (mask is None or bool(mask[b, j]))


def reference(fn, q, k, v, causal, mask=None):
    """weights[b, h, i, j] = fn(b, h, i, visible keys) -> {j: weight}; padded queries get zeros."""
    bsz, heads, sq, _ = q.shape
    w = torch.zeros(bsz, heads, sq, k.size(-2), dtype=torch.float64)
    for b in range(bsz):
        for h in range(heads):
            for i in range(sq):
                if mask is not None and not mask[b, i]:
                    continue
                keys = [j for j in range(k.size(-2)) if sees(i, j, causal, mask, b)]
                for j, value in fn(b, h, i, keys).items():
                    w[b, h, i, j] = value
    return w


def sigmoid_ref(q, k, bias=None):
    def fn(b, h, i, keys):
        bb = -math.log(len(keys)) if bias is None else bias
        return {j: 1 / (1 + math.exp(-(score(q, k, b, h, i, j) + bb))) for j in keys}
    return fn


def softpick_ref(q, k, eps=1e-6):
    def fn(b, h, i, keys):
        e = {j: math.exp(score(q, k, b, h, i, j)) - 1 for j in keys}
        den = sum(abs(x) for x in e.values()) + eps
        return {j: max(x, 0.0) / den for j, x in e.items()}
    return fn


def stick_ref(q, k, attend_to_self=True):
    def fn(b, h, i, keys):
        beta = {j: 1 / (1 + math.exp(-score(q, k, b, h, i, j))) for j in keys}
        out = {}
        for j in keys:
            if j < i:
                p = beta[j]
                for kk in keys:
                    if j < kk < i:
                        p *= 1 - beta[kk]
                out[j] = p
        if attend_to_self:
            out[i] = 1 - sum(out.values())
        return out
    return fn


def selective_ref(q, k):
    def fn(b, h, i, keys):
        logits = {}
        for j in keys:
            f = sum(max(score(q, k, b, 0, kk, j), 0.0) for kk in range(i) if kk != j and j != 0 and j <= kk)
            logits[j] = score(q, k, b, h, i, j) - f
        z = sum(math.exp(x) for x in logits.values())
        return {j: math.exp(x) / z for j, x in logits.items()}
    return fn


def forgetting_ref(q, k, x):
    logf = torch.nn.functional.logsigmoid(x[..., 0])

    def fn(b, h, i, keys):
        logits = {j: score(q, k, b, h, i, j) + float(sum(logf[b, h, l] for l in range(j + 1, i + 1))) for j in keys}
        z = sum(math.exp(x) for x in logits.values())
        return {j: math.exp(x) / z for j, x in logits.items()}
    return fn


def softmax_ref(q, k):
    def fn(b, h, i, keys):
        z = sum(math.exp(score(q, k, b, h, i, j)) for j in keys)
        return {j: math.exp(score(q, k, b, h, i, j)) / z for j in keys}
    return fn


MASK = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])

ROWWISE = {  # scheme, options -> reference weights
    "sigmoid": lambda q, k, x: sigmoid_ref(q, k),
    "softpick": lambda q, k, x: softpick_ref(q, k),
    "stickbreaking": lambda q, k, x: stick_ref(q, k),
    "selective": lambda q, k, x: selective_ref(q, k),
    "forgetting": lambda q, k, x: forgetting_ref(q, k, x),
}


@pytest.mark.parametrize("scheme", list(ROWWISE))
@pytest.mark.parametrize("padded", [False, True])
def test_causal_weights_and_outputs_equal_the_papers_formula(scheme, padded):
    core = core_of(scheme)
    q, k, v, x = data(n=core.input_features(D))
    mask = MASK if padded else None
    kw = {"x": x} if x is not None else {}
    res = core(q, k, v, q_mask=mask, k_mask=mask, need_weights=True, **kw)
    ref = reference(ROWWISE[scheme](q, k, x), q, k, v, True, mask)
    torch.testing.assert_close(res.weights, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(res.out, ref @ v, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(core(q, k, v, q_mask=mask, k_mask=mask, **kw).out, ref @ v, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scheme", ["sigmoid", "softpick"])
def test_encoder_and_cross_forms_equal_the_formula(scheme):
    enc = core_of(scheme, causal=False, location="encoder")
    q, k, v, _ = data()
    ref = reference(ROWWISE[scheme](q, k, None), q, k, v, False, MASK)
    res = enc(q, k, v, q_mask=MASK, k_mask=MASK, need_weights=True)
    torch.testing.assert_close(res.weights, ref, rtol=1e-9, atol=1e-12)
    cross = core_of(scheme, causal=False, location="cross")
    q, k, v, _ = data(t=3, sk=9)
    ref = reference(ROWWISE[scheme](q, k, None), q, k, v, False)
    torch.testing.assert_close(cross(q, k, v, need_weights=True).weights, ref, rtol=1e-9, atol=1e-12)


def test_sigmoid_fixed_bias_and_stick_breaking_without_self():
    q, k, v, _ = data()
    res = core_of("sigmoid", bias=-2.0)(q, k, v, need_weights=True)
    torch.testing.assert_close(res.weights, reference(sigmoid_ref(q, k, -2.0), q, k, v, True))
    sb = core_of("stickbreaking", attend_to_self=False)
    assert not sb.rows_sum_to_one and core_of("stickbreaking").rows_sum_to_one
    res = sb(q, k, v, need_weights=True)
    torch.testing.assert_close(res.weights, reference(stick_ref(q, k, False), q, k, v, True))
    assert bool((res.weights.sum(-1) < 1).all())  # what is left is not attended


def test_gated_attention_is_softmax_times_the_gate():
    for placement in ("sdpa", "value"):
        for granularity, n in (("elementwise", D), ("headwise", 1)):
            core = core_of("gated", placement=placement, granularity=granularity)
            assert core.input_features(D) == n
            q, k, v, x = data(n=n)
            ref_w = reference(softmax_ref(q, k), q, k, v, True, MASK)
            gate = torch.sigmoid(x)
            want = ref_w @ v * gate if placement == "sdpa" else ref_w @ (v * gate)
            want = want * MASK[:, None, :, None]
            for need in (True, False):
                res = core(q, k, v, q_mask=MASK, k_mask=MASK, need_weights=need, x=x)
                torch.testing.assert_close(res.out, want, rtol=1e-9, atol=1e-12)
    with pytest.raises(Exception, match="placement=value gates values"):
        core_of("gated", causal=False, location="cross", placement="value")


@pytest.mark.parametrize("layer", [0, 3])
def test_differential_attention_equals_the_papers_equation(layer):
    core = core_of("differential", layer=layer)
    assert core.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
    q, k, v, _ = data()
    lq1, lk1, lq2, lk2 = core.lambdas.detach()
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + core.lambda_init
    res = core(q, k, v, q_mask=MASK, k_mask=MASK, need_weights=True)
    a = reference(softmax_ref(q, k), q, k, v, True, MASK)
    for p in range(2):
        w = a[:, 2 * p] - lam * a[:, 2 * p + 1]
        o = w @ torch.cat([v[:, 2 * p], v[:, 2 * p + 1]], -1)
        rms = torch.sqrt(o.square().mean(-1, keepdim=True) + 1e-5)
        o = o / rms * core.norm_weight.detach() * (1 - core.lambda_init) * MASK[..., None]
        torch.testing.assert_close(res.out[:, 2 * p], o[..., :D], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res.out[:, 2 * p + 1], o[..., D:], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res.weights[:, 2 * p], w)
    torch.testing.assert_close(core(q, k, v, q_mask=MASK, k_mask=MASK).out, res.out, rtol=1e-9, atol=1e-12)
    with pytest.raises(Exception, match="model.heads=3 must be even"):
        core_of("differential", heads=3)


@pytest.mark.parametrize("scheme", ["sigmoid", "softpick", "stickbreaking", "selective"])
def test_blocks_of_queries_give_the_formulas_values_and_gradients(scheme):
    """More queries than block_size: blocks under checkpointing, the later keys of a causal block
    skipped, selective's column sums carried from block to block."""
    one = core_of(scheme, block_size=64)
    blocked = core_of(scheme, block_size=3)
    q, k, v, _ = data(t=11)
    mask = torch.tensor([[True] * 11, [True] * 8 + [False] * 3])
    grads = []
    for core in (one, blocked):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = core(qq, kk, vv, q_mask=mask, k_mask=mask).out
        out.square().sum().backward()
        grads.append((out.detach(), qq.grad, kk.grad, vv.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scheme", ["sigmoid", "softpick", "stickbreaking", "selective", "forgetting", "gated",
                                    "differential"])
def test_one_query_steps_equal_the_full_forward(scheme):
    core = core_of(scheme)
    n = core.input_features(D)
    q, k, v, x = data(t=9, n=n)
    full = core(q, k, v, **({"x": x} if n else {})).out
    state, outs = None, []
    for i in range(9):
        kw = {"x": x[..., i:i + 1, :]} if n else {}
        o, state = core.step(q[..., i:i + 1, :], k[..., :i + 1, :], v[..., :i + 1, :], None, state, **kw)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, -2), full, rtol=1e-9, atol=1e-12)
    if core.carries_state and not n:  # the prefill's state in one pass equals the steps'
        torch.testing.assert_close(core.prefill_state(q, k, v, None, None), state)


@pytest.mark.parametrize("scheme", ["forgetting", "selective", "stickbreaking"])
def test_a_causal_only_scheme_elsewhere_is_refused_naming_the_decoder_form(scheme):
    with pytest.raises(Exception) as err:
        core_of(scheme, causal=False, location="encoder")
    assert isinstance(err.value.__cause__ or err.value, SchemeError)
    assert f"attention.decoder={scheme}" in str(err.value)


@pytest.mark.parametrize("scheme", ["sigmoid", "softpick", "stickbreaking", "selective", "forgetting", "gated",
                                    "differential"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_autocast_stays_finite_and_close(scheme, dtype):
    core = core_of(scheme).float()
    n = core.input_features(D)
    q, k, v, x = (None if t is None else t.float() for t in data(t=12, n=n))
    kw = {"x": x} if n else {}
    ref = core(q, k, v, **kw).out
    with torch.autocast("cpu", dtype=dtype):
        low = core(q.to(dtype), k.to(dtype), v.to(dtype), **({"x": x.to(dtype)} if n else {})).out
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), ref, rtol=0.05, atol=0.05)
