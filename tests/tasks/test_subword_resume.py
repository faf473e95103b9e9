"""task=subword_lm resumes exactly: a run killed in the middle of an epoch of packed windows and continued
ends with the test scores of the run never stopped (the shuffled window order, the model, the optimizer and the
schedule all carried in the checkpoint)."""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import torch
from helpers import NAS_RUN, nas_run, start_command

from tasks.language_model import train_windows

WORDS = "the model reads a long text about rivers cities and music in many places over years".split()


def _args(corpus, cache, run):
    return ("task=subword_lm", f"task.path={corpus}", "task.vocab_size=300", "task.valid_docs=5", "task.test_docs=5",
            "task.tokens_per_sample=32", "task.batch_size=16", f"task.cache_dir={cache}", "debug=fast",
            "train_batch_items=null", "trainer.max_steps=40", "trainer.val_check_interval=20",
            "checkpoint.last_every_n_steps=7", "optim.schedule=cosine", "optim.warmup=5", "diagnostics.plots=never",
            "logger=csv", f"hydra.run.dir={run}")


def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path):
    rng = np.random.default_rng(0)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) + "."})
                              + "\n" for _ in range(60)))
    cache = tmp_path / "cache"
    ref = nas_run(*_args(corpus, cache, tmp_path / "ref"), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = json.loads((tmp_path / "ref" / "summary.json").read_text())

    run = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    proc = start_command([NAS_RUN, *_args(corpus, cache, run)], cwd=tmp_path, env=env)
    last = run / "checkpoints" / "last.ckpt"
    end = time.time() + 240
    while not last.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < end, "no checkpoint appeared"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists()
    step = torch.load(last, weights_only=True)["global_step"]
    (meta,) = (cache / "subword").glob("*/meta.json")
    tokens = json.loads(meta.read_text())["splits"]["train"]["tokens"]
    steps_per_epoch = -(-len(train_windows(tokens, 32)) // 16)
    assert 0 < step < 40 and step % steps_per_epoch, (step, steps_per_epoch)  # stopped inside an epoch

    res = nas_run(f"resume={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((run / "summary.json").read_text())
    assert got["steps"] == 40 and got["resumed_from"].endswith(".ckpt")
    for key, value in expected["test"].items():
        assert got["test"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert got["best_val"]["value"] == pytest.approx(expected["best_val"]["value"], abs=1e-6)
