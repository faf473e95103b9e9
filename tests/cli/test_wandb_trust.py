"""What the W&B dashboard shows is what ran: a run's label and config_id come from the locations its
model has, a resumed offline run is one whole history, every run records the code that made it,
and the gradient norm it logs is the gradients' norm. Files are read back with W&B's own protobufs."""
from __future__ import annotations

import csv
import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg, nas_run, run_command
from nas_cli.infra.config_identity import config_id
from nas_cli.infra.version import code_version, describe
from nas_cli.infra.wandb_offline import SUPERSEDED, offline_folders, read_run
from nas_cli.model.plan import AttentionPlan, canonical_config
from nas_cli.pipeline.lit import grad_norm
from nas_cli.pipeline.launch.resolvers import scheme_tag

NAS_RUN = str(Path(sys.executable).parent / "nas-run")


@pytest.mark.parametrize("override, missing", [("attention.cross=dnas", "no cross-attention"),
                                               ("attention.encoder=hnas", "no encoder self-attention")])
def test_a_scheme_at_a_location_the_model_lacks_is_refused_and_leaves_nothing(tmp_path, override, missing):
    proc = nas_run("task=copy_lm", override, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "task copy_lm builds a decoder-only model" in lines[0] and missing in lines[0]
    assert f"drop {override.split('=')[0]}" in lines[0]
    assert list(tmp_path.iterdir()) == []


def _identity(*overrides):
    cfg = compose_cfg(*overrides)
    plan = AttentionPlan.for_job(cfg)
    container = OmegaConf.to_container(cfg, resolve=True)
    tag = scheme_tag(cfg.attention, cfg.task._target_, cfg.model)
    return plan.tag, tag, sorted(plan.wandb_tags), config_id(canonical_config(container))


def test_two_spellings_of_one_model_are_one_setup():
    lm = _identity("task=copy_lm", "attention=dnas")
    assert lm == _identity("task=copy_lm", "attention.decoder=dnas")
    assert lm[:3] == ("dnas", "dnas", ["decoder:dnas"])
    # the encoder-decoder: every location named alike is the scheme everywhere
    s2s = _identity("attention=dnas")
    assert s2s == _identity("attention.encoder=dnas", "attention.decoder=dnas", "attention.cross=dnas")
    assert s2s[0] == "dnas" and s2s[3] != lm[3]
    # different models stay different
    assert _identity("attention=hnas")[3] != s2s[3]
    assert _identity("attention=dnas", "attention.cross=unas")[1] == "enc-dnas_dec-dnas_cross-unas"
    # the WikiText-2 preset's decoder-only model: its decoder's scheme, not enc-..._cross-...
    assert _identity("experiment=wikitext2_cpu", "attention.decoder=dnas")[:2] == ("dnas", "dnas")
    # no encoder layers: no encoder location
    assert _identity("model.encoder_layers=0", "attention.decoder=hnas", "attention.cross=hnas")[0] == "hnas"


@pytest.mark.slow  # a run stopped and resumed
def test_resumed_offline_run_is_one_whole_history_and_records_the_code(tmp_path):
    run = tmp_path / "r"
    first = nas_run("debug=fast", "trainer.max_steps=30", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = read_run(run)
    again = nas_run(f"resume={run}", "trainer.max_steps=60", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[nas_run][INFO]" not in again.stdout + again.stderr  # the log's lines go to nas_run.log only
    first = [ln for ln in again.stderr.splitlines() if ln.strip()][0]  # says first what it continues, to what
    assert first == f"nas-run: continuing {run} from step 30 (checkpoints/last.ckpt) to trainer.max_steps=60", first
    wandb_dir = run / "wandb"
    newest = offline_folders(wandb_dir, before["id"])
    assert len(newest) == 1  # the first launch's folder moved aside, kept
    assert [p.name.rsplit("-", 1)[1] for p in (wandb_dir / SUPERSEDED).iterdir()] == [before["id"]]
    whole = read_run(newest[0])
    assert whole["id"] == before["id"]
    train_steps = [h["trainer/global_step"] for h in whole["history"] if "train/loss" in h]
    assert train_steps == list(range(4, 60, 5))  # every logged step from the first to the last, once
    val_steps = [h["trainer/global_step"] for h in whole["history"] if "val/loss" in h]
    assert val_steps == sorted(set(val_steps)) and len(val_steps) == 6
    # the carried rows are the first launch's, value for value (histograms too), but for what a finished
    # launch logs at its end (its test, its figures): the continued run logs its own, once
    def end_of_launch(h, key):
        return key.startswith("test/") or key.rsplit("/", 1)[0] in {k.rsplit("/", 1)[0] for k, v in h.items()
                                                                    if k.endswith("/_type") and v in
                                                                    ("image-file", "table-file")}

    def shown(h):
        return {k: v for k, v in h.items() if not k.startswith("_") and not k.endswith(("/path", "/sha256"))
                and not end_of_launch(h, k)}

    carried = [shown(h) for h in whole["history"] if h["trainer/global_step"] <= 30]
    strip = [shown(h) for h in before["history"]]
    assert [h for h in carried if set(h) - {"trainer/global_step"}] == \
        [h for h in strip if set(h) - {"trainer/global_step"}]
    assert len([h for h in whole["history"] if "test/loss" in h]) == 1  # one test result: the last launch's
    assert [h["trainer/global_step"] for h in whole["history"] if "test/loss" in h][0] > 30
    images = [k for h in whole["history"] for k, v in h.items() if k.endswith("/_type") and v == "image-file"]
    assert images and len(images) == len(set(images))  # one image set
    # W&B's best/step is the history row holding the best value; the config id survives the extension
    best_rows = [h["trainer/global_step"] for h in whole["history"]
                 if h.get("val/exact_match") == whole["summary"]["best/val/exact_match"]]
    assert whole["summary"]["best/step"] in best_rows
    assert before["config"]["config_id"] == whole["config"]["config_id"]
    for h in whole["history"]:
        for key, value in h.items():
            if key.endswith("/_type") and value == "image-file":
                assert (newest[0] / "files" / h[key[:-len("_type")] + "path"]).is_file()
    # the code version, in summary.json and the W&B config; the parameters and best step too
    summary = json.loads((run / "summary.json").read_text())
    assert summary["code"] == code_version() and summary["code"]["version"] == metadata.version("nas-run")
    assert whole["config"]["code"] == summary["code"]
    assert whole["config"]["parameters"] == summary["parameters"]
    assert summary["best_val"]["step"] in (10, 20, 30, 40, 50, 60)  # a validation's optimizer step
    assert whole["summary"]["best/step"] == summary["best_val"]["logged_step"]  # the row, whichever launch logged it
    assert whole["summary"]["best/optimizer_step"] == summary["best_val"]["step"]
    assert summary["config_id"] == json.loads((run / "summary.step30.json").read_text())["config_id"]
    assert not Path(summary["run_dir"]).is_absolute() and not Path(summary["wandb_dir"]).is_absolute()
    assert (run / summary["wandb_dir"]).resolve() == (newest[0] / "files").resolve()
    # the run's log says what happened, launch by launch
    log = (run / "nas_run.log").read_text()
    assert "started: reverse, unas, h4, seed 1" in log and "resumed from last.ckpt" in log
    assert log.count("finished: ") == 2 and "finished: 60 steps" in log
    # the gradient norm before clipping, at every logging step
    assert [h["trainer/global_step"] for h in whole["history"] if "train/grad_norm" in h] == train_steps


def test_version_names_nas_run_and_its_version():
    proc = run_command([NAS_RUN, "--version"])
    assert proc.returncode == 0
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"nas-run {metadata.version('nas-run')}")
    code = code_version()
    if code["commit"]:
        assert code["commit"] in first
    assert describe({"version": "0.1.0", "commit": "3f2a9c1deadbeef", "dirty": True}) == "0.1.0+3f2a9c1.dirty"
    assert describe(None) == "?"


def test_grad_norm_is_the_norm_clipping_measures():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    model(torch.randn(4, 5)).pow(2).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
    assert float(grad_norm(model.parameters())) == pytest.approx(float(expected), rel=1e-6)


def test_csv_logger_gets_the_gradient_norm(tmp_path):
    from nas_cli.pipeline.run import train

    cfg = compose_cfg("logger=csv", "debug=fast", "trainer.gradient_clip_val=0.5", "diagnostics.enabled=false",
                      "run_test=false")
    train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    rows = [r for r in csv.DictReader(open(tmp_path / "csv" / "metrics.csv")) if r.get("train/grad_norm")]
    assert len(rows) == 4 and all(float(r["train/grad_norm"]) > 0 for r in rows)
    # before clipping: the first steps' norms exceed the clip value
    assert float(rows[0]["train/grad_norm"]) > 0.5


def test_job_logging_prints_a_library_s_own_records_once(tmp_path, capsys):
    # A SLURM job's stderr showed each of submitit's warnings twice: by submitit's own handler and by the
    # job logging's console. The job logging of conf/config.yaml, applied as Hydra applies it.
    import logging
    import logging.config

    from importlib.resources import files

    job_logging = OmegaConf.load(files("nas_cli.conf") / "config.yaml").hydra.job_logging
    job_logging.handlers.file.filename = str(tmp_path / "nas_run.log")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    library = logging.getLogger("a_library")
    try:
        logging.config.dictConfig(OmegaConf.to_container(job_logging))
        own = logging.StreamHandler(sys.stderr)
        own.setFormatter(logging.Formatter("a_library: %(message)s"))
        library.addHandler(own)
        library.warning("caught a signal")
        logging.getLogger("a_plain_one").warning("something to see")
        for handler in root.handlers:
            handler.flush()
    finally:
        library.handlers.clear()
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        root.handlers[:], root.level = saved[0], saved[1]
    err = capsys.readouterr().err
    assert err.count("caught a signal") == 1 and err.count("something to see") == 1, err
    log = (tmp_path / "nas_run.log").read_text()
    assert "caught a signal" in log and "something to see" in log  # the file keeps both
