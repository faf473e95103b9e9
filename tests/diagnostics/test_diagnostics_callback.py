"""DiagnosticsCallback in real training: its numbers equal a direct computation on the
model; the interval, the LM path, logger=none. (The W&B side is checked in test_report.py,
on the seed sweep it shares.)"""
from __future__ import annotations

import json

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from nas_cli.diagnostics import explained_away_stats, head_jsd_per_sample
from nas_cli.diagnostics.callback import DiagnosticsCallback
from nas_cli.pipeline.parts import build_module, build_task
from nas_cli.pipeline.run import train
from nas_cli.model.plan import AttentionPlan
from helpers import compose_cfg



def test_callback_numbers_match_a_direct_computation_on_the_model(tmp_path):
    """Validation only at the last step, so the final model is the one the callback saw.
    Cross-attention is one-layer additive: its step variation must vanish (the blog post "Why Bahdanau's neural attention requires two layers")."""
    cfg = compose_cfg("debug=fast", "attention=dnas", "attention.cross=additive_1layer")
    pl.seed_everything(0, verbose=False)
    task = build_task(cfg)
    module = build_module(cfg, task, AttentionPlan.for_job(cfg).model_cores(cfg.model))
    cb = DiagnosticsCallback(run_dir=tmp_path, batches=2)
    trainer = pl.Trainer(accelerator="cpu", max_steps=6, val_check_interval=6, check_val_every_n_epoch=None,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb])
    trainer.fit(module, datamodule=task)
    latest = json.loads((tmp_path / "diagnostics" / "latest.json").read_text())
    assert latest["step"] == 6

    module.model.eval()
    it = iter(task.val_dataloader())
    batches = [next(it), next(it)]
    pad = task.pad_id
    with torch.no_grad():
        outs = [module.model(b["src"], b["tgt_in"], need_weights=True)[1] for b in batches]
    masks = {"encoder": lambda b: (b["src"] != pad, b["src"] != pad),
             "decoder": lambda b: (b["tgt_in"] != pad, b["tgt_in"] != pad),
             "cross": lambda b: (b["tgt_in"] != pad, b["src"] != pad)}
    for loc in ("encoder", "decoder", "cross"):
        for layer in range(2):
            # JSD: per-sample sums over real queries, averaged over both batches' samples
            per_sample = torch.cat([head_jsd_per_sample(o[loc][layer].weights, *masks[loc](b))
                                    for o, b in zip(outs, batches)])
            got = np.array(latest["locations"][loc]["layers"][layer]["jsd"])
            np.testing.assert_allclose(got, per_sample.mean(0).numpy(), rtol=1e-6, atol=1e-9)
            # explaining away: per-head histograms of both batches add up
            stats = [explained_away_stats(o[loc][layer].weights, *masks[loc](b)) for o, b in zip(outs, batches)]
            ea = latest["locations"][loc]["layers"][layer]["explained_away"]
            np.testing.assert_array_equal(np.array(ea["counts"]), stats[0].counts + stats[1].counts)
            assert ea["min_margin"] == pytest.approx(np.minimum(stats[0].min_margin, stats[1].min_margin).tolist())
    # one-layer additive cross-attention ignores the decoder state: the same source weights at every
    # step (up to float32 rounding of the row-wise softmax); decoder self-attention is not analysed
    for layer in range(2):
        var = latest["locations"]["cross"]["layers"][layer]["step_variation"]
        assert len(var) == 4 and max(var) < 1e-5
    assert "step_variation" not in latest["locations"]["decoder"]["layers"][0]
    # logger=False: nothing to log to, but the files are there
    summary = json.loads((tmp_path / "diagnostics" / "summary.json").read_text())
    assert sorted(summary["files"]) == sorted(p.name for p in (tmp_path / "diagnostics").glob("*.png"))
    assert len(summary["files"]) == 6


def test_lm_every_second_validation_with_logger_none(tmp_path):
    cfg = compose_cfg("task=copy_lm", "attention=dnas", "logger=none", "debug=fast", "run_test=false",
                      "trainer.max_steps=15", "trainer.val_check_interval=5", "diagnostics.every_n_validations=2")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    assert summary["steps"] == 15
    diag = tmp_path / "diagnostics"
    # validations at steps 5, 10 and 15; only the 1st and 3rd are analysed
    assert sorted(p.name for p in diag.glob("step_*.json")) == ["step_15.json", "step_5.json"]
    s = json.loads((diag / "summary.json").read_text())
    assert s["validations_seen"] == 3 and s["validations_analysed"] == 2 and s["step"] == 15
    latest = json.loads((diag / "latest.json").read_text())
    assert list(latest["locations"]) == ["decoder"]  # decoder-only LM: causal self-attention only
    ea = latest["locations"]["decoder"]["layers"][0]["explained_away"]
    assert ea["n_keys"] > 0 and len(ea["entropy"]) == 4
    assert not (tmp_path / "csv").exists() and not (tmp_path / "wandb").exists()


def test_repro_explained_away_trains_both_schemes_on_the_same_data(tmp_path):
    from nas_cli.bench.repro import explained_away_overrides, run_explained_away

    # a --set of the same key replaces the repro's own optimizer default
    ov = explained_away_overrides("unas", 5, 1, 4, 1, ["optim.lr=1e-3"])
    assert "optim.lr=1e-3" in ov and "optim.lr=2e-3" not in ov and "optim.warmup=100" in ov

    rep = run_explained_away(tmp_path, steps=4, batches=1,
                             overrides=["task.train_size=256", "task.val_size=32", "task.test_size=32"])
    unas, dnas = rep["schemes"]["unas"], rep["schemes"]["dnas"]
    assert unas["steps"] == dnas["steps"] == 4
    # same data and seed: the same keys were analysed; the histograms count every one of them
    assert unas["n_keys_per_layer"] == dnas["n_keys_per_layer"]
    assert sum(unas["counts_all_layers"]) == sum(dnas["counts_all_layers"]) == sum(unas["n_keys_per_layer"]) * 4
    assert dnas["min_margin"] >= -1e-6 and dnas["explained_away_frac"] == 0.0 and rep["theorem2_holds_for_dnas"]
    assert sorted(rep["files"]) == ["explained_away.json", "fig1_encoder_layer0.png", "fig1_encoder_layer1.png",
                                    "fig1_encoder_log_mass.png"]
    assert json.loads((tmp_path / "explained_away.json").read_text())["schemes"]["unas"]["n_keys_per_layer"]
    for name in rep["files"][:-1]:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_signed_weights_of_a_linear_kernel_read_null_with_a_note_not_a_crash(tmp_path):
    """A linear kernel's weights can be negative (Tsai et al. 2019): JSD and log sum_i pi_ij are
    undefined for them. The run trains on; the JSON says null and why (never NaN)."""
    cfg = compose_cfg("debug=fast", "attention=kernel_linear", "logger=csv", "run_test=false", "trainer.max_steps=10")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    assert summary["steps"] == 10
    diag = tmp_path / "diagnostics"
    latest = json.loads((diag / "latest.json").read_text())  # strict JSON: no NaN
    final = json.loads((diag / "summary.json").read_text())["locations"]
    for loc in ("encoder", "decoder", "cross"):
        assert "negative entries" in final[loc]["note"], loc
        assert final[loc]["jsd_mean"] is None and latest["locations"][loc]["jsd_mean"] is None, loc
    metrics = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "nan" not in metrics.lower()  # nothing undefined logged as a number


def test_probability_weights_carry_no_note(tmp_path):
    cfg = compose_cfg("debug=fast", "attention=unas", "logger=none", "run_test=false", "trainer.max_steps=10")
    train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    final = json.loads((tmp_path / "diagnostics" / "summary.json").read_text())["locations"]
    assert all("note" not in v and v["jsd_mean"] > 0 for v in final.values())
