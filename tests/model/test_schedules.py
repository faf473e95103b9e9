"""The learning-rate schedules (nas_cli/pipeline/optim.py) against their closed forms, and the optimizer each
option builds: the inverse square root, cosine to optim.min_lr, warm-up-stable-decay and constant, each
after a linear warm-up; AdamW's decoupled weight decay against Adam's."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nas_cli.pipeline.optim import configure, inverse_sqrt, warmup_cosine, warmup_stable_decay


def test_the_schedules_follow_their_closed_forms():
    cos = warmup_cosine(10, 110, 0.1)
    assert [cos(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert cos(10) == pytest.approx(1.0) and cos(110) == pytest.approx(0.1) and cos(500) == pytest.approx(0.1)
    assert cos(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    wsd = warmup_stable_decay(10, 100, 0.0, 0.2)
    assert wsd(50) == 1.0 and wsd(79) == 1.0 and wsd(90) == pytest.approx(0.5) and wsd(100) == pytest.approx(0.0)
    constant = warmup_cosine(5, 0, 0.0)
    assert constant(2) == pytest.approx(0.6) and constant(1000) == 1.0
    inv = inverse_sqrt(4)
    assert inv(3) == pytest.approx(1.0) and inv(15) == pytest.approx(math.sqrt(4 / 16))


@pytest.mark.parametrize("optimizer,kind", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_the_optimizer_option_builds_that_optimizer(optimizer, kind):
    o = SimpleNamespace(optimizer=optimizer, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1,
                        schedule="cosine", warmup=0, min_lr=0.0, decay_fraction=0.2)
    trainer = SimpleNamespace(max_steps=100, estimated_stepping_batches=100)
    got = configure([torch.nn.Parameter(torch.ones(2))], o, trainer)
    assert type(got["optimizer"]) is kind and got["optimizer"].param_groups[0]["weight_decay"] == 0.1
    assert got["lr_scheduler"]["interval"] == "step"


def test_a_token_budget_is_the_steps_that_train_that_many_tokens():
    from helpers import compose_cfg
    from hydra.utils import instantiate

    from nas_cli.errors import UserError
    from nas_cli.pipeline.trainer import budget_steps, trainer_kwargs

    cfg = compose_cfg("task=mqar", "train_tokens=100000")  # 64 sequences of 64 tokens a step
    task = instantiate(cfg.task)
    assert budget_steps(cfg, task) == 25 and trainer_kwargs(cfg, task)["max_steps"] == 25
    assert budget_steps(compose_cfg("task=mqar", "train_tokens=100000", "train_batch_items=16"), task) == 98
    with pytest.raises(UserError, match="train_tokens=1000: task 'reverse' has batches of varying size"):
        cfg = compose_cfg("train_tokens=1000")
        budget_steps(cfg, instantiate(cfg.task))
