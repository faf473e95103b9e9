"""Scale-out and fault tolerance: DDP on CPU, launchers and sweepers, resume after
SIGKILL/SIGTERM, determinism, safe checkpoint loading, secrets. Real Lightning, real Hydra
plugins, real W&B (offline); no cluster: SLURM stops at the sbatch file submitit would submit."""
import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from nas_cli.diagnostics.callback import DiagnosticsCallback
from nas_cli.diagnostics.locations import location_scalars
from nas_cli.model.choices import CONF_DIR
from nas_cli.infra.resume import fault_tolerance_state
from datafiles import write_lm, write_parallel
from nas_cli.pipeline.parts import build_module, build_task
from nas_cli.infra.distributed import shard_and_resume
from nas_cli.infra.wandb_offline import read_run
from nas_cli.model.plan import AttentionPlan
from helpers import NAS_RUN, glob_now, nas_run, run_command, start_command

TINY = ("debug=fast", "progress_bar=false", "diagnostics.plots=never")  # the figures: tests/diagnostics


def wandb_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob("run-*.wandb"))


def last_val(history: list[dict], key: str) -> float:
    return [h[key] for h in history if key in h][-1]


# ---- distributed: 2 CPU processes (gloo) --------------------------------------------------------
def test_ddp_two_cpu_processes_one_wandb_run_metrics_equal_single_process(tmp_path):
    run = tmp_path / "ddp"
    # 96 validation examples = 2 batches of 64 and 32: one per process, unequal sizes
    proc = nas_run(*TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
                   "trainer.max_steps=10", "trainer.val_check_interval=10", "trainer.limit_val_batches=1.0",
                   "task.val_size=96", "diagnostics.batches=2", "eval_batch_items=null", f"hydra.run.dir={run}",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 10
    assert proc.stdout.count("nas-run result") == 1  # only rank 0 reports
    files = wandb_files(run)
    assert len(files) == 1, files  # exactly one W&B run for the job
    wb = read_run(files[0])
    assert wb["id"] == summary["wandb_run_id"]

    # the same checkpoint evaluated by one process
    ev = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run), "--split", "valid",
                         "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--name", "single"],
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    single = json.loads((run / "eval" / "single.json").read_text())["metrics"]
    for key in ("loss", "ppl", "bleu", "exact_match", "token_acc"):
        assert last_val(wb["history"], f"val/{key}") == pytest.approx(single[f"valid/{key}"], rel=1e-5, abs=1e-6), key

    # diagnostics: rank 0 analysed the whole split's first batches, as one process would
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    task = build_task(cfg)
    module = build_module(cfg, task, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model))
    module.load_state_dict(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    cb = DiagnosticsCallback(run_dir=tmp_path / "single-diag", batches=2)
    cb._active = True
    for i, batch in enumerate(task.val_dataloader()):
        if i == 2:
            break
        cb._analyse_batch(module, batch)
    expected = cb.diag.compute()
    got = json.loads((run / "diagnostics" / "summary.json").read_text())["locations"]
    for loc in ("encoder", "decoder", "cross"):
        assert got[loc]["jsd_mean"] == pytest.approx(location_scalars(expected[loc])["jsd_mean"], rel=1e-5), loc


# ---- launchers and sweepers ---------------------------------------------------------------------
def test_threads_follow_the_model_size_slurm_and_omp(monkeypatch):
    """threads=null: one thread for a model below ONE_THREAD_BELOW parameters on the CPU, else the CPUs
    the process may use (at most SLURM_CPUS_PER_TASK); OMP_NUM_THREADS and threads=N win."""
    from nas_cli.pipeline.trainer import ONE_THREAD_BELOW, choose_threads, cpus_allowed, set_threads

    auto, two = OmegaConf.create({"threads": None}), OmegaConf.create({"threads": 2})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert choose_threads(auto, ONE_THREAD_BELOW - 1, on_cpu=True)[0] == 1
    assert choose_threads(auto, ONE_THREAD_BELOW, on_cpu=True)[0] == cpus_allowed() == len(os.sched_getaffinity(0))
    assert choose_threads(auto, 1000, on_cpu=False)[0] == cpus_allowed()  # a GPU run: the size rule is the CPU's
    assert choose_threads(two, 1000, on_cpu=True) == (2, "threads=")  # an explicit threads=N wins
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert cpus_allowed() == 1 and choose_threads(auto, ONE_THREAD_BELOW, on_cpu=True)[0] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(auto, 1000, on_cpu=True) == (2, "OMP_NUM_THREADS")
    before = torch.get_num_threads()
    try:
        set_threads(OmegaConf.create({"threads": None, "trainer": {"accelerator": "cpu"}}), 1000)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_multirun_flag_is_moved_to_the_front():
    from nas_cli.pipeline.launch.command_line import multirun_first

    assert multirun_first(["trainer=ddp", "hydra/launcher=slurm", "-m", "seed=1,2,3"]) == [
        "-m", "trainer=ddp", "hydra/launcher=slurm", "seed=1,2,3"]
    assert multirun_first(["seed=1", "--multirun"]) == ["-m", "seed=1"] and multirun_first(["seed=1"]) == ["seed=1"]


def test_slurm_launcher_submits_what_the_config_says(tmp_path, monkeypatch):
    """Compose hydra/launcher=slurm, run the real submitit launcher up to the sbatch file."""
    import submitit.slurm.slurm as slurm

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=[
            "hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=2", "trainer.devices=8",
            "hydra.launcher.partition=gpu-long", "hydra.launcher.account=proj42", "hydra.launcher.timeout_min=600",
            "hydra.launcher.cpus_per_task=6", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
        cpu = compose("config", return_hydra_config=True, overrides=["hydra/launcher=slurm", "trainer=cpu"])
        default = compose("config", return_hydra_config=True, overrides=["hydra/launcher=slurm"])
        one_gpu = compose("config", return_hydra_config=True, overrides=["hydra/launcher=slurm", "trainer=gpu"])
    # the default trainer (accelerator auto) asks SLURM for no GPU; trainer=gpu for its devices
    assert default.hydra.launcher.gpus_per_node is None and default.hydra.launcher.tasks_per_node == 1
    assert one_gpu.hydra.launcher.gpus_per_node == 1
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg.nodes == 2 and launcher_cfg.tasks_per_node == 8 and launcher_cfg.gpus_per_node == 8
    assert cpu.hydra.launcher.gpus_per_node is None and cpu.hydra.launcher.tasks_per_node == 1
    assert cpu.hydra.launcher.partition is None  # nothing cluster-specific unless set

    class Submitted(Exception):
        pass

    def capture(self, tasks):
        raise Submitted(self._make_submission_file_text("python -m job", "uid"))

    monkeypatch.setattr(slurm.SlurmExecutor, "_internal_process_submissions", capture)
    monkeypatch.setattr(slurm.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "srun is there"
    launcher = instantiate(launcher_cfg)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(Submitted) as sub:
        launcher.launch([["attention=dnas"]], initial_job_idx=0)
    sbatch = str(sub.value)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu-long", "#SBATCH --account=proj42", "#SBATCH --time=600",
                 "#SBATCH --cpus-per-task=6", "#SBATCH --signal=USR2@120"):
        assert line in sbatch, line


def test_joblib_and_optuna_sweeps_and_no_overwrite(tmp_path):
    # joblib: two jobs in parallel worker processes, one W&B run each in one group; -m anywhere.
    # With DataLoader workers inside joblib's processes: every job failed on a 16-core machine, where
    # task.num_workers=auto starts workers (this 2-core one starts none)
    proc = nas_run(*TINY, "trainer.max_steps=6", "run_test=false", "hydra/launcher=joblib", "-m",
                   "hydra.launcher.n_jobs=2", "attention=unas,dnas", "task.num_workers=1", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Lightning's hint where SLURM's tools are installed (this machine), once per job before: not for nas-run
    assert "The `srun` command is available" not in proc.stderr
    # optuna: 3 trials, maximizing the reverse task's val/exact_match
    # a trial that would never validate has nothing to optimize: refused before training, one line
    bad = nas_run("-m", *TINY, "trainer.max_steps=6", "sweep=optuna", "hydra.sweeper.n_trials=2",
                  "hydra.sweep.dir=never", cwd=tmp_path)
    assert bad.returncode == 2 and "trainer.val_check_interval=10 > trainer.max_steps=6" in bad.stderr
    assert "Traceback" not in bad.stderr and not list((tmp_path / "never").rglob("*.ckpt"))
    proc2 = nas_run(*TINY, "trainer.max_steps=6", "trainer.val_check_interval=3", "run_test=false",
                    "sweep=optuna", "hydra.sweeper.n_trials=3", "--multirun", cwd=tmp_path, timeout=600)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    sweeps = sorted((tmp_path / "outputs" / "sweeps").iterdir())
    assert len(sweeps) == 2  # a second sweep into the same output root gets its own directory
    joblib_dir, optuna_dir = sweeps
    jobs = sorted(p for p in joblib_dir.iterdir() if (p / "summary.json").exists())
    assert [json.loads((p / "summary.json").read_text())["scheme"] for p in jobs] == ["unas", "dnas"]
    runs = [read_run(p) for p in jobs]
    assert len({r["id"] for r in runs}) == 2 and {r["group"] for r in runs} == {joblib_dir.name}

    result = yaml.safe_load((optuna_dir / "optimization_results.yaml").read_text())
    assert set(result["best_params"]) == {"optim.lr", "optim.warmup", "model.dropout"}
    trials = [json.loads(p.read_text())["best_val"] for p in optuna_dir.glob("*/summary.json")]
    assert len(trials) == 3 and {t["metric"] for t in trials} == {"val/exact_match"}
    assert result["best_value"] == pytest.approx(max(t["value"] for t in trials))  # maximized

    # the same explicit sweep directory again: refused, nothing overwritten
    before = {p: p.stat().st_mtime_ns for p in joblib_dir.rglob("*") if p.is_file()}
    proc3 = nas_run("-m", *TINY, "trainer.max_steps=6", "attention=unas", f"hydra.sweep.dir={joblib_dir}", cwd=tmp_path)
    assert proc3.returncode == 2 and "holds a sweep of other overrides" in proc3.stderr
    assert "Traceback" not in proc3.stderr
    assert {p: p.stat().st_mtime_ns for p in joblib_dir.rglob("*") if p.is_file()} == before


def test_joblib_refuses_multi_process_jobs(tmp_path):
    proc = nas_run("-m", *TINY, "hydra/launcher=joblib", "trainer=ddp", "trainer.accelerator=cpu",
                   "trainer.devices=2", "attention=unas", cwd=tmp_path)
    assert proc.returncode == 2 and "hydra/launcher=joblib" in proc.stderr and "Traceback" not in proc.stderr


# ---- resume ---------------------------------------------------------------------------------------
#: a run long enough to be stopped mid-training: 240 steps over about 4 epochs (62 batches of 16 each), so a
#: resume crosses epoch boundaries; batches of 16, not the task's 64, keep each step cheap
LONG = (*TINY, "trainer.max_steps=240", "trainer.val_check_interval=80", "checkpoint.last_every_n_steps=10",
        "task.train_size=1000", "task.batch_size=16", "task.val_size=128", "task.test_size=128",
        "trainer.limit_val_batches=1.0", "trainer.limit_test_batches=1.0")


def start(run_dir: Path, cwd: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return start_command([NAS_RUN, *LONG, *extra, f"hydra.run.dir={run_dir}"], cwd=cwd, env=env)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < end, f"{path} never appeared"
        time.sleep(0.05)


def start_group(cwd: Path, *args: str, **popen) -> subprocess.Popen:
    """nas-run in a process group of its own (what a terminal, `timeout` or a SLURM step signal as one)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    if popen:  # e.g. a signal ignored from the start: the installed script itself
        return subprocess.Popen([NAS_RUN, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, **popen)
    return start_command([NAS_RUN, *args], cwd=cwd, env=env)


def assert_group_gone(pgid: int) -> None:
    time.sleep(6)  # a DataLoader worker outliving its training process exits within PyTorch's 5 s watchdog interval
    left = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left in the group: {left.stdout}"


def test_sigkill_at_a_random_step_then_resume_matches_uninterrupted_run(tmp_path):
    ref = nas_run(*LONG, f"hydra.run.dir={tmp_path / 'ref'}", cwd=tmp_path, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = json.loads((tmp_path / "ref" / "summary.json").read_text())

    run = tmp_path / "killed"
    proc = start(run, tmp_path)
    wait_for(run / "checkpoints" / "last.ckpt", proc)
    time.sleep(random.uniform(0.0, 2.0))  # somewhere after the first checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "finished before the kill: make the run longer"
    # nothing corrupt: every checkpoint left behind loads with the safe loader
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        assert "state_dict" in torch.load(ckpt, weights_only=True)
    # the W&B run id travels in the checkpoint (a SIGKILLed offline run may not have flushed its
    # run record yet); the run file W&B started is named after the same id
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    killed_id = fault_tolerance_state(last)["wandb_run_id"]
    assert killed_id and [p.name for p in wandb_files(run)] and all(
        p.name.endswith(f"-{killed_id}.wandb") for p in wandb_files(run))
    killed_step = last["global_step"]
    assert 0 < killed_step < 240

    res = nas_run(f"resume={run}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((run / "summary.json").read_text())
    assert got["steps"] == 240 and got["resumed_from"].endswith(".ckpt")
    assert got["wandb_run_id"] == killed_id  # the same W&B run continues
    resumed = read_run(run)  # the newest W&B folder: the whole run (the killed launch's moved aside)
    assert resumed["id"] == killed_id and last_val(resumed["history"], "trainer/global_step") >= 239
    train_steps = [h["trainer/global_step"] for h in resumed["history"] if "train/loss" in h]
    assert train_steps == sorted(set(train_steps)) and train_steps[0] < killed_step  # one history, each step once
    for key, value in expected["test"].items():
        assert got["test"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert got["best_val"]["value"] == pytest.approx(expected["best_val"]["value"], abs=1e-6)
    assert not list(run.rglob("*.tmp"))


def test_sigterm_saves_last_checkpoint_and_exits_with_a_resume_hint(tmp_path):
    run = tmp_path / "term"
    proc = start(run, tmp_path, "logger=csv")
    wait_for(run / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "SIGTERM during training" in err and f"nas-run resume={run}" in err and "Traceback" not in err
    step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < step < 240 and not (run / "summary.json").exists()
    import pandas as pd

    before = pd.read_csv(run / "csv" / "metrics.csv")  # what the run logged up to the stop
    assert len(before) and before["step"].min() < step
    res = nas_run(f"resume={run}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 240
    # the resumed run continues metrics.csv: every row logged before the checkpoint it resumed
    # from is still there, unchanged, and no metric has a step twice
    after = pd.read_csv(run / "csv" / "metrics.csv")
    assert "Previous log files" not in res.stderr
    kept = before[before["step"] < step]
    assert len(kept)
    pd.testing.assert_frame_equal(after[after["step"] < step][kept.columns].reset_index(drop=True),
                                  kept.reset_index(drop=True), check_dtype=False)
    assert after["step"].max() >= 230
    for col in after.columns.drop("step"):
        logged = after.dropna(subset=[col])
        assert not logged["step"].duplicated().any(), col


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "ctrl-c", "hangup"])
def test_a_stop_signal_to_the_whole_process_group_with_dataloader_workers_still_saves(tmp_path, sig):
    # what a SLURM time limit, `timeout`, `kill -TERM -<group>` and Ctrl-C in a terminal do: the
    # DataLoader workers get the signal too. Were a worker to die of it, the run would fail ("DataLoader
    # worker ... is killed by signal") before it could save, losing the steps since the last periodic
    # checkpoint. The workers leave the stop to the training process, which saves and says how to continue
    run = tmp_path / "group"
    proc = start_group(tmp_path, *LONG, "logger=csv", "task.num_workers=2", f"hydra.run.dir={run}")
    wait_for(run / "checkpoints" / "last.ckpt", proc)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"stopped: {sig.name} during training" in err and f"nas-run resume={run}" in err and "Traceback" not in err
    assert 0 < torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] < 240
    assert_group_gone(proc.pid)


# Ctrl-C to the sweep's process alone is left out: its sweep process takes the path of Ctrl-C to the group
# (the stop passed on to the workers, then KeyboardInterrupt), and its workers that of SIGTERM to the
# process (SIGTERM passed on, nothing else)
@pytest.mark.parametrize("sig,to", [(signal.SIGTERM, "group"), (signal.SIGTERM, "process"), (signal.SIGINT, "group")],
                         ids=["SIGTERM-group", "SIGTERM-process", "ctrl-c-group"])
def test_a_stopped_joblib_sweep_saves_every_job_and_says_how_to_continue_in_one_line(tmp_path, sig, to):
    # the sweep's own process waits in joblib, where Ctrl-C would print a KeyboardInterrupt traceback and
    # SIGTERM end it without a word, leaving joblib's worker processes behind. Signalled alone (`kill <pid>`,
    # not its group), it passes the stop to the jobs and waits until each has saved: no steps lost
    sweep = tmp_path / "sweep"
    proc = start_group(tmp_path, "-m", *LONG, "logger=csv", "task.num_workers=1", "hydra/launcher=joblib",
                       "hydra.launcher.n_jobs=2", "attention=unas,dnas", "seed=1,2", f"hydra.sweep.dir={sweep}")
    end = time.time() + 240
    while len(jobs := glob_now(sweep, "*/checkpoints/last.ckpt")) < 2:  # both workers are training
        assert proc.poll() is None and time.time() < end, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    jobs = [p.parents[1].name for p in jobs]
    if to == "group":
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = [ln for ln in err.splitlines() if ln.startswith("nas-run: stopped:")][-1]
    assert last.endswith(f"the same command with hydra.sweep.dir={sweep} continues the sweep (finished jobs are "
                         "skipped, the others resume from their last.ckpt)")
    for job in jobs:  # each job saved where it stopped, and said so
        said = re.search(rf"SIG(?:TERM|INT) during training at step (\d+) \(checkpoints/last.ckpt saved; no "
                         rf"summary.json\); continue with: nas-run resume={re.escape(str(sweep / job))}", err)
        assert said, err[-3000:]
        assert torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == int(said[1])
    others = [p for p in sweep.iterdir() if p.is_dir() and p.name not in jobs]
    assert len(others) <= 2 and not any((p / "checkpoints").exists() for p in others)  # never started training
    assert not (sweep / ".nas-run-stopping").exists()
    assert_group_gone(proc.pid)


def test_the_sweep_finds_its_joblib_workers_without_proc_too(monkeypatch):
    # a stop signal to a joblib sweep's own process reaches its workers only if it can name them: Linux's
    # /proc lists them, and where there is no /proc (macOS, Windows) joblib's loky executor does; both
    # must name the same live worker processes of this one
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    from nas_cli.sweeps import supervision as entry

    with Parallel(n_jobs=2, backend="loky") as parallel:
        pids = set(parallel(delayed(os.getpid)() for _ in range(8)))
        from_proc = set(entry.joblib_workers())
        from_loky = set(entry.loky_executor_workers())
        assert from_loky == from_proc and pids <= from_loky and len(from_loky) == 2
        monkeypatch.setattr(entry, "Path", lambda *a: Path("/nonexistent-proc"))  # a system without /proc
        assert set(entry.joblib_workers()) == from_loky
    get_reusable_executor().shutdown(wait=True)
    assert entry.loky_executor_workers() == []


def test_a_stop_mark_left_by_a_killed_sweep_process_does_not_skip_the_next_launch(tmp_path):
    # a sweep process killed (SIGKILL) while its jobs saved leaves the mark that keeps new jobs from starting
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / ".nas-run-stopping").touch()
    proc = nas_run("-m", *TINY, "trainer.max_steps=2", "run_test=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(sweep.glob("*/summary.json"))) == 1 and not (sweep / ".nas-run-stopping").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["background-job", "nohup"])
def test_a_run_started_with_the_signal_ignored_keeps_ignoring_it(tmp_path, sig):
    # a shell script's background job (`nas-run ... &`) starts with SIGINT ignored, so that Ctrl-C meant
    # for the script leaves it running, and `nohup` ignores SIGHUP: nas-run's stop handling must not undo that
    run = tmp_path / "bg"
    proc = start_group(tmp_path, *LONG, "logger=csv", f"hydra.run.dir={run}",
                       preexec_fn=lambda: signal.signal(sig, signal.SIG_IGN))
    wait_for(run / "checkpoints" / "last.ckpt", proc)
    os.killpg(proc.pid, sig)
    time.sleep(3)
    assert proc.poll() is None, proc.stderr.read()[-3000:]  # still training
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    # the stop lands in training or in one of its validations (every 80 steps): either is a stop of the run
    assert proc.returncode == 128 + signal.SIGTERM and re.search(r"stopped: SIGTERM during (training|validation)",
                                                                 err), err[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_the_same_signal_twice_while_stopping_stops_at_once(tmp_path, sig):
    from nas_cli.errors import SignalStop
    from nas_cli.infra.fault_tolerance import FaultTolerance
    from nas_cli.infra.resume import FAULT_TOLERANCE_KEY

    assert FaultTolerance.__qualname__ == FAULT_TOLERANCE_KEY  # how a checkpoint files the callback's state
    ft = FaultTolerance(tmp_path / "last.ckpt", 10, {})
    ft._note(sig, None)
    assert ft.pending == sig  # the first: noted, acted on at the next batch (of training or a validation)
    ft._note(sig, None)  # the same signal at once: one stop arriving twice (a group's and a sweep's), noted
    other = signal.SIGTERM if sig == signal.SIGINT else signal.SIGINT
    ft._noted_at -= 5  # five seconds later
    ft._note(other, None)  # another signal while stopping: one stop passed on as another, only noted
    with pytest.raises(SignalStop) as stop:
        ft._note(sig, None)  # the same signal again, later: at once
    assert stop.value.signum == sig and ft.pending == sig
    other = FaultTolerance(tmp_path / "last.ckpt", 10, {})
    other._note(signal.SIGTERM, None)  # a joblib sweep's process passes Ctrl-C on as SIGTERM; the terminal's
    other._note(signal.SIGINT, None)  # own SIGINT may come after it: still one stop, saved as usual
    assert other.pending == signal.SIGTERM


@pytest.mark.parametrize("args,needle", [
    (["resume=/nonexistent/run"], "no such run directory"),
    (["resume=.", "-m"], "cannot be combined with -m"),
])
def test_resume_bad_input(tmp_path, args, needle):
    proc = nas_run(*args, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_resume_refuses_finished_run_and_unsafe_checkpoint(tmp_path):
    run = tmp_path / "done"
    assert nas_run(*TINY, "trainer.max_steps=4", "run_test=false", "logger=csv", f"hydra.run.dir={run}",
                   cwd=tmp_path).returncode == 0
    proc = nas_run(f"resume={run}", cwd=tmp_path)
    assert proc.returncode == 2 and "that run is complete" in proc.stderr

    # a checkpoint that would run code when unpickled: never executed, refused in one line
    (run / "summary.json").unlink()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for name in ("last.ckpt", "best.ckpt"):
        torch.save({"state_dict": {}, "loops": {}, "evil": Evil()}, run / "checkpoints" / name)
    proc = nas_run(f"resume={run}", cwd=tmp_path)
    assert proc.returncode == 2 and "no checkpoint to continue from loads" in proc.stderr and "Traceback" not in proc.stderr
    ev = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run)], capture_output=True, text=True)
    # the refused resume wrote nothing: the run is as it was, unfinished, no failed.json
    assert ev.returncode == 2 and "is unfinished (no summary.json)" in ev.stderr and not (run / "failed.json").exists()
    ev = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run), "--ckpt", str(run / "checkpoints" / "best.ckpt")],
                     capture_output=True, text=True)
    assert ev.returncode == 2 and "cannot read checkpoint" in ev.stderr
    assert not marker.exists()


# ---- determinism and secrets ----------------------------------------------------------------------
def test_same_seed_same_metrics_other_seed_different(tmp_path):
    args = (*TINY, "trainer.deterministic=true", "logger=csv", "attention=dnas")
    out = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        proc = nas_run(*args, f"seed={seed}", f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.append(json.loads((tmp_path / name / "summary.json").read_text())["test"])
    assert out[0] == out[1]  # bit-identical
    assert out[0]["test/loss"] != out[2]["test/loss"]


def test_secrets_never_reach_files(tmp_path):
    secret = "sk-SECRET-4f9a7c"
    run = tmp_path / "run"
    env_key = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}
    os.environ.update(env_key)
    try:
        # plural and compound names, and a secret inside another key's string value
        proc = nas_run(*TINY, "trainer.max_steps=4", f"+logger.api_key={secret}", f"+hf_token={secret}",
                       f"+logger.keys=[{secret},x]", f"+logger.authkey={secret}", f'logger.group="api_key={secret}"',
                       f"hydra.run.dir={run}", cwd=tmp_path)
    finally:
        os.environ.pop("WANDB_API_KEY")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert secret not in proc.stdout + proc.stderr
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "config.yaml" for p in files)
    for p in files:
        data = p.read_bytes()
        assert secret.encode() not in data, p
        assert env_key["WANDB_API_KEY"].encode() not in data, p


def test_saved_configs_without_a_secret_word_are_not_parsed_and_every_secret_is_still_dropped(tmp_path):
    # redact_files skips a file whose text has none of the secret words (a run's saved configs, usually): that must
    # never skip a key is_secret calls secret, in any case, spelling or quoting
    import random

    from omegaconf import OmegaConf

    from nas_cli.infra import redaction

    rng = random.Random(0)
    words = ["api_key", "keys", "authkey", "accessToken", "hf_token", "password", "PASSWD", "Credentials",
             "my key", "x-Secret-value", "KEY", "sessionToken"]
    for i in range(200):  # the documented names and random compounds of them
        name = words[i] if i < len(words) else (rng.choice(["", "my_", "X", "a-"]) + rng.choice(words)
                                                  + rng.choice(["", "_1", "s", "Name"]))
        if i >= len(words) and not redaction.is_secret(name):
            continue  # e.g. accessTokens: not a secret by the rule (as max_tokens is not)
        assert redaction.is_secret(name), name
        path = tmp_path / f"c{i}.yaml"
        OmegaConf.save(OmegaConf.create({"model": {"heads": 4}, "logger": {name: "sk-123", "project": "p"}}), path)
        redaction.redact_files(path)
        saved = OmegaConf.to_container(OmegaConf.load(path))
        assert saved == {"model": {"heads": 4}, "logger": {"project": "p"}}, (name, saved)
    plain = tmp_path / "plain.yaml"
    plain.write_text("model:\n  heads: 4   # not as OmegaConf would write it\ntask:\n  max_len: 12\n")
    before = plain.read_bytes()
    real = redaction.OmegaConf.load
    redaction.OmegaConf.load = lambda *a: pytest.fail("parsed a file with no secret word")
    try:
        redaction.redact_files(plain)
    finally:
        redaction.OmegaConf.load = real
    assert plain.read_bytes() == before


# ---- data order: every epoch a new one, a function of (seed, epoch) ------------------------------
class _RecordBatches(pl.Callback):
    def __init__(self):
        self.seen: dict[int, list[bytes]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = batch["src"] if "src" in batch else batch["ids"]
        self.seen.setdefault(trainer.current_epoch, []).append(key.numpy().tobytes())


def _epoch_task_overrides(kind: str, tmp_path: Path) -> list[str]:
    if kind == "translation":
        return ["task=iwslt14", f"task.path={write_parallel(tmp_path / 'mt', n=(200, 20, 20))}",
                "task.vocab_size=120", "task.max_tokens=256", "task.num_workers=0"]
    if kind == "lm":
        return ["task=wikitext2", f"task.path={write_lm(tmp_path / 'lm', n=(200, 20, 20))}",
                "task.tokens_per_sample=32", "task.context_window=24", "task.batch_size=8"]
    return ["task.train_size=320", "task.batch_size=32"]


@pytest.mark.parametrize("kind", ["synthetic", "translation", "lm"])
def test_every_epoch_sees_a_new_data_order_set_by_seed_and_epoch(tmp_path, kind):
    """Lightning's set_epoch must reach nas-run's batch sampler (it once replayed epoch 0 forever)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*_epoch_task_overrides(kind, tmp_path), "model=tiny", "seed=3"])
    task = build_task(cfg)
    data = shard_and_resume(task, int(cfg.seed))
    module = build_module(cfg, task, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model))
    record = _RecordBatches()
    trainer = pl.Trainer(max_epochs=3, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
                         use_distributed_sampler=False, accelerator="cpu")
    trainer.fit(module, datamodule=data)
    assert sorted(record.seen) == [0, 1, 2]
    orders = [record.seen[e] for e in range(3)]
    assert all(len(o) > 2 for o in orders)
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]
    assert len(orders[0]) == len(orders[1]) == len(orders[2])
    # a function of (seed, epoch): a fresh loader asked for epoch 2 gives epoch 2's batches
    loader = data.train_dataloader()
    loader.batch_sampler.sampler.set_epoch(2)  # as Lightning does
    again = [(b["src"] if "src" in b else b["ids"]).numpy().tobytes() for b in loader]
    assert again == orders[2]


def _cli_task_overrides(kind: str, tmp_path: Path) -> list[str]:
    if kind == "synthetic":
        return ["task.train_size=320", "task.batch_size=32", "task.val_size=64", "task.test_size=64"]
    return _epoch_task_overrides(kind, tmp_path)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.parametrize("kind", ["synthetic", "translation", "lm"])
def test_sigkill_in_a_later_epoch_then_resume_gives_bit_identical_weights(tmp_path, kind):
    args = (*TINY, *_cli_task_overrides(kind, tmp_path), "trainer.deterministic=true", "logger=csv",
            "trainer.max_steps=80", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
            "trainer.check_val_every_n_epoch=1", "checkpoint.last_every_n_steps=3", "seed=5")
    ref = nas_run(*args, f"hydra.run.dir={tmp_path / 'ref'}", cwd=tmp_path, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]

    run = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    proc = start_command([NAS_RUN, *args, f"hydra.run.dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
    last, end = run / "checkpoints" / "last.ckpt", time.time() + 300
    while True:  # kill as soon as a checkpoint from epoch >= 1 exists
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < end, "no checkpoint from epoch >= 1 appeared"
        if last.exists():
            try:
                if torch.load(last, weights_only=True)["epoch"] >= 1:
                    break
            except Exception:  # noqa: BLE001 - replaced while reading
                pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = torch.load(last, weights_only=True)
    assert not (run / "summary.json").exists() and killed["epoch"] >= 1 and killed["global_step"] < 80

    res = nas_run(f"resume={run}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    expected, got = _final_weights(tmp_path / "ref"), _final_weights(run)
    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, different[:5]
    assert (json.loads((run / "summary.json").read_text())["test"]
            == json.loads((tmp_path / "ref" / "summary.json").read_text())["test"])


@pytest.mark.skipif(__import__("slurm_cluster").available(accounting=True) is None,
                    reason="a real SLURM cluster runs the same check: tests/cli/test_slurm.py")
def test_a_job_the_scheduler_ends_fails_alone_and_the_same_command_finishes_it(tmp_path):
    """Hydra-submitit-launcher waits with job.results(), which raised submitit's
    UncompletedJobError for a job killed from outside (scancel, node failure, OOM): the sweep died
    in a traceback with no table and no failed.json. Here a real submitit (local executor) job is
    SIGKILLed mid-training: the other job's result is summarized, the killed one is a failed row
    with failed.json, exit 1, no traceback; the same command again finishes it from last.ckpt."""
    sweep = tmp_path / "sweep"
    args = ["-m", "debug=fast", "logger=csv", "trainer.max_steps=20,150", "trainer.val_check_interval=10",
            "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "WANDB_MODE": "offline", "NO_COLOR": "1"}
    proc = start_command([NAS_RUN, *args], cwd=tmp_path, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and not glob_now(sweep, "1_*/checkpoints/last.ckpt"):
        time.sleep(0.5)
    (long_job,) = sweep.glob("1_*")
    # as scancel does, end the job's processes: the training process (it holds the run directory's
    # lock) and the local executor's process for the job
    pids = [json.loads((long_job / ".nas-run.lock").read_text())["pid"]]
    pids += [int(j.name) for j in (sweep / ".submitit").iterdir() if j.name.isdigit()]
    killed = 0
    for pid in pids:
        if (long_job / "summary.json").exists():
            break
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    out, err = proc.communicate(timeout=300)
    assert killed >= 1
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "1 of 2 jobs failed" in err
    failed = json.loads((long_job / "failed.json").read_text())
    assert failed["reason"].startswith("ended by the scheduler before it finished") and "failed" in out
    assert (next(sweep.glob("0_*")) / "summary.json").is_file()
    again = run_command([NAS_RUN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((long_job / "summary.json").read_text())
    assert summary["steps"] == 150 and summary.get("resumed_from") == "checkpoints/last.ckpt"


def test_an_optuna_sweep_with_a_storage_continues_its_study(tmp_path):
    # the storage conf/sweep/optuna.yaml suggests works (optuna 2 with SQLAlchemy < 2), and the
    # same command again adds trials to the stored study, in new job directories (none reused or skipped)
    import sqlite3

    args = ("-m", *TINY, "trainer.max_steps=6", "trainer.val_check_interval=3", "run_test=false", "sweep=optuna",
            "hydra.sweeper.n_trials=2", "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweep.dir=opt")
    first = nas_run(*args, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    again = nas_run(*args, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    dirs = sorted(p.name.split("_")[0] for p in (tmp_path / "opt").iterdir() if (p / "summary.json").is_file())
    assert dirs == ["0", "1", "2", "3"]
    assert not list((tmp_path / "opt").glob("*/.nas-run-kept-configs"))  # old trials are not launched again
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        states = [r[0] for r in db.execute("select state from trials")]
    assert len(states) == 4 and set(states) == {"COMPLETE"}
    values = [json.loads(p.read_text())["best_val"]["value"] for p in sorted((tmp_path / "opt").glob("*/summary.json"))]
    result = yaml.safe_load((tmp_path / "opt" / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(max(values))  # the best of all four trials


def test_joblib_gives_each_sweep_job_its_own_gpu():
    # job i of a joblib sweep gets GPU i mod G as its Lightning device list; CPU trainers and machines
    # without GPUs are left alone; a job asking for several devices is refused with one line
    from nas_cli.errors import UserError
    from nas_cli.infra.launchers import joblib_gpu

    assert [joblib_gpu(i, 4, "gpu", 1) for i in range(6)] == [[0], [1], [2], [3], [0], [1]]
    assert [joblib_gpu(i, 2, "auto", "auto") for i in range(3)] == [[0], [1], [0]]
    assert joblib_gpu(3, 0, "auto", 1) is None and joblib_gpu(3, 4, "cpu", 1) is None
    with pytest.raises(UserError, match=r"trainer.devices=2 needs several"):
        joblib_gpu(0, 4, "gpu", 2)


def test_a_busy_slurm_controller_does_not_end_a_requeued_job(tmp_path, monkeypatch):
    # a CI run once marked a preempted-and-requeued SLURM job as failed ("ended by the scheduler"). The wait asks
    # squeue whether the job is still queued; a controller too busy to answer (squeue exits 1, "Socket timed
    # out") or one answer without the job are not an ended job: it takes 3 answers without it. squeue here is a
    # script that plays back a sequence of answers (the real cluster's states: tests/cli/test_slurm.py).
    from types import SimpleNamespace

    from submitit.slurm.slurm import SlurmJob

    from nas_cli.infra.launchers import _still_queued

    def squeue(*answers):
        (tmp_path / "n").write_text("0")
        lines = ["#!/bin/sh", f'n=$(cat {tmp_path}/n); echo $((n + 1)) > {tmp_path}/n', 'case "$n" in']
        for i, (rc, out, err) in enumerate(answers):
            lines.append(f'{i}) printf "{out}"; printf "{err}" >&2; exit {rc};;')
        lines += ['*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;', "esac"]
        (tmp_path / "squeue").write_text("\n".join(lines) + "\n")
        (tmp_path / "squeue").chmod(0o755)

    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    job = SlurmJob(folder=tmp_path / "jobs", job_id="7")
    timeout = (1, "", "slurm_load_jobs error: Socket timed out on send/recv operation\\n")
    squeue(timeout, timeout, (0, "", ""), (0, "COMPLETING\\n", ""))
    assert _still_queued(job, pause_s=0)
    squeue((0, "", ""), timeout, (0, "", ""), (0, "PENDING\\n", ""))
    assert _still_queued(job, pause_s=0)
    squeue((0, "", ""), (0, "", ""), timeout)  # then "Invalid job id": the job is gone
    assert not _still_queued(job, pause_s=0)
    assert (tmp_path / "n").read_text().strip() == "4"  # decided after the third answer without it
    squeue(*[timeout] * 20)  # a controller that never answers: given up on after 12 looks
    assert not _still_queued(job, pause_s=0)
    assert (tmp_path / "n").read_text().strip() == "12"
    squeue((0, "RUNNING\\n", ""))  # hydra/launcher=submitit_local: a local process, never asked of squeue
    assert not _still_queued(SimpleNamespace(job_id="7"), pause_s=0)
    assert (tmp_path / "n").read_text().strip() == "0"
