"""``hydra/launcher=ray``: each job of a sweep runs as one Ray task, on a Ray cluster (``ray start``,
``ray up``, KubeRay) or on a Ray started on this machine.

* **Where**: ``hydra.launcher.ray.init`` are ``ray.init``'s arguments. ``address: null`` starts a
  Ray on this machine for the sweep (Ray's ``local``; ``RAY_ADDRESS`` still wins); ``auto`` joins the cluster this machine belongs to; ``ray://host:10001``
  a remote one through Ray Client. Joining a cluster, Ray refuses ``object_store_memory`` (it is
  the cluster's): it is dropped there.
* **Resources per job**, from the job's own config: ``num_cpus`` = its ``threads`` (1 when null:
  Ray then sets ``OMP_NUM_THREADS=1``, which nas-run's thread policy follows), ``num_gpus`` = its
  ``trainer.devices`` on a GPU trainer. ``hydra.launcher.ray.remote`` adds ``ray.remote`` options
  for every job (``memory``, ``resources``, ``runtime_env``; a ``num_cpus`` there wins). A job no
  node of the cluster can hold is refused before anything is submitted, in one line.
* **A job that fails fails alone**: a Ray worker killed mid-job (OOM killer, ``kill -9``, a lost
  node) is written down as the job's ``failed.json``; the others go on, and the same command
  again resumes it from its ``last.ckpt`` and skips the finished ones (as with joblib and SLURM).
  Ray retries no job (``max_retries=0``): a retry would race the rerun for the directory.
* **Stop**: Ctrl-C or SIGTERM to the sweep's process cancels each running job with Ray's
  ``ray.cancel``, which reaches the job as SIGINT: the job saves ``last.ckpt`` and ends; the
  process waits for them (at most two minutes; a second signal stops at once), then says how to
  continue.

Every node must see the sweep directory and the data at the same paths (shared storage) and have
nas-run installed (docs/scaling.md); a job runs in the directory the command was typed in, so that
relative paths (``hydra.sweep.dir=sw``, ``task.path=data/...``) mean what they meant there.
"""
from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from nas_cli.errors import UserError, fail, say
from nas_cli.infra.ray_train import NotedStops, forwarded_env

#: how long a stopping sweep waits for its Ray jobs to save, at most (as for joblib's workers)
WAIT_S = 120.0
#: ray.init's arguments that only a Ray started here takes
LOCAL_ONLY = ("object_store_memory", "num_cpus", "num_gpus", "resources", "include_dashboard", "_temp_dir")


def init_arguments(init: DictConfig | dict | None) -> dict[str, Any]:
    """``hydra.launcher.ray.init`` as ``ray.init``'s keyword arguments: on an existing cluster
    (``address`` set) without the options Ray refuses there, nulls dropped; a local Ray without a
    dashboard and with this machine's usage statistics off unless asked."""
    args = _plain(init)
    address = args.get("address")
    args = {k: v for k, v in args.items() if v is not None}
    args.setdefault("logging_level", "WARNING")  # not Ray's "Connecting to ..." lines in every sweep
    if address:
        return {k: v for k, v in args.items() if k not in LOCAL_ONLY}
    args.setdefault("include_dashboard", False)
    args["address"] = "local"  # a new Ray for this sweep, not a cluster that ray start left on this machine
    return args


def _plain(node) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def job_resources(cfg: DictConfig, remote: dict | None = None) -> dict[str, Any]:
    """The ``ray.remote`` options of one job: its CPUs from ``threads``, its GPUs from
    ``trainer.devices`` on a GPU trainer, then ``hydra.launcher.ray.remote``'s own options."""
    threads = cfg.get("threads")
    out: dict[str, Any] = {"num_cpus": int(threads) if threads else 1}
    trainer = cfg.get("trainer", {})
    if str(trainer.get("accelerator", "auto")).lower() in ("gpu", "cuda"):
        devices = trainer.get("devices", 1)
        out["num_gpus"] = len(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else \
            int(devices) if str(devices).isdigit() and int(devices) > 0 else 1
    out.update({k: v for k, v in (remote or {}).items() if v is not None})
    env = forwarded_env()
    if env:
        runtime = dict(out.get("runtime_env") or {})
        runtime["env_vars"] = {**env, **(runtime.get("env_vars") or {})}
        out["runtime_env"] = runtime
    return out


def refuse_unplaceable(needs: Sequence[tuple[int, dict]], nodes: Sequence[dict]) -> None:
    """One line if a job asks for more CPUs, GPUs or memory than any alive node has."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", n.get("alive", True))]
    for num, need in needs:
        want = {"CPU": need.get("num_cpus", 1), "GPU": need.get("num_gpus", 0), "memory": need.get("memory", 0),
                **(need.get("resources") or {})}
        if not any(all(node.get(k, 0) >= v for k, v in want.items() if v) for node in alive):
            biggest = max(alive, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
            asked = ", ".join(f"{k} {v:g}" for k, v in want.items() if v)
            has = ", ".join(f"{k} {biggest.get(k, 0):g}" for k in want if want[k])
            raise UserError(f"hydra/launcher=ray: job {num} asks for {asked}, more than any node of the Ray cluster "
                            f"has (the largest: {has}); lower threads / trainer.devices, or add a node that has it")


def refuse_multi_process(cfg: DictConfig, num: int) -> None:
    from nas_cli.infra.launchers import spawns_processes

    if str(cfg.trainer.get("strategy", "")) == "ray_ddp":
        raise UserError(f"hydra/launcher=ray runs job {num} as one Ray task, and trainer=ray_ddp trains a job on Ray "
                        "Train workers of its own: sweep trainer=ray_ddp jobs with the basic launcher (drop "
                        "hydra/launcher=ray; RAY_ADDRESS=auto puts each job's workers on the cluster)")
    if spawns_processes(cfg.trainer):
        raise UserError(f"hydra/launcher=ray runs job {num} as one Ray task, which cannot start Lightning's DDP/FSDP "
                        f"processes (trainer.devices={cfg.trainer.get('devices')}); use one device per job "
                        "(trainer.devices=1), or hydra/launcher=slurm (or the basic launcher) for multi-device jobs")


def _connect(init: dict[str, Any]) -> None:
    """ray.init, keeping nas-run's stop handlers (ray.init puts ``sys.exit`` on SIGTERM, which would
    end the sweep without letting its jobs save)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        ray.init(**init)
    except ConnectionError as err:
        raise UserError(f"hydra/launcher=ray: no Ray cluster at hydra.launcher.ray.init.address={init.get('address')} "
                        f"({str(err).strip().splitlines()[0][:160]}); start one (ray start --head) or leave "
                        "the address unset for a Ray on this machine") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def run_remote_job(hydra_context, sweep_config: DictConfig, task_function, singleton_state) -> dict[str, Any]:
    """What runs in the Ray worker: the Hydra job, as Hydra's own launchers run it. A job that
    exits (a stop, a refusal) returns its exit code instead of ending the worker."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    here = os.getcwd()
    launched_from = str(sweep_config.hydra.runtime.cwd)
    if os.path.isdir(launched_from):  # relative paths (hydra.sweep.dir=sw, task.path=data) as the command meant them
        os.chdir(launched_from)
    inherited = _hear_cancel()
    try:
        ret = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except SystemExit as exit_:
        return {"exit": exit_.code if isinstance(exit_.code, int) else 1, "pid": os.getpid()}
    finally:
        os.chdir(here)
        signal.signal(signal.SIGINT, inherited)
    return {"ret": ret, "pid": os.getpid()}


def _hear_cancel():
    """In a Ray worker, SIGINT is Ray's cancel (``ray.cancel`` raises it in the task's thread), not a
    terminal's Ctrl-C: a job must hear it even where the worker was started with SIGINT ignored,
    which every worker of a cluster started from a background shell job (``ray start ... &`` in a
    script, CI) inherits; there the job never heard the cancel and a stopped sweep ended with its
    jobs unsaved. Returns the handler to put back after the job."""
    inherited = signal.getsignal(signal.SIGINT)
    if inherited in (signal.SIG_IGN, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return inherited if inherited is not None else signal.SIG_DFL


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
    """Hydra's ``Launcher.launch`` for ``hydra/launcher=ray`` (the module's docstring)."""
    import ray
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    from nas_cli.infra.rundir import remove_unstarted_sweep

    setup_globals()
    config, hydra_context = launcher.config, launcher.hydra_context
    sweep_dir = Path(str(config.hydra.sweep.dir))
    remote = _plain(launcher.ray_cfg.get("remote"))
    jobs = []
    try:
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"ray_{num}"
                sweep_config.hydra.job.num = num
            refuse_multi_process(sweep_config, num)
            jobs.append((num, list(overrides), sweep_config, job_resources(sweep_config, remote)))
        _connect(init_arguments(launcher.ray_cfg.get("init")))
        refuse_unplaceable([(num, need) for num, _, _, need in jobs], ray.nodes())
    except UserError as err:
        remove_unstarted_sweep(sweep_dir)
        fail(str(err))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    say(f"nas-run: {len(jobs)} jobs as Ray tasks on {_cluster_words(ray)}", log=False)
    state = Singleton.get_state()
    refs, results = {}, {}
    with _NotedStops() as stops:  # a stop inside Ray's calls is noted, then acted on between them
        for num, overrides, sweep_config, need in jobs:
            if stops.signals:
                break
            task = ray.remote(max_retries=0, **need)(run_remote_job)
            refs[task.remote(hydra_context, sweep_config, launcher.task_function, state)] = (num, overrides)
        pending = list(refs)
        while pending and not stops.signals:
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                num, overrides = refs[ref]
                results[num] = _result(ref, num, overrides, sweep_dir)
        if stops.signals:
            _cancel_and_wait(pending, stops, refs)
    if stops.signals:
        stops.raise_first()
    return [results[num] for num, *_ in jobs]


class _NotedStops(NotedStops):
    """While the sweep waits on Ray, Ctrl-C / SIGTERM / SIGHUP are noted (:class:`NotedStops`). The first
    one stops the sweep (its jobs save first), a second one stops the wait at once; after the wait the
    first is raised as nas-run's own handlers raise it, and they print the line that says how to continue."""

    def raise_first(self) -> None:
        from nas_cli.infra.process import PROCESS
        from nas_cli.sweeps.supervision import ProcessStop

        PROCESS.stops.extend(self.signals)
        if self.signals[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise ProcessStop(self.signals[0])


def _result(ref, num: int, overrides, sweep_dir: Path):
    """The job's JobReturn; a job whose worker died (or that exited) as a failed job of the sweep."""
    import ray
    from hydra.core.utils import JobReturn, JobStatus

    from nas_cli.infra.launchers import ended_job

    try:
        out = ray.get(ref)
    except (ray.exceptions.RayError, OSError) as err:
        return ended_job(_RayJob(ref), err, num, overrides, sweep_dir)
    if "ret" in out:
        return out["ret"]
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = math.nan  # refused or stopped: the job said why in its own line
    return ret


class _RayJob:
    """What :func:`nas_cli.infra.launchers.ended_job` reads of a job: its id and state."""

    def __init__(self, ref):
        self.job_id = ref.task_id().hex()[:16]
        self.state = "worker died"


def _cancel_and_wait(pending: list, stops: _NotedStops, jobs: dict, wait_s: float = WAIT_S) -> None:
    """Cancel the jobs not finished (a running one gets SIGINT: it saves last.ckpt; a queued one never
    starts) and wait until they end, at most ``wait_s``, or until a second stop signal. ``jobs``: each
    job's (number, overrides) by its reference; a job still running after the wait is named, as the
    one that keeps its last periodic last.ckpt (its worker ends with this process)."""
    import time

    import ray

    if not pending:
        return
    say(f"nas-run: stopping: each of the {len(pending)} unfinished Ray job(s) saves its last.ckpt "
        f"(at most {wait_s:.0f} s; a second signal stops at once)", log=False)
    for ref in pending:
        try:
            ray.cancel(ref, force=False)
        except Exception:  # noqa: BLE001 - a job that ended meanwhile
            pass
    end = time.monotonic() + wait_s
    while pending and len(stops.signals) < 2 and time.monotonic() < end:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
    if pending:
        named = ", ".join(f"job {jobs[ref][0]} ({' '.join(jobs[ref][1]) or 'no overrides'})" for ref in pending)
        why = "a second signal" if len(stops.signals) >= 2 else f"not ended within {wait_s:.0f} s"
        say(f"nas-run: {named}: stopped at once ({why}); each resumes from its last periodic last.ckpt", log=False)


def _cluster_words(ray) -> str:
    try:
        total = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    except Exception:  # noqa: BLE001 - words only
        return "Ray"
    gpus = f", {total.get('GPU', 0):g} GPUs" if total.get("GPU") else ""
    return f"{nodes} node{'s' * (nodes != 1)} ({total.get('CPU', 0):g} CPUs{gpus})"
