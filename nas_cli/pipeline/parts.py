"""The parts of a job built from its config: the task with its data, and the Lightning module with
the model and its attention cores. A run (nas_cli/pipeline/run.py) and nas-eval (evaluation.py) build
them the same way, and each refusal is one line."""
from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from nas_cli.attention import SchemeError
from nas_cli.errors import UserError
from nas_cli.errors import unwrap as _unwrap
from nas_cli.model.plan import Cores
from nas_cli.pipeline.lit import NasLitModule
from tasks.scores import declaration


def build_task(cfg: DictConfig, task=None):
    """The task of ``cfg`` with its data set up for training: ``task`` as the pre-run check built it
    (the job trains with the task it checked), else built here."""
    try:
        if task is None:
            task = instantiate(cfg.task, _convert_="all")
            declaration(task.metrics)  # a malformed metrics declaration is refused before any data is read
        task.setup("fit")
        return task
    except UserError:
        raise
    except (ValueError, TypeError, InstantiationException, OSError) as err:
        raise UserError(f"task '{cfg.task.get('name', '?')}': {_unwrap(err)}") from err


def check_lengths(task, model_max_len: int) -> None:
    """Refuse, before training, evaluation sources longer than the model's positions (they
    would stop the run at its first validation)."""
    ids = task.ids
    if not isinstance(ids, dict):
        return
    for split in ("valid", "test"):
        if split in ids and ids[split][0]:
            longest = max(len(s) for s in ids[split][0])
            if longest > model_max_len:
                raise UserError(f"the longest {split} source has {longest} tokens, more than model.max_len="
                                f"{model_max_len} positions: raise model.max_len (e.g. model.max_len={longest + 64}) "
                                f"or lower task.max_len to {model_max_len} (longer evaluation sources are cut to it)")


def build_module(cfg: DictConfig, task, cores: Cores) -> NasLitModule:
    check_lengths(task, int(cfg.model.max_len))
    try:
        return NasLitModule(cfg.model, cores, cfg.optim, task, log_learned_every=cfg.log_learned_every)
    except (SchemeError, ValueError, InstantiationException) as err:
        raise UserError(_unwrap(err)) from err
