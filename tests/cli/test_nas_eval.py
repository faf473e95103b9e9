"""nas-eval scores the split it is asked for, under that split's name, with nas-run's thread policy."""
from __future__ import annotations

import argparse
import json

import sacrebleu
import torch

from datafiles import write_parallel
from helpers import compose_cfg
from nas_cli.model.plan import AttentionPlan
from nas_cli.pipeline.evaluation import evaluate
from nas_cli.pipeline.parts import build_task
from nas_cli.pipeline.run import train


def _args(run, **kw):
    base = dict(run_dir=run, ckpt=None, average_last=0, split="test", beam=None, lenpen=None, name=None, set=[])
    return argparse.Namespace(**{**base, **kw})


def test_the_valid_split_is_scored_against_its_own_references_under_its_name(tmp_path):
    data = write_parallel(tmp_path / "mt", n=(200, 30, 20))
    overrides = ("task=multi30k", f"task.path={data}", "task.splits.valid=valid", "task.splits.test=test",
                 "task.vocab_size=120", "model=tiny", "debug=fast", "logger=none", "diagnostics.enabled=false")
    cfg = compose_cfg(*overrides)
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    assert train(cfg, AttentionPlan.for_job(cfg), run, group="t") is not None
    result = evaluate(_args(run, split="valid", set=["threads=1"]))
    metrics = result["metrics"]
    assert {"valid/loss", "valid/bleu", "valid/ppl"} <= set(metrics) and not any(k.startswith("test/") for k in metrics)
    assert result["threads"] == 1 == torch.get_num_threads()
    hyps = (run / "eval" / "valid.hyp.txt").read_text().splitlines()
    task = build_task(cfg)
    refs = task.text["valid"][1]
    assert len(hyps) == len(refs) == 30
    scored_hyps, scored_refs = task.scored_text(hyps, refs)
    assert metrics["valid/bleu"] == sacrebleu.corpus_bleu(scored_hyps, [scored_refs]).score
    items = json.loads((run / "eval" / "valid.items.json").read_text())
    assert items["split"] == "valid" and items["n"] == 30 and items["refs"] == scored_refs
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["valid.hyp.txt", "valid.items.json", "valid.json"]
    test = evaluate(_args(run))  # the test split: its own names, its own references
    assert "test/bleu" in test["metrics"] and not any(k.startswith("valid/") for k in test["metrics"])
    test_items = json.loads((run / "eval" / "test.items.json").read_text())
    assert test_items["n"] == 20 and test_items["refs"] == task.scored_text(task.text["test"][1],
                                                                           task.text["test"][1])[1]
