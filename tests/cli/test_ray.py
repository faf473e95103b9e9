"""``hydra/launcher=ray`` and ``trainer=ray_ddp`` against a real local Ray cluster of two nodes, one CPU
each (tests/ray_cluster.py: ``ray start --head`` in a temporary directory, a second node at its own
address, ``ray stop`` at the end): sweeps as Ray tasks on both nodes, nas-report over them, a killed
worker, stops, resources per job, one job's DDP across the two nodes. Skipped, with the reason, where Ray is not
installed (``pip install -e ".[ray]"``; CI installs it)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import NAS_RUN, glob_now, run_command, start_command
from omegaconf import OmegaConf
from ray_cluster import RayCluster, available

from nas_cli.errors import UserError
from nas_cli.infra.wandb_offline import read_run
from nas_cli.sweeps.ray_engine import init_arguments, job_resources, refuse_unplaceable

NAS_REPORT = str(Path(NAS_RUN).with_name("nas-report"))
SKIP = available()
needs_ray = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
pytestmark = pytest.mark.xdist_group("ray")  # one worker: one cluster at a time
RAY = ("-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=auto")
TINY = ("task=reverse", "model=tiny", "progress_bar=false")
#: the budget of the trainer=ray_ddp test: a stop after the first validation (step 25) lands well before it
STEPS = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if SKIP:
        pytest.skip(SKIP)
    with RayCluster(tmp_path_factory.mktemp("ray")) as c:
        yield c


def _run(cluster, *args, cwd, timeout=600):
    return run_command([NAS_RUN, *args], cwd=cwd, env=cluster.env, timeout=timeout)


@needs_ray
def test_a_sweep_runs_as_ray_tasks_each_an_ordinary_run_that_nas_report_reads(cluster, tmp_path):
    proc = _run(cluster, *RAY, "attention=unas,dnas", "seed=1,2", *TINY, "debug=fast", "hydra.sweep.dir=sw",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 jobs as Ray tasks on 2 nodes (2 CPUs)" in proc.stderr
    jobs = sorted(p for p in (tmp_path / "sw").iterdir() if p.is_dir())
    assert len(jobs) == 4
    pids, workers, nodes = set(), set(), set()
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        env = summary["environment"]
        assert env["threads"] == 1 and env["ray"]["task_id"] and env["ray"]["worker_id"]  # in a Ray task, 1 CPU
        pids.add(env["pid"])
        workers.add(env["ray"]["worker_id"])
        nodes.add(env["ray"]["node_id"])
        wb = read_run(job / "wandb")  # its W&B run (offline) in the sweep's group
        assert wb["group"] == "sw" and wb["id"] == summary["wandb_run_id"]
    assert os.getpid() not in pids and len(workers) >= 2  # the jobs ran in Ray's worker processes, side by side
    assert len(nodes) == 2  # one CPU per node: the jobs ran on both nodes
    report = run_command([NAS_REPORT, "sw", "--baseline", "scheme=unas", "--format", "json", "--metrics", "ppl",
                          "--no-item-tests"], cwd=tmp_path, env=cluster.env)
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert [g["n"] for g in doc["runs"]["groups"]] == [2, 2] and doc["comparison"]["rows"][0]["seeds"] == [1, 2]


def _wait_for(path_glob, root: Path, timeout: float = 300) -> list[Path]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = glob_now(root, path_glob)
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {path_glob} under {root} after {timeout} s")


def _terminated(proc, timeout: float) -> str:
    """SIGTERM to a started command (unless it ended already), its stderr once it ends; killed if it hangs."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def _resume(run: Path, steps: int, cwd: Path, env: dict) -> None:
    """``nas-run resume=<run> trainer.max_steps=<steps>``: it continues from last.ckpt and finishes there."""
    resumed = run_command([NAS_RUN, f"resume={run}", f"trainer.max_steps={steps}"], cwd=cwd, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from last.ckpt" in (run / "nas_run.log").read_text()
    assert json.loads((run / "summary.json").read_text())["steps"] == steps


@needs_ray
def test_a_killed_ray_worker_fails_its_job_alone_and_the_same_command_resumes_it(cluster, tmp_path):
    args = (*RAY, "trainer.max_steps=30,200", *TINY, "trainer.val_check_interval=100", "checkpoint.last_every_n_steps=20",
            "logger=csv", "hydra.sweep.dir=sw")
    sweep = start_command([NAS_RUN, *args], cwd=tmp_path, env=cluster.env)
    try:
        long_job = tmp_path / "sw" / "1_reverse_unas-h4"
        _wait_for("1_*/checkpoints/last.ckpt", tmp_path / "sw")
        holder = json.loads((long_job / ".nas-run.lock").read_text())["pid"]
        assert holder in cluster.workers()  # the job trains in a Ray worker process
        os.kill(holder, signal.SIGKILL)
        out, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode != 0 and "1 of 2 jobs failed" in err, err[-3000:]
    assert (tmp_path / "sw" / "0_reverse_unas-h4" / "summary.json").is_file()
    failed = json.loads((long_job / "failed.json").read_text())
    assert "worker died" in failed["reason"] and not (long_job / "summary.json").exists()
    again = _run(cluster, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0_reverse_unas-h4: finished in an earlier launch of this sweep: skipped" in again.stdout + again.stderr
    log = (long_job / "nas_run.log").read_text()
    assert "resumed from last.ckpt" in log or "resumed from" in log
    assert json.loads((long_job / "summary.json").read_text())["steps"] == 200
    assert not (long_job / "failed.json").exists()


@needs_ray
def test_a_stop_lets_every_ray_job_save_and_each_resumes_from_there(cluster, tmp_path):
    """SIGTERM to a 2-job sweep once both train: each job saves last.ckpt at the step the cancel reached it, says so
    in its log, and resume= continues it from there. A budget no job can finish before the other starts; that the
    same command continues a sweep through Ray is the killed-worker test's."""
    args = (*RAY, "attention=unas,dnas", *TINY, "trainer.max_steps=5000", "trainer.val_check_interval=300",
            "checkpoint.last_every_n_steps=20", "logger=none", "hydra.sweep.dir=sw")
    sweep = start_command([NAS_RUN, *args], cwd=tmp_path, env=cluster.env)
    try:
        end = time.monotonic() + 300  # both jobs training: each has written a periodic last.ckpt
        while len(glob_now(tmp_path / "sw", "*/checkpoints/last.ckpt")) < 2 and time.monotonic() < end:
            time.sleep(0.5)
        time.sleep(1)
    finally:
        err = _terminated(sweep, timeout=200)
    assert sweep.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "each of the 2 unfinished Ray job(s) saves its last.ckpt" in err and "Traceback" not in err
    assert "the same command with hydra.sweep.dir=sw continues the sweep" in err
    # each job saved at the step the stop reached it (not only at its last periodic checkpoint), as its log says
    # (its lines on the terminal come through Ray's log stream, which may end before they arrive)
    jobs = sorted(p for p in (tmp_path / "sw").iterdir() if p.is_dir())
    assert len(jobs) == 2 and not any((j / "summary.json").exists() for j in jobs)
    for job in jobs:
        said = re.search(r"stopped: SIGINT during (?:training|validation) at step (\d+) \(checkpoints/last\.ckpt saved",
                         (job / "nas_run.log").read_text())
        assert said, (job / "nas_run.log").read_text()[-2000:] + err[-2000:]
        assert torch_step(job / "checkpoints" / "last.ckpt") == int(said.group(1)) < 5000
    job = jobs[0]  # what it saved is a run to continue: 10 more steps from the step of the stop
    step = torch_step(job / "checkpoints" / "last.ckpt")
    _resume(job, step + 10, cwd=tmp_path, env=cluster.env)


@needs_ray
def test_a_job_no_node_can_hold_is_refused_before_the_sweep_in_one_line(cluster, tmp_path):
    proc = _run(cluster, *RAY, "threads=1,8", *TINY, "debug=fast", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "hydra/launcher=ray: job 1 asks for CPU 8, more than any node of the Ray cluster has (the largest: " \
           "CPU 1)" in line
    assert not (tmp_path / "sw").exists()


def test_resources_per_job_come_from_its_threads_and_devices():
    def cfg(**kw):
        return OmegaConf.create({"threads": kw.get("threads"), "trainer": {"accelerator": kw.get("acc", "cpu"),
                                                                          "devices": kw.get("devices", 1)}})
    assert job_resources(cfg())["num_cpus"] == 1 and "num_gpus" not in job_resources(cfg())
    assert job_resources(cfg(threads=4))["num_cpus"] == 4
    assert job_resources(cfg(acc="gpu", devices=2))["num_gpus"] == 2
    assert job_resources(cfg(acc="gpu", devices=[0, 3]))["num_gpus"] == 2
    assert job_resources(cfg(acc="gpu", devices="auto"))["num_gpus"] == 1
    assert job_resources(cfg(threads=4), {"num_cpus": 6, "memory": 2e9})["num_cpus"] == 6
    nodes = [{"Alive": True, "Resources": {"CPU": 8, "GPU": 1}}, {"Alive": True, "Resources": {"CPU": 16}},
             {"Alive": False, "Resources": {"CPU": 64, "GPU": 8}}]
    refuse_unplaceable([(0, {"num_cpus": 16}), (1, {"num_cpus": 8, "num_gpus": 1})], nodes)
    with pytest.raises(UserError, match=r"job 3 asks for CPU 1, GPU 2, more than any node .* \(the largest: CPU 8, GPU 1\)"):
        refuse_unplaceable([(3, {"num_cpus": 1, "num_gpus": 2})], nodes)  # the dead node's 8 GPUs do not count


def test_joining_a_cluster_drops_what_ray_refuses_there():
    local = init_arguments({"address": None, "object_store_memory": 78643200})
    assert local["object_store_memory"] == 78643200 and local["include_dashboard"] is False
    assert local["address"] == "local"  # a Ray of its own, even where ray start left a cluster
    joined = init_arguments({"address": "auto", "object_store_memory": 78643200, "num_cpus": 4})
    assert joined["address"] == "auto" and "object_store_memory" not in joined and "num_cpus" not in joined


def test_hydra_launcher_ray_without_ray_is_one_line_naming_the_extra(tmp_path):
    hide = tmp_path / "no_ray"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None  # as if Ray were not installed\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    # a process of its own (not one forked from the test server, which started without the hiding)
    proc = subprocess.run([NAS_RUN, "-m", "hydra/launcher=ray", "seed=1,2", *TINY, "hydra.sweep.dir=sw"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ['nas-run: error: hydra/launcher=ray: Ray is not installed; install '
                                                'nas-run with its ray extra: pip install "nas-run[ray]" (from a '
                                                'checkout: pip install -e ".[ray]")']
    assert not (tmp_path / "sw").exists()


@needs_ray
def test_ray_ddp_on_two_nodes_stops_at_a_saved_step_and_resumed_equals_trainer_ddp(cluster, tmp_path):
    """trainer=ray_ddp: Lightning's DDP over 2 Ray Train workers (gloo), one on each node of the test cluster.
    SIGTERM to nas-run's process once training is on: both workers stop at the same step after saving last.ckpt
    there (periodic saves are off), with trainer=ddp's line and exit status, and the folder the process and its
    workers talk through is gone. resume= then trains it to the end, and every test and validation number equals
    those of trainer=ddp's 2 processes trained to the end at once (the tolerance of the DDP tests)."""
    common = (*TINY, "debug=fast", f"trainer.max_steps={STEPS}", "trainer.val_check_interval=25",
              "checkpoint.last_every_n_steps=0", "eval_batch_items=null", "logger=csv")
    ray_env = {**cluster.env, "RAY_ADDRESS": "auto"}
    run = tmp_path / "ray"
    proc = start_command([NAS_RUN, "trainer=ray_ddp", *common, f"hydra.run.dir={run}"], cwd=tmp_path, env=ray_env)
    try:
        _wait_for("checkpoints/last.ckpt", run)  # written after the first validation (step 25): training is on
        sent = time.time()
    finally:
        err = _terminated(proc, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert re.search(r"world_rank=\d, local_rank=0, node_rank=1\b", err)  # Ray Train's line: a worker per node
    assert "\x1b" not in err and "core_worker.cc" not in err and "Token authentication" not in err  # no Ray noise
    assert "the 2 Ray Train workers save checkpoints/last.ckpt at their next step" in err and "Traceback" not in err
    said = re.search(r"stopped: SIGTERM during training at step (\d+) \(checkpoints/last\.ckpt saved; no "
                     r"summary\.json\); continue with: nas-run resume=", err)
    assert said, err[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    assert torch_step(last) == int(said.group(1)) < STEPS and last.stat().st_mtime >= sent  # saved by the stop
    assert not (run / "summary.json").exists() and not (run / ".ray_train").exists()
    _resume(run, STEPS, cwd=tmp_path, env=ray_env)
    ddp = run_command([NAS_RUN, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                       "trainer.precision=32-true", *common, "hydra.run.dir=ddp"], cwd=tmp_path, env=cluster.env,
                      timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    on_ray, plain = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("ray", "ddp"))
    assert on_ray["processes"] == plain["processes"] == 2 and on_ray["steps"] == plain["steps"] == STEPS
    assert on_ray["environment"]["ray"]["worker_id"] and "ray" not in plain["environment"]  # rank 0 was a Ray worker
    for key, value in plain["test"].items():
        assert on_ray["test"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert on_ray["best_val"]["value"] == pytest.approx(plain["best_val"]["value"], rel=1e-5, abs=1e-6)


class _Fitting:
    """What the wait of trainer=ray_ddp's process reads of Ray Train's trainer: a ``fit()`` that blocks until
    released. The real trainer's stop is the two-node test above; this checks the wait's own limits."""

    def __init__(self):
        self.release = threading.Event()

    def fit(self):
        self.release.wait(60)
        return "result"


@pytest.mark.parametrize("second", [True, False], ids=["second-signal", "time-limit"])
def test_the_wait_of_a_ray_ddp_run_ends_at_a_second_signal_or_at_its_limit(tmp_path, second):
    from nas_cli.errors import Stopped
    from nas_cli.infra import fault_tolerance  # noqa: F401 - imported before the signals come (Lightning: seconds)
    from nas_cli.infra.ray_train import _fit_until_stopped

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    fitting, request, before = _Fitting(), tmp_path / "stop", signal.getsignal(signal.SIGTERM)
    timers = [threading.Timer(at, os.kill, (os.getpid(), signal.SIGTERM)) for at in ((0.5, 2.0) if second else (0.5,))]
    for timer in timers:
        timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(Stopped) as stop:
            _fit_until_stopped(fitting, request, tmp_path / "run", 2, wait_s=30 if second else 3)
    finally:
        fitting.release.set()
        for timer in timers:
            timer.cancel()
    took = time.monotonic() - start
    assert request.read_text() == str(int(signal.SIGTERM))  # what the workers' watchers read
    assert stop.value.code == 128 + signal.SIGTERM and f"resume={tmp_path / 'run'}" in str(stop.value)
    why = "were stopped at once (a second signal)" if second else "did not stop within 3 s"
    assert f"SIGTERM: the Ray Train workers {why}; the run keeps its last periodic" in str(stop.value)
    assert (2.0 if second else 3.5) <= took < (10 if second else 12)
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handler back


def torch_step(ckpt: Path) -> int:
    import torch

    return torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]


@needs_ray
def test_seed_auto_launches_each_round_of_seeds_through_ray(cluster, tmp_path):
    """seed=auto's sequential sweeper launches its rounds through hydra/launcher=ray: every job a Ray task, no seed
    twice, the decision written down (tests/cli/test_sequential_sweep.py checks the decisions themselves)."""
    proc = _run(cluster, *RAY, "attention=unas,dnas", "seed=auto", *TINY, "debug=fast", "diagnostics.plots=never",
                "hydra.sweeper.max_seeds=3", "hydra.sweeper.metric=ppl", "logger=none", "hydra.sweep.dir=seq",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "jobs as Ray tasks" in proc.stderr
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "seq").glob("*/summary.json"))]
    runs = [(s["scheme"], s["seed"]) for s in summaries]
    assert len(runs) == len(set(runs)) >= 4 and all(s["environment"]["ray"]["task_id"] for s in summaries)
    (comp,) = json.loads((tmp_path / "seq" / "sequential.json").read_text())["comparisons"]
    n = comp["looks"][-1]["n"]
    assert comp["decision"] in ("higher", "lower", "undecided") and n in (2, 3)
    assert sorted(runs) == sorted((s, k) for s in ("unas", "dnas") for k in range(1, n + 1))


def test_a_ray_ddp_runs_output_leaves_out_rays_core_log_and_colour_codes(monkeypatch, capsys):
    """What the driver prints of its workers' lines (Ray's print_worker_logs): the lines of Ray's C++ core's
    log dropped, the rest kept, and no colour codes where stdout is not a terminal."""
    from ray._private import worker as ray_worker

    from nas_cli.infra import ray_output

    monkeypatch.setattr(ray_worker, "print_worker_logs", ray_worker.print_worker_logs)
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.setattr(ray_output.sys.stdout, "isatty", lambda: False, raising=False)
    ray_output.quiet_ray_output()
    import sys

    data = {"pid": "4242", "ip": "1", "localhost": "1", "actor_name": "TrainController", "is_err": True,
            "lines": ["[2026-12-01 20:43:46,234 E 18234 18273] core_worker.cc:2465: Actor with class name: 'X'",
                      "- (ip=10.0.0.2, pid=7) world_rank=0, local_rank=0, node_rank=1"]}
    ray_worker.print_worker_logs(data, sys.stderr)
    err = capsys.readouterr().err
    assert "core_worker.cc" not in err and "node_rank=1" in err and "\x1b" not in err, err


def test_ray_trains_timeout_warning_on_a_busy_machine_is_one_line_after_ray_trains_own_logging(capsys):
    """In Ray Train's controller, a resource request to the autoscaling coordinator that times out on a busy
    machine is logged as a warning with the traceback of the timeout (which failed the stop test on a loaded
    2-core machine). With the run's setup hook run first (as Ray runs it in each process) and Ray Train's
    own logging configuration applied after it, the real client's warning is one line naming the timeout, no
    traceback; the warning itself is kept. The hook is what the run's runtime_env names."""
    import logging
    import logging.config

    import ray.exceptions
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as client_module

    from nas_cli.infra import ray_output

    env = ray_output.runtime_env({"NAS_RUN_X": "1"})
    assert env["env_vars"] == {"NAS_RUN_X": "1"}
    module, _, name = env["worker_process_setup_hook"].rpartition(".")
    getattr(__import__(module, fromlist=[name]), name)()  # as Ray's load_and_execute_setup_hook_module does

    own = logging.getLogger(client_module.__name__)
    ray_train_logger = logging.getLogger("ray.train")
    kept = ray_train_logger.level, ray_train_logger.propagate, ray_train_logger.handlers[:]
    try:
        ray_output.quiet_worker()  # a second run adds nothing
        assert [type(f) for f in own.filters] == [ray_output.OneLineWarning]
        # Ray Train's dictConfig on the "ray.train" logger, as in its controller (LoggingManager), after the hook
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                                   "handlers": {"console": {"class": "logging.StreamHandler",
                                                            "stream": "ext://sys.stderr"}},
                                   "loggers": {"ray.train": {"level": "DEBUG", "handlers": ["console"],
                                                             "propagate": False}}})
        client = client_module.TrainAutoscalingCoordinatorClient("train-test")

        class Slow:
            class request_resources:  # noqa: N801 - the actor method Ray Train calls
                @staticmethod
                def remote(**kwargs):
                    raise ray.exceptions.GetTimeoutError("Get timed out: some object(s) not ready.")

        client.__dict__["_autoscaling_coordinator"] = Slow()
        from ray.train import ScalingConfig

        client.send_resource_request(ScalingConfig(num_workers=2), 2)
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in err, err
        assert "Failed to send resource request for train-test" in lines[0], err
        assert "GetTimeoutError: Get timed out" in lines[0], err
    finally:
        ray_train_logger.setLevel(kept[0])
        ray_train_logger.propagate, ray_train_logger.handlers[:] = kept[1], kept[2]
