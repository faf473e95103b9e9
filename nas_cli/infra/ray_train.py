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
paths on every node (shared storage).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from nas_cli.errors import UserError

#: the strategy name of trainer=ray_ddp (conf/trainer/ray_ddp.yaml)
STRATEGY = "ray_ddp"
#: set in a Ray Train worker while it trains: trainer_kwargs builds Ray's strategy there
WORKER_ENV = "NAS_RUN_RAY_TRAIN_WORKER"
#: environment variables a job reads that nas-run passes on to its Ray workers (which the cluster
#: started, with the cluster's environment): nas-run's own, W&B's, Hugging Face's, Triton's
FORWARDED_PREFIXES = ("NAS_RUN_", "NAS_TRITON", "WANDB_", "HF_", "TRITON_")
FORWARDED = ("PYTHONWARNINGS", "NO_COLOR", "NETRC")
#: a UserError a worker raised (a non-finite loss, a refused value), for the job's one line
_ERROR_FILE = "user_error.txt"


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
    import json

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    count = workers(cfg)
    gpu = str(cfg.trainer.get("accelerator", "cpu")).lower() in ("gpu", "cuda")
    threads = cfg.get("threads")
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = os.environ.get("RAY_ADDRESS") or "local"
        local = {"include_dashboard": False} if address == "local" else {}
        ray.init(address=address, logging_level="WARNING", runtime_env={"env_vars": forwarded_env()}, **local)
    storage = Path(tempfile.mkdtemp(prefix="nas-run-ray-train-"))
    launched_from = os.getcwd()

    def loop(_config) -> None:
        from pytorch_lightning.utilities import rank_zero_only
        import ray.train

        os.chdir(launched_from)  # relative paths as the command meant them
        os.environ[WORKER_ENV] = "1"
        rank = ray.train.get_context().get_world_rank()
        rank_zero_only.rank = rank
        if rank == 0:
            _log_to(run_dir / "nas_run.log")
        try:
            train(cfg, *args, **kwargs)
        except UserError as err:
            (storage / _ERROR_FILE).write_text(str(err))
            raise

    trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=count, use_gpu=gpu,
                                                              resources_per_worker={"CPU": int(threads) if threads
                                                                                    else 1}),
                           run_config=RunConfig(storage_path=str(storage), name="job",
                                                failure_config=FailureConfig(max_failures=0)))
    try:
        result = trainer.fit()
    except Exception as err:  # noqa: BLE001 - a worker's failure: its own one line when it was a UserError
        said = storage / _ERROR_FILE
        if said.is_file():
            raise UserError(said.read_text()) from None
        raise
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    if getattr(result, "error", None) is not None:
        raise result.error
    summary = Path(run_dir) / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else None


def _log_to(path: Path) -> None:
    """Rank 0's lines for the job's log (``record``: the nas_run logger's file handlers), appended."""
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    handler.setLevel(logging.WARNING)  # libraries' warnings; record()'s lines are handed to it directly
    logging.getLogger().addHandler(handler)  # where nas_cli.errors.record finds the job's log
