"""Soft-capping, sliding windows and sinks (nas_cli/attention/mods.py) against independent references: Hugging Face
Transformers' own eager attention of Gemma 2 (soft-capping) and gpt-oss (sinks) and its sliding-window masks, and
each row-wise formula written out in float64; then with every scheme that takes them, causality and incremental
decoding equal to recomputing the prefix, with a cache that holds the window only."""
from __future__ import annotations

import math
import re

import pytest
import torch
from helpers import assert_steps_equal_recomputing, build_core
from omegaconf import OmegaConf
from test_model import SIZES

from nas_cli.attention.base import SchemeError
from nas_cli.model.choices import CONF_DIR, available
from nas_cli.model.memory import kv_cache_bytes_per_token, windowed_cache_bytes
from nas_cli.model.plan import make_core_factory
from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer


def _taking(option: str) -> list[str]:
    return [s for s in available("attention") if option in OmegaConf.load(CONF_DIR / "attention" / f"{s}.yaml")]


def _qkv(b=2, h=4, t=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, dtype=torch.float64) * 1.5 for _ in range(3)]


def test_the_options_are_offered_where_they_apply():
    assert _taking("softcap") == ["flex", "gated", "selective", "sigmoid", "softpick", "stickbreaking", "unas"]
    assert _taking("window") == ["gated", "sigmoid", "softpick", "stickbreaking", "unas"]
    assert _taking("sink") == ["flex", "gated", "unas"]


class _Module(torch.nn.Module):  # what HF's eager functions read of their attention module
    num_key_value_groups, head_dim = 1, 8


@pytest.mark.parametrize("causal", [True, False])
def test_softcap_and_window_equal_gemma2s_eager_attention(causal):
    from transformers.masking_utils import (sliding_window_bidirectional_overlay, sliding_window_causal_mask_function)
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    q, k, v = _qkv()
    window = 3
    core = build_core("unas", causal=causal, location="decoder" if causal else "encoder", softcap=2.0,
                      window=window).double()
    got = core(q, k, v, need_weights=True)
    # HF's bidirectional window counts |i - j| <= w, nas-run's |i - j| < w: the same mask at w - 1
    mask_of = sliding_window_causal_mask_function(window) if causal else sliding_window_bidirectional_overlay(window - 1)
    zero = torch.tensor(0)
    allowed = mask_of(zero, zero, torch.arange(9)[:, None], torch.arange(9)[None, :])
    assert allowed.shape == (9, 9) and allowed.sum() < (45 if causal else 81)
    bias = torch.zeros(9, 9, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    ref, ref_w = eager_attention_forward(_Module(), q, k, v, bias, scaling=8 ** -0.5, softcap=2.0)
    close = dict(rtol=1e-6, atol=1e-6)  # HF's softmax runs in float32
    torch.testing.assert_close(got.out, ref.transpose(1, 2), **close)
    torch.testing.assert_close(got.weights, ref_w, **close)
    # the fused path (no weights asked for) takes the window as its mask; the cap makes it the formula's
    windowed = build_core("unas", causal=causal, location="decoder" if causal else "encoder", window=window).double()
    plain = eager_attention_forward(_Module(), q, k, v, bias, scaling=8 ** -0.5)[0].transpose(1, 2)
    torch.testing.assert_close(windowed(q, k, v).out, plain, **close)


@pytest.mark.parametrize("sink", ["learned", "zero"])
def test_sinks_equal_gpt_oss_eager_attention(sink):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v = _qkv(seed=1)
    core = build_core("unas", causal=True, location="decoder", sink=sink).double()
    if sink == "learned":
        with torch.no_grad():
            core.sink_logit.copy_(torch.tensor([-1.0, 0.0, 1.5, 3.0]))
    module = _Module()
    module.sinks = core.sink_logit.detach() if sink == "learned" else torch.zeros(4, dtype=torch.float64)
    if sink == "learned":
        assert core.learned()["sink"].shape == (4,)  # followed over training as `sink`
    causal = torch.zeros(9, 9, dtype=torch.float64).masked_fill(torch.ones(9, 9).triu(1).bool(), float("-inf"))
    ref, ref_w = eager_attention_forward(module, q, k, v, causal, scaling=8 ** -0.5)
    got = core(q, k, v, need_weights=True)
    torch.testing.assert_close(got.out, ref.transpose(1, 2))
    torch.testing.assert_close(got.weights, ref_w)
    assert (got.weights.sum(-1) < 1).all() and not core.rows_sum_to_one
    if sink == "learned":
        core(q, k, v).out.sum().backward()
        assert core.sink_logit.grad.abs().sum() > 0


def test_row_wise_schemes_take_the_cap_and_window_in_every_block():
    """Sigmoid attention with a window in float64: sigma(c tanh(s / c) - log n) over the window's n keys, in one block,
    in blocks of 4 queries (each against its keys only) and step by step."""
    q, k, v = _qkv(t=11, seed=2)
    core = build_core("sigmoid", causal=True, location="decoder", softcap=3.0, window=4, block_size=4).double()
    s = 3.0 * torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(8) / 3.0)
    i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
    inside = (j <= i) & (i - j < 4)
    n = inside.sum(-1, keepdim=True).double()
    w = torch.sigmoid(s - torch.log(n)) * inside
    torch.testing.assert_close(core(q, k, v, need_weights=True).weights, w)
    torch.testing.assert_close(core(q, k, v).out, w @ v)  # 11 queries in blocks of 4
    for t in range(11):
        out, _ = core.step(q[..., t:t + 1, :], k[..., max(0, t - 3):t + 1, :], v[..., max(0, t - 3):t + 1, :], None,
                           None)
        torch.testing.assert_close(out, (w @ v)[..., t:t + 1, :])


def _plan(scheme, **options):
    """UNAS everywhere, ``scheme`` with ``options`` at the decoder's self-attention."""
    cfg = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    cfg.decoder = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    for key, value in options.items():
        cfg.decoder[key] = value
    return make_core_factory(cfg, 4)


def _lm(scheme, **options):
    torch.manual_seed(0)
    return DecoderOnlyLM(20, _plan(scheme, **options), decoder_layers=2, **{**SIZES, "positions": "rope"}).eval()


@pytest.mark.parametrize("scheme", _taking("window"))
def test_windowed_lm_is_causal_and_sees_the_window_only(scheme):
    extra = {"sink": "learned"} if scheme in _taking("sink") else {}
    lm = _lm(scheme, window=3, softcap=5.0, **extra)
    ids = torch.randint(3, 20, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(3, 20, (2, 4))
    a, _ = lm(ids)
    torch.testing.assert_close(lm(changed)[0][:, :6], a[:, :6], rtol=0, atol=1e-5)
    early = ids.clone()  # two layers of a window of 3 reach 4 tokens back: position 0 is out of position 9's reach
    early[:, 0] = (ids[:, 0] - 2) % 17 + 3
    torch.testing.assert_close(lm(early)[0][:, 9], a[:, 9], rtol=0, atol=1e-5)
    assert not torch.allclose(lm(early)[0][:, 1], a[:, 1])


@pytest.mark.parametrize("scheme", _taking("window"))
def test_windowed_decoding_equals_recomputing_with_the_window_in_the_cache(scheme):
    extra = {"sink": "zero", "placement": "value"} if scheme == "gated" else {"sink": "learned"} if scheme == "unas" else {}
    torch.manual_seed(1)
    m = Seq2SeqTransformer(25, 25, _plan(scheme, window=3, softcap=5.0, **extra), encoder_layers=1, decoder_layers=2,
                           **{**SIZES, "positions": "rope"}).eval()
    assert m.can_step
    cache = assert_steps_equal_recomputing(m, steps=7)
    assert cache["layers"][0]["self"]["k"].shape[2] == 3  # the cache holds the window, not the 7 keys


def test_the_cache_bytes_of_windowed_layers():
    lm = _lm("unas", window=16)
    lm.layers[1].self_attn.core.window = None  # one global layer
    layer = 2 * 4 * 8 * 4  # (k, v) x heads x d_head x float32
    assert kv_cache_bytes_per_token(lm) == 2 * layer
    assert windowed_cache_bytes(lm) == {"per_token_beyond_windows": layer, "windows": 16 * layer}
    assert windowed_cache_bytes(_lm("unas")) is None


@pytest.mark.parametrize("scheme, options, words", [
    ("selective", {"window": 4}, "selective attention cannot take a sliding window"),
    ("unas", {"softcap": -1}, "attention.softcap must be null (no cap) or a positive number"),
    ("unas", {"window": 0}, "attention.window must be null (every key) or a positive number"),
    ("unas", {"sink": "one"}, "attention.sink must be null (no sink), zero or learned"),
])
def test_bad_values_are_refused_in_one_line(scheme, options, words):
    with pytest.raises(Exception, match=re.escape(words)):  # Hydra wraps a ValueError; the run says its line
        build_core(scheme, causal=True, location="decoder", **options)


def test_a_window_in_cross_attention_is_refused():
    cfg = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    cfg.window = 4
    with pytest.raises(SchemeError, match="attention.cross.window=4: cross-attention's keys"):
        Seq2SeqTransformer(20, 20, make_core_factory(cfg, 4), encoder_layers=1, decoder_layers=1, **SIZES)


def _page_commands(heading: str) -> list[list[str]]:
    import shlex

    from datafiles import ROOT

    block = (ROOT / "docs" / "attention.md").read_text().split(heading)[1].split("```bash")[1].split("```")[0]
    return [shlex.split(line) for line in block.strip().splitlines() if not line.startswith("#")]


@pytest.mark.slow  # the page's examples, run as written
@pytest.mark.parametrize("heading, labels", [
    ("### Soft-capping, sliding windows and sinks", ["unas@w8"]),
    ("### Per-layer plans", ["unas@w8*5+unas", "deltanet*3+unas"]),
])
def test_the_pages_commands_run_as_written(tmp_path, heading, labels):
    """docs/attention.md's commands of each section, as written there, each to a summary with its label."""
    import json

    from helpers import nas_run

    commands = _page_commands(heading)
    assert len(commands) == len(labels)
    for i, argv in enumerate(commands):
        assert argv[0] == "nas-run"
        proc = nas_run(*argv[1:], f"hydra.run.dir={tmp_path / str(i)}", "diagnostics.plots=never", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads((tmp_path / str(i) / "summary.json").read_text())
        assert summary["scheme"] == labels[i]
        windowed = "w8" in labels[i]
        assert (summary["kv_cache_windowed"] is not None) == windowed
        if labels[i].startswith("deltanet"):
            assert summary["recurrent_state_bytes"] > 0 and summary["kv_cache_bytes_per_token"] > 0
        if "attention.sink=learned" in argv:
            assert any(k.startswith("sink/decoder/L0/h") for k in summary["learned"])


def test_a_per_layer_plan_builds_each_layer_and_names_it(tmp_path):
    from nas_cli.model.plan import AttentionPlan

    cfg = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    cfg.window = 4
    cfg.per_layer = [None, {"window": None}, {"scheme": "sigmoid", "bias_n": 16}]
    plan = AttentionPlan.from_config(cfg)
    lm = DecoderOnlyLM(20, plan.core_factory(4), decoder_layers=5, **SIZES)
    cores = [b.self_attn.core for b in lm.layers]
    assert [c.name for c in cores] == ["unas", "unas", "sigmoid", "unas", "unas"]
    assert [c.window for c in cores] == [4, None, None, 4, None]
    assert cores[2].bias == pytest.approx(-math.log(16))
    assert plan.tag == "unas@w4+unas+sigmoid" and plan.schemes == ("sigmoid", "unas")
    assert plan.identity()["decoder"]["per_layer"][2]["scheme"] == "sigmoid"


def test_settings_left_at_none_leave_the_identity_as_without_them():
    """A scheme's YAML offers the settings of today's models at the value that means none: the plan builds, names
    and hashes as one without them (runs made before a YAML offered them keep their config ids)."""
    from nas_cli.model.plan import AttentionPlan

    for scheme in ("unas", "deltanet", "flex", "mamba2"):
        cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
        offered = {"softcap", "window", "sink", "conv", "gate", "state", "per_layer"} & set(cfg)
        assert offered and not offered & set(AttentionPlan.from_config(cfg).identity()["decoder"])
    cfg = OmegaConf.load(CONF_DIR / "attention" / "deltanet.yaml")
    cfg.conv, cfg.gate = 4, True
    assert {"conv": 4, "gate": True}.items() <= AttentionPlan.from_config(cfg).identity()["decoder"].items()
