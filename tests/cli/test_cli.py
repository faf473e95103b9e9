"""End-to-end: the installed ``nas-run`` command, real Lightning, real W&B (offline)."""
import csv
import os
from pathlib import Path
import json

import pytest
import torch
from omegaconf import OmegaConf

from nas_cli.infra.wandb_offline import read_run

from helpers import NAS_RUN, nas_run, run_command  # noqa: F401  (NAS_RUN: used below)


def test_debug_run_from_another_directory_logs_to_offline_wandb(tmp_path):
    run_dir = tmp_path / "run"
    proc = nas_run("debug=fast", "attention=hnas", "attention.u_init=0.2", "threads=1", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # what the numbers also depend on: threads=1 was applied, and the torch build is recorded
    env = summary["environment"]
    assert env["threads"] == 1 and env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["deterministic"] is False and env["precision"] == "32-true"
    assert summary["scheme"] == "hnas" and summary["heads"] == 4 and summary["steps"] == 20
    assert "nas-run result" in proc.stdout and "exact match" in proc.stdout
    # no warnings a user cannot act on (Lightning's deprecated W&B setting and pytree call)
    assert "anonymous setting" not in proc.stderr and "LeafSpec" not in proc.stderr
    # what W&B itself recorded (its offline transaction log)
    wb = read_run(run_dir / "wandb")
    assert wb["id"] == summary["wandb_run_id"]
    assert wb["group"] == "reverse" and "scheme:hnas" in wb["tags"] and "heads:4" in wb["tags"]
    assert wb["config"]["attention"]["u_init"] == 0.2
    logged = set().union(*map(set, wb["history"]))
    for key in ("train/loss", "train/token_acc", "lr", "val/loss", "val/ppl", "val/bleu", "val/exact_match",
                "u/encoder/L0/h0", "u/decoder/L1/mean", "u/cross/L0/h3"):
        assert key in logged, key
    assert wb["summary"]["test/bleu"] == pytest.approx(summary["test"]["test/bleu"])
    assert wb["summary"]["parameters"] == summary["parameters"]
    first_u = next(h["u/encoder/L0/h0"] for h in wb["history"] if "u/encoder/L0/h0" in h)
    assert first_u == pytest.approx(0.2, abs=0.01)
    # the best checkpoint is complete and loadable with the safe loader
    ckpt = torch.load(run_dir / summary["best_checkpoint"], weights_only=True)
    assert "state_dict" in ckpt
    assert not list(run_dir.rglob("*.tmp"))


def test_multirun_one_wandb_run_per_job_in_one_group(tmp_path):
    sweep = tmp_path / "sweep"
    proc = nas_run("-m", "debug=fast", "trainer.max_steps=6", "run_test=false", "diagnostics.plots=never",
                   "attention=unas,dnas", "model.heads=2,4",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert [p.name for p in jobs] == ["0_reverse_unas-h2", "1_reverse_unas-h4", "2_reverse_dnas-h2", "3_reverse_dnas-h4"]
    runs = [read_run(p / "wandb") for p in jobs]
    assert len({r["id"] for r in runs}) == 4
    assert {r["group"] for r in runs} == {"sweep"}
    assert {r["job_type"] for r in runs} == {"sweep"}
    assert "nas-run sweep" in proc.stdout  # the comparison table after the sweep


@pytest.mark.slow  # a sweep of trained runs
def test_a_sweep_over_schemes_takes_their_own_option(tmp_path):
    """``-m attention=deltanet,mamba2 attention.conv=4``: an option the default scheme (unas) lacks, beside a sweep
    over schemes that offer it, reaches every job (Hydra composes the sweep's own config with the default)."""
    import json

    sweep = tmp_path / "sweep"
    proc = nas_run("-m", "task=mqar", "debug=fast", "trainer.max_steps=4", "run_test=false", "diagnostics.plots=never",
                   "attention=deltanet,mamba2", "attention.conv=4", "model.positions=none",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    assert [OmegaConf.load(p / ".hydra" / "config.yaml").attention.conv for p in jobs] == [4, 4]
    for p in jobs:  # the state holds the convolution's last inputs beside the mixer's (2 layers, 4 heads of 16)
        assert json.loads((p / "summary.json").read_text())["recurrent_state_bytes"] > 2 * 4 * 16 * 16 * 4


@pytest.mark.parametrize("args,needle", [
    (["attention.encoder=bogus"], "attention.encoder=bogus: no such choice (choices: additive, "),
    (["model.heads=5"], "model.heads=5 must divide model.d_model=64"),
    (["attention=hnas", "attention.u_init=3"], "attention.u_init must be in [0, 1]"),
    (["optim.lr=inf", "trainer.max_steps=5"], "optim.lr=inf is not valid: it must be a number > 0"),
    (["optim.lr=1e30", "trainer.max_steps=5"], "training loss became nan"),
    (["logger.mode=sometimes"], "logger.mode must be offline, online or disabled"),
])
def test_bad_input_gives_one_clear_line(tmp_path, args, needle):
    proc = nas_run("debug=fast", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run" / "summary.json").exists()
    if "nan" not in needle:  # refused before training: no run directory left behind
        assert not (tmp_path / "run").exists()
    # ... and with the default run directory, no folder under outputs/ either
    if args == ["model.heads=5"]:
        again = nas_run("debug=fast", *args, cwd=tmp_path)
        assert again.returncode == 2 and not (tmp_path / "outputs").exists()



@pytest.mark.parametrize("argv,line", [
    (["nas-eval", "run", "--beam", "abc"],
     "nas-eval: error: argument --beam: invalid int value: 'abc' (see nas-eval --help)"),
    (["nas-eval"], "nas-eval: error: the following arguments are required: run_dir (see nas-eval --help)"),
    (["nas-report", "sweep", "--bogus"], "nas-report: error: unrecognized arguments: --bogus (see nas-report --help)"),
    (["nas-bench", "attention", "--lengths", "abc"],  # a subcommand's parser: the same class
     "nas-bench attention: error: argument --lengths: expected a number, got 'abc' (see nas-bench attention --help)"),
    (["nas-repro", "bogus"], "nas-repro: error: argument command: invalid choice: 'bogus' (choose from "
                             "'mode-collapse', 'explained-away') (see nas-repro --help)"),
])
def test_the_other_commands_bad_arguments_are_one_line(tmp_path, argv, line):
    # argparse printed its usage block (up to nine lines) before the error; the usage is at --help
    proc = run_command([str(Path(NAS_RUN).with_name(argv[0])), *argv[1:]], cwd=tmp_path, timeout=120,
                       env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300"})
    assert proc.returncode == 2 and proc.stderr.strip() == line, proc.stderr[-2000:]
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []

@pytest.mark.parametrize("args,needle", [
    (["trainer.max_steps=-5"], "trainer.max_steps=-5 is not valid: it must be a positive number of optimizer steps"),
    (["+trainer.foo=1"], "+trainer.foo: Lightning's Trainer has no argument 'foo'"),
    (["trainer.precision=fp7"], "trainer.precision=fp7): Precision 'fp7' is invalid"),
    pytest.param(["trainer=gpu"], "trainer.accelerator=gpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="needs a machine without a GPU")),
])
def test_bad_trainer_option_refused_before_anything_starts(tmp_path, args, needle):
    """Lightning's own checks, as one line, before data, model, W&B run or checkpoint."""
    run = tmp_path / "run"
    proc = nas_run("debug=fast", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert needle in lines[-1] and lines[-1].startswith("nas-run: error:")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not run.exists()  # nothing made


def test_validation_interval_longer_than_an_epoch_is_one_line_naming_the_fix(tmp_path):
    """Lightning rejects trainer.val_check_interval above an epoch's batches only once the data
    is known (a ValueError with a traceback): nas-run says it in one line, with both ways out, and
    the suggested one trains."""
    args = ("task=sort", "task.train_size=500", "task.test_size=50", "trainer.max_steps=20",
            "trainer.val_check_interval=10", "logger=csv", "progress_bar=false", "diagnostics.plots=never")
    proc = nas_run(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last == ("nas-run: error: trainer.val_check_interval=10 is more than the 8 training batches of one "
                    "epoch of task=sort; set it to at most 8, or add trainer.check_val_every_n_epoch=null to "
                    "count it in updates across epochs")
    assert not (tmp_path / "run" / "summary.json").exists() and (tmp_path / "run" / "failed.json").exists()
    fixed = nas_run(*args, "trainer.check_val_every_n_epoch=null", "trainer.max_steps=40",
                    f"hydra.run.dir={tmp_path / 'fixed'}", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    summary = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert summary["steps"] == 40 and len(summary["fit_seconds_by_launch"]) == 1
    # the throughput is the whole training's, also when the test loads an earlier best checkpoint
    # (whose recorded training time must not replace the run's): near the last value logged
    logged = [float(r["train/tokens_per_s"]) for r in csv.DictReader((tmp_path / "fixed" / "csv").rglob(
        "metrics.csv").__next__().open()) if r.get("train/tokens_per_s")]
    assert summary["tested"]["step"] < 40 and logged
    assert summary["tokens_per_s"] == pytest.approx(logged[-1], rel=0.3)


def test_unknown_group_choice_lists_valid_options(tmp_path):
    proc = nas_run("attention=bogus", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "attention=bogus: no such choice" in proc.stderr and "dnas" in proc.stderr and "sinkhorn" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["model.head=4"], "model.head is not an option; did you mean model.heads?"),
    (["attention.decoer=dnas"], "attention.decoer is not an option; did you mean attention.decoder?"),
    (["atention=dnas"], "atention is not an option; did you mean attention?"),
    (["attention=dnass"], "attention=dnass: no such choice; did you mean dnas?"),
    (["-m", "attention=unas,dnass"], "attention=dnass: no such choice; did you mean dnas?"),
    (["+model.head=4"], "+model.head: nas-run does not read this key, so it would be ignored; did you mean model.heads?"),
    (["modle.heads=4"], "there is no 'modle' section; did you mean model?"),
])
def test_typos_get_one_line_with_the_closest_name(tmp_path, args, needle):
    proc = nas_run(*args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_thread_count_does_not_split_a_group_but_the_setup_does():
    from omegaconf import OmegaConf

    from helpers import compose_cfg
    from nas_cli.infra.config_identity import config_id

    def cid(*overrides):
        return config_id(OmegaConf.to_container(compose_cfg(*overrides), resolve=True))

    base = cid("attention=dnas")
    assert cid("attention=dnas", "threads=1") == cid("attention=dnas", "threads=2") == base
    assert cid("attention=dnas", "seed=7") == base  # seeds are what a group averages over
    assert cid("attention=dnas", "model.heads=2") != base and cid("attention=unas") != base


def test_the_committed_study_configs_are_of_todays_layout():
    # the code reads one layout: the study's saved configs were migrated once (benchmarks/migrate_runs.py),
    # so each of their top-level keys is one today's nas-run has, and their run-directory tag is today's
    from omegaconf import OmegaConf

    from helpers import compose_cfg

    repo = Path(__file__).resolve().parents[2]
    keys = set(compose_cfg())
    saved = sorted((repo / "benchmarks" / "study").rglob(".hydra/config.yaml"))
    assert len(saved) >= 90
    for path in saved:
        config = OmegaConf.to_container(OmegaConf.load(path))
        assert set(config) <= keys, (path, set(config) - keys)
        hydra = (path.parent / "hydra.yaml").read_text()
        assert "${nas.tag:${attention},${task._target_},${model}}" in hydra, path


