"""The Lightning Trainer as a run gets it: its keyword arguments from ``cfg.trainer``, a check
that Lightning accepts them (before any data, model or W&B run exists), and ``compile=``."""
from __future__ import annotations

import os
import sys
import platform
import re
import warnings
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from nas_cli.errors import UserError
from nas_cli.infra import ray_train
from nas_cli.errors import unwrap as _unwrap


def _debug_fast() -> bool:
    """Whether the run is a ``debug=fast`` one (its 20 steps win over a token budget)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get("debug") == "fast"
    except (ValueError, AttributeError):  # not inside a Hydra run
        return False


def budget_steps(cfg: DictConfig, task) -> int | None:
    """``train_tokens``: the optimizer steps that train that many input tokens (rounded up), or None."""
    tokens = cfg.get("train_tokens")
    if not tokens or task is None or _debug_fast():
        return None
    per_step = task.tokens_per_step(cfg.get("train_batch_items"))
    if not per_step:
        raise UserError(f"train_tokens={tokens}: task '{getattr(task, 'name', '?')}' has batches of varying size, "
                        "so a token budget has no fixed number of steps; set trainer.max_steps instead")
    per_step *= int(cfg.trainer.get("accumulate_grad_batches") or 1)
    return -(-int(tokens) // per_step)


def trainer_kwargs(cfg: DictConfig, task=None) -> dict[str, Any]:
    tcfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    steps = budget_steps(cfg, task)
    if steps is not None:  # a token budget: the steps it makes, whatever trainer.max_steps said
        tcfg["max_steps"] = steps
    if isinstance(tcfg.get("strategy"), dict):  # e.g. trainer=fsdp: {_target_: nas_cli.pipeline.trainer.fsdp_strategy, ...}
        try:
            tcfg["strategy"] = instantiate(cfg.trainer.strategy)
        except InstantiationException as err:
            raise UserError(f"trainer.strategy: {_unwrap(err)}") from err
    if tcfg.get("strategy") == ray_train.STRATEGY:  # trainer=ray_ddp: Ray's DDP in a Ray Train worker
        tcfg = ray_train.strategy_arguments(tcfg)
    # nas-run shards the data itself (nas_cli.infra.distributed): no DistributedSampler, nothing padded or repeated
    tcfg["use_distributed_sampler"] = False
    if isinstance(tcfg.get("max_steps"), int) and tcfg["max_steps"] > 0:
        # a step budget takes precedence, as conf/trainer/default.yaml promises: the epoch limit would
        # otherwise stop the run first (and "resume with more steps" would train nothing)
        tcfg["max_epochs"] = -1
    return tcfg


#: the threads each job of a sweep that runs its jobs several at a time trains with (set by the sweep's
#: process, nas_cli/pipeline/launch/sweep_launcher.py; read by its jobs)
JOB_THREADS_ENV = "NAS_RUN_JOB_THREADS"

#: a CPU run of a model with fewer parameters uses one thread: for these sizes a second thread buys
#: almost nothing on a quiet machine and, beside other busy processes, its OpenMP threads wait on
#: each other (benchmarks/threads.py, docs/benchmarks.md "CPU threads")
ONE_THREAD_BELOW = 5_000_000


def cpus_allowed() -> int:
    """The CPUs this process may use: its affinity (a container's or taskset's limit), at most the
    CPUs SLURM allotted the task (``SLURM_CPUS_PER_TASK``)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    allotted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(count, int(allotted)) if allotted.isdigit() and int(allotted) > 0 else count


def choose_threads(cfg: DictConfig, parameters: int, on_cpu: bool) -> tuple[int, str]:
    """(threads, why): ``threads=N`` as given; else a parallel sweep's share (its jobs' threads, as the
    sweep chose them: :mod:`~nas_cli.pipeline.launch.sweep_launcher`); else ``OMP_NUM_THREADS``; else, training on the CPU, one
    thread below :data:`ONE_THREAD_BELOW` parameters; else every CPU the process may use."""
    if cfg.get("threads") is not None:
        return int(cfg.threads), "threads="
    shared = os.environ.get(JOB_THREADS_ENV, "")
    if shared.isdigit() and int(shared) > 0:  # before OMP_NUM_THREADS, which joblib's workers set
        return int(shared), "a parallel sweep's share of the CPUs"
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    if on_cpu and parameters < ONE_THREAD_BELOW:
        return 1, f"model below {ONE_THREAD_BELOW:,} parameters"
    return cpus_allowed(), "the CPUs allowed"


def set_threads(cfg: DictConfig, parameters: int) -> str:
    """Set torch's CPU threads for this job (:func:`choose_threads`); returns why, for summary.json."""
    accel = str(cfg.trainer.get("accelerator", "auto")) if "trainer" in cfg else "auto"
    on_cpu = accel == "cpu" or (accel == "auto" and not torch.cuda.is_available())
    threads, why = choose_threads(cfg, parameters, on_cpu)
    torch.set_num_threads(threads)
    return why


def environment(trainer: pl.Trainer, cfg: DictConfig) -> dict[str, Any]:
    """What a deterministic run's numbers also depend on, recorded in summary.json: the same
    seed gives the same numbers again only with the same torch build, device and CPU threads."""
    device = "cpu"
    if trainer.strategy.root_device.type == "cuda":
        device = torch.cuda.get_device_name(trainer.strategy.root_device)
    return {"torch": torch.__version__, "lightning": pl.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "cpus_allowed": cpus_allowed(),
            "threads": torch.get_num_threads(),
            "device": device, "precision": str(trainer.precision),
            "deterministic": bool(cfg.trainer.get("deterministic", False)), **where_it_ran()}


def where_it_ran() -> dict[str, Any]:
    """The host and process that trained the run; in a Ray task (hydra/launcher=ray) also Ray's node,
    worker and task ids."""
    import socket

    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ctx = ray.get_runtime_context()
        if ctx.get_task_id():
            out["ray"] = {"node_id": ctx.get_node_id(), "worker_id": ctx.get_worker_id(), "task_id": ctx.get_task_id()}
    return out


def check_trainer(cfg: DictConfig) -> None:
    """Refuse a trainer configuration Lightning would reject (accelerator not on this machine,
    unknown precision, negative max_steps, an option Trainer does not have) with one line,
    before any data, model, W&B run or checkpoint is made: build a throwaway Trainer."""
    kwargs = trainer_kwargs(cfg)
    try:
        with warnings.catch_warnings():  # the job's own Trainer says them, once
            warnings.simplefilter("ignore")
            trial = pl.Trainer(**kwargs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                               enable_model_summary=False)
    except TypeError as err:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if not unknown:
            raise
        raise UserError(f"trainer.{unknown.group(1)} is not an option of Lightning's Trainer; remove it "
                        "(see conf/trainer/*.yaml for the options nas-run uses)") from None
    except (MisconfigurationException, ValueError, ModuleNotFoundError, RuntimeError) as err:
        where = ", ".join(f"trainer.{k}={cfg.trainer.get(k)}" for k in ("accelerator", "devices", "strategy", "precision")
                          if k in cfg.trainer and not isinstance(cfg.trainer.get(k), DictConfig))
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"Lightning rejects the trainer configuration ({where}): {first}; fix the trainer.* "
                        "option it names, or pick a trainer preset this machine has (e.g. trainer=cpu)") from None
    precision = str(cfg.trainer.get("precision", ""))
    if precision.startswith("16") and trial.strategy.root_device.type == "cpu":
        raise UserError(f"trainer.precision={precision} is float16, which needs a GPU: on the CPU Lightning would "
                        "silently use bf16-mixed instead (about 5x slower than float32 here); use "
                        "trainer.precision=32-true (the default) or train on a GPU (trainer=gpu)")


def compile_model(module, setting) -> str | None:
    """``compile=true`` (inductor) or ``compile=<torch.compile backend>``: compile the model's
    forward in place with ``nn.Module.compile``, so parameter names, checkpoints and
    ``nas-eval`` stay as they are. Returns the backend, or None for ``compile=false``."""
    if not setting:  # false / null
        return None
    backend = "inductor" if setting is True else str(setting)
    try:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
    except Exception as err:  # noqa: BLE001 - any import/platform failure is the same user-facing problem
        raise UserError(f"compile={setting}: torch.compile is unavailable here ({_unwrap(err)}); "
                        "run with compile=false") from err
    if backend not in known:
        raise UserError(f"compile={setting}: unknown torch.compile backend; use compile=true (inductor), "
                        f"compile=false, or one of {', '.join(known)}")
    module.model.compile(backend=backend)
    return backend


def compile_failure(err: BaseException) -> str | None:
    """One line describing a torch.compile failure (None if ``err`` is not one)."""
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    if exc is None or not isinstance(err, exc.TorchDynamoException):
        return None
    inner = getattr(err, "inner_exception", None) or err.__cause__ or err
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"[:300]


def data_dependent_refusal(err: BaseException, cfg: DictConfig) -> str | None:
    """One line for a trainer option Lightning can only reject once the data is known (None if
    ``err`` is not one): ``trainer.val_check_interval`` above the training batches of an epoch."""
    m = re.search(r"`val_check_interval` \((\d+)\) must be less than or equal to the number of the training "
                  r"batches \((\d+)\)", str(err))
    if not isinstance(err, ValueError) or not m:
        return None
    return (f"trainer.val_check_interval={m.group(1)} is more than the {m.group(2)} training batches of one epoch "
            f"of task={cfg.task.name}; set it to at most {m.group(2)}, or add trainer.check_val_every_n_epoch=null "
            "to count it in updates across epochs")


def fsdp_strategy(**kwargs):
    """``trainer=fsdp``: Lightning's FSDPStrategy wrapping each Transformer block as one FSDP unit
    (parameters of one block gathered at a time); further keyword arguments go to FSDPStrategy."""
    from pytorch_lightning.strategies import FSDPStrategy

    from nas_cli.model.transformer import Block

    kwargs.setdefault("auto_wrap_policy", {Block})
    return FSDPStrategy(**kwargs)
