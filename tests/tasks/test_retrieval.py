"""task=retrieval: each form's sequences hold what its definition says (the answer is the asked needle's
value, the chain's variables, the asked entry's number), the asked needle sits at its depth, the evaluation
scores each depth apart and every depth again at a longer length, and a trained run writes the length x
depth accuracies and their heatmap. Bad options are one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import nas_run

from tasks.retrieval import FORMS, N, Q, S, V, Retrieval


def _task(form, **kw):
    options = dict(form=form, seq_len=96, needles=3, keys=32, filler=16, train_size=20, val_size=10, test_size=10)
    return Retrieval(**{**options, **kw})


def _needles(x, layout):
    """(key tokens, value tokens) of each N ... S ... S needle in a sequence."""
    out, i = [], 0
    while i < len(x):
        if x[i] == N:
            j = i + 1 + list(x[i + 1:]).index(S)
            k = list(x[i + 1:j])
            e = j + 1 + list(x[j + 1:]).index(S)
            out.append((k, list(x[j + 1:e])))
            i = e
        i += 1
    return out


@pytest.mark.parametrize("form", ["single", "multikey", "multivalue", "multiquery"])
def test_the_answer_is_the_asked_keys_value(form):
    task = _task(form)
    x, y = task.make(200, np.random.default_rng(0))
    for row, t in zip(x, y):
        seq = np.append(row, t[-1])  # the full sequence: the last target is the last token
        needles = _needles(seq[: list(seq).index(Q)], task.layout)
        assert len(needles) == (1 if form == "single" else 3)
        answer = [int(v) for v in t if v >= 0]
        q = list(seq).index(Q)
        asked = list(seq[q + 1: q + 1 + task.key_len])
        values = [v for k, v in needles if k == asked]
        if form == "multivalue":
            assert answer == [tok for v in values for tok in v]  # every value, in the order they stand
        elif form == "multiquery":  # each key asked in turn, each answer its value, scored where it stands
            asks = [i for i, tok in enumerate(seq) if tok == Q]
            assert len(asks) == 3
            for i in asks:
                key = list(seq[i + 1: i + 1 + task.key_len])
                at = i + 2 + task.key_len
                value = list(seq[at: at + task.value_len])
                assert [v for k, v in needles if k == key] == [value]
                assert list(t[at - 1: at - 1 + task.value_len]) == value  # the target before each answer token
        else:
            assert len(values) == 1 and answer == values[0]


def test_passkey_variable_tracking_and_phonebook_answers():
    x, y = _task("passkey").make(50, np.random.default_rng(1))
    for row, t in zip(x, y):
        seq = np.append(row, t[-1])
        i = list(seq).index(N)
        assert [int(v) for v in t if v >= 0] == list(seq[i + 1: i + 5])
    x, y = _task("variable_tracking").make(50, np.random.default_rng(2))
    for row, t in zip(x, y):
        seq = list(np.append(row, t[-1]))
        hops = [seq[i + 1: i + 5] for i, tok in enumerate(seq) if tok == V]
        chain = [hops[0][0]] + [h[0] for h in hops[1:]]
        assert all(h[2] == prev for h, prev in zip(hops[1:], chain))  # each hop names the one before
        assert [int(v) for v in t if v >= 0] == chain
    task = _task("phonebook")
    x, y = task.make(50, np.random.default_rng(3), depth=0.5)
    for row, t in zip(x, y):
        seq = list(np.append(row, t[-1]))
        q = seq.index(Q)
        name = seq[q + 1: q + 3]
        where = next(i for i in range(q) if seq[i:i + 2] == name and seq[i + 2] == S)
        assert [int(v) for v in t if v >= 0] == seq[where + 3: where + 7]


@pytest.mark.parametrize("form", ["single", "passkey", "phonebook"])
def test_the_asked_needle_sits_at_its_depth(form):
    task = _task(form, seq_len=200)
    for depth in (0.0, 0.5, 1.0):
        x, y = task.make(40, np.random.default_rng(4), depth=depth)
        for row in x:
            seq = list(row)
            q = seq.index(Q)
            start = seq.index(N) if form != "phonebook" else None
            if form == "phonebook":
                name = seq[q + 1: q + 3]
                start = next(i for i in range(q) if seq[i:i + 2] == name and seq[i + 2] == S)
            assert abs(start / q - depth) < 0.15


def test_each_depth_is_its_own_share_of_the_test_set_and_every_length_has_them_all():
    task = _task("single", test_size=20)
    task.setup()
    groups = torch.cat([b["group"] for b in task.test_dataloader()])
    assert groups.tolist()[:5] == [0, 1, 2, 3, 4] and torch.bincount(groups).tolist() == [4] * 5
    longer = next(iter(task.length_loader("test", 192)))
    assert longer["ids"].size(1) == 192 and set(longer["group"].tolist()) == {0, 1, 2, 3, 4}


def test_group_accuracies_count_each_groups_answers():
    from nas_cli.model.scoring import Scores, group_accuracies, group_sums

    target = torch.tensor([[0, 5, 6], [0, 0, 7], [8, 9, 0]])
    pred = torch.tensor([5, 1, 7, 8, 0])  # the scored positions row by row: (5, 6), (7,), (8, 9)
    tgt = torch.tensor([5, 6, 7, 8, 9])
    z = torch.zeros(())
    scores = Scores(z, z, z, z, torch.tensor([2, 1, 2]), pred, tgt)
    sums = group_sums(scores, target, 0, torch.tensor([0, 1, 0]), 2)
    got = group_accuracies("test", "retrieval_acc", ["depth0", "depth100"], sums)
    assert got == {"test/retrieval_acc_depth0": pytest.approx(2 / 4), "test/retrieval_acc_depth100": 1.0}


@pytest.mark.parametrize("options,message", [
    (dict(form="haystack"), "task.form must be one of"),
    (dict(depths=[0, 150]), "task.depths must be needle depths in percent of the haystack, 0 to 100"),
    (dict(seq_len=20, needles=4, form="multiquery"), "task.seq_len=20 is too short for the needles"),
])
def test_bad_options_say_which(options, message):
    with pytest.raises(ValueError, match=message):
        _task(**{"form": "single", **options})
    assert set(FORMS) >= {"passkey", "phonebook", "variable_tracking"}


@pytest.mark.slow  # a trained run
def test_a_trained_run_reports_the_length_by_depth_grid_and_draws_it(tmp_path):
    run = tmp_path / "r"
    proc = nas_run("task=retrieval", "task.seq_len=64", "task.depths=[0,50,100]", "eval_lengths=[128]",
                   "debug=fast", "logger=csv", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    test = json.loads((run / "summary.json").read_text())["test"]
    for d in (0, 50, 100):
        for suffix in ("", "@128"):
            assert 0 <= test[f"test/retrieval_acc_depth{d}{suffix}"] <= 1
    assert (run / "retrieval_heatmap.png").stat().st_size > 1000
