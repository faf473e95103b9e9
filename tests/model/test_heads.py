"""The head settings of today's models around every scheme (nas_cli/model/heads.py): grouped-query key/values,
QK-norm and RoPE scaling. Each is checked against an independent reference (PyTorch's own grouped-query SDPA,
RMSNorm written out, Hugging Face Transformers' RoPE frequencies), and with every scheme: causality, and
incremental decoding equal to recomputing the prefix with the cache holding the unrepeated key/value heads."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_lm_causal, assert_steps_equal_recomputing, build_core, nas_run, section_commands
from test_model import SIZES, factory, positions_for

from nas_cli.model.heads import HeadSettings, RopeScaling
from nas_cli.model.memory import kv_cache_bytes_per_token
from nas_cli.model.transformer import DecoderOnlyLM, MultiHeadAttention, Seq2SeqTransformer

YARN = {"type": "yarn", "factor": 4.0, "original_max_len": 16}


def _settings(scheme):
    """Every setting the scheme takes: 2 key/value heads for 4 query heads unless its keys are its queries, QK-norm,
    and rotary positions scaled by YaRN unless it places positions itself."""
    tied = build_core(scheme).tie_qk
    rope = positions_for(scheme) != "none"
    return dict(kv_heads=None if tied else 2, qk_norm=True, positions="rope" if rope else "none",
                rope_scaling=YARN if rope else None)


def test_lm_is_causal_with_every_setting(scheme):
    torch.manual_seed(0)
    options = _settings(scheme)
    assert_lm_causal(DecoderOnlyLM(20, factory(scheme), decoder_layers=2, **{**SIZES, **options}).eval())


def test_incremental_decoding_with_every_setting_equals_recomputing(scheme):
    torch.manual_seed(3)
    options = _settings(scheme)
    m = Seq2SeqTransformer(25, 25, factory(scheme), encoder_layers=1, decoder_layers=2, **{**SIZES, **options}).eval()
    src = torch.randint(3, 25, (3, 6))
    assert torch.equal(m.greedy_decode(src, 1, 2, max_len=8), m.greedy_decode(src, 1, 2, max_len=8, incremental=False))
    if not m.can_step:
        return
    cache = assert_steps_equal_recomputing(m)
    kv = options["kv_heads"] or 4
    assert cache["layers"][0]["self"]["k"].shape[1] == kv  # the cache holds the key/value heads unrepeated


def test_grouped_query_attention_equals_pytorchs_own():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, build_core("unas", heads=4, causal=True, location="decoder"),
                             settings=HeadSettings(kv_heads=2)).eval()
    assert mha.k_proj.out_features == mha.v_proj.out_features == 16  # 2 heads of 8
    x = torch.randn(2, 7, 32)
    out, _ = mha(x, x)
    split = lambda t, h: t.view(2, 7, h, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(mha.q_proj(x), 4), split(mha.k_proj(x), 2), split(mha.v_proj(x), 2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, mha.out_proj(ref.transpose(1, 2).reshape(2, 7, 32)), rtol=1e-5, atol=1e-6)


def test_qk_norm_is_rmsnorm_of_each_head_with_a_learned_scale():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, build_core("unas"), settings=HeadSettings(qk_norm=True))
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32)
    raw = mha.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    want = raw / torch.sqrt(raw.pow(2).mean(-1, keepdim=True) + torch.finfo(raw.dtype).eps) * mha.q_norm.weight
    torch.testing.assert_close(mha.queries(x), want, rtol=1e-5, atol=1e-6)
    assert mha.k_norm is not mha.q_norm


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_rope_scaling_frequencies_equal_transformers(kind):
    """Hugging Face's own RoPE initialisations: linear and yarn directly; NTK-aware as its dynamic NTK at the
    length where the dynamic base equals the static one (base * ((f L / L0) - (f - 1)) = base * f)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    factor, original, d = 4.0, 64, 16
    rope = {"rope_type": {"ntk": "dynamic"}.get(kind, kind), "rope_theta": 10000.0, "factor": factor,
            "original_max_position_embeddings": original}
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=original * 4,
                         rope_parameters=rope)
    seq_len = int(original * (2 * factor - 1) / factor) if kind == "ntk" else None
    if kind == "ntk":
        config.max_position_embeddings = original
    want, want_gain = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", seq_len=seq_len)
    got, gain = RopeScaling(kind, factor, original).frequencies(d, 10000.0)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-5, atol=1e-7)
    assert gain == pytest.approx(want_gain)
    if kind == "yarn":
        assert gain == pytest.approx(0.1 * math.log(4) + 1)  # Peng et al. 2023: sqrt(1/t) = 0.1 ln(s) + 1


def test_rope_scaling_reaches_the_scores_and_a_factor_of_one_changes_nothing():
    from nas_cli.attention.positions import rotate

    x, pos = torch.randn(1, 2, 6, 8), torch.arange(6)
    torch.testing.assert_close(rotate(x, pos, scaling=RopeScaling("linear", 1.0, 16)), rotate(x, pos))
    torch.testing.assert_close(rotate(x, pos, scaling=RopeScaling("linear", 2.0, 16)),
                               rotate(x, pos.double() / 2))  # position interpolation: positions / factor


def test_kv_cache_bytes_per_token_count_the_key_value_heads():
    lm = DecoderOnlyLM(20, factory("unas"), decoder_layers=3, **{**SIZES, "kv_heads": 1})
    assert kv_cache_bytes_per_token(lm) == 3 * 2 * 1 * 8 * 4  # layers x (keys, values) x heads x size x float32
    full = DecoderOnlyLM(20, factory("unas"), decoder_layers=3, **SIZES)
    assert kv_cache_bytes_per_token(full) == 4 * kv_cache_bytes_per_token(lm)


@pytest.mark.parametrize("args, words", [
    (["model.kv_heads=3"], "model.kv_heads=3 must divide model.heads=4"),
    (["model.rope_scaling={type:yarn,factor:4,original_max_len:64}"], "it needs model.positions=rope"),
    (["model.positions=rope", "model.rope_scaling=yarn"], "model.rope_scaling=yarn: give the type, the factor"),
    (["model.positions=rope", "model.rope_scaling={type:dynamic,factor:4,original_max_len:64}"],
     "model.rope_scaling.type=dynamic: choose one of linear, ntk, yarn"),
    (["attention=kernel_exp", "attention.symmetric=true", "model.positions=sinusoidal", "model.kv_heads=2"],
     "ties its keys to its queries"),
    # multi-head latent attention (model.mla): the other refusals are checked where they are made (test_latent.py)
    (["model.mla=true", "model.kv_heads=2"], "model.kv_heads=2 with model.mla"),
    (["attention=kernel_exp", "attention.symmetric=true", "model.positions=sinusoidal", "model.mla=true"],
     "model.mla: scheme 'kernel_exp' ties its keys to its queries"),
])
def test_bad_head_settings_are_one_line_before_training(tmp_path, args, words):
    proc = nas_run("task=copy_lm", "debug=fast", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()  # nothing left behind


def test_the_pages_commands_run_as_written(tmp_path):
    """docs/attention.md's two commands (head settings), as written there, each to a summary."""
    import json

    commands = section_commands("attention.md", "### Head settings of today's models")
    assert len(commands) == 2
    for i, argv in enumerate(commands):
        assert argv[0] == "nas-run"
        proc = nas_run(*argv[1:], f"hydra.run.dir={tmp_path / str(i)}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads((tmp_path / str(i) / "summary.json").read_text())
        assert summary["kv_cache_bytes_per_token"] > 0
