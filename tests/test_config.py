"""Real Hydra composition of every task x attention scheme, and the pieces built from it."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import nas_cli.cli  # noqa: F401  (registers the nas.tag resolver)
from nas_cli.lit import build_model
from nas_cli.registry import CONF_DIR, available, placement, scheme_tag

TASKS = available("task")


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("task_name", TASKS)
def test_every_task_and_scheme_composes_and_runs_a_batch(task_name, scheme):
    cfg = compose_cfg(f"task={task_name}", f"attention={scheme}", "debug=fast")
    task = instantiate(cfg.task)
    task.setup("fit")
    model = build_model(cfg.model, cfg.attention, task)
    batch = next(iter(task.train_dataloader()))
    if task.kind == "lm":
        logits, _ = model(batch["ids"])
        assert logits.shape[:2] == batch["target"].shape
    else:
        logits, _ = model(batch["src"], batch["tgt_in"])
        assert logits.shape[:2] == batch["tgt_out"].shape
    assert torch.isfinite(logits).all()


def test_one_scheme_everywhere_vs_per_location():
    cfg = compose_cfg("attention=dnas")
    assert placement(cfg.attention) == {"encoder": "dnas", "decoder": "dnas", "cross": "dnas"}
    assert scheme_tag(cfg.attention) == "dnas"
    cfg = compose_cfg("attention=hnas", "attention.u_init=0.1", "attention.decoder=unas", "attention.cross=unas")
    assert placement(cfg.attention) == {"encoder": "hnas", "decoder": "unas", "cross": "unas"}
    assert scheme_tag(cfg.attention) == "enc-hnas_dec-unas_cross-unas"
    task = instantiate(cfg.task)
    model = build_model(cfg.model, cfg.attention, task)
    kinds = {type(m.self_attn.core).__name__ for m in model.encoder}
    assert kinds == {"HNAS"}
    assert all(abs(float(m.self_attn.core.u.mean()) - 0.1) < 1e-6 for m in model.encoder)
    assert {type(m.self_attn.core).__name__ for m in model.decoder} == {"UNAS"}
    assert {type(m.cross_attn.core).__name__ for m in model.decoder} == {"UNAS"}


def test_scheme_options_reach_the_core():
    cfg = compose_cfg("attention=sinkhorn", "attention.iterations=5")
    model = build_model(cfg.model, cfg.attention, instantiate(cfg.task))
    assert model.encoder[0].self_attn.core.iterations == 5
    # a scheme named only at a location takes its defaults from conf/attention/<name>.yaml
    cfg = compose_cfg("attention=unas", "attention.cross=sinkhorn")
    model = build_model(cfg.model, cfg.attention, instantiate(cfg.task))
    assert model.decoder[0].cross_attn.core.iterations == 3


def test_gigaword_style_experiment_preset():
    cfg = compose_cfg("experiment=gigaword_style")
    assert placement(cfg.attention) == {"encoder": "hnas", "decoder": "unas", "cross": "unas"}
    assert cfg.attention.u_init == 0.1


def test_model_presets_and_lm_model():
    for name in available("model"):
        cfg = compose_cfg(f"model={name}")
        assert cfg.model.d_model % cfg.model.heads == 0
    cfg = compose_cfg("task=copy_lm", "model.positions=learned", "model.norm_first=false")
    model = build_model(cfg.model, cfg.attention, instantiate(cfg.task))
    assert type(model).__name__ == "DecoderOnlyLM"
