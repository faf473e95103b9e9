"""Real Hydra composition of every task x attention scheme, and the pieces built from it."""
import functools
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from nas_cli.pipeline.lit import build_model
from helpers import build_core, compose_cfg
from nas_cli.model.plan import AttentionPlan
from nas_cli.model.choices import CONF_DIR, available


def placement(attn_cfg):
    return AttentionPlan.from_config(attn_cfg).names

TASKS = available("task")




@functools.cache  # once per task and data folder: the schemes of one task share them
def tiny_data_overrides(task_name: str, root: Path) -> list[str]:
    """Tiny generated data in the layout the task's own config asks for (its kind, languages
    and split names), and the options that shrink it: no list a new task must be added to."""
    from datafiles import write_lm, write_parallel
    from hydra.utils import get_class

    cfg = compose("config", overrides=[f"task={task_name}"]).task
    if "path" not in cfg:  # built-in data
        return []
    where = root / task_name
    if not where.exists():
        if get_class(cfg._target_).kind == "lm":
            write_lm(where, n=(60, 10, 10))
        else:
            splits = {"train": "train", "valid": "valid", "test": "test", **cfg.get("splits", {})}
            write_parallel(where, splits=tuple(splits[k] for k in ("train", "valid", "test")), n=(60, 8, 8),
                           src=cfg.src_lang, tgt=cfg.tgt_lang)
    shrink = {"vocab_size": 120, "max_tokens": 256, "tokens_per_sample": 16, "context_window": 8,
              "text_docs": "line"}  # (a subword corpus: each generated line a document)
    if "text_docs" in cfg:  # a byte-level BPE starts from the 256 bytes
        shrink["vocab_size"] = 300
    return [f"task.path={where}", *[f"task.{k}={v}" for k, v in shrink.items() if k in cfg]]


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


_TASKS: dict = {}
#: the tasks that build a decoder-only language model (a causal-only scheme runs at their one location)
LM_TASKS = ("copy_lm", "wikitext2", "wikitext103", "subword_lm", "mqar", "selective_copy", "retrieval")


@pytest.mark.parametrize("task_name", TASKS)
def test_every_task_and_scheme_composes_and_runs_a_batch(task_name, scheme, tmp_path_factory, hydra_ctx,
                                                         monkeypatch):
    root = tmp_path_factory.getbasetemp() / "corpora"
    monkeypatch.setenv("NAS_RUN_CACHE", str(root / "cache"))
    extra = tiny_data_overrides(task_name, root)
    # a scheme that places positions itself declares it; the model then adds none at its input
    positions = ["model.positions=none"] if build_core(scheme).requires_no_input_positions else []
    choice = [f"attention={scheme}"]
    if build_core(scheme).causal_self_only and task_name not in LM_TASKS:  # where it is defined: the decoder
        choice = ["attention=unas", f"attention@attention.decoder={scheme}"]
    cfg = compose("config", overrides=[f"task={task_name}", *choice, "debug=fast", *extra, *positions])
    if task_name not in _TASKS:  # the task does not depend on the scheme: build its data once
        task = instantiate(cfg.task)
        task.setup("fit")
        _TASKS[task_name] = (task, next(iter(task.train_dataloader())))
    task, batch = _TASKS[task_name]
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task)
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
    assert AttentionPlan.from_config(cfg.attention).tag == "dnas"
    cfg = compose_cfg("attention=hnas", "attention.u_init=0.1", "attention.decoder=unas", "attention.cross=unas")
    assert placement(cfg.attention) == {"encoder": "hnas", "decoder": "unas", "cross": "unas"}
    assert AttentionPlan.from_config(cfg.attention).tag == "enc-hnas_dec-unas_cross-unas"
    task = instantiate(cfg.task)
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), task)
    kinds = {type(m.self_attn.core).__name__ for m in model.encoder}
    assert kinds == {"HNAS"}
    assert all(abs(float(m.self_attn.core.u.mean()) - 0.1) < 1e-6 for m in model.encoder)
    assert {type(m.self_attn.core).__name__ for m in model.decoder} == {"UNAS"}
    assert {type(m.cross_attn.core).__name__ for m in model.decoder} == {"UNAS"}


def test_scheme_options_reach_the_core():
    cfg = compose_cfg("attention=sinkhorn", "attention.iterations=5")
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), instantiate(cfg.task))
    assert model.encoder[0].self_attn.core.iterations == 5
    # a scheme named only at a location is composed by Hydra there: its defaults, and options
    # given for that location on the command line
    cfg = compose_cfg("attention=unas", "attention.cross=sinkhorn")
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), instantiate(cfg.task))
    assert model.decoder[0].cross_attn.core.iterations == 3
    cfg = compose_cfg("attention=unas", "attention.cross=sinkhorn", "attention.cross.iterations=7")
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), instantiate(cfg.task))
    assert model.decoder[0].cross_attn.core.iterations == 7
    assert type(model.encoder[0].self_attn.core).__name__ == "UNAS"


def test_gigaword_style_experiment_preset():
    cfg = compose_cfg("experiment=gigaword_style")
    assert placement(cfg.attention) == {"encoder": "hnas", "decoder": "unas", "cross": "unas"}
    assert cfg.attention.u_init == 0.1


def test_model_presets_and_lm_model():
    for name in available("model"):
        cfg = compose_cfg(f"model={name}")
        assert cfg.model.d_model % cfg.model.heads == 0
    cfg = compose_cfg("task=copy_lm", "model.positions=learned", "model.norm_first=false")
    model = build_model(cfg.model, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model), instantiate(cfg.task))
    assert type(model).__name__ == "DecoderOnlyLM"


def test_every_experiment_preset_composes():
    for name in available("experiment"):
        cfg = compose_cfg(f"experiment={name}")
        assert cfg.model.d_model % cfg.model.heads == 0, name
        placement(cfg.attention)
