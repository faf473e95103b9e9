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
    logs = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").rglob("*_log.err"))
    assert "Connection lost" not in logs, logs[-3000:]  # W&B closed before the job ended (issue #28, 4)
    assert "failed" in out
    again = _nas_run(cluster, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((tmp_path / "sw").glob("*/summary.json"))) == 2 and not list((tmp_path / "sw").glob("*/failed.json"))


@pytest.fixture(scope="module")
def two_nodes():
    """Two slurmd daemons on this machine, one CPU each: a two-node cluster (no accounting needed here)."""
    root = Path(tempfile.mkdtemp(prefix="nas-slurm2-"))
    root.chmod(0o755)
    try:
        with SlurmCluster(root, nodes=2) as c:
            yield c
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_ddp_over_two_slurm_nodes(two_nodes, tmp_path):
    # issue #28: DDP across nodes, ranks and world size from SLURM (one task per node, gloo on the CPU). The test
    # cluster's node names do not resolve, so the job sets the main node's address (hydra.launcher.setup)
    proc = _nas_run(two_nodes, *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.num_nodes=2",
                    "trainer.devices=1", "trainer.precision=32-true", "hydra/launcher=slurm",
                    'hydra.launcher.setup=["export MASTER_ADDR=127.0.0.1"]', "-m", "seed=1", "hydra.sweep.dir=sw",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + two_nodes.log()
    text = next((tmp_path / "sw" / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text and "gpus" not in text
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "sw").glob("*/summary.json")]
    assert summary["processes"] == 2


def test_preemption_requeues_resumes_and_finishes_the_wandb_run_cleanly(cluster, tmp_path):
    # issue #28 (4): SIGUSR2 (what SLURM sends before a time limit, --signal=USR2@120) -> last.ckpt, submitit
    # requeues, the job resumes from last.ckpt into the same W&B run; no W&B traceback, and the records logged
    # before the stop are in the first offline run file
    from nas_cli.wandb_offline import read_run

    args = ("debug=fast", "progress_bar=false", "trainer.max_steps=120", "trainer.val_check_interval=40",
            "trainer.log_every_n_steps=5", "run_test=false", "hydra/launcher=slurm", "-m", "seed=1",
            "hydra.sweep.dir=sw")
    proc = _nas_run(cluster, *args, cwd=tmp_path, wait=False)
    try:
        job = None
        deadline = time.time() + 180
        while job is None and time.time() < deadline:
            ckpt = list((tmp_path / "sw").glob("0_*/checkpoints/last.ckpt"))
            jobs = cluster.jobs()
            if ckpt and jobs and jobs[0].split()[1] == "RUNNING":
                job = jobs[0].split()[0]
            time.sleep(0.3)
        assert job, "the job never trained"
        subprocess.run(["scancel", "--signal=USR2", job], env=cluster.env, check=True)
        deadline = time.time() + 120  # a requeued job waits ~120 s in PD (BeginTime): release it now
        while time.time() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                                   env=cluster.env).stdout.strip()
            if state == "PENDING":
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=cluster.env)
                break
            time.sleep(0.3)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run_dir = next((tmp_path / "sw").glob("0_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] and summary["steps"] == 120
    logs = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").rglob("*_log.err"))
    assert "Traceback" not in logs and "Connection lost" not in logs, logs[-3000:]
    files = sorted(run_dir.rglob("run-*.wandb"))
    assert len(files) == 2  # the first launch's file and the resumed one's, one W&B run id
    first, second = read_run(files[0]), read_run(files[1])
    assert first["id"] == second["id"] == summary["wandb_run_id"]
    steps = [h.get("trainer/global_step") for h in first["history"] if "train/loss" in h]
    assert steps and max(steps) >= 5  # what was logged before the stop was written
