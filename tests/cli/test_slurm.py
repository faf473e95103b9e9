"""``hydra/launcher=slurm`` against a real SLURM cluster (issue #28): Debian's Slurm, one node on
this machine, with accounting (slurmdbd + MariaDB), started for these tests in a temporary
directory (tests/slurm_cluster.py). Skipped, with the reason, where SLURM is not installed or
the tests do not run as root; ``.ci/run`` installs it."""
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import NAS_RUN
from slurm_cluster import SlurmCluster, available

pytestmark = pytest.mark.skipif(available(accounting=True) is not None, reason=str(available(accounting=True)))

TINY = ("debug=fast", "progress_bar=false", "trainer.max_steps=4", "run_test=false")


@pytest.fixture(scope="module")
def cluster():
    # not under pytest's temporary root: that is private to root, and munged / MariaDB run as their own users
    root = Path(tempfile.mkdtemp(prefix="nas-slurm-"))
    root.chmod(0o755)
    try:
        with SlurmCluster(root, accounting=True) as c:
            yield c
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _nas_run(cluster, *args, cwd, timeout=400, wait=True):
    env = {**cluster.env, "NO_COLOR": "1"}
    if not wait:
        return subprocess.Popen([NAS_RUN, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run([NAS_RUN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_sequential_sweep_runs_as_job_arrays_on_a_cpu_partition(cluster, tmp_path):
    # the default trainer (accelerator auto) asks SLURM for no GPU: the CPU node takes the jobs (issue #28, 1);
    # -m after other options (3); seed=auto launches its round as one job array (issue #32)
    proc = _nas_run(cluster, *TINY, "attention=unas,dnas", "hydra/launcher=slurm", "-m", "seed=auto",
                    "hydra.sweeper.max_seeds=2", "hydra.sweeper.metric=ppl", "hydra.sweep.dir=sw", "run_test=true",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + cluster.log()
    scripts = list((tmp_path / "sw" / ".submitit").rglob("*_submission.sh"))
    assert scripts, "no sbatch script"
    text = scripts[0].read_text()
    assert "#SBATCH --array=0-3" in text and "gpus" not in text and "gres" not in text
    runs = [json.loads(p.read_text()) for p in (tmp_path / "sw").glob("*/summary.json")]
    assert sorted((r["scheme"], r["seed"]) for r in runs) == [("dnas", 1), ("dnas", 2), ("unas", 1), ("unas", 2)]
    state = json.loads((tmp_path / "sw" / "sequential.json").read_text())
    assert state["comparisons"][0]["looks"][-1]["n"] == 2 and state["finished"]
    assert "Bypassing sacct error" not in proc.stderr  # accounting answers: submitit knows each job's state


def test_a_job_the_scheduler_ends_fails_alone_and_the_same_command_finishes_it(cluster, tmp_path):
    args = ("debug=fast", "progress_bar=false", "trainer.max_steps=150", "trainer.val_check_interval=75",
            "run_test=false", "hydra/launcher=slurm", "-m", "seed=1,2", "hydra.sweep.dir=sw")
    proc = _nas_run(cluster, *args, cwd=tmp_path, wait=False)
    try:
        victim = None
        deadline = time.time() + 180
        while victim is None and time.time() < deadline:  # cancel array task 1 once it trains
            for line in cluster.jobs():
                job, state = line.split()
                if job.endswith("_1") and state == "RUNNING" and list((tmp_path / "sw").glob("1_*/nas_run.log")):
                    victim = job
            time.sleep(0.5)
        assert victim, "array task 1 never ran"
        subprocess.run(["scancel", victim], env=cluster.env, check=True)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "UncompletedJobError" not in err
    failed = json.loads(next((tmp_path / "sw").glob("1_*/failed.json")).read_text())
    assert "ended by the scheduler" in failed["reason"] and "CANCELLED" in failed["reason"]
    assert list((tmp_path / "sw").glob("0_*/summary.json"))  # the other job finished and is in the table
    assert "failed" in out
    again = _nas_run(cluster, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((tmp_path / "sw").glob("*/summary.json"))) == 2 and not list((tmp_path / "sw").glob("*/failed.json"))


def test_ddp_over_two_slurm_tasks(cluster, tmp_path):
    proc = _nas_run(cluster, *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                    "trainer.precision=32-true", "hydra/launcher=slurm", "-m", "seed=1", "hydra.sweep.dir=sw",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + cluster.log()
    text = next((tmp_path / "sw" / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=2" in text and "gpus" not in text
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "sw").glob("*/summary.json")]
    assert summary["processes"] == 2
