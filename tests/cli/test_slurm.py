"""``hydra/launcher=slurm`` against a real SLURM cluster: Debian's Slurm, one node on
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
import torch

from helpers import NAS_RUN, glob_now, run_command, script, start_command
from slurm_cluster import SlurmCluster, available

# one xdist worker runs them all (pyproject's --dist loadgroup): one accounting cluster and one two-node cluster
# per test run, not one per worker side by side on a 2-core machine
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm"),
              pytest.mark.skipif(available(accounting=True) is not None, reason=str(available(accounting=True)))]

TINY = ("debug=fast", "progress_bar=false", "trainer.max_steps=4", "run_test=false",
        "diagnostics.plots=never")  # the figures: tests/diagnostics


def _started(kind, prefix: str, **options):
    """A test cluster in a fresh directory; a machine where the daemons cannot start (ports, hostname,
    packages half installed) skips the tests with the reason instead of failing them."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    try:
        try:
            c = kind(root, **options).__enter__()
        except (RuntimeError, subprocess.SubprocessError, OSError) as err:
            pytest.skip(f"the SLURM test cluster did not start here: {str(err)[:300]}")
        try:
            yield c
        finally:
            c.__exit__(None, None, None)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    # not under pytest's temporary root: that is private to root, and munged / MariaDB run as their own users
    yield from _started(SlurmCluster, "nas-slurm-", accounting=True)


def _nas_run(cluster, *args, cwd, timeout=400, wait=True):
    env = {**cluster.env, "NO_COLOR": "1"}
    if not wait:
        return start_command([NAS_RUN, *args], cwd=cwd, env=env)
    return run_command([NAS_RUN, *args], cwd=cwd, timeout=timeout, env=env)


def test_a_sequential_sweep_runs_as_job_arrays_on_a_cpu_partition(cluster, tmp_path):
    # the default trainer (accelerator auto) asks SLURM for no GPU: the CPU node takes the jobs;
    # -m after other options (3); seed=auto launches its round as one job array
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
    args = ("debug=fast", "progress_bar=false", "diagnostics.plots=never", "trainer.max_steps=150",
            "trainer.val_check_interval=75", "run_test=false", "hydra/launcher=slurm", "-m", "seed=1,2",
            "hydra.sweep.dir=sw")
    proc = _nas_run(cluster, *args, cwd=tmp_path, wait=False)
    try:
        victim = None
        deadline = time.time() + 180
        while victim is None and time.time() < deadline:  # cancel array task 1 once it trains
            for line in cluster.jobs():
                job, state = line.split()
                if job.endswith("_1") and state == "RUNNING" and glob_now(tmp_path / "sw", "1_*/nas_run.log"):
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
    assert "Connection lost" not in logs, logs[-3000:]  # W&B closed before the job ended
    assert "failed" in out
    again = _nas_run(cluster, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list((tmp_path / "sw").glob("*/summary.json"))) == 2 and not list((tmp_path / "sw").glob("*/failed.json"))


@pytest.fixture(scope="module")
def two_nodes():
    """Two slurmd daemons on this machine, one CPU each: a two-node cluster (no accounting needed here)."""
    yield from _started(SlurmCluster, "nas-slurm2-", nodes=2)


def test_ddp_over_two_slurm_nodes(two_nodes, tmp_path):
    # DDP across nodes, ranks and world size from SLURM (one task per node, gloo on the CPU). The test
    # cluster's node names do not resolve, so the job sets the main node's address (hydra.launcher.setup)
    # 96 test examples: two batches of 64 and 32, one per process, unequal sizes
    proc = _nas_run(two_nodes, "debug=fast", "progress_bar=false", "trainer.max_steps=4", "trainer=ddp",
                    "trainer.accelerator=cpu", "trainer.num_nodes=2", "trainer.devices=1", "trainer.precision=32-true",
                    "task.test_size=96", "trainer.limit_test_batches=1.0", "eval_batch_items=null", "hydra/launcher=slurm",
                    'hydra.launcher.setup=["export MASTER_ADDR=127.0.0.1"]', "-m", "seed=1", "hydra.sweep.dir=sw",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + two_nodes.log()
    text = next((tmp_path / "sw" / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text and "gpus" not in text
    (run,) = [p.parent for p in (tmp_path / "sw").glob("*/summary.json")]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["processes"] == 2
    assert len(list(run.rglob("run-*.wandb"))) == 1  # one W&B run, written by rank 0
    # the test metrics of the two processes equal one process's evaluation of the same checkpoint
    ev = run_command([script("nas-eval"), str(run), "--split", "test", "--ckpt",
                      str(run / summary["best_checkpoint"]) if summary.get("best_checkpoint") else
                      str(run / "checkpoints" / "best.ckpt"), "--name", "single"], timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    single = json.loads((run / "eval" / "single.json").read_text())["metrics"]
    for key in ("test/loss", "test/bleu", "test/exact_match"):
        assert summary["test"][key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key


def _release_when_requeued(cluster, job, timeout=120):
    """A requeued job waits about 120 s in PD (BeginTime) in this Slurm version: make it eligible
    sooner, and again until it has left PD. Not at once: slurmd revokes the old run's job credential
    at the second of the requeue and refuses a credential issued within that second, so a job
    released at once failed to start ("Killing non-startable batch JobId=9: Job credential revoked",
    state FAILED; the sweep then rightly called it failed: this test's failure in a full suite run
    and in CI). Slurm's own begin-time delay is there to avoid this; 2 s are enough here. (Once, in a
    full suite run under load, the requeued job did not start for the next 180 s after a single
    update: an update made while the requeue is still being processed can be overwritten by the
    requeue's own begin time; hence the repeated update.)"""
    deadline = time.time() + timeout
    pending_since = None
    while time.time() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                               env=cluster.env).stdout.strip()
        if state == "PENDING":
            pending_since = pending_since or time.time()
            if time.time() - pending_since >= 2.0:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=cluster.env)
        elif pending_since is not None:  # requeued, then started (or already over)
            return
        time.sleep(0.5 if pending_since is not None else 0.3)
    raise AssertionError(f"job {job} was {'requeued but never started again' if pending_since else 'not requeued'}")


def _why(sweep: Path) -> str:
    """What a failed job left: its failed.json and the end of its SLURM logs (for an assertion's message)."""
    parts = [f"--- {p}\n{p.read_text()}" for p in sweep.glob("*/failed.json")]
    for p in sorted((sweep / ".submitit").rglob("*_log.*")):
        parts.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(parts)[-6000:]


def _step(ckpt: Path) -> int:
    try:
        return int(torch.load(ckpt, weights_only=True)["global_step"])
    except Exception:  # noqa: BLE001 - being written
        return -1


def test_preemption_requeues_resume_bit_identically_and_close_wandb_cleanly(cluster, tmp_path):
    # SIGUSR2 (what SLURM sends before a time limit, --signal=USR2@120: last.ckpt, submitit requeues),
    # then `scontrol requeue` (SIGTERM: last.ckpt, SLURM requeues): each time the job resumes from last.ckpt in the
    # same W&B run, and the final weights equal an uninterrupted run's bit for bit (deterministic mode). No W&B
    # traceback in the job's log (4), and the records logged before the first stop are in the first run file.
    from nas_cli.infra.wandb_offline import read_run

    setup = ("debug=fast", "progress_bar=false", "diagnostics.plots=never", "trainer.max_steps=160",
             "trainer.val_check_interval=40", "trainer.log_every_n_steps=5", "run_test=false",
             "trainer.deterministic=true", "threads=1", "seed=1", "checkpoint.last_every_n_steps=10")
    proc = _nas_run(cluster, *setup, "hydra/launcher=slurm", "-m", "hydra.sweep.dir=sw", cwd=tmp_path, wait=False)
    try:
        job, last = None, None
        deadline = time.time() + 180
        while job is None and time.time() < deadline:
            found = glob_now(tmp_path / "sw", "0_*/checkpoints/last.ckpt")
            jobs = cluster.jobs()
            if found and jobs and jobs[0].split()[1] == "RUNNING":
                job, last = jobs[0].split()[0], found[0]
            time.sleep(0.3)
        assert job, "the job never trained"
        subprocess.run(["scancel", "--signal=USR2", job], env=cluster.env, check=True)
        _release_when_requeued(cluster, job)
        first_stop = _step(last)
        deadline = time.time() + 180  # the resumed job trains on: requeue it again, from outside
        while time.time() < deadline and _step(last) < first_stop + 20:
            time.sleep(0.3)
        assert _step(last) < 160, "the job finished before the second preemption"
        subprocess.run(["scontrol", "requeue", job], env=cluster.env, check=True)
        _release_when_requeued(cluster, job)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-1500:] + _why(tmp_path / "sw") + cluster.log()
    run_dir = next((tmp_path / "sw").glob("0_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] and summary["steps"] == 160
    logs = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").rglob("*_log.err"))
    # (a SIGTERM that arrives while a log record is being written can still print Python's "--- Logging error ---"
    # with a traceback: a known cosmetic race of the second stop signal, nothing lost; any other traceback fails)
    assert logs.count("this job is preempted") == 1 and "Connection lost" not in logs, logs[-3000:]
    assert logs.count("Traceback") <= logs.count("--- Logging error ---"), logs[-3000:]
    files = sorted(run_dir.rglob("run-*.wandb"))
    assert len(files) == 3  # one file per launch, one W&B run id
    runs = [read_run(f) for f in files]
    assert {r["id"] for r in runs} == {summary["wandb_run_id"]}
    steps = [h.get("trainer/global_step") for h in runs[0]["history"] if "train/loss" in h]
    assert steps and max(steps) >= 5  # what was logged before the first stop was written
    # the same job, never interrupted, on the plain CPU: bit-identical final weights
    ref = run_command([NAS_RUN, *setup, "hydra.run.dir=ref"], cwd=tmp_path, timeout=400,
                      env={**cluster.env, "NO_COLOR": "1"})
    assert ref.returncode == 0, ref.stderr[-2000:]
    a = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
