"""Length generalization (``eval_lengths``): what a length means for each task, checked item by item;
the refusals before training; and a run that writes a metric per length to summary.json, W&B, the
result table, nas-report (columns, verdicts, the figure) and nas-eval."""
import json

import numpy as np
import pytest

from datafiles import ROOT, WIKITEXT2
from helpers import compose_cfg, nas_run, run_command, script
from nas_cli.errors import UserError
from tasks.base import PAD
from tasks.language_model import LanguageModelTask
from tasks.recall import MQAR, SPECIALS, SelectiveCopy


def _lm(block=16, context=12, n=500):
    task = LanguageModelTask("lm", tokens_per_sample=block, context_window=context, eval_batch_size=4)
    task.streams = {"test": np.arange(10, 10 + n, dtype=np.int32)}  # token = position + 10: each one unique
    return task


@pytest.mark.parametrize("length", [16, 40, 64, 128])
def test_a_language_model_scores_every_token_once_at_every_length_with_the_same_share_of_new_tokens(length):
    task = _lm()
    scored, windows = [], 0
    for batch in task.length_loader("test", length):
        ids, target = batch["ids"], batch["target"]
        assert ids.size(1) <= length
        for row_ids, row_t in zip(ids, target):
            real = row_t[row_t != PAD]
            scored += real.tolist()
            windows += 1
            # each target is the token after its input (context positions carry PAD targets)
            where = (row_t != PAD).nonzero().flatten()
            assert all(int(row_t[p]) == int(row_ids[p]) + 1 for p in where)
    assert sorted(scored) == list(range(11, 510))  # tokens 1..n-1 of the split, each exactly once
    new = max(1, round(length * (16 - 12) / 16))  # 4 new tokens of 16 at the trained length: a quarter
    assert task.length_context(length) == length - new
    assert windows == pytest.approx(1 + (499 - length) / new, abs=1.5)


def test_mqar_at_a_longer_length_has_proportionally_more_pairs_and_its_own_draw():
    task = MQAR(vocab_size=512, seq_len=64, num_kv_pairs=4, train_size=50, val_size=20, test_size=30)
    task.setup()
    assert task.at_length(256)["num_kv_pairs"] == 16 and task.trained_length() == 64
    batches = list(task.length_loader("test", 256))
    ids = np.concatenate([b["ids"].numpy() for b in batches]) - SPECIALS
    target = np.concatenate([b["target"].numpy() for b in batches])
    assert ids.shape == (30, 256)
    for x, y in zip(ids, target):
        keys, values = list(x[0:32:2]), list(x[1:32:2])
        assert len(set(keys)) == 16
        where = np.flatnonzero(y != PAD)
        assert len(where) == 16
        for p in where:  # the query is a key; its target is that key's value
            assert y[p] - SPECIALS == values[keys.index(x[p])]
    again = np.concatenate([b["ids"].numpy() for b in task.length_loader("test", 256)]) - SPECIALS
    assert np.array_equal(ids, again)  # a fixed draw: every scheme sees the same test set at each length
    at128 = np.concatenate([b["ids"].numpy() for b in task.length_loader("test", 128)])
    assert at128.shape == (30, 128)
    with pytest.raises(ValueError, match="at 1024 tokens the task would be .*vocab_size=512 must exceed"):
        task.check_length(1024)


def test_selective_copy_at_a_longer_length_copies_proportionally_more_tokens():
    task = SelectiveCopy(vocab_size=16, seq_len=64, num_tokens=8, train_size=20, val_size=10, test_size=10)
    task.setup()
    batch = next(iter(task.length_loader("test", 128)))
    assert batch["ids"].shape[1] == 128
    assert all(int((row != PAD).sum()) == 16 for row in batch["target"])


@pytest.mark.parametrize("overrides,message", [
    (["task=mqar", "eval_lengths=[128]", "model.positions=learned", "model.max_len=64"],
     r"eval_lengths=\[128\] reaches 128 tokens, but model.positions=learned trains only the position rows of its "
     r"training length \(64 tokens; model.max_len=64\)"),
    (["task=mqar", "eval_lengths=[128,256]", "model.positions=learned"],  # rows up to max_len 256, trained up to 64
     r"eval_lengths=\[128,256\] reaches 256 tokens, but model.positions=learned trains only the position rows of "
     r"its training length \(64 tokens; model.max_len=256\)"),
    (["task=reverse", "eval_lengths=[64]"], "task 'reverse' has no evaluation at other lengths"),
    (["task=mqar", "eval_lengths=[0,128]"], "must be a list of positive lengths in tokens"),
    (["task=mqar", "eval_lengths=128"], "must be a list of positive lengths in tokens"),
    (["task=mqar", "eval_lengths=[128]", "run_test=false"], "it needs run_test=true"),
    (["task=mqar", "eval_lengths=[20000]"], "at 20000 tokens the task would be"),
])
def test_what_cannot_be_evaluated_is_refused_before_training_in_one_line(overrides, message):
    from nas_cli.pipeline.checks.config import check_config

    with pytest.raises(UserError, match=message) as err:
        check_config(compose_cfg(*overrides))
    assert "\n" not in str(err.value)


def test_learned_positions_up_to_the_trained_length_and_positions_that_extend_are_accepted():
    from nas_cli.pipeline.checks.config import check_config

    check_config(compose_cfg("task=mqar", "eval_lengths=[32,64]", "model.positions=learned", "model.max_len=128"))
    for positions in ("sinusoidal", "rope", "alibi", "none"):
        check_config(compose_cfg("task=mqar", "eval_lengths=[1024]", f"model.positions={positions}", "model.max_len=64"))


@pytest.mark.slow  # a sweep of four runs
def test_a_run_reports_each_length_in_its_summary_table_wandb_nas_report_and_nas_eval(tmp_path):
    out = nas_run("task=mqar", "debug=fast", "eval_lengths=[128,256]", "model.positions=sinusoidal",
                  "model.max_len=64", "seed=1,2", "attention=unas,sigmoid", "-m",
                  f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(runs) == 4
    summary = json.loads(runs[0].read_text())
    assert summary["lengths"] == {"trained": 64, "evaluated": [128, 256]}
    for key in ("test/query_acc@128", "test/query_acc@256", "test/ppl@256"):
        assert 0 <= summary["test"][key] < float("inf")
    assert summary["metrics"]["test/query_acc@256"] == ["query acc. @256", True, "pct"]
    assert summary["test"]["test/ppl@256"] != summary["test"]["test/ppl"]  # another test set, another number
    assert "query acc. @128" in out.stdout
    # W&B: the numbers in the run's summary, a chart of each metric against the length
    wandb_dir = runs[0].parent / summary["wandb_dir"]
    chart, = wandb_dir.glob("media/table/lengths/query_acc_*.table.json")
    table = json.loads(chart.read_text())
    assert table["columns"] == ["length", "query_acc"]
    assert table["data"] == [[64, summary["test"]["test/query_acc"]], [128, summary["test"]["test/query_acc@128"]],
                             [256, summary["test"]["test/query_acc@256"]]]
    # nas-report: a column and a verdict per length, and the figure against the length
    html = tmp_path / "report.html"
    report = run_command([script("nas-report"), str(tmp_path / "sweep"), "--baseline", "scheme=unas",
                          "--format", "json", "--html", str(html)], cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = json.loads(report.stdout)["comparison"]["rows"]
    assert {"query_acc@128", "query_acc@256", "ppl@256"} <= {row["metric"] for row in rows}
    assert all(row["verdict"] for row in rows if row["metric"].endswith("@256"))
    page = html.read_text()
    assert "<h2>Metric vs evaluated length</h2>" in page and "mqar metric vs length" in page
    # nas-eval at lengths of its own, for the finished run
    ev = run_command([script("nas-eval"), str(runs[0].parent), "--eval-lengths", "96"], cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    result = json.loads((runs[0].parent / "eval" / "test-at96.json").read_text())
    assert "test/query_acc@96" in result["metrics"] and result["lengths"] == {"trained": 64, "evaluated": [96]}


@pytest.mark.slow  # a real corpus, trained and tested at three lengths
@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/wikitext-2 not present")
def test_wikitext2_trained_at_one_length_and_tested_at_others_as_the_docs_show(tmp_path):
    """The command of docs/tasks.md, as written (the repository's root as working directory)."""
    run_dir = tmp_path / "wt"
    out = nas_run("experiment=wikitext2_cpu", "task.path=../shared/data/wikitext-2", "model.positions=rope",
                  "eval_lengths=[256,1024]", "debug=fast", "logger=none", f"hydra.run.dir={run_dir}", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lengths"] == {"trained": 128, "evaluated": [256, 1024]}
    assert {"test/ppl@256", "test/ppl@1024"} <= set(summary["test"])
    assert "test ppl @1024" in out.stdout


@pytest.mark.slow  # the README's line as written
def test_the_readme_lines_run_as_written(tmp_path):
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if "eval_lengths=" in ln and
             ln.startswith("nas-run ")]
    expected = {"task=mqar": ({"trained": 64, "evaluated": [128, 256]}, "test/query_acc@256"),
                "task=retrieval": ({"trained": 256, "evaluated": [512, 1024]}, "test/retrieval_acc_depth50@1024")}
    assert len(lines) == len(expected)
    for i, line in enumerate(lines):
        argv = line.split("#")[0].split()[1:]
        out = nas_run(*argv, "debug=fast", "logger=none", f"hydra.run.dir={tmp_path}/run{i}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads((tmp_path / f"run{i}" / "summary.json").read_text())
        lengths, key = expected[argv[0]]
        assert summary["lengths"] == lengths and key in summary["test"]
