"""task=mqar and task=selective_copy: the data are what their definitions say, checked item by item and,
for MQAR's power-law query distances, against the distribution itself (scipy's chi-square test); and
both train to a summary with their accuracy, with nas-run's LM and with model=hf_llama."""
import json

import numpy as np
import pytest
from scipy import stats

from helpers import nas_run
from tasks.recall import MQAR, SelectiveCopy, mqar, selective_copy_mad, selective_copy_mamba


def test_mqar_pairs_queries_and_targets_follow_zoologys_definition():
    rng = np.random.default_rng(0)
    vocab, length, pairs = 64, 32, 4
    inputs, target = mqar(200, vocab, length, pairs, 0.01, True, rng)
    assert inputs.shape == target.shape == (200, length)
    for x, y in zip(inputs, target):
        keys, values = x[0:2 * pairs:2], x[1:2 * pairs:2]
        assert len(set(keys)) == pairs and len(set(values)) == pairs
        assert all(1 <= k < vocab // 2 for k in keys) and all(vocab // 2 <= v < vocab for v in values)
        scored = np.flatnonzero(y >= 0)
        assert len(scored) == pairs and all(p >= 2 * pairs and (p - 2 * pairs) % 2 == 0 for p in scored)
        for p in scored:  # the query is the key at p, its target the key's value
            k = x[p]
            assert k in keys and y[p] == values[list(keys).index(k)]
        assert all(0 <= t < vocab for t in x)


def test_mqar_query_distances_follow_the_power_law():
    """The query slots' offsets g (0-based) are drawn with p(g) proportional to a (g + 1) ** (a - 1): the
    first draw of each row against p, by a chi-square test (a wrong law fails it at this n)."""
    rng = np.random.default_rng(1)
    n, length, pairs, a = 20000, 24, 1, 0.5
    inputs, target = mqar(n, 128, length, pairs, a, False, rng)
    space = (length - 2 * pairs) // 2
    g = (np.argmax(target >= 0, axis=1) - 2 * pairs) // 2
    counts = np.bincount(g, minlength=space)
    p = a * np.arange(1, space + 1, dtype=float) ** (a - 1)
    p /= p.sum()
    assert stats.chisquare(counts, n * p).pvalue > 1e-3
    assert counts[0] > counts[-1] * 2  # near queries are likelier


@pytest.mark.parametrize("make,answer_input", [(selective_copy_mamba, 1), (selective_copy_mad, 0)])
def test_selective_copy_asks_for_every_content_token_from_memory(make, answer_input):
    """Both published forms: the answer region's inputs are copy markers (Mamba) or blanks (MAD), never the
    content tokens, and the j-th scored output is the j-th content token (tests/tasks/test_published_tasks.py
    compares each with its source's distributions)."""
    inputs, target = make(100, 10, 40, 6, np.random.default_rng(2))
    assert inputs.shape == target.shape == (100, 40)
    for x, y in zip(inputs, target):
        scored = np.flatnonzero(y >= 0)
        assert list(scored) == list(range(34, 40)) and set(x[scored]) == {answer_input}
        content = x[:34][x[:34] >= 2]
        assert len(content) == 6 and list(y[scored]) == list(content)


def test_splits_are_seeded_and_apart_and_bad_options_say_which():
    a, b = MQAR(vocab_size=64, seq_len=16, num_kv_pairs=2, train_size=50, val_size=20, test_size=20), \
        MQAR(vocab_size=64, seq_len=16, num_kv_pairs=2, train_size=50, val_size=20, test_size=20)
    a.setup(), b.setup()
    assert all(np.array_equal(a.splits[s].inputs, b.splits[s].inputs) for s in a.splits)
    assert not np.array_equal(a.splits["val"].inputs, a.splits["test"].inputs)
    batch = next(iter(a.train_dataloader()))
    assert batch["ids"].min() >= 3 and (batch["target"] > 0).sum(1).tolist() == [2] * batch["target"].size(0)
    with pytest.raises(ValueError, match="task.seq_len=10 must be even and at least 4 x task.num_kv_pairs"):
        MQAR(seq_len=10, num_kv_pairs=4)
    with pytest.raises(ValueError, match="task.num_tokens=30 must be at most half of task.seq_len=40"):
        SelectiveCopy(seq_len=40, num_tokens=30)
    with pytest.raises(ValueError, match="task.seq_len=33 must exceed 2 x task.num_tokens \\+ 1 = 33"):
        SelectiveCopy(variant="mad", seq_len=33, num_tokens=16)
    with pytest.raises(ValueError, match="task.variant must be one of mamba, mad"):
        SelectiveCopy(variant="s4")


@pytest.mark.slow  # trained runs, Hugging Face models among them
@pytest.mark.parametrize("task,metric", [("mqar", "query_acc"), ("selective_copy", "copy_acc")])
@pytest.mark.parametrize("model", ["tiny", "hf_llama"])
def test_each_trains_to_a_summary_with_its_accuracy(task, metric, model, tmp_path):
    run = tmp_path / "r"
    small = ["task.train_size=512", "task.val_size=64", "task.test_size=64"]
    small += ["task.seq_len=64"] if task == "selective_copy" else []  # mqar's own length is 64; this one's 256
    proc = nas_run(f"task={task}", f"model={model}", "debug=fast", *small, "logger=csv", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["test"][f"test/{metric}"] <= 1 and summary["best_val"]["metric"] == f"val/{metric}"
    assert summary["metrics"][f"test/{metric}"][1] is True  # higher is better, for the tables and verdicts
