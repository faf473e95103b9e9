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
import zygote
from helpers import NAS_RUN, nas_run

EVAL = str(Path(NAS_RUN).with_name("nas-eval"))
#: validation lines of the long-validation corpus: with model=small on one thread the valid split takes
#: over 30 s (windows of 256 inputs scoring 64 tokens)
LONG_VALID_LINES = 9000  # a validation well over 30 s, also on a fast day of this machine


def _lm(tmp_path: Path, valid_lines: int) -> Path:
    return write_lm(tmp_path / "lm", n=(300, valid_lines, 40))


def _start(args: list[str], cwd: Path, out: Path, err: Path) -> subprocess.Popen:
    """The installed command in a process group of its own, stdout and stderr to files."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return subprocess.Popen([str(a) for a in args], cwd=cwd, env=env, stdout=out.open("w"), stderr=err.open("w"),
                            start_new_session=True, preexec_fn=zygote.terminal_signals)  # Ctrl-C, hang-up answered


def _wait_for_lines(path: Path, needle: str, count: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.time() + timeout
    while path.read_text().count(needle) < count:
        errors = path.with_suffix(".err").read_text() if path.with_suffix(".err").exists() else ""
        assert proc.poll() is None, f"exited {proc.returncode} before {count} x {needle!r}: {errors[-2000:]}"
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
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    args = [NAS_RUN, *LM, f"task.path={data}", "model=small", "trainer.max_steps=3", "task.batch_size=4",
            "+trainer.limit_test_batches=2", f"hydra.run.dir={run}"]
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
    done, total = map(int, lines[-1].split("batch ")[1].split(" (")[0].split(" of "))
    # stopped mid-way through a long validation (its estimate depends on the machine's load: 20 s or more)
    assert done < total and _seconds(elapsed) + _seconds(left.removesuffix(" left")) >= 20, lines
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
    res = nas_run(f"resume={run}", "+trainer.limit_val_batches=4", cwd=tmp_path, timeout=600)
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


#: (the step whose validation is stopped, overrides): 4 training batches an epoch at task.batch_size=4
CASES = {
    "mid-epoch": (2, ["trainer.max_steps=6", "trainer.val_check_interval=2", "trainer.check_val_every_n_epoch=null"]),
    "epoch-end": (4, ["trainer.max_steps=8"]),  # once an epoch, the validation after its last batch
    "last-step": (3, ["trainer.max_steps=3"]),  # the validation at the end of training, then the test
}


@pytest.mark.parametrize("sig,to_group,case", [(signal.SIGINT, True, "mid-epoch"), (signal.SIGUSR1, False, "epoch-end"),
                                               (signal.SIGHUP, False, "last-step")],
                         ids=["ctrl-c-mid-epoch", "SIGUSR1-epoch-end", "SIGHUP-last-step"])
def test_a_run_stopped_in_a_validation_and_resumed_equals_the_run_never_stopped(tmp_path, sig, to_group, case):
    """Stopped during a validation (signalled as a terminal's Ctrl-C, SLURM's SIGUSR1, a closed terminal's
    SIGHUP) and resumed, a run logs each validation once with the values, best checkpoint and test result of
    the same run never stopped: the resumed run repeated the validation, then trained on as it would have."""
    import pandas as pd

    step, extra = CASES[case]
    data = _lm(tmp_path, 1500)
    args = [*LM, f"task.path={data}", "model=tiny", "task.batch_size=4", "task.eval_batch_size=2",
            "+trainer.limit_test_batches=2", *extra]
    ref = nas_run(*args, f"hydra.run.dir={tmp_path / 'ref'}", cwd=tmp_path, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run = tmp_path / "run"
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    proc = _start([NAS_RUN, *args, f"hydra.run.dir={run}"], tmp_path, out, err)
    _wait_for_lines(out, f"validation at step {step}: batch", 1, proc)
    _stopped_within(proc, sig, 10, to_group)
    errors = err.read_text()
    assert proc.returncode == 128 + sig, errors[-3000:]
    assert f"stopped: {sig.name} during validation at step {step}" in errors and "Traceback" not in errors
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
    res = nas_run(f"resume={run}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(f"validation at step {step}: val/loss") == 1
    got, want = (json.loads((d / "summary.json").read_text()) for d in (run, tmp_path / "ref"))
    assert got["best_val"] == want["best_val"] and got["steps"] == want["steps"]
    assert got["test"] == pytest.approx(want["test"], rel=1e-6)
    rows = [pd.read_csv(d / "csv" / "metrics.csv").dropna(subset=["val/loss"])[["step", "val/loss"]]
            for d in (run, tmp_path / "ref")]
    pd.testing.assert_frame_equal(rows[0].reset_index(drop=True), rows[1].reset_index(drop=True), rtol=1e-6)
