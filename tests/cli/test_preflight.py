"""The pre-run check counts the model's parameters on the meta device (nothing allocated): the count
is the trained model's, for every kind of model, and the run says it before training starts."""
from __future__ import annotations

import os

import pytest

from helpers import NAS_RUN, compose_cfg, nas_run, run_command
from nas_cli.pipeline.checks.config import check_config
from nas_cli.pipeline.lit import count_parameters
from nas_cli.pipeline.parts import build_module, build_task


@pytest.mark.parametrize("overrides", [
    (),                                                                  # nas-run's encoder-decoder
    ("attention=pe_product_symmetric", "model.positions=none"),          # tie_qk: keys share the query projection
    ("task=copy_lm", "attention=hnas"),                                  # decoder-only, a scheme with parameters
    ("task=copy_lm", "model=hf_llama"),                                  # a Hugging Face family
], ids=["seq2seq", "tie_qk", "lm-hnas", "hf_llama"])
def test_the_preflight_count_is_the_trained_models(overrides):
    if "model=hf_llama" in overrides:
        pytest.importorskip("transformers")
    cfg = compose_cfg(*overrides)
    checked = check_config(cfg)
    module = build_module(cfg, build_task(cfg), checked.plan.model_cores(cfg.model))
    assert checked.exact and checked.parameters == count_parameters(module.model)
    if "attention=pe_product_symmetric" in overrides:
        tied = [m for m in module.model.modules() if hasattr(m, "k_proj") and getattr(m, "tie_qk", False)]
        assert tied and all(m.k_proj is None for m in tied)


def test_the_run_says_its_size_before_training(tmp_path):
    proc = nas_run("debug=fast", "logger=none", "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model: 234,944 parameters" in proc.stderr.splitlines()
    assert "model: 234,944 parameters" in (tmp_path / "run" / "nas_run.log").read_text()


def test_a_count_the_data_will_settle_says_what_it_assumed():
    """A tokenizer not trained yet: with task.vocab_size the count already holds embeddings of that size
    (the line says "about" and names the assumption); without it, the embeddings are not in the count."""
    from nas_cli.pipeline.run import _estimated

    assert _estimated(6_002_688, 8000) == ("model: about 6,002,688 parameters (its embeddings counted at "
                                           "task.vocab_size=8000; the tokenizer trained on the data decides)")
    assert _estimated(1_000, None) == "model: 1,000 parameters + the embeddings of the vocabulary the data give"


def test_a_job_trains_the_task_its_check_built(tmp_path):
    # the task is built once: by the check before Hydra starts (its data checked before anything is made),
    # whose result the job takes over and hands to training
    (tmp_path / "counted.py").write_text(
        "from tasks.synthetic import SyntheticSeq2Seq\n\n\n"
        "class Counted(SyntheticSeq2Seq):\n"
        "    def __init__(self, **kw):\n"
        "        with open('built.txt', 'a') as f:\n"
        "            f.write('built\\n')\n"
        "        super().__init__(**kw)\n")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                                                 os.environ.get("PYTHONPATH")]))}
    proc = run_command([NAS_RUN, "debug=fast", "logger=none", "trainer.max_steps=2", "task._target_=counted.Counted",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "built.txt").read_text().count("built") == 1
