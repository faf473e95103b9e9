"""The recurrent token mixers (linear attention, DeltaNet, Gated DeltaNet): the chunked sequence form equals the
recurrence in float64, each core equals a transcription of its paper's definition, the decoding cache keeps the
state and only the newest key, and the run reports the state's size."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_steps_equal_recomputing, build_core, nas_run

from nas_cli.attention.recurrent import chunked, implicit_weights, recurrence

B, H, T, D = 2, 3, 29, 6


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, generator=g) for _ in range(3))
    return q, F.normalize(k, dim=-1), v, -torch.rand(B, H, T, dtype=torch.float64, generator=g), \
        torch.rand(B, H, T, dtype=torch.float64, generator=g)


@pytest.mark.parametrize("gated, delta", [(None, False), ("head", False), ("feature", False), (None, True),
                                          ("head", True)])  # a decay per key feature is GLA's: additive only
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_the_chunked_form_equals_the_recurrence_in_float64(gated, delta, chunk):
    q, k, v, g, beta = _inputs()
    g = {None: None, "head": g, "feature": -torch.rand(B, H, T, D, dtype=torch.float64)}[gated]
    beta = beta if delta else None
    state = torch.randn(B, H, D, D, dtype=torch.float64)
    want, want_state = recurrence(q, k, v, g, beta, state)
    got, got_state = chunked(q, k, v, g, beta, state, chunk=chunk)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-12)
    zero, _ = recurrence(q, k, v, g, beta)
    torch.testing.assert_close(implicit_weights(q, k, g, beta) @ v, zero, rtol=0, atol=1e-12)


def _core(name, **options):
    core = build_core(name, heads=H, causal=True, location="decoder", **options).double()
    core.set_width(H * D)
    return core.double()


def test_linear_attention_is_katharopoulos_et_als_formula():
    q, k, v, _, _ = _inputs(1)
    out = _core("linear_attention")(q, k, v).out
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    for t in range(T):  # o_t = phi(q_t)^T sum_{s<=t} phi(k_s) v_s^T / phi(q_t)^T sum_{s<=t} phi(k_s)
        num = torch.einsum("bhd,bhsd,bhse->bhe", phi_q[:, :, t], phi_k[:, :, :t + 1], v[:, :, :t + 1])
        den = torch.einsum("bhd,bhsd->bh", phi_q[:, :, t], phi_k[:, :, :t + 1])[..., None]
        torch.testing.assert_close(out[:, :, t], num / den, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_the_delta_rules_are_their_papers_recurrences(name):
    """In the papers' convention: S_t in R^{d_v x d_k}, S_t = S_{t-1} (a_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T,
    o_t = S_t q_t (a_t = 1 for DeltaNet), with the features of flash-linear-attention's layer."""
    core = _core(name)
    q, k, v, _, _ = _inputs(2)
    x = torch.randn(B, H, T, core.input_features(D), dtype=torch.float64)
    out = core(q, k, v, x=x).out
    qn, kn = F.normalize(F.silu(q), dim=-1) / D ** 0.5, F.normalize(F.silu(k), dim=-1)
    beta = torch.sigmoid(x[..., 0])
    if name == "gated_deltanet":
        a = torch.exp(-core.a_log.exp()[None, :, None] * F.softplus(x[..., 1] + core.dt_bias[None, :, None]))
    else:
        a = torch.ones_like(beta)
    s = torch.zeros(B, H, D, D, dtype=torch.float64)
    eye = torch.eye(D, dtype=torch.float64)
    for t in range(T):
        kt, bt = kn[:, :, t], beta[:, :, t][..., None, None]
        s = s @ (a[:, :, t][..., None, None] * (eye - bt * kt[..., :, None] * kt[..., None, :])) \
            + bt * v[:, :, t][..., :, None] * kt[..., None, :]
        torch.testing.assert_close(out[:, :, t], torch.einsum("bhvk,bhk->bhv", s, qn[:, :, t]), rtol=0, atol=1e-12)


def test_gla_is_yang_et_als_recurrence():
    """S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t / sqrt(d), a_t = sigma(W2 (W1 x_t) + b)^(1/16)."""
    core = _core("gla")
    q, k, v, _, _ = _inputs(3)
    x = torch.randn(B, H, T, core.input_features(D), dtype=torch.float64)  # W1 x_t, rank 16 per head
    out = core(q, k, v, x=x).out
    a = torch.sigmoid(torch.einsum("bhtr,hrd->bhtd", x, core.gate_up) + core.gate_bias[None, :, None]) ** (1 / 16)
    s = torch.zeros(B, H, D, D, dtype=torch.float64)
    for t in range(T):
        s = a[:, :, t][..., :, None] * s + k[:, :, t][..., :, None] * v[:, :, t][..., None, :]
        torch.testing.assert_close(out[:, :, t], torch.einsum("bhkv,bhk->bhv", s, q[:, :, t]) / D ** 0.5,
                                   rtol=0, atol=1e-12)


def test_mamba2_is_the_ssd_recurrence():
    """Dao and Gu 2024, per head in the paper's notation (C, B, x = q, k, v; N = P = d): h_t = exp(dt_t A) h_{t-1}
    + dt_t B_t x_t^T, y_t = C_t^T h_t + D x_t, dt_t = softplus(w . u_t + b), A = -exp(A_log); and the implicit
    matrix times the values is the output."""
    core = _core("mamba2")
    with torch.no_grad():
        core.d_skip.copy_(torch.linspace(0.5, 2.0, H))
    q, k, v, _, _ = _inputs(4)
    x = torch.randn(B, H, T, core.input_features(D), dtype=torch.float64)
    res = core(q, k, v, x=x, need_weights=True)
    dt = F.softplus(x[..., 0] + core.dt_bias[None, :, None])
    a = -core.a_log.exp()[None, :]  # (1, H)
    h = torch.zeros(B, H, D, D, dtype=torch.float64)
    for t in range(T):
        h = torch.exp(dt[:, :, t] * a)[..., None, None] * h \
            + dt[:, :, t][..., None, None] * k[:, :, t][..., :, None] * v[:, :, t][..., None, :]
        y = torch.einsum("bhnp,bhn->bhp", h, q[:, :, t]) + core.d_skip[None, :, None] * v[:, :, t]
        torch.testing.assert_close(res.out[:, :, t], y, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.weights @ v, res.out, rtol=0, atol=1e-12)


def test_mamba2_with_a_state_size_of_its_own_is_the_ssd_recurrence_and_decodes_alike():
    """attention.state=N: B and C of N features per head (Mamba-2's d_state), x of the head's d = P; the state N x P
    per head. The recurrence written out with N != P, the model's projections and convolution at those sizes, its
    summary's state bytes, and decoding equal to recomputing the prefix."""
    from omegaconf import OmegaConf

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.model.memory import recurrent_state_bytes
    from nas_cli.model.plan import make_core_factory
    from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer

    n = 10
    core = _core("mamba2", state=n)
    assert core.qk_width(D) == n
    q, k = (torch.randn(B, H, T, n, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, D, dtype=torch.float64)
    x = torch.randn(B, H, T, core.input_features(D), dtype=torch.float64)
    out = core(q, k, v, x=x).out
    dt = F.softplus(x[..., 0] + core.dt_bias[None, :, None])
    h = torch.zeros(B, H, n, D, dtype=torch.float64)
    for t in range(T):
        h = torch.exp(-dt[:, :, t] * core.a_log.exp()[None, :])[..., None, None] * h \
            + dt[:, :, t][..., None, None] * k[:, :, t][..., :, None] * v[:, :, t][..., None, :]
        y = torch.einsum("bhnp,bhn->bhp", h, q[:, :, t]) + core.d_skip[None, :, None] * v[:, :, t]
        torch.testing.assert_close(out[:, :, t], y, rtol=0, atol=1e-12)
    plan = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    plan.decoder = OmegaConf.load(CONF_DIR / "attention" / "mamba2.yaml")
    plan.decoder.state, plan.decoder.conv = n, 4
    sizes = dict(d_model=32, heads=4, ffn=64, dropout=0.0, max_len=64)
    lm = DecoderOnlyLM(20, make_core_factory(plan, 4), decoder_layers=2, **sizes)
    layer = lm.layers[0].self_attn
    assert layer.q_proj.out_features == layer.k_proj.out_features == 4 * n and layer.v_proj.out_features == 32
    # per layer: heads x N x P, and the convolution's last 3 inputs of B, C (N each) and x (P)
    assert recurrent_state_bytes(lm) == 2 * (4 * n * 8 + 4 * (n + n + 8) * 3) * 4
    torch.manual_seed(2)
    m = Seq2SeqTransformer(25, 25, make_core_factory(plan, 4), encoder_layers=1, decoder_layers=2, **sizes).eval()
    assert_steps_equal_recomputing(m)


def test_decoding_keeps_the_state_and_only_the_newest_key(tmp_path):
    from omegaconf import OmegaConf

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.model.memory import kv_cache_bytes_per_token, recurrent_state_bytes
    from nas_cli.model.plan import make_core_factory
    from nas_cli.model.transformer import Seq2SeqTransformer

    plan = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    plan.decoder = OmegaConf.load(CONF_DIR / "attention" / "gated_deltanet.yaml")  # attention.decoder=gated_deltanet
    torch.manual_seed(0)
    m = Seq2SeqTransformer(25, 25, make_core_factory(plan, 4), encoder_layers=1, decoder_layers=2, d_model=32,
                           heads=4, ffn=64, dropout=0.0, max_len=64).eval()
    cache = assert_steps_equal_recomputing(m, batch=2)
    layer = cache["layers"][0]["self"]
    assert layer["k"].size(2) == 1 and layer["state"].shape == (2, 4, 8, 8)
    assert kv_cache_bytes_per_token(m) == 0 and recurrent_state_bytes(m) == 2 * 4 * 8 * 8 * 4


def test_a_run_reports_the_state_and_a_mixer_elsewhere_is_one_line(tmp_path):
    proc = nas_run("task=mqar", "attention=deltanet", "debug=fast", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["kv_cache_bytes_per_token"] == 0 and summary["recurrent_state_bytes"] > 0
    from helpers import run_command, script

    report = run_command([script("nas-report"), str(tmp_path / "run"), "--format", "json"], cwd=tmp_path)
    runs = json.loads(report.stdout)["runs"]
    assert {"KV cache B/token", "state B"} <= set(runs["columns"])
    assert runs["rows"][0]["state B"] == f"{summary['recurrent_state_bytes']:,}"
    bad = nas_run("task=reverse", "attention=deltanet", "debug=fast", f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert bad.returncode == 2 and "defined for causal self-attention only" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_the_short_convolution_is_the_causal_formula_and_steps_alike():
    """y_t = silu(sum_i w_i x_{t-K+1+i}) per channel, zeros before the start; a left-padded sequence is convolved as
    it is alone; one position at a time with the last K - 1 inputs kept gives the same."""
    from nas_cli.attention.short_conv import ShortConv

    conv = ShortConv(H, D, 4).double()
    q, k, v, _, _ = _inputs(5)
    got = conv.sequence([q, k, v])
    for s, (x, y) in enumerate(zip((q, k, v), got)):
        w = conv.weight[s].view(H, D, 4)
        padded = F.pad(x, (0, 0, 3, 0))
        ref = sum(w[None, :, None, :, i] * padded[:, :, i:i + T] for i in range(4))
        torch.testing.assert_close(y, F.silu(ref), rtol=0, atol=1e-12)
    kept = None
    for t in range(T):
        step, kept = conv.step([x[:, :, t:t + 1] for x in (q, k, v)], kept)
        for y, s in zip(got, step):
            torch.testing.assert_close(s, y[:, :, t:t + 1], rtol=0, atol=1e-12)
    mask = torch.ones(B, T + 2, dtype=torch.bool)
    mask[:, :2] = False
    lead = [F.pad(x, (0, 0, 2, 0), value=7.0) for x in (q, k, v)]  # padding holds anything
    for y, z in zip(got, conv.sequence(lead, mask)):
        torch.testing.assert_close(z[:, :, 2:], y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["linear_attention", "deltanet", "gated_deltanet", "gla", "mamba2"])
def test_every_mixer_with_a_convolution_and_a_gate_is_causal_and_decodes_as_its_forward(name):
    from omegaconf import OmegaConf

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.model.memory import recurrent_state_bytes
    from nas_cli.model.plan import make_core_factory
    from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer

    plan = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    plan.decoder = OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml")
    plan.decoder.conv = 4
    plan.decoder.gate = True
    sizes = dict(d_model=32, heads=4, ffn=64, dropout=0.0, max_len=64)
    torch.manual_seed(0)
    lm = DecoderOnlyLM(20, make_core_factory(plan, 4), decoder_layers=2, **sizes).eval()
    ids = torch.randint(3, 20, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(3, 20, (2, 4))
    torch.testing.assert_close(lm(changed)[0][:, :6], lm(ids)[0][:, :6], rtol=0, atol=1e-5)
    without = OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml")
    plain = DecoderOnlyLM(20, make_core_factory(without, 4), decoder_layers=2, **sizes)
    assert recurrent_state_bytes(lm) == recurrent_state_bytes(plain) + 2 * 3 * 4 * 8 * 3 * 4  # layers, q k v, ...
    torch.manual_seed(1)
    m = Seq2SeqTransformer(25, 25, make_core_factory(plan, 4), encoder_layers=1, decoder_layers=2, **sizes).eval()
    assert_steps_equal_recomputing(m)


@pytest.mark.slow  # the page's example, run as written
def test_the_pages_commands_run_as_written(tmp_path):
    """docs/attention.md's mixer commands, as written there, each to a summary with its state's size."""
    import json
    import shlex

    from datafiles import ROOT
    from helpers import nas_run

    page = (ROOT / "docs" / "attention.md").read_text()
    block = page.split("### Recurrent token mixers")[1].split("```bash")[1].split("```")[0]
    commands = [shlex.split(line) for line in block.strip().splitlines()]
    assert len(commands) == 1
    for i, argv in enumerate(commands):
        proc = nas_run(*argv[1:], "diagnostics.plots=never", f"hydra.run.dir={tmp_path / str(i)}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads((tmp_path / str(i) / "summary.json").read_text())
        assert summary["recurrent_state_bytes"] > 0 and summary["kv_cache_bytes_per_token"] == 0


@pytest.mark.parametrize("name", ["deltanet", "mamba2"])
def test_the_output_gate_is_the_layers_norm_and_silu(name):
    """flash-linear-attention's DeltaNet layer: RMSNorm(o) * silu(g); Mamba-2's: RMSNorm(y * silu(z)); g and z the
    last d_head features of the input projection, after the rule's own."""
    gated = build_core(name, heads=H, causal=True, location="decoder", gate=True).double()
    gated.set_width(H * D)
    gated.double()
    plain = build_core(name, heads=H, causal=True, location="decoder").double()
    plain.set_width(H * D)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if "gate_norm" not in k})
    plain.double()
    with torch.no_grad():
        gated.gate_norm.weight.uniform_(0.5, 1.5)
    q, k, v, _, _ = _inputs(6)
    own = plain.input_features(D)
    assert gated.input_features(D) == own + D
    x = torch.randn(B, H, T, own + D, dtype=torch.float64)
    o = plain(q, k, v, x=x[..., :own]).out
    g = F.silu(x[..., own:])
    rms = lambda t: t / t.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * gated.gate_norm.weight  # noqa: E731
    ref = rms(o * g) if name == "mamba2" else rms(o) * g
    torch.testing.assert_close(gated(q, k, v, x=x).out, ref, rtol=0, atol=1e-12)
