"""A stop during an evaluation: a validation inside training ends at its next batch with last.ckpt and
the resume line, and the resumed run repeats that validation; nas-eval stops at once and writes
nothing; and a run whose output goes to a file shows its progress there as plain lines.

The runs are real ``nas-run`` and ``nas-eval`` processes, in a process group of their own, their
output to files (as under SLURM or nohup), signalled as a terminal, ``timeout`` or SLURM would."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from datafiles import write_lm
from helpers import NAS_RUN, nas_run

EVAL = str(Path(NAS_RUN).with_name("nas-eval"))
#: validation lines of the long-validation corpus: with model=small on one thread the valid split takes
#: over 30 s (windows of 256 inputs scoring 64 tokens)
LONG_VALID_LINES = 6000


def _lm(tmp_path: Path, valid_lines: int) -> Path:
    return write_lm(tmp_path / "lm", n=(300, valid_lines, 40))


def _start(args: list[str], cwd: Path, out: Path, err: Path) -> subprocess.Popen:
    """The installed command in a process group of its own, stdout and stderr to files."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return subprocess.Popen([str(a) for a in args], cwd=cwd, env=env, stdout=out.open("w"), stderr=err.open("w"),
                            start_new_session=True)


def _wait_for_lines(path: Path, needle: str, count: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.time() + timeout
    while path.read_text().count(needle) < count:
        assert proc.poll() is None, f"exited {proc.returncode} before {count} x {needle!r}: {path.read_text()[-2000:]}"
        assert time.time() < end, f"never {count} x {needle!r}: {path.read_text()[-2000:]}"
        time.sleep(0.1)


def _stopped_within(proc: subprocess.Popen, sig: int, seconds: float, to_group: bool = True) -> float:
    t0 = time.monotonic()
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    proc.wait(timeout=120)
    took = time.monotonic() - t0
    assert took < seconds, f"took {took:.1f} s to stop"
    return took


def _seconds(text: str) -> int:
    """``45 s`` / ``3 min 05 s`` / ``1 h 02 min`` (nas_cli.pipeline.progress.duration) in seconds."""
    words = text.split()
    unit = {"s": 1, "min": 60, "h": 3600}
    return sum(int(n) * unit[u] for n, u in zip(words[::2], words[1::2]))


LM = ("task=wikitext2", "threads=1", "logger=csv", "diagnostics.plots=never", "trainer.log_every_n_steps=1")


def test_sigterm_during_a_long_validation_stops_within_a_batch_and_the_resume_repeats_it(tmp_path):
    """The issue's case: a validation at the end of 3 steps (the run's last), over 30 s long, sent
    SIGTERM to the process group a third of the way in; the output goes to files."""
    data = _lm(tmp_path, LONG_VALID_LINES)
    run = tmp_path / "run"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    args = [NAS_RUN, *LM, f"task.path={data}", "model=small", "trainer.max_steps=3", "task.batch_size=4",
            "trainer.limit_test_batches=2", f"hydra.run.dir={run}"]
    proc = _start(args, tmp_path, out, err)
    needle = "validation at step 3: batch"
    _wait_for_lines(out, needle, 3, proc)
    t0 = time.monotonic()
    _stopped_within(proc, signal.SIGTERM, 10)
    log, errors = out.read_text(), err.read_text()
    lines = [line for line in log.splitlines() if needle in line]
    assert len(lines) >= 3 and "about" in lines[0] and "left" in lines[0]  # the ETA of each line
    timing = lines[-1].split("(")[1].rstrip(")")  # "<elapsed> elapsed, about <left> left"
    elapsed, left = timing.split(" elapsed, about ")
    assert _seconds(elapsed) + _seconds(left.removesuffix(" left")) >= 30, lines  # a validation of 30 s or more
    assert "\r" not in log and "\x1b" not in log  # plain lines in a file: no live bar
    assert proc.returncode == 128 + signal.SIGTERM, errors[-3000:]
    assert ("stopped: SIGTERM during validation at step 3 (checkpoints/last.ckpt saved; the resumed run repeats "
            "this validation; no summary.json); continue with: nas-run resume=") in errors, errors[-3000:]
    assert "Traceback" not in errors and not (run / "summary.json").exists()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert [v for k, v in ckpt["callbacks"].items() if k.startswith("FaultTolerance")][0]["validation_owed"] == 3
    assert not (run / "checkpoints" / "best.ckpt").exists()  # the stopped validation chose nothing
    assert time.monotonic() - t0 < 60

    # the printed command, with the repeated validation cut short here (the suite's time): the run finishes
    # with that validation's value at step 3 as its best, as if it had never stopped
    res = nas_run(f"resume={run}", "trainer.limit_val_batches=4", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["best_val"]["step"] == 3 and summary["best_val"]["value"] > 0
    assert "validation at step 3: val/loss = " in res.stdout  # the resumed run's own lines (not a terminal)
    import pandas as pd

    metrics = pd.read_csv(run / "csv" / "metrics.csv").dropna(subset=["val/loss"])
    assert metrics["step"].tolist() == [2]  # Lightning logs a validation at step - 1: one validation, once

    # nas-eval of the finished run: a stop during its evaluation ends it at once, nothing in eval/
    out2, err2 = tmp_path / "eval.out", tmp_path / "eval.err"
    proc = _start([EVAL, run, "--split", "valid", "--set", "threads=1"], tmp_path, out2, err2)
    _wait_for_lines(out2, "nas-eval: ", 1, proc)
    _stopped_within(proc, signal.SIGTERM, 10, to_group=False)
    assert proc.returncode == 128 + signal.SIGTERM, err2.read_text()[-3000:]
    assert "stopped: SIGTERM during the evaluation" in err2.read_text() and "Traceback" not in err2.read_text()
    assert not list((run / "eval").glob("*")) if (run / "eval").exists() else True


@pytest.mark.parametrize("sig,to_group", [(signal.SIGINT, True), (signal.SIGUSR1, False), (signal.SIGHUP, False)],
                         ids=["ctrl-c", "SIGUSR1", "SIGHUP"])
def test_a_stop_during_a_validation_inside_training_resumes_with_that_validation_then_trains_on(
        tmp_path, sig, to_group):
    data = _lm(tmp_path, 1500)
    run = tmp_path / "run"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    args = [NAS_RUN, *LM, f"task.path={data}", "model=tiny", "trainer.max_steps=8", "trainer.val_check_interval=4",
            "trainer.check_val_every_n_epoch=null", "task.eval_batch_size=2", "trainer.limit_test_batches=2",
            f"hydra.run.dir={run}"]
    proc = _start(args, tmp_path, out, err)
    _wait_for_lines(out, "validation at step 4: batch", 1, proc)
    _stopped_within(proc, sig, 10, to_group)
    errors = err.read_text()
    assert proc.returncode == 128 + sig, errors[-3000:]
    assert f"stopped: {sig.name} during validation at step 4" in errors and "Traceback" not in errors
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    res = nas_run(f"resume={run}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("validation at step 4: val/loss") == 1 and "validation at step 8: val/loss" in res.stdout
    import pandas as pd

    metrics = pd.read_csv(run / "csv" / "metrics.csv")
    assert metrics.dropna(subset=["val/loss"])["step"].tolist() == [3, 7]  # each validation once
    train_steps = metrics.dropna(subset=["train/loss"])["step"].tolist()
    assert train_steps == sorted(set(train_steps)) and max(train_steps) == 7
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
