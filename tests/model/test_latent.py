"""Multi-head latent attention (model.mla, nas_cli/model/latent.py): checked against Hugging Face Transformers'
DeepSeek-V3 attention with the same weights, and with every scheme that takes it: causality, and incremental
decoding equal to recomputing the prefix with the cache holding the latents (not the heads' keys and values)."""
from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import assert_lm_causal, assert_steps_equal_recomputing, build_core, nas_run, section_commands
from test_model import SIZES, factory, positions_for

from nas_cli.model.heads import HeadSettings
from nas_cli.model.latent import LatentSpec
from nas_cli.model.memory import kv_cache_bytes_per_token
from nas_cli.model.multihead import MultiHeadAttention
from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer

MLA = {"kv_rank": 12, "q_rank": 10, "rope_dim": 4}


def _refused(scheme) -> bool:
    core = build_core(scheme)
    return bool(core.tie_qk or core.input_positions)


@pytest.mark.parametrize("q_rank", [None, 10])
def test_latent_attention_equals_transformers_deepseek_v3(q_rank):
    """The same weights in Transformers' DeepseekV3Attention (eager, half-split RoPE) and in nas-run's layer with
    softmax attention: equal outputs, with and without the query latent."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    torch.manual_seed(0)
    d_model, heads, d_head, rope_dim, kv_rank, t = 32, 4, 8, 4, 12, 7
    config = DeepseekV3Config(hidden_size=d_model, num_attention_heads=heads, num_key_value_heads=heads,
                              q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_rope_head_dim=rope_dim,
                              qk_nope_head_dim=d_head - rope_dim, v_head_dim=d_head, rope_interleave=False,
                              attention_bias=False, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    ref = DeepseekV3Attention(config, 0).double().eval()
    spec = LatentSpec(kv_rank, q_rank, rope_dim)
    mha = MultiHeadAttention(d_model, heads, build_core("unas", heads=heads, causal=True, location="decoder"),
                             positions="rope", settings=HeadSettings(latent=spec)).double().eval()
    lat = mha.latent
    with torch.no_grad():
        for p in ref.parameters():
            p.uniform_(-0.5, 0.5)
        pairs = [(lat.kv_down, ref.kv_a_proj_with_mqa), (lat.kv_norm, ref.kv_a_layernorm), (lat.kv_up, ref.kv_b_proj)]
        pairs += [(lat.q_up, ref.q_proj)] if q_rank is None else [
            (lat.q_down, ref.q_a_proj), (lat.q_norm, ref.q_a_layernorm), (lat.q_up, ref.q_b_proj)]
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
        mha.out_proj.weight.copy_(ref.o_proj.weight)
        mha.out_proj.bias.zero_()
    x = torch.randn(2, t, d_model, dtype=torch.float64)
    inv = 10000.0 ** -(torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    assert torch.allclose(DeepseekV3RotaryEmbedding(config).inv_freq.double(), inv)  # its frequencies
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1)[None], torch.cat([angle.sin()] * 2, -1)[None]
    causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None].expand(2, 1, t, t)
    want, _ = ref(x, (cos, sin), causal)
    got, _ = mha(x, x)
    # Transformers' RMSNorm and eager softmax compute in float32 whatever the input's type
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _lm_options(scheme):
    rope = positions_for(scheme) != "none"
    return dict(positions="rope" if rope else "none", mla=MLA if rope else {"kv_rank": 12, "q_rank": 10})


def test_lm_with_latent_attention_is_causal_with_every_scheme(scheme):
    if _refused(scheme):
        pytest.skip(f"{scheme}: refused with model.mla (one projection for queries and keys, or input positions)")
    torch.manual_seed(0)
    assert_lm_causal(DecoderOnlyLM(20, factory(scheme), decoder_layers=2, **{**SIZES, **_lm_options(scheme)}).eval())


def test_latent_cache_decoding_equals_recomputing_with_every_scheme(scheme):
    if _refused(scheme):
        pytest.skip(f"{scheme}: refused with model.mla")
    torch.manual_seed(7)
    options = _lm_options(scheme)
    m = Seq2SeqTransformer(25, 25, factory(scheme), encoder_layers=1, decoder_layers=2,
                           **{**SIZES, **options}).eval()
    src = torch.randint(3, 25, (3, 6))
    # an end token never emitted: no row finishes, so no padding is fed (an untrained model's padding position has
    # a zero query without biases, which a signed kernel cannot normalize)
    decoded = m.greedy_decode(src, 1, 99, max_len=8)
    assert torch.equal(decoded, m.greedy_decode(src, 1, 99, max_len=8, incremental=False)) and decoded.shape[1] == 8
    if not m.can_step:
        return
    cache = assert_steps_equal_recomputing(m, steps=5)
    self_cache = cache["layers"][0]["self"]
    recurrent = m.decoder[0].self_attn.core.recurrent  # its state holds the past: the cache only the newest
    assert "k" not in self_cache and self_cache["c"].shape[1:3] == (1, 1 if recurrent else 5)  # no heads
    if not recurrent:
        assert self_cache["c"].shape[-1] == 12 and self_cache["kr"].shape[-1] == options["mla"].get("rope_dim", 0)
    assert cache["layers"][0]["cross"]["k"].shape[1] == 4  # cross-attention keeps plain heads


def test_latent_cache_with_a_sliding_window_keeps_the_window():
    torch.manual_seed(1)
    windowed = lambda location, i, causal: build_core("unas", causal=True, location="decoder", window=3)  # noqa: E731
    lm = DecoderOnlyLM(20, windowed, decoder_layers=1,
                       **{**SIZES, "positions": "rope", "mla": MLA}).eval()
    layer = lm.layers[0]
    from nas_cli.model.incremental import block_step

    cache, x = {}, torch.randn(2, 6, 32)
    for i in range(6):
        block_step(layer, x[:, i:i + 1], None, None, cache)
    assert cache["self"]["c"].shape[2] == cache["self"]["kr"].shape[2] == 3


def test_cache_bytes_count_the_latent_and_the_rotary_key():
    lm = DecoderOnlyLM(20, factory("unas"), decoder_layers=3, **{**SIZES, "positions": "rope", "mla": MLA})
    assert kv_cache_bytes_per_token(lm) == 3 * (12 + 4) * 4  # layers x (kv_rank + rope_dim) x float32
    plain = DecoderOnlyLM(20, factory("unas"), decoder_layers=3, **{**SIZES, "positions": "rope"})
    assert kv_cache_bytes_per_token(plain) == 3 * 2 * 4 * 8 * 4


def test_defaults_follow_deepseek_v2s_ratios():
    assert LatentSpec.from_option(True, 16, "rope") == LatentSpec(64, None, 8)
    assert LatentSpec.from_option({"kv_rank": 8}, 16, "sinusoidal") == LatentSpec(8, None, 0)
    assert LatentSpec.from_option(None, 16, "rope") is None


@pytest.mark.parametrize("options, words", [
    (dict(mla=True, qk_norm=True), "model.qk_norm=true with model.mla"),
    (dict(mla={"rope_dim": 4}), "model.mla.rope_dim=4: the decoupled rotary features need model.positions=rope"),
    (dict(mla={"rope_dim": 3}, positions="rope"), "model.mla.rope_dim=3: with rotary positions"),
    (dict(mla={"kv_rnak": 8}), "model.mla.kv_rnak: not an option of multi-head latent attention"),
    (dict(mla=True, positions="rope", rope_scaling={"type": "yarn", "factor": 4.0, "original_max_len": 64}),
     "model.rope_scaling.type=yarn with model.mla"),
])
def test_bad_latent_settings_name_the_option(options, words):
    """Each refusal's words (the command line's one-line path is tests/model/test_heads.py's)."""
    with pytest.raises(ValueError, match=re.escape(words)):
        HeadSettings.from_options(4, options.get("kv_heads"), options.get("qk_norm", False), options.get("rope_scaling"),
                                  options.get("positions", "sinusoidal"), options["mla"], 8)


def test_a_scheme_with_input_positions_is_refused_with_latent_attention():
    core = build_core("kernel_exp", positions="direct_sum_layer")
    with pytest.raises(ValueError, match="adds positions to the inputs of its key and value projections"):
        MultiHeadAttention(32, 4, core, settings=HeadSettings(latent=LatentSpec(12, None, 0)))


@pytest.mark.slow  # the page's example, run as written
def test_the_pages_command_runs_as_written(tmp_path):
    """docs/attention.md's command for latent attention, as written there, to a summary with the latent cache."""
    (argv,) = section_commands("attention.md", "### Multi-head latent attention")
    proc = nas_run(*argv[1:], f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["kv_cache_bytes_per_token"] == 2 * (32 + 8) * 4  # 2 layers x (kv_rank 32 + rope_dim 8) x float32
