"""What a refusal advises is then accepted: each suggestion below is taken from the refusal's own line and
composed and checked as nas-run would (one refused in turn would send a user in a circle). And the few
places where a legal-looking input gave a silently different number: an evaluation at the trained length
is the test split itself; nas-report's tables written to a file keep every column and number whole."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from helpers import compose_cfg

from nas_cli.errors import UserError
from nas_cli.pipeline.checks.config import check_config


def _refusal(*overrides: str) -> str:
    from nas_cli.pipeline.launch.overrides import check_overrides  # noqa: F401 - the run's own order of checks

    with pytest.raises(Exception) as err:
        check_config(compose_cfg(*overrides))
    return str(err.value)


def test_the_gated_value_placement_advice_for_cross_attention_is_accepted():
    line = _refusal("attention=gated", "attention.placement=value")
    advised = re.search(r"\((attention\.cross=\S+ attention\.cross\.placement=sdpa)\)", line).group(1).split()
    check_config(compose_cfg("attention=gated", "attention.placement=value", *advised))  # accepted
    other = re.search(r"another scheme for attention.cross \((attention\.cross=\w+)\)", line).group(1)
    check_config(compose_cfg("attention=gated", "attention.placement=value", other))


def test_a_misspelled_model_key_advises_only_the_right_key_and_it_is_accepted(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nas_cli.commands.nas_run", "model.head=4", "debug=fast"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "+model.head" not in proc.stderr, proc.stderr
    key = re.search(r"did you mean (model\.\w+)\?", proc.stderr).group(1)
    check_config(compose_cfg(f"{key}=4"))


def test_a_misspelled_tune_key_and_equivalence_metric_say_the_right_name():
    with pytest.raises(UserError, match=r"did you mean optim\.lr\?"):
        check_config(compose_cfg("tune=[optim.lrr]"))
    from nas_cli.report.compare import CompareError, parse_margins

    with pytest.raises(CompareError, match=r"did you mean --equivalence bleu=1\?"):
        parse_margins("blue=1", ["test/bleu", "test/ppl"])


def test_an_evaluation_at_the_trained_length_is_the_test_split_itself():
    from tasks.recall import MQAR

    task = MQAR(vocab_size=64, seq_len=16, num_kv_pairs=2, train_size=20, val_size=10, test_size=12)
    task.setup()
    at = np.concatenate([b["ids"].numpy() for b in task.length_loader("test", 16)])
    test = np.concatenate([b["ids"].numpy() for b in task.test_dataloader()])
    assert np.array_equal(at, test)
    other = np.concatenate([b["ids"].numpy() for b in task.length_loader("test", 32)])
    assert other.shape == (12, 32)


def test_nas_report_written_to_a_file_keeps_every_column_and_whole_numbers(tmp_path):
    """A tuned grid with long labels: written to a file (not a terminal), no column is squeezed away and no
    number is cut short with an ellipsis."""
    for scheme in ("unas", "dnas"):
        for lr in (0.001, 0.003):
            for seed in range(1, 9):  # a column per seed in the tuning table: wider than any default width
                d = tmp_path / f"{scheme}-{lr}-{seed}"
                (d / ".hydra").mkdir(parents=True)
                config = {"task": {"name": "sim"}, "attention": scheme, "optim": {"lr": lr}, "seed": seed,
                          "tune": ["optim.lr"], "model": {"some_rather_long_option_name": 123456789}}
                (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
                (d / "summary.json").write_text(json.dumps({
                    "task": "sim", "scheme": scheme, "heads": 4, "seed": seed, "parameters": 23_456_789,
                    "best_val": {"metric": "val/bleu", "mode": "max", "value": 30 + seed + 1000 * lr},
                    "test": {"test/bleu": 234.987654 + seed}}))
    out = tmp_path / "report.txt"
    with open(out, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "nas_cli.commands.nas_report", str(tmp_path), "--baseline",
                               "scheme=unas", "--no-item-tests"], stdout=f, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "…" not in text
    assert "optim.lr=0.003 (tuned)" in text and "23,456,789" in text
    # the verdict's words on one line, not folded into a narrow column
    assert re.search(r"no significant difference \(n=8, CI [-+.\d]+\.\.[-+.\d]+, p=[\d.]+\)", text), text
    for column in ("cell", "optim.lr", "val seed 1", "val seed 8", "mean val", "chosen", "margin to runner-up"):
        assert column in text


def test_single_runs_of_other_positions_have_other_directory_names():
    """copy_lm with sigmoid attention and ALiBi, and with sinusoids, no longer share copy_lm/sigmoid-h4."""
    from nas_cli.pipeline.launch.resolvers import positions_tag, register_resolvers

    register_resolvers()
    alibi = compose_cfg("task=copy_lm", "attention=sigmoid", "model.positions=alibi")
    plain = compose_cfg("task=copy_lm", "attention=sigmoid")
    assert positions_tag(alibi.model) == "-alibi" and positions_tag(plain.model) == ""
    assert positions_tag(compose_cfg("model=hf_llama").model) == ""  # a Hugging Face family's positions are its own


def test_sweep_job_folders_name_their_positions_and_a_continued_sweep_keeps_its_folders(tmp_path):
    """A sweep over model.positions gets one folder name per positions; a sweep made when job folders did not
    name them continues in its folders (of the same positions), not in new ones."""
    from omegaconf import OmegaConf

    from helpers import nas_run
    from nas_cli.pipeline.launch.resolvers import job_subdir

    proc = nas_run("-m", "task=copy_lm", "attention=sigmoid", "model.positions=alibi,sinusoidal", "debug=fast",
                   "trainer.max_steps=2", "progress_bar=false", "logger=csv", "diagnostics.plots=never",
                   f"hydra.sweep.dir={tmp_path / 'sw'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sw").iterdir() if p.is_dir()) == [
        "0_copy_lm_sigmoid-alibi-h4", "1_copy_lm_sigmoid-h4"]

    alibi = OmegaConf.create({"heads": 4, "positions": "alibi"})
    earlier = tmp_path / "old" / "3_copy_lm_sigmoid-h4" / ".hydra"
    earlier.mkdir(parents=True)
    (earlier / "config.yaml").write_text(yaml.safe_dump({"model": {"heads": 4, "positions": "alibi"}}))
    assert job_subdir(tmp_path / "old", 3, "copy_lm", "sigmoid", alibi) == "3_copy_lm_sigmoid-h4"
    (earlier / "config.yaml").write_text(yaml.safe_dump({"model": {"heads": 4, "positions": "sinusoidal"}}))
    assert job_subdir(tmp_path / "old", 3, "copy_lm", "sigmoid", alibi) == "3_copy_lm_sigmoid-alibi-h4"
    assert job_subdir(tmp_path / "new", 3, "copy_lm", "sigmoid", alibi) == "3_copy_lm_sigmoid-alibi-h4"


def test_a_completed_run_refusal_names_only_keys_that_are_no_option(tmp_path):
    """trainer.max_stepz is a near miss of trainer.max_steps and no option; trainer.max_epochs is an option of
    the run's config and is not called a misspelling."""
    from nas_cli.infra.resume import check_resumable

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": 20, "max_epochs": 1}}))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 20}))
    with pytest.raises(UserError) as err:
        check_resumable(tmp_path, ["trainer.max_epochs=3"])
    assert "that run is complete (20 steps" in str(err.value) and "no option" not in str(err.value)
    with pytest.raises(UserError, match=r"trainer\.max_stepz=40 is no option: did you mean trainer\.max_steps=40\?"):
        check_resumable(tmp_path, ["trainer.max_stepz=40"])


def test_runs_made_before_an_option_existed_group_with_runs_that_have_it_at_its_default():
    """A study's seeds made before optim.decay_fraction and train_tokens existed and after (with them at their
    defaults) are one setup: nas-report does not split them into two groups; set otherwise, the option splits."""
    from nas_cli.infra.config_identity import config_id, identity

    before = {"seed": 1, "optim": {"lr": 0.01}, "model": {"d_model": 64}}
    after = {"seed": 2, "optim": {"lr": 0.01, "decay_fraction": 0.2}, "model": {"d_model": 64}, "train_tokens": None}
    assert identity(before) == identity(after) and config_id(before) == config_id(after)
    other = {**after, "optim": {"lr": 0.01, "decay_fraction": 0.5}}
    assert config_id(other) != config_id(before)
