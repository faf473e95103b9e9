"""``trainer=ray_ddp``: one job trained with Lightning's DDP across Ray Train workers (Ray Train's
Lightning integration: ``RayDDPStrategy`` over the process group Ray Train sets up, ranks from
``RayLightningEnvironment``).

nas-run's process stays the job's owner (its directory lock, its refusals, its failed.json); the
training itself (``nas_cli.pipeline.run.train``, handed in) runs in each of the
``trainer.devices x trainer.num_nodes`` workers, as each process of ``trainer=ddp`` runs it: the
data sharded by rank (``nas_cli.infra.distributed``), one W&B run, the checkpoints and
``summary.json`` written by rank 0 into the run directory. So checkpoints, resume (``nas-run
resume=<run>``) and metrics are those of ``trainer=ddp``.

The cluster: a Ray started on this machine for the run, or the one ``RAY_ADDRESS`` names
(``RAY_ADDRESS=auto``: the cluster this machine belongs to). Each worker asks for ``threads`` CPUs
(1 when null) and, on a GPU trainer, one GPU. The run directory and the data must be at the same
paths on every node (shared storage): the workers and nas-run's process also talk through the run
directory's ``.ray_train/`` folder (Ray Train's storage, a stop request, a worker's refusal or
stop line), which is removed when the run ends.

A stop signal (Ctrl-C, SIGTERM, SIGHUP, SIGUSR1/2) reaches nas-run's process, not the workers'
training, which Ray Train runs outside each worker's main thread (where no signal handler runs):
nas-run's process writes the signal into ``.ray_train/stop``, each worker's watcher hands it to its
training (``PROCESS.asked_stop``), and the workers stop together at their next step after saving
``last.ckpt``, as ``trainer=ddp``'s processes do on the signal itself. nas-run's process waits for
them at most :data:`WAIT_S`; a second signal stops at once (the run then keeps its last periodic
``last.ckpt``). A stop during the final test lets the test finish.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from nas_cli.errors import Stopped, UserError, say
from nas_cli.infra.ray_output import quiet_ray_output, runtime_env

#: the strategy name of trainer=ray_ddp (conf/trainer/ray_ddp.yaml)
STRATEGY = "ray_ddp"
#: set in a Ray Train worker while it trains: trainer_kwargs builds Ray's strategy there
WORKER_ENV = "NAS_RUN_RAY_TRAIN_WORKER"
#: environment variables a job reads that nas-run passes on to its Ray workers (which the cluster
#: started, with the cluster's environment): nas-run's own, W&B's, Hugging Face's, Triton's
FORWARDED_PREFIXES = ("NAS_RUN_", "NAS_TRITON", "WANDB_", "HF_", "TRITON_")
FORWARDED = ("PYTHONWARNINGS", "NO_COLOR", "NETRC")
#: the run directory's folder where the job's process and its workers talk (module docstring)
SHARED = ".ray_train"
#: how long nas-run's process waits, after a stop signal, for the workers to save and end
WAIT_S = 120.0
#: in SHARED: a UserError a worker raised (a non-finite loss, a refused value), for the job's one line;
#: the stop signal asked of the workers; rank 0's stop line and exit status
_ERROR_FILE, _STOP_FILE, _STOPPED_FILE = "user_error.txt", "stop", "stopped.json"


def forwarded_env(environ=os.environ) -> dict[str, str]:
    """The variables of :data:`FORWARDED_PREFIXES` / :data:`FORWARDED` set here, for Ray's runtime_env."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED}


def on_ray(cfg: DictConfig) -> bool:
    """The job trains on Ray Train workers (``trainer.strategy=ray_ddp``)."""
    return str(cfg.trainer.get("strategy", "")) == STRATEGY


def workers(cfg: DictConfig) -> int:
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    if not str(devices).isdigit() or int(devices) < 1 or not str(nodes).isdigit() or int(nodes) < 1:
        raise UserError(f"trainer=ray_ddp: trainer.devices={devices} x trainer.num_nodes={nodes} is the number of Ray "
                        "Train workers; give both as positive integers (e.g. trainer.devices=2)")
    return int(devices) * int(nodes)


def strategy_arguments(tcfg: dict[str, Any]) -> dict[str, Any]:
    """Lightning's arguments for ``strategy: ray_ddp``: in a Ray Train worker, Ray's DDP strategy and
    cluster environment over this worker's one device; elsewhere (the pre-run checks) plain DDP."""
    if not os.environ.get(WORKER_ENV):
        return {**tcfg, "strategy": "ddp"}
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment

    plugins = list(tcfg.get("plugins") or [])
    return {**tcfg, "strategy": RayDDPStrategy(), "plugins": [*plugins, RayLightningEnvironment()], "devices": "auto",
            "num_nodes": 1}


def fit(train: Callable[..., Any], cfg: DictConfig, run_dir: Path, *args, **kwargs) -> dict[str, Any] | None:
    """Run ``train(cfg, ..., run_dir, ...)`` on the job's Ray Train workers; rank 0's summary."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    count = workers(cfg)
    gpu = str(cfg.trainer.get("accelerator", "cpu")).lower() in ("gpu", "cuda")
    threads = cfg.get("threads")
    _connect()
    shared = Path(run_dir).resolve() / SHARED
    shutil.rmtree(shared, ignore_errors=True)  # a request or a line left by a run killed before its end
    shared.mkdir(parents=True)
    loop = _worker_loop(train, cfg, run_dir, shared, os.getcwd(), args, kwargs)
    trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=count, use_gpu=gpu,
                                                              resources_per_worker={"CPU": int(threads) if threads
                                                                                    else 1}),
                           run_config=RunConfig(storage_path=str(shared), name="job",
                                                failure_config=FailureConfig(max_failures=0)))
    try:
        result, asked = _fit_until_stopped(trainer, shared / _STOP_FILE, run_dir, count)
        said = _words_of_workers(shared)
    except Stopped:
        raise
    except Exception:  # noqa: BLE001 - a worker's failure: its own one line when it was a UserError
        refused = shared / _ERROR_FILE
        if refused.is_file():
            raise UserError(refused.read_text()) from None
        raise
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    if said:  # the workers saved at the step of the stop
        raise Stopped(said["line"], int(said["code"]))
    if getattr(result, "error", None) is not None:
        raise result.error
    summary = Path(run_dir) / "summary.json"
    if asked:  # the stop came during the final test, which Ray Train workers finish: the run is complete
        raise Stopped(f"{signal.Signals(asked).name} during the final test, which finished: the run is complete "
                      f"({summary} written)", 128 + asked)
    return json.loads(summary.read_text()) if summary.is_file() else None


def _connect() -> None:
    """The Ray the workers run on: the one ``RAY_ADDRESS`` names, else one started here, with its
    dashboard, whose state API Ray Train's placement-group cleaner asks every few seconds."""
    import ray

    # a worker's print as it is: Ray Train's own print, on by default, printed every line of rank 0 twice
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    quiet_ray_output()
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=os.environ.get("RAY_ADDRESS") or "local", logging_level="WARNING",
                 runtime_env=runtime_env(forwarded_env()))


def _worker_loop(train: Callable[..., Any], cfg: DictConfig, run_dir: Path, shared: Path, launched_from: str,
                 args: tuple, kwargs: dict) -> Callable[[Any], None]:
    """What each Ray Train worker runs: the job's ``train``, as one process of ``trainer=ddp``, with a
    watcher for the stop its job's process asks for; a refusal or a stop said back through ``shared``."""

    def loop(_config) -> None:
        from pytorch_lightning.utilities import rank_zero_only
        import ray.train

        from nas_cli.errors import quiet_libraries
        from nas_cli.infra.process import PROCESS

        quiet_libraries()  # Lightning's banner and tips, as in nas-run's own process
        os.chdir(launched_from)  # relative paths as the command meant them
        os.environ[WORKER_ENV] = "1"
        rank = ray.train.get_context().get_world_rank()
        rank_zero_only.rank = rank
        if rank == 0:
            _log_to(run_dir / "nas_run.log")
        PROCESS.asked_stop = None
        watcher = _StopWatcher(shared / _STOP_FILE, PROCESS)
        try:
            train(cfg, *args, **kwargs)
        except UserError as err:
            (shared / _ERROR_FILE).write_text(str(err))
            raise
        except Stopped as stop:  # saved at the step of the stop: said by rank 0, the job's process ends with it
            if rank == 0:
                (shared / _STOPPED_FILE).write_text(json.dumps({"line": str(stop), "code": stop.code}))
        finally:
            watcher.close()

    return loop


def _words_of_workers(shared: Path) -> dict[str, Any] | None:
    """Rank 0's stop line and exit status, when the workers stopped on a request."""
    try:
        return json.loads((shared / _STOPPED_FILE).read_text())
    except (OSError, ValueError):
        return None


def _fit_until_stopped(trainer, request: Path, run_dir: Path, count: int, wait_s: float = WAIT_S):
    """``trainer.fit()`` in a thread of its own while this (main) thread waits for it with nas-run's
    stop handling (module docstring); returns fit's result and the stop signal asked of the workers
    (0: none). Ray Train's own SIGINT handler, which would end the workers without a save, is
    installed only from the main thread: never, then."""
    from nas_cli.infra.fault_tolerance import ONE_STOP_SECONDS, STOP_SIGNALS

    if threading.current_thread() is not threading.main_thread():
        return trainer.fit(), 0
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err

    fitting = threading.Thread(target=run, name="nas-run ray_ddp fit", daemon=True)
    asked = 0
    with NotedStops(STOP_SIGNALS) as stops:
        noted = stops.noted
        fitting.start()
        while fitting.is_alive():
            fitting.join(0.25)
            if noted and not asked:
                asked = noted[0][0]
                request.write_text(str(asked))
                say(f"nas-run: stopping: the {count} Ray Train workers save checkpoints/last.ckpt at their next step "
                    f"(at most {wait_s:.0f} s; a second signal stops at once)")
            late = asked and time.monotonic() - noted[0][1] > wait_s
            again = any(s == asked and at - noted[0][1] >= ONE_STOP_SECONDS for s, at in noted[1:])
            if fitting.is_alive() and (late or again):
                why = f"did not stop within {wait_s:.0f} s" if late else "were stopped at once (a second signal)"
                raise Stopped(f"{signal.Signals(asked).name}: the Ray Train workers {why}; the run keeps its last "
                              f"periodic checkpoints/last.ckpt (no summary.json); continue with: nas-run "
                              f"resume={run_dir}", 128 + asked)
    if "error" in box:
        raise box["error"]
    return box["result"], asked


class NotedStops:
    """While nas-run's process waits on Ray (a sweep's tasks, a job's Ray Train workers), stop signals
    are noted, with when they came, instead of raised: raised inside Ray's own calls they came out as
    a SystemError traceback. The waiting code acts on them between its calls. ``signals``: those
    noted (default: Ctrl-C, SIGTERM, SIGHUP); one a shell or ``nohup`` left ignored stays ignored."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        self.watched = tuple(signals)
        self.noted: list[tuple[int, float]] = []
        self.previous: dict = {}

    @property
    def signals(self) -> list[int]:
        return [signum for signum, _ in self.noted]

    def _note(self, signum, frame) -> None:
        self.noted.append((signum, time.monotonic()))

    def __enter__(self):
        for sig in self.watched:
            handler = signal.getsignal(sig)
            if handler not in (signal.SIG_IGN, None):
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class _StopWatcher:
    """In a Ray Train worker: a thread that hands a stop the job's process wrote into ``request`` to
    the worker's training (``process.asked_stop``), which stops at its next step."""

    def __init__(self, request: Path, process, every_s: float = 0.25):
        self.request, self.process, self.every_s = request, process, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="nas-run stop watcher", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                text = self.request.read_text().strip()
            except OSError:
                continue
            self.process.asked_stop = int(text) if text.isdigit() else int(signal.SIGTERM)
            return

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)


def _log_to(path: Path) -> None:
    """Rank 0's lines for the job's log (``record``: the nas_run logger's file handlers), appended."""
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    handler.setLevel(logging.WARNING)  # libraries' warnings; record()'s lines are handed to it directly
    logging.getLogger().addHandler(handler)  # where nas_cli.errors.record finds the job's log
