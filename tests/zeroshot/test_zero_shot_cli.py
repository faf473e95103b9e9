"""Zero-shot scores from the commands: ``lm_eval.tasks`` at the end of training (eval/lm_eval.json, per-item
records, a table in the W&B run) and ``nas-eval RUN --lm-eval`` afterwards, each scoring the tested weights the
same way; bad inputs are one line naming the option or file, exit 2, with nothing made."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
import pytest
from datafiles import zero_shot_data
from helpers import NAS_RUN, nas_run, run_command, script

pytest.importorskip("lm_eval")

WORDS = "the model reads a long text about rivers cities and music in many places question answer yes no".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) + "." for _ in range(80)]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return root


def _train(tmp_path, corpus, *extra):
    run = tmp_path / "run"
    proc = nas_run("task=subword_lm", f"task.path={corpus}", "task.vocab_size=300", "task.valid_docs=5",
                   "task.test_docs=5", "task.tokens_per_sample=32", f"task.cache_dir={tmp_path / 'cache'}",
                   "model.positions=rope", "model.max_len=512", "debug=fast", f"hydra.run.dir={run}", *extra,
                   cwd=tmp_path)
    return run, proc


def _own_process(argv, cwd, timeout=420) -> subprocess.CompletedProcess:
    """``argv`` in a process group of its own (``start_new_session``), started from the installed script (not forked from the tests' server),
    Python's fault handler on: a command whose output is still open at ``timeout`` is sent SIGABRT, which prints
    every thread's stack, then its whole group is killed (a child left behind holds the pipes too), and
    the test fails showing the stacks."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "NO_COLOR": "1"}
    env.pop("WANDB_MODE", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{argv[0]} (exit {proc.returncode}) still had its output open after {timeout} s:\n{err[-6000:]}")

    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_scores_at_the_end_of_training_equal_nas_evals_of_the_same_weights(tmp_path, corpus):
    data = zero_shot_data(tmp_path)
    run = tmp_path / "run"
    proc = _own_process([NAS_RUN, "task=subword_lm", f"task.path={corpus}", "task.vocab_size=300",
                         "task.valid_docs=5", "task.test_docs=5", "task.tokens_per_sample=32",
                         f"task.cache_dir={tmp_path / 'cache'}", "model.positions=rope", "model.max_len=512",
                         "debug=fast", f"hydra.run.dir={run}", "lm_eval.tasks=[lambada_openai,piqa]",
                         f"lm_eval.data_dir={data}", "lm_eval.limit=6", "lm_eval.max_length=384"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    record = json.loads((run / "eval" / "lm_eval.json").read_text())
    assert summary["zero_shot"]["file"] == "eval/lm_eval.json"
    assert set(record["metrics"]) == {"test/zeroshot/lambada_openai/perplexity", "test/zeroshot/lambada_openai/acc",
                                      "test/zeroshot/piqa/acc", "test/zeroshot/piqa/acc_norm"}
    assert record["zero_shot"]["tasks"]["piqa"]["items"] == 6 and record["zero_shot"]["limit"] == 6
    items = json.loads((run / "eval" / "lm_eval.items.json").read_text())["zeroshot"]
    assert np.mean(items["piqa"]["acc"]) == pytest.approx(record["metrics"]["test/zeroshot/piqa/acc"])
    samples = [json.loads(line) for line in (run / "eval" / "lm_eval.samples" / "piqa.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {"doc", "arguments", "resps", "acc"} <= set(samples[0])
    # the W&B run (offline) holds the table of the scores
    (table,) = run.glob("wandb/offline-run-*/files/media/table/zeroshot_*.table.json")
    logged = json.loads(table.read_text())
    assert logged["columns"] == ["task", "metric", "value", "stderr"]
    assert ["piqa", "acc", record["metrics"]["test/zeroshot/piqa/acc"]] in [row[:3] for row in logged["data"]]

    out = _own_process([script("nas-eval"), str(run), "--lm-eval", "piqa,lambada_openai", "--lm-eval-data",
                        str(data), "--lm-eval-limit", "6", "--lm-eval-max-length", "384", "--name", "again"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    again = json.loads((run / "eval" / "again.json").read_text())
    for key, value in record["metrics"].items():
        assert again["metrics"][key] == pytest.approx(value, rel=1e-6), key
    assert "piqa" in out.stdout and "± stderr" in out.stdout

    # nas-report: the evaluations are rows of their own, with the zero-shot columns
    report = run_command([script("nas-report"), str(run), "--format", "json"], cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["runs"]["rows"]
    assert {r["scheme"] for r in rows} >= {"unas [eval:lm_eval]", "unas [eval:again]"}


@pytest.mark.parametrize("args, words", [
    (["--lm-eval", "piqa,no_such_task"], "--lm-eval no_such_task: lm-eval has no such task"),
    (["--lm-eval", "piqa", "--lm-eval-data", "{empty}"], "its local file"),
    (["--lm-eval", "piqa", "--lm-eval-limit", "0"], "--lm-eval-limit 0"),
    (["--lm-eval", "piqa", "--lm-eval-max-length", "100000"], "--lm-eval-max-length 100000: give 2 to 512"),
    (["--lm-eval", ","], "--lm-eval: name one or more lm-eval tasks"),
])
def test_bad_zero_shot_options_are_one_line_and_write_nothing(tmp_path_factory, corpus, args, words):
    tmp_path = tmp_path_factory.mktemp("bad")
    run, proc = _train(tmp_path, corpus)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty") for a in args]
    out = run_command([script("nas-eval"), str(run), *argv], cwd=tmp_path)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (run / "eval").exists()


def test_lm_eval_tasks_on_a_task_that_is_not_a_subword_lm_is_refused_before_training(tmp_path):
    proc = nas_run("task=reverse", "debug=fast", "lm_eval.tasks=[piqa]", f"hydra.run.dir={tmp_path / 'run'}",
                   cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "lm_eval.tasks scores a language model trained on text with a subword tokenizer" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_zero_shot_failure_after_training_leaves_the_run_finished(tmp_path, corpus):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(zero_shot_data(tmp_path / "source"), data)
    (data / "piqa" / "valid.jsonl").write_text('{"goal": "broken\n')  # read only when the scores are computed
    run, proc = _train(tmp_path, corpus, "lm_eval.tasks=[piqa]", f"lm_eval.data_dir={data}", "lm_eval.limit=4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["zero_shot"]["error"] and "test/ppl" in summary["test"]
    assert "the zero-shot evaluation failed" in proc.stderr and f"nas-eval {run} --lm-eval piqa" in proc.stderr
    assert not (run / "eval" / "lm_eval.json").exists()
