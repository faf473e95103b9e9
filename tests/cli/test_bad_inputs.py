"""Bad input, table-driven, across every command: what a user might really type (a typo, a value out of
range, a path that is not there, an option one command does not have) gets one line naming it, a
non-zero exit, no traceback, and nothing made or changed on disk: not in the directory it was typed
in, not in the run it named. Each row: the command line ({run}: a finished run, {unfinished}: a run
directory without results, {empty}: an empty folder, {missing}: a path that does not exist), the exit
status, and a piece of the one line."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers import run_command

BIN = Path(sys.executable).parent

R = "nas-run"
#: (argv, exit status, a piece of the line): refused before anything is made
CASES = [
    # --- nas-run: model ---
    ([R, "model.heads=0"], 2, "model.heads=0 is not valid"),
    ([R, "model.heads=four"], 2, "model.heads='four' is not valid"),
    ([R, "model.heads=5"], 2, "must divide model.d_model"),
    ([R, "model.d_model=-1"], 2, "model.d_model=-1 is not valid"),
    ([R, "model.dropout=1.5"], 2, "model.dropout=1.5 is not valid"),
    ([R, "model.max_len=0"], 2, "model.max_len=0 is not valid"),
    ([R, "model.encoder_layers=-1"], 2, "model.encoder_layers=-1 is not valid"),
    ([R, "model.decoder_layers=0"], 2, "model.decoder_layers=0 is not valid"),
    ([R, "model.ffn=-1"], 2, "model.ffn=-1 is not valid"),
    ([R, "model.head=4"], 2, "model.heads"),
    ([R, "model=huge"], 2, "model=huge"),
    ([R, "model.positions=bogus"], 2, "model.positions=bogus is not valid"),
    # --- nas-run: score settings and per-layer plans ---
    ([R, "attention=dnas", "attention.softcap=30"], 2, "dnas has no option 'softcap'; it is an option of flex, gated"),
    ([R, "attention.window=8"], 2, "attention.cross.window=8: cross-attention's keys are the source's positions"),
    ([R, "task=copy_lm", "attention.sink=one"], 2, "attention.sink must be null (no sink), zero or learned"),
    ([R, "task=copy_lm", "attention.per_layer=[{{windw:3}}]"], 2, "attention.per_layer[0].windw=3: unas has no option"),
    ([R, "task=copy_lm", "attention.per_layer=3"], 2, "attention.per_layer=3: give a list repeated over the layers"),
    ([R, "task=copy_lm", "attention.per_layer=[{{scheme:nope}}]"], 2, "attention.per_layer[0]: unknown attention scheme"),
    ([R, "model=base", "model.d_model=8192", "model.ffn=65536", "model.heads=8"], 2, "the model is too large"),
    # --- nas-run: optimizer ---
    ([R, "optim.lr=-1"], 2, "optim.lr=-1 is not valid"),
    ([R, "optim.lr=abc"], 2, "optim.lr='abc' is not valid"),
    ([R, "optim.warmup=-3"], 2, "optim.warmup=-3 is not valid"),
    ([R, "optim.label_smoothing=1"], 2, "optim.label_smoothing=1 is not valid"),
    ([R, "optim.weight_decay=-0.1"], 2, "optim.weight_decay=-0.1 is not valid"),
    ([R, "optim.lrr=1e-3"], 2, "optim.lr"),
    ([R, "tune=[optim.lrr]"], 2, "optim.lrr is no option of this config (did you mean optim.lr?)"),
    ([R, "attention=differential", "attention.lambda_init=1"], 2, "attention.lambda_init must be null"),
    ([R, "optim.optimizer=sgd"], 2, "optim.optimizer='sgd' is not valid: it must be adam or adamw"),
    ([R, "optim.schedule=linear"], 2, "optim.schedule='linear' is not valid"),
    # --- nas-run: task ---
    ([R, "task=nonexistent"], 2, "task=nonexistent"),
    ([R, "task.batch_size=0"], 2, "task.batch_size=0 is not valid"),
    ([R, "task.min_len=20", "task.max_len=5"], 2, "task.min_len <= task.max_len"),
    ([R, "task.symbols=0"], 2, "task.symbols must be in"),
    ([R, "task.max_len=300"], 2, "more than model.max_len=256"),
    ([R, "task=copy_lm", "task.max_len=200"], 2, "more than model.max_len=256"),
    ([R, "task.op=rotate"], 2, "task.op must be one of"),
    ([R, "task.train_size=0"], 2, "task.train_size=0 is not valid"),
    ([R, "task.vocab_size=0", "task=multi30k", "task.path={empty}"], 2, "task.vocab_size=0 is not valid"),
    ([R, "experiment=multi30k_cpu", "task.path={missing}"], 2, "task.path"),
    ([R, "experiment=wikitext2_cpu", "task.path={empty}"], 2, "{empty}"),
    ([R, "task.sizee=3"], 2, "task.size"),
    ([R, "task=subword_lm", "task.path={empty}"], 2, "no files there"),
    ([R, "task=subword_lm", "task.path={missing}"], 2, "no such file or folder"),
    ([R, "task=subword_lm", "task.path={empty}", "task.vocab_size=100"], 2, "below the byte alphabet"),
    ([R, "task=selective_copy", "task.variant=s4"], 2, "task.variant must be one of mamba, mad"),
    ([R, "experiment=zoology_fig2", "task.seq_len=100"], 2, "has Figure 2's cells task.seq_len=64, 128, 256, 512"),
    ([R, "task=mad_recall", "task.frac_noise=0.3"], 2, "task.frac_noise > 0 needs task.noise_vocab_size"),
    ([R, "task=mad_compression", "model=hf_llama"], 2, "decodes every position from the last position's state"),
    ([R, "task=copy_lm", "attention=sigmoid", "attention.bias=-2", "attention.bias_n=64"], 2,
     "attention.bias and attention.bias_n both set the bias"),
    # --- nas-run: seed, threads, top-level ---
    ([R, "seed=-1"], 2, "seed=-1 is not valid"),
    ([R, "seed=1.5"], 2, "seed=1.5 is not valid"),
    ([R, "seed=abc"], 2, "seed='abc' is not valid"),
    ([R, "threads=0"], 2, "threads=0 is not valid"),
    ([R, "run_tset=false"], 2, "run_test"),
    ([R, "experiment=bogus"], 2, "experiment=bogus"),
    ([R, "debug=slow"], 2, "debug=slow"),
    # --- nas-run: trainer ---
    ([R, "trainer.max_steps=0"], 2, "trainer.max_steps=0 is not valid"),
    ([R, "trainer.max_steps=-5"], 2, "trainer.max_steps=-5 is not valid"),
    ([R, "trainer.max_epochs=0"], 2, "trainer.max_epochs=0 is not valid"),
    ([R, "trainer.precision=16-mixed"], 2, "trainer.precision=16-mixed is float16, which needs a GPU"),
    ([R, "trainer.precision=fp7"], 2, "Precision 'fp7' is invalid"),
    ([R, "trainer.accumulate_grad_batches=0"], 2, "trainer.accumulate_grad_batches=0 is not valid"),
    ([R, "trainer.val_check_interval=0"], 2, "trainer.val_check_interval=0 is not valid"),
    ([R, "trainer=tpu9"], 2, "trainer=tpu9"),
    ([R, "trainer.devices=0"], 2, "trainer"),
    # --- nas-run: attention ---
    ([R, "attention=bogus"], 2, "attention=bogus"),
    ([R, "attention.encoder=bogus"], 2, "attention.encoder=bogus: no such choice"),
    ([R, "attention=hnas", "attention.u_init=2"], 2, "attention.u_init must be in [0, 1]"),
    ([R, "attention.u_init=0.1"], 2, "u_init"),
    ([R, "task=copy_lm", "attention.cross=dnas"], 2, "has no cross-attention"),
    ([R, "task=copy_lm", "attention.encoder=hnas"], 2, "has no encoder self-attention"),
    ([R, "+attention.decoder.dropout=0.1"], 2, "attention.decoder"),
    ([R, "attention=pe_lookup"], 2, "model.positions=none"),
    ([R, "attention=dnas", "attention.impl=fastest"], 2, "attention.impl"),
    ([R, "attention=sinkhorn", "attention.iterations=0"], 2, "iterations"),
    # the option's type is its constructor's annotation: 2.5 iterations was int(2.5) = 2, silently
    ([R, "attention=sinkhorn", "attention.iterations=2.5"], 2, "sinkhorn's option 'iterations' takes an integer"),
    ([R, "attention=hnas", "attention.u_init=abc"], 2, "hnas's option 'u_init' takes a number"),
    ([R, "task=mqar", "attention=mamba2", "attention.state=0"], 2, "attention.state must be null (the head size)"),
    ([R, "task=mqar", "attention=mamba2", "attention.state=8", "model.positions=none", "model.mla=true"], 2,
     "model.mla: scheme 'mamba2' asks for queries and keys of 8 features per head"),
    # --- nas-run: logger, diagnostics, checkpoints ---
    ([R, "logger.mode=sometimes"], 2, "logger.mode must be offline, online or disabled"),
    ([R, "logger.mode=online"], 2, "logger.mode=online needs a W&B login"),
    ([R, "logger=nope"], 2, "logger=nope"),
    ([R, "diagnostics.batches=0"], 2, "diagnostics.batches=0 is not valid"),
    ([R, "+diagnostics.metrics.bogus={{_target_: nope.Nope}}"], 2, "diagnostics.metrics.bogus"),
    ([R, "checkpoint.keep_last=0"], 2, "checkpoint.keep_last=0 is not valid"),
    # --- nas-run: where and how ---
    ([R, "hydra.run.dir=/proc/x/run"], 2, "hydra.run.dir=/proc/x/run: cannot create"),
    ([R, "hydra.run.dir=''"], 2, "hydra.run.dir='': an empty directory"),
    ([R, "-m", "seed=1,1"], 2, "seed=1,1 lists 1 twice"),
    ([R, "-m", "attention=unas,dnas,unas"], 2, "lists unas twice"),
    ([R, "-m", "attention=deltanet,dnas", "attention.conv=4"], 2,
     "attention.conv=4: dnas (swept in attention=deltanet,dnas) has no option 'conv'; sweep the schemes that offer it "
     "(deltanet)"),
    ([R, "-m", "seed=auto"], 2, "seed=auto"),
    ([R, "seed=auto"], 2, "seed=auto runs seeds in rounds"),
    ([R, "resume={missing}"], 2, "{missing}"),
    ([R, "resume={empty}"], 2, "{empty}"),
    ([R, "resume={run}", "trainer.max_steps=5"], 2, "that run is complete (20 steps"),
    ([R, "resume={run}", "trainer.max_steps=40", "attention=dnas"], 2, "attention=dnas"),
    ([R, "resume={run}", "trainer.max_steps=40", "debug=fast"], 2, "debug=fast"),
    ([R, "resume={run}", "trainer.max_stepz=9"], 2, "trainer.max_stepz=9 is no option: did you mean trainer.max_steps=9?"),
    ([R, "resume={run}", "debug=fast"], 2, "debug=fast does not apply to a resumed run"),
    ([R, "resume={run}", "-m", "seed=1,2"], 2, "resume= takes one run directory and cannot be combined with -m"),
    ([R, "resume={run}"], 2, "{run}"),
    ([R, "resume={run}", "trainer.max_steps=40", "model.heads=3"], 2, "model.heads"),
    ([R, "logger=wandb", "logger.project=''"], 2, "logger.project='' is empty: a W&B run needs a project name"),
    # --- nas-run: data a task cannot get (refused before any run directory is made) ---
    ([R, "task=wmt14"], 2, "task 'wmt14' has no task.path, so it reads the Hugging Face dataset 'wmt14' (de-en); the "
                           "hub does not answer and"),
    ([R, "task=multi30k", "task.path="], 2, "give the data as files with task.path=<dir with train.de/train.en, "
                                            "val.*, test_2016_flickr.*>"),
    # --- nas-run: Lightning's Trainer arguments (every one is accepted as trainer.<name>=) ---
    ([R, "trainer.foo=1"], 2, "trainer.foo: Lightning's Trainer has no argument 'foo'; the closest of its arguments is "
                              "trainer."),
    ([R, "+trainer.foo=1"], 2, "+trainer.foo: Lightning's Trainer has no argument 'foo'"),
    ([R, "trainer.limit_val_batchs=0"], 2, "did you mean trainer.limit_val_batches?"),
    ([R, "resume={run}", "trainer.max_steps=40", "+trainer.fo=1"], 2, "Lightning's Trainer has no argument 'fo'"),
    # --- nas-run: Hydra's own groups ---
    ([R, "-m", "hydra/launcher=nonexistent", "seed=1,2"], 2, "hydra/launcher=nonexistent: no such choice (choices: "
                                                             "basic, joblib, ray, slurm, submitit_local, "
                                                             "submitit_slurm)"),
    ([R, "hydra/launcher=jobli"], 2, "did you mean hydra/launcher=joblib?"),
    ([R, "-m", "hydra/launcher=rq", "seed=1,2"], 2, "hydra/launcher=rq: that plug-in is not installed"),
    ([R, "-m", "hydra/sweeper=nevergrad", "seed=1,2"], 2, "pip install hydra-nevergrad-sweeper"),
    ([R, "hydra/lancher=basic"], 2, "hydra/lancher is not a config group of Hydra; did you mean hydra/launcher?"),
    # --- nas-report ---
    (["nas-report"], 2, "the following arguments are required"),
    (["nas-report", "{missing}"], 2, "{missing}"),
    (["nas-report", "{empty}"], 2, "no nas-run runs"),
    (["nas-report", "{run}", "--baseline", "scheme=bogus"], 2, "scheme=bogus"),
    (["nas-report", "{run}", "--baseline", "scheme"], 2, "--baseline"),
    (["nas-report", "{run}", "--format", "xml"], 2, "--format xml: unknown"),
    (["nas-report", "{run}", "--group-by", "nofield"], 2, "nofield"),
    (["nas-report", "{run}", "--table", "comparison"], 2, "--table comparison"),
    (["nas-report", "{run}", "--format", "csv", "--table", "nosuch"], 2, "--table nosuch: unknown"),
    (["nas-report", "{run}", "--metrics", "nosuch"], 2, "nosuch"),
    (["nas-report", "{run}", "--detect", "bleu=0.5"], 2, "--detect plans seeds for a comparison"),
    (["nas-report", "{run}", "--wandb", "sometimes"], 2, "invalid choice: 'sometimes'"),
    (["nas-report", "{run}", "--pivot", "nocol"], 2, "--pivot nocol"),
    (["nas-report", "{run}", "--samples", "many"], 2, "--samples"),
    # --- nas-eval ---
    (["nas-eval"], 2, "the following arguments are required: run_dir"),
    (["nas-eval", "{missing}"], 2, "{missing}"),
    (["nas-eval", "{empty}"], 2, "not a nas-run run directory"),
    (["nas-eval", "{unfinished}"], 2, "is unfinished (no summary.json)"),
    (["nas-eval", "{run}", "--beam", "0"], 2, "--beam 0"),
    (["nas-eval", "{run}", "--eval-lengths", "0"], 2, "--eval-lengths 0 must be a list of positive lengths"),
    (["nas-eval", "{run}", "--beam", "abc"], 2, "invalid int value: 'abc'"),
    (["nas-eval", "{run}", "--set", "nokey=1"], 2, "--set nokey"),
    (["nas-eval", "{run}", "--set", "novalue"], 2, "expected KEY=VALUE"),
    (["nas-eval", "{run}", "--ckpt", "{missing}"], 2, "not found"),
    (["nas-eval", "{run}", "--average-last", "3"], 2, "--average-last 3: only 0 periodic checkpoints"),
    (["nas-eval", "{run}", "--split", "train"], 2, "invalid choice: 'train'"),
    # --- nas-bench ---
    (["nas-bench"], 2, "nas-bench"),
    (["nas-bench", "bogus"], 2, "invalid choice: 'bogus'"),
    (["nas-bench", "attention", "--lengths", "abc"], 2, "expected a number, got 'abc'"),
    (["nas-bench", "attention", "--schemes", "bogus"], 2, "bogus"),
    (["nas-bench", "attention", "--heads", "0"], 2, "--heads"),
    (["nas-bench", "train", "--model", "huge"], 2, "huge"),
    (["nas-bench", "gpu-check"], 2, "no CUDA device on this machine"),
    # --- nas-repro ---
    (["nas-repro"], 2, "nas-repro"),
    (["nas-repro", "bogus"], 2, "invalid choice: 'bogus'"),
    (["nas-repro", "mode-collapse"], 2, "--out"),
    (["nas-repro", "explained-away", "--out", "x", "--steps", "0"], 2, "--steps"),
    (["nas-repro", "explained-away", "--out", "x", "--set", "model.heads=0"], 2, "model.heads=0"),
    (["nas-repro", "explained-away", "--out", "x", "--heads", "-2"], 2, "heads"),
]


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A finished run, a run directory without results, an empty folder, a path that does not exist."""
    root = tmp_path_factory.mktemp("places")
    run = root / "done"
    proc = run_command([BIN / R, "debug=fast", "logger=none", f"hydra.run.dir={run}"], cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    unfinished = root / "unfinished"
    shutil.copytree(run / ".hydra", unfinished / ".hydra")
    (root / "empty").mkdir()
    return {"run": run, "unfinished": unfinished, "empty": root / "empty", "missing": root / "missing"}


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_the_table_covers_every_command_with_enough_inputs():
    commands = {argv[0] for argv, _, _ in CASES}
    assert commands == {"nas-run", "nas-report", "nas-eval", "nas-bench", "nas-repro"}
    assert len(CASES) >= 80


@pytest.mark.parametrize("argv, code, piece", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(argv, code, piece, places, tmp_path):
    if argv[:2] == ["nas-bench", "gpu-check"] and not _no_gpu():
        pytest.skip("this machine has CUDA: the check would run")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = {k: _snapshot(v) for k, v in places.items() if v.is_dir()}
    args = [a.format(**places) for a in argv[1:]]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400", "NETRC": str(tmp_path / "no-netrc")}
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        env.pop(key, None)
    proc = run_command([BIN / argv[0], *args], cwd=cwd, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(lines) == 1, out[-3000:]
    assert piece.format(**places) in lines[0], lines[0]
    assert lines[0].startswith(f"{argv[0]}") and ": error: " in lines[0], lines[0]
    assert list(cwd.iterdir()) == []  # nothing made where it was typed
    assert {k: _snapshot(v) for k, v in places.items() if v.is_dir()} == before  # nor in what it named


def test_from_a_read_only_directory_nas_run_is_one_line(tmp_path):
    """A working directory where outputs/ cannot be made (/proc/1 is not writable, even by root)."""
    for argv in ([BIN / R, "debug=fast"], [BIN / R, "-m", "debug=fast", "seed=1,2"]):
        proc = run_command(argv, cwd="/proc/1", timeout=300)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert "cannot write the run directories under /proc/1/outputs" in lines[0]


def test_a_flag_after_resume_overrides_goes_to_hydra(places, tmp_path):
    """``nas-run resume=<dir> trainer.max_steps=N --cfg job`` prints the config (argparse refused it)."""
    before = _snapshot(places["run"])
    proc = run_command([BIN / R, f"resume={places['run']}", "trainer.max_steps=20000", "--cfg", "job"], cwd=tmp_path,
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_steps: 20000" in proc.stdout and _snapshot(places["run"]) == before


def test_help_shows_nas_runs_own_usage_groups_and_debug_fast(tmp_path):
    proc = run_command([BIN / R, "--help"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and list(tmp_path.iterdir()) == []
    for piece in ("nas-run: train Transformer models", "debug=fast", "resume=<run dir>", "attention: additive",
                  "experiment: ", "nas-run --hydra-help", "docs/"):
        assert piece in proc.stdout, piece
    assert "Powered by Hydra" not in proc.stdout  # Hydra's stock text is at --hydra-help


def test_nas_eval_prints_its_table_without_lightnings_banner(places, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(places["run"], run)
    proc = run_command([BIN / "nas-eval", run, "--beam", "2"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert out.lstrip().startswith("nas-eval") and "test/bleu" in out, out[:500]  # the table first
    for noise in ("GPU available", "TPU available", "Tip:", "LeafSpec", "`srun` command"):  # (srun: where SLURM is)
        assert noise not in out, noise


def test_the_progress_bar_states_the_budget_it_has():
    import pytorch_lightning as pl

    from nas_cli.pipeline.progress import progress_bar

    for kwargs, expected in (({"max_steps": 30, "max_epochs": -1}, "Epoch 0 (to step 30)"),
                             ({"max_epochs": 8}, "Epoch 0/7")):
        bar = progress_bar()
        trainer = pl.Trainer(callbacks=[bar], logger=False, enable_checkpointing=False, **kwargs)
        bar.setup(trainer, None, "fit")  # what Lightning calls when fitting starts
        text = bar._get_train_description(0)
        assert text.strip() == expected and "-2" not in text


def test_every_lightning_trainer_argument_is_accepted_as_written(tmp_path):
    """trainer.<name>= for an argument of Lightning's Trainer that no preset sets (Hydra would answer
    'not in struct'): composed as an addition, in a new run and in a resume."""
    from nas_cli.pipeline.launch.overrides import lightning_arguments

    assert {"limit_val_batches", "limit_test_batches", "overfit_batches", "max_time"} <= set(lightning_arguments())
    proc = run_command([BIN / R, "trainer.limit_val_batches=0", "trainer.overfit_batches=3", "--cfg", "job"],
                       cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "limit_val_batches: 0" in proc.stdout and "overfit_batches: 3" in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arg", ["attention.impl=triton", "+attention.impl=triton"])
def test_an_option_of_other_schemes_names_the_schemes_that_have_it(arg, tmp_path):
    """attention.impl with the default scheme (UNAS): one line naming the schemes that have the option."""
    from helpers import nas_run

    proc = nas_run(arg, "debug=fast", cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "unas has no option 'impl'; it is an option of dnas, hnas, sinkhorn" in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_a_refusal_on_a_new_machine_is_one_line(tmp_path):
    """task=wmt14 without data, on a machine whose matplotlib has no font cache yet (a fresh MPLCONFIGDIR):
    the refusal's one line and nothing before it (no "generated new fontManager")."""
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "NAS_RUN_CACHE": str(tmp_path / "cache")}
    proc = run_command([str(Path(sys.executable).parent / "nas-run"), "task=wmt14"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "task.path" in lines[0], proc.stdout + proc.stderr
