"""A sweep on the CPU runs its jobs several at a time by default (nas_cli/pipeline/launch/sweep_launcher.py):
as many as the CPUs allow for one job's threads, with Hydra's joblib launcher; the user can still
choose one job at a time, and a job that takes a whole device keeps the sequential launcher."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf, open_dict, read_write

from helpers import run_command

NAS_RUN = str(Path(sys.executable).with_name("nas-run"))
FAST = ["debug=fast", "logger=csv", "diagnostics.plots=never", "run_test=false"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NAS_RUN_SWEEP_JOBS"}
    return {**env, **extra}


def _launcher(job: Path) -> dict:
    return yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]["launcher"]


def test_a_cpu_sweep_runs_its_jobs_two_at_a_time_on_two_cpus_and_continues(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cpus = len(os.sched_getaffinity(0))
    sweep = tmp_path / "s"
    args = [NAS_RUN, "-m", "attention=unas,dnas", "seed=1,2", *FAST, "progress_bar=true", "progress_lines=true",
            f"hydra.sweep.dir={sweep}"]
    proc = run_command(args, cwd=tmp_path, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = min(cpus, 4)
    assert f"nas-run: 4 jobs, {n} side by side on {cpus} CPUs (1 thread each" in proc.stdout + proc.stderr
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert _launcher(job)["n_jobs"] == n and "Joblib" in _launcher(job)["_target_"]
        summary = json.loads((job / "summary.json").read_text())
        assert summary["environment"]["threads"] == 1 and summary["steps"] == 20
        # progress as lines naming the job in the job's own log, not live bars that overwrite each other, and
        # not interleaved on the sweep's console, which has a line for the job when it is done
        log = (job / "nas_run.log").read_text()
        assert f"nas-run: {job.name}: step 2 of 20" in log
        assert f"nas-run: {job.name}: validation at step 20: val/exact_match" in log
        assert f"{job.name}: step" not in proc.stdout + proc.stderr and f"done: {sweep.name}" not in log
        assert f"done: {sweep.name}/{job.name}: " in proc.stdout + proc.stderr
    assert f"each job's progress is in its own log: {sweep}/<job>/nas_run.log" in proc.stdout + proc.stderr
    assert "hydra/launcher=joblib" in yaml.safe_load((sweep / "multirun.yaml").read_text())["hydra"]["overrides"]["hydra"]
    again = run_command(args, cwd=tmp_path, env=_env(), timeout=600)  # the same command continues the sweep
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 finished job(s) are skipped" in again.stdout + again.stderr


def test_the_user_can_still_run_the_jobs_one_after_another(tmp_path):
    for how, env in ((["hydra/launcher=basic"], _env()), ([], _env(NAS_RUN_SWEEP_JOBS="1"))):
        sweep = tmp_path / f"s{len(how)}"
        proc = run_command([NAS_RUN, "-m", "attention=unas,dnas", *how, *FAST, f"hydra.sweep.dir={sweep}"],
                           cwd=tmp_path, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "at a time" not in proc.stdout + proc.stderr
        for job in (p for p in sweep.iterdir() if p.is_dir()):
            assert "BasicLauncher" in _launcher(job)["_target_"]


def _config(tmp_path, overrides: list[str], swept: list[str], hydra: list[str] = ()):
    """The config RunGuard.on_multirun_start sees for ``nas-run -m <swept> <overrides>``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.pipeline.launch.resolvers import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, *hydra], return_hydra_config=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [*swept, *overrides]
        cfg.hydra.overrides.hydra = list(hydra)
    return cfg


@pytest.mark.parametrize("overrides, swept, hydra, expected", [
    ([], ["attention=unas,dnas,hnas", "model.heads=4,8", "seed=1,2,3"], [], 8),  # the README's grid: 18 jobs
    ([], ["seed=1,2,3"], [], 3),  # no more workers than jobs
    ([], ["seed=auto", "attention=unas,dnas"], [], 4),  # seed=auto: its first round (min_seeds 2 x 2 schemes)
    (["threads=4"], ["seed=1,2,3,4,5"], [], 2),  # 8 CPUs / 4 threads each
    (["threads=8"], ["seed=1,2"], [], 1),  # one job fills the CPUs
    (["trainer.accelerator=gpu"], ["seed=1,2"], [], 1),  # a job that takes a device
    (["trainer.strategy=ddp", "trainer.devices=2"], ["seed=1,2"], [], 1),  # DDP: processes per job
    ([], ["seed=1,2"], ["hydra/launcher=basic"], 1),  # the user's choice
    ([], ["seed=1,2"], ["hydra/sweeper=basic"], 2),  # Hydra's own sweeper named: still the default launcher
])
def test_how_many_jobs_at_a_time(tmp_path, monkeypatch, overrides, swept, hydra, expected):
    import nas_cli.pipeline.checks.sizing as sizing
    import nas_cli.pipeline.trainer as trainer
    from nas_cli.pipeline.launch.sweep_launcher import parallel_default
    from nas_cli.pipeline.trainer import JOB_THREADS_ENV

    monkeypatch.setattr(trainer, "cpus_allowed", lambda: 8)
    monkeypatch.setattr(sizing, "available_memory", lambda: 64 * 2 ** 30)
    monkeypatch.delenv("NAS_RUN_SWEEP_JOBS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(JOB_THREADS_ENV, "0")  # recorded, so that the value parallel_default sets is undone
    if "seed=auto" in swept:
        hydra = [*hydra, "hydra/sweeper=sequential"]
    cfg = _config(tmp_path, overrides, swept, hydra)
    assert parallel_default(cfg, 234_944) == expected
    launcher = OmegaConf.to_container(cfg.hydra.launcher)
    if expected > 1:
        assert launcher["n_jobs"] == expected and "Joblib" in launcher["_target_"]
        assert list(cfg.hydra.overrides.hydra)[-2:] == ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={expected}"]
        assert os.environ[JOB_THREADS_ENV] == str(8 // expected if "threads=4" in overrides else 1)
    else:
        assert "BasicLauncher" in launcher["_target_"] and os.environ[JOB_THREADS_ENV] == "0"
    monkeypatch.setenv("NAS_RUN_SWEEP_JOBS", "1")
    assert parallel_default(_config(tmp_path, overrides, swept, hydra), 234_944) == 1


def test_no_more_jobs_at_a_time_than_the_memory_holds(tmp_path, monkeypatch):
    """1 GiB per worker beside its model's weights, gradients and Adam state (16 bytes a parameter)."""
    import nas_cli.pipeline.checks.sizing as sizing
    import nas_cli.pipeline.trainer as trainer
    from nas_cli.pipeline.launch.sweep_launcher import parallel_default
    from nas_cli.pipeline.trainer import JOB_THREADS_ENV

    monkeypatch.setattr(trainer, "cpus_allowed", lambda: 8)
    monkeypatch.delenv("NAS_RUN_SWEEP_JOBS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(JOB_THREADS_ENV, "0")
    for gib, parameters, expected in ((3, 234_944, 2), (64, 234_944, 5), (3, 4_000_000, 2), (2.1, 4_000_000, 1)):
        monkeypatch.setattr(sizing, "available_memory", lambda gib=gib: int(gib * 2 ** 30))
        assert parallel_default(_config(tmp_path, [], ["seed=1,2,3,4,5"]), parameters) == expected, (gib, parameters)
