"""A run is changed only by a command that runs it: every refusal of ``resume=`` leaves the whole run
directory byte for byte as it was (no failed.json, no resumes.yaml entry, no log line), and a finished
run whose last.ckpt is damaged stays finished for nas-eval and nas-report."""
from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path

import pytest

from helpers import NAS_RUN, nas_run, run_command

EVAL = str(Path(NAS_RUN).with_name("nas-eval"))
REPORT = str(Path(NAS_RUN).with_name("nas-report"))


def checksum(folder: Path) -> str:
    """Every file's path and bytes under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("intact")
    run = root / "run"
    proc = nas_run("debug=fast", "logger=csv", "diagnostics.plots=never", f"hydra.run.dir={run}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


#: (overrides after resume=<run>, what the one line says): every way a resume is refused
REFUSALS = [
    ([], "that run is complete (20 steps"),
    (["trainer.max_steps=20"], "that run is complete (20 steps"),
    (["trainer.max_steps=10"], "that run is complete (20 steps"),
    (["trainer.max_steps=40", "trainer.max_stepz=40"], "did you mean trainer.max_steps?"),
    (["trainer.max_steps=40", "attention=dnas"], "chooses a config"),
    (["trainer.max_steps=40", "seed=1,2"], "is a sweep"),
    (["trainer.max_steps=40", "model.heads=3"], "model.heads"),
    (["trainer.max_steps=40", "trainer.precision=16-mixed"], "trainer.precision=16-mixed"),
    (["trainer.max_steps=40", "optim.lr=-1"], "optim.lr"),
]


@pytest.mark.parametrize("overrides,needle", REFUSALS, ids=[" ".join(o) or "no-overrides" for o, _ in REFUSALS])
def test_every_refused_resume_leaves_the_run_byte_for_byte(finished, tmp_path, overrides, needle):
    before = checksum(finished)
    proc = nas_run(f"resume={finished}", *overrides, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert checksum(finished) == before


def test_a_run_another_nas_run_trains_is_refused_without_writing_into_it(finished, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    sleeper = __import__("subprocess").Popen(["sleep", "60"])  # a live process holding the run's lock
    try:
        (run / ".nas-run.lock").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(),
                                                       "slurm_job_id": None, "since": time.strftime("%H:%M")}))
        before = checksum(run)
        proc = nas_run(f"resume={run}", "trainer.max_steps=40", cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "another nas-run is training this run" in lines[0]
        assert f"PID {sleeper.pid}" in lines[0] and checksum(run) == before
    finally:
        sleeper.kill()


def test_a_finished_run_with_a_damaged_last_checkpoint_stays_finished(finished, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])  # truncated
    before = checksum(run)
    proc = nas_run(f"resume={run}", "trainer.max_steps=40", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "no checkpoint to continue from loads (last.ckpt: truncated or not a checkpoint file)" in lines[0]
    assert "the finished run is unchanged (summary.json and checkpoints/best.ckpt)" in lines[0]
    assert checksum(run) == before and not (run / "failed.json").exists()
    ev = run_command([EVAL, run], cwd=tmp_path, timeout=300)  # scored from best.ckpt, as before
    assert ev.returncode == 0 and "best.ckpt" in ev.stdout, ev.stderr[-2000:]
    report = run_command([REPORT, run, "--format", "json"], cwd=tmp_path, timeout=300)
    assert report.returncode == 0 and "failed" not in json.dumps(json.loads(report.stdout).get("runs", "")), \
        report.stdout[-2000:]


def test_a_resume_that_fails_before_training_leaves_the_run_as_it_was(finished, tmp_path):
    """A failure before training starts (here the data of the run's task, given anew, missing) is a
    refusal: the run keeps its summary, writes no failed.json and no log line."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = checksum(run)
    proc = nas_run(f"resume={run}", "trainer.max_steps=40", "task.train_size=0", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert checksum(run) == before
