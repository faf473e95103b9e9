"""attention=flex (nas_cli/attention/flex_mods.py): FlexAttention mods named by import path, against the formula
written out in float64, against PyTorch's own FlexAttention (forward, on the CPU), with a factory's keyword
arguments, in incremental decoding, and refused in one line when a path does not import."""
from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import assert_steps_equal_recomputing, build_core
from omegaconf import OmegaConf

from nas_cli.attention.flex_mods import flex_forward
from nas_cli.model.choices import CONF_DIR
from nas_cli.model.plan import make_core_factory
from nas_cli.model.transformer import Seq2SeqTransformer

def relative_bias(score, b, h, q_idx, kv_idx):  # a score_mod: a bias by distance, per head
    return score - (h + 1) * 0.25 * (q_idx - kv_idx).abs()


def prefix_lm(b, h, q_idx, kv_idx):  # a mask_mod: the first 3 positions see each other
    return (kv_idx < 3) | (q_idx >= kv_idx)


def sliding(window_size):  # a factory of a mask_mod
    def mask(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < window_size
    return mask


MODS = {"score_mod": "test_flex_mods.relative_bias", "mask_mod": "test_flex_mods.prefix_lm"}


def _qkv(t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, t, 8, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
def test_the_mods_equal_the_formula(causal):
    q, k, v = _qkv()
    core = build_core("flex", causal=causal, location="decoder" if causal else "encoder", **MODS).double()
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    h = torch.arange(4)[:, None, None]
    s = q @ k.transpose(-1, -2) / 8 ** 0.5 - (h + 1) * 0.25 * (i - j).abs()
    allowed = ((j < 3) | (i >= j)) & ((j <= i) if causal else True)
    w = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    got = core(q, k, v, need_weights=True)
    torch.testing.assert_close(got.weights, w.expand_as(got.weights))
    torch.testing.assert_close(core(q, k, v).out, w @ v)


def test_pytorchs_flex_attention_gives_the_same_output():
    """The CUDA path's call (FlexAttention with the mods and the block mask), run forward on the CPU."""
    q, k, v = (t.float() for t in _qkv(t=16))
    k_mask = torch.ones(2, 16, dtype=torch.bool)
    k_mask[0, 12:] = False
    core = build_core("flex", causal=True, location="decoder", **MODS)
    with torch.no_grad():
        ours = core(q, k, v, q_mask=k_mask, k_mask=k_mask).out
        theirs = flex_forward(core, q, k, v, k_mask) * k_mask[:, None, :, None]
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_a_factory_with_its_keywords_is_a_sliding_window():
    q, k, v = _qkv()
    flex = build_core("flex", causal=True, location="decoder", mask_mod="test_flex_mods.sliding",
                      mask_mod_kwargs={"window_size": 3}).double()
    unas = build_core("unas", causal=True, location="decoder", window=3).double()
    torch.testing.assert_close(flex(q, k, v).out, unas(q, k, v).out)


def test_decoding_steps_give_the_newest_query_its_position():
    cfg = OmegaConf.load(CONF_DIR / "attention" / "unas.yaml")
    cfg.decoder = OmegaConf.load(CONF_DIR / "attention" / "flex.yaml")
    cfg.decoder.update(MODS)
    torch.manual_seed(0)
    m = Seq2SeqTransformer(25, 25, make_core_factory(cfg, 4), encoder_layers=1, decoder_layers=2, d_model=32, heads=4,
                           ffn=64, dropout=0.0, max_len=64).eval()
    assert_steps_equal_recomputing(m)


@pytest.mark.parametrize("options, words", [
    ({"score_mod": "nowhere.mod"}, "attention.score_mod=nowhere.mod: cannot be imported (No module named 'nowhere')"),
    ({"mask_mod": "test_flex_mods.absent"}, "attention.mask_mod=test_flex_mods.absent: cannot be imported"),
    ({"mask_mod": "test_flex_mods.sliding", "mask_mod_kwargs": {"width": 3}},
     "attention.mask_mod_kwargs={'width': 3}: test_flex_mods.sliding does not take them"),
])
def test_a_mod_that_cannot_be_had_is_one_line(options, words):
    with pytest.raises(Exception, match=words.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")
                       .replace("}", r"\}")):
        build_core("flex", **options)


@pytest.mark.slow  # the page's example, run as written
def test_the_pages_command_runs_as_written_and_a_bad_path_is_one_line(tmp_path):
    """docs/attention.md's example: its module (the commented lines) written to the folder, its command run there."""
    import shlex

    from datafiles import ROOT
    from helpers import run_command, script

    block = (ROOT / "docs" / "attention.md").read_text().split("### FlexAttention mods")[1].split("```bash")[1]
    block = block.split("```")[0].strip().splitlines()
    (tmp_path / "my_mods.py").write_text("".join(line[4:] + "\n" for line in block if line.startswith("#   ")))
    argv = shlex.split(block[-1])
    assert argv[:2] == ["PYTHONPATH=.", "nas-run"]
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": "."}

    def nas_run_here(*args):
        return run_command([script("nas-run"), *args], cwd=tmp_path, env=env, timeout=300)

    proc = nas_run_here(*argv[2:], "diagnostics.plots=never", f"hydra.run.dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["scheme"] == "flex"
    bad = nas_run_here("task=copy_lm", "attention=flex", "attention.score_mod=my_mods.nothing", "debug=fast",
                       f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr[-2000:]
    assert "attention.score_mod=my_mods.nothing: cannot be imported" in bad.stderr and not (tmp_path / "bad").exists()
