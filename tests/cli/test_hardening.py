"""Faults injected into real runs, and what each must leave: a run that continues, or one line.

Faults are real: SIGKILL / SIGUSR1 / SIGUSR2 sent by the nas-run process to itself at a precise
moment (tests/faults.py), two real processes in one directory, a real file-size limit."""
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from faults import run_with_fault
from helpers import NAS_RUN, nas_run, run_command, start_command

FAST = ("debug=fast", "progress_bar=false", "logger=csv", "diagnostics.plots=never")  # the figures: tests/diagnostics
NAS_REPORT = str(Path(NAS_RUN).with_name("nas-report"))


def ckpt_step(path: Path) -> int:
    return int(torch.load(path, weights_only=True, map_location="cpu")["global_step"])


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def one_line_error(proc, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("nas-run:")
             and not ln.startswith("nas-run: continuing ")]  # a resumed run's first line: what it continues
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


# ---- checkpoints and what was tested ------------------------------------------------------------
def test_sigkill_right_after_a_non_improving_validation_costs_at_most_n_steps(tmp_path):
    # a learning rate of 1e-9: validation never improves after the first one (exact match stays 0)
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:25", *FAST, "optim.lr=1e-9", "trainer.max_steps=100",
                          "trainer.val_check_interval=10", "checkpoint.last_every_n_steps=10",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert ckpt_step(run / "checkpoints" / "best.ckpt") == 10  # validations at 20 did not improve it
    assert ckpt_step(run / "checkpoints" / "last.ckpt") >= 25 - 10  # the README's promise: at most N steps lost


def test_the_last_steps_are_validated_and_the_tested_step_is_said(tmp_path):
    run = tmp_path / "run"
    proc = nas_run(*FAST, "trainer.max_steps=25", "trainer.val_check_interval=10", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "diagnostics" / "step_25.json").is_file()  # a validation at the final step, not only 10 and 20
    s = summary(run)
    tested = s["tested"]
    assert tested["checkpoint"] == "checkpoints/best.ckpt" and s["best_checkpoint"] == "checkpoints/best.ckpt"
    assert tested["step"] == ckpt_step(run / "checkpoints" / "best.ckpt") and tested["step"] in (10, 20, 25)
    assert f"tested checkpoint: step {tested['step']} of 25" in proc.stdout

    none = tmp_path / "noval"
    proc = nas_run(*FAST, "trainer.max_steps=5", "trainer.limit_val_batches=0", f"hydra.run.dir={none}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(none)["tested"]["line"] == "no validation ran: tested the final weights (step 5)"
    assert "no validation ran: tested the final weights" in proc.stdout


# ---- run directories -----------------------------------------------------------------------------
def test_a_second_process_in_the_same_run_directory_is_refused_and_overwrites_nothing(tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    first = start_command([NAS_RUN, *FAST, "trainer.max_steps=100000", "checkpoint.last_every_n_steps=5",
                           f"hydra.run.dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
    try:
        end = time.time() + 120
        while not (run / "checkpoints" / "last.ckpt").exists():
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.time() < end
            time.sleep(0.05)
        config = (run / ".hydra" / "config.yaml").read_text()
        second = nas_run(*FAST, "seed=9", f"hydra.run.dir={run}", cwd=tmp_path)
        line = one_line_error(second)
        assert f"{run} is in use by another nas-run run (PID {first.pid}" in line
        assert (run / ".hydra" / "config.yaml").read_text() == config  # the refused run wrote nothing
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the owner is gone (SIGKILL left its lock behind): the directory can be resumed. Killed between writing a
    # temporary file and renaming it, it leaves that file too (how often depends on when the kill lands: made
    # certain here); the run that takes the directory over removes it
    (run / "diagnostics").mkdir(exist_ok=True)
    (run / "diagnostics" / f".latest.json.{first.pid}.tmp").write_text('{"half": ')
    target = ckpt_step(run / "checkpoints" / "last.ckpt") + 10
    res = nas_run(f"resume={run}", f"trainer.max_steps={target}", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(run)["steps"] == target and not (run / ".nas-run.lock").exists()
    assert not list(run.rglob("*.tmp"))


def test_killed_during_the_final_test_relaunches_to_testing_in_a_moved_directory(tmp_path):
    original = tmp_path / "original"
    args = (*FAST, "trainer.max_steps=30", "trainer.val_check_interval=10")
    proc = run_with_fault("kill@test", *args, f"hydra.run.dir={original}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    diag = json.loads((original / "diagnostics" / "summary.json").read_text())
    assert diag["locations"] and not (original / "summary.json").exists()
    # the directory is moved (copied, the original deleted): it tests its own best.ckpt
    moved = tmp_path / "moved"
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    again = nas_run(*args, f"hydra.run.dir={moved}", cwd=tmp_path)  # the same command (a SLURM requeue)
    assert again.returncode == 0, again.stderr[-3000:]
    s = summary(moved)
    assert s["steps"] == 30 and s["resumed_from"] == "checkpoints/last.ckpt" and s["test"]
    assert s["tested"]["checkpoint"] == "checkpoints/best.ckpt"
    # the training time and throughput are the first launch's (kept in the checkpoint), not the ~0 s
    # of a launch that only tested
    first, second = s["fit_seconds_by_launch"]
    assert first > 10 * second and second < 5 and s["fit_seconds"] == pytest.approx(first + second)
    assert s["tokens_per_s"] and s["tokens_per_s"] > 0
    # the diagnostics written by the first process survive the resume that only tests
    assert json.loads((moved / "diagnostics" / "summary.json").read_text())["locations"] == diag["locations"]


@pytest.mark.parametrize("fault,phase", [("SIGUSR1@test", "testing"), ("SIGUSR2@startup", "startup")])
def test_sigusr_outside_training_stops_with_one_line(tmp_path, fault, phase):
    run = tmp_path / "run"
    proc = run_with_fault(fault, *FAST, "trainer.max_steps=10", f"hydra.run.dir={run}", cwd=tmp_path)
    name = fault.split("@")[0]
    line = one_line_error(proc, code=128 + getattr(signal, name))
    assert f"{name} during {phase}" in line and f"nas-run resume={run}" in line
    assert not (run / "summary.json").exists()


def test_a_kill_before_the_first_checkpoint_continues_the_same_wandb_run(tmp_path):
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:0", "debug=fast", "progress_bar=false", "diagnostics.plots=never",
                          "trainer.max_steps=10", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL and not (run / "checkpoints" / "last.ckpt").exists()
    first = {p.name.rsplit("-", 1)[1] for p in run.rglob("run-*.wandb")}
    assert len(first) == 1
    again = nas_run("debug=fast", "progress_bar=false", "diagnostics.plots=never", "trainer.max_steps=10",
                    f"hydra.run.dir={run}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    ids = {p.name.rsplit("-", 1)[1] for p in run.rglob("run-*.wandb")}
    assert ids == first and f"{summary(run)['wandb_run_id']}.wandb" in ids  # no orphan W&B run


# ---- resume -------------------------------------------------------------------------------------
def test_resume_refuses_fewer_steps_than_done_and_records_its_overrides(tmp_path):
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:25", *FAST, "trainer.max_steps=40", "checkpoint.last_every_n_steps=10",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    def files():  # the lock left by the killed process is taken over and released: not a record
        return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "wandb" not in p.parts
                and p.name != ".nas-run.lock"}

    before = files()
    line = one_line_error(nas_run(f"resume={run}", "trainer.max_steps=12", cwd=tmp_path))
    assert "trainer.max_steps=12 is below the 20 steps this run has already trained" in line
    assert not (run / "summary.json").exists()
    # a refusal writes nothing (no failed.json, no resumes.yaml entry)
    assert files() == before
    ok = nas_run(f"resume={run}", "trainer.max_steps=40", "+logger.api_key=sk-SECRET-1", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    recorded = yaml.safe_load((run / ".hydra" / "resumes.yaml").read_text())
    assert [r["overrides"] for r in recorded][-1] == ["trainer.max_steps=40", "+logger.api_key=***"]



@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run SIGKILLed at step 8 of 40, with a checkpoint at step 5: one to resume (the tests that use it
    are refused and change nothing in it)."""
    run = tmp_path_factory.mktemp("killed") / "run"
    proc = run_with_fault("kill@step:8", *FAST, "trainer.max_steps=40", "checkpoint.last_every_n_steps=5",
                          f"hydra.run.dir={run}", cwd=run.parent)
    assert proc.returncode == -signal.SIGKILL
    return run


@pytest.mark.parametrize("override,needle", [
    ("debug=fast", "debug=fast chooses a config, which a resumed run keeps from its saved .hydra/config.yaml"),
    ("attention=dnas", "attention=dnas chooses a config"),  # was a ValueError from Hydra, exit 1
    ("attention.decoder=dnas", "attention.decoder=dnas chooses a config"),
    ("+debug=fast", "+debug=fast chooses a config"),  # was silently ignored: the run trained on
    ("trainer.max_stepz=30", "trainer.max_stepz: Lightning's Trainer has no argument 'max_stepz'; did you mean trainer.max_steps?"),  # six lines
    ("+model.dropoutt=0.3", "+model.dropoutt: nas-run does not read this key, so it would be ignored"),
    ("seed=1,2", "seed=1,2 is a sweep; resume= continues one run"),
])
def test_resume_overrides_that_cannot_apply_are_one_line_and_change_nothing(killed_run, override, needle):
    # resume= applies its overrides to the run's saved config, which has no config groups to choose; Hydra
    # answered these with its own multi-line message (exit 1), or trained with the option ignored
    def files():
        return {p: p.read_bytes() for p in killed_run.rglob("*") if p.is_file() and p.name != ".nas-run.lock"}

    before = files()
    line = one_line_error(nas_run(f"resume={killed_run}", "trainer.max_steps=30", override, cwd=killed_run.parent))
    assert needle in line, line
    assert files() == before

def test_a_finished_run_trains_longer_in_the_same_wandb_run(tmp_path):
    run = tmp_path / "run"
    first = nas_run("debug=fast", "progress_bar=false", "diagnostics.plots=never", "trainer.max_steps=20",
                    f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    before = summary(run)
    same = nas_run(f"resume={run}", cwd=tmp_path)
    assert "that run is complete (20 steps, summary.json); to train it longer pass trainer.max_steps=<more than 20>" \
        in one_line_error(same)
    longer = nas_run(f"resume={run}", "trainer.max_steps=30", cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr[-3000:]
    after = summary(run)
    assert after["steps"] == 30 and after["continued_from_summary"] == "summary.step20.json"
    assert json.loads((run / "summary.step20.json").read_text()) == before
    assert after["wandb_run_id"] == before["wandb_run_id"]  # the W&B history continues
    # nas-eval rebuilds the model from the config: one that does not match the checkpoint is refused
    # (4 -> 2 heads keeps every parameter's shape: it would otherwise evaluate a different model silently)
    ev = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run), "--set", "model.heads=2"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ev.returncode == 2 and "was trained with another configuration" in ev.stderr and "Traceback" not in ev.stderr
    # a typo in --set is named as a typo, not blamed on another configuration
    typo = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run), "--set", "model.head=4"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert typo.returncode == 2 and "--set model.head: this run's config has no such key; did you mean model.heads?" \
        in typo.stderr and len(typo.stderr.strip().splitlines()) == 1


def test_an_unsafe_newest_checkpoint_falls_back_to_an_older_one_with_one_whole_line(tmp_path):
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:25", *FAST, "trainer.max_steps=30", "checkpoint.every_n_steps=10",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    last = run / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {}, "loops": {}, "evil": Evil()}, last)
    os.utime(last)  # the newest
    res = nas_run(f"resume={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    warnings = [ln for ln in res.stderr.splitlines() if "is unreadable" in ln]
    assert len(warnings) == 1, res.stderr[-3000:]
    assert warnings[0].endswith("(refused by the safe loader: it holds objects other than tensors and plain "
                                "containers); trying an older one")
    assert summary(run)["resumed_from"] == "checkpoints/step20.ckpt" and not marker.exists()


# ---- failures -----------------------------------------------------------------------------------
def test_a_run_that_fails_before_training_is_marked_failed(tmp_path):
    # a byte that is not UTF-8 past the first 64 KiB of a split: found only when the data are read, after the run
    # directory exists (a missing file, a mismatched pair of sides or a bad start of a file is refused before it
    # is made: test_the_last_bad_inputs_..., tests/tasks)
    data = tmp_path / "late_bad_byte"
    data.mkdir()
    lines = 8000  # 72 KB of good text before the bad byte
    for split, n in (("train", lines), ("valid", 1), ("test", 1)):
        (data / f"{split}.de").write_bytes(b"ein satz\n" * n + (b"kaputt \xff\n" if split == "train" else b""))
        (data / f"{split}.en").write_text("a sentence\n" * (n + (split == "train")))
    run = tmp_path / "run"
    line = one_line_error(nas_run(*FAST, "task=iwslt14", f"task.path={data}", f"hydra.run.dir={run}", cwd=tmp_path))
    failed = json.loads((run / "failed.json").read_text())
    assert failed["reason"] in line and "is not valid UTF-8" in failed["reason"]
    report = run_command([NAS_REPORT, str(tmp_path), "--out", str(tmp_path / "tables")], capture_output=True,
                         text=True, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "1 failed, 0 unfinished" in report.stdout and "failed:" in report.stdout
    import pandas as pd  # every CSV nas-report writes reads as a table

    (row,) = pd.read_csv(tmp_path / "tables" / "unfinished.csv").to_dict("records")
    assert row["status"].startswith("failed: ") and "is not valid UTF-8" in row["status"]


def test_a_failed_jobs_reason_names_the_error_that_started_it():
    # a job whose DataLoader workers could not start failed with Lightning's teardown error
    # ("Please call `iter(combined_loader)` first."), raised while handling the real one
    from nas_cli.pipeline.job import error_line as _error_line, first_error as _first_error

    try:
        try:
            raise AttributeError("'Process' object has no attribute 'env'")
        except AttributeError:
            raise RuntimeError("Please call `iter(combined_loader)` first.")  # noqa: B904 - the chain under test
    except RuntimeError as err:
        chained = err
    first = _first_error(chained)
    assert isinstance(first, AttributeError) and _error_line(first) == \
        "AttributeError: 'Process' object has no attribute 'env'"
    try:  # raised `from` another on purpose: that one is the message meant for the reader
        raise ValueError("task.path: no such folder") from KeyError("x")
    except ValueError as err:
        assert _first_error(err) is err


def test_a_failing_sweep_job_does_not_stop_the_others(tmp_path):
    sweep = tmp_path / "sweep"
    proc = nas_run("-m", *FAST, "trainer.max_steps=5", "model.heads=3,4", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "1 of 2 jobs failed" in proc.stderr and "Traceback" not in proc.stderr
    assert "failed" in proc.stdout and "nas-run sweep" in proc.stdout
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert (jobs[1] / "summary.json").is_file()  # the job after the failing one ran
    assert "model.heads=3" in json.loads((jobs[0] / "failed.json").read_text())["reason"]
    report = run_command([NAS_REPORT, str(sweep)], capture_output=True, text=True, cwd=tmp_path)
    assert "1 failed, 0 unfinished" in report.stdout


@pytest.mark.parametrize("override,needle", [
    ("model.heads=four", "model.heads='four' is not valid: it must be a positive integer"),
    ("seed=abc", "seed='abc' is not valid: it must be an integer"),
    ("optim.lr=-0.001", "optim.lr=-0.001 is not valid: it must be a number > 0"),
    ("task.batch_size=0", "task.batch_size=0 is not valid"),
    ("threads=0", "threads=0 is not valid: it must be a positive integer (CPU threads) or null"),
    ("task=iwslt14 task.max_tokens=0", "task.max_tokens=0 is not valid"),
    ("model.d_model=200000 model.ffn=800000", "the model is too large for this machine"),
])
def test_malformed_values_one_line_before_anything_is_created(tmp_path, override, needle):
    run = tmp_path / "run"
    line = one_line_error(nas_run(*FAST, *override.split(), f"hydra.run.dir={run}", cwd=tmp_path))
    assert needle in line
    assert not run.exists()


def _bad_data(tmp_path: Path, kind: str) -> str:
    """A task.path that cannot be read: a file, a folder with a binary training file, an empty one."""
    if kind == "file":
        (tmp_path / "train.txt").write_text("a line\n")
        return str(tmp_path / "train.txt")
    data = tmp_path / kind
    data.mkdir()
    for split in ("valid", "test"):
        (data / f"{split}.txt").write_text("a line\n")
    (data / "train.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe" * 20 if kind == "binary" else b"")
    return str(data)


@pytest.mark.parametrize("args,needle", [
    (["seed=-1"], "seed=-1 is not valid: it must be an integer from 0 to 4294967295"),
    (["seed=4294967296"], "seed=4294967296 is not valid"),
    (["hydra.run.dir=''"], "hydra.run.dir='': an empty directory"),
    (["logger.group=Überlauf"], "logger.group=Überlauf: the value has characters outside ASCII; quote it"),
    (["task=wikitext2", "task.path=<file>"], "is not a directory"),
    (["task=wikitext2", "task.path=<binary>"], "train.txt is binary (NUL bytes)"),
    (["task=wikitext2", "task.path=<empty>"], "train.txt is empty"),
    (["-m", "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0 is not valid"),
], ids=["seed-1", "seed-2^32", "empty-run-dir", "non-ascii", "path-file", "path-binary", "path-empty", "n_jobs-0"])
def test_the_last_bad_inputs_are_one_line_and_leave_nothing(tmp_path, args, needle):
    """Inputs that a careless check would end in a traceback, a run directory with failed.json, or exit 0."""
    for kind in ("file", "binary", "empty"):
        args = [a.replace(f"<{kind}>", _bad_data(tmp_path, kind)) if f"<{kind}>" in a else a for a in args]
    before = {p for p in tmp_path.rglob("*")}
    run = ["hydra.sweep.dir=sweep"] if "-m" in args else ["hydra.run.dir=run"] if not any(
        a.startswith("hydra.run.dir") for a in args) else []
    line = one_line_error(nas_run(*FAST, *args, *run, cwd=tmp_path))
    assert needle in line
    assert {p for p in tmp_path.rglob("*")} == before  # no run or sweep directory, no outputs/, nothing


def test_the_slurm_launcher_without_slurm_is_one_line_and_leaves_nothing(tmp_path):
    """The README's cluster line on a machine without SLURM ended in submitit's RuntimeError traceback."""
    import sys

    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # this environment's commands, no srun/sbatch
    env.pop("WANDB_MODE", None)
    proc = run_command([NAS_RUN, "trainer=ddp", "trainer.devices=8", "hydra/launcher=slurm", "-m", "seed=1,2,3"],
                       cwd=tmp_path, env=env, timeout=300)
    assert "hydra/launcher=slurm: this machine has no SLURM" in one_line_error(proc)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("sinfo") is None or shutil.which("sbatch") is None,
                    reason="needs SLURM's client tools (sinfo, sbatch): the machine without them is tested above")
@pytest.mark.parametrize("conf", ["missing", "empty"])
def test_the_slurm_launcher_with_no_controller_is_one_line_and_leaves_nothing(tmp_path, conf):
    """SLURM's tools installed, no cluster they can reach (found on this machine: sbatch's errors, then
    submitit's CalledProcessError traceback). Real sinfo, with SLURM_CONF naming a file that is missing
    or holds no cluster."""
    slurm_conf = tmp_path.parent / f"{tmp_path.name}-slurm.conf"
    if conf == "empty":
        slurm_conf.write_text("")
    env = {**os.environ, "SLURM_CONF": str(slurm_conf)}
    env.pop("WANDB_MODE", None)
    proc = run_command([NAS_RUN, "hydra/launcher=slurm", "-m", "seed=1,2"], cwd=tmp_path, env=env, timeout=300)
    line = one_line_error(proc)
    assert "hydra/launcher=slurm: SLURM's tools are installed but no controller answers" in line
    assert ("no such file" in line) if conf == "missing" else ("Unable to process configuration file" in line)
    assert list(tmp_path.iterdir()) == []


def test_nas_eval_never_advises_loading_a_file_unsafely(tmp_path):
    run = tmp_path / "run"
    proc = nas_run(*FAST, "trainer.max_steps=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    torch.save({"state_dict": {"w": torch.zeros(1)}, "extra": Path("x")}, tmp_path / "objects.ckpt")
    nas_eval = str(Path(NAS_RUN).with_name("nas-eval"))
    for name, says in (("text.ckpt", "not a PyTorch checkpoint"), ("objects.ckpt", "will not run code from the file")):
        res = run_command([nas_eval, str(run), "--ckpt", str(tmp_path / name)], cwd=tmp_path)
        assert res.returncode == 2 and says in res.stderr and "weights_only" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and not (run / "eval").exists()


def test_a_full_disk_while_saving_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:25", *FAST, "trainer.max_steps=40", "checkpoint.last_every_n_steps=10",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    last = run / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    limit = len(before) // 2  # no file of half a checkpoint's size can be written: as if the disk were full

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    res = subprocess.run([NAS_RUN, f"resume={run}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         preexec_fn=small_files, timeout=300)
    line = one_line_error(res)
    assert f"cannot write checkpoint {last}" in line and "MiB free on that disk" in line
    assert last.read_bytes() == before and not list(run.rglob("*.tmp"))


# ---- secrets ------------------------------------------------------------------------------------
def test_secrets_in_nested_quoted_and_list_overrides_never_reach_files(tmp_path):
    secrets = ["sk-NESTED-1", "sk QUOTED 2", "sk-LIST-3"]
    run = tmp_path / "run"
    proc = nas_run("debug=fast", "progress_bar=false", "diagnostics.plots=never", "trainer.max_steps=2",
                   "run_test=false", "+logger.auth={token:sk-NESTED-1,user:me}", '+logger.api_key="sk QUOTED 2"',
                   "+logger.access_token=[sk-LIST-3,x]", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "overrides.yaml" for p in files)
    for p in files:
        data = p.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, (p, secret)
    assert "user:me" in (run / ".hydra" / "overrides.yaml").read_text()  # only the secret part is masked


# ---- resumable sweeps -------------------------------------------------------------
def test_a_killed_sweep_launched_again_skips_finished_jobs_and_resumes_the_rest(tmp_path):
    sweep = tmp_path / "sweep"
    args = ("-m", *FAST, "trainer.max_steps=20,40", "checkpoint.last_every_n_steps=10", f"hydra.sweep.dir={sweep}")
    killed = run_with_fault("kill@step:25", *args, cwd=tmp_path)  # job 0 (20 steps) finishes, job 1 dies at 25
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first, second = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert (first / "summary.json").is_file() and not (second / "summary.json").exists()
    finished = (first / "summary.json").read_bytes()
    # what an older nas-run composed for the finished job (its presets have changed since): a mark
    with (first / ".hydra" / "config.yaml").open("a") as f:
        f.write("# composed by an earlier nas-run\n")
    configs = {f.name: f.read_bytes() for f in (first / ".hydra").iterdir()}
    record = (sweep / "multirun.yaml").read_bytes()

    other = nas_run("-m", *FAST, "trainer.max_steps=20,30", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert "holds a sweep of other overrides" in one_line_error(other)

    # the same overrides typed in another order are the same sweep, also without a key that
    # changes only what is shown (progress_bar=false: the README's study command against the committed sweep)
    reordered = ("checkpoint.last_every_n_steps=10", "trainer.max_steps=20,40",
                 *[a for a in FAST if a != "progress_bar=false"], f"hydra.sweep.dir={sweep}", "-m")
    elsewhere = tmp_path / "elsewhere"  # launched from another directory too
    elsewhere.mkdir()
    again = nas_run(*reordered, cwd=elsewhere, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    # the sweep's record is the first launch's (a study kept in git: its files unchanged)
    assert (sweep / "multirun.yaml").read_bytes() == record and not (sweep / ".multirun.first.yaml").exists()
    assert "continuing the sweep" in again.stderr and f"{first.name}: finished in an earlier launch" in again.stderr
    assert (first / "summary.json").read_bytes() == finished  # not trained again
    # ... and its saved configs still say what ran: Hydra wrote the configs of this launch there,
    # nas-run put the finished job's own back
    assert {f.name: f.read_bytes() for f in (first / ".hydra").iterdir()} == configs
    assert not (first / ".nas-run-kept-configs").exists()
    s = summary(second)
    assert s["steps"] == 40 and s["resumed_from"] == "checkpoints/last.ckpt"
    assert len(s["fit_seconds_by_launch"]) == 2 and all(t > 0 for t in s["fit_seconds_by_launch"])


def test_max_steps_lifts_the_epoch_limit_and_resuming_trains_exactly_the_steps_asked(tmp_path):
    """640 examples at batch 64 are 10 steps an epoch, so the default 8 epochs end at
    80 steps; trainer.max_steps=100 must train 100, and resuming with max_steps=130 exactly 30 more."""
    run = tmp_path / "run"
    common = ("progress_bar=false", "logger=csv", "model=tiny", "task.train_size=640", "task.val_size=64",
              "task.test_size=64", "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=4",
              "diagnostics.enabled=false")
    first = nas_run(*common, "trainer.max_steps=100", f"hydra.run.dir={run}", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary(run)["steps"] == 100
    longer = nas_run(f"resume={run}", "trainer.max_steps=130", cwd=tmp_path, timeout=600)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert summary(run)["steps"] == 130 and ckpt_step(run / "checkpoints" / "last.ckpt") == 130


def test_an_unwritable_run_directory_is_one_line(tmp_path):
    """A hydra.run.dir that cannot be made is one line and exit 2, not Hydra's traceback."""
    line = one_line_error(nas_run("debug=fast", "hydra.run.dir=/proc/x/run", cwd=tmp_path))
    assert "hydra.run.dir=/proc/x/run: cannot create or write the directory" in line
    blocked = tmp_path / "file"
    blocked.write_text("")
    line = one_line_error(nas_run("-m", "debug=fast", f"hydra.sweep.dir={blocked}/sweep", "seed=1", cwd=tmp_path))
    assert f"hydra.sweep.dir={blocked}/sweep" in line


def test_checkpoint_rotation_deletes_only_its_own_files(tmp_path):
    """Keep_last removed every step*.ckpt in the directory, a user's own too."""
    run = tmp_path / "run"
    first = nas_run(*FAST, "trainer.max_steps=20", "checkpoint.every_n_steps=5", "checkpoint.keep_last=2",
                    f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    mine = run / "checkpoints" / "step_best.ckpt"
    shutil.copy(run / "checkpoints" / "step20.ckpt", mine)
    longer = nas_run(f"resume={run}", "trainer.max_steps=30", cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert mine.is_file()
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt")) == ["step25.ckpt", "step30.ckpt",
                                                                                 "step_best.ckpt"]


@pytest.mark.parametrize("damage", ["truncated", "unsafe"])
def test_resuming_to_the_test_with_an_unreadable_best_checkpoint_tests_the_final_weights(tmp_path, damage):
    """Killed when the final test starts, then best.ckpt damaged: the resume tests the
    final weights with one warning line (no traceback), and summary.json says which weights."""
    run = tmp_path / "run"
    proc = run_with_fault("kill@test", *FAST, "trainer.max_steps=20", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    best = run / "checkpoints" / "best.ckpt"
    if damage == "truncated":
        best.write_bytes(best.read_bytes()[:1000])
    else:
        class Evil:
            def __reduce__(self):
                return (print, ("unsafe",))

        torch.save({"state_dict": {}, "x": Evil()}, best)
    done = nas_run(f"resume={run}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    warned = [ln for ln in done.stderr.splitlines() if "best.ckpt is unreadable" in ln]
    assert len(warned) == 1 and "testing the final weights (step 20)" in warned[0]
    tested = summary(run)["tested"]
    assert tested["checkpoint"] is None and tested["step"] == 20 and "best checkpoint unreadable" in tested["line"]


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs with about 4 MB free (root only; skipped elsewhere)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (mnt / "fill").write_bytes(b"\0" * (16 * 2 ** 20))
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_is_one_line_and_exit_2(small_disk, tmp_path):
    """On a full disk the message was built, then writing failed.json raised again
    (74 lines of traceback, 374 with W&B, exit 1). Now one line, exit 2, the checkpoint intact."""
    run = small_disk / "run"
    proc = nas_run("debug=fast", "trainer.max_steps=40", f"hydra.run.dir={run}", cwd=tmp_path)
    line = one_line_error(proc)
    assert "No space left on device" in line and f"nas-run resume={run}" in line
    # one line, and before it the run's size, which a run that got under way says on purpose
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0] == "model: 234,944 parameters"
    assert torch.load(run / "checkpoints" / "best.ckpt", weights_only=True, map_location="cpu")["state_dict"]


def test_a_half_written_first_checkpoint_is_cleaned_up_on_resume(tmp_path):
    """Killed during the first last.ckpt write, the temp file stayed forever (the
    clean-up ran only when some checkpoint could be resumed)."""
    run = tmp_path / "run"
    proc = run_with_fault("kill@step:3", *FAST, "trainer.max_steps=20", "checkpoint.last_every_n_steps=0",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL
    assert not list((run / "checkpoints").glob("*.ckpt")) if (run / "checkpoints").exists() else True
    (run / "checkpoints").mkdir(exist_ok=True)
    half = run / "checkpoints" / ".last.ckpt.4242.tmp"
    half.write_bytes(b"\x80\x02 half a checkpoint")
    again = nas_run(*FAST, "trainer.max_steps=20", "checkpoint.last_every_n_steps=0", f"hydra.run.dir={run}",
                    cwd=tmp_path)  # the same command again, as the refusal of resume= says
    assert again.returncode == 0, again.stderr[-3000:]
    assert not half.exists() and summary(run)["steps"] == 20


def _take(run_dir, results, start):
    import nas_cli.infra.rundir as rundir
    from nas_cli.errors import UserError
    from nas_cli.infra.rundir import acquire

    read = rundir._read

    def slow_read(path):  # widen the window between reading the holder and acting on it (fault injection)
        got = read(path)
        time.sleep(0.2)
        return got

    rundir._read = slow_read
    start.wait()
    try:
        acquire(run_dir)
        results.put("owner")
    except UserError:
        results.put("refused")
    time.sleep(1.0)  # keep holding it while the others try


def test_two_takers_of_one_stale_lock_never_both_own_the_run(tmp_path):
    """Processes that find the same stale lock (a requeued SLURM job and a re-run command) must not
    both remove it and each create their own: the takeover is one at a time, and of eight racing
    processes exactly one owns the directory."""
    import multiprocessing as mp

    from nas_cli.infra.rundir import LOCK_NAME, _me

    dead = subprocess.Popen(["true"])
    dead.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for trial in range(1):
        (run_dir / LOCK_NAME).write_text(json.dumps({**_me(), "pid": dead.pid}))
        ctx = mp.get_context("fork")
        results, start = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_take, args=(run_dir, results, start)) for _ in range(8)]
        for p in procs:
            p.start()
        start.set()
        got = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert got.count("owner") == 1 and got.count("refused") == 7, (trial, got)


class _Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_legacy_format_unsafe_checkpoint_is_refused_not_called_truncated(tmp_path):
    """Torch's legacy (non-zip) format cannot be memory-mapped; the safe loader's refusal
    was reported as 'truncated'. Now it is refused as unsafe, nothing runs, and a safe legacy file loads."""
    from nas_cli.infra.resume import unreadable_reason, load_safe

    marker = tmp_path / "pwned"
    bad = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {}, "x": _Marker(marker)}, bad, _use_new_zipfile_serialization=False)
    with pytest.raises(Exception) as err:
        load_safe(bad)
    assert unreadable_reason(err.value).startswith("refused by the safe loader") and not marker.exists()
    good = tmp_path / "legacy_ok.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, good, _use_new_zipfile_serialization=False)
    assert torch.equal(load_safe(good)["state_dict"]["w"], torch.ones(2))


def test_a_busy_sweep_directory_is_refused_before_continuing_is_said(tmp_path):
    """Launching a sweep into a directory whose sweep is still running printed
    'continuing the sweep' and then the lock error."""
    from nas_cli.infra.rundir import LOCK_NAME, _me

    sweep = tmp_path / "sweep"
    args = ("-m", *FAST, "seed=1", f"hydra.sweep.dir={sweep}")
    first = nas_run(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    alive = subprocess.Popen(["sleep", "60"])
    try:
        (sweep / LOCK_NAME).write_text(json.dumps({**_me(), "pid": alive.pid}))
        busy = nas_run(*args, cwd=tmp_path)
        assert "is in use by another nas-run sweep" in one_line_error(busy)
        assert "continuing the sweep" not in busy.stderr
    finally:
        alive.kill()


def test_only_the_temporary_files_of_writers_that_are_gone_are_removed(tmp_path):
    # a writer killed between its temporary file and the rename leaves `.<name>.<pid>.tmp`; the next owner of
    # the directory removes those of dead processes and leaves a live writer's, its own and every other file
    from nas_cli.infra.atomic import atomic_write_text, remove_stale_temporaries, temporary_name

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process now
    live = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "diagnostics").mkdir()
        dead = tmp_path / "diagnostics" / f".latest.json.{gone.pid}.tmp"
        dead_top = tmp_path / f".summary.json.{gone.pid}.tmp"
        running = tmp_path / "diagnostics" / f".step_4.json.{live.pid}.tmp"
        own = temporary_name(tmp_path / "x.json")
        keep = [running, own, tmp_path / "notes.tmp", tmp_path / ".no-pid.tmp", tmp_path / "latest.json"]
        for f in [dead, dead_top, *keep]:
            f.write_text("{")
        assert sorted(remove_stale_temporaries(tmp_path)) == sorted([dead, dead_top])
        assert all(f.exists() for f in keep) and not dead.exists() and not dead_top.exists()
        atomic_write_text(tmp_path / "x.json", "{}")  # this process's own write still works and leaves nothing
        assert (tmp_path / "x.json").read_text() == "{}" and not own.exists()
    finally:
        live.kill()
        live.wait()
