"""``debug=fast`` on every preset whose data is here: the whole run, the test included, on batches of at
most 16 items (``train_batch_items`` / ``eval_batch_items``). The time budget is the benchmark's
(benchmarks/debug_fast.py, docs/benchmarks.md), not this test's."""
from __future__ import annotations

import json

import pytest
from helpers import compose_cfg, load_benchmark, nas_run
from omegaconf import OmegaConf

from nas_cli.infra.config_identity import config_id
from nas_cli.infra.distributed import EpochBatches
from tasks.batching import TokenBatchSampler

debug_fast = load_benchmark("debug_fast")
documented_path, local_presets = debug_fast.documented_path, debug_fast.local_presets

RUNNABLE, SKIPPED = local_presets()


def test_the_presets_are_found_with_their_data_and_the_others_are_said_why():
    names = {p for p, _ in RUNNABLE}
    assert "gigaword_style" in names  # the built-in task: its data is generated
    assert documented_path("multi30k_cpu") == "../shared/data/multi30k/raw"
    assert documented_path("iwslt14") == "/data/iwslt14.tokenized.de-en"
    assert "iwslt14" in SKIPPED and "not on this machine (/data/iwslt14" in SKIPPED["iwslt14"]
    assert set(SKIPPED).isdisjoint(names) and len(names) + len(SKIPPED) >= 13


@pytest.mark.parametrize("preset,overrides", RUNNABLE, ids=[p for p, _ in RUNNABLE])
def test_debug_fast_runs_every_preset_whose_data_is_here_test_included(tmp_path, preset, overrides):
    proc = nas_run("debug=fast", f"experiment={preset}", *overrides, "logger=none", "hydra.run.dir=run",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["test"], summary
    assert all(v == v for v in summary["test"].values())  # finite numbers, not NaN
    if (run / "test_items.json").is_file():  # tasks scored item by item: at most 2 test batches of 16
        assert 0 < json.loads((run / "test_items.json").read_text())["n"] <= 32
    assert "tested checkpoint: step" in proc.stdout


def _sampler(lengths, budget):
    return TokenBatchSampler(lengths, budget, shuffle=False)


def test_batches_are_cut_into_pieces_of_at_most_max_items_keeping_every_item_in_order():
    lengths = [3] * 50 + [9] * 20 + [30] * 5
    whole = EpochBatches(_sampler(lengths, 120), seed=1)
    cut = EpochBatches(_sampler(lengths, 120), seed=1, max_items=16)
    assert max(len(b) for b in whole) == 40  # 120 tokens of 3-token items
    pieces = list(cut)
    assert max(len(b) for b in pieces) <= 16
    assert [i for b in pieces for i in b] == [i for b in whole for i in b]
    assert len(cut) == len(pieces) > len(whole)
    # a resumed epoch starts after the pieces already trained on
    resumed = EpochBatches(_sampler(lengths, 120), seed=1, max_items=16)
    resumed.resume(0, 3)
    assert list(resumed) == pieces[3:]
    # two processes share the pieces, each gets every second one
    ranks = [list(EpochBatches(_sampler(lengths, 120), seed=1, rank=r, world=2, max_items=16)) for r in (0, 1)]
    assert ranks[0] == pieces[0::2] and ranks[1] == pieces[1::2]


def test_the_batch_caps_leave_a_configs_identity_at_their_default_and_split_it_when_set():
    base = OmegaConf.to_container(compose_cfg("task=reverse"), resolve=True)
    without = {k: v for k, v in base.items() if k not in ("train_batch_items", "eval_batch_items")}
    assert base["train_batch_items"] is None and base["eval_batch_items"] is None
    assert config_id(base) == config_id(without)  # runs made before the options existed keep their id
    assert config_id({**base, "eval_batch_items": 16}) != config_id(base)
    assert config_id({**base, "train_batch_items": 16}) != config_id({**base, "eval_batch_items": 16})


def test_a_batch_cap_below_one_is_refused_in_one_line(tmp_path):
    proc = nas_run("task=reverse", "model=tiny", "eval_batch_items=0", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 2 and "eval_batch_items=0" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_eval_lengths_and_the_tuning_options_leave_a_configs_identity_as_runs_before_them_had_it():
    base = OmegaConf.to_container(compose_cfg("task=copy_lm"), resolve=True)
    without = {k: v for k, v in base.items() if k not in ("eval_lengths", "tune", "tune_seeds")}
    assert config_id(base) == config_id(without)  # the study's runs made before them share a group with new ones
    assert config_id({**base, "eval_lengths": [256]}) != config_id(base)
    assert config_id({**base, "tune": ["optim.lr"], "tune_seeds": [9]}) == config_id(base)  # how a report reads them
